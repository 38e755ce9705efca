//! Changing the ACL of nodes that exist: made even (`ensure`) or moved
//! from one digest credential to another (a rotation). Apart from
//! [`super::acl`], which describes credentials and ACLs and which the
//! session needs, so that neither module needs the other.

use zookeeper_client as zk;

use super::acl::{same, Credential};
use super::error::{Result, ZkError};
use super::session::Session;

/// Sets `path`'s ACL to `wanted` unless it already is (in any order).
/// Returns whether it changed; `Ok(false)` when the node does not exist.
pub async fn ensure(session: &Session, path: &str, wanted: &[zk::Acl]) -> Result<bool> {
    update(session, path, |current| {
        (!same(current, wanted)).then(|| wanted.to_vec())
    })
    .await
}

/// Replaces the entries that name `old` in `path`'s ACL by entries with
/// the same permissions for `new` (a rotated credential). Returns whether
/// it changed; `Ok(false)` when the node does not exist.
pub async fn replace_digest(
    session: &Session,
    path: &str,
    old: &Credential,
    new: &Credential,
) -> Result<bool> {
    rewrite_digest(session, path, old, new, false).await
}

/// Gives `new` the permissions `old` has in `path`'s ACL, keeping `old`'s
/// (a rotation's grace window: both work). Returns whether it changed.
pub async fn share_digest(
    session: &Session,
    path: &str,
    old: &Credential,
    new: &Credential,
) -> Result<bool> {
    rewrite_digest(session, path, old, new, true).await
}

async fn rewrite_digest(
    session: &Session,
    path: &str,
    old: &Credential,
    new: &Credential,
    keep_old: bool,
) -> Result<bool> {
    let (old_id, new_id) = (old.digest_id(), new.digest_id());
    let names = |a: &zk::Acl, id: &str| a.scheme() == "digest" && a.id() == id;
    update(session, path, |current| {
        let has_old = current.iter().any(|a| names(a, &old_id));
        let has_new = current.iter().any(|a| names(a, &new_id));
        if !has_old || (keep_old && has_new) {
            return None;
        }
        let mut wanted = Vec::with_capacity(current.len() + 1);
        for a in current {
            if names(a, &old_id) {
                if keep_old {
                    wanted.push(a.clone());
                }
                // Shared during a grace window, `new` is there already.
                if !has_new {
                    wanted.push(new.acl(a.permission()));
                }
            } else {
                wanted.push(a.clone());
            }
        }
        Some(wanted)
    })
    .await
}

/// Reads `path`'s ACL and sets what `change` makes of it, if anything,
/// provided nobody changed the ACL in between (its version). Whether it
/// changed; a node that is not there (or went meanwhile) has nothing to
/// protect.
async fn update(
    session: &Session,
    path: &str,
    change: impl FnOnce(&[zk::Acl]) -> Option<Vec<zk::Acl>>,
) -> Result<bool> {
    let client = session.client();
    let absent = |e: &ZkError| {
        matches!(
            e,
            ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }
        )
    };
    let (current, stat) = match session
        .retry("read the ACL of", path, || client.get_acl(path))
        .await
    {
        Ok(found) => found,
        Err(e) if absent(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    let Some(wanted) = change(&current) else {
        return Ok(false);
    };
    match session
        .retry("set the ACL of", path, || {
            client.set_acl(path, &wanted, Some(stat.aversion))
        })
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if absent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}
