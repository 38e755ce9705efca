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

/// A node with its data and its children's data, read in two round trips
/// (the node and its child list, then every child at once).
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The node's data.
    pub data: Vec<u8>,
    /// The node's stat.
    pub stat: zk::Stat,
    /// Its children, sorted by name. A child deleted between the two reads
    /// is left out.
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
    let children = names
        .into_iter()
        .zip(results)
        .filter_map(|(name, result)| match result {
            zk::MultiReadResult::Data { data, stat } => Some(ChildNode { name, data, stat }),
            _ => None,
        })
        .collect();
    Ok(Some(Snapshot {
        data,
        stat,
        children,
    }))
}

/// Deletes `path` and everything below it. Children that appear meanwhile
/// (a participant registering as the resource is deleted) are deleted too.
pub async fn delete_tree(session: &Session, path: &str) -> Result<()> {
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
            }) => return Ok(()),
            Err(e) => return Err(e),
        };
        for child in children {
            Box::pin(delete_tree(session, &path::join(path, &child))).await?;
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
                return Ok(());
            }
            Err(ZkError::Zk {
                source: zk::Error::NotEmpty,
                ..
            }) => continue,
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
