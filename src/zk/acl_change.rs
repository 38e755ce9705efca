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
    update(session, path, |current| {
        rewritten(current, old, new, keep_old)
    })
    .await
}

/// `current` with `new` granted what `old` has (and `old`'s entries gone
/// unless `keep_old`); `None` when `old` has nothing in it or nothing
/// changes.
fn rewritten(
    current: &[zk::Acl],
    old: &Credential,
    new: &Credential,
    keep_old: bool,
) -> Option<Vec<zk::Acl>> {
    let (old_id, new_id) = (old.digest_id(), new.digest_id());
    let names = |a: &zk::Acl, id: &str| a.scheme() == "digest" && a.id() == id;
    let granted = |id: &str| {
        current.iter().filter(|a| names(a, id)).fold(None, |p, a| {
            Some(p.unwrap_or(zk::Permission::NONE) | a.permission())
        })
    };
    let old_permission = granted(&old_id)?;
    // `new` may be there already with less: a node made during a grace
    // window grants the other credential READ only
    // ([`Session::grant_read`]). It gets what `old` has too, or a node of
    // `old`'s would be left with no one to administer it.
    let permission = granted(&new_id).map_or(old_permission, |p| p | old_permission);
    let mut wanted: Vec<zk::Acl> = current
        .iter()
        .filter(|a| !names(a, &new_id) && (keep_old || !names(a, &old_id)))
        .cloned()
        .collect();
    wanted.push(new.acl(permission));
    (!same(current, &wanted)).then_some(wanted)
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

#[cfg(test)]
mod tests {
    use super::*;
    use zk::Permission as P;

    #[test]
    fn a_rotation_gives_the_new_credential_what_the_old_one_had() {
        let (old, new) = (Credential::generate("ns"), Credential::generate("ns"));
        let controller = Credential::generate("controller");
        let with_old = vec![controller.acl(P::READ), old.acl(P::ALL)];
        // Shared, then replaced: both ALL in the window, new alone after.
        let shared = rewritten(&with_old, &old, &new, true).unwrap();
        assert!(same(
            &shared,
            &[controller.acl(P::READ), old.acl(P::ALL), new.acl(P::ALL)]
        ));
        assert_eq!(rewritten(&shared, &old, &new, true), None, "idempotent");
        let replaced = rewritten(&shared, &old, &new, false).unwrap();
        assert!(same(&replaced, &[controller.acl(P::READ), new.acl(P::ALL)]));
        assert_eq!(rewritten(&replaced, &old, &new, false), None);
        // Made by old during the window, granting new READ: new gets ALL.
        let made_in_window = vec![old.acl(P::ALL), new.acl(P::READ)];
        let shared = rewritten(&made_in_window, &old, &new, true).unwrap();
        assert!(same(&shared, &[old.acl(P::ALL), new.acl(P::ALL)]));
        let replaced = rewritten(&made_in_window, &old, &new, false).unwrap();
        assert!(same(&replaced, &[new.acl(P::ALL)]));
        // Made by new during the window, granting old READ: old goes.
        let by_new = vec![new.acl(P::ALL), old.acl(P::READ)];
        assert_eq!(rewritten(&by_new, &old, &new, true), None);
        assert!(same(
            &rewritten(&by_new, &old, &new, false).unwrap(),
            &[new.acl(P::ALL)]
        ));
        // Nothing of old's: nothing to move.
        assert_eq!(rewritten(&[new.acl(P::ALL)], &old, &new, false), None);
    }
}
