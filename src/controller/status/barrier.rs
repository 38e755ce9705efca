//! The Barrier's status rules.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{
    bound, bound_conditions, bound_name, bound_name_some, bound_notes, bounded_name, condition,
    jiff_span, note, pods_tracked, spec_accepted, time_of_millis, warning, Capped, Note,
    LIST_LIMIT, LOST_KEPT, TEXT_LIMIT,
};
use crate::api::{BarrierPhase, BarrierSpec, BarrierStatus, OnParticipantLoss, ParticipantStatus};
use crate::zk::tree::Snapshot;
use crate::zk::{BarrierData, ParticipantData, READY};

/// What to do about a barrier.
#[derive(Clone, Debug, PartialEq)]
pub struct BarrierOutcome {
    /// The status to write.
    pub status: BarrierStatus,
    /// Mark the barrier failed in ZooKeeper with this reason.
    pub fail: Option<String>,
    /// Events to record.
    pub notes: Vec<Note>,
    /// Reconcile again after this long at the latest (a timeout to enforce).
    pub requeue: Option<Duration>,
}

/// Everything the barrier's status is computed from.
pub struct BarrierObservation<'a> {
    /// The spec.
    pub spec: &'a BarrierSpec,
    /// How many participants open it (the spec's, or its Job's).
    pub participants: u32,
    /// When the resource was created.
    pub created: Option<Timestamp>,
    /// The barrier node, read just now.
    pub node: &'a Snapshot,
    /// The status written last time.
    pub previous: &'a BarrierStatus,
    /// The resource's generation.
    pub generation: Option<i64>,
    /// The barrier node's path.
    pub znode: &'a str,
    /// Now.
    pub now: Timestamp,
    /// What in the spec could not be applied, if anything.
    pub spec_problem: Option<&'a str>,
    /// Why it is held (`spec.after`), if it is.
    pub held: Option<&'a str>,
    /// Why it must fail because of its `after` (a named Barrier failed, or
    /// a cycle), if it must.
    pub after_failed: Option<&'a str>,
    /// In rounds: how many commands of this round or an earlier one are
    /// still marked as running ([`crate::zk::RunMarks`]). A member cut off
    /// while the servers ran on has left as far as its registration goes,
    /// but not until its command ended: the barrier is not Completed
    /// before.
    pub still_running: u32,
}

impl Capped for BarrierStatus {
    fn capped(&self) -> Self {
        let mut written = self.clone();
        let total = written.participants.len() + written.unlisted as usize;
        written.participants.truncate(LIST_LIMIT);
        written.unlisted = (total - written.participants.len()) as u32;
        written
    }
}

impl BarrierOutcome {
    /// Every text from ZooKeeper in the status and the events cut to
    /// [`TEXT_LIMIT`], names and reasons to [`NAME_LIMIT`].
    fn bound_texts(&mut self) {
        let status = &mut self.status;
        bound_name_some(&mut status.reason);
        if let Some(message) = &mut status.message {
            bound(message, TEXT_LIMIT);
        }
        bound_conditions(&mut status.conditions);
        for p in &mut status.participants {
            bound_name(&mut p.id);
            bound_name_some(&mut p.pod);
        }
        for end in &mut status.round_ends {
            bound(end, TEXT_LIMIT);
        }
        bound_notes(&mut self.notes);
    }
}

/// Computes a barrier's status (its texts bounded: [`TEXT_LIMIT`]).
pub fn barrier(obs: &BarrierObservation<'_>) -> BarrierOutcome {
    let mut outcome = unbounded(obs);
    outcome.bound_texts();
    outcome
}

fn unbounded(obs: &BarrierObservation<'_>) -> BarrierOutcome {
    let data = BarrierData::parse(obs.znode, &obs.node.data)
        .ok()
        .flatten()
        .unwrap_or_default();
    let ready = obs.node.children.iter().find(|c| c.name == READY);
    let members: Vec<_> = obs
        .node
        .children
        .iter()
        .filter(|c| c.name != READY)
        .collect();
    let opened = ready.is_some();
    let mut notes = Vec::new();

    // Merge who is there now with who was seen before.
    // Members are listed by their ids as the status keeps them (bounded),
    // so that the next look finds them again whatever their nodes' names;
    // ids a status kept unbounded (an older controller's) are bounded too.
    let mut participants = obs.previous.participants.clone();
    for p in &mut participants {
        bound_name(&mut p.id);
    }
    let member_ids: Vec<String> = members.iter().map(|m| bounded_name(&m.name)).collect();
    for (member, id) in members.iter().zip(&member_ids) {
        let pod = ParticipantData::parse(&member.data).pod;
        match participants.iter_mut().find(|p| p.id == *id) {
            Some(p) if p.left_at.is_some() => {
                // The same id registered again: a replacement.
                *p = ParticipantStatus {
                    id: id.clone(),
                    pod,
                    entered_at: time_of_millis(member.stat.ctime),
                    ..Default::default()
                };
            }
            Some(_) => {}
            None => participants.push(ParticipantStatus {
                id: id.clone(),
                pod,
                entered_at: time_of_millis(member.stat.ctime),
                ..Default::default()
            }),
        }
    }
    let present: std::collections::HashSet<&str> = member_ids.iter().map(String::as_str).collect();
    let mut lost = Vec::new();
    for p in participants.iter_mut().filter(|p| p.left_at.is_none()) {
        if !present.contains(p.id.as_str()) {
            p.left_at = Some(Time(obs.now));
            if !opened {
                p.lost = true;
                lost.push(p.id.clone());
            }
        }
    }
    participants.sort_by(|a, b| {
        a.entered_at
            .cmp(&b.entered_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    // A Job's retries can lose participants without end: keep the most
    // recent few (they explain a Failed barrier), not every one.
    let lost_seen = participants.iter().filter(|p| p.lost).count();
    if lost_seen > LOST_KEPT {
        let mut lost_times: Vec<_> = participants
            .iter()
            .filter(|p| p.lost)
            .map(|p| (p.left_at.clone().map(|t| t.0), p.id.clone()))
            .collect();
        lost_times.sort();
        let dropped: Vec<_> = lost_times[..lost_seen - LOST_KEPT]
            .iter()
            .map(|(_, id)| id.clone())
            .collect();
        participants.retain(|p| !(p.lost && dropped.contains(&p.id)));
    }
    let mut entered = participants.iter().filter(|p| !p.lost).count() as u32;
    let mut left = participants
        .iter()
        .filter(|p| p.left_at.is_some() && !p.lost)
        .count() as u32;
    if opened {
        // `ready` is made only once x are registered, so an opened barrier
        // had at least x even when a participant entered and left between
        // two looks of the controller (the list shows only those seen).
        entered = entered.max(data.participants);
        if members.is_empty() {
            left = entered;
        }
        // Once open, the counts only grow; a status read back with a capped
        // list (a new term) still knows them.
        if matches!(
            obs.previous.phase,
            Some(BarrierPhase::Open | BarrierPhase::Leaving | BarrierPhase::Completed)
        ) {
            entered = entered.max(obs.previous.entered);
            left = left.max(obs.previous.left).min(entered);
        }
    }

    let mut fail = None;
    let mut requeue = None;
    let previous_phase = obs.previous.phase;
    // A barrier that opened stays opened: a failure marked after `ready`
    // (a timeout racing the last arrival) does not undo it.
    let (phase, reason, message) = if let (Some(reason), false) = (data.failed.clone(), opened) {
        // The account written when it failed stays (the look that failed
        // it knew why; later looks only see the reason).
        let message = match (
            &obs.previous.phase,
            &obs.previous.reason,
            &obs.previous.message,
        ) {
            (Some(BarrierPhase::Failed), Some(was), Some(message))
                if *was == bounded_name(&reason) =>
            {
                message.clone()
            }
            _ => obs
                .after_failed
                .map(|why| format!("it starts after another Barrier, and cannot: {why}"))
                .unwrap_or_else(|| format!("failed: {reason}")),
        };
        (BarrierPhase::Failed, Some(reason.clone()), message)
    } else if opened {
        if members.is_empty() && obs.still_running > 0 {
            (
                BarrierPhase::Leaving,
                None,
                format!(
                    "all {left} participants have left, but {} of their commands still run (a member cut off from ZooKeeper, its command marked as running)",
                    obs.still_running
                ),
            )
        } else if members.is_empty() {
            (
                BarrierPhase::Completed,
                None,
                format!("all {left} participants have left"),
            )
        } else if left == 0 {
            (
                BarrierPhase::Open,
                None,
                format!("open: {entered} participants entered"),
            )
        } else {
            (
                BarrierPhase::Leaving,
                None,
                format!("{left} of {entered} participants have left"),
            )
        }
    } else if let Some(why) = obs.after_failed {
        fail = Some("AfterFailed".to_owned());
        (
            BarrierPhase::Failed,
            Some("AfterFailed".to_owned()),
            format!("it starts after another Barrier, and cannot: {why}"),
        )
    } else if !lost.is_empty() && obs.spec.on_participant_loss == OnParticipantLoss::Fail {
        fail = Some("ParticipantLost".to_owned());
        (
            BarrierPhase::Failed,
            Some("ParticipantLost".to_owned()),
            format!(
                "participant {} was lost before the barrier opened",
                lost.join(", ")
            ),
        )
    } else {
        let timeout = obs
            .spec
            .timeout
            .as_deref()
            .and_then(|t| crate::api::parse_duration(t).ok());
        let deadline = timeout
            .zip(obs.created)
            .and_then(|(t, c)| c.checked_add(jiff_span(t)).ok());
        match deadline {
            Some(deadline) if obs.now >= deadline => {
                fail = Some("TimedOut".to_owned());
                (
                    BarrierPhase::Failed,
                    Some("TimedOut".to_owned()),
                    match obs.held {
                        Some(why) => format!(
                            "{} of {} participants entered within {}, but it was held: {why}",
                            members.len(),
                            data.participants.max(obs.participants),
                            obs.spec.timeout.as_deref().unwrap_or("")
                        ),
                        None => format!(
                            "{} of {} participants entered within {}",
                            members.len(),
                            data.participants.max(obs.participants),
                            obs.spec.timeout.as_deref().unwrap_or("")
                        ),
                    },
                )
            }
            other => {
                if let Some(deadline) = other {
                    requeue = Some(Duration::from_millis(
                        deadline.duration_since(obs.now).as_millis().max(0) as u64 + 50,
                    ));
                }
                let entered = format!(
                    "{} of {} participants entered",
                    members.len(),
                    obs.participants
                );
                (
                    BarrierPhase::Waiting,
                    None,
                    match obs.held {
                        Some(why) => format!("{entered}; held: {why}"),
                        None => entered,
                    },
                )
            }
        }
    };
    for id in &lost {
        notes.push(warning(
            "ParticipantLost",
            format!("participant {id} left before the barrier opened"),
        ));
    }
    if previous_phase != Some(phase) {
        match phase {
            BarrierPhase::Open | BarrierPhase::Leaving
                if !matches!(
                    previous_phase,
                    Some(BarrierPhase::Open | BarrierPhase::Leaving)
                ) =>
            {
                notes.push(note(
                    "Opened",
                    format!("the barrier opened with {entered} participants"),
                ))
            }
            BarrierPhase::Completed => notes.push(note(
                "Completed",
                format!("all {left} participants have left"),
            )),
            BarrierPhase::Failed => notes.push(warning("Failed", message.clone())),
            _ => {}
        }
    }
    let completed_at = match phase {
        BarrierPhase::Completed => obs.previous.completed_at.clone().or(Some(Time(obs.now))),
        _ => None,
    };
    let is_open = matches!(
        phase,
        BarrierPhase::Open | BarrierPhase::Leaving | BarrierPhase::Completed
    );
    let ready_condition = condition(
        "Ready",
        is_open,
        reason
            .as_deref()
            .unwrap_or(if is_open { "Opened" } else { "Waiting" }),
        &message,
        obs.generation,
        obs.now,
        &obs.previous.conditions,
    );
    let accepted = spec_accepted(
        obs.spec_problem,
        obs.generation,
        obs.now,
        &obs.previous.conditions,
        &mut notes,
    );
    BarrierOutcome {
        status: BarrierStatus {
            phase: Some(phase),
            reason,
            message: Some(message),
            // What the node holds: the count it opened with stays, whatever
            // the spec or the Job says later.
            required: Some(if data.participants > 0 {
                data.participants
            } else {
                obs.participants
            }),
            entered,
            left,
            participants,
            unlisted: 0,
            round: None,
            restarts: 0,
            round_ends: Vec::new(),
            opened_at: ready.and_then(|r| time_of_millis(r.stat.ctime)),
            completed_at,
            conditions: vec![
                ready_condition,
                accepted,
                pods_tracked(
                    &obs.node.children,
                    obs.generation,
                    obs.now,
                    &obs.previous.conditions,
                ),
            ],
            observed_generation: obs.generation,
            znode: Some(obs.znode.to_owned()),
        },
        fail,
        notes,
        requeue,
    }
}

/// How many round ends the status lists.
const ROUND_ENDS_LISTED: usize = 10;

/// The status last written, as the start of round `round`'s: a status of
/// an earlier round describes none of this round's participants, so only
/// its conditions, its round and its restarts carry over (the counts and
/// the list start again, and the phase with them).
pub fn previous_of_round(previous: BarrierStatus, round: Option<u32>) -> BarrierStatus {
    match round {
        Some(k) if previous.round != Some(k) => BarrierStatus {
            conditions: previous.conditions,
            round: previous.round,
            restarts: previous.restarts,
            ..BarrierStatus::default()
        },
        _ => previous,
    }
}

/// Adds to a barrier's status in rounds (`top`: the barrier node's data,
/// now in round `round`) the round, the restarts and why the last rounds
/// ended; an event for each restart seen; and the barrier failed when it
/// ran out of restarts (whatever the current round's own phase).
pub fn in_rounds(
    outcome: &mut BarrierOutcome,
    previous: &BarrierStatus,
    top: &BarrierData,
    round: u32,
    now: Timestamp,
) {
    let status = &mut outcome.status;
    status.round = Some(round);
    status.restarts = round;
    let skip = top.ends.len().saturating_sub(ROUND_ENDS_LISTED);
    status.round_ends = top.ends[skip..].to_vec();
    if let Some(before) = previous.round.filter(|before| *before < round) {
        let why = top
            .ends
            .last()
            .map(String::as_str)
            .unwrap_or("no reason recorded");
        outcome.notes.push(warning(
            "GangRestarted",
            format!("round {before} ended ({why}); the gang meets again in round {round}"),
        ));
    }
    if let Some(failed) = &top.failed {
        // As the status keeps it, so that an unchanged reason compares equal.
        let reason = bounded_name(failed.split(':').next().unwrap_or(failed).trim());
        let message = format!("failed: {failed}");
        // Said once: when the previous status did not say it yet (the look's
        // own phase comes from the round's node, which knows nothing of it).
        let said = previous.phase == Some(BarrierPhase::Failed)
            && previous.reason.as_deref() == Some(reason.as_str());
        if status.phase != Some(BarrierPhase::Failed) && !said {
            outcome.notes.push(warning("Failed", message.clone()));
        }
        status.phase = Some(BarrierPhase::Failed);
        status.reason = Some(reason.clone());
        status.message = Some(message.clone());
        if let Some(ready) = status.conditions.iter_mut().find(|c| c.type_ == "Ready") {
            // The look's own condition knows nothing of the failure: the
            // previous status says whether Ready already was False for it.
            let before = previous.conditions.iter().find(|c| c.type_ == "Ready");
            match before {
                Some(before) if before.status == "False" && before.reason == reason => {
                    ready.last_transition_time = before.last_transition_time.clone();
                }
                _ if ready.status != "False" || ready.reason != reason => {
                    ready.last_transition_time = Time(now);
                }
                _ => {}
            }
            ready.status = "False".to_owned();
            ready.reason = reason;
            ready.message = message;
        }
    }
    outcome.bound_texts();
}

/// The status of a Barrier that has no size yet (`spec.jobRef` names a
/// Job that is not there, or runs no pod): waiting, and why. Nothing is made
/// in ZooKeeper until it has a size, so its participants wait for the node.
pub fn barrier_unsized(
    previous: &BarrierStatus,
    problem: &str,
    generation: Option<i64>,
    znode: &str,
    now: Timestamp,
) -> BarrierOutcome {
    let mut notes = Vec::new();
    let accepted = spec_accepted(
        Some(problem),
        generation,
        now,
        &previous.conditions,
        &mut notes,
    );
    let message = format!("waiting to know how many participants open it: {problem}");
    BarrierOutcome {
        status: BarrierStatus {
            phase: Some(BarrierPhase::Waiting),
            reason: Some("Unsized".to_owned()),
            conditions: vec![
                condition(
                    "Ready",
                    false,
                    "Unsized",
                    &message,
                    generation,
                    now,
                    &previous.conditions,
                ),
                accepted,
            ],
            message: Some(message),
            observed_generation: generation,
            znode: Some(znode.to_owned()),
            ..BarrierStatus::default()
        },
        fail: None,
        notes,
        requeue: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{at, child, node, spec};
    use super::super::{NAME_LIMIT, TEXT_LIMIT};
    use super::*;

    fn observe(
        spec: &BarrierSpec,
        node: &Snapshot,
        previous: &BarrierStatus,
        now: i64,
    ) -> BarrierOutcome {
        barrier(&BarrierObservation {
            spec,
            participants: spec.participants.unwrap_or(1),
            created: Some(at(0)),
            node,
            previous,
            generation: Some(1),
            znode: "/b",
            now: at(now),
            spec_problem: None,
            held: None,
            after_failed: None,
            still_running: 0,
        })
    }

    #[test]
    fn waiting_then_open_then_leaving_then_completed() {
        let s = spec(2, None, OnParticipantLoss::Wait);
        let data = BarrierData {
            participants: 2,
            ..Default::default()
        };
        let one = observe(
            &s,
            &node(data.clone(), vec![child("a", 10, 11, "")]),
            &BarrierStatus::default(),
            20,
        );
        assert_eq!(
            (one.status.phase, one.status.entered),
            (Some(BarrierPhase::Waiting), 1)
        );
        let open = observe(
            &s,
            &node(
                data.clone(),
                vec![
                    child("a", 10, 11, ""),
                    child("b", 30, 31, ""),
                    child(READY, 31, 32, ""),
                ],
            ),
            &one.status,
            40,
        );
        assert_eq!(
            (open.status.phase, open.status.entered),
            (Some(BarrierPhase::Open), 2)
        );
        assert_eq!(
            open.notes.iter().map(|n| n.reason).collect::<Vec<_>>(),
            ["Opened"]
        );
        let leaving = observe(
            &s,
            &node(
                data.clone(),
                vec![child("b", 30, 31, ""), child(READY, 31, 32, "")],
            ),
            &open.status,
            50,
        );
        assert_eq!(
            (leaving.status.phase, leaving.status.left),
            (Some(BarrierPhase::Leaving), 1)
        );
        assert!(leaving.notes.is_empty(), "no second Opened event");
        let done = observe(
            &s,
            &node(data, vec![child(READY, 31, 32, "")]),
            &leaving.status,
            60,
        );
        assert_eq!(
            (done.status.phase, done.status.entered, done.status.left),
            (Some(BarrierPhase::Completed), 2, 2)
        );
        assert_eq!(done.notes[0].reason, "Completed");
    }

    /// Issue 43: in rounds, a member cut off while the servers ran on has
    /// its registration gone but its command marked as running: the
    /// barrier is Leaving, not Completed, until the command ended.
    #[test]
    fn a_command_still_marked_as_running_keeps_the_barrier_leaving() {
        let s = spec(2, None, OnParticipantLoss::RestartGang);
        let data = BarrierData {
            participants: 2,
            ..Default::default()
        };
        let gone = node(data, vec![child(READY, 31, 32, "")]);
        let previous = BarrierStatus {
            phase: Some(BarrierPhase::Leaving),
            entered: 2,
            left: 1,
            ..Default::default()
        };
        let observe_with = |still_running| {
            barrier(&BarrierObservation {
                spec: &s,
                participants: 2,
                created: Some(at(0)),
                node: &gone,
                previous: &previous,
                generation: Some(1),
                znode: "/b",
                now: at(60),
                spec_problem: None,
                held: None,
                after_failed: None,
                still_running,
            })
        };
        let running = observe_with(1);
        assert_eq!(running.status.phase, Some(BarrierPhase::Leaving));
        assert!(
            running
                .status
                .message
                .as_deref()
                .is_some_and(|m| m.contains("still run")),
            "{:?}",
            running.status.message
        );
        assert_eq!(observe_with(0).status.phase, Some(BarrierPhase::Completed));
    }

    #[test]
    fn a_gang_that_came_and_went_between_two_looks_still_counts_x() {
        // The whole round (enter, open, leave) happened between two looks:
        // only `ready` is left, yet x entered and left.
        let s = spec(3, None, OnParticipantLoss::Wait);
        let data = BarrierData {
            participants: 3,
            ..Default::default()
        };
        let done = observe(
            &s,
            &node(data, vec![child(READY, 31, 32, "")]),
            &BarrierStatus::default(),
            60,
        );
        assert_eq!(
            (done.status.phase, done.status.entered, done.status.left),
            (Some(BarrierPhase::Completed), 3, 3)
        );
        assert_eq!(
            done.status.message.as_deref(),
            Some("all 3 participants have left")
        );
    }

    #[test]
    fn a_participant_lost_before_opening_waits_or_fails_by_policy() {
        let data = BarrierData {
            participants: 3,
            ..Default::default()
        };
        let before = observe(
            &spec(3, None, OnParticipantLoss::Wait),
            &node(
                data.clone(),
                vec![child("a", 1, 2, ""), child("b", 1, 3, "")],
            ),
            &BarrierStatus::default(),
            5,
        );
        let wait = observe(
            &spec(3, None, OnParticipantLoss::Wait),
            &node(data.clone(), vec![child("a", 1, 2, "")]),
            &before.status,
            6,
        );
        assert_eq!(
            (wait.status.phase, wait.status.entered, wait.fail.clone()),
            (Some(BarrierPhase::Waiting), 1, None)
        );
        assert!(wait
            .status
            .participants
            .iter()
            .any(|p| p.id == "b" && p.lost));
        let fail = observe(
            &spec(3, None, OnParticipantLoss::Fail),
            &node(data, vec![child("a", 1, 2, "")]),
            &before.status,
            6,
        );
        assert_eq!(fail.fail.as_deref(), Some("ParticipantLost"));
        assert_eq!(fail.status.phase, Some(BarrierPhase::Failed));
    }

    #[test]
    fn a_timeout_fails_a_waiting_barrier_and_is_requeued_until_then() {
        let s = spec(2, Some("10s"), OnParticipantLoss::Wait);
        let data = BarrierData {
            participants: 2,
            ..Default::default()
        };
        let early = observe(
            &s,
            &node(data.clone(), vec![child("a", 1, 2, "")]),
            &BarrierStatus::default(),
            4_000,
        );
        assert_eq!(early.fail, None);
        let requeue = early.requeue.unwrap();
        assert!(
            requeue > Duration::from_secs(5) && requeue <= Duration::from_secs(7),
            "{requeue:?}"
        );
        let late = observe(
            &s,
            &node(data, vec![child("a", 1, 2, "")]),
            &early.status,
            10_001,
        );
        assert_eq!(late.fail.as_deref(), Some("TimedOut"));
    }

    #[test]
    fn a_spec_problem_is_a_condition_and_one_warning() {
        let s = spec(1, None, OnParticipantLoss::Wait);
        let data = BarrierData {
            participants: 3,
            ..Default::default()
        };
        let n = node(data, vec![child("a", 1, 2, ""), child("b", 1, 3, "")]);
        let problem = "participants lowered to 1, but 2 have already entered; keeping 3";
        let obs = |previous| BarrierObservation {
            spec: &s,
            participants: s.participants.unwrap_or(1),
            created: Some(at(0)),
            node: &n,
            previous,
            generation: Some(2),
            znode: "/b",
            now: at(5),
            spec_problem: Some(problem),
            held: None,
            after_failed: None,
            still_running: 0,
        };
        let empty = BarrierStatus::default();
        let first = barrier(&obs(&empty));
        let accepted = first
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "SpecAccepted")
            .unwrap();
        assert_eq!(
            (
                accepted.status.as_str(),
                accepted.reason.as_str(),
                accepted.message.as_str()
            ),
            ("False", "InvalidSpec", problem)
        );
        assert_eq!(
            first
                .notes
                .iter()
                .filter(|n| n.reason == "InvalidSpec")
                .count(),
            1
        );
        let again = barrier(&obs(&first.status));
        assert!(
            again.notes.iter().all(|n| n.reason != "InvalidSpec"),
            "reported once, not on every reconcile"
        );
    }

    /// Issue 45, item 1: what a tenant's participants write in ZooKeeper
    /// (a failure's reason, a round's end, a member's id and pod) reaches
    /// the status and the events only bounded: a namespace cannot make the
    /// controller hold, write or record megabytes (an Event is refused past
    /// 1 KiB, and with it the rest of the look's events).
    #[test]
    fn what_a_tenant_writes_in_zookeeper_reaches_status_and_events_bounded() {
        let huge = "x".repeat(200_000);
        let s = spec(2, Some("1s"), OnParticipantLoss::RestartGang);
        let member = format!(r#"{{"pod":"{huge}"}}"#);
        let mut out = observe(
            &s,
            &node(
                BarrierData {
                    participants: 2,
                    failed: Some(huge.clone()),
                    ..Default::default()
                },
                vec![child(&format!("m-{huge}"), 1, 2, &member)],
            ),
            &BarrierStatus::default(),
            5_000,
        );
        assert_eq!(out.status.phase, Some(BarrierPhase::Failed));
        assert_bounded(&out.status, &out.notes);
        let top = BarrierData {
            participants: 2,
            round: Some(1),
            ends: vec![huge.clone(); 3],
            failed: Some(format!("RestartLimit{huge}: {huge}")),
            ..Default::default()
        };
        let previous = BarrierStatus {
            round: Some(0),
            ..Default::default()
        };
        in_rounds(&mut out, &previous, &top, 1, at(5_000));
        assert!(out.notes.iter().any(|n| n.reason == "GangRestarted"));
        assert_bounded(&out.status, &out.notes);
        assert!(
            out.status
                .message
                .as_deref()
                .is_some_and(|m| m.contains("bytes more")),
            "a cut text says so: {:?}",
            out.status
                .message
                .as_deref()
                .map(|m| &m[m.len().saturating_sub(40)..])
        );
    }

    /// A member's id and a failure's reason past their bound are kept
    /// bounded, and compare equal at the next look: the member is the same
    /// member (not one that left and one that came), and the Ready
    /// condition does not move.
    #[test]
    fn a_long_member_name_and_reason_are_the_same_at_the_next_look() {
        let huge = "y".repeat(5_000);
        let s = spec(2, None, OnParticipantLoss::RestartGang);
        let n = node(
            BarrierData {
                participants: 2,
                ..Default::default()
            },
            vec![child(&format!("m-{huge}"), 1, 2, "")],
        );
        let first = observe(&s, &n, &BarrierStatus::default(), 1_000);
        let second = observe(&s, &n, &first.status, 2_000);
        assert_eq!(second.status.participants.len(), 1, "{:?}", second.status);
        assert_eq!((second.status.entered, second.status.left), (1, 0));
        assert!(second.status.participants[0].left_at.is_none());
        // A status an older controller wrote kept the whole id: the same
        // member still, not lost.
        let mut older = first.status.clone();
        older.participants[0].id = format!("m-{huge}");
        let upgraded = observe(&s, &n, &older, 2_000);
        assert_eq!(upgraded.status.participants.len(), 1);
        assert!(!upgraded.status.participants[0].lost);
        assert_eq!((upgraded.status.entered, upgraded.status.left), (1, 0));

        let top = BarrierData {
            participants: 2,
            round: Some(0),
            failed: Some(format!("{huge}: why")),
            ..Default::default()
        };
        let mut a = observe(&s, &n, &BarrierStatus::default(), 1_000);
        in_rounds(&mut a, &BarrierStatus::default(), &top, 0, at(1_000));
        let mut b = observe(&s, &n, &a.status, 5_000);
        in_rounds(&mut b, &a.status, &top, 0, at(5_000));
        let ready = |o: &BarrierOutcome| {
            o.status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| (c.reason.clone(), c.last_transition_time.clone()))
        };
        assert_eq!(ready(&a), ready(&b), "the Ready condition moved");
        assert!(b.notes.iter().all(|n| n.reason != "Failed"), "failed again");
    }

    /// Every text of `status` and `notes` within [`TEXT_LIMIT`], every
    /// reason and name within [`NAME_LIMIT`].
    fn assert_bounded(status: &BarrierStatus, notes: &[Note]) {
        let mut texts: Vec<(&str, usize)> = vec![];
        texts.extend(status.message.as_deref().map(|m| (m, TEXT_LIMIT)));
        texts.extend(status.reason.as_deref().map(|r| (r, NAME_LIMIT)));
        for c in &status.conditions {
            texts.push((&c.message, TEXT_LIMIT));
            texts.push((&c.reason, NAME_LIMIT));
        }
        for p in &status.participants {
            texts.push((&p.id, NAME_LIMIT));
            texts.extend(p.pod.as_deref().map(|pod| (pod, NAME_LIMIT)));
        }
        texts.extend(status.round_ends.iter().map(|e| (e.as_str(), TEXT_LIMIT)));
        texts.extend(notes.iter().map(|n| (n.message.as_str(), TEXT_LIMIT)));
        for (text, limit) in texts {
            assert!(
                text.len() <= limit,
                "{} bytes past a limit of {limit}: {}...",
                text.len(),
                &text[..40.min(text.len())]
            );
        }
    }

    #[test]
    fn an_opened_barrier_stays_open_even_if_marked_failed_later() {
        let s = spec(1, Some("1s"), OnParticipantLoss::Wait);
        let data = BarrierData {
            participants: 1,
            failed: Some("TimedOut".into()),
            ..Default::default()
        };
        let out = observe(
            &s,
            &node(data, vec![child("a", 1, 2, ""), child(READY, 2, 3, "")]),
            &BarrierStatus::default(),
            5_000,
        );
        assert_eq!(out.status.phase, Some(BarrierPhase::Open));
        assert_eq!(out.fail, None);
    }

    #[test]
    fn a_new_round_starts_its_counts_and_list_afresh_and_says_why_the_gang_restarted() {
        let s = spec(2, None, OnParticipantLoss::RestartGang);
        let round = BarrierData {
            participants: 2,
            ..Default::default()
        };
        // Round 0 open with a and b.
        let open = observe(
            &s,
            &node(
                round.clone(),
                vec![
                    child("a", 1, 2, ""),
                    child("b", 2, 3, ""),
                    child(READY, 3, 4, ""),
                ],
            ),
            &BarrierStatus::default(),
            1_000,
        );
        let top0 = BarrierData {
            participants: 2,
            round: Some(0),
            ..Default::default()
        };
        let mut open = open;
        in_rounds(&mut open, &BarrierStatus::default(), &top0, 0, at(1_000));
        assert_eq!((open.status.round, open.status.restarts), (Some(0), 0));
        assert_eq!(open.status.phase, Some(BarrierPhase::Open));
        // b failed: round 1, where only a has registered yet.
        let top1 = BarrierData {
            round: Some(1),
            ends: vec!["b's command exited 3".into()],
            ..top0
        };
        let previous = previous_of_round(open.status.clone(), top1.round);
        assert_eq!(previous.entered, 0, "round 0's counts do not carry over");
        assert!(previous.participants.is_empty());
        let mut next = observe(
            &s,
            &node(round, vec![child("a", 10, 11, "")]),
            &previous,
            2_000,
        );
        in_rounds(&mut next, &previous, &top1, 1, at(2_000));
        assert_eq!(next.status.phase, Some(BarrierPhase::Waiting));
        assert_eq!((next.status.round, next.status.restarts), (Some(1), 1));
        assert_eq!(next.status.entered, 1);
        assert_eq!(next.status.round_ends, ["b's command exited 3"]);
        let restarted: Vec<_> = next
            .notes
            .iter()
            .filter(|n| n.reason == "GangRestarted")
            .collect();
        assert_eq!(restarted.len(), 1, "{:?}", next.notes);
        assert!(restarted[0].message.contains("b's command exited 3"));
        // Looked at again in the same round: no second event.
        let previous = previous_of_round(next.status.clone(), top1.round);
        let mut again = observe(
            &s,
            &node(
                BarrierData {
                    participants: 2,
                    ..Default::default()
                },
                vec![child("a", 10, 11, "")],
            ),
            &previous,
            3_000,
        );
        in_rounds(&mut again, &previous, &top1, 1, at(3_000));
        assert!(again.notes.iter().all(|n| n.reason != "GangRestarted"));
    }

    #[test]
    fn a_gang_past_its_restarts_is_failed_whatever_its_round_shows() {
        let s = spec(2, None, OnParticipantLoss::RestartGang);
        let mut out = observe(
            &s,
            &node(
                BarrierData {
                    participants: 2,
                    ended: Some("b's command exited 3".into()),
                    ..Default::default()
                },
                vec![
                    child("a", 1, 2, ""),
                    child("b", 2, 3, ""),
                    child(READY, 3, 4, ""),
                ],
            ),
            &BarrierStatus::default(),
            1_000,
        );
        let top = BarrierData {
            participants: 2,
            round: Some(0),
            max_restarts: Some(0),
            ends: vec!["b's command exited 3".into()],
            failed: Some("RestartLimit: round 0 ended (b's command exited 3)".into()),
            ..Default::default()
        };
        in_rounds(&mut out, &BarrierStatus::default(), &top, 0, at(1_000));
        assert_eq!(out.status.phase, Some(BarrierPhase::Failed));
        assert_eq!(out.status.reason.as_deref(), Some("RestartLimit"));
        let ready = out
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "RestartLimit")
        );
        assert!(out.notes.iter().any(|n| n.reason == "Failed"));
    }
}
