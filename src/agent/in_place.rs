//! What a barrier sidecar in rounds keeps in its pod, across its own
//! restarts: the sidecar form of `onParticipantLoss: RestartGang`.
//!
//! In that form the sidecar cannot stop the pod's commands itself; the
//! kubelet does, by restarting every container of the pod in place
//! (`restartPolicyRules` with `action: RestartAllContainers`, Kubernetes
//! 1.36+), which the webhook asks for on two exits:
//!
//! - the sidecar's own [`Exit::Restart`] (7): its round ended, so the
//!   pod's commands must stop and the gang meet again;
//! - any failure of a main container: its round ends when the restarted
//!   sidecar finds, in [`PodRecord::opened`], the round it had let the
//!   commands start in (the kubelet restarts a container without a
//!   signal, so the sidecar that was killed could not say so itself).
//!
//! No command of a round may run beside the next ([`GangBarrier::await_round_empty`]:
//! the next round's commands start only once every registration of the
//! round before is gone), and the sidecar cannot stop the commands itself.
//! So a sidecar whose round ended does not withdraw its registration: it
//! exits 7 and abandons its session (the registration, ephemeral, stays
//! until the session's timeout), and the pod's next life withdraws it. The
//! kubelet kills and removes every container of the pod before it runs the
//! init containers again, so a sidecar that starts in a new life knows
//! that no command of the round before still runs.
//!
//! Four files in an emptyDir that outlives the containers (the kubelet
//! keeps a pod's volumes over an in-place restart):
//!
//! - `new-life`: made by the init container `zkgate install --pod-dir`,
//!   which runs once per life of the pod's containers (at the start and
//!   after each in-place restart), and taken by the sidecar as it starts:
//!   there, no main container runs. A sidecar that starts without it was
//!   restarted alone (it crashed, or was OOM-killed), and the commands
//!   may still run.
//! - `opened`: the round whose opening let the main containers start, and
//!   our registration in it, made before readiness is reported and removed
//!   once that registration is withdrawn. A sidecar that starts and finds
//!   it ends that round: the commands were stopped (a new life: the
//!   registration is withdrawn, and the sidecar meets the gang in the next
//!   round), or its own process died while they may still run (exit 7, so
//!   that the kubelet stops them; the next life withdraws it).
//! - `round.env`: what the main containers are told of their round, as
//!   `barrier run` tells its command (`ZKGATE_ROUND`, `ZKGATE_RANK`,
//!   `ZKGATE_MEMBERS`), written before they start.
//! - `stopping`: made by the main containers' `preStop` hook
//!   (`zkgate barrier stopping`), which the kubelet runs only when it
//!   kills a container (the pod deleted, evicted or preempted), never when
//!   the container exits by itself, and not in an in-place restart. The
//!   kubelet stops native sidecars only after the main containers, so a
//!   sidecar's SIGTERM with `stopping` there is a pod killed (its member is
//!   lost: the round ends), and without it is a pod whose commands all
//!   completed (exit 0: the member completed).
//!
//! [`GangBarrier::await_round_empty`]: crate::zk::GangBarrier::await_round_empty

use std::path::{Path, PathBuf};

use super::exit::{AgentError, Exit};
use super::ready::{remove, write_atomically};

/// The file of [`PodRecord::opened`].
const OPENED: &str = "opened";
/// The file of [`PodRecord::tell_round`], for the main containers.
pub const ROUND_ENV: &str = "round.env";
/// The sidecar's ready file in the pod's directory, cleared by
/// [`PodRecord::mark_new_life`].
pub const READY: &str = "ready";
/// The file of [`PodRecord::take_new_life`].
const NEW_LIFE: &str = "new-life";
/// The file of [`PodRecord::stopping`].
pub const STOPPING: &str = "stopping";

/// A sidecar's record in its pod's directory (see the module docs).
#[derive(Clone, Debug)]
pub struct PodRecord {
    dir: PathBuf,
}

impl PodRecord {
    /// The record in `dir` (an emptyDir shared with the main containers'
    /// `preStop` hook).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PodRecord { dir: dir.into() }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The round that let the main containers start and our registration
    /// in it, if a sidecar before this one recorded them and has not
    /// withdrawn that registration.
    pub fn opened(&self) -> Result<Option<Opened>, AgentError> {
        let path = self.file(OPENED);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unreadable(&path, e)),
        };
        let mut lines = text.lines();
        let round = lines.next().and_then(|k| k.trim().parse().ok());
        let node = lines.next().map(str::trim).filter(|n| n.starts_with('/'));
        match (round, node, lines.next()) {
            (Some(round), Some(node), None) => Ok(Some(Opened {
                round,
                node: node.to_owned(),
            })),
            _ => Err(AgentError::new(
                Exit::Internal,
                format!(
                    "{} holds {:?}, not a round and a registration: it is the sidecar's own (remove it, or give the sidecar a fresh --pod-dir)",
                    path.display(),
                    text.trim()
                ),
            )),
        }
    }

    /// Records that round `k`'s opening, with our registration `node` in
    /// it, lets the main containers start.
    pub fn set_opened(&self, k: u32, node: &str) -> Result<(), AgentError> {
        write_atomically(&self.file(OPENED), &format!("{k}\n{node}\n"))
    }

    /// Tells the main containers, which start after it, what `barrier run`
    /// tells its command in the environment: `ZKGATE_ROUND`, `ZKGATE_RANK`
    /// and `ZKGATE_MEMBERS`, lines a shell can source.
    pub fn tell_round(&self, k: u32, rank: usize, members: usize) -> Result<(), AgentError> {
        write_atomically(
            &self.file(ROUND_ENV),
            &format!("ZKGATE_ROUND={k}\nZKGATE_RANK={rank}\nZKGATE_MEMBERS={members}\n"),
        )
    }

    /// The registration of [`Self::opened`] is withdrawn.
    pub fn clear_opened(&self) {
        remove(&self.file(OPENED));
    }

    /// Whether the kubelet ran a main container's `preStop` hook: the pod
    /// is being killed, not completing.
    pub fn stopping(&self) -> bool {
        self.file(STOPPING).exists()
    }

    /// Forgets a `preStop` of before the pod's last in-place restart (a
    /// liveness probe's kill runs it too).
    pub fn clear_stopping(&self) {
        remove(&self.file(STOPPING));
    }

    /// Whether this is the first sidecar of a new life of the pod's
    /// containers (see the module docs): no main container runs. Taken:
    /// a sidecar restarted alone in this life finds it gone.
    pub fn take_new_life(&self) -> Result<bool, AgentError> {
        let path = self.file(NEW_LIFE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(AgentError::new(
                Exit::Internal,
                format!("cannot remove {}: {e} (check --pod-dir)", path.display()),
            )),
        }
    }

    /// `zkgate install --pod-dir` (an init container, before the
    /// sidecar): marks a new life of the pod's containers, in which
    /// nothing is ready yet: the ready file of the life before (the
    /// sidecar's `--ready-file` is [`READY`] here, for this) goes first,
    /// before the sidecar starts and its startup probe can read it.
    pub fn mark_new_life(dir: &Path) -> Result<(), AgentError> {
        remove(&dir.join(READY));
        write_atomically(&dir.join(NEW_LIFE), "")
    }

    /// `zkgate barrier stopping` (the main containers' `preStop` hook):
    /// records that the kubelet is killing the pod.
    pub fn mark_stopping(dir: &Path) -> Result<(), AgentError> {
        write_atomically(&dir.join(STOPPING), "")
    }
}

fn unreadable(path: &Path, e: std::io::Error) -> AgentError {
    AgentError::new(
        Exit::Internal,
        format!("cannot read {}: {e} (check --pod-dir)", path.display()),
    )
}

/// What [`PodRecord::opened`] holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The round.
    pub round: u32,
    /// Our registration in it.
    pub node: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_keeps_the_opened_round_until_cleared_and_refuses_garbage() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let record = PodRecord::new(dir.path());
        assert_eq!(record.opened().expect("readable"), None);
        record
            .set_opened(3, "/zkgate/barriers/ns/train/round-3/pod-a")
            .expect("written");
        assert_eq!(
            record.opened().expect("readable"),
            Some(Opened {
                round: 3,
                node: "/zkgate/barriers/ns/train/round-3/pod-a".into()
            })
        );
        record.clear_opened();
        assert_eq!(record.opened().expect("readable"), None);
        for garbage in ["three\n/x\n", "3\n", "3\nx\n", "3\n/x\n/y\n"] {
            std::fs::write(dir.path().join(OPENED), garbage).expect("written");
            assert_eq!(
                record.opened().expect_err(garbage).exit,
                Exit::Internal,
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn a_new_life_is_told_once_and_nothing_is_ready_in_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let record = PodRecord::new(dir.path());
        assert!(!record.take_new_life().expect("readable"));
        std::fs::write(dir.path().join(READY), "").expect("written");
        PodRecord::mark_new_life(dir.path()).expect("marked");
        assert!(
            !dir.path().join(READY).exists(),
            "the life before's ready file"
        );
        assert!(record.take_new_life().expect("taken"));
        assert!(
            !record.take_new_life().expect("readable"),
            "a sidecar restarted alone in the same life"
        );
    }

    #[test]
    fn stopping_is_what_the_pre_stop_hook_left_until_cleared() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let record = PodRecord::new(dir.path());
        assert!(!record.stopping());
        PodRecord::mark_stopping(dir.path()).expect("marked");
        assert!(record.stopping());
        record.clear_stopping();
        assert!(!record.stopping());
    }
}
