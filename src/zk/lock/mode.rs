//! Writing a lock node's data, and changing its mode only while nobody
//! holds or waits: the owner's half of the contract whose other half is a
//! contender's queueing (one transaction with a check of the data version
//! it read the mode at, see [`super::LockOptions::check`]).
//!
//! The change is made in two steps. The node first says `changingTo`
//! (contenders that read it wait until it goes); only then is the lock
//! looked at for good: whoever queued under the old mode did so before the
//! announcement, so this session sees its node now, and nobody can queue
//! under the old mode after it. If someone is there, the mode stays and the
//! announcement is withdrawn in the same write that settles the rest.

use zookeeper_client as zk;

use super::node::{LockMode, LockNodeData};
use crate::zk::contender::Contender;
use crate::zk::error::{Result, ZkError};
use crate::zk::{path, tree, Session};

/// A lock node as its owner read it.
#[derive(Clone, Copy, Debug)]
pub struct LockNodeRead<'a> {
    /// The node's data (a [`LockNodeData`], or anything: unreadable data
    /// counts as the default, an `Exclusive` lock).
    pub data: &'a [u8],
    /// The data's version.
    pub version: i32,
    /// The names of the node's children.
    pub children: &'a [String],
}

/// What [`settle`] left in the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The data the node says now (never a change under way).
    pub data: LockNodeData,
    /// Its version.
    pub version: i32,
    /// The mode asked for, when it could not be taken because the lock is
    /// in use (`data.mode` is the one kept).
    pub waiting_for: Option<LockMode>,
}

/// Makes the lock node at `path` say `wanted`: the lease and the owner at
/// once, the mode only once nobody holds or waits under the old one (see
/// the module's comment). A semaphore's own nodes (its leases, its
/// internal lock and its count) go with a change away from `Semaphore`.
///
/// Errors: a write that finds the data changed since `read` (someone else
/// wrote the node) fails with the client's `BadVersion` in [`ZkError::Zk`]:
/// read the node again. [`ZkError::LeftBehind`] when a semaphore's nodes
/// cannot be deleted (an ACL shuts this session out).
pub async fn settle(
    session: &Session,
    path: &str,
    read: LockNodeRead<'_>,
    wanted: &LockNodeData,
) -> Result<Settled> {
    let current: LockNodeData = serde_json::from_slice(read.data).unwrap_or_default();
    let mut data = read.data.to_vec();
    let mut version = read.version;
    let mut target = LockNodeData {
        mode: current.mode,
        changing_to: None,
        ..wanted.clone()
    };
    let mut waiting_for = None;
    if current.mode != wanted.mode {
        let mut in_use = in_use(session, path, read.children, current.mode).await?;
        if !in_use {
            let announced = LockNodeData {
                changing_to: Some(wanted.mode),
                ..target.clone()
            };
            version = write(session, path, &data, &announced, version).await?;
            data = serde_json::to_vec(&announced).unwrap_or_default();
            let names = session
                .client()
                .list_children(path)
                .await
                .map_err(|e| ZkError::Zk {
                    op: "list",
                    path: path.to_owned(),
                    source: e,
                })?;
            in_use = self::in_use(session, path, &names, current.mode).await?;
        }
        if in_use {
            waiting_for = Some(wanted.mode);
        } else {
            if current.mode == LockMode::Semaphore {
                // A semaphore's own nodes mean nothing to a lock.
                for dir in [crate::zk::LEASES, crate::zk::LOCKS, crate::zk::COUNT] {
                    let at = path::join(path, dir);
                    let left = tree::delete_tree(session, &at).await?;
                    if !left.is_empty() {
                        return Err(ZkError::LeftBehind { path: at, left });
                    }
                }
            }
            target.mode = wanted.mode;
        }
    }
    // A change of mode left announced by a pass that did not finish (or
    // by this one, the lock in use) is withdrawn here.
    let version = write(session, path, &data, &target, version).await?;
    Ok(Settled {
        data: target,
        version,
        waiting_for,
    })
}

/// Whether anyone holds or waits at the lock at `path` (children `names`)
/// under `mode`.
pub async fn in_use(
    session: &Session,
    path: &str,
    names: &[String],
    mode: LockMode,
) -> Result<bool> {
    if names.iter().any(|n| Contender::parse(n).is_some()) {
        return Ok(true);
    }
    if mode != LockMode::Semaphore {
        return Ok(false);
    }
    // `locks` before `leases`: a contender takes its permit by moving from
    // the one to the other in one transaction (which checks only the
    // count), so listed in this order it is seen in one or the other; the
    // other way round, a move between the two lists is seen in neither.
    for dir in [crate::zk::LOCKS, crate::zk::LEASES].map(|d| path::join(path, d)) {
        match session.client().list_children(&dir).await {
            Ok(names) if !names.is_empty() => return Ok(true),
            Ok(_) | Err(zk::Error::NoNode) => {}
            Err(e) => {
                return Err(ZkError::Zk {
                    op: "list",
                    path: dir,
                    source: e,
                })
            }
        }
    }
    Ok(false)
}

/// Writes `wanted` into the node at `path` unless `data` (read at
/// `version`) already says it; the data's version after.
async fn write(
    session: &Session,
    path: &str,
    data: &[u8],
    wanted: &LockNodeData,
    version: i32,
) -> Result<i32> {
    if serde_json::from_slice::<LockNodeData>(data).ok().as_ref() == Some(wanted) {
        return Ok(version);
    }
    let bytes = serde_json::to_vec(wanted).map_err(|e| ZkError::InvalidData {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let stat = session
        .client()
        .set_data(path, &bytes, Some(version))
        .await
        .map_err(|e| ZkError::Zk {
            op: "write",
            path: path.to_owned(),
            source: e,
        })?;
    Ok(stat.version)
}
