//! The `LockLease` resource: a lock, exclusive or read/write, or a
//! semaphore of N permits, with a bounded hold time and a fencing token for
//! each holder.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::zk::{LockMode, LockNodeData};

/// A ZooKeeper lock that pods take through `zkgate lock ...`.
// Several printcolumn(...) entries repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "zkgate.io",
    version = "v1alpha1",
    kind = "LockLease",
    namespaced,
    status = "LockLeaseStatus",
    derive = "PartialEq",
    shortname = "zlock",
    category = "zkgate",
    doc = "A ZooKeeper lock (exclusive, read/write, or a semaphore of N permits) with a bounded hold time and a fencing token for each holder.",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(
        name = "In use",
        type_ = "integer",
        json_path = ".status.permitsInUse",
        description = "Permits held (Semaphore)"
    ),
    printcolumn(
        name = "Permits",
        type_ = "integer",
        json_path = ".spec.permits",
        description = "Permits in all (Semaphore)"
    ),
    printcolumn(name = "Holders", type_ = "integer", json_path = ".status.holderCount"),
    printcolumn(
        name = "Waiting",
        type_ = "integer",
        json_path = ".status.waitingCount"
    ),
    printcolumn(
        name = "Token",
        type_ = "integer",
        json_path = ".status.holders[0].fencingToken",
        description = "The fencing token of the (first) holder"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LockLeaseSpec {
    /// `Exclusive` (one holder), `ReadWrite` (holders ask for read or
    /// write) or `Semaphore` (at most `permits` held at once).
    #[serde(default)]
    pub mode: LockMode,
    /// A Semaphore's permits (1 when absent; ignored by the other modes).
    /// A change takes effect for the next admission: raising it admits
    /// waiters at once; lowering it revokes nobody and admits no one until
    /// fewer than the new number are in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub permits: Option<u32>,
    /// The longest one holder may hold the lock (e.g. `30s`, `5m`; not
    /// zero). A zkgate holder stops its command when it has held this long;
    /// the controller revokes the hold after this, the holder's kill grace
    /// and a second. No limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::api::DURATION_PATTERN))]
    pub lease_duration: Option<String>,
}

impl LockLeaseSpec {
    /// A Semaphore's permits (1 when absent).
    pub fn permits(&self) -> u32 {
        self.permits.unwrap_or(1).max(1)
    }

    /// The lease duration, when one is set and valid.
    pub fn lease(&self) -> Option<std::time::Duration> {
        self.lease_duration
            .as_deref()
            .and_then(|d| crate::api::parse_duration(d).ok())
    }
}

/// Whether anyone holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum LockPhase {
    /// Nobody holds it.
    Free,
    /// Someone holds it.
    Held,
}

/// What the controller observed (written by the controller only).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockLeaseStatus {
    /// Free or Held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<LockPhase>,
    /// The holders (at most the first 100; `holderCount` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<HolderStatus>,
    /// How many hold it.
    #[serde(default)]
    pub holder_count: u32,
    /// A Semaphore's permits held, by all holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits_in_use: Option<u32>,
    /// The ids of the waiters, in queue order (at most the first 100;
    /// `waitingCount` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
    /// The same waiters with their pods and since when each waits, in
    /// queue order (at most the first 100).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiters: Vec<WaiterStatus>,
    /// How many wait.
    #[serde(default)]
    pub waiting_count: u32,
    /// `Held`: true while someone holds the lock (reason `Held`; false:
    /// `Free`). `SpecAccepted`: false (reason `InvalidSpec`) while a spec
    /// change cannot be applied (the mode, while anyone holds or waits),
    /// true (`Accepted`) otherwise. `PodsTracked`: false (`PodUnknown`)
    /// while a hold that outlives its process names no pod, true
    /// (`PodsNamed`) otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The lock's node in ZooKeeper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub znode: Option<String>,
}

/// One holder.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HolderStatus {
    /// Its id (the pod name by default).
    pub id: String,
    /// Its pod, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// How it holds the lock.
    pub mode: HoldMode,
    /// The permits it holds (Semaphore; 1 for the other modes).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub permits: u32,
    /// Since when it holds the lock (microseconds: the lease is measured from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<MicroTime>,
    /// Its fencing token (the czxid of its node): larger for every later hold.
    pub fencing_token: i64,
    /// When the controller revokes the hold (with a lease duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<MicroTime>,
}

/// One waiter in a lock's queue.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaiterStatus {
    /// Its id (the pod name by default).
    pub id: String,
    /// Its pod, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Since when it waits: when its node was made, by the ZooKeeper
    /// server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<MicroTime>,
}

/// How a holder holds a lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum HoldMode {
    /// Alone (an `Exclusive` lock).
    #[default]
    Exclusive,
    /// Beside other readers (a `ReadWrite` lock's read side).
    Read,
    /// Alone (a `ReadWrite` lock's write side).
    Write,
    /// With permits of a `Semaphore`.
    Permit,
}

impl std::fmt::Display for HoldMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HoldMode::Exclusive => "Exclusive",
            HoldMode::Read => "Read",
            HoldMode::Write => "Write",
            HoldMode::Permit => "Permit",
        })
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}
