//! The guardian: a small zkgate process between a `run` (or `lock watch`)
//! and its command, so that nothing of the command outlives a zkgate that
//! was SIGKILLed (an OOM kill, a node's eviction of one process).
//!
//! zkgate itself cannot act on its own SIGKILL, and the kernel's
//! parent-death signal reaches only a process's direct children: a
//! command's SIGKILL would leave the command's own children running
//! beside the next holder. So zkgate starts `zkgate __guard -- COMMAND`
//! instead of the command, with a parent-death signal the guardian
//! catches. The guardian is a child subreaper, so every process the
//! command starts stays its descendant (also one that left the group with
//! `setsid` or whose parent exited); when zkgate dies it SIGKILLs all of
//! them at once and exits. When the command exits by itself, the guardian
//! stops what the command left (SIGTERM, SIGKILL after the grace) before
//! it reports the command's exit code as its own, so zkgate sees the
//! command end only once nothing of it runs.
//!
//! Signals zkgate passes on go to the guardian, which passes each on once
//! to the command's process group (the command leads a group of its own,
//! so a command that makes itself a group, as GNU `timeout` does, still
//! gets them). The guardian starts with those signals blocked (zkgate
//! blocks them before the exec): one sent before it can take them waits,
//! and is passed on once the command runs, rather than killing the
//! guardian or being lost. Parent death is acted on first and logged
//! after; the guardian's log lines never block (a full pipe, a paused
//! terminal: they are dropped) and never panic (a reader gone).

use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;
use tracing::warn;

use super::exit::{AgentError, Exit};
use super::procs::{self, tree};
use super::Termination;

/// The signals zkgate passes on (see [`super::Termination::any`]).
fn passed_on() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        set.add(sig);
    }
    set
}

/// The hidden subcommand that runs the guardian.
pub const SUBCOMMAND: &str = "__guard";

/// The signal the guardian gets when the zkgate that started it dies: a
/// real-time one, which no terminal sends and zkgate never passes on.
fn parent_died() -> i32 {
    nix::libc::SIGRTMIN() + 1
}

/// The guardian's command line for `command`, started by `parent` (this
/// process) and given `grace` to stop what the command leaves behind. The
/// caller adds the process group and the environment.
pub(super) fn command(parent: Pid, grace: Duration, command: &[String]) -> Command {
    // /proc/self/exe: this very binary, even when the file was replaced
    // or removed since (an upgrade of an emptyDir copy).
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("zkgate")
        .arg(SUBCOMMAND)
        .arg("--parent")
        .arg(parent.to_string())
        .arg("--kill-grace-ms")
        .arg(grace.as_millis().to_string())
        .arg("--")
        .args(command);
    // SAFETY: prctl and pthread_sigmask only set the new process's
    // parent-death signal and signal mask; both are async-signal-safe and
    // survive the exec.
    unsafe {
        cmd.pre_exec(|| {
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, parent_died()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            nix::sys::signal::pthread_sigmask(
                nix::sys::signal::SigmaskHow::SIG_BLOCK,
                Some(&passed_on()),
                None,
            )
            .map_err(std::io::Error::from)
        });
    }
    cmd
}

/// Runs the guardian: starts `command`, and returns its exit code once it
/// and everything it started have ended, or 137 once `parent` died and
/// all of it was killed.
pub async fn run(parent: i32, grace: Duration, command: &[String]) -> Result<i32, AgentError> {
    let failed = |what: &str, e: std::io::Error| {
        AgentError::new(Exit::Internal, format!("guardian: cannot {what}: {e}"))
    };
    // `ps` and `pgrep` show it for what it is (not `exe`), and zkgate
    // tells it (and its copies before the command's exec) by it.
    if let Ok(name) = std::ffi::CString::new(procs::GUARDIAN_NAME) {
        let _ = nix::sys::prctl::set_name(&name);
    }
    // Handlers first, then the check: a parent that dies after this point
    // is seen by one or the other.
    let mut orphaned =
        signal(SignalKind::from_raw(parent_died())).map_err(|e| failed("handle signals", e))?;
    let mut children = signal(SignalKind::child()).map_err(|e| failed("handle signals", e))?;
    let mut passed = Termination::install()?;
    // Blocked since before our exec (see `command`): what came meanwhile
    // is taken now, and passed on once the command runs.
    nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_UNBLOCK,
        Some(&passed_on()),
        None,
    )
    .map_err(|e| failed("take signals", e.into()))?;
    if nix::unistd::getppid().as_raw() != parent {
        return Err(AgentError::new(
            Exit::Internal,
            "guardian: the zkgate that started it has ended; the command was not started",
        ));
    }
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| failed("become the command's subreaper", e.into()))?;
    let mut cmd = Command::new(&command[0]);
    // A group of its own: what is passed on reaches it and its group.
    cmd.args(&command[1..]).process_group(0).kill_on_drop(true);
    // SAFETY: prctl only sets a flag of the new process; async-signal-safe.
    // Should the guardian itself be SIGKILLed, the command goes too, and
    // its children are re-parented to zkgate (a subreaper as well), which
    // stops them.
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Into::into));
    }
    let mut started = cmd
        .spawn()
        .map_err(|e| failed(&format!("start {:?}", command[0]), e))?;
    let pid = started.id().map(|id| Pid::from_raw(id as i32));
    let me = Pid::this();
    let code = loop {
        tokio::select! {
            // zkgate's death first: nothing of the command may outlive it.
            biased;
            _ = orphaned.recv() => return Ok(kill_all().await),
            status = started.wait() => break match status {
                Ok(status) => procs::exit_code(status),
                Err(e) => {
                    warn!(error = %e, "guardian: lost track of the command");
                    137
                }
            },
            _ = children.recv() => tree::reap_exited_children(me, pid),
            sig = passed.any() => {
                if let Some(pid) = pid {
                    let _ = nix::sys::signal::killpg(pid, sig);
                }
            }
        }
    };
    // What the command left gets its grace, unless zkgate dies meanwhile;
    // what is passed on still reaches the command's group.
    let leftovers = procs::stop_tree(None, Instant::now() + grace, procs::Hidden::PassUp);
    tokio::pin!(leftovers);
    loop {
        tokio::select! {
            biased;
            _ = orphaned.recv() => return Ok(kill_all().await),
            () = &mut leftovers => return Ok(code),
            sig = passed.any() => {
                if let Some(pid) = pid {
                    let _ = nix::sys::signal::killpg(pid, sig);
                }
            }
        }
    }
}

/// zkgate died: SIGKILL to every process of the command, then a word (the
/// guardian's log lines never block: see `main`).
async fn kill_all() -> i32 {
    procs::kill_tree().await;
    warn!(
        "zkgate ended without stopping its command: killed the command and everything it started"
    );
    137
}
