//! `zkgate barrier enter | leave | sidecar | run`.

use std::time::Duration;

use tracing::{info, warn};

use super::child::{self, Ended};
use super::exit::{AgentError, Exit};
use super::ready::{Readiness, ReadinessOptions};
use super::{close, termination, Participant};
use crate::zk::{DoubleBarrier, EnterOptions, HoldMonitor, Session};

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

    async fn enter_with(&self, session: &Session, persistent: bool) -> Result<String, AgentError> {
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
        Ok(entered.node)
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
    /// outlives this process, and returns once the barrier is open.
    pub async fn enter(&self) -> Result<i32, AgentError> {
        let session = self.participant.connect().await?;
        let result = self.enter_with(&session, true).await;
        close(session).await;
        result.map(|_| 0)
    }

    /// `leave`: leaves and returns once every participant has left.
    pub async fn leave(&self) -> Result<i32, AgentError> {
        let session = self.participant.connect().await?;
        let result = self.leave_with(&session, self.participant.deadline()).await;
        close(session).await;
        result.map(|_| 0)
    }

    /// `sidecar`: enters with an ephemeral node, reports ready once open,
    /// holds the session while the pod runs, and leaves on SIGTERM within
    /// `grace`.
    pub async fn sidecar(
        &self,
        readiness: &ReadinessOptions,
        grace: Duration,
    ) -> Result<i32, AgentError> {
        let readiness = Readiness::start(readiness).await?;
        let session = self.participant.connect().await?;
        let node = match self.enter_with(&session, false).await {
            Ok(node) => node,
            Err(e) => {
                close(session).await;
                return Err(e);
            }
        };
        readiness.set_ready()?;
        let outcome = tokio::select! {
            stop = termination() => {
                stop?;
                info!("asked to stop: leaving the barrier");
                readiness.clear();
                let deadline = tokio::time::Instant::now() + grace;
                self.leave_with(&session, Some(deadline)).await.map(|_| 0)
            }
            reason = HoldMonitor::new(&session, node, true).lost() => {
                readiness.clear();
                Err(AgentError::new(
                    Exit::Unavailable,
                    format!("our registration in the barrier {} was lost: {reason} (servers {})", self.barrier.path(), self.participant.connect_string()),
                ))
            }
        };
        close(session).await;
        outcome
    }

    /// `run`: enters, runs `command`, leaves; returns the command's exit code.
    pub async fn run(&self, command: &[String], grace: Duration) -> Result<i32, AgentError> {
        child::check_command(command)?;
        let session = self.participant.connect().await?;
        if let Err(e) = self.enter_with(&session, false).await {
            close(session).await;
            return Err(e);
        }
        let code = match child::spawn(command, &[]) {
            Ok(child) => match child::supervise(child, std::future::pending::<()>(), grace).await {
                Ok(Ended::Exited(code)) | Ok(Ended::Interrupted((), code)) => code,
                Err(e) => {
                    close(session).await;
                    return Err(e);
                }
            },
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
