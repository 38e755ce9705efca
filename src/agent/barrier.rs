//! `zkgate barrier enter | leave | sidecar | run`.

use std::time::Duration;

use tracing::{info, warn};

use super::child::{self, Ended};
use super::exit::{AgentError, Exit};
use super::ready::{Readiness, ReadinessOptions};
use super::{close, Participant, Termination};
use crate::zk::{DoubleBarrier, EnterOptions, Entered, HoldMonitor, Session};

/// How often a waiting participant logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// One participant command on one barrier.
pub struct BarrierCommand<'a> {
    participant: &'a Participant,
    barrier: DoubleBarrier,
    participants: Option<u32>,
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
        })
    }

    fn options(&self, persistent: bool) -> EnterOptions {
        EnterOptions {
            data: self.participant.identity(),
            persistent,
            create_with_participants: self.participants,
            progress_every: Some(PROGRESS_EVERY),
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

    async fn enter_with(&self, session: &Session, persistent: bool) -> Result<Entered, AgentError> {
        let p = self.participant;
        let entered = match self
            .barrier
            .enter(session, &p.id, &self.options(persistent), p.deadline())
            .await
        {
            Ok(entered) => entered,
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
        Ok(entered)
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
    pub async fn enter(&self) -> Result<i32, AgentError> {
        let mut stop = Termination::install()?;
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        let result = stop
            .unless_stopped(&self.waiting(), self.enter_with(&session, true))
            .await;
        close(session).await;
        result.map(|_| 0)
    }

    /// Connects and enters with an ephemeral registration (sidecar, run),
    /// unless stopped first; on failure the session is closed.
    async fn enter_ephemeral(
        &self,
        stop: &mut Termination,
    ) -> Result<(Session, Entered), AgentError> {
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        match stop
            .unless_stopped(&self.waiting(), self.enter_with(&session, false))
            .await
        {
            Ok(entered) => Ok((session, entered)),
            Err(e) => {
                close(session).await;
                Err(e)
            }
        }
    }

    /// `leave`: leaves and returns once every participant has left.
    /// SIGTERM or SIGINT stops the wait (exit 143 or 130) and removes our
    /// node, as for `enter`.
    pub async fn leave(&self) -> Result<i32, AgentError> {
        let mut stop = Termination::install()?;
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
        readiness: &ReadinessOptions,
        grace: Duration,
    ) -> Result<i32, AgentError> {
        let mut stop = Termination::install()?;
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
    pub async fn run(&self, command: &[String], grace: Duration) -> Result<i32, AgentError> {
        child::check_command(command)?;
        let mut stop = Termination::install()?;
        let (session, entered) = self.enter_ephemeral(&mut stop).await?;
        let ended = match child::spawn(command, &[]) {
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
