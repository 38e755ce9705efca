//! Reconciling a `LockLease`: its lock node, the lease duration, released
//! holds of finished pods, and the status.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::ResourceExt;
use tracing::info;
use zookeeper_client as zk;

use super::context::{Context, StatusMemory};
use super::credentials::NamespaceAcls;
use super::error::Error;
use super::pods::PodFate;
use super::reconciler::{next_look, own_node, release_ended, Reconciled, POD_RECHECK};
use super::status;
use crate::api::{LockLease, LockMode};
use crate::zk::lock_mode::{self as mode, LockNodeRead};
use crate::zk::{path, tree, ZkError};

pub use crate::api::LockNodeData;

impl Reconciled for LockLease {
    fn memory(ctx: &Context) -> &StatusMemory<Self::Status> {
        &ctx.lock_status
    }

    async fn apply(
        &self,
        namespace: &str,
        acls: &NamespaceAcls,
        ctx: &Context,
    ) -> Result<Action, Error> {
        let lock = self;
        let name = lock.name_any();
        let uid = lock.uid().ok_or(Error::Incomplete("uid"))?;
        let path = ctx.layout.lock(namespace, &name)?;
        let zk = &*ctx.zk;
        let wanted = LockNodeData {
            uid: uid.clone(),
            mode: lock.spec.mode,
            lease_ms: lock.spec.lease().map(|l| l.as_millis() as u64),
            changing_to: None,
        };

        let bytes = serde_json::to_vec(&wanted)?;
        // A node without a uid was made by a participant's `--create`
        // before us: its holds are real, so it is taken over as ours, and
        // its mode changes only by the rules below (not while in use).
        let owner = |data: &[u8]| match serde_json::from_slice::<LockNodeData>(data) {
            Ok(d) if d.uid.is_empty() => Ok(Some(uid.clone())),
            Ok(d) => Ok(Some(d.uid)),
            Err(e) => Err(e.to_string()),
        };
        let create = || async {
            let dir = zk::CreateMode::Persistent.with_acls((&acls.resources[..]).into());
            let made = |at: &str| {
                let at = at.to_owned();
                move |e| ZkError::Zk {
                    op: "create",
                    path: at,
                    source: e,
                }
            };
            if let Some((parent, _)) = path.rsplit_once('/') {
                match zk.client().mkdir(parent, &dir).await {
                    Ok(()) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(made(parent)(e).into()),
                }
            }
            match zk.client().create(&path, &bytes, &dir).await {
                Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
                Err(e) => Err(made(&path)(e).into()),
            }
        };
        let node = own_node(lock, ctx, &path, &uid, bytes.clone(), owner, create).await?;
        let Some(mut node) = node else {
            return Ok(Action::requeue(Duration::from_secs(1)));
        };

        // The mode changes only while nobody holds or waits (the recipe's
        // two steps); the lease at once: holders follow it (a change
        // reaches a holder by its watch on this node).
        let names: Vec<String> = node.children.iter().map(|c| c.name.clone()).collect();
        let read = LockNodeRead {
            data: &node.data,
            version: node.stat.version,
            children: &names,
        };
        let settled = match mode::settle(zk, &path, read, &wanted).await {
            Ok(settled) => settled,
            Err(ZkError::LeftBehind { left, .. }) => return Err(Error::ShutOut(left)),
            Err(e) => return Err(e.into()),
        };
        let spec_problem = settled.waiting_for.map(|to| {
            format!(
                "mode changed from {:?} to {:?} while the lock is in use; keeping {:?} until it is free",
                settled.data.mode, to, settled.data.mode
            )
        });
        node.stat.version = settled.version;
        node.data = serde_json::to_vec(&settled.data).unwrap_or_default();
        let mode = settled.data.mode;
        if mode == LockMode::Semaphore {
            return apply_semaphore(lock, namespace, ctx, &path, &acls.resources, spec_problem)
                .await;
        }

        // Holds taken by init containers outlive them: release those whose pod
        // has finished or is gone.
        let holds: Vec<_> = node
            .children
            .iter()
            .filter(|c| {
                c.stat.ephemeral_owner == 0
                    && crate::zk::contender::Contender::parse(&c.name).is_some()
            })
            .collect();
        let persistent = !holds.is_empty();
        let removed = release_ended(ctx, namespace, &path, holds, ended).await?;
        node.children.retain(|c| !removed.contains(&c.name));

        let nodes = status::LockNodes::Queue(&node.children);
        let outcome = settle(lock, ctx, &path, nodes, spec_problem.as_deref()).await?;
        publish(lock, namespace, ctx, &outcome, persistent).await
    }

    async fn cleanup(&self, namespace: &str, ctx: &Context) -> Result<Action, Error> {
        let lock = self;
        let name = lock.name_any();
        let path = ctx.layout.lock(namespace, &name)?;
        let zk = &*ctx.zk;
        // Contenders go last-in-queue first: each waiter's own node is gone
        // before the node it watches, so when it wakes it finds itself removed
        // (exit 4) instead of finding itself first in line. The holder goes last.
        let names = match zk.client().list_children(&path).await {
            Ok(names) => names,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => {
                return Err(ZkError::Zk {
                    op: "list",
                    path: path.clone(),
                    source: e,
                }
                .into())
            }
        };
        // Each with what may be below it (a pod may put children under a
        // node of its own); what cannot go is said by delete_subtree below.
        for contender in crate::zk::contender::queue(&names).iter().rev() {
            tree::delete_tree(zk, &path::join(&path, &contender.name)).await?;
        }
        super::reconciler::delete_subtree(lock, ctx, &path).await?;
        ctx.metrics.lock_gone(namespace, &name);
        if let Some(uid) = lock.uid() {
            ctx.lock_status.forget(&uid);
        }
        info!(lock = %name, %path, "deleted the lock's znodes");
        Ok(Action::await_change())
    }
}

/// Whether a hold or lease of a pod with this fate is released: once the
/// pod has finished or is gone. A Terminating pod's command may still run
/// out its grace period, so its hold stays.
fn ended(fate: PodFate) -> bool {
    matches!(fate, PodFate::Finished | PodFate::Gone)
}

/// A Semaphore: keeps its layout (`locks`, `leases`, and `count` holding
/// `spec.permits` as a Curator SharedCount, which waiters watch: a change
/// takes effect for the next admission), releases the leases of pods that
/// ended, revokes holds past the lease duration, and writes the status.
async fn apply_semaphore(
    lock: &LockLease,
    namespace: &str,
    ctx: &Context,
    path: &str,
    acls: &[zk::Acl],
    spec_problem: Option<String>,
) -> Result<Action, Error> {
    let name = lock.name_any();
    let zk = &*ctx.zk;
    let dir = zk::CreateMode::Persistent.with_acls(acls.into());
    let write_err = |op: &'static str, at: &str| {
        let at = at.to_owned();
        move |e| ZkError::Zk {
            op,
            path: at,
            source: e,
        }
    };
    for child in [crate::zk::LOCKS, crate::zk::LEASES] {
        let at = path::join(path, child);
        match zk.client().create(&at, &[], &dir).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(write_err("create", &at)(e).into()),
        }
    }
    let count = path::join(path, crate::zk::COUNT);
    let permits = crate::zk::encode_count(lock.spec.permits());
    match zk.client().get_data(&count).await {
        Ok((data, stat)) if data != permits => {
            info!(lock = %name, permits = lock.spec.permits(), "setting the semaphore's permits");
            zk.client()
                .set_data(&count, &permits, Some(stat.version))
                .await
                .map_err(write_err("write", &count))?;
        }
        Ok(_) => {}
        Err(zk::Error::NoNode) => match zk.client().create(&count, &permits, &dir).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(write_err("create", &count)(e).into()),
        },
        Err(e) => return Err(write_err("read", &count)(e).into()),
    }

    let leases_path = path::join(path, crate::zk::LEASES);
    let mut leases = tree::snapshot(zk, &leases_path)
        .await?
        .map(|s| s.children)
        .unwrap_or_default();
    let locks = tree::snapshot(zk, &path::join(path, crate::zk::LOCKS))
        .await?
        .map(|s| s.children)
        .unwrap_or_default();

    // Leases taken by init containers outlive them: release those whose pod
    // has finished or is gone (a permit never leaks).
    let persistent_leases: Vec<_> = leases
        .iter()
        .filter(|c| c.stat.ephemeral_owner == 0)
        .collect();
    let persistent = !persistent_leases.is_empty();
    let removed = release_ended(ctx, namespace, &leases_path, persistent_leases, ended).await?;
    leases.retain(|c| !removed.contains(&c.name));

    let nodes = status::LockNodes::Semaphore {
        leases: &leases,
        locks: &locks,
    };
    let outcome = settle(lock, ctx, path, nodes, spec_problem.as_deref()).await?;
    publish(lock, namespace, ctx, &outcome, persistent).await
}

/// The lock's status with the holds past their lease revoked: computed in
/// one pass ([`status::lock_settled`]), then the revoked nodes deleted.
async fn settle(
    lock: &LockLease,
    ctx: &Context,
    path: &str,
    nodes: status::LockNodes<'_>,
    spec_problem: Option<&str>,
) -> Result<status::LockOutcome, Error> {
    let uid = lock.uid().ok_or(Error::Incomplete("uid"))?;
    let previous = ctx.lock_status.previous(&uid, lock.status.as_ref());
    let outcome = status::lock_settled(&status::LockObservation {
        spec: &lock.spec,
        nodes,
        previous: &previous,
        generation: lock.metadata.generation,
        znode: path,
        now: Timestamp::now(),
        spec_problem,
    });
    for revoked in &outcome.revoke {
        info!(lock = %lock.name_any(), node = %revoked, "revoking a hold past its lease duration");
        tree::delete_if_present(&ctx.zk, &path::join(path, revoked)).await?;
    }
    Ok(outcome)
}

/// Writes what a look found: the status (when it changed), the events, the
/// metrics; then when to look again (the next expiry, or the pod recheck
/// while persistent holds exist).
async fn publish(
    lock: &LockLease,
    namespace: &str,
    ctx: &Context,
    outcome: &status::LockOutcome,
    persistent: bool,
) -> Result<Action, Error> {
    super::reconciler::publish(lock, namespace, &outcome.status, &outcome.notes, ctx).await?;
    ctx.metrics
        .lock_seen(namespace, &lock.name_any(), &outcome.status);
    let recheck = persistent.then_some(POD_RECHECK);
    Ok(next_look(ctx, namespace, [outcome.requeue, recheck]).await)
}
