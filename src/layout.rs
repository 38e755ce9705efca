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

    fn namespace(&self, namespace: &str) -> Result<String, ZkError> {
        path::validate_name(namespace)?;
        Ok(format!("{}/namespaces/{namespace}", self.root))
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
    }
}
