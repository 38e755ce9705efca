//! What a reconcile can fail with.

use crate::zk::ZkError;

/// A reconcile's error; the controller retries with back-off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// ZooKeeper failed.
    #[error("ZooKeeper: {0}")]
    Zk(#[from] ZkError),
    /// The API server failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A status could not be turned into JSON and back (a bug).
    #[error("cannot encode the status: {0}")]
    Encode(#[from] serde_json::Error),
    /// Nodes in the way that the controller cannot remove: their maker gave
    /// them an ACL that shuts it out.
    #[error("ZooKeeper nodes the controller cannot remove are in the way: {} (whoever made them gave them an ACL that shuts the controller out; a ZooKeeper superuser must delete them)", .0.join(", "))]
    ShutOut(Vec<String>),
    /// The resource has no namespace or name.
    #[error("the resource has no {0}")]
    Incomplete(&'static str),
    /// This replica's leader node is gone: another may lead, and this one
    /// writes nothing more.
    #[error("no longer leading ({0} is gone): writing nothing")]
    NotLeading(String),
    /// Adding or removing the finalizer, or the wrapped reconcile, failed.
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}
