//! The process tree below a zkgate process, read from `/proc`, and how it
//! is stopped: SIGTERM once to each process, SIGKILL to all from a
//! deadline on, until none is left. `run`'s supervision
//! ([`super::child`]) and the guardian ([`super::guardian`]) both stand
//! on it; it knows neither.
//!
//! A process counts as ended only once none of its threads runs: a
//! process whose main thread has exited (`pthread_exit` from `main`) shows
//! `Z` in `/proc/PID/stat` while its other threads run on, and must still
//! be stopped.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::{error, info, warn};

/// The name the guardian gives itself (`/proc/PID/comm`), by which its
/// copies between their fork and the command's exec are told.
pub const GUARDIAN_NAME: &str = "zkgate-guard";

/// The exit code a shell would report: the status, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// How often the stopping tree is looked at.
pub(super) const TREE_POLL: Duration = Duration::from_millis(10);

/// Stopping the processes below us: each gets SIGTERM once, when it is
/// first seen; from the kill deadline on, all get SIGKILL, at every look.
pub(super) struct Stopping {
    /// Spared SIGTERM (the guardian, which would pass it on again), not
    /// SIGKILL.
    spared: Option<Pid>,
    termed: std::collections::HashSet<Pid>,
    kill_at: Instant,
    killing: bool,
}

impl Stopping {
    pub(super) fn new(spared: Option<Pid>, kill_at: Instant) -> Stopping {
        Stopping {
            spared,
            termed: Default::default(),
            kill_at,
            killing: Instant::now() >= kill_at,
        }
    }

    /// Brings the SIGKILL forward to `kill_at` if that is sooner.
    pub(super) fn kill_by(&mut self, kill_at: Instant) {
        self.kill_at = self.kill_at.min(kill_at);
    }

    /// One look: signals what is there; what is left.
    pub(super) fn step(&mut self) -> Left {
        if !self.killing && Instant::now() >= self.kill_at {
            warn!("processes of the command did not stop after SIGTERM within the kill grace; killing them");
            self.killing = true;
        }
        let left = tree::descendants(Pid::this());
        let mut unstoppable = Vec::new();
        for &pid in &left {
            if self.killing {
                if nix::sys::signal::kill(pid, Signal::SIGKILL) == Err(nix::errno::Errno::EPERM) {
                    unstoppable.push(pid);
                }
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
        if left.is_empty() {
            Left::Nothing
        } else if unstoppable.len() == left.len() {
            Left::Unstoppable(unstoppable)
        } else {
            Left::Some
        }
    }
}

/// What a look at the stopping tree left.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Left {
    /// Nothing: the tree has stopped.
    Nothing,
    /// Processes still to stop.
    Some,
    /// Only processes that SIGKILL may not reach (another user's, with
    /// zkgate lacking `CAP_KILL`): nothing to do but wait for them.
    Unstoppable(Vec<Pid>),
}

/// How often a tree of only [`Left::Unstoppable`] processes is looked at.
const UNSTOPPABLE_POLL: Duration = Duration::from_millis(250);

/// Waits out `stopping`: looks, signals, and looks again until nothing is
/// left. Processes zkgate may not signal are waited for, never left
/// running behind our back: a hold is kept (and a barrier not left) until
/// they end, and the user is told once which they are.
///
/// `/proc` mounted with `hidepid` does not show another user's processes
/// at all: with [`Hidden::WaitFor`], nothing is left only once we have no
/// child either (a hidden process below us comes to us, the subreaper,
/// when its visible parents end), and hidden ones are waited for like
/// those we may not signal. Only where no child of ours is one tokio
/// still waits for.
async fn stop_all(mut stopping: Stopping, hidden: Hidden) {
    let me = Pid::this();
    let mut told = false;
    let mut told_hidden = false;
    loop {
        tree::reap_exited_children(me, None);
        match stopping.step() {
            Left::Nothing => {
                if hidden == Hidden::PassUp || !tree::any_child_runs() {
                    return;
                }
                // One that has appeared in /proc since the look is
                // stopped at the next look, at once; one that has not is
                // hidden: zkgate does not learn its PID.
                if !tree::descendants(me).is_empty() {
                    tokio::time::sleep(TREE_POLL).await;
                    continue;
                }
                if !told_hidden {
                    error!(
                        "processes of the command still run that /proc does not show zkgate (mounted with hidepid: another user's, \
                         or one that made itself not dumpable), so zkgate cannot stop them; waiting for them to end before going on"
                    );
                    told_hidden = true;
                }
                tokio::time::sleep(UNSTOPPABLE_POLL).await;
            }
            Left::Some => tokio::time::sleep(TREE_POLL).await,
            Left::Unstoppable(pids) => {
                if !told {
                    error!(
                        processes = %tree::describe(&pids),
                        "processes of the command belong to another user and zkgate may not signal them; waiting for them to end before going on"
                    );
                    told = true;
                }
                tokio::time::sleep(UNSTOPPABLE_POLL).await;
            }
        }
    }
}

/// SIGKILL, now, to every process below us, until none is left.
pub(super) async fn kill_tree() {
    stop_all(Stopping::new(None, Instant::now()), Hidden::PassUp).await
}

/// What [`stop_tree`] does about processes below us that `/proc` hides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hidden {
    /// Waits for them, saying so: the process that holds (zkgate), which
    /// must not give its hold up while they run.
    WaitFor,
    /// Leaves them to our own subreaper when we end: the guardian, whose
    /// log may go nowhere (a pipe it may not open again), so that zkgate
    /// waits for them and says so.
    PassUp,
}

/// Stops every process left of the command (every descendant of ours but
/// `spared`: we are their subreaper): SIGTERM once each, SIGKILL (to
/// `spared` too) from `kill_at` on (at once when it has passed), until
/// none is left. Called once the command itself has been reaped (or will
/// never be waited for), so nothing we reap here is a child tokio still
/// waits for.
pub(super) async fn stop_tree(spared: Option<Pid>, kill_at: Instant, hidden: Hidden) {
    let me = Pid::this();
    tree::reap_exited_children(me, None);
    let left = tree::descendants(me);
    if left.is_empty() && (hidden == Hidden::PassUp || !tree::any_child_runs()) {
        return;
    }
    info!(
        processes = left.len(),
        "the command left processes behind; stopping them before going on"
    );
    stop_all(Stopping::new(spared, kill_at), hidden).await
}

/// How long [`pause_tree`] tries to see every process below us stopped.
const PAUSE_WITHIN: Duration = Duration::from_secs(1);

/// Stops (SIGSTOP) every process below us, until a look shows each one
/// stopped (a process forked between two looks is stopped at the next).
/// False when some still ran after [`PAUSE_WITHIN`] (one in an
/// uninterruptible sleep, say): then every process is continued again,
/// and nothing of the tree is left stopped by us.
pub(super) async fn pause_tree() -> bool {
    let me = Pid::this();
    let until = Instant::now() + PAUSE_WITHIN;
    loop {
        let left = tree::descendants(me);
        let running: Vec<Pid> = left.into_iter().filter(|&p| !tree::stopped(p)).collect();
        if running.is_empty() {
            return true;
        }
        if Instant::now() >= until {
            resume_tree();
            return false;
        }
        for pid in running {
            let _ = nix::sys::signal::kill(pid, Signal::SIGSTOP);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Continues (SIGCONT) every process below us.
pub(super) fn resume_tree() {
    for pid in tree::descendants(Pid::this()) {
        let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
    }
}

/// The process tree below a process, read from `/proc`.
pub(super) mod tree {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::Pid;

    /// A process's parent and whether it has ended, from
    /// `/proc/PID/stat`: `pid (comm) state ppid ...`, where comm may hold
    /// anything, parentheses and spaces included. `Z` (or `X`) is the
    /// state of the main thread only: the process has ended when no other
    /// thread of it runs either ([`threads_ended`]).
    fn stat(pid: &str) -> Option<(i32, bool)> {
        let (ppid, main_ended) =
            parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
        Some((ppid, main_ended && threads_ended(pid)))
    }

    /// The parent and whether the state is `Z` or `X`, from the text of a
    /// `/proc/.../stat` file.
    fn parse_stat(text: &str) -> Option<(i32, bool)> {
        let rest = &text[text.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        let state = fields.next()?;
        let ppid = fields.next()?.parse().ok()?;
        Some((ppid, state == "Z" || state == "X"))
    }

    /// Whether every thread of `pid` has exited (`/proc/PID/task/*/stat`).
    /// A task that cannot be read has gone: it no longer runs.
    fn threads_ended(pid: &str) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            // The whole process is gone (or was reaped) meanwhile.
            return true;
        };
        tasks.filter_map(|t| t.ok()).all(|task| {
            std::fs::read_to_string(task.path().join("stat"))
                .ok()
                .and_then(|text| parse_stat(&text))
                .is_none_or(|(_, ended)| ended)
        })
    }

    /// Whether no thread of `pid` runs: each is stopped (`T`, or `t` under
    /// a tracer) or has exited. A process that is gone is not running.
    pub(in crate::agent) fn stopped(pid: Pid) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.filter_map(|t| t.ok()).all(|task| {
            std::fs::read_to_string(task.path().join("stat"))
                .ok()
                .and_then(|text| {
                    let rest = &text[text.rfind(')')? + 1..];
                    rest.split_whitespace().next().map(str::to_owned)
                })
                .is_none_or(|state| matches!(state.as_str(), "T" | "t" | "Z" | "X"))
        })
    }

    /// Whether `pid` is a guardian (the name it gives itself), or a copy of
    /// one that has not exec'd the command yet.
    pub(in crate::agent) fn is_guardian(pid: Pid) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == super::GUARDIAN_NAME)
    }

    /// The live descendants of `root` that we may not signal (`kill` with
    /// no signal fails with `EPERM`: another user's, and we lack
    /// `CAP_KILL`), and so could not stop.
    pub(in crate::agent) fn unsignalable(root: Pid) -> Vec<Pid> {
        descendants(root)
            .into_iter()
            .filter(|&pid| nix::sys::signal::kill(pid, None) == Err(nix::errno::Errno::EPERM))
            .collect()
    }

    /// `pids` for a message: each with its name and owner, as `/proc`
    /// tells them (`1234 (sleep, uid 65534)`).
    pub(in crate::agent) fn describe(pids: &[Pid]) -> String {
        pids.iter()
            .map(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|c| c.trim_end().to_owned())
                    .unwrap_or_else(|_| "?".to_owned());
                let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|status| {
                        status
                            .lines()
                            .find_map(|l| l.strip_prefix("Uid:"))
                            .and_then(|ids| ids.split_whitespace().next().map(str::to_owned))
                    })
                    .unwrap_or_else(|| "?".to_owned());
                format!("{pid} ({comm}, uid {uid})")
            })
            .collect::<Vec<_>>()
            .join(", ")
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

    /// Whether a child of ours still runs, seen in `/proc` or not (with
    /// `hidepid`, another user's is not). Reaps every child of ours that
    /// has exited on the way (hidden zombies too, which
    /// [`reap_exited_children`] cannot see), so it may be called only
    /// where none is one tokio waits for.
    pub(in crate::agent) fn any_child_runs() -> bool {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return true,
                // One had exited, and is reaped now: look again.
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                // ECHILD: no child at all.
                Err(_) => return false,
            }
        }
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
