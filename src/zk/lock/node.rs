//! What a lock node holds: its mode, written by its owner (the controller)
//! and read by every contender before it queues.

use serde::{Deserialize, Serialize};

/// How a lock is shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
// The LockLease resource carries it: its schema is built with the operator.
#[cfg_attr(feature = "operator", derive(schemars::JsonSchema))]
pub enum LockMode {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Readers share it; a writer excludes everyone.
    ReadWrite,
    /// A counting semaphore: at most `permits` held at once, a holder
    /// taking one or more; shared with Apache Curator's
    /// InterProcessSemaphoreV2 on the same path.
    Semaphore,
}

/// What the controller writes into a lock node: the contract between the
/// controller and the participant commands (which read the mode from it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockNodeData {
    /// The resource's uid.
    pub uid: String,
    /// The mode.
    pub mode: LockMode,
    /// `spec.leaseDuration`, in milliseconds: a holder that follows the
    /// lease stops its command once it has held this long (on its own
    /// clock), before the controller revokes the hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// Set while the controller changes the mode to this one: contenders
    /// wait until it is cleared. Written before the controller looks
    /// whether the lock is in use, so that a contender that read the mode
    /// before cannot queue unseen (its create checks the data's version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changing_to: Option<LockMode>,
}
