//! The `LockLease` resource: a lock, exclusive or read/write, with a bounded
//! hold time and a fencing token for each holder.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    doc = "A ZooKeeper lock (exclusive or read/write) with a bounded hold time and a fencing token for each holder.",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
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
    /// `Exclusive` (one holder) or `ReadWrite` (holders ask for read or write).
    #[serde(default)]
    pub mode: LockMode,
    /// The longest one holder may hold the lock (e.g. `30s`, `5m`; not
    /// zero); past it the controller revokes the hold. No limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::api::DURATION_PATTERN))]
    pub lease_duration: Option<String>,
}

/// How a lock is shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum LockMode {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Readers share it; a writer excludes everyone.
    ReadWrite,
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
    /// The holders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<HolderStatus>,
    /// How many hold it.
    #[serde(default)]
    pub holder_count: u32,
    /// The ids of the waiters, in queue order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
    /// How many wait.
    #[serde(default)]
    pub waiting_count: u32,
    /// `Held` is true while someone holds the lock.
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
    /// `Exclusive`, `Read` or `Write`.
    pub mode: String,
    /// Since when it holds the lock (microseconds: the lease is measured from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<MicroTime>,
    /// Its fencing token (the czxid of its node): larger for every later hold.
    pub fencing_token: i64,
    /// When the controller revokes the hold (with a lease duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<MicroTime>,
}
