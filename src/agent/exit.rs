//! Exit codes of the `zkgate` commands and the one-line messages that go
//! with them.

use crate::zk::{ErrorKind, ZkError};

/// The documented exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Done.
    Done = 0,
    /// Internal error.
    Internal = 1,
    /// Usage or invalid input.
    Usage = 2,
    /// Timed out.
    TimedOut = 3,
    /// The barrier failed or the resource was deleted.
    Failed = 4,
    /// ZooKeeper unreachable or the session expired.
    Unavailable = 5,
    /// The lock was lost (revoked, or the session expired while held).
    LockLost = 6,
    /// A barrier sidecar in rounds: its round ended, and the pod's
    /// containers are to restart in place to meet the gang again (the
    /// kubelet's `RestartAllContainers` on this exit; see
    /// [`super::in_place`]).
    Restart = 7,
    /// Stopped by SIGINT while waiting; our registration was removed
    /// (128 + the signal's number, as a shell reports it).
    Interrupted = 130,
    /// Stopped by SIGTERM (how Kubernetes stops a container) while
    /// waiting; our registration was removed.
    Terminated = 143,
}

impl Exit {
    /// The signal a stop code reports (`SIGTERM`, `SIGINT`), for messages.
    pub fn signal_name(self) -> &'static str {
        match self {
            Exit::Interrupted => "SIGINT",
            _ => "SIGTERM",
        }
    }
}

/// Why a command stopped: the exit code and one line for the user saying
/// what happened and what to check.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    /// The exit code.
    pub exit: Exit,
    /// What happened and what to check, on one line.
    pub message: String,
}

impl AgentError {
    /// An error with this code and message.
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        AgentError {
            exit,
            message: message.into(),
        }
    }

    /// Bad input (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(Exit::Usage, message)
    }

    /// Explains a recipe's error, naming the servers in `connect` where
    /// that is what the user should check.
    pub fn from_zk(err: ZkError, connect: &str) -> Self {
        let exit = match err.kind() {
            ErrorKind::Invalid => Exit::Usage,
            ErrorKind::Timeout => Exit::TimedOut,
            ErrorKind::Failed => Exit::Failed,
            ErrorKind::Unavailable => Exit::Unavailable,
            ErrorKind::Internal => Exit::Internal,
        };
        let hint = match &err {
            ZkError::Timeout { .. } => {
                "; check that every participant started and reaches ZooKeeper, or raise --timeout".to_owned()
            }
            ZkError::Unreachable { .. } => {
                "; check --zookeeper / ZKGATE_ZOOKEEPER and that the ensemble is up".to_owned()
            }
            ZkError::SessionExpired => format!(
                " (servers {connect}); the process was cut off from ZooKeeper for longer than the session timeout"
            ),
            ZkError::Deleted { .. } => "; nothing left to wait for".to_owned(),
            ZkError::BarrierFailed { .. } => "; see the Barrier's status and events".to_owned(),
            ZkError::ParticipantConflict { .. } => "; give each participant its own --id".to_owned(),
            ZkError::NotAuthorized { .. } => "; a pod's credential is its namespace's, handed out by the controller (an injected container, or the label zkgate.io/credentials: \"true\" on a pod with its own zkgate containers)".to_owned(),
            _ => String::new(),
        };
        AgentError::new(exit, format!("{err}{hint}"))
    }
}
