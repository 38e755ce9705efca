//! Removing the nodes of pods that ended: barrier registrations, lock holds
//! and semaphore leases that outlive the init containers that made them.
//!
//! A removal acts on what a look (a [`ChildNode`] of a snapshot) saw, and
//! only on that: a node rewritten or made again under the same name since
//! the look (a new pod registering the same id) survives. For a barrier
//! registration the removal also moves the barrier node's version in the
//! same transaction, so that a participant's opening decided on a count
//! that included the removed node fails its version check and counts again
//! (see `DoubleBarrier::enter`: it opens with a check of the version it
//! read in the round that counted).

use tracing::{debug, info};
use zookeeper_client as zk;

use crate::zk::tree::ChildNode;
use crate::zk::{path, Session, ZkError, CONTENDED_ATTEMPTS, READY};

/// What became of a removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The node the look saw was removed by this call.
    Removed,
    /// Not removed: the node is gone, or it is not the one the look saw
    /// (made again under the same name, or rewritten, since).
    Changed,
    /// Not removed: the barrier has opened (when asked to remove only
    /// before the opening).
    Opened,
    /// Not removed: the parent (the barrier node) is gone.
    ParentGone,
}

/// Whether `seen` is still the node the look saw: the same creation (czxid)
/// and the same version. Read just before the removal: ZooKeeper has no
/// delete conditional on the creation, so a delete by version alone would
/// take a node made again since the look (its version is 0 again). What is
/// left is the one round trip between this read and the delete that follows.
async fn still_as_seen(
    session: &Session,
    node_path: &str,
    seen: &ChildNode,
) -> Result<bool, ZkError> {
    let client = session.client();
    match session
        .retry("read", node_path, || client.check_stat(node_path))
        .await?
    {
        Some(stat) => {
            let same = stat.czxid == seen.stat.czxid && stat.version == seen.stat.version;
            if !same {
                info!(node = %node_path, "not removing: the node was made again or rewritten since it was looked at");
            }
            Ok(same)
        }
        None => Ok(false),
    }
}

/// Removes `seen` (a child of `parent`, as a look saw it) if it is still
/// that node: same creation, same version (a delete by that version).
/// For holds and leases, whose removal changes no count a participant
/// decides on.
pub async fn remove_seen(
    session: &Session,
    parent: &str,
    seen: &ChildNode,
) -> Result<Removal, ZkError> {
    let node_path = path::join(parent, &seen.name);
    if !still_as_seen(session, &node_path, seen).await? {
        return Ok(Removal::Changed);
    }
    let client = session.client();
    match session
        .retry("delete", &node_path, || {
            client.delete(&node_path, Some(seen.stat.version))
        })
        .await
    {
        Ok(()) => Ok(Removal::Removed),
        Err(ZkError::Zk {
            source: zk::Error::NoNode | zk::Error::BadVersion,
            ..
        }) => Ok(Removal::Changed),
        Err(e) => Err(e),
    }
}

/// Removes the registration `seen` of the barrier at `barrier` if it is
/// still the node the look saw, in one transaction that also rewrites the
/// barrier node's data unchanged (its version moves: an opening counted
/// with the removed registration fails its version check and counts
/// again) and, with `unless_open`, asserts that the barrier has not opened
/// (it makes and deletes `ready`, which fails if `ready` exists).
///
/// Guarantees: the barrier's data is never changed (it is written back
/// exactly as read, conditioned on the version read); a registration made
/// again or rewritten since the look is not removed; with `unless_open`,
/// nothing is removed from an open barrier.
pub async fn remove_registration(
    session: &Session,
    barrier: &str,
    seen: &ChildNode,
    unless_open: bool,
) -> Result<Removal, ZkError> {
    let client = session.client();
    let node_path = path::join(barrier, &seen.name);
    let ready = path::join(barrier, READY);
    let ready_options = zk::CreateMode::Persistent.with_acls(session.node_acls());
    // Bounded: the namespace's pods may rewrite the barrier node, and one
    // that does so without pause must not hold this reconcile forever.
    let mut lost = 0;
    loop {
        if lost == CONTENDED_ATTEMPTS {
            return Err(ZkError::Contended {
                op: "remove a registration from",
                path: barrier.to_owned(),
                attempts: lost,
            });
        }
        let (data, stat) = match session
            .retry("read", barrier, || client.get_data(barrier))
            .await
        {
            Ok(found) => found,
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => return Ok(Removal::ParentGone),
            Err(e) => return Err(e),
        };
        if !still_as_seen(session, &node_path, seen).await? {
            return Ok(Removal::Changed);
        }
        let mut writer = client.new_multi_writer();
        // The data write first, as in `DoubleBarrier`'s own transactions: a
        // waiter takes a `ready` notified with no barrier change before it
        // for an opening, so the transient `ready` must follow the write.
        let built = writer
            .add_set_data(barrier, &data, Some(stat.version))
            .and_then(|()| {
                if unless_open {
                    writer.add_create(&ready, &[], &ready_options)?;
                    writer.add_delete(&ready, None)?;
                }
                writer.add_delete(&node_path, Some(seen.stat.version))
            });
        built.map_err(|e| ZkError::from_client("remove", &node_path, e))?;
        let delete_at = if unless_open { 3 } else { 1 };
        match writer.commit().await {
            Ok(_) => {
                debug!(node = %node_path, "removed the registration and moved the barrier's version");
                return Ok(Removal::Removed);
            }
            Err(zk::MultiWriteError::OperationFailed { index: 0, source }) => match source {
                // The barrier changed since we read it: read it again.
                zk::Error::BadVersion => {
                    lost += 1;
                    continue;
                }
                zk::Error::NoNode => return Ok(Removal::ParentGone),
                e => return Err(ZkError::from_client("remove", &node_path, e)),
            },
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NodeExists,
            }) if unless_open => return Ok(Removal::Opened),
            Err(zk::MultiWriteError::OperationFailed {
                index,
                source: zk::Error::NoNode | zk::Error::BadVersion,
            }) if index == delete_at => return Ok(Removal::Changed),
            // A lost connection among them: applied or not, the reconcile
            // fails and the next look (a new snapshot) settles it.
            Err(e) => return Err(ZkError::from_client("remove", &node_path, e.into())),
        }
    }
}
