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

/// What the controller publishes in a namespace's node (readable by the
/// namespace's credentials alone): the digest ids of the credentials that
/// work in the namespace now (the current one, and during a rotation's
/// grace window the one it replaced). A participant gives each of them
/// READ on the nodes it makes (see [`super::Session::grant_read`]): from
/// ZooKeeper 3.9 on, `exists` and its watch need READ on a node that is
/// there, and participants on the two credentials of a grace window watch
/// each other's registrations, `ready` and contenders. ZooKeeper hides the
/// digests of an ACL from whoever lacks ADMIN on the node, so participants
/// cannot learn them from the barrier node's ACL. The controller's own id
/// is not published: it reads with the namespace's credentials, and its
/// digest would let a tenant guess at a weak controller password offline.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Readers {
    /// Digest ids (`user:base64(sha1(user:password))`).
    pub readers: Vec<String>,
}

impl Readers {
    /// The readers of `credentials`.
    pub fn of<'c>(credentials: impl IntoIterator<Item = &'c Credential>) -> Readers {
        Readers {
            readers: credentials.into_iter().map(Credential::digest_id).collect(),
        }
    }

    /// Parses a namespace node's data: anything else (empty, written by an
    /// older controller, junk) names no reader.
    pub fn parse(data: &[u8]) -> Readers {
        serde_json::from_slice(data).unwrap_or_default()
    }

    /// Serializes it.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings always serializes.
        serde_json::to_vec(self).unwrap_or_default()
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
    fn readers_round_trip_and_junk_names_none() {
        let (a, b) = (Credential::generate("ns"), Credential::generate("ns"));
        let readers = Readers::of([&a, &b]);
        assert_eq!(readers.readers, vec![a.digest_id(), b.digest_id()]);
        assert_eq!(Readers::parse(&readers.to_bytes()), readers);
        for junk in [&b""[..], b"junk", b"{\"readers\":1}"] {
            assert!(Readers::parse(junk).readers.is_empty(), "{junk:?}");
        }
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
