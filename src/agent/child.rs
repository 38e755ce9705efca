//! Running the workload's command under `run`: signals are passed on, and
//! the command is terminated (SIGTERM, then SIGKILL) when the coordination
//! it depends on is lost.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

use super::exit::{AgentError, Exit};

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
/// SIGUSR1 and SIGUSR2. When `interrupt` resolves first, the command gets
/// SIGTERM and, after `grace`, SIGKILL.
pub async fn supervise<T>(
    mut child: Child,
    interrupt: impl Future<Output = T>,
    grace: Duration,
) -> Result<Ended<T>, AgentError> {
    let pid = child.id().map(|id| Pid::from_raw(id as i32));
    let handle = |kind| {
        signal(kind)
            .map_err(|e| AgentError::new(Exit::Internal, format!("cannot handle signals: {e}")))
    };
    let mut term = handle(SignalKind::terminate())?;
    let mut int = handle(SignalKind::interrupt())?;
    let mut hup = handle(SignalKind::hangup())?;
    let mut quit = handle(SignalKind::quit())?;
    let mut usr1 = handle(SignalKind::user_defined1())?;
    let mut usr2 = handle(SignalKind::user_defined2())?;
    tokio::pin!(interrupt);
    loop {
        let sig = tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| AgentError::new(Exit::Internal, format!("lost track of the command: {e}")))?;
                return Ok(Ended::Exited(exit_code(status)));
            }
            reason = &mut interrupt => {
                let code = terminate(&mut child, pid, grace).await;
                return Ok(Ended::Interrupted(reason, code));
            }
            _ = term.recv() => Signal::SIGTERM,
            _ = int.recv() => Signal::SIGINT,
            _ = hup.recv() => Signal::SIGHUP,
            _ = quit.recv() => Signal::SIGQUIT,
            _ = usr1.recv() => Signal::SIGUSR1,
            _ = usr2.recv() => Signal::SIGUSR2,
        };
        info!(signal = %sig, "passing the signal on to the command");
        if let Some(pid) = pid {
            let _ = killpg(pid, sig);
        }
    }
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
