//! Where each resource lives in ZooKeeper:
//! `<root>/namespaces/<ns>/barriers/<name>` and
//! `<root>/namespaces/<ns>/locks/<name>`. The controller and the
//! participant commands both derive paths from here.

use crate::zk::{path, ZkError};

/// The default root, below any chroot of the connect string.
pub const DEFAULT_ROOT: &str = "/zkgate";

/// The paths of one namespace's resources under a root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    root: String,
}

impl Layout {
    /// A layout under `root` (an absolute path, `/` allowed).
    pub fn new(root: &str) -> Result<Layout, ZkError> {
        path::validate_path(root)?;
        Ok(Layout {
            root: root.trim_end_matches('/').to_owned(),
        })
    }

    /// The root path.
    pub fn root(&self) -> &str {
        if self.root.is_empty() {
            "/"
        } else {
            &self.root
        }
    }

    /// The node `name` directly under the root.
    pub fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.root)
    }

    /// The node of `namespace`'s subtree.
    pub fn namespace(&self, namespace: &str) -> Result<String, ZkError> {
        path::validate_name(namespace)?;
        Ok(format!("{}/namespaces/{namespace}", self.root))
    }

    /// The parents of `namespace`'s barrier and lock nodes, outermost
    /// first: the namespace node, `barriers`, `locks`.
    pub fn namespace_dirs(&self, namespace: &str) -> Result<[String; 3], ZkError> {
        let ns = self.namespace(namespace)?;
        Ok([ns.clone(), format!("{ns}/barriers"), format!("{ns}/locks")])
    }

    /// Where the controller keeps `namespace`'s ZooKeeper credential
    /// (readable by the controller alone).
    pub fn credential(&self, namespace: &str) -> Result<String, ZkError> {
        path::validate_name(namespace)?;
        Ok(format!("{}/credentials/{namespace}", self.root))
    }

    /// The barrier node of `namespace/name`.
    pub fn barrier(&self, namespace: &str, name: &str) -> Result<String, ZkError> {
        path::validate_name(name)?;
        Ok(format!("{}/barriers/{name}", self.namespace(namespace)?))
    }

    /// The lock node of `namespace/name`.
    pub fn lock(&self, namespace: &str, name: &str) -> Result<String, ZkError> {
        path::validate_name(name)?;
        Ok(format!("{}/locks/{name}", self.namespace(namespace)?))
    }
}

/// The kind of resource a znode belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceKind {
    /// A Barrier.
    Barrier,
    /// A LockLease.
    Lock,
}

impl Layout {
    /// The parent of every namespace's subtree.
    pub fn namespaces_root(&self) -> String {
        format!("{}/namespaces", self.root)
    }

    /// The resource a path at or below a barrier or lock node belongs to.
    pub fn resource_of(&self, path: &str) -> Option<(ResourceKind, String, String)> {
        let rest = path
            .strip_prefix(&self.namespaces_root())?
            .strip_prefix('/')?;
        let mut parts = rest.split('/');
        let namespace = parts.next()?;
        let kind = match parts.next()? {
            "barriers" => ResourceKind::Barrier,
            "locks" => ResourceKind::Lock,
            _ => return None,
        };
        let name = parts.next()?;
        Some((kind, namespace.to_owned(), name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let l = Layout::new("/zkgate").unwrap();
        assert_eq!(
            l.barrier("ns", "b").unwrap(),
            "/zkgate/namespaces/ns/barriers/b"
        );
        assert_eq!(l.lock("ns", "l").unwrap(), "/zkgate/namespaces/ns/locks/l");
        assert_eq!(
            Layout::new("/").unwrap().lock("a", "b").unwrap(),
            "/namespaces/a/locks/b"
        );
        assert!(l.barrier("ns", "a/b").is_err());
        assert!(Layout::new("relative").is_err());
        assert_eq!(
            l.resource_of("/zkgate/namespaces/ns/barriers/b/p0"),
            Some((ResourceKind::Barrier, "ns".into(), "b".into()))
        );
        assert_eq!(
            l.resource_of("/zkgate/namespaces/ns/locks/l"),
            Some((ResourceKind::Lock, "ns".into(), "l".into()))
        );
        assert_eq!(l.resource_of("/zkgate/namespaces/ns"), None);
        assert_eq!(l.resource_of("/zkgate/leader/x"), None);
    }
}
