//! Status from observation: what ZooKeeper holds now plus what the previous
//! status remembered gives the new status, the events to record and the
//! actions to take. Pure functions, so every rule is testable without
//! servers.
//!
//! The Barrier's rules are in `barrier.rs`, the LockLease's in `lock.rs`;
//! what both use (events, conditions, the written lists' limits) is here.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::zk::tree::ChildNode;
use crate::zk::{ParticipantData, READY};

mod barrier;
mod lock;

pub use barrier::*;
pub use lock::*;

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

/// The most bytes of a text from ZooKeeper (a failure, a round's end)
/// that a status or an event carries. A tenant's participants write those
/// texts: one namespace must not make the controller hold, write or
/// record megabytes, and an Event's note is refused past 1 KiB.
pub const TEXT_LIMIT: usize = 1024;
/// The most bytes of a name or a reason from ZooKeeper (a member's id or
/// pod, a failure's reason) a status carries: a Kubernetes name's limit.
pub const NAME_LIMIT: usize = 253;

/// `text` cut to at most `limit` bytes on a character boundary, ending
/// with how many bytes were left out (without that when `limit` has no
/// room for it).
pub fn bounded(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    // The marker's length with the whole length's digits bounds its own.
    let marker_room = "… ( bytes more)".len() + text.len().to_string().len();
    if limit < marker_room {
        return text[..floor_boundary(text, limit)].to_owned();
    }
    let keep = floor_boundary(text, limit - marker_room);
    format!("{}… ({} bytes more)", &text[..keep], text.len() - keep)
}

/// A name from ZooKeeper (a member's id, a pod, a reason) cut to
/// [`NAME_LIMIT`] bytes, ending with a digest of the whole: two names that
/// differ only past the cut stay two (a status lists members by id).
pub fn bounded_name(name: &str) -> String {
    use sha1::{Digest, Sha1};
    if name.len() <= NAME_LIMIT {
        return name.to_owned();
    }
    let digest: String = Sha1::digest(name.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let keep = floor_boundary(name, NAME_LIMIT - "…".len() - digest.len());
    format!("{}…{digest}", &name[..keep])
}

/// The largest character boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// [`bounded`] in place.
fn bound(text: &mut String, limit: usize) {
    if text.len() > limit {
        *text = bounded(text, limit);
    }
}

/// [`bounded_name`] in place.
fn bound_name(name: &mut String) {
    if name.len() > NAME_LIMIT {
        *name = bounded_name(name);
    }
}

/// [`bounded_name`] in place, if any.
fn bound_name_some(name: &mut Option<String>) {
    if let Some(name) = name {
        bound_name(name);
    }
}

/// Conditions' reasons and messages bounded.
fn bound_conditions(conditions: &mut [Condition]) {
    for c in conditions {
        bound_name(&mut c.reason);
        bound(&mut c.message, TEXT_LIMIT);
    }
}

/// Events' messages bounded.
fn bound_notes(notes: &mut [Note]) {
    for n in notes {
        bound(&mut n.message, TEXT_LIMIT);
    }
}

/// A status as written: its lists cut to [`LIST_LIMIT`]. The controller
/// remembers the whole status and writes this.
pub trait Capped {
    /// The written form.
    fn capped(&self) -> Self;
}

fn jiff_span(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    #[test]
    fn bounded_texts_and_names_stay_within_their_limit_on_character_boundaries() {
        for text in ["x".repeat(3000), "é".repeat(3000), "😀".repeat(3000)] {
            for limit in [0, 1, 5, 22, 23, 40, NAME_LIMIT, TEXT_LIMIT] {
                let cut = bounded(&text, limit);
                assert!(cut.len() <= limit, "{limit}: {}", cut.len());
                assert_eq!(bounded(&cut, limit), cut, "cut again, unchanged");
            }
            let name = bounded_name(&text);
            assert!(name.len() <= NAME_LIMIT);
            assert_eq!(bounded_name(&name), name);
        }
        let (a, b) = ("p".repeat(300) + "-0001", "p".repeat(300) + "-0002");
        assert_ne!(
            bounded_name(&a),
            bounded_name(&b),
            "names differing past the cut"
        );
        assert_eq!(bounded_name("short"), "short");
    }
}

/// What the Barrier's and the LockLease's tests both build from.
#[cfg(test)]
mod test_support {
    use k8s_openapi::jiff::Timestamp;
    use zookeeper_client::Stat;

    use crate::api::{BarrierSpec, OnParticipantLoss};
    use crate::zk::tree::{ChildNode, Snapshot};
    use crate::zk::BarrierData;

    pub(super) fn stat(ctime: i64, czxid: i64, ephemeral_owner: i64) -> Stat {
        crate::zk::tree::test_stat(ctime, czxid, ephemeral_owner)
    }

    pub(super) fn child(name: &str, ctime: i64, czxid: i64, data: &str) -> ChildNode {
        ChildNode {
            name: name.into(),
            data: data.as_bytes().to_vec(),
            stat: stat(ctime, czxid, 1),
        }
    }

    pub(super) fn node(data: BarrierData, children: Vec<ChildNode>) -> Snapshot {
        Snapshot {
            data: data.to_bytes(),
            stat: stat(0, 1, 0),
            children,
        }
    }

    pub(super) fn spec(x: u32, timeout: Option<&str>, loss: OnParticipantLoss) -> BarrierSpec {
        BarrierSpec {
            participants: Some(x),
            timeout: timeout.map(Into::into),
            on_participant_loss: loss,
            job_ref: None,
            max_restarts: None,
            after: Vec::new(),
        }
    }

    pub(super) fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{node, spec};
    use super::*;
    use crate::api::{
        BarrierPhase, BarrierStatus, LockLeaseStatus, OnParticipantLoss, ParticipantStatus,
        WaiterStatus,
    };
    use crate::zk::BarrierData;

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
            held: None,
            after_failed: None,
            still_running: 0,
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
}
