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
//!   commands start in.
//!
//! In an in-place restart the kubelet stops every container (the main
//! containers first, the sidecar after them) with SIGTERM and, 2 s later,
//! SIGKILL, running no `preStop` hook; then it removes them and runs the
//! init containers again.
//!
//! No command of a round may run beside the next ([`GangBarrier::await_round_empty`]:
//! the next round's commands start only once every registration of the
//! round before is gone), and the sidecar cannot stop the commands itself.
//! So a sidecar whose round ended does not withdraw its registration: it
//! exits 7 and abandons its session (the registration, ephemeral, stays
//! until the session's timeout), and the pod's next life withdraws it. The
//! kubelet removes every container of the pod before it runs the init
//! containers again, so a sidecar that starts in a new life knows that no
//! command of the round before still runs.
//!
//! Files in an emptyDir that outlives the containers (the kubelet keeps a
//! pod's volumes over an in-place restart):
//!
//! - `new-life`: made by the init container `zkgate install --pod-dir`,
//!   which runs once per life of the pod's containers (at the start and
//!   after each in-place restart), and removed by the sidecar once it has
//!   dealt with the life before: until then no main container of this life
//!   runs. A sidecar that starts without it was restarted alone (it
//!   crashed, or was OOM-killed), and the commands may still run.
//! - `opened`: the round whose opening let the main containers start,
//!   made before readiness is reported and removed once our registration
//!   in it (`<round>/<id>`) is withdrawn. A sidecar that starts and finds
//!   it ends that round: the commands were stopped (a new life: the
//!   registration is withdrawn, and the sidecar meets the gang in the next
//!   round), or its own process died while they may still run (exit 7, so
//!   that the kubelet stops them; the next life withdraws it). While it is
//!   there the sidecar abandons its session rather than closing it.
//! - `restart-asked`: the sidecar exited 7 in this life. Found by a
//!   sidecar of the same life, the kubelet restarted only the sidecar: the
//!   cluster does not restart pods in place, and the commands run on.
//! - `round.env`: what the main containers are told of their round, as
//!   `barrier run` tells its command (`ZKGATE_ROUND`, `ZKGATE_RANK`,
//!   `ZKGATE_MEMBERS`), written before they start.
//! - `ready`: the sidecar's ready file (its startup probe's), which a new
//!   life clears before any probe can read it.
//! - `ending`: made by the sidecar's own `preStop` hook (`zkgate barrier
//!   stopping --sidecar`), which the kubelet runs when it ends the pod
//!   with a grace period (all its main containers completed, or it is
//!   deleted), and not in an in-place restart (nor a kill with no grace
//!   period). A SIGTERM without it changes nothing in ZooKeeper: the
//!   pod's next life, or the session's expiry, ends the round.
//! - `stopping`: made by the main containers' `preStop` hook (`zkgate
//!   barrier stopping`), which the kubelet runs only when it kills a main
//!   container with a grace period (the pod deleted, evicted or
//!   preempted), never when it exits by itself. The kubelet stops native
//!   sidecars only after the main containers, so a sidecar's SIGTERM with
//!   `ending` and `stopping` is a pod killed (its member is lost: the
//!   round ends), and with `ending` alone a pod whose commands all
//!   completed (the member completed).
//!
//! The main containers can write the directory (their `preStop` marks);
//! what a sidecar reads there decides only its own pod's part in the gang
//! (the registration it withdraws is always its own, `<round>/<id>`).
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
/// The file of [`PodRecord::new_life`].
const NEW_LIFE: &str = "new-life";
/// The file of [`PodRecord::restart_asked`].
const RESTART_ASKED: &str = "restart-asked";
/// The file of [`PodRecord::ending`].
const ENDING: &str = "ending";
/// The file of [`PodRecord::stopping`].
const STOPPING: &str = "stopping";

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

    /// The round that let the main containers start, if a sidecar before
    /// this one recorded it and has not withdrawn its registration there.
    pub fn opened(&self) -> Result<Option<u32>, AgentError> {
        let path = self.file(OPENED);
        match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map(Some).map_err(|_| {
                AgentError::new(
                    Exit::Internal,
                    format!(
                        "{} holds {:?}, not a round number: it is the sidecar's own (remove it, or give the sidecar a fresh --pod-dir)",
                        path.display(),
                        text.trim()
                    ),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(unreadable(&path, e)),
        }
    }

    /// Records that round `k`'s opening lets the main containers start.
    pub fn set_opened(&self, k: u32) -> Result<(), AgentError> {
        write_atomically(&self.file(OPENED), &format!("{k}\n"))
    }

    /// Our registration of [`Self::opened`]'s round is withdrawn.
    pub fn clear_opened(&self) {
        remove(&self.file(OPENED));
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

    /// Whether this is a new life of the pod's containers whose sidecar
    /// has not yet dealt with the life before (see the module docs): no
    /// main container of it runs.
    pub fn new_life(&self) -> bool {
        self.file(NEW_LIFE).exists()
    }

    /// The life before is dealt with: a sidecar restarted alone from here
    /// on is in this life (its main containers may run).
    pub fn end_new_life(&self) {
        remove(&self.file(NEW_LIFE));
    }

    /// `zkgate install --pod-dir` (an init container, before the
    /// sidecar): marks a new life of the pod's containers, in which
    /// nothing is ready yet and nothing was asked of the kubelet: the
    /// ready file of the life before (the sidecar's `--ready-file` is
    /// [`READY`] here, for this) goes before the sidecar starts and its
    /// startup probe can read it.
    pub fn mark_new_life(dir: &Path) -> Result<(), AgentError> {
        remove(&dir.join(READY));
        remove(&dir.join(RESTART_ASKED));
        write_atomically(&dir.join(NEW_LIFE), "")
    }

    /// Records that we exit 7 in this life, asking the kubelet to restart
    /// every container of the pod.
    pub fn ask_restart(&self) -> Result<(), AgentError> {
        write_atomically(&self.file(RESTART_ASKED), "")
    }

    /// Whether a sidecar of this life exited 7 (and yet this life goes on).
    pub fn restart_asked(&self) -> bool {
        self.file(RESTART_ASKED).exists()
    }

    /// Whether the kubelet ran the sidecar's own `preStop` hook: it ends
    /// the pod, with a grace period.
    pub fn ending(&self) -> bool {
        self.file(ENDING).exists()
    }

    /// Whether the kubelet ran a main container's `preStop` hook: the pod
    /// is being killed, not completing.
    pub fn stopping(&self) -> bool {
        self.file(STOPPING).exists()
    }

    /// Forgets the marks of before the pod's last in-place restart (a
    /// liveness probe's kill runs `preStop` too).
    pub fn clear_marks(&self) {
        remove(&self.file(ENDING));
        remove(&self.file(STOPPING));
    }

    /// `zkgate barrier stopping` (a `preStop` hook): records that the
    /// kubelet ends the pod (`sidecar`: the sidecar's own hook) or kills a
    /// main container.
    pub fn mark_stopping(dir: &Path, sidecar: bool) -> Result<(), AgentError> {
        write_atomically(&dir.join(if sidecar { ENDING } else { STOPPING }), "")
    }
}

fn unreadable(path: &Path, e: std::io::Error) -> AgentError {
    AgentError::new(
        Exit::Internal,
        format!("cannot read {}: {e} (check --pod-dir)", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_keeps_the_opened_round_until_cleared_and_refuses_garbage() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let record = PodRecord::new(dir.path());
        assert_eq!(record.opened().expect("readable"), None);
        record.set_opened(3).expect("written");
        assert_eq!(record.opened().expect("readable"), Some(3));
        record.clear_opened();
        assert_eq!(record.opened().expect("readable"), None);
        std::fs::write(dir.path().join(OPENED), "three").expect("written");
        assert_eq!(
            record.opened().expect_err("not a number").exit,
            Exit::Internal
        );
    }

    #[test]
    fn a_new_life_lasts_until_ended_and_clears_what_the_life_before_left() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let record = PodRecord::new(dir.path());
        assert!(!record.new_life());
        std::fs::write(dir.path().join(READY), "").expect("written");
        record.ask_restart().expect("written");
        PodRecord::mark_new_life(dir.path()).expect("marked");
        assert!(
            !dir.path().join(READY).exists(),
            "the life before's ready file"
        );
        assert!(!record.restart_asked(), "the life before's exit 7");
        assert!(record.new_life());
        assert!(record.new_life(), "until the sidecar has dealt with it");
        record.end_new_life();
        assert!(
            !record.new_life(),
            "a sidecar restarted alone in the same life"
        );
    }

    #[test]
    fn the_pre_stop_marks_are_the_sidecars_and_the_main_containers_until_cleared() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let record = PodRecord::new(dir.path());
        assert!(!record.ending() && !record.stopping());
        PodRecord::mark_stopping(dir.path(), true).expect("marked");
        assert!(record.ending() && !record.stopping());
        PodRecord::mark_stopping(dir.path(), false).expect("marked");
        assert!(record.ending() && record.stopping());
        record.clear_marks();
        assert!(!record.ending() && !record.stopping());
    }
}
