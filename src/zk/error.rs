//! The error type of the ZooKeeper recipes.

use std::time::Duration;

/// Everything a recipe can fail with.
///
/// Each variant names what happened in words a user can act on; the
/// participant commands map them to exit codes (see [`ZkError::kind`]).
#[derive(Debug, thiserror::Error)]
pub enum ZkError {
    /// The connect string could not be parsed.
    #[error("invalid ZooKeeper connect string {input:?}: {reason}")]
    InvalidConnectString {
        /// What was given.
        input: String,
        /// Why it was refused.
        reason: String,
    },

    /// A path or a node name is not valid in ZooKeeper.
    #[error("invalid ZooKeeper path {path:?}: {reason}")]
    InvalidPath {
        /// What was given.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// No session could be established within the connect timeout.
    #[error("could not reach ZooKeeper at {servers} within {waited:?}: {source}")]
    Unreachable {
        /// The servers tried.
        servers: String,
        /// How long we tried.
        waited: Duration,
        /// The client's last error.
        #[source]
        source: zookeeper_client::Error,
    },

    /// A deadline passed before the operation completed; nothing of the
    /// operation was left behind.
    #[error("timed out after {waited:?} while {during}")]
    Timeout {
        /// What was being waited for.
        during: String,
        /// How long it waited.
        waited: Duration,
    },

    /// The session expired: ephemeral nodes are gone, holds are lost.
    #[error("ZooKeeper session expired")]
    SessionExpired,

    /// The session was closed by this process.
    #[error("ZooKeeper session closed")]
    SessionClosed,

    /// The TLS settings cannot be used (no CA for `tcp+tls://` servers,
    /// unreadable PEM).
    #[error("invalid TLS settings: {reason}")]
    Tls {
        /// What is wrong.
        reason: String,
    },

    /// The servers could not be reached because the TLS handshake failed.
    #[error("could not reach ZooKeeper at {servers}: {reason} (check --tls-ca, and the client certificate if the servers ask for one)")]
    TlsHandshake {
        /// The servers tried.
        servers: String,
        /// What the handshake said.
        reason: String,
    },

    /// The ensemble lacks a feature zkgate needs.
    #[error("the ZooKeeper ensemble does not support {what}: zkgate needs {needs}")]
    Unsupported {
        /// The feature.
        what: &'static str,
        /// What provides it.
        needs: &'static str,
    },

    /// The server refused the credentials.
    #[error("ZooKeeper authentication failed (check the digest credentials)")]
    AuthFailed,

    /// The server refused an operation for lack of permission.
    #[error("not authorized to {op} {path}: ZooKeeper's ACL refused it (NoAuth); check the credential given with --auth / --auth-file")]
    NotAuthorized {
        /// The operation.
        op: &'static str,
        /// The path.
        path: String,
    },

    /// The barrier or lock node does not exist (any more).
    #[error("{path} does not exist (the resource was deleted or never created)")]
    Deleted {
        /// The missing node.
        path: String,
    },

    /// The barrier was marked failed by its owner (for example the
    /// controller, on a timeout or a lost participant).
    #[error("barrier {path} failed: {reason}")]
    BarrierFailed {
        /// The barrier node.
        path: String,
        /// Why, as written in the barrier node.
        reason: String,
    },

    /// A participant id is registered by someone else.
    #[error("participant {id:?} is already registered at {path} by {holder}")]
    ParticipantConflict {
        /// The id.
        id: String,
        /// The node.
        path: String,
        /// Who holds it.
        holder: String,
    },

    /// We gave up waiting for a barrier (`gave_up` says why: a timeout),
    /// but our registration could not be withdrawn in the transaction that
    /// settles whether an opening counted it (`source` says why: the
    /// session expired, the node was removed by someone else): the barrier
    /// may have opened counting it, so the others may pass without us.
    #[error("{gave_up}, and our registration could not be withdrawn for sure ({source}): the barrier {path} may have opened counting it, and the others may pass without us")]
    Unsettled {
        /// The barrier node.
        path: String,
        /// Why we gave up.
        gave_up: Box<ZkError>,
        /// Why the withdrawal could not settle it.
        source: Box<ZkError>,
    },

    /// A barrier in rounds (`onParticipantLoss: RestartGang`) entered or
    /// left as a plain double barrier: only a participant that enters each
    /// round and can stop its command when the gang restarts may take part.
    #[error("barrier {path} meets in rounds (onParticipantLoss: RestartGang): only `zkgate barrier run NAME -- COMMAND` takes part in it (it enters each round, and stops the command when the gang restarts), or `zkgate barrier sidecar NAME --pod-dir DIR` in a pod that restarts its containers in place (the webhook's sidecar form, Kubernetes 1.36+); the init container cannot, nor a sidecar without --pod-dir")]
    InRounds {
        /// The barrier node.
        path: String,
    },

    /// Our own node disappeared while we waited: someone deleted it.
    #[error("our node {path} was deleted by someone else while waiting")]
    NodeRemoved {
        /// The node.
        path: String,
    },

    /// A create made on condition that a node's data was unchanged (see
    /// [`crate::zk::VersionCheck`]) was not made: the data changed since
    /// it was read.
    #[error("the data of {path} changed since it was read (it says how to take the lock: read it again)")]
    Changed {
        /// The node whose data changed.
        path: String,
    },

    /// A lock was asked for what its mode cannot give: permits it does not
    /// have, or a side (read, write) it does not have.
    #[error("lock {path}: {reason}")]
    Permits {
        /// The lock node.
        path: String,
        /// What was asked and what it has.
        reason: String,
    },

    /// A node's data could not be understood.
    #[error("invalid data in {path}: {reason}")]
    InvalidData {
        /// The node.
        path: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A conditional write lost the race to other writers of the node
    /// [`CONTENDED_ATTEMPTS`] times in a row: someone rewrites it without
    /// pause. Giving up lets the caller back off instead of holding on.
    #[error("gave up trying to {op} {path} after {attempts} attempts: it changed between every read and write (something rewrites it without pause)")]
    Contended {
        /// The operation.
        op: &'static str,
        /// The node.
        path: String,
        /// How many times it was read and written.
        attempts: u32,
    },

    /// Nodes under `path` that could not be deleted (their ACL shuts this
    /// session out).
    #[error("nodes under {path} cannot be deleted: {}", .left.join(", "))]
    LeftBehind {
        /// The subtree's root.
        path: String,
        /// What is left.
        left: Vec<String>,
    },

    /// Any other failure reported by the client.
    #[error("ZooKeeper {op} {path} failed: {source}")]
    Zk {
        /// The operation.
        op: &'static str,
        /// The path.
        path: String,
        /// The client's error.
        #[source]
        source: zookeeper_client::Error,
    },
}

/// How many times a read-then-conditional-write is tried against other
/// writers of the same node before [`ZkError::Contended`]. Honest races
/// (a few participants withdrawing at once) settle in a handful.
pub const CONTENDED_ATTEMPTS: u32 = 32;

/// The broad class of an error: what a caller should do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad input from the user.
    Invalid,
    /// A deadline passed.
    Timeout,
    /// The barrier failed or its resource was deleted.
    Failed,
    /// ZooKeeper is unreachable, the session expired or auth failed.
    Unavailable,
    /// Anything else.
    Internal,
}

impl ZkError {
    /// Classifies the error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ZkError::InvalidConnectString { .. }
            | ZkError::InvalidPath { .. }
            | ZkError::Tls { .. }
            | ZkError::ParticipantConflict { .. }
            | ZkError::InRounds { .. }
            | ZkError::Permits { .. } => ErrorKind::Invalid,
            ZkError::Timeout { .. } => ErrorKind::Timeout,
            ZkError::Deleted { .. }
            | ZkError::BarrierFailed { .. }
            | ZkError::NodeRemoved { .. } => ErrorKind::Failed,
            ZkError::Unreachable { .. }
            | ZkError::TlsHandshake { .. }
            | ZkError::SessionExpired
            | ZkError::SessionClosed
            | ZkError::Unsettled { .. }
            | ZkError::AuthFailed
            | ZkError::NotAuthorized { .. }
            | ZkError::LeftBehind { .. } => ErrorKind::Unavailable,
            ZkError::InvalidData { .. }
            | ZkError::Zk { .. }
            | ZkError::Unsupported { .. }
            | ZkError::Contended { .. }
            // Caught by the caller, which reads the rules again.
            | ZkError::Changed { .. } => ErrorKind::Internal,
        }
    }

    /// Wraps a client error for `op` on `path`, mapping the session-level
    /// errors to their own variants.
    pub(crate) fn from_client(
        op: &'static str,
        path: &str,
        source: zookeeper_client::Error,
    ) -> Self {
        use zookeeper_client::Error as E;
        match source {
            E::SessionExpired => ZkError::SessionExpired,
            E::ClientClosed => ZkError::SessionClosed,
            E::AuthFailed => ZkError::AuthFailed,
            E::NoAuth => ZkError::NotAuthorized {
                op,
                path: path.to_owned(),
            },
            source => ZkError::Zk {
                op,
                path: path.to_owned(),
                source,
            },
        }
    }
}

/// Results of the recipes.
pub type Result<T, E = ZkError> = std::result::Result<T, E>;

/// Runs `work` until `deadline` (`None`: no limit). Past it, `work` is
/// dropped (its clean-up guards run) and the result is
/// [`ZkError::Timeout`], saying what was being waited for.
pub async fn within<T>(
    deadline: Option<tokio::time::Instant>,
    during: impl FnOnce() -> String,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let Some(deadline) = deadline else {
        return work.await;
    };
    let started = tokio::time::Instant::now();
    match tokio::time::timeout_at(deadline, work).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ZkError::Timeout {
            during: during(),
            waited: started.elapsed(),
        }),
    }
}
