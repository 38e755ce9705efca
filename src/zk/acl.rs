//! Digest credentials and the ACLs zkgate gives its nodes.
//!
//! ZooKeeper's `digest` scheme identifies a session that added
//! `user:password` by the id `user:base64(sha1(user:password))`; an ACL
//! entry names that id and the permissions it grants. ACLs are not
//! inherited: every node carries its own, and reading or changing a node
//! checks only that node's ACL (creating or deleting a child checks the
//! parent's `CREATE` / `DELETE`).

use std::fmt;

use base64::Engine;
use sha1::{Digest, Sha1};
use zookeeper_client as zk;

use super::error::{Result, ZkError};
use super::session::Session;

/// A digest credential, `user:password`. Its `Debug` output hides the
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: String,
}

impl Credential {
    /// A credential for `user` with a fresh random password (244 random
    /// bits, hex).
    pub fn generate(user: impl Into<String>) -> Credential {
        Credential {
            user: user.into(),
            password: format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            ),
        }
    }

    /// Parses `user:password` (the password may contain `:`; surrounding
    /// whitespace, such as a file's trailing newline, is ignored).
    pub fn parse(text: &str) -> std::result::Result<Credential, String> {
        match text.trim().split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => Ok(Credential {
                user: user.to_owned(),
                password: password.to_owned(),
            }),
            _ => Err("expected user:password".into()),
        }
    }

    /// `user:password`, as the session presents it and a Secret stores it.
    pub fn expose(&self) -> String {
        format!("{}:{}", self.user, self.password)
    }

    /// The id ACL entries name: `user:base64(sha1(user:password))`.
    pub fn digest_id(&self) -> String {
        let hash = Sha1::digest(self.expose().as_bytes());
        format!(
            "{}:{}",
            self.user,
            base64::engine::general_purpose::STANDARD.encode(hash)
        )
    }

    /// An ACL entry granting `permission` to holders of this credential.
    pub fn acl(&self, permission: zk::Permission) -> zk::Acl {
        zk::Acl::new(permission, zk::AuthId::new("digest", &self.digest_id()))
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// The ACL anyone may do anything with: what nodes get without credentials.
pub fn open() -> Vec<zk::Acl> {
    zk::Acls::anyone_all().to_vec()
}

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

/// Whether two ACLs grant the same (order does not matter).
pub fn same(a: &[zk::Acl], b: &[zk::Acl]) -> bool {
    let key = |acl: &zk::Acl| {
        (
            acl.scheme().to_owned(),
            acl.id().to_owned(),
            format!("{}", acl.permission()),
        )
    };
    let mut a: Vec<_> = a.iter().map(key).collect();
    let mut b: Vec<_> = b.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_ids_match_zookeepers() {
        // From ZooKeeper's DigestAuthenticationProvider.generateDigest("super:test").
        let c = Credential::parse("super:test\n").unwrap();
        assert_eq!(c.digest_id(), "super:D/InIHSb7yEEbrWz8b9l71RjZJU=");
        assert!(!format!("{c:?}").contains("test"));
    }

    #[test]
    fn parsing_and_generation() {
        assert_eq!(Credential::parse("u:p:q").unwrap().password, "p:q");
        for bad in ["", "u", ":p", "u:", "  "] {
            assert!(Credential::parse(bad).is_err(), "{bad:?}");
        }
        let a = Credential::generate("ns");
        let b = Credential::generate("ns");
        assert_ne!(a.password, b.password);
        assert_eq!(a.password.len(), 64);
    }
}
