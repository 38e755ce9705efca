//! Status from observation: what ZooKeeper holds now plus what the previous
//! status remembered gives the new status, the events to record and the
//! actions to take. Pure functions, so every rule is testable without
//! servers.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{
    BarrierPhase, BarrierSpec, BarrierStatus, HoldMode, HolderStatus, LockLeaseSpec,
    LockLeaseStatus, LockPhase, OnParticipantLoss, ParticipantStatus, WaiterStatus,
};
use crate::zk::contender::{self, ContenderKind};
use crate::zk::tree::{ChildNode, Snapshot};
use crate::zk::{BarrierData, ParticipantData, READY};

/// A Kubernetes event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// `Opened`, `Completed`, `Failed`, `Acquired`, `Released`, `Revoked`.
    pub reason: &'static str,
    /// What happened, for a person.
    pub message: String,
    /// Whether it is a warning.
    pub warning: bool,
}

fn note(reason: &'static str, message: String) -> Note {
    Note {
        reason,
        message,
        warning: false,
    }
}

fn warning(reason: &'static str, message: String) -> Note {
    Note {
        reason,
        message,
        warning: true,
    }
}

/// A ZooKeeper ctime (milliseconds) as a Kubernetes time.
pub fn time_of_millis(ms: i64) -> Option<Time> {
    Timestamp::from_millisecond(ms).ok().map(Time)
}

fn condition(
    kind: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
    previous: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // The transition time moves only when the status flips.
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// The `PodsTracked` condition: whether every registration that outlives
/// its process (a persistent node: an init container's) names the pod whose
/// end the controller checks. One that names none is left in place, since
/// the controller cannot tell when it is done; the condition says which.
fn pods_tracked(
    children: &[ChildNode],
    generation: Option<i64>,
    now: Timestamp,
    previous: &[Condition],
) -> Condition {
    let untracked: Vec<String> = children
        .iter()
        .filter(|c| c.name != READY && c.stat.ephemeral_owner == 0)
        .filter_map(|c| {
            let who = ParticipantData::parse(&c.data);
            who.pod
                .is_none()
                .then(|| who.id.unwrap_or_else(|| c.name.clone()))
        })
        .collect();
    let message = if untracked.is_empty() {
        "every registration that outlives its process names its pod".to_owned()
    } else {
        format!(
            "the registrations of {} name no pod (set ZKGATE_POD_NAME from metadata.name): the controller cannot tell when their pods end and leaves them in place",
            untracked.join(", ")
        )
    };
    condition(
        "PodsTracked",
        untracked.is_empty(),
        if untracked.is_empty() {
            "PodsNamed"
        } else {
            "PodUnknown"
        },
        &message,
        generation,
        now,
        previous,
    )
}

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
}

/// The `SpecAccepted` condition, and a warning the first time a problem is seen.
fn spec_accepted(
    problem: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
    previous: &[Condition],
    notes: &mut Vec<Note>,
) -> Condition {
    let was = previous.iter().find(|c| c.type_ == "SpecAccepted");
    if let Some(problem) = problem {
        if was.is_none_or(|c| c.status != "False" || c.message != problem) {
            notes.push(warning("InvalidSpec", problem.to_owned()));
        }
    }
    condition(
        "SpecAccepted",
        problem.is_none(),
        if problem.is_some() {
            "InvalidSpec"
        } else {
            "Accepted"
        },
        problem.unwrap_or("the spec is applied"),
        generation,
        now,
        previous,
    )
}

/// The most entries a status list holds: a 5,000-pod gang's status must not
/// be megabytes rewritten on every change. The counts stay exact.
pub const LIST_LIMIT: usize = 100;
/// How many participants lost before the opening a barrier's list keeps
/// (the most recent).
pub const LOST_KEPT: usize = 10;

/// A status as written: its lists cut to [`LIST_LIMIT`]. The controller
/// remembers the whole status and writes this.
pub trait Capped {
    /// The written form.
    fn capped(&self) -> Self;
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

impl Capped for LockLeaseStatus {
    fn capped(&self) -> Self {
        let mut written = self.clone();
        written.holders.truncate(LIST_LIMIT);
        written.waiting.truncate(LIST_LIMIT);
        written.waiters.truncate(LIST_LIMIT);
        written
    }
}

/// Computes a barrier's status.
pub fn barrier(obs: &BarrierObservation<'_>) -> BarrierOutcome {
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
    let mut participants = obs.previous.participants.clone();
    for member in &members {
        let pod = ParticipantData::parse(&member.data).pod;
        match participants.iter_mut().find(|p| p.id == member.name) {
            Some(p) if p.left_at.is_some() => {
                // The same id registered again: a replacement.
                *p = ParticipantStatus {
                    id: member.name.clone(),
                    pod,
                    entered_at: time_of_millis(member.stat.ctime),
                    ..Default::default()
                };
            }
            Some(_) => {}
            None => participants.push(ParticipantStatus {
                id: member.name.clone(),
                pod,
                entered_at: time_of_millis(member.stat.ctime),
                ..Default::default()
            }),
        }
    }
    let mut lost = Vec::new();
    for p in participants.iter_mut().filter(|p| p.left_at.is_none()) {
        if !members.iter().any(|m| m.name == p.id) {
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
        (
            BarrierPhase::Failed,
            Some(reason.clone()),
            format!("failed: {reason}"),
        )
    } else if opened {
        if members.is_empty() {
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
                    format!(
                        "{} of {} participants entered within {}",
                        members.len(),
                        data.participants.max(obs.participants),
                        obs.spec.timeout.as_deref().unwrap_or("")
                    ),
                )
            }
            other => {
                if let Some(deadline) = other {
                    requeue = Some(Duration::from_millis(
                        deadline.duration_since(obs.now).as_millis().max(0) as u64 + 50,
                    ));
                }
                (
                    BarrierPhase::Waiting,
                    None,
                    format!(
                        "{} of {} participants entered",
                        members.len(),
                        obs.participants
                    ),
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

fn jiff_span(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

/// What to do about a lock.
#[derive(Clone, Debug, PartialEq)]
pub struct LockOutcome {
    /// The status to write.
    pub status: LockLeaseStatus,
    /// Holders' nodes to delete: their lease expired.
    pub revoke: Vec<String>,
    /// Events to record.
    pub notes: Vec<Note>,
    /// Reconcile again after this long at the latest (the next expiry).
    pub requeue: Option<Duration>,
}

/// The nodes a lock's status is computed from.
#[derive(Clone, Copy, Debug)]
pub enum LockNodes<'a> {
    /// An exclusive or read/write lock: its contenders, the lock node's
    /// children.
    Queue(&'a [ChildNode]),
    /// A Semaphore: its holders are the lease nodes under `leases` (grouped
    /// by their protected id: one holder taking k permits made k nodes in one
    /// transaction), its waiters the internal mutex's queue under `locks`, in
    /// the order they will be served. A lease to revoke is named
    /// `leases/<name>`, relative to the lock node.
    Semaphore {
        /// The children of `leases`.
        leases: &'a [ChildNode],
        /// The children of `locks`.
        locks: &'a [ChildNode],
    },
}

/// Everything a lock's status is computed from.
#[derive(Clone, Copy, Debug)]
pub struct LockObservation<'a> {
    /// The spec.
    pub spec: &'a LockLeaseSpec,
    /// Its holders' and waiters' nodes, read just now.
    pub nodes: LockNodes<'a>,
    /// The status written last time (it remembers when each hold started).
    pub previous: &'a LockLeaseStatus,
    /// The resource's generation.
    pub generation: Option<i64>,
    /// The lock node's path.
    pub znode: &'a str,
    /// The time the nodes were read, against which leases are measured.
    pub now: Timestamp,
    /// What in the spec could not be applied, if anything (reported as the
    /// `SpecAccepted` condition and an `InvalidSpec` event).
    pub spec_problem: Option<&'a str>,
}

/// One look at a lock: its status as the nodes stand, and the holds past
/// their lease in `revoke`. The status still lists the next in line as
/// waiting; [`lock_settled`] is the status once the revocations are done.
pub fn lock(obs: &LockObservation<'_>) -> LockOutcome {
    match obs.nodes {
        LockNodes::Queue(children) => held_status(obs, queue_held(children)),
        LockNodes::Semaphore { leases, locks } => held_status(obs, semaphore_held(leases, locks)),
    }
}

/// A lock's status with its revocations settled in one pass: the holds
/// past their lease are in `revoke` (to delete), and the status, events and
/// next look are those of the lock once they are gone (the next in line
/// holding from `now`; a revoked hold is reported as revoked, never as
/// released).
pub fn lock_settled(obs: &LockObservation<'_>) -> LockOutcome {
    let mut outcome = lock(obs);
    if outcome.revoke.is_empty() {
        return outcome;
    }
    let (mut held, locks) = match obs.nodes {
        LockNodes::Queue(children) => (children.to_vec(), None),
        LockNodes::Semaphore { leases, locks } => (leases.to_vec(), Some(locks)),
    };
    let relative = |c: &ChildNode| match locks {
        None => c.name.clone(),
        Some(_) => format!("{}/{}", crate::zk::LEASES, c.name),
    };
    let mut previous = obs.previous.clone();
    let mut revoke = Vec::new();
    let mut notes = Vec::new();
    // A new holder's lease starts now, so it rarely expires at once; with
    // a zero lease it does, and every pass removes at least one node.
    while !outcome.revoke.is_empty() {
        let before = held.len();
        let tokens: Vec<i64> = held
            .iter()
            .filter(|c| outcome.revoke.contains(&relative(c)))
            .map(|c| c.stat.czxid)
            .collect();
        held.retain(|c| !outcome.revoke.contains(&relative(c)));
        previous
            .holders
            .retain(|h| !tokens.contains(&h.fencing_token));
        revoke.append(&mut outcome.revoke);
        notes.append(&mut outcome.notes);
        let nodes = match locks {
            None => LockNodes::Queue(&held),
            Some(locks) => LockNodes::Semaphore {
                leases: &held,
                locks,
            },
        };
        outcome = lock(&LockObservation {
            nodes,
            previous: &previous,
            ..*obs
        });
        if held.len() == before {
            break;
        }
    }
    notes.append(&mut outcome.notes);
    outcome.notes = notes;
    revoke.append(&mut outcome.revoke);
    outcome.revoke = revoke;
    outcome
}

/// Who holds and who waits on an exclusive or read/write lock.
fn queue_held(children: &[ChildNode]) -> Held<'_> {
    let names: Vec<String> = children.iter().map(|c| c.name.clone()).collect();
    let queue = contender::queue(&names);
    let mut holdings = Vec::new();
    let mut waiting = Vec::new();
    for (i, c) in queue.iter().enumerate() {
        let Some(child) = children.iter().find(|n| n.name == c.name) else {
            continue;
        };
        if contender::blocker(&queue, i).is_some() {
            waiting.push(waiter(child));
            continue;
        }
        holdings.push(Holding {
            child,
            mode: match c.kind {
                ContenderKind::Exclusive => HoldMode::Exclusive,
                ContenderKind::Read => HoldMode::Read,
                ContenderKind::Write => HoldMode::Write,
                ContenderKind::Lease => HoldMode::Permit,
            },
            nodes: vec![c.name.clone()],
        });
    }
    Held {
        holdings,
        waiting,
        children,
        permits_in_use: None,
    }
}

/// Who holds and who waits on a Semaphore (see [`LockNodes::Semaphore`]).
fn semaphore_held<'a>(leases: &'a [ChildNode], locks: &'a [ChildNode]) -> Held<'a> {
    let mut holdings: Vec<Holding> = Vec::new();
    let mut sorted: Vec<&ChildNode> = leases.iter().collect();
    sorted.sort_by_key(|c| (c.stat.czxid, c.name.clone()));
    for child in sorted {
        let group = contender::protection_id(&child.name).unwrap_or(&child.name);
        let node = format!("{}/{}", crate::zk::LEASES, child.name);
        match holdings
            .iter_mut()
            .find(|h| contender::protection_id(&h.child.name).unwrap_or(&h.child.name) == group)
        {
            Some(h) => h.nodes.push(node),
            None => holdings.push(Holding {
                child,
                mode: HoldMode::Permit,
                nodes: vec![node],
            }),
        }
    }
    let names: Vec<String> = locks.iter().map(|c| c.name.clone()).collect();
    let waiting = contender::queue(&names)
        .iter()
        .filter_map(|c| locks.iter().find(|n| n.name == c.name))
        .map(waiter)
        .collect();
    let in_use = holdings.iter().map(|h| h.nodes.len() as u32).sum();
    Held {
        holdings,
        waiting,
        children: leases,
        permits_in_use: Some(in_use),
    }
}

/// One holder: the node that stands for it (its first), its mode, and
/// every node of its hold (revoked together).
struct Holding<'a> {
    child: &'a ChildNode,
    mode: HoldMode,
    nodes: Vec<String>,
}

/// Who holds and who waits, as the status rules see it.
struct Held<'a> {
    holdings: Vec<Holding<'a>>,
    waiting: Vec<WaiterStatus>,
    /// The nodes whose pods are tracked (persistent holds).
    children: &'a [ChildNode],
    permits_in_use: Option<u32>,
}

/// The id a holder or waiter goes by: its id, else its pod, else its node.
fn shown_id(who: &ParticipantData, child: &ChildNode) -> String {
    who.id
        .clone()
        .or_else(|| who.pod.clone())
        .unwrap_or_else(|| child.name.clone())
}

/// A waiter as the status shows it: who, and since when (its node's ctime).
fn waiter(child: &ChildNode) -> WaiterStatus {
    let who = ParticipantData::parse(&child.data);
    WaiterStatus {
        id: shown_id(&who, child),
        pod: who.pod,
        since: Timestamp::from_millisecond(child.stat.ctime)
            .ok()
            .map(MicroTime),
    }
}

/// The status rules shared by locks and semaphores: lease expiry and
/// revocation, Acquired/Released/Revoked events, conditions.
fn held_status(obs: &LockObservation<'_>, seen: Held<'_>) -> LockOutcome {
    let LockObservation {
        spec,
        previous,
        generation,
        znode,
        now,
        spec_problem,
        ..
    } = *obs;
    let lease = spec
        .lease_duration
        .as_deref()
        .and_then(|d| crate::api::parse_duration(d).ok());
    let mut holders = Vec::new();
    let waiting = seen.waiting;
    let mut revoke: Vec<String> = Vec::new();
    let mut notes = Vec::new();
    let mut requeue: Option<Duration> = None;
    for holding in &seen.holdings {
        let child = holding.child;
        let who = ParticipantData::parse(&child.data);
        let id = shown_id(&who, child);
        // ZooKeeper does not record when a waiter became the holder (its
        // ctime is when it queued): the hold starts when the controller first
        // saw this token holding, remembered in the status across restarts.
        let since = previous
            .holders
            .iter()
            .find(|h| h.fencing_token == child.stat.czxid)
            .and_then(|h| h.since.as_ref().map(|t| t.0))
            .unwrap_or(now);
        let expires = lease.and_then(|l| since.checked_add(jiff_span(l)).ok());
        if let Some(expires) = expires {
            if now >= expires {
                revoke.extend(holding.nodes.iter().cloned());
                notes.push(warning(
                    "Revoked",
                    format!(
                        "revoked the hold of {id} (token {}): held longer than {}",
                        child.stat.czxid,
                        spec.lease_duration.as_deref().unwrap_or("")
                    ),
                ));
                continue;
            }
            let left =
                Duration::from_millis(expires.duration_since(now).as_millis().max(0) as u64 + 50);
            requeue = Some(requeue.map_or(left, |r| r.min(left)));
        }
        holders.push(HolderStatus {
            id,
            pod: who.pod,
            mode: holding.mode,
            permits: holding.nodes.len() as u32,
            since: Some(MicroTime(since)),
            fencing_token: child.stat.czxid,
            expires_at: expires.map(MicroTime),
        });
    }
    for h in &holders {
        if !previous
            .holders
            .iter()
            .any(|p| p.fencing_token == h.fencing_token)
        {
            notes.push(note(
                "Acquired",
                format!(
                    "{} acquired the lock ({}, token {})",
                    h.id, h.mode, h.fencing_token
                ),
            ));
        }
    }
    for p in &previous.holders {
        let still = holders.iter().any(|h| h.fencing_token == p.fencing_token);
        let revoked_now = seen.holdings.iter().any(|h| {
            h.child.stat.czxid == p.fencing_token && revoke.iter().any(|r| h.nodes.contains(r))
        });
        if !still && !revoked_now {
            notes.push(note(
                "Released",
                format!("{} released the lock (token {})", p.id, p.fencing_token),
            ));
        }
    }
    let accepted = spec_accepted(
        spec_problem,
        generation,
        now,
        &previous.conditions,
        &mut notes,
    );
    let held = !holders.is_empty();
    let message = if held {
        format!(
            "held by {}",
            holders
                .iter()
                .map(|h| h.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        "free".to_owned()
    };
    LockOutcome {
        status: LockLeaseStatus {
            phase: Some(if held {
                LockPhase::Held
            } else {
                LockPhase::Free
            }),
            holder_count: holders.len() as u32,
            permits_in_use: seen
                .permits_in_use
                .map(|_| holders.iter().map(|h| h.permits).sum()),
            waiting_count: waiting.len() as u32,
            holders,
            waiting: waiting.iter().map(|w| w.id.clone()).collect(),
            waiters: waiting,
            conditions: vec![
                condition(
                    "Held",
                    held,
                    if held { "Held" } else { "Free" },
                    &message,
                    generation,
                    now,
                    &previous.conditions,
                ),
                accepted,
                pods_tracked(seen.children, generation, now, &previous.conditions),
            ],
            observed_generation: generation,
            znode: Some(znode.to_owned()),
        },
        revoke,
        notes,
        requeue,
    }
}

#[cfg(test)]
mod tests {
    /// The waiters' ids, in queue order.
    fn ids(waiters: &[WaiterStatus]) -> Vec<&str> {
        waiters.iter().map(|w| w.id.as_str()).collect()
    }

    #[test]
    fn written_lists_are_capped_and_lost_participants_do_not_pile_up() {
        let many = |n: usize, lost: bool| -> Vec<ParticipantStatus> {
            (0..n)
                .map(|i| ParticipantStatus {
                    id: format!("{}{i:04}", if lost { "lost-" } else { "p-" }),
                    lost,
                    left_at: lost.then(|| Time(Timestamp::from_second(1_000 + i as i64).unwrap())),
                    ..Default::default()
                })
                .collect()
        };
        let status = BarrierStatus {
            participants: many(150, false),
            entered: 150,
            ..Default::default()
        };
        let written = status.capped();
        assert_eq!(written.participants.len(), LIST_LIMIT);
        assert_eq!(written.unlisted, 50);
        assert_eq!(written.entered, 150);
        assert_eq!(written.capped(), written, "capping twice changes nothing");

        let lock = LockLeaseStatus {
            waiting: (0..250).map(|i| format!("w{i}")).collect(),
            waiters: (0..250)
                .map(|i| WaiterStatus {
                    id: format!("w{i}"),
                    ..Default::default()
                })
                .collect(),
            waiting_count: 250,
            ..Default::default()
        };
        let written = lock.capped();
        assert_eq!((written.waiting.len(), written.waiting_count), (100, 250));
        assert_eq!(written.waiting[0], "w0");
        assert_eq!(written.waiters.len(), 100);

        // A Job's retries: 30 lost before the opening; the 10 most recent stay.
        let spec = spec(5, None, OnParticipantLoss::Wait);
        let previous = BarrierStatus {
            phase: Some(BarrierPhase::Waiting),
            participants: many(30, true),
            ..Default::default()
        };
        let node = node(
            BarrierData {
                participants: 5,
                ..Default::default()
            },
            Vec::new(),
        );
        let outcome = barrier(&BarrierObservation {
            spec: &spec,
            participants: spec.participants.unwrap_or(1),
            created: None,
            node: &node,
            previous: &previous,
            generation: Some(1),
            znode: "/b",
            now: Timestamp::now(),
            spec_problem: None,
        });
        let kept: Vec<_> = outcome
            .status
            .participants
            .iter()
            .map(|p| p.id.as_str())
            .collect();
        assert_eq!(kept.len(), LOST_KEPT);
        assert_eq!(kept[0], "lost-0020", "the most recent are kept: {kept:?}");
    }
    use super::*;
    use crate::zk::tree::ChildNode;
    use zookeeper_client::Stat;

    fn stat(ctime: i64, czxid: i64, ephemeral_owner: i64) -> Stat {
        crate::zk::tree::test_stat(ctime, czxid, ephemeral_owner)
    }

    fn child(name: &str, ctime: i64, czxid: i64, data: &str) -> ChildNode {
        ChildNode {
            name: name.into(),
            data: data.as_bytes().to_vec(),
            stat: stat(ctime, czxid, 1),
        }
    }

    fn node(data: BarrierData, children: Vec<ChildNode>) -> Snapshot {
        Snapshot {
            data: data.to_bytes(),
            stat: stat(0, 1, 0),
            children,
        }
    }

    fn spec(x: u32, timeout: Option<&str>, loss: OnParticipantLoss) -> BarrierSpec {
        BarrierSpec {
            participants: Some(x),
            timeout: timeout.map(Into::into),
            on_participant_loss: loss,
            job_ref: None,
        }
    }

    fn look(
        spec: &LockLeaseSpec,
        nodes: LockNodes<'_>,
        previous: &LockLeaseStatus,
        now: Timestamp,
    ) -> LockOutcome {
        lock(&LockObservation {
            spec,
            nodes,
            previous,
            generation: Some(1),
            znode: "/l",
            now,
            spec_problem: None,
        })
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).unwrap()
    }

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
    fn lock_holders_waiters_and_revocation() {
        let s = LockLeaseSpec {
            mode: crate::api::LockMode::ReadWrite,
            lease_duration: Some("10s".into()),
            permits: None,
        };
        let who = |p: &str| format!(r#"{{"pod":"{p}"}}"#);
        let n = Snapshot {
            data: vec![],
            stat: stat(0, 1, 0),
            children: vec![
                child("_c_a-__READ__0000000001", 0, 100, &who("r1")),
                child("_c_b-__READ__0000000002", 500, 101, &who("r2")),
                child("_c_c-__WRIT__0000000003", 600, 102, &who("w")),
                child("_c_d-__READ__0000000004", 700, 103, &who("r3")),
            ],
        };
        let out = look(
            &s,
            LockNodes::Queue(&n.children),
            &LockLeaseStatus::default(),
            at(1_000),
        );
        assert_eq!(
            out.status
                .holders
                .iter()
                .map(|h| h.id.as_str())
                .collect::<Vec<_>>(),
            ["r1", "r2"]
        );
        assert_eq!(
            out.status.waiting,
            ["w", "r3"],
            "queue order; a later reader waits behind the writer"
        );
        assert_eq!(ids(&out.status.waiters), ["w", "r3"]);
        assert!(out.revoke.is_empty());
        assert_eq!(
            out.requeue,
            Some(Duration::from_millis(10_050)),
            "looked at again when the leases end"
        );
        let later = look(&s, LockNodes::Queue(&n.children), &out.status, at(11_000));
        assert_eq!(
            later.revoke,
            ["_c_a-__READ__0000000001", "_c_b-__READ__0000000002"]
        );
        assert!(later.notes.iter().any(|n| n.reason == "Revoked"));
    }

    #[test]
    fn semaphore_holders_are_grouped_by_their_protected_id_and_revoked_whole() {
        let s = LockLeaseSpec {
            mode: crate::api::LockMode::Semaphore,
            lease_duration: Some("3s".into()),
            permits: Some(4),
        };
        let a = "_c_aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa-lease-";
        let b = "_c_bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb-lease-";
        // a took two permits in one multi (one czxid), b one later.
        let leases = vec![
            child(&format!("{a}0000000001"), 0, 100, r#"{"id":"a"}"#),
            child(&format!("{a}0000000002"), 0, 100, r#"{"id":"a"}"#),
            child(&format!("{b}0000000003"), 0, 150, r#"{"id":"b"}"#),
        ];
        let locks = vec![
            child("_c_x-lock-0000000009", 0, 160, r#"{"id":"second"}"#),
            child("_c_y-lock-0000000008", 0, 155, r#"{"id":"first"}"#),
        ];
        let seen = look(
            &s,
            LockNodes::Semaphore {
                leases: &leases,
                locks: &locks,
            },
            &LockLeaseStatus::default(),
            at(200),
        );
        let st = &seen.status;
        assert_eq!(st.permits_in_use, Some(3));
        assert_eq!(st.holder_count, 2);
        assert_eq!(
            st.holders
                .iter()
                .map(|h| (h.id.as_str(), h.permits))
                .collect::<Vec<_>>(),
            [("a", 2), ("b", 1)]
        );
        assert_eq!(
            st.waiting,
            ["first", "second"],
            "in the order they will be served"
        );
        // Past the lease, a's hold is revoked whole: both its nodes.
        let late = look(
            &s,
            LockNodes::Semaphore {
                leases: &leases,
                locks: &locks,
            },
            &seen.status,
            at(3_300),
        );
        assert_eq!(
            late.revoke,
            [
                format!("leases/{a}0000000001"),
                format!("leases/{a}0000000002"),
                format!("leases/{b}0000000003")
            ]
        );
    }

    #[test]
    fn a_hold_starts_when_the_waiter_becomes_the_holder_not_when_it_queued() {
        let s = LockLeaseSpec {
            mode: crate::api::LockMode::Exclusive,
            lease_duration: Some("3s".into()),
            permits: None,
        };
        let first = child("_c_a-lock-0000000001", 0, 100, "");
        let second = child("_c_b-lock-0000000002", 100, 101, "");
        let both = Snapshot {
            data: vec![],
            stat: stat(0, 1, 0),
            children: vec![first, second.clone()],
        };
        let before = look(
            &s,
            LockNodes::Queue(&both.children),
            &LockLeaseStatus::default(),
            at(200),
        );
        // The first holder is revoked at 3.2 s; the second, queued since 0.1 s, takes over.
        let revoked = look(
            &s,
            LockNodes::Queue(&both.children),
            &before.status,
            at(3_200),
        );
        assert_eq!(revoked.revoke, ["_c_a-lock-0000000001"]);
        let next = Snapshot {
            data: vec![],
            stat: stat(0, 1, 0),
            children: vec![second],
        };
        let taken = look(
            &s,
            LockNodes::Queue(&next.children),
            &revoked.status,
            at(3_250),
        );
        assert!(
            taken.revoke.is_empty(),
            "a full lease for the new holder, not what is left since it queued"
        );
        assert_eq!(taken.status.holders[0].since, Some(MicroTime(at(3_250))));
        let still = look(
            &s,
            LockNodes::Queue(&next.children),
            &taken.status,
            at(6_000),
        );
        assert!(still.revoke.is_empty());
        assert_eq!(
            look(
                &s,
                LockNodes::Queue(&next.children),
                &taken.status,
                at(6_300)
            )
            .revoke
            .len(),
            1
        );
    }

    #[test]
    fn revocation_is_settled_in_one_pass() {
        let s = LockLeaseSpec {
            mode: crate::api::LockMode::Exclusive,
            lease_duration: Some("3s".into()),
            permits: None,
        };
        let children = vec![
            child("_c_a-lock-0000000001", 0, 100, r#"{"id":"a"}"#),
            child("_c_b-lock-0000000002", 100, 101, r#"{"id":"b"}"#),
        ];
        let before = look(
            &s,
            LockNodes::Queue(&children),
            &LockLeaseStatus::default(),
            at(200),
        );
        let settled = lock_settled(&LockObservation {
            spec: &s,
            nodes: LockNodes::Queue(&children),
            previous: &before.status,
            generation: Some(1),
            znode: "/l",
            now: at(3_200),
            spec_problem: None,
        });
        assert_eq!(settled.revoke, ["_c_a-lock-0000000001"]);
        let holders: Vec<_> = settled
            .status
            .holders
            .iter()
            .map(|h| (h.id.as_str(), h.since.clone()))
            .collect();
        assert_eq!(holders, [("b", Some(MicroTime(at(3_200))))]);
        assert!(settled.status.waiting.is_empty());
        let reasons: Vec<_> = settled.notes.iter().map(|n| n.reason).collect();
        assert_eq!(reasons, ["Revoked", "Acquired"], "revoked, never released");
        assert_eq!(settled.requeue, Some(Duration::from_millis(3_050)));
    }
}
