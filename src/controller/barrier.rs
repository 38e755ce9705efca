//! Reconciling a `Barrier`: its barrier node in ZooKeeper, the registrations
//! of finished pods, the timeout, and the status.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::ResourceExt;
use tracing::{info, warn};

use super::after::{self, Verdict};
use super::context::{Context, StatusMemory};
use super::credentials::NamespaceAcls;
use super::error::Error;
use super::pods::PodFate;
use super::reconciler::{next_look, own_node, publish, Reconciled, POD_RECHECK};
use super::removal::{self, Removal};
use super::status::{self, BarrierObservation};
use crate::api::{Barrier, BarrierPhase, OnParticipantLoss};
use crate::zk::tree::ChildNode;
use crate::zk::{BarrierData, DoubleBarrier, GangBarrier, RunMark, RunMarks, READY};

impl Reconciled for Barrier {
    fn memory(ctx: &Context) -> &StatusMemory<Self::Status> {
        &ctx.barrier_status
    }

    async fn apply(
        &self,
        namespace: &str,
        acls: &NamespaceAcls,
        ctx: &Context,
    ) -> Result<Action, Error> {
        let barrier = self;
        let uid = barrier.uid().ok_or(Error::Incomplete("uid"))?;
        let path = ctx.layout.barrier(namespace, &barrier.name_any())?;
        let size = match size(barrier, namespace, ctx).await {
            Ok(n) => n,
            Err(problem) => match current_size(ctx, &path).await? {
                // Made before: it keeps its count (and says why it cannot follow).
                Some(n) => {
                    return apply_sized(barrier, namespace, acls, ctx, n, Some(problem)).await;
                }
                None => {
                    let previous = ctx.barrier_status.previous(&uid, barrier.status.as_ref());
                    let outcome = status::barrier_unsized(
                        &previous,
                        &problem,
                        barrier.metadata.generation,
                        &path,
                        Timestamp::now(),
                    );
                    publish(barrier, namespace, &outcome.status, &outcome.notes, ctx).await?;
                    // The Job's arrival triggers a look; this is the fallback.
                    return Ok(Action::requeue(Duration::from_secs(30)));
                }
            },
        };
        apply_sized(barrier, namespace, acls, ctx, size, None).await
    }

    async fn cleanup(&self, namespace: &str, ctx: &Context) -> Result<Action, Error> {
        let barrier = self;
        let name = barrier.name_any();
        let path = ctx.layout.barrier(namespace, &name)?;
        let zk = &*ctx.zk;
        // Waiters learn first that the barrier is gone (they exit 4), then the
        // subtree goes.
        match DoubleBarrier::new(&path).fail(zk, "Deleted").await {
            Ok(_)
            | Err(crate::zk::ZkError::Zk {
                source: zookeeper_client::Error::NoNode,
                ..
            }) => {}
            // The namespace's pods may write the node: data made unreadable,
            // or rewritten without pause, must not keep the Barrier (and its
            // namespace) for ever. Its deletion below tells the waiters too.
            Err(
                e @ (crate::zk::ZkError::InvalidData { .. } | crate::zk::ZkError::Contended { .. }),
            ) => {
                tracing::warn!(barrier = %name, error = %e, "could not mark the barrier failed before deleting it; deleting it all the same");
            }
            Err(e) => return Err(e.into()),
        }
        super::reconciler::delete_subtree(barrier, ctx, &path).await?;
        ctx.metrics.barrier_gone(namespace, &name);
        ctx.jobs.follow(namespace, &name, None);
        ctx.after.set(namespace, &name, &[]);
        ctx.after.touch(namespace, &name);
        if let Some(uid) = barrier.uid() {
            ctx.barrier_status.forget(&uid);
        }
        info!(barrier = %name, %path, "deleted the barrier's znodes");
        Ok(Action::await_change())
    }
}

/// How many participants open `barrier`: `spec.participants`, else its
/// Job's count (see [`super::jobs`]); or why it has no size.
async fn size(barrier: &Barrier, namespace: &str, ctx: &Context) -> Result<u32, String> {
    let following = barrier
        .spec
        .job_ref
        .as_deref()
        .filter(|_| barrier.spec.participants.is_none());
    ctx.jobs.follow(namespace, &barrier.name_any(), following);
    match (barrier.spec.participants, following) {
        (Some(n), _) => Ok(n),
        (None, Some(job)) => ctx.jobs.size(namespace, job).await,
        (None, None) => Err("neither participants nor jobRef is set".to_owned()),
    }
}

/// The count the barrier node holds, if the node exists.
async fn current_size(ctx: &Context, path: &str) -> Result<Option<u32>, Error> {
    match ctx.zk.client().get_data(path).await {
        Ok((data, _)) => Ok(BarrierData::parse(path, &data)
            .ok()
            .flatten()
            .map(|d| d.participants)),
        Err(zookeeper_client::Error::NoNode) => Ok(None),
        Err(e) => Err(crate::zk::ZkError::Zk {
            op: "read",
            path: path.to_owned(),
            source: e,
        }
        .into()),
    }
}

/// [`apply`] once the barrier's size is known: `size_problem` says why it
/// is not what the spec asks for.
async fn apply_sized(
    barrier: &Barrier,
    namespace: &str,
    acls: &NamespaceAcls,
    ctx: &Context,
    size: u32,
    size_problem: Option<String>,
) -> Result<Action, Error> {
    let name = barrier.name_any();
    let uid = barrier.uid().ok_or(Error::Incomplete("uid"))?;
    let path = ctx.layout.barrier(namespace, &name)?;
    let zk = &*ctx.zk;
    let restarts = barrier.spec.on_participant_loss == OnParticipantLoss::RestartGang;
    // Roles in order: held until the Barriers it starts after are far
    // enough along (looked at until it opens; not in rounds yet).
    let previous = ctx.barrier_status.previous(&uid, barrier.status.as_ref());
    let settled = matches!(
        previous.phase,
        Some(
            BarrierPhase::Open
                | BarrierPhase::Leaving
                | BarrierPhase::Completed
                | BarrierPhase::Failed
        )
    );
    let verdict = if settled || restarts {
        Verdict::Lifted
    } else {
        after::verdict(barrier, namespace, ctx).await?
    };
    // What the node says (stable while held: a change wakes every waiter);
    // the detail goes to the status.
    let held = match &verdict {
        Verdict::Lifted => None,
        Verdict::Held(_) | Verdict::Failed(_) => Some(after::held_note(&barrier.spec.after)),
    };
    // Until it opens, a change of a named Barrier is a reason to look
    // again (lifted, it may have to be held again).
    let waits_on: Vec<String> = match settled || restarts {
        false => barrier
            .spec
            .after
            .iter()
            .map(|a| a.barrier.clone())
            .collect(),
        true => Vec::new(),
    };
    ctx.after.set(namespace, &name, &waits_on);
    let wanted = BarrierData {
        participants: size,
        uid: Some(uid.clone()),
        failed: None,
        // Fixed at creation: a Barrier's owners do not change its run.
        // Its run, or that it has none ("").
        run: Some(crate::workload::run::run_of(barrier).unwrap_or_default()),
        // A gang that restarts together meets in rounds, from round 0.
        round: restarts.then_some(0),
        max_restarts: barrier.spec.max_restarts.filter(|_| restarts),
        numeric_ranks: restarts,
        held: held.clone(),
        ..BarrierData::default()
    };

    let owner = |data: &[u8]| {
        BarrierData::parse(&path, data)
            .map(|d| d.and_then(|d| d.uid))
            .map_err(|e| e.to_string())
    };
    // In rounds, the round's node is made below.
    let create = || async {
        DoubleBarrier::new(&path)
            .create_with_acls(zk, &wanted, &acls.barriers)
            .await
            .map(|_| ())
            .map_err(Error::from)
    };
    let node = own_node(barrier, ctx, &path, &uid, wanted.to_bytes(), owner, create).await?;
    let Some(node) = node else {
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let top = BarrierData::parse(&path, &node.data)
        .ok()
        .flatten()
        .unwrap_or_default();
    // A node made before runs were recorded (an upgrade) gets its run, so
    // that a later run's participants never pass its `ready`.
    if let (None, Some(run)) = (&top.run, &wanted.run) {
        if top.uid == wanted.uid {
            DoubleBarrier::new(&path).set_run(zk, run).await?;
        }
    }
    let mut spec_problem = size_problem;
    if restarts && !barrier.spec.after.is_empty() {
        spec_problem = Some(
            "after is not supported with onParticipantLoss: RestartGang yet; it has no effect"
                .to_owned(),
        );
    }
    if top.round.is_some() != restarts {
        spec_problem = Some(format!(
            "onParticipantLoss is fixed when the barrier is made, and this one was made {} rounds; the change has no effect",
            if top.round.is_some() { "in" } else { "without" }
        ));
    }
    // In rounds, the registrations are the current round's: everything
    // below looks at that round's node.
    let mut marked = 0;
    let (live, mut node) = match top.round {
        None => (path.clone(), node),
        Some(k) => {
            let gang = GangBarrier::new(&path);
            gang.ensure_round(zk, &top, k).await?;
            prepare_rounds(zk, &gang, &top, k, size).await?;
            marked = clear_run_marks(ctx, namespace, &gang, k).await?;
            let round = gang.round_path(k);
            match crate::zk::tree::snapshot(zk, &round).await? {
                // Ended since the barrier node was read (the barrier node
                // has moved on): look again, rather than report a round
                // whose members are on their way out. (The last round of
                // a failed barrier stays ended: that is its outcome.)
                Some(node)
                    if top.failed.is_none()
                        && BarrierData::parse(&round, &node.data)
                            .ok()
                            .flatten()
                            .is_some_and(|d| d.ended.is_some()) =>
                {
                    return Ok(Action::requeue(Duration::from_millis(100)))
                }
                Some(node) => (round, node),
                None => return Ok(Action::requeue(Duration::ZERO)),
            }
        }
    };
    let recipe = DoubleBarrier::new(&live);

    // Registrations made by init containers outlive them: remove those whose
    // pod has finished (it left) or is gone, and, until the barrier opens,
    // those whose pod is being deleted: such a pod starts no main container,
    // so it must not complete the count (after the opening it is leaving,
    // and its main containers may still run out their grace period). First,
    // so that the count below is of the registrations that stay.
    let opened = node.children.iter().any(|c| c.name == READY);
    let registrations: Vec<_> = node
        .children
        .iter()
        .filter(|c| c.name != READY && c.stat.ephemeral_owner == 0)
        .collect();
    let persistent = !registrations.is_empty();
    let removed = remove_ended(ctx, namespace, &live, registrations, opened).await?;
    node.children.retain(|c| !removed.contains(&c.name));

    // x can change while the barrier waits, but not below those already
    // in (the count could never come down to it), and not once it opened.
    // Lowered to exactly those in, it opens: the data write fires the
    // waiters' barrier watch, and each counts again against the new x.
    let current = BarrierData::parse(&live, &node.data)
        .ok()
        .flatten()
        .unwrap_or_default();
    let entered = node.children.iter().filter(|c| c.name != READY).count();
    let wanted_x = size;
    // The hold follows the verdict until the barrier opens; written before
    // a lowered count (which could open it).
    if current.held != held && current.failed.is_none() && !opened {
        if recipe.set_held(zk, held.as_deref()).await? {
            node.data = BarrierData {
                held: held.clone(),
                ..current.clone()
            }
            .to_bytes();
        } else {
            // It opened since our snapshot.
            return Ok(Action::requeue(Duration::ZERO));
        }
    }
    let current = BarrierData {
        held: held.clone(),
        ..current
    };
    // In rounds, the barrier node's count is what the next rounds are made
    // with: it follows the spec first, whatever the current round does (a
    // round ended in between is made with the new count, or fails its
    // version check and reads it again).
    if top.round.is_some() && top.participants != wanted_x && top.failed.is_none() {
        DoubleBarrier::new(&path)
            .set_participants(zk, wanted_x)
            .await?;
    }
    if current.participants != wanted_x && current.failed.is_none() {
        if opened {
            spec_problem = Some(format!(
                "participants changed to {wanted_x} after the barrier opened with {}; it has no effect",
                current.participants
            ));
        } else if (wanted_x as usize) < entered {
            spec_problem = Some(format!(
                "participants lowered to {wanted_x}, but {entered} have already entered; keeping {}",
                current.participants
            ));
        } else if recipe.set_participants(zk, wanted_x).await? {
            node.data = BarrierData {
                participants: wanted_x,
                ..current.clone()
            }
            .to_bytes();
        } else {
            // It opened since our snapshot: the count it opened with stands.
            return Ok(Action::requeue(Duration::ZERO));
        }
    }

    let after_failed = match &verdict {
        Verdict::Failed(why) => Some(why.as_str()),
        _ => None,
    };
    let previous = status::previous_of_round(previous, top.round);
    let mut outcome = status::barrier(&BarrierObservation {
        spec: &barrier.spec,
        participants: wanted_x,
        // A round after the first waits from its own start: its timeout
        // counts from when the round before ended.
        created: match top.round {
            Some(k) if k > 0 => Timestamp::from_millisecond(node.stat.ctime).ok(),
            _ => barrier.metadata.creation_timestamp.as_ref().map(|t| t.0),
        },
        node: &node,
        previous: &previous,
        generation: barrier.metadata.generation,
        znode: &path,
        now: Timestamp::now(),
        spec_problem: spec_problem.as_deref(),
        still_running: marked,
        held: match &verdict {
            Verdict::Held(why) => Some(why.as_str()),
            _ => None,
        },
        after_failed,
    });
    if let Some(k) = top.round {
        status::in_rounds(&mut outcome, &previous, &top, k, Timestamp::now());
    }
    if let Some(reason) = &outcome.fail {
        warn!(barrier = %name, %reason, "failing the barrier");
        if !recipe.fail(zk, reason).await? {
            // It opened since our snapshot: its outcome stands. Look again.
            info!(barrier = %name, "the barrier opened before it could be failed");
            return Ok(Action::requeue(Duration::ZERO));
        }
    }
    let changed = publish(barrier, namespace, &outcome.status, &outcome.notes, ctx).await?;
    ctx.metrics
        .barrier_seen(namespace, &name, &outcome.status, &node);
    // Those that start after this one look again when what they read of
    // it changed (its pods' changes reach them directly: see
    // `waits::Waits::dependents`). Not on every look: a chain of held
    // Barriers would wake each other without end.
    if changed {
        ctx.after.touch(namespace, &name);
    }
    let recheck = (persistent || marked > 0).then_some(POD_RECHECK);
    let held_look = matches!(verdict, Verdict::Held(_)).then_some(after::RECHECK);
    Ok(next_look(ctx, namespace, [outcome.requeue, recheck, held_look]).await)
}

/// A barrier in rounds, at round `k`: the next round's node made ahead
/// (with the barrier node's ACL, which the members cannot copy: see
/// [`GangBarrier::end_round`]) and its count kept at `size`; the nodes of
/// rounds before `k - 1` removed (the round before may still hold members
/// stopping their commands, which the current round waits out).
async fn prepare_rounds(
    zk: &crate::zk::Session,
    gang: &GangBarrier,
    top: &BarrierData,
    k: u32,
    size: u32,
) -> Result<(), Error> {
    let next = k.checked_add(1);
    let allowed = top
        .max_restarts
        .is_none_or(|max| next.is_some_and(|n| n <= max));
    if let (Some(next), None, true) = (next, &top.failed, allowed) {
        let data = BarrierData {
            participants: size,
            ..top.clone()
        };
        if !gang.ensure_round(zk, &data, next).await? {
            // Made before with another count (the spec changed since).
            DoubleBarrier::new(gang.round_path(next))
                .set_participants(zk, size)
                .await?;
        }
    }
    let client = zk.client();
    let children = match client.list_children(gang.path()).await {
        Ok(children) => children,
        Err(e) => {
            return Err(crate::zk::ZkError::Zk {
                op: "list",
                path: gang.path().to_owned(),
                source: e,
            }
            .into())
        }
    };
    let rounds = children
        .iter()
        .filter_map(|c| c.strip_prefix("round-")?.parse::<u32>().ok());
    for old in rounds.filter(|j| j.saturating_add(1) < k) {
        crate::zk::tree::delete_tree(zk, &gang.round_path(old)).await?;
    }
    Ok(())
}

/// Removes the run marks of `gang` (see [`RunMarks`]) whose pod has
/// finished or is gone: its command is dead, and a round waiting for it may
/// start. A pod being deleted keeps its mark (its command may run out the
/// grace period). Each removal is conditional on the mark's version, so a
/// mark made again since the look stays. Returns how many marks of round
/// `k` or before are left (to be looked at again).
async fn clear_run_marks(
    ctx: &Context,
    namespace: &str,
    gang: &GangBarrier,
    k: u32,
) -> Result<u32, Error> {
    let marks = RunMarks::of(gang.path());
    let Some(node) = crate::zk::tree::snapshot(&ctx.zk, marks.path()).await? else {
        // Made once (not looked for on every reconcile): no mark yet.
        marks.ensure(&ctx.zk, gang.path()).await?;
        return Ok(0);
    };
    let mut left = 0;
    for (mark, fate) in ctx.pods.fates(namespace, &node.children).await? {
        // A mark we cannot read is taken as of this round or before, as
        // the members waiting for marks take it.
        let counts = u32::from(RunMark::parse(&mark.data).is_none_or(|m| m.round <= k));
        if !matches!(fate, PodFate::Finished | PodFate::Gone) {
            left += counts;
            continue;
        }
        let path = crate::zk::path::join(marks.path(), &mark.name);
        match ctx.zk.client().delete(&path, Some(mark.stat.version)).await {
            Ok(()) => {
                info!(barrier = %gang.path(), member = %mark.name, ?fate, "removed the run mark of a pod that ended");
            }
            // Made again, or removed, since the look: the next look sees.
            Err(zookeeper_client::Error::BadVersion | zookeeper_client::Error::NoNode) => {
                left += counts
            }
            Err(e) => {
                return Err(crate::zk::ZkError::from_client("delete", &path, e).into());
            }
        }
    }
    Ok(left)
}

/// Removes the registrations among `registrations` (persistent children of
/// the barrier at `path`, as the look saw them) whose pod ended: finished or
/// gone, or, while the barrier has not `opened`, being deleted. Each removal
/// moves the barrier node's version in its transaction (an opening that
/// counted the registration counts again), leaves a registration made again
/// since the look alone, and for a pod being deleted asserts that the
/// barrier has not opened since. Returns the names removed.
async fn remove_ended(
    ctx: &Context,
    namespace: &str,
    path: &str,
    registrations: Vec<&ChildNode>,
    opened: bool,
) -> Result<Vec<String>, Error> {
    let mut removed = Vec::new();
    for (node, fate) in ctx.pods.fates(namespace, registrations).await? {
        let unless_open = match fate {
            PodFate::Alive => continue,
            PodFate::Terminating if opened => continue,
            PodFate::Terminating => true,
            PodFate::Finished | PodFate::Gone => false,
        };
        info!(barrier = %path, node = %node.name, ?fate, "removing the registration of a pod that ended");
        match removal::remove_registration(&ctx.zk, path, node, unless_open).await? {
            Removal::Removed => removed.push(node.name.clone()),
            outcome => {
                info!(barrier = %path, node = %node.name, ?outcome, "the registration was not removed")
            }
        }
    }
    Ok(removed)
}
