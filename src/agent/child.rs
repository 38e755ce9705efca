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
//! left. What no process can do for itself: a SIGKILL of zkgate takes the
//! command (parent-death signal) but not the command's own children.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
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

/// Starts the command in its own process group, so that a terminal's
/// signals reach it only through us and it can be stopped with its children.
pub fn spawn(command: &[String], env: &[(&str, String)]) -> Result<Child, AgentError> {
    check_command(command)?;
    // Orphans of the command are re-parented to us, not to init, so that
    // stop_tree finds them.
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| {
        AgentError::new(
            Exit::Internal,
            format!("cannot become the command's subreaper: {e}"),
        )
    })?;
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).process_group(0).kill_on_drop(true);
    // SAFETY: prctl only sets a flag of the new process; it is
    // async-signal-safe. If zkgate dies (even by SIGKILL) the command must
    // not go on without the lock or barrier it was started under.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
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
/// started, so none is lost in between). When `interrupt` resolves first,
/// the command gets SIGTERM and, after `grace`, SIGKILL. Either way, what
/// is left of the command's process tree is stopped the same way before
/// this returns.
pub async fn supervise<T>(
    mut child: Child,
    signals: &mut Termination,
    interrupt: impl Future<Output = T>,
    grace: Duration,
) -> Result<Ended<T>, AgentError> {
    let pid = child.id().map(|id| Pid::from_raw(id as i32));
    tokio::pin!(interrupt);
    let ended = loop {
        let sig = tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| AgentError::new(Exit::Internal, format!("lost track of the command: {e}")))?;
                break Ended::Exited(exit_code(status));
            }
            reason = &mut interrupt => {
                let code = terminate(&mut child, pid, grace).await;
                break Ended::Interrupted(reason, code);
            }
            sig = signals.any() => sig,
        };
        info!(signal = %sig, "passing the signal on to the command");
        if let Some(pid) = pid {
            let _ = killpg(pid, sig);
        }
    };
    stop_tree(pid, grace).await;
    Ok(ended)
}

/// SIGTERM to the command's group, SIGKILL after `grace`.
async fn terminate(child: &mut Child, pid: Option<Pid>, grace: Duration) -> i32 {
    if let Some(pid) = pid {
        let _ = killpg(pid, Signal::SIGTERM);
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(status)) => exit_code(status),
        _ => {
            warn!(
                grace_ms = grace.as_millis() as u64,
                "the command did not stop after SIGTERM; killing it"
            );
            if let Some(pid) = pid {
                let _ = killpg(pid, Signal::SIGKILL);
            }
            child.wait().await.map(exit_code).unwrap_or(137)
        }
    }
}

/// How often the stopping tree is looked at.
const TREE_POLL: Duration = Duration::from_millis(10);

/// Stops every process left of the command (its group, and every
/// descendant of ours: we are their subreaper): SIGTERM, then SIGKILL
/// after `grace`, until none is left. Called once the command itself has
/// been reaped, so nothing we reap here is a child tokio still waits for.
async fn stop_tree(group: Option<Pid>, grace: Duration) {
    let me = Pid::this();
    let left = tree::descendants(me);
    let group_gone = group.is_none_or(|g| killpg(g, None).is_err());
    if left.is_empty() && group_gone {
        return;
    }
    info!(
        processes = left.len(),
        "the command left processes behind; stopping them before going on"
    );
    let kill_at = tokio::time::Instant::now() + grace;
    let mut sig = Signal::SIGTERM;
    loop {
        if let Some(group) = group {
            let _ = killpg(group, sig);
        }
        let left = tree::descendants(me);
        for pid in &left {
            let _ = nix::sys::signal::kill(*pid, sig);
        }
        tree::reap_exited_children(me);
        let group_gone = group.is_none_or(|g| killpg(g, None).is_err());
        if group_gone && tree::descendants(me).is_empty() {
            return;
        }
        if sig == Signal::SIGTERM && tokio::time::Instant::now() >= kill_at {
            warn!(
                grace_ms = grace.as_millis() as u64,
                "processes of the command did not stop after SIGTERM; killing them"
            );
            sig = Signal::SIGKILL;
            continue;
        }
        tokio::time::sleep(TREE_POLL).await;
    }
}

/// The process tree below a process, read from `/proc`.
mod tree {
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

    /// Every live (not yet exited) descendant of `root`.
    pub(super) fn descendants(root: Pid) -> Vec<Pid> {
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
    /// have exited, so they do not linger as zombies.
    pub(super) fn reap_exited_children(me: Pid) {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
            let Ok(pid) = name.parse::<i32>() else {
                continue;
            };
            if stat(&name) == Some((me.as_raw(), true)) {
                let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }
}
