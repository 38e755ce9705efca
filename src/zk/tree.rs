//! Reading and removing whole subtrees: what an owner of barrier and lock
//! nodes (the controller) needs.

use tracing::debug;
use zookeeper_client as zk;

use super::error::{Result, ZkError};
use super::path;
use super::session::Session;

/// One child of a node, with its data and stat.
#[derive(Clone, Debug)]
pub struct ChildNode {
    /// Its name.
    pub name: String,
    /// Its data.
    pub data: Vec<u8>,
    /// Its stat (czxid, ctime, ephemeral owner, ...).
    pub stat: zk::Stat,
}

/// The most of one child's data a [`snapshot`] keeps (it reads no more,
/// unless the child grew since its stat was read). Registrations and
/// contenders carry a few hundred bytes; a child past this (a namespace's
/// pods may write what they like under their own nodes, up to ZooKeeper's
/// 1 MB) is listed with its stat and no data, so that nobody can make the
/// reader (the controller, for every namespace) hold their bulk.
pub const MAX_CHILD_DATA: usize = 64 * 1024;

/// Children's data read per multi-read: at most this many children, and
/// at most [`BATCH_BYTES`] by their stats. A child may grow between its
/// stat and its read (it is then dropped after the read): the count bounds
/// what one read can bring (16 nodes of ZooKeeper's 1 MB at most).
const BATCH_CHILDREN: usize = 16;
const BATCH_BYTES: usize = 1024 * 1024;

/// A node with its data and its children's data: the node and its child
/// list, then the children's stats, then their data in multi-reads of a
/// bounded size (one per 16 children).
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The node's data.
    pub data: Vec<u8>,
    /// The node's stat.
    pub stat: zk::Stat,
    /// Its children, sorted by name. A child deleted between the reads, or
    /// one this session may not read, is left out; one with more than [`MAX_CHILD_DATA`] bytes has empty
    /// `data` (its `stat.data_length` says how much it holds).
    pub children: Vec<ChildNode>,
}

/// Reads `path` and its children; `None` when `path` does not exist.
pub async fn snapshot(session: &Session, path: &str) -> Result<Option<Snapshot>> {
    let client = session.client();
    let head = session
        .retry("read", path, || {
            let data = client.get_data(path);
            let children = client.list_children(path);
            async move { Ok((data.await?, children.await?)) }
        })
        .await;
    let ((data, stat), mut names) = match head {
        Ok(head) => head,
        Err(ZkError::Zk {
            source: zk::Error::NoNode,
            ..
        }) => return Ok(None),
        Err(e) => return Err(e),
    };
    names.sort();
    // Requests go out in call order: every stat is asked for before the
    // first answer is awaited (one round trip).
    let stats = session
        .retry("read", path, || {
            let asked: Vec<_> = names
                .iter()
                .map(|name| client.check_stat(&path::join(path, name)))
                .collect();
            async move {
                let mut stats = Vec::with_capacity(asked.len());
                for stat in asked {
                    stats.push(match stat.await {
                        // A child whose maker shut us out: from ZooKeeper
                        // 3.9 on even its stat is refused (3.8 gives it, and
                        // refuses its data below). Left out like a child
                        // deleted meanwhile; whoever removes the subtree
                        // finds it in the way and says so (`delete_tree`).
                        Err(zk::Error::NoAuth) => None,
                        found => found?,
                    });
                }
                Ok(stats)
            }
        })
        .await?;
    let mut children = Vec::with_capacity(names.len());
    let mut batch: Vec<String> = Vec::new();
    let mut batch_bytes = 0;
    for (name, stat) in names.into_iter().zip(stats) {
        let Some(stat) = stat else { continue };
        let len = usize::try_from(stat.data_length).unwrap_or(0);
        if len > MAX_CHILD_DATA {
            debug!(%path, child = %name, bytes = len, "a child too large to read: listed without its data");
            children.push(ChildNode {
                name,
                data: Vec::new(),
                stat,
            });
            continue;
        }
        if batch.len() == BATCH_CHILDREN || batch_bytes + len > BATCH_BYTES {
            read_batch(session, path, std::mem::take(&mut batch), &mut children).await?;
            batch_bytes = 0;
        }
        batch.push(name);
        batch_bytes += len;
    }
    read_batch(session, path, batch, &mut children).await?;
    children.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(Snapshot {
        data,
        stat,
        children,
    }))
}

/// Reads the data of `path`'s children `names` in one multi-read into
/// `children` (a child deleted meanwhile is left out; one grown past
/// [`MAX_CHILD_DATA`] since its stat was read keeps no data).
async fn read_batch(
    session: &Session,
    path: &str,
    names: Vec<String>,
    children: &mut Vec<ChildNode>,
) -> Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let client = session.client();
    let results = session
        .retry("read", path, || {
            let mut reader = client.new_multi_reader();
            for name in &names {
                // Names come from the server below a valid path.
                let _ = reader.add_get_data(&path::join(path, name));
            }
            reader.commit()
        })
        .await?;
    children.extend(
        names
            .into_iter()
            .zip(results)
            .filter_map(|(name, result)| match result {
                zk::MultiReadResult::Data { mut data, stat } => {
                    if data.len() > MAX_CHILD_DATA {
                        data = Vec::new();
                    }
                    Some(ChildNode { name, data, stat })
                }
                _ => None,
            }),
    );
    Ok(())
}

/// Deletes `path` and everything below it. Children that appear meanwhile
/// (a participant registering as the resource is deleted) are deleted too.
///
/// Returns the nodes it had to leave, with what is below them: whoever
/// makes a node chooses its ACL, so a participant may make one that shuts
/// the session out (it cannot list its children, nor delete it while it
/// has any). Only a ZooKeeper superuser can remove those; the caller says
/// so rather than retrying for ever.
pub async fn delete_tree(session: &Session, path: &str) -> Result<Vec<String>> {
    let client = session.client();
    for _ in 0..20 {
        let children = match session
            .retry("list", path, || client.list_children(path))
            .await
        {
            Ok(children) => children,
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => return Ok(Vec::new()),
            // Unreadable: gone if it has no children (deleting needs only
            // the parent's permission), else left.
            Err(ZkError::NotAuthorized { .. }) => {
                return match session
                    .retry("delete", path, || client.delete(path, None))
                    .await
                {
                    Ok(())
                    | Err(ZkError::Zk {
                        source: zk::Error::NoNode,
                        ..
                    }) => Ok(Vec::new()),
                    Err(ZkError::Zk {
                        source: zk::Error::NotEmpty,
                        ..
                    })
                    | Err(ZkError::NotAuthorized { .. }) => Ok(vec![path.to_owned()]),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let mut left = Vec::new();
        for child in children {
            left.extend(Box::pin(delete_tree(session, &path::join(path, &child))).await?);
        }
        if !left.is_empty() {
            return Ok(left);
        }
        match session
            .retry("delete", path, || client.delete(path, None))
            .await
        {
            Ok(())
            | Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => {
                debug!(%path, "deleted");
                return Ok(Vec::new());
            }
            Err(ZkError::Zk {
                source: zk::Error::NotEmpty,
                ..
            }) => continue,
            Err(ZkError::NotAuthorized { .. }) => return Ok(vec![path.to_owned()]),
            Err(e) => return Err(e),
        }
    }
    Err(ZkError::Zk {
        op: "delete",
        path: path.to_owned(),
        source: zk::Error::NotEmpty,
    })
}

/// Deletes one node if it is there; `true` when this call deleted it.
pub async fn delete_if_present(session: &Session, path: &str) -> Result<bool> {
    let client = session.client();
    match session
        .retry("delete", path, || client.delete(path, None))
        .await
    {
        Ok(()) => Ok(true),
        Err(ZkError::Zk {
            source: zk::Error::NoNode,
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A stat for unit tests of code that reads snapshots.
#[cfg(test)]
pub(crate) fn test_stat(ctime: i64, czxid: i64, ephemeral_owner: i64) -> zk::Stat {
    zk::Stat {
        czxid,
        mzxid: czxid,
        pzxid: czxid,
        ctime,
        mtime: ctime,
        version: 0,
        cversion: 0,
        aversion: 0,
        ephemeral_owner,
        data_length: 0,
        num_children: 0,
    }
}
