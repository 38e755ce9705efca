//! Clean-up of a node a recipe created, on every way out: an error, a
//! deadline, or the caller dropping the future (cancellation).

use tracing::{debug, warn};
use zookeeper_client as zk;

use super::session::{is_connection_loss, Session};

/// Deletes its node unless disarmed. Awaited clean-up goes through
/// [`NodeGuard::delete_now`]; when the guard is dropped armed (the future
/// that owned it was cancelled) the delete is sent from a spawned task.
pub(crate) struct NodeGuard {
    client: zk::Client,
    path: Option<String>,
}

impl NodeGuard {
    pub(crate) fn new(session: &Session) -> Self {
        NodeGuard {
            client: session.client().clone(),
            path: None,
        }
    }

    /// From now on the node at `path` is ours to remove on failure.
    pub(crate) fn arm(&mut self, path: String) {
        self.path = Some(path);
    }

    /// Whether a node is armed.
    pub(crate) fn is_armed(&self) -> bool {
        self.path.is_some()
    }

    /// Keeps the node: the recipe succeeded.
    pub(crate) fn disarm(&mut self) -> Option<String> {
        self.path.take()
    }

    /// Deletes the node now, retrying over a connection loss. A session
    /// that has ended took its ephemeral nodes with it; nothing is left to do.
    pub(crate) async fn delete_now(&mut self, session: &Session) {
        if let Some(path) = self.path.take() {
            match session
                .retry("delete", &path, || self.client.delete(&path, None))
                .await
            {
                Ok(()) => debug!(%path, "removed our node"),
                Err(e) => match e {
                    super::ZkError::Zk {
                        source: zk::Error::NoNode,
                        ..
                    } => {}
                    e => warn!(%path, error = %e, "could not remove our node"),
                },
            }
        }
    }
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        let Some(path) = self.path.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!(%path, "no runtime to remove our node from; it stays until the session ends");
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            let mut state = client.state_watcher();
            // Bounded: a session that never reconnects expires and takes
            // ephemeral nodes with it.
            for _ in 0..10 {
                match client.delete(&path, None).await {
                    Err(e) if is_connection_loss(&e) => {
                        if state.changed().await.is_terminated() {
                            return;
                        }
                    }
                    Ok(()) | Err(zk::Error::NoNode) => {
                        debug!(%path, "removed our node after cancellation");
                        return;
                    }
                    Err(e) => {
                        warn!(%path, error = %e, "could not remove our node after cancellation");
                        return;
                    }
                }
            }
        });
    }
}
