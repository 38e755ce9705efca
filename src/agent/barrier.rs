//! `zkgate barrier enter | leave | sidecar | run`.

use futures::FutureExt as _;
use std::time::Duration;

use tracing::{info, warn};

use super::child::{self, Ended};
use super::exit::{AgentError, Exit};
use super::in_place::PodRecord;
use super::ready::{Readiness, ReadinessOptions};
use super::{close, Participant, Termination};
use crate::zk::{
    for_want_of_zookeeper, when_reachable, within, BarrierData, DoubleBarrier, EnterOptions,
    Entered, Entry, GangBarrier, HoldMonitor, KeptRegistration, RoundEnd, RunMarks, Session,
};

/// How often a waiting participant logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// One participant command on one barrier.
pub struct BarrierCommand<'a> {
    participant: &'a Participant,
    barrier: DoubleBarrier,
    participants: Option<u32>,
    run: Option<String>,
    released: Option<std::path::PathBuf>,
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
            released: None,
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

    /// `run`: the file that exists from just before the command starts
    /// after an opening (each round's, in rounds) until the member has
    /// left after it exited 0; removed at once after a failure, a stop or
    /// a round's end: the wrap form's readiness, which a queue's
    /// `waitForPodsReady` reads (issue 42). None: no file.
    pub fn released_file(self, file: Option<std::path::PathBuf>) -> Self {
        BarrierCommand {
            released: file,
            ..self
        }
    }

    /// What [`Self::released_file`] asks for, not released yet (a file an
    /// earlier life left is removed).
    async fn released(&self) -> Result<Readiness, AgentError> {
        Readiness::start(&ReadinessOptions {
            file: self.released.clone(),
            probe_addr: None,
        })
        .await
    }

    fn options(&self, persistent: bool) -> EnterOptions {
        EnterOptions {
            // Every barrier member of this version waits for earlier
            // rounds' run marks (see `join_round`).
            data: crate::zk::ParticipantData {
                honours_run_marks: true,
                ..self.participant.identity()
            },
            persistent,
            create_with_participants: self.participants,
            progress_every: Some(PROGRESS_EVERY),
            run: self.run.clone(),
        }
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
        self.enter_at(&self.barrier, session, persistent, stop)
            .await
    }

    /// [`BarrierCommand::enter_with`] at `barrier` (this one, or one of its
    /// rounds).
    async fn enter_at(
        &self,
        barrier: &DoubleBarrier,
        session: &Session,
        persistent: bool,
        stop: &mut Termination,
    ) -> Result<(Entered, Option<Exit>), AgentError> {
        let p = self.participant;
        let waiting = format!("waiting for the barrier {} to open", barrier.path());
        let entry = barrier
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
                info!(barrier = %barrier.path(), "stopped, but the barrier had opened with us");
                (entered, Some(exit))
            }
            Ok(Entry::Stopped(exit)) => {
                return Err(AgentError::new(
                    exit,
                    format!(
                    "stopped by {} while {}; our registration was withdrawn and nobody counted it",
                    exit.signal_name(),
                    waiting
                ),
                ))
            }
            Ok(Entry::StoppedUnsettled(exit, e)) => {
                return Err(AgentError::new(
                    exit,
                    format!(
                    "stopped by {} while {}, and our registration could not be withdrawn for sure ({e}): the barrier may have opened counting it, and the others may pass without us",
                    exit.signal_name(),
                    waiting
                ),
                ))
            }
            Err(e) => {
                return Err(super::explain_missing(
                    p,
                    session,
                    barrier.path(),
                    "Barrier",
                    p.explain(e),
                )
                .await)
            }
        };
        info!(
            barrier = %barrier.path(),
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
        self.leave_at(&self.barrier, session, deadline).await
    }

    /// [`BarrierCommand::leave_with`] at `barrier` (this one, or one of its
    /// rounds).
    async fn leave_at(
        &self,
        barrier: &DoubleBarrier,
        session: &Session,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), AgentError> {
        let p = self.participant;
        barrier
            .leave(session, &p.id, deadline)
            .await
            .map_err(|e| p.explain(e))?;
        info!(barrier = %barrier.path(), id = %p.id, "everyone has left");
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

    /// Enters with an ephemeral registration (sidecar, run) on `session`,
    /// unless stopped first; on failure the session is closed. Stopped as
    /// the barrier opened with us, it leaves (the others count us, and
    /// wait for us to leave) and reports the signal.
    async fn enter_ephemeral_on(
        &self,
        session: Session,
        stop: &mut Termination,
    ) -> Result<(Session, Entered), AgentError> {
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
    /// On a barrier in rounds it takes part only given `in_place` (the
    /// record of a pod whose containers restart in place on its exit 7:
    /// see [`super::in_place`]); without, it is refused (exit 2).
    pub async fn sidecar(
        &self,
        mut stop: Termination,
        readiness: &ReadinessOptions,
        grace: Duration,
        in_place: Option<&PodRecord>,
    ) -> Result<i32, AgentError> {
        let readiness = Readiness::start(readiness).await?;
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        if let Some(record) = in_place {
            match self.peek(&session, &mut stop).await {
                Ok(Some(data)) if data.round.is_some() => {
                    let joined = self
                        .sidecar_joins_round(&session, &mut stop, &readiness, record)
                        .await;
                    let (session, outcome) = match joined {
                        Ok(round) => {
                            let mut kept =
                                KeptRegistration::new(session, round.entered.node.clone());
                            let outcome = self
                                .sidecar_in_round(&mut kept, &mut stop, &readiness, record, round)
                                .await;
                            (kept.into_session(), outcome)
                        }
                        Err(e) => (session, Err(e)),
                    };
                    readiness.clear();
                    if matches!(record.opened(), Ok(Some(_))) {
                        // Our registration of the round recorded stays
                        // until the pod's next life withdraws it, once the
                        // kubelet has stopped the commands.
                        session.abandon();
                    } else {
                        close(session).await;
                    }
                    return outcome;
                }
                Ok(_) => {}
                Err(e) => {
                    close(session).await;
                    return Err(e);
                }
            }
        }
        let (session, entered) = self.enter_ephemeral_on(session, &mut stop).await?;
        // The pod's commands run from here on, and need nothing of
        // ZooKeeper: an outage, however long, neither stops this sidecar
        // nor takes its readiness (see `run`).
        let mut kept = KeptRegistration::new(session, entered.node);
        if let Err(e) = readiness.set_ready() {
            close(kept.into_session()).await;
            return Err(e);
        }
        let lost = tokio::select! {
            _ = stop.received() => None,
            reason = kept.keep() => Some(reason),
        };
        readiness.clear();
        let outcome = match lost {
            Some(reason) => Err(self.registration_lost(reason, "")),
            None => {
                info!("asked to stop: leaving the barrier");
                let deadline = tokio::time::Instant::now() + grace;
                self.leave_kept(&mut kept, Some(deadline)).await.map(|_| 0)
            }
        };
        close(kept.into_session()).await;
        outcome
    }

    /// Leaves on a kept registration: waits for ZooKeeper when it is away,
    /// until `deadline`.
    async fn leave_kept(
        &self,
        kept: &mut KeptRegistration,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), AgentError> {
        let p = self.participant;
        let barrier = self.barrier.path();
        within(
            deadline,
            || format!("waiting for everyone to leave the barrier {barrier}"),
            when_reachable(kept, async |session| {
                self.barrier.leave(session, &p.id, deadline).await
            }),
        )
        .await
        .map_err(|e| p.explain(e))?;
        info!(barrier = %barrier, id = %p.id, "everyone has left");
        Ok(())
    }

    /// The barrier node's data once it is there (with a controller, which
    /// makes it; without, `None` when missing: ours to make), unless
    /// stopped first: how to enter (in rounds, say).
    async fn peek(
        &self,
        session: &Session,
        stop: &mut Termination,
    ) -> Result<Option<BarrierData>, AgentError> {
        let creating = self.participants.is_some();
        let peek = async {
            let data = if creating {
                self.barrier.data_if_there(session).await
            } else {
                self.barrier
                    .data_when_there(session, self.run.as_deref())
                    .await
            };
            data.map_err(|e| self.participant.explain(e))
        };
        stop.unless_stopped(
            &format!("waiting for the barrier {}", self.barrier.path()),
            peek,
        )
        .await
    }

    /// `sidecar` on a barrier in rounds, in a pod whose containers restart
    /// in place on our exit 7 and on a main container's failure (see
    /// [`super::in_place`]). Finding a round recorded as opened, a
    /// sidecar before us let the commands start in it and is gone: that
    /// round ends (unless it is finishing); in a new life of the pod's
    /// containers (no command runs) we withdraw that sidecar's
    /// registration and meet the gang in the next round, otherwise we exit
    /// 7, so that no command of it runs on. Then it joins the current
    /// round, as `run` does, records the opening and reports ready (the
    /// main containers start), and holds until:
    /// - the round ends (a member failed, was lost or restarted): exit 7,
    ///   our registration left for the next life to withdraw;
    /// - SIGTERM without our `preStop` mark (an in-place restart, or a
    ///   kill with no grace period): nothing changes in ZooKeeper, the
    ///   next life (or our session's expiry) ends the round;
    /// - SIGTERM with it and the main containers' (the pod is killed): the
    ///   round ends for the others, exit 143;
    /// - SIGTERM with ours alone (the main containers all completed): the
    ///   round is marked finishing and we leave it, exit 0; if it had
    ///   ended, the gang cannot meet again without us, and it fails;
    /// - our registration is lost: exit 7 (the others' round ends with it).
    ///
    /// While [`PodRecord::opened`] is there, the caller abandons the
    /// session rather than closing it (the registration stays).
    ///
    /// This part joins the round and reports ready
    /// ([`BarrierCommand::sidecar_in_round`] holds it).
    async fn sidecar_joins_round(
        &self,
        session: &Session,
        stop: &mut Termination,
        readiness: &Readiness,
        record: &PodRecord,
    ) -> Result<Joined, AgentError> {
        let p = self.participant;
        let gang = GangBarrier::new(self.barrier.path());
        let marks = RunMarks::of(gang.path());
        let new_life = record.new_life();
        if new_life {
            // Marks of before our pod's last in-place restart (a
            // liveness kill runs preStop too) say nothing of this life.
            record.clear_marks();
        } else if record.restart_asked() {
            return Err(AgentError::new(
                Exit::Failed,
                format!(
                    "a sidecar of this pod exited 7 and the kubelet restarted only the sidecar, not every container of the pod: this node does not restart pods in place (the RestartAllContainersOnContainerExits gate, Kubernetes 1.36+, on the API server and the kubelet), and the pod's commands may run on beside the gang's next round of the barrier {}: use the wrap form",
                    gang.path()
                ),
            ));
        }
        let restart = |what: String| restart_pod(record, what);
        let opened = record.opened()?;
        if new_life {
            // No main container of ours runs now (the kubelet restarted
            // them all): a mark of ours is of a life whose commands are
            // dead. (In the same life, even with no round recorded as
            // opened, a sidecar before us may have let them start and its
            // record been cleared since: its mark stays, replaced when we
            // mark again, or removed by the controller once the pod ends.)
            marks
                .unmark_earlier_life(session, &p.id, &p.identity())
                .await
                .map_err(|e| p.explain(e))?;
        }
        if let Some(k) = opened {
            let why = if new_life {
                format!("{}'s containers restarted in round {k}", p.id)
            } else {
                format!("{}'s barrier sidecar restarted in round {k}", p.id)
            };
            info!(barrier = %gang.path(), round = k, new_life, "a sidecar before us let the commands start in this round: ending it");
            let end = gang
                .end_round(session, k, &why)
                .await
                .map_err(|e| p.explain(e))?;
            if !new_life && end != RoundEnd::Finishing {
                // The commands may run on: the kubelet stops them on our
                // exit, and the next life withdraws the registration.
                return Err(restart(format!(
                    "round {k} of the barrier {} is over ({why}) while the pod's commands may still run",
                    gang.path()
                )));
            }
            if new_life {
                // The kubelet removed every container of the round's life
                // before ours started: none of its commands runs.
                let node = crate::zk::path::join(&gang.round_path(k), &p.id);
                self.withdraw(session, &node).await?;
            }
            record.clear_opened();
            match end {
                RoundEnd::Finishing => {
                    return Err(failed_barrier(
                        &gang,
                        &format!("round {k} is finishing (a member completed), so the gang cannot restart for us"),
                    ))
                }
                RoundEnd::LimitReached(reason) | RoundEnd::Failed(reason) => {
                    return Err(failed_barrier(&gang, &reason))
                }
                RoundEnd::Restarted { .. } | RoundEnd::AlreadyEnded => {
                    info!(barrier = %gang.path(), round = k, "the pod's containers restarted: meeting the gang in the next round");
                }
            }
        }
        // Dealt with: a sidecar restarted alone from here on is of a life
        // whose commands may run (once we report ready).
        record.end_new_life();
        let mut uid = None;
        let joined = loop {
            if let Some(joined) = self
                .join_round(session, stop, &gang, &mut uid, Some(&marks))
                .await?
            {
                break joined;
            }
        };
        let k = joined.k;
        // Recorded before the main containers can start: a sidecar after
        // us then knows they may be running.
        record.set_opened(k)?;
        record.tell_round(k, rank_of(&joined.members, &p.id), joined.members.len())?;
        readiness.set_ready()?;
        info!(barrier = %gang.path(), round = k, marked = joined.marked, "round open: the main containers start");
        Ok(joined)
    }

    /// The round [`BarrierCommand::sidecar_joins_round`] joined, held while
    /// the main containers run (see [`BarrierCommand::sidecar_joins_round`]
    /// for how it ends). With the main containers marked as running (see
    /// [`RunMarks`]), an outage of any length changes nothing: the round
    /// is watched again once ZooKeeper is back, and only a registration
    /// known to be gone (the server says our session expired) ends our
    /// part (exit 7, the mark left for the next life). Without, the rule
    /// from before: given up early enough for the main containers to be
    /// stopped before our session could expire.
    async fn sidecar_in_round(
        &self,
        kept: &mut KeptRegistration,
        stop: &mut Termination,
        readiness: &Readiness,
        record: &PodRecord,
        joined: Joined,
    ) -> Result<i32, AgentError> {
        let p = self.participant;
        let gang = GangBarrier::new(self.barrier.path());
        let marks = RunMarks::of(gang.path());
        let restart = |what: String| restart_pod(record, what);
        let Joined {
            k,
            entered,
            members,
            marked,
            ..
        } = joined;
        let lost = |reason: crate::zk::LossReason| {
            // Kept: the next life ends the round, in case nobody did.
            restart(format!(
                "our registration in round {k} of the barrier {} was lost: {reason} (servers {}); the others' round ends with it",
                gang.path(),
                p.connect_string()
            ))
        };
        let over = if marked {
            tokio::select! {
                exit = stop.received() => Ok(Err(exit)),
                over = async {
                    loop {
                        match gang.round_over(kept.session(), k, &members).await {
                            Err(e) if for_want_of_zookeeper(&e) => {
                                warn!(barrier = %gang.path(), round = k, error = %e, "ZooKeeper unreachable: the main containers go on, and the round is watched again once it is back");
                                if let Err(reason) = kept.back().await {
                                    break Err(reason);
                                }
                            }
                            over => break Ok(over),
                        }
                    }
                } => match over {
                    Ok(over) => over.map(Ok),
                    Err(reason) => {
                        readiness.clear();
                        return Err(lost(reason));
                    }
                },
            }
        } else {
            let session = kept.session();
            tokio::select! {
                exit = stop.received() => Ok(Err(exit)),
                over = gang.round_over(session, k, &members) => over.map(Ok),
                reason = self.registration(session, &entered).lost() => {
                    readiness.clear();
                    return Err(lost(reason));
                }
            }
        };
        readiness.clear();
        let session = kept.session();
        match over.map_err(|e| p.explain(e))? {
            // Not withdrawn: the commands run until the kubelet stops them
            // on our exit; the next life withdraws it.
            Ok(why) => Err(restart(format!(
                "round {k} of the barrier {} ended ({why})",
                gang.path()
            ))),
            Err(exit) if !record.ending() => Err(AgentError::new(
                exit,
                format!(
                    "stopped by {} with no preStop of ours (the kubelet restarts the pod's containers in place, or kills them with no grace period): round {k} of the barrier {} is left to the pod's next life, or to our session's expiry",
                    exit.signal_name(),
                    gang.path()
                ),
            )),
            Err(exit) if record.stopping() => {
                let why = format!("{}'s pod is being stopped", p.id);
                self.end_round(session, &gang, k, &why, &entered.node)
                    .await?;
                // The mark stays: the kubelet stops a pod's sidecars after
                // its main containers only until the grace period runs out,
                // so theirs may still run; the controller removes it once
                // the pod is gone (found in review).
                record.clear_opened();
                Err(AgentError::new(
                    exit,
                    format!(
                        "stopped by {} with the pod (its preStop ran): round {k} of the barrier {} was ended for the others",
                        exit.signal_name(),
                        gang.path()
                    ),
                ))
            }
            Err(_) => {
                if gang
                    .start_leaving(session, k)
                    .await
                    .map_err(|e| p.explain(e))?
                {
                    // The main containers have exited: waiting for the
                    // others to leave would only hold the pod up.
                    info!(barrier = %gang.path(), round = k, "the main containers completed; leaving the round");
                    marks
                        .unmark(session, &p.id)
                        .await
                        .map_err(|e| p.explain(e))?;
                    self.withdraw(session, &entered.node).await?;
                    record.clear_opened();
                    return Ok(0);
                }
                // Our commands cannot run again, and the gang cannot meet
                // without us: it fails, saying so, rather than wait.
                let reason = format!(
                    "{}'s main containers completed as round {k} ended: the gang cannot meet again without it",
                    p.id
                );
                gang.fail(session, &reason)
                    .await
                    .map_err(|e| p.explain(e))?;
                marks
                    .unmark(session, &p.id)
                    .await
                    .map_err(|e| p.explain(e))?;
                self.withdraw(session, &entered.node).await?;
                record.clear_opened();
                Err(failed_barrier(&gang, &reason))
            }
        }
    }

    /// `run`: enters, runs `command`, leaves; returns the command's exit
    /// code. Once the barrier opened, a ZooKeeper outage stops nothing
    /// (our registration is kept: [`KeptRegistration`]); only a
    /// registration deleted by someone else terminates the command, and
    /// the exit is 5.
    pub async fn run(
        &self,
        mut stop: Termination,
        command: &[String],
        grace: Duration,
    ) -> Result<i32, AgentError> {
        child::check_command(command)?;
        if let Some(file) = &self.released {
            // Also done before the participant's credentials are fetched
            // (the command line's `run`); here for every other caller.
            super::ready::refuse_special(file)?;
            super::ready::remove(file);
        }
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        // A barrier in rounds is entered round by round. Without a
        // controller (`--participants`), a missing node is ours to make,
        // a plain one; with one, we wait for it to say which it is.
        let found = self.peek(&session, &mut stop).await;
        match found {
            Ok(Some(data)) if data.round.is_some() => {
                return self.run_in_rounds(session, &mut stop, command, grace).await;
            }
            Ok(_) => {}
            Err(e) => {
                close(session).await;
                return Err(e);
            }
        }
        let (session, entered) = self.enter_ephemeral_on(session, &mut stop).await?;
        // From here on the command needs nothing of ZooKeeper: an outage,
        // however long, neither stops nor fails it. Only a registration
        // known to be gone (deleted by someone else) does.
        let mut kept = KeptRegistration::new(session, entered.node);
        let released = match self.released().await {
            Ok(released) => released,
            Err(e) => {
                close(kept.into_session()).await;
                return Err(e);
            }
        };
        let ended = match released.set_ready() {
            Ok(()) => match child::spawn(command, &[], grace) {
                Ok(child) => child::supervise(child, &mut stop, kept.keep(), grace).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let code = match ended {
            Ok(Ended::Exited(code)) => code,
            Ok(Ended::Interrupted(reason, code)) => {
                // Not released before the session's close, which may
                // wait for a server (found in review).
                drop(released);
                close(kept.into_session()).await;
                return Err(self.registration_lost(
                    reason,
                    &format!("; the command was terminated (it exited {code})"),
                ));
            }
            Err(e) => {
                drop(released);
                close(kept.into_session()).await;
                return Err(e);
            }
        };
        // Released while this member leaves after its command completed
        // (its pod must stay Ready while it waits for the others to end);
        // not after a failure, nor once it is being stopped.
        let released = (code == 0 && stop.asked_to_stop().is_none()).then_some(released);
        info!(code, "the command exited; leaving the barrier");
        // Leaving needs ZooKeeper: it waits for it (the user's timeout
        // bounds the wait, as for any leave).
        let left = self
            .leave_kept(&mut kept, self.participant.deadline())
            .await;
        drop(released);
        close(kept.into_session()).await;
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

    /// `run` on a barrier in rounds ([`GangBarrier`]): enters the current
    /// round, runs the command, and when the round ends (a member's
    /// command failed, a member was lost or restarted) stops the command's
    /// whole tree and meets the others again in the next round; the
    /// command never runs while a command of an earlier round still runs
    /// (see [`RunMarks`]: ours is marked before it starts and unmarked once
    /// it is dead). Arriving at a round that opened without us (our
    /// container restarted) ends that round. Returns the command's code
    /// once a round finished with it: `0` when every member completed. A
    /// member that completes marks the round finishing, and from then on a
    /// failure no longer restarts the gang.
    ///
    /// Once marked, the command needs ZooKeeper only to start and to end:
    /// an outage of any length stops nothing, what needs ZooKeeper (the
    /// round's end, the leave) waits for it, and our registration is kept
    /// (the session resumed). Only a registration known to be gone (the
    /// server says our session expired, or it was deleted) ends our part
    /// in the round: the command is stopped, and we meet the gang in the
    /// next round. On a barrier without marks (its controller predates
    /// them) the rule from before holds: the command is stopped before our
    /// session could expire. Closes `session`.
    async fn run_in_rounds(
        &self,
        session: Session,
        stop: &mut Termination,
        command: &[String],
        grace: Duration,
    ) -> Result<i32, AgentError> {
        let p = self.participant;
        let gang = GangBarrier::new(self.barrier.path());
        let marks = RunMarks::of(gang.path());
        let mut session = session;
        // A mark an earlier life of ours left: its command is dead (our
        // container restarted), and it must not hold up a round we join.
        if let Err(e) = marks
            .unmark_earlier_life(&session, &p.id, &p.identity())
            .await
        {
            close(session).await;
            return Err(p.explain(e));
        }
        // The barrier we found (`run` waited for it): one of another uid
        // later is a new Barrier of the same name, and ours was deleted.
        let mut uid = None;
        let outcome = loop {
            let joined = match self
                .join_round(&session, stop, &gang, &mut uid, Some(&marks))
                .await
            {
                Ok(Some(joined)) => joined,
                Ok(None) => continue,
                Err(e) => break Err(e),
            };
            let (after, outcome) = self
                .run_round(session, stop, command, grace, &gang, &marks, joined)
                .await;
            session = after;
            match outcome {
                Ok(Some(code)) => break Ok(code),
                Ok(None) => continue,
                Err(e) => break Err(e),
            }
        };
        close(session).await;
        outcome
    }

    /// Runs the command in the round we joined (see
    /// [`BarrierCommand::run_in_rounds`]) and deals with its end: `Some`
    /// code when we are done, `None` to meet the gang again in the next
    /// round. Returns the session to go on with (a new one when ours was
    /// lost).
    #[allow(clippy::too_many_arguments)]
    async fn run_round(
        &self,
        session: Session,
        stop: &mut Termination,
        command: &[String],
        grace: Duration,
        gang: &GangBarrier,
        marks: &RunMarks,
        joined: Joined,
    ) -> (Session, Result<Option<i32>, AgentError>) {
        let p = self.participant;
        let Joined {
            k,
            round,
            entered,
            members,
            marked,
        } = joined;
        // What the command is told of its round: which it is (a restart
        // resumes from a checkpoint, say), and its place among the round's
        // members, by id.
        let rank = rank_of(&members, &p.id);
        let env = [
            ("ZKGATE_ROUND", k.to_string()),
            ("ZKGATE_RANK", rank.to_string()),
            ("ZKGATE_MEMBERS", members.len().to_string()),
        ];
        let (released, spawned) = match self.released().await {
            Ok(released) => {
                let spawned = released
                    .set_ready()
                    .and_then(|()| child::spawn(command, &env, grace));
                (Some(released), spawned)
            }
            Err(e) => (None, Err(e)),
        };
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                drop(released);
                let unmarked = marks.unmark(&session, &p.id).await;
                if let Err(u) = unmarked {
                    warn!(error = %u, "could not remove our run mark; the controller removes it when the pod ends");
                }
                return (session, Err(e));
            }
        };
        info!(barrier = %gang.path(), round = k, members = members.len(), marked, "round open: running the command");
        let mut kept = KeptRegistration::new(session, entered.node.clone());
        let ended = if marked {
            // Watching the round needs ZooKeeper; while it is away the
            // command goes on, and the watch resumes with the session.
            let interrupt = async {
                loop {
                    match gang.round_over(kept.session(), k, &members).await {
                        Ok(why) => break Interruption::RoundOver(why),
                        Err(e) if for_want_of_zookeeper(&e) => {
                            warn!(barrier = %gang.path(), round = k, error = %e, "ZooKeeper unreachable: the command goes on, and the round is watched again once it is back");
                            if let Err(reason) = kept.back().await {
                                break Interruption::Lost(reason);
                            }
                        }
                        Err(e) => break Interruption::Failed(e),
                    }
                }
            };
            child::supervise_graced(
                child,
                stop,
                interrupt,
                grace,
                |_| grace,
                std::future::pending(),
            )
            .await
        } else {
            // No marks: a registration that may be lost is acted on early
            // enough for the command to be dead, SIGKILL included, before
            // the server can expire the session: the others then end the
            // round and may start the next, which must not run beside it.
            let session = kept.session();
            let loss_grace = grace.min(session.timeout() / 4);
            let registration = self
                .registration(session, &entered)
                .with_reserve(loss_grace + session.timeout() / 10);
            // Followed by the interruption and, once the command is being
            // stopped for another reason (the round ended), by the stop
            // itself: a loss meanwhile cuts the grace short.
            let lost = registration.lost().shared();
            let lost_first = lost.clone();
            let interrupt = async {
                tokio::select! {
                    reason = lost_first => Interruption::Lost(reason),
                    over = gang.round_over(session, k, &members) => match over {
                        Ok(why) => Interruption::RoundOver(why),
                        Err(e) => Interruption::Failed(e),
                    },
                }
            };
            child::supervise_graced(
                child,
                stop,
                interrupt,
                grace,
                // Watching the round can fail with the session too.
                |interruption| match interruption {
                    Interruption::RoundOver(_) => grace,
                    Interruption::Lost(_) | Interruption::Failed(_) => loss_grace,
                },
                lost.map(|_| loss_grace),
            )
            .await
        };
        // The command ended: not released until the next round's starts,
        // unless it completed, when this member stays released while it
        // leaves the round (see `after_round`).
        let completed = matches!(ended, Ok(Ended::Exited(0))) && stop.asked_to_stop().is_none();
        let released = released.filter(|_| completed);
        let outcome = self
            .after_round(
                &mut kept, stop, gang, marks, k, &round, ended, marked, released,
            )
            .await;
        (kept.into_session(), outcome)
    }

    /// What follows the command's end in round `k` (see
    /// [`BarrierCommand::run_round`]): the run mark removed (the command
    /// is dead), then the round finished, ended or met again. Everything
    /// here that needs ZooKeeper waits for it. `released` (a completed
    /// command's) lasts while this member leaves a finishing round.
    #[allow(clippy::too_many_arguments)]
    async fn after_round(
        &self,
        kept: &mut KeptRegistration,
        stop: &mut Termination,
        gang: &GangBarrier,
        marks: &RunMarks,
        k: u32,
        round: &DoubleBarrier,
        ended: Result<Ended<Interruption>, AgentError>,
        marked: bool,
        released: Option<Readiness>,
    ) -> Result<Option<i32>, AgentError> {
        let p = self.participant;
        let node = kept.node().to_owned();
        // Supervising failed (the command's fate unknown): the mark stays,
        // for the controller to remove once the pod has ended.
        let ended = ended?;
        // The command is dead: the next round need not wait for it any
        // more.
        let unmarked = when_reachable(kept, async |s| marks.unmark(s, &p.id).await).await;
        if let Err(e) = unmarked {
            warn!(error = %e, "could not remove our run mark; the controller removes it when the pod ends");
        }
        if let (Some(exit), Ended::Exited(code)) = (stop.asked_to_stop(), &ended) {
            // Our pod is going: whatever the command made of the signal,
            // this member is gone from the round, which ends for the others
            // (they meet our replacement, if any, in the next).
            let why = format!("{} was stopped by {}", p.id, exit.signal_name());
            self.end_kept_round(kept, gang, k, round, &why, &node)
                .await?;
            info!(barrier = %gang.path(), round = k, code, "stopped by {}: the round was ended for the others", exit.signal_name());
            // Not a completion, even if the command made it one: the pod
            // must not count as succeeded while its gang restarts without
            // it (the Job replaces a failed one).
            return Ok(Some(if *code == 0 { exit as i32 } else { *code }));
        }
        match ended {
            Ended::Exited(0) => {
                if when_reachable(kept, async |s| gang.start_leaving(s, k).await)
                    .await
                    .map_err(|e| p.explain(e))?
                {
                    info!(barrier = %gang.path(), round = k, "the command completed; leaving the round");
                    let deadline = p.deadline();
                    within(
                        deadline,
                        || format!("waiting for everyone to leave the barrier {}", round.path()),
                        when_reachable(kept, async |s| round.leave(s, &p.id, deadline).await),
                    )
                    .await
                    .map_err(|e| p.explain(e))?;
                    self.await_commands_ended(kept, marks, k).await?;
                    info!(barrier = %round.path(), id = %p.id, "everyone has left");
                    drop(released);
                    return Ok(Some(0));
                }
                drop(released);
                // The round ended as we completed: the gang runs again, and
                // so do we.
                info!(barrier = %gang.path(), round = k, "the command completed, but the round had ended: meeting again");
                self.withdraw_kept(kept, &node).await?;
                Ok(None)
            }
            Ended::Exited(code) => {
                let why = format!("{}'s command exited {code}", p.id);
                match self
                    .end_kept_round(kept, gang, k, round, &why, &node)
                    .await?
                {
                    RoundEnd::Restarted { .. } | RoundEnd::AlreadyEnded => {
                        info!(barrier = %gang.path(), round = k, code, "the command failed: the gang meets again");
                        Ok(None)
                    }
                    RoundEnd::Finishing => {
                        warn!(barrier = %gang.path(), round = k, code, "the command failed after a member completed: the gang cannot restart");
                        Ok(Some(code))
                    }
                    RoundEnd::LimitReached(reason) | RoundEnd::Failed(reason) => {
                        warn!(barrier = %gang.path(), round = k, code, %reason, "the command failed and the gang cannot restart");
                        Ok(Some(code))
                    }
                }
            }
            Ended::Interrupted(Interruption::RoundOver(why), code) => {
                info!(barrier = %gang.path(), round = k, %why, code, "the round ended: the command was stopped; meeting again");
                self.withdraw_kept(kept, &node).await?;
                match stop.asked_to_stop() {
                    Some(exit) => Err(AgentError::new(
                        exit,
                        format!(
                            "stopped by {} after round {k} of the barrier {} ended ({why})",
                            exit.signal_name(),
                            gang.path()
                        ),
                    )),
                    None => Ok(None),
                }
            }
            Ended::Interrupted(Interruption::Lost(reason), code) if marked => {
                // Our registration is known gone (the servers ran on
                // without us): the others end the round, or have; so do
                // we, and meet them again, our command dead before the
                // next round starts (it waited for our mark).
                warn!(barrier = %gang.path(), round = k, %reason, code, "our registration in the round was lost: the command was stopped; meeting the gang again");
                let why = format!("{} was lost in round {k} ({reason})", p.id);
                match self
                    .end_kept_round(kept, gang, k, round, &why, &node)
                    .await?
                {
                    RoundEnd::Restarted { .. } | RoundEnd::AlreadyEnded => Ok(None),
                    RoundEnd::Finishing => Err(self.registration_lost(
                        reason,
                        &format!(
                            "; the command was terminated (it exited {code}) and round {k} is finishing (a member completed), so the gang cannot restart for us"
                        ),
                    )),
                    RoundEnd::LimitReached(why) | RoundEnd::Failed(why) => {
                        Err(failed_barrier(gang, &why))
                    }
                }
            }
            Ended::Interrupted(Interruption::Lost(reason), code) => Err(self.registration_lost(
                reason,
                &format!("; the command was terminated (it exited {code})"),
            )),
            Ended::Interrupted(Interruption::Failed(e), code) => {
                let err = p.explain(e);
                Err(AgentError::new(
                    err.exit,
                    format!(
                        "{}; the command was terminated (it exited {code})",
                        err.message
                    ),
                ))
            }
        }
    }

    /// [`BarrierCommand::end_round`] on a kept registration: each step
    /// waits for ZooKeeper.
    async fn end_kept_round(
        &self,
        kept: &mut KeptRegistration,
        gang: &GangBarrier,
        k: u32,
        round: &DoubleBarrier,
        why: &str,
        node: &str,
    ) -> Result<RoundEnd, AgentError> {
        let p = self.participant;
        let end = when_reachable(kept, async |s| gang.end_round(s, k, why).await)
            .await
            .map_err(|e| p.explain(e))?;
        if end == RoundEnd::Finishing {
            let deadline = p.deadline();
            when_reachable(kept, async |s| round.leave(s, &p.id, deadline).await)
                .await
                .map_err(|e| p.explain(e))?;
            self.await_commands_ended(kept, &RunMarks::of(gang.path()), k)
                .await?;
        } else {
            self.withdraw_kept(kept, node).await?;
        }
        Ok(end)
    }

    /// After the leave of finishing round `k`: waits until no other
    /// member's command of it (or of an earlier round) is marked as
    /// running, so that "everyone has left" also means every command ended.
    /// A member cut off while the servers ran on has left the round as far
    /// as they know (its registration went with its session), but its
    /// command may run on until it is back.
    async fn await_commands_ended(
        &self,
        kept: &mut KeptRegistration,
        marks: &RunMarks,
        k: u32,
    ) -> Result<(), AgentError> {
        let p = self.participant;
        let next = k.saturating_add(1);
        within(
            p.deadline(),
            || {
                format!(
                    "waiting for the commands of round {k} of the barrier {} to end",
                    marks.path()
                )
            },
            when_reachable(kept, async |s| {
                marks.await_none_before(s, next, &p.id).await
            }),
        )
        .await
        .map_err(|e| p.explain(e))
    }

    /// Removes our registration from a round that ended, waiting for
    /// ZooKeeper as long as it takes.
    async fn withdraw_kept(
        &self,
        kept: &mut KeptRegistration,
        node: &str,
    ) -> Result<(), AgentError> {
        when_reachable(kept, async |s| {
            crate::zk::tree::delete_if_present(s, node).await
        })
        .await
        .map(|_| ())
        .map_err(|e| self.participant.explain(e))
    }

    /// Joins the current round of `gang` (see [`BarrierCommand::run_in_rounds`]):
    /// enters it, and once it opened with us, waits for the round before to
    /// be empty (no member of it still running) and lists the round's
    /// members, by id. `None` when the round was lost before it started for
    /// us (it opened without us, or a member came or went): meet again in
    /// the next. `uid` is the Barrier's, from the first look: a node of
    /// another uid later is a new Barrier of the same name.
    async fn join_round(
        &self,
        session: &Session,
        stop: &mut Termination,
        gang: &GangBarrier,
        uid: &mut Option<Option<String>>,
        marks: Option<&RunMarks>,
    ) -> Result<Option<Joined>, AgentError> {
        let p = self.participant;
        let failed = |reason: &str| failed_barrier(gang, reason);
        let deleted = || {
            p.explain(crate::zk::ZkError::Deleted {
                path: gang.path().to_owned(),
            })
        };
        let top = self
            .barrier
            .data_if_there(session)
            .await
            .map_err(|e| p.explain(e))?
            .ok_or_else(deleted)?;
        if uid.get_or_insert_with(|| top.uid.clone()) != &top.uid {
            return Err(deleted());
        }
        if let Some(reason) = &top.failed {
            return Err(failed(reason));
        }
        let k = top.round.unwrap_or_default();
        let round = gang.round(k);
        let (entered, stopped) = self.enter_at(&round, session, false, stop).await?;
        if let Some(exit) = stopped {
            // Counted as we were stopped: the others wait for us to
            // leave, and this round ends with us gone.
            let why = format!("{} was stopped by {}", p.id, exit.signal_name());
            self.end_round(session, gang, k, &why, &entered.node)
                .await?;
            return Err(AgentError::new(exit, format!("stopped by {} as round {k} of the barrier {} opened; the round was ended for the others", exit.signal_name(), gang.path())));
        }
        if !gang
            .counted(session, k, &entered.node)
            .await
            .map_err(|e| p.explain(e))?
        {
            // Round k opened without us: we restarted after it began.
            let why = format!("{} restarted after round {k} opened", p.id);
            info!(barrier = %gang.path(), round = k, "the round opened without us: ending it, to meet again in the next");
            match self.end_round(session, gang, k, &why, &entered.node).await? {
                RoundEnd::Restarted { .. } | RoundEnd::AlreadyEnded => return Ok(None),
                RoundEnd::Finishing => {
                    return Err(failed(&format!(
                        "round {k} is finishing (a member completed), so the gang cannot restart for us"
                    )))
                }
                RoundEnd::LimitReached(reason) | RoundEnd::Failed(reason) => {
                    return Err(failed(&reason))
                }
            }
        }
        let mut entered = entered;
        if let Some(before) = k.checked_sub(1) {
            // No command of this round while one of the round before
            // still runs (a member whose pod is stopping, which this
            // round went on without, may take its grace period).
            let emptied = async {
                gang.await_round_empty(session, before).await?;
                // And no command of an earlier round still runs whose
                // member's registration went before it (cut off, say).
                RunMarks::of(gang.path())
                    .await_none_before(session, k, &p.id)
                    .await
            };
            let outcome = tokio::select! {
                emptied = emptied => emptied.map_err(|e| p.explain(e)),
                reason = self.registration(session, &entered).lost() => Err(self.registration_lost(reason, "")),
                exit = stop.received() => Err(AgentError::new(exit, format!("stopped by {} as round {k} of the barrier {} opened; the round was ended for the others", exit.signal_name(), gang.path()))),
            };
            if let Err(e) = outcome {
                if let Some(exit) = stop.asked_to_stop() {
                    let why = format!("{} was stopped by {}", p.id, exit.signal_name());
                    self.end_round(session, gang, k, &why, &entered.node)
                        .await?;
                }
                return Err(e);
            }
        }
        let mut members = loop {
            if let Some(members) = gang.members(session, k).await.map_err(|e| p.explain(e))? {
                break members;
            }
            // A member came or went since the opening, and none has
            // completed: the round is lost before its commands start.
            // End it (if nobody has).
            let why = format!("a member of round {k} was lost before its commands started");
            info!(barrier = %gang.path(), round = k, "{why}: meeting again in the next round");
            match gang
                .end_round(session, k, &why)
                .await
                .map_err(|e| p.explain(e))?
            {
                // A member completed meanwhile: the round stands, and
                // its members are listed again (now with that mark).
                RoundEnd::Finishing => continue,
                RoundEnd::Restarted { .. } | RoundEnd::AlreadyEnded => {
                    self.withdraw(session, &entered.node).await?;
                    return Ok(None);
                }
                RoundEnd::LimitReached(reason) | RoundEnd::Failed(reason) => {
                    self.withdraw(session, &entered.node).await?;
                    return Err(failed(&reason));
                }
            }
        };
        // As the barrier says (fixed when it was made), so that members of
        // two versions of zkgate in one gang rank alike.
        if top.numeric_ranks {
            members.sort_by(|a, b| by_number(a, b));
        } else {
            members.sort();
        }
        // Our command marked before it starts (the wrap form), then our
        // registration confirmed: a member of a later round that found our
        // registration gone finds the mark (made before that).
        // Only where every member of the round waits for marks: one of a
        // zkgate from before them (a gang across an upgrade) could start
        // the next round beside a command that runs on.
        let all_honour = match marks {
            Some(_) => gang
                .all_honour_marks(session, k)
                .await
                .map_err(|e| p.explain(e))?,
            None => false,
        };
        let marked = match marks {
            Some(marks) if all_honour => marks
                .mark(session, &p.id, k, &p.identity())
                .await
                .map_err(|e| p.explain(e))?,
            _ => false,
        };
        if marked || k > 0 {
            // Confirmed afresh: the command's monitor counts from here,
            // not from the opening, which may be long past.
            match gang.confirm(session, &entered.node).await {
                Ok(at) => entered.confirmed_at = at,
                Err(e) => {
                    if let (true, Some(marks)) = (marked, marks) {
                        if let Err(u) = marks.unmark(session, &p.id).await {
                            warn!(error = %u, "could not remove our run mark; the controller removes it when the pod ends");
                        }
                    }
                    return Err(p.explain(e));
                }
            }
        }
        Ok(Some(Joined {
            k,
            round,
            entered,
            members,
            marked,
        }))
    }

    /// Ends round `k` (see [`GangBarrier::end_round`]) and withdraws our
    /// registration `node` from it, unless the round is finishing (then
    /// our registration stays, for the leave).
    async fn end_round(
        &self,
        session: &Session,
        gang: &GangBarrier,
        k: u32,
        why: &str,
        node: &str,
    ) -> Result<RoundEnd, AgentError> {
        let p = self.participant;
        let end = gang
            .end_round(session, k, why)
            .await
            .map_err(|e| p.explain(e))?;
        if end == RoundEnd::Finishing {
            self.leave_at(&gang.round(k), session, p.deadline()).await?;
        } else {
            self.withdraw(session, node).await?;
        }
        Ok(end)
    }

    /// Removes our registration from a round that ended.
    async fn withdraw(&self, session: &Session, node: &str) -> Result<(), AgentError> {
        crate::zk::tree::delete_if_present(session, node)
            .await
            .map(|_| ())
            .map_err(|e| self.participant.explain(e))
    }
}

/// The sidecar in rounds' exit 7 for `what`: the kubelet restarts every
/// container of the pod, to meet the gang in the next round. Asked of the
/// kubelet once per life: a sidecar of the same life finding that it was
/// asked knows the kubelet did not do it.
fn restart_pod(record: &PodRecord, what: String) -> AgentError {
    if let Err(e) = record.ask_restart() {
        return e;
    }
    AgentError::new(
        Exit::Restart,
        format!("{what}: restarting the pod's containers to meet the gang in the next round"),
    )
}

/// `id`'s place among a round's `members` (sorted [`by_number`]).
fn rank_of(members: &[String], id: &str) -> usize {
    members.iter().position(|m| m == id).unwrap_or_default()
}

/// Orders ids as text, but runs of digits by their value: so the pods of an
/// Indexed Job (`train-2-x7k2p` before `train-10-b9q4z`) are ranked in the
/// order of their completion index, as launchers expect of a rank.
fn by_number(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> impl Iterator<Item = &str> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = rest.chars().next()?;
            let digits = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digits)
                .unwrap_or(rest.len());
            let (chunk, tail) = rest.split_at(end);
            rest = tail;
            Some(chunk)
        })
    }
    let (mut x, mut y) = (chunks(a), chunks(b));
    loop {
        let order = match (x.next(), y.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(p), Some(q))
                if p.starts_with(|c: char| c.is_ascii_digit())
                    && q.starts_with(|c: char| c.is_ascii_digit()) =>
            {
                let (p, q) = (p.trim_start_matches('0'), q.trim_start_matches('0'));
                p.len().cmp(&q.len()).then_with(|| p.cmp(q))
            }
            (Some(p), Some(q)) => p.cmp(q),
        };
        if order.is_ne() {
            return order;
        }
    }
}

/// The barrier `gang` failed, for `reason` (exit 4).
fn failed_barrier(gang: &GangBarrier, reason: &str) -> AgentError {
    AgentError::new(
        Exit::Failed,
        format!(
            "barrier {} failed: {reason}; see the Barrier's status and events",
            gang.path()
        ),
    )
}

/// A round joined ([`BarrierCommand::join_round`]).
struct Joined {
    /// Its number.
    k: u32,
    /// Its double barrier.
    round: DoubleBarrier,
    /// Our registration in it.
    entered: Entered,
    /// Its members' ids, sorted.
    members: Vec<String>,
    /// Whether our command is marked as running (see [`RunMarks`]).
    marked: bool,
}

/// Why a command running in a round was stopped.
enum Interruption {
    /// Our registration was lost.
    Lost(crate::zk::LossReason),
    /// The round ended (why).
    RoundOver(String),
    /// Watching the round failed.
    Failed(crate::zk::ZkError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_the_numbers_in_ids_so_an_indexed_jobs_pods_rank_by_index() {
        let mut ids: Vec<String> = [
            "ddp-train-10-b9q4z",
            "ddp-train-2-x7k2p",
            "ddp-train-0-zzzzz",
            "ddp-train-1-aaaaa",
            "ddp-train-02-aaaaa",
        ]
        .map(String::from)
        .to_vec();
        ids.sort_by(|a, b| by_number(a, b));
        assert_eq!(
            ids,
            [
                "ddp-train-0-zzzzz",
                "ddp-train-1-aaaaa",
                "ddp-train-02-aaaaa",
                "ddp-train-2-x7k2p",
                "ddp-train-10-b9q4z"
            ]
        );
        assert_eq!(rank_of(&ids, "ddp-train-10-b9q4z"), 4);
        // Text without numbers sorts as text; a prefix comes first.
        assert_eq!(by_number("a", "b"), std::cmp::Ordering::Less);
        assert_eq!(by_number("pod", "pod-1"), std::cmp::Ordering::Less);
        assert_eq!(by_number("x9", "x9"), std::cmp::Ordering::Equal);
    }
}
