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
