//! `zkgate barrier enter | leave | sidecar | run`.

use std::time::Duration;

use tracing::{info, warn};

use super::child::{self, Ended};
use super::exit::{AgentError, Exit};
use super::ready::{Readiness, ReadinessOptions};
use super::{close, Participant, Termination};
use crate::zk::{DoubleBarrier, EnterOptions, Entered, Entry, HoldMonitor, Session};

/// How often a waiting participant logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// One participant command on one barrier.
pub struct BarrierCommand<'a> {
    participant: &'a Participant,
    barrier: DoubleBarrier,
    participants: Option<u32>,
    run: Option<String>,
}

impl<'a> BarrierCommand<'a> {
    /// The barrier `name` in the participant's namespace. With
    /// `participants`, the barrier node is created when missing (no
    /// controller); without, the command waits for its owner to create it.
    pub fn new(
        participant: &'a Participant,
        name: &str,
        participants: Option<u32>,
    ) -> Result<Self, AgentError> {
        let path = participant
            .layout
            .barrier(&participant.namespace, name)
            .map_err(|e| participant.explain(e))?;
        Ok(BarrierCommand {
            participant,
            barrier: DoubleBarrier::new(path),
            participants,
            run: None,
        })
    }

    /// Enters only a barrier of `run` (see [`EnterOptions::run`]); an empty
    /// run is none.
    pub fn in_run(self, run: Option<String>) -> Self {
        BarrierCommand {
            run: run.filter(|r| !r.is_empty()),
            ..self
        }
    }

    fn options(&self, persistent: bool) -> EnterOptions {
        EnterOptions {
            data: self.participant.identity(),
            persistent,
            create_with_participants: self.participants,
            progress_every: Some(PROGRESS_EVERY),
            run: self.run.clone(),
        }
    }

    fn waiting(&self) -> String {
        format!("waiting for the barrier {} to open", self.barrier.path())
    }

    /// Watches our ephemeral registration from the moment the barrier
    /// opened: what stops the sidecar or the command when it is lost.
    fn registration<'s>(&self, session: &'s Session, entered: &Entered) -> HoldMonitor<'s> {
        HoldMonitor::new(session, entered.node.clone(), true, entered.confirmed_at)
    }

    fn registration_lost(&self, reason: crate::zk::LossReason, what: &str) -> AgentError {
        AgentError::new(
            Exit::Unavailable,
            format!(
                "our registration in the barrier {} was lost: {reason}{what} (servers {}); the other participants may finish without us",
                self.barrier.path(),
                self.participant.connect_string()
            ),
        )
    }

    /// Enters unless stopped by SIGTERM or SIGINT first. The outcome is
    /// settled with the server (see [`DoubleBarrier::enter_unless`]): the
    /// barrier entered, with the signal that came as it opened if one did;
    /// or stopped, with our registration withdrawn (exit 143 or 130, and
    /// the message says whether an opening may have counted it).
    async fn enter_with(
        &self,
        session: &Session,
        persistent: bool,
        stop: &mut Termination,
    ) -> Result<(Entered, Option<Exit>), AgentError> {
        let p = self.participant;
        let entry = self
            .barrier
            .enter_unless(
                session,
                &p.id,
                &self.options(persistent),
                p.deadline(),
                stop.received(),
            )
            .await;
        let (entered, stopped) = match entry {
            Ok(Entry::Entered(entered)) => (entered, None),
            Ok(Entry::OpenedAsStopped(entered, exit)) => {
                info!(barrier = %self.barrier.path(), "stopped, but the barrier had opened with us");
                (entered, Some(exit))
            }
            Ok(Entry::Stopped(exit)) => {
                return Err(AgentError::new(
                    exit,
                    format!(
                    "stopped by {} while {}; our registration was withdrawn and nobody counted it",
                    exit.signal_name(),
                    self.waiting()
                ),
                ))
            }
            Ok(Entry::StoppedUnsettled(exit, e)) => {
                return Err(AgentError::new(
                    exit,
                    format!(
                    "stopped by {} while {}, and our registration could not be withdrawn for sure ({e}): the barrier may have opened counting it, and the others may pass without us",
                    exit.signal_name(),
                    self.waiting()
                ),
                ))
            }
            Err(e) => {
                return Err(super::explain_missing(
                    p,
                    session,
                    self.barrier.path(),
                    "Barrier",
                    p.explain(e),
                )
                .await)
            }
        };
        info!(
            barrier = %self.barrier.path(),
            id = %p.id,
            participants = entered.participants,
            was_registered = entered.was_registered,
            "barrier open"
        );
        Ok((entered, stopped))
    }

    async fn leave_with(
        &self,
        session: &Session,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), AgentError> {
        let p = self.participant;
        self.barrier
            .leave(session, &p.id, deadline)
            .await
            .map_err(|e| p.explain(e))?;
        info!(barrier = %self.barrier.path(), id = %p.id, "everyone has left");
        Ok(())
    }

    /// `enter` (init container): registers with a persistent node, which
    /// outlives this process, and returns once the barrier is open. SIGTERM
    /// while waiting removes the registration (exit 143).
    pub async fn enter(&self, mut stop: Termination) -> Result<i32, AgentError> {
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        // Stopped as the barrier opened with us: we are counted, and our
        // registration stays for the others; the init container succeeded.
        let result = self.enter_with(&session, true, &mut stop).await;
        close(session).await;
        result.map(|_| 0)
    }

    /// Connects and enters with an ephemeral registration (sidecar, run),
    /// unless stopped first; on failure the session is closed. Stopped as
    /// the barrier opened with us, it leaves (the others count us, and
    /// wait for us to leave) and reports the signal.
    async fn enter_ephemeral(
        &self,
        stop: &mut Termination,
    ) -> Result<(Session, Entered), AgentError> {
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        match self.enter_with(&session, false, stop).await {
            Ok((entered, None)) => Ok((session, entered)),
            Ok((_, Some(exit))) => {
                let left = self.leave_with(&session, self.participant.deadline()).await;
                close(session).await;
                Err(AgentError::new(
                    exit,
                    format!(
                        "stopped by {} as the barrier {} opened with us; {}",
                        exit.signal_name(),
                        self.barrier.path(),
                        match left {
                            Ok(()) => "we left it, after everyone".to_owned(),
                            Err(e) => format!("leaving failed: {e}"),
                        }
                    ),
                ))
            }
            Err(e) => {
                close(session).await;
                Err(e)
            }
        }
    }

    /// `leave`: leaves and returns once every participant has left.
    /// SIGTERM or SIGINT stops the wait (exit 143 or 130) and removes our
    /// node, as for `enter`.
    pub async fn leave(&self, mut stop: Termination) -> Result<i32, AgentError> {
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        let result = stop
            .unless_stopped(
                &format!(
                    "waiting for everyone to leave the barrier {}",
                    self.barrier.path()
                ),
                self.leave_with(&session, self.participant.deadline()),
            )
            .await;
        close(session).await;
        result.map(|_| 0)
    }

    /// `sidecar`: enters with an ephemeral node, reports ready once open,
    /// holds the session while the pod runs, and leaves on SIGTERM within
    /// `grace`. SIGTERM before the barrier opened removes the registration.
    pub async fn sidecar(
        &self,
        mut stop: Termination,
        readiness: &ReadinessOptions,
        grace: Duration,
    ) -> Result<i32, AgentError> {
        let readiness = Readiness::start(readiness).await?;
        let (session, entered) = self.enter_ephemeral(&mut stop).await?;
        readiness.set_ready()?;
        let outcome = tokio::select! {
            _ = stop.received() => {
                info!("asked to stop: leaving the barrier");
                readiness.clear();
                let deadline = tokio::time::Instant::now() + grace;
                self.leave_with(&session, Some(deadline)).await.map(|_| 0)
            }
            reason = self.registration(&session, &entered).lost() => {
                readiness.clear();
                Err(self.registration_lost(reason, ""))
            }
        };
        close(session).await;
        outcome
    }

    /// `run`: enters, runs `command`, leaves; returns the command's exit
    /// code. If our registration is lost while the command runs (the
    /// session expired or may have: the peers would finish the round
    /// without us), the command is terminated and the exit is 5.
    pub async fn run(
        &self,
        mut stop: Termination,
        command: &[String],
        grace: Duration,
    ) -> Result<i32, AgentError> {
        child::check_command(command)?;
        let (session, entered) = self.enter_ephemeral(&mut stop).await?;
        let ended = match child::spawn(command, &[], grace) {
            Ok(child) => {
                let registration = self.registration(&session, &entered);
                child::supervise(child, &mut stop, registration.lost(), grace).await
            }
            Err(e) => Err(e),
        };
        let code = match ended {
            Ok(Ended::Exited(code)) => code,
            Ok(Ended::Interrupted(reason, code)) => {
                close(session).await;
                return Err(self.registration_lost(
                    reason,
                    &format!("; the command was terminated (it exited {code})"),
                ));
            }
            Err(e) => {
                close(session).await;
                return Err(e);
            }
        };
        info!(code, "the command exited; leaving the barrier");
        let left = self.leave_with(&session, self.participant.deadline()).await;
        close(session).await;
        match left {
            Ok(()) => Ok(code),
            // The command's own failure matters more than how leaving went.
            Err(e) if code != 0 => {
                warn!(error = %e, "could not leave the barrier");
                Ok(code)
            }
            Err(e) => Err(e),
        }
    }
}
