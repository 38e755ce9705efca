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
//! then kills the command's whole tree. Both stand on [`super::procs`],
//! the process tree below us.

use std::future::Future;
use std::time::Duration;

use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::exit::{AgentError, Exit};
use super::procs::{
    exit_code, pause_tree, resume_tree, stop_tree, tree, Hidden, Stopping, TREE_POLL,
};
use super::Termination;

/// The terminal's requests to stop a process: SIGTSTP (Ctrl-Z), SIGTTIN
/// and SIGTTOU (a background process reading or writing the terminal).
/// Once caught they no longer stop us by themselves (see [`supervise`]).
struct TerminalStops {
    tstp: tokio::signal::unix::Signal,
    ttin: tokio::signal::unix::Signal,
    ttou: tokio::signal::unix::Signal,
}

impl TerminalStops {
    fn install() -> Result<Self, AgentError> {
        use tokio::signal::unix::{signal, SignalKind};
        let handle = |sig: nix::sys::signal::Signal| {
            signal(SignalKind::from_raw(sig as i32))
                .map_err(|e| AgentError::new(Exit::Internal, format!("cannot handle signals: {e}")))
        };
        use nix::sys::signal::Signal;
        Ok(TerminalStops {
            tstp: handle(Signal::SIGTSTP)?,
            ttin: handle(Signal::SIGTTIN)?,
            ttou: handle(Signal::SIGTTOU)?,
        })
    }

    async fn recv(&mut self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal;
        tokio::select! {
            _ = self.tstp.recv() => Signal::SIGTSTP,
            _ = self.ttin.recv() => Signal::SIGTTIN,
            _ = self.ttou.recv() => Signal::SIGTTOU,
        }
    }
}

/// How often the running command's tree is searched for processes we may
/// not signal (see [`supervise`]).
const UNSIGNALABLE_SCAN: Duration = Duration::from_secs(1);

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
/// nothing of it runs when this returns.
///
/// A process of the command's tree that we may not signal (another
/// user's: `sudo -u`, a set-user-ID program that changed its real user)
/// could not be stopped when the coordination is lost, so it is refused:
/// once a look (every [`UNSIGNALABLE_SCAN`]) finds one, the command is
/// terminated, that process is waited for, and this returns a usage error
/// (exit 2), unless `interrupt` resolves while it is waited for (the hold
/// was lost: said at once, as that process runs on beside the next
/// holder), which is then what this returns. One that appears and is orphaned between two looks is waited
/// for too, at the end ([`stop_tree`] never leaves a process running).
/// Orphans that exit while the command runs are reaped as they go (we are
/// their subreaper).
///
/// A terminal's stop (Ctrl-Z's SIGTSTP; SIGTTIN, SIGTTOU) reaches only us
/// (the command is in a group of its own): the command's whole tree is
/// stopped first, then we stop. When we are continued (`fg`, `bg`,
/// SIGCONT), `interrupt` is looked at before the command is: one that
/// came due while we were stopped (a hold's deadline passed, so the hold
/// may be another's now) has the command killed where it stands, never
/// continued; otherwise the command continues. A tree that cannot be
/// stopped within a second is continued and the stop ignored, with a
/// warning, rather than leave it running while we are stopped.
pub async fn supervise<T>(
    child: Child,
    signals: &mut Termination,
    interrupt: impl Future<Output = T>,
    grace: Duration,
) -> Result<Ended<T>, AgentError> {
    supervise_graced(
        child,
        signals,
        interrupt,
        grace,
        |_| grace,
        std::future::pending(),
    )
    .await
}

/// [`supervise`], with the kill grace of an interruption chosen by what
/// interrupted (`grace_for`): a hold that may be lost leaves only what is
/// left of the session for the command to end in, while a round that
/// ended for the others can give it the whole grace. And once the command
/// is being stopped (interrupted, or ended by itself with processes left
/// behind), `hurry` is still followed: when it resolves, with a grace, the
/// SIGKILL comes no later than that grace from then (the hold was lost
/// while the command took its time).
pub async fn supervise_graced<T>(
    mut child: Child,
    signals: &mut Termination,
    interrupt: impl Future<Output = T>,
    grace: Duration,
    grace_for: impl Fn(&T) -> Duration,
    hurry: impl Future<Output = Duration>,
) -> Result<Ended<T>, AgentError> {
    tokio::pin!(hurry);
    // Whether `hurry` resolved (it is not polled again).
    let mut hurried = false;
    let guardian = child.id().map(|id| Pid::from_raw(id as i32));
    let me = Pid::this();
    let mut orphans = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        .map_err(|e| AgentError::new(Exit::Internal, format!("cannot handle signals: {e}")))?;
    tokio::pin!(interrupt);
    let mut stops = TerminalStops::install()?;
    let mut scan = tokio::time::interval(UNSIGNALABLE_SCAN);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (ended, kill_at) = loop {
        let sig = tokio::select! {
            status = child.wait() => {
                let kill_at = Instant::now() + grace;
                match status {
                    Ok(status) => break (Ended::Exited(exit_code(status)), kill_at),
                    Err(e) => {
                        stop_tree(None, kill_at, Hidden::WaitFor).await;
                        return Err(AgentError::new(Exit::Internal, format!("lost track of the command: {e}")));
                    }
                }
            }
            reason = &mut interrupt => {
                let mut kill_at = Instant::now() + grace_for(&reason);
                let code = terminate_hurried(&mut child, guardian, &mut kill_at, hurry.as_mut(), &mut hurried).await;
                break (Ended::Interrupted(reason, code), kill_at);
            }
            _ = scan.tick() => {
                let found = tree::unsignalable(me);
                if found.is_empty() {
                    continue;
                }
                // Refused: what we may not signal we could not stop when
                // the hold is lost or the pod stopped. Stop what we can
                // now, and wait for the rest to end before going on.
                let what = tree::describe(&found);
                warn!(processes = %what, "the command started processes zkgate may not signal: stopping the command and waiting for them to end");
                let kill_at = Instant::now() + grace;
                let code = terminate(&mut child, guardian, kill_at).await;
                // The hold is still watched while they run: a loss is
                // said at once (they run beside the next holder, which
                // nothing here can prevent) and is what we exit with.
                let rest = stop_tree(None, kill_at, Hidden::WaitFor);
                tokio::pin!(rest);
                let mut lost = None;
                loop {
                    tokio::select! {
                        () = &mut rest => break,
                        reason = &mut interrupt, if lost.is_none() => {
                            error!(processes = %what, "lost while processes zkgate may not signal still run: they run on beside whoever comes next; waiting for them to end");
                            lost = Some(reason);
                        }
                        sig = signals.any() => {
                            warn!(signal = %sig, processes = %what, "not passed on: zkgate may not signal these processes; waiting for them to end");
                        }
                    }
                }
                if let Some(reason) = lost {
                    return Ok(Ended::Interrupted(reason, code));
                }
                return Err(AgentError::usage(format!(
                    "the command started processes of another user, which zkgate may not signal: {what}; \
                     zkgate could not stop them when it must (a lost hold, a stop), so it stopped the command \
                     (it exited {code}) and waited for them to end; run the command as zkgate's user, or give zkgate CAP_KILL"
                )));
            }
            sig = stops.recv() => {
                if !pause_tree().await {
                    warn!(signal = %sig, "the command could not be stopped within a second; not stopping");
                    continue;
                }
                info!(signal = %sig, "the command is stopped; stopping");
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                // Continued. Timers that came due while we were stopped
                // fire at the runtime's next turn, before this short one:
                // `interrupt` is looked at first.
                tokio::select! {
                    biased;
                    reason = &mut interrupt => {
                        // The command must not run again: killed now.
                        let code = terminate(&mut child, guardian, Instant::now()).await;
                        break (Ended::Interrupted(reason, code), Instant::now());
                    }
                    () = tokio::time::sleep(TREE_POLL) => {}
                }
                info!("continued; continuing the command");
                resume_tree();
                continue;
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
    tokio::select! {
        () = stop_tree(None, kill_at, Hidden::WaitFor) => {}
        grace = hurry, if !hurried => {
            stop_tree(None, kill_at.min(Instant::now() + grace), Hidden::WaitFor).await;
        }
    }
    Ok(ended)
}

/// SIGTERM to the command's whole tree at once (not to the guardian, which
/// would pass it on a second time), and to every process of it that
/// appears later (the command itself, when the guardian was still
/// starting it; a child forked meanwhile); SIGKILL to all of it, the
/// guardian too, at `kill_at`. The command's exit code (as its guardian
/// reports it).
async fn terminate(child: &mut Child, guardian: Option<Pid>, kill_at: Instant) -> i32 {
    let mut kill_at = kill_at;
    terminate_hurried(
        child,
        guardian,
        &mut kill_at,
        std::pin::pin!(std::future::pending()),
        &mut false,
    )
    .await
}

/// [`terminate`], bringing the SIGKILL forward (and `kill_at` with it)
/// when `hurry` resolves with a shorter grace from then. `hurried` says
/// whether it has resolved (then it is not polled again).
async fn terminate_hurried(
    child: &mut Child,
    guardian: Option<Pid>,
    kill_at: &mut Instant,
    mut hurry: std::pin::Pin<&mut impl Future<Output = Duration>>,
    hurried: &mut bool,
) -> i32 {
    let mut stopping = Stopping::new(guardian, *kill_at);
    loop {
        stopping.step();
        tokio::select! {
            status = child.wait() => {
                return status.map(exit_code).unwrap_or(137);
            }
            grace = hurry.as_mut(), if !*hurried => {
                *hurried = true;
                *kill_at = (*kill_at).min(Instant::now() + grace);
                stopping.kill_by(*kill_at);
                warn!(grace = ?grace, "the hold may be lost while the command stops: killing it within the grace that is left");
            }
            () = tokio::time::sleep(TREE_POLL) => {}
        }
    }
}
