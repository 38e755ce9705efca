//! Running the workload's command under `run`: signals are passed on, and
//! the command is terminated (SIGTERM, then SIGKILL) when the coordination
//! it depends on is lost.
//!
//! Nothing of the command outlives its supervision: the command runs in a
//! process group of its own, and zkgate is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so every process the command starts stays
//! zkgate's descendant, even one that left the group with `setsid` or
//! whose parent exited. When the command ends, however it ends, the rest
//! of its tree is stopped (SIGTERM, SIGKILL after the grace) before
//! [`supervise`] returns, and so before a lock is released or a barrier
//! left. A SIGKILL of zkgate cannot be caught, so the command runs under
//! a guardian ([`super::guardian`]) that zkgate's death wakes and that
//! then kills the command's whole tree.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;
use tracing::{info, warn};

use super::exit::{AgentError, Exit};
use super::Termination;

/// Checks that `command[0]` can be started, before anything is registered.
pub fn check_command(command: &[String]) -> Result<(), AgentError> {
    let program = command
        .first()
        .ok_or_else(|| AgentError::usage("no command given after --"))?;
    which::which(program).map(|_| ()).map_err(|_| {
        AgentError::usage(format!(
            "cannot run {program:?}: not found or not executable (check the command after --)"
        ))
    })
}

/// Starts the command, through a guardian (see [`super::guardian`]), in a
/// process group of its own, so that a terminal's signals reach it only
/// through us and it can be stopped with its children. `grace` is the
/// guardian's for what the command leaves behind when it exits.
pub fn spawn(
    command: &[String],
    env: &[(&str, String)],
    grace: Duration,
) -> Result<Child, AgentError> {
    check_command(command)?;
    // Orphans of the command are re-parented to us, not to init, so that
    // stop_tree finds them (those of a guardian we had to kill, too).
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| {
        AgentError::new(
            Exit::Internal,
            format!("cannot become the command's subreaper: {e}"),
        )
    })?;
    let mut cmd = super::guardian::command(Pid::this(), grace, command);
    cmd.process_group(0).kill_on_drop(true);
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.spawn().map_err(|e| {
        AgentError::new(
            Exit::Internal,
            format!("could not start {:?}: {e}", command[0]),
        )
    })
}

/// The exit code a shell would report: the status, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// How the command ended.
#[derive(Debug)]
pub enum Ended<T> {
    /// It exited by itself with this code.
    Exited(i32),
    /// `interrupt` resolved with `T` and the command was terminated; it
    /// ended with this code.
    Interrupted(T, i32),
}

/// Waits for the command, passing on SIGTERM, SIGINT, SIGHUP, SIGQUIT,
/// SIGUSR1 and SIGUSR2 (caught by `signals` since before the command was
/// started, so none is lost in between) to its guardian, which passes each
/// on once to the command's process group. When `interrupt` resolves
/// first, the command's whole tree (every descendant, also those that left
/// the group) gets SIGTERM at once and SIGKILL `grace` later: one deadline
/// for all of it. When the command exits by itself, its guardian stops
/// what is left of its tree the same way before it exits. Either way
/// nothing of it runs when this returns. Orphans that exit while the
/// command runs are reaped as they go (we are their subreaper).
pub async fn supervise<T>(
    mut child: Child,
    signals: &mut Termination,
    interrupt: impl Future<Output = T>,
    grace: Duration,
) -> Result<Ended<T>, AgentError> {
    let guardian = child.id().map(|id| Pid::from_raw(id as i32));
    let me = Pid::this();
    let mut orphans = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        .map_err(|e| AgentError::new(Exit::Internal, format!("cannot handle signals: {e}")))?;
    tokio::pin!(interrupt);
    let (ended, kill_at) = loop {
        let sig = tokio::select! {
            status = child.wait() => {
                let kill_at = Instant::now() + grace;
                match status {
                    Ok(status) => break (Ended::Exited(exit_code(status)), kill_at),
                    Err(e) => {
                        stop_tree(None, kill_at).await;
                        return Err(AgentError::new(Exit::Internal, format!("lost track of the command: {e}")));
                    }
                }
            }
            reason = &mut interrupt => {
                let kill_at = Instant::now() + grace;
                let code = terminate(&mut child, guardian, kill_at).await;
                break (Ended::Interrupted(reason, code), kill_at);
            }
            _ = orphans.recv() => {
                // Never the guardian itself: tokio reaps it.
                tree::reap_exited_children(me, guardian);
                continue;
            }
            sig = signals.any() => sig,
        };
        info!(signal = %sig, "passing the signal on to the command");
        // To the guardian alone, which passes it on to the command's group
        // exactly once (also while it starts: it keeps the signals blocked
        // until it can take them).
        if let Some(guardian) = guardian {
            let _ = nix::sys::signal::kill(guardian, sig);
        }
    };
    stop_tree(None, kill_at).await;
    Ok(ended)
}

/// SIGTERM to the command's whole tree at once (not to the guardian, which
/// would pass it on a second time), and to every process of it that
/// appears later (the command itself, when the guardian was still
/// starting it; a child forked meanwhile); SIGKILL to all of it, the
/// guardian too, at `kill_at`. The command's exit code (as its guardian
/// reports it).
async fn terminate(child: &mut Child, guardian: Option<Pid>, kill_at: Instant) -> i32 {
    let mut stopping = Stopping::new(guardian, kill_at);
    loop {
        stopping.step();
        tokio::select! {
            status = child.wait() => {
                return status.map(exit_code).unwrap_or(137);
            }
            () = tokio::time::sleep(TREE_POLL) => {}
        }
    }
}

/// How often the stopping tree is looked at.
const TREE_POLL: Duration = Duration::from_millis(10);

/// Stopping the processes below us: each gets SIGTERM once, when it is
/// first seen; from the kill deadline on, all get SIGKILL, at every look.
struct Stopping {
    /// Spared SIGTERM (the guardian, which would pass it on again), not
    /// SIGKILL.
    spared: Option<Pid>,
    termed: std::collections::HashSet<Pid>,
    kill_at: Instant,
    killing: bool,
}

impl Stopping {
    fn new(spared: Option<Pid>, kill_at: Instant) -> Stopping {
        Stopping {
            spared,
            termed: Default::default(),
            kill_at,
            killing: Instant::now() >= kill_at,
        }
    }

    /// One look: signals what is there; whether anything is left.
    fn step(&mut self) -> bool {
        if !self.killing && Instant::now() >= self.kill_at {
            warn!("processes of the command did not stop after SIGTERM within the kill grace; killing them");
            self.killing = true;
        }
        let left = tree::descendants(Pid::this());
        for &pid in &left {
            if self.killing {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            } else if Some(pid) != self.spared
                // A guardian's copy between its fork and the command's
                // exec still has the guardian's handlers, which would take
                // the SIGTERM meant for the command: it gets it once it
                // is the command, at a later look.
                && !tree::is_guardian(pid)
                && self.termed.insert(pid)
            {
                let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            }
        }
        !left.is_empty()
    }
}

/// SIGKILL, now, to every process below us, until none is left.
pub(super) async fn kill_tree() {
    let mut stopping = Stopping::new(None, Instant::now());
    loop {
        tree::reap_exited_children(Pid::this(), None);
        if !stopping.step() {
            return;
        }
        tokio::time::sleep(TREE_POLL).await;
    }
}

/// Stops every process left of the command (every descendant of ours but
/// `spared`: we are their subreaper): SIGTERM once each, SIGKILL (to
/// `spared` too) from `kill_at` on (at once when it has passed), until
/// none is left. Called once the command itself has been reaped (or will
/// never be waited for), so nothing we reap here is a child tokio still
/// waits for.
pub(super) async fn stop_tree(spared: Option<Pid>, kill_at: Instant) {
    let me = Pid::this();
    tree::reap_exited_children(me, None);
    let left = tree::descendants(me);
    if left.is_empty() {
        return;
    }
    info!(
        processes = left.len(),
        "the command left processes behind; stopping them before going on"
    );
    let mut stopping = Stopping::new(spared, kill_at);
    loop {
        tree::reap_exited_children(me, None);
        if !stopping.step() {
            return;
        }
        tokio::time::sleep(TREE_POLL).await;
    }
}

/// The process tree below a process, read from `/proc`.
pub(super) mod tree {
    use nix::sys::wait::{waitpid, WaitPidFlag};
    use nix::unistd::Pid;

    /// A process's parent and whether it has exited (a zombie), from
    /// `/proc/PID/stat`: `pid (comm) state ppid ...`, where comm may hold
    /// anything, parentheses and spaces included.
    fn stat(pid: &str) -> Option<(i32, bool)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &text[text.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        let state = fields.next()?;
        let ppid = fields.next()?.parse().ok()?;
        Some((ppid, state == "Z" || state == "X"))
    }

    /// Whether `pid` is a guardian (the name it gives itself), or a copy of
    /// one that has not exec'd the command yet.
    pub(in crate::agent) fn is_guardian(pid: Pid) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == super::super::guardian::NAME)
    }

    /// Every live (not yet exited) descendant of `root`.
    pub(in crate::agent) fn descendants(root: Pid) -> Vec<Pid> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let processes: Vec<(i32, i32, bool)> = entries
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let pid: i32 = name.parse().ok()?;
                let (ppid, exited) = stat(&name)?;
                Some((pid, ppid, exited))
            })
            .collect();
        let mut found = vec![root.as_raw()];
        let mut live = Vec::new();
        let mut at = 0;
        while at < found.len() {
            let parent = found[at];
            for &(pid, ppid, exited) in &processes {
                if ppid == parent && !found.contains(&pid) {
                    found.push(pid);
                    if !exited {
                        live.push(Pid::from_raw(pid));
                    }
                }
            }
            at += 1;
        }
        live
    }

    /// Reaps our children (orphans of the command re-parented to us) that
    /// have exited, so they do not linger as zombies; never `except` (the
    /// command itself, which tokio reaps).
    pub(in crate::agent) fn reap_exited_children(me: Pid, except: Option<Pid>) {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
            let Ok(pid) = name.parse::<i32>() else {
                continue;
            };
            if Some(Pid::from_raw(pid)) != except && stat(&name) == Some((me.as_raw(), true)) {
                let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }
}
