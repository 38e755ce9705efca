//! Roles that start in order (`spec.after`): a Barrier that opens only
//! once other Barriers of its namespace are far enough along.
//!
//! The controller holds such a barrier in ZooKeeper (`held` in its node's
//! data: its participants enter and wait, and none opens it, whatever the
//! count) until every named Barrier is `Entered`, `Open`, `Ready` (open,
//! and every participant's pod Ready) or `Completed`; then it lifts the
//! hold and the participants open it themselves, at once. A named Barrier
//! that fails fails this one; one not made yet is waited for; a cycle of
//! `after`s fails every Barrier on it.
//!
//! What wakes a held Barrier: the reconcile of a Barrier it names (that
//! one's status changed, its nodes changed, or a labelled pod of it
//! changed) asks for a look at the Barriers waiting on it
//! ([`super::waits::Waits`]);
//! pods written by hand (unlabelled) are looked at every [`RECHECK`].

use std::collections::HashMap;
use std::time::Duration;

use kube::api::Api;

use super::context::Context;
use super::error::Error;
use crate::api::{After, Barrier, BarrierPhase, Until};
use crate::workload::after::{cycle_of, Chain, MAX_VISITS};
use crate::zk::{BarrierData, ParticipantData, READY};

/// How often a held Barrier looks again without being asked (its named
/// Barriers' pods may be unlabelled, so their readiness triggers nothing).
pub const RECHECK: Duration = Duration::from_secs(5);

/// Where a Barrier with `after` stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every named Barrier is far enough along: it may open.
    Lifted,
    /// Held, and why (the first condition that does not hold).
    Held(String),
    /// A named Barrier failed, or the `after`s make a cycle: why.
    Failed(String),
}

/// What a named Barrier must be for `after` to hold, given the Barrier
/// (`None`: not made yet) and, for `Ready`, the pods of its participants
/// that are not Ready.
pub fn judge(after: &After, found: Option<&Barrier>, not_ready: &[String]) -> Verdict {
    let name = &after.barrier;
    let Some(found) = found else {
        return Verdict::Held(format!("waiting for Barrier {name} to be made"));
    };
    let status = found.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or(BarrierPhase::Waiting);
    if phase == BarrierPhase::Failed {
        return Verdict::Failed(format!(
            "Barrier {name} failed ({})",
            status
                .reason
                .clone()
                .or(status.message.clone())
                .unwrap_or_default()
        ));
    }
    let opened = matches!(
        phase,
        BarrierPhase::Open | BarrierPhase::Leaving | BarrierPhase::Completed
    );
    let required = status.required.unwrap_or(0);
    let why = match after.until {
        Until::Entered if opened || (required > 0 && status.entered >= required) => {
            return Verdict::Lifted
        }
        Until::Entered => format!(
            "waiting for Barrier {name}: {} of {required} participants entered",
            status.entered
        ),
        Until::Open if opened => return Verdict::Lifted,
        Until::Open => format!("waiting for Barrier {name} to open ({})", describe(&status)),
        // Gone before they were all Ready (one finished or failed, and
        // a failed one's registration goes too): they never will be.
        Until::Ready if matches!(phase, BarrierPhase::Leaving | BarrierPhase::Completed) => {
            return Verdict::Failed(format!(
                "participants of Barrier {name} left it before every one was Ready ({})",
                describe(&status)
            ))
        }
        Until::Ready if opened && not_ready.is_empty() => return Verdict::Lifted,
        Until::Ready if opened => format!(
            "waiting for the pods of Barrier {name} to be Ready: {} not yet",
            list(not_ready)
        ),
        Until::Ready => format!(
            "waiting for Barrier {name} to open, then its pods to be Ready ({})",
            describe(&status)
        ),
        Until::Completed if phase == BarrierPhase::Completed => return Verdict::Lifted,
        Until::Completed => format!(
            "waiting for Barrier {name} to complete ({})",
            describe(&status)
        ),
    };
    Verdict::Held(why)
}

fn describe(status: &crate::api::BarrierStatus) -> String {
    status
        .message
        .clone()
        .unwrap_or_else(|| "no status yet".to_owned())
}

/// At most the first five names, and how many more.
fn list(names: &[String]) -> String {
    let mut shown = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        shown.push_str(&format!(" and {} more", names.len() - 5));
    }
    shown
}

/// What the barrier node's `held` says while it is held: which Barriers it
/// starts after, and how far. Stable while it waits (the detail, which
/// changes with every arrival there, is in the status only): each change
/// of it would wake every waiting participant.
pub fn held_note(after: &[After]) -> String {
    let named: Vec<String> = after
        .iter()
        .map(|a| format!("{} ({:?})", a.barrier, a.until))
        .collect();
    format!("it starts after Barrier {}", named.join(", "))
}

/// The verdict for `barrier`'s `after`s (empty: [`Verdict::Lifted`]),
/// reading the named Barriers (API) and their registrations (ZooKeeper)
/// and pods now.
pub async fn verdict(barrier: &Barrier, namespace: &str, ctx: &Context) -> Result<Verdict, Error> {
    if barrier.spec.after.is_empty() {
        return Ok(Verdict::Lifted);
    }
    let api: Api<Barrier> = Api::namespaced(ctx.client.clone(), namespace);
    // The search reads the named Barriers first: what it read serves below.
    let mut read = HashMap::new();
    match cycle_of(&api, barrier, &mut read).await? {
        Chain::Cycle(cycle) => {
            return Ok(Verdict::Failed(format!(
                "the Barriers' after make a cycle: {cycle}"
            )))
        }
        Chain::TooLong => {
            return Ok(Verdict::Failed(format!(
                "its after reach more than {MAX_VISITS} Barriers (a chain that long is refused: it may hide a cycle)"
            )))
        }
        Chain::Fine => {}
    }
    let mut held = None;
    for after in &barrier.spec.after {
        let found = match read.remove(&after.barrier) {
            Some(found) => found,
            None => api.get_opt(&after.barrier).await?,
        };
        let not_ready = match (&found, after.until) {
            (Some(_), Until::Ready) => {
                let seen = participants(ctx, namespace, &after.barrier).await?;
                // Read in ZooKeeper before its status says so: one left
                // (finished or failed) after the opening.
                if seen.open && seen.registrations < seen.count as usize {
                    return Ok(Verdict::Failed(format!(
                        "participants of Barrier {} left it before every one was Ready ({} of {} still there)",
                        after.barrier, seen.registrations, seen.count
                    )));
                }
                ctx.pods.not_ready(namespace, &seen.pods).await?
            }
            _ => Vec::new(),
        };
        match judge(after, found.as_ref(), &not_ready) {
            Verdict::Lifted => {}
            failed @ Verdict::Failed(_) => return Ok(failed),
            Verdict::Held(why) => {
                held.get_or_insert(why);
            }
        }
    }
    Ok(held.map_or(Verdict::Lifted, Verdict::Held))
}

/// A named Barrier's participants as ZooKeeper has them now.
struct Participants {
    /// The pods its registrations name (every one, not the status's capped
    /// list; the current round's in rounds). A registration that names no
    /// pod (a participant that is not a pod) has no readiness to wait for.
    pods: Vec<String>,
    /// How many registrations there are.
    registrations: usize,
    /// How many open it.
    count: u32,
    /// Whether it opened.
    open: bool,
}

async fn participants(ctx: &Context, namespace: &str, name: &str) -> Result<Participants, Error> {
    let path = ctx.layout.barrier(namespace, name)?;
    let none = Participants {
        pods: Vec::new(),
        registrations: 0,
        count: 0,
        open: false,
    };
    let Some(mut node) = crate::zk::tree::snapshot(&ctx.zk, &path).await? else {
        return Ok(none);
    };
    let data = BarrierData::parse(&path, &node.data).ok().flatten();
    if let Some(k) = data.as_ref().and_then(|d| d.round) {
        let round = crate::zk::GangBarrier::new(&path).round_path(k);
        match crate::zk::tree::snapshot(&ctx.zk, &round).await? {
            Some(found) => node = found,
            None => return Ok(none),
        }
    }
    let registrations: Vec<_> = node.children.iter().filter(|c| c.name != READY).collect();
    Ok(Participants {
        pods: registrations
            .iter()
            .filter_map(|c| ParticipantData::parse(&c.data).pod)
            .collect(),
        registrations: registrations.len(),
        count: data.map_or(0, |d| d.participants),
        open: node.children.iter().any(|c| c.name == READY),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::BarrierStatus;

    fn named(phase: Option<BarrierPhase>, entered: u32, required: u32) -> Barrier {
        let mut b = Barrier::new("workers", Default::default());
        b.status = Some(BarrierStatus {
            phase,
            entered,
            required: Some(required),
            message: Some(format!("{entered} of {required} participants entered")),
            reason: (phase == Some(BarrierPhase::Failed)).then(|| "TimedOut".to_owned()),
            ..Default::default()
        });
        b
    }

    fn after(until: Until) -> After {
        After {
            barrier: "workers".into(),
            until,
        }
    }

    #[test]
    fn a_barrier_not_made_yet_is_waited_for() {
        assert_eq!(
            judge(&after(Until::Ready), None, &[]),
            Verdict::Held("waiting for Barrier workers to be made".into())
        );
    }

    #[test]
    fn each_until_lifts_at_its_own_point() {
        let waiting = named(Some(BarrierPhase::Waiting), 2, 3);
        let entered = named(Some(BarrierPhase::Waiting), 3, 3);
        let open = named(Some(BarrierPhase::Open), 3, 3);
        let done = named(Some(BarrierPhase::Completed), 3, 3);
        let lifted = |u, b: &Barrier, not_ready: &[String]| {
            judge(&after(u), Some(b), not_ready) == Verdict::Lifted
        };
        assert!(!lifted(Until::Entered, &waiting, &[]));
        assert!(lifted(Until::Entered, &entered, &[]));
        assert!(!lifted(Until::Open, &entered, &[]));
        assert!(lifted(Until::Open, &open, &[]));
        assert!(!lifted(Until::Ready, &entered, &[]));
        assert!(!lifted(Until::Ready, &open, &["workers-1".into()]));
        assert!(lifted(Until::Ready, &open, &[]));
        assert!(matches!(
            judge(&after(Until::Ready), Some(&done), &[]),
            Verdict::Failed(_)
        ));
        let leaving = named(Some(BarrierPhase::Leaving), 3, 3);
        assert!(matches!(
            judge(&after(Until::Ready), Some(&leaving), &[]),
            Verdict::Failed(_)
        ));
        assert!(!lifted(Until::Completed, &open, &[]));
        assert!(lifted(Until::Completed, &done, &[]));
    }

    #[test]
    fn a_held_barrier_says_which_pods_are_not_ready() {
        let open = named(Some(BarrierPhase::Open), 3, 3);
        let not_ready: Vec<String> = (0..7).map(|i| format!("w-{i}")).collect();
        let Verdict::Held(why) = judge(&after(Until::Ready), Some(&open), &not_ready) else {
            panic!("not held");
        };
        assert_eq!(
            why,
            "waiting for the pods of Barrier workers to be Ready: w-0, w-1, w-2, w-3, w-4 and 2 more not yet"
        );
    }

    #[test]
    fn a_failed_named_barrier_fails_this_one_whatever_the_until() {
        let failed = named(Some(BarrierPhase::Failed), 1, 3);
        for until in [Until::Entered, Until::Open, Until::Ready, Until::Completed] {
            assert_eq!(
                judge(&after(until), Some(&failed), &[]),
                Verdict::Failed("Barrier workers failed (TimedOut)".into())
            );
        }
    }
}
