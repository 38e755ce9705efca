//! Clean-up of a node a recipe created, on every way out: an error, a
//! deadline, or the caller dropping the future (cancellation), including
//! the moment between sending a create and reading its reply, when the node
//! may exist without the recipe knowing its name.

use tracing::{debug, warn};
use zookeeper_client as zk;

use super::path;
use super::session::{is_connection_loss, Session, SessionOptions};
use tokio_util::task::TaskTracker;

/// What the guard removes.
#[derive(Clone, Debug)]
enum Armed {
    /// A node we know we created; its czxid, when known, tells it from a
    /// node made later under the same name (a new pod's registration,
    /// once ours was removed), which is not ours to remove.
    Node { path: String, czxid: Option<i64> },
    /// A sequential create (or a multi of them) was sent under `parent`;
    /// its nodes, if any, are the children whose names start with `prefix`
    /// (a protected name: the prefix holds a uuid of ours).
    Protected { parent: String, prefix: String },
    /// A create of `path` was sent; the node there is ours only if this
    /// session owns it or, for a persistent node, it holds exactly `data`
    /// (someone else may hold the same name: that node is left alone).
    Pending { path: String, data: Vec<u8> },
}

/// Deletes its node unless disarmed. Awaited clean-up goes through
/// [`NodeGuard::delete_now`]; when the guard is dropped armed (the future
/// that owned it was cancelled) the delete is sent from a spawned task.
pub(crate) struct NodeGuard {
    client: zk::Client,
    /// To connect again when the session that made the node has ended
    /// and the node is persistent.
    options: SessionOptions,
    tracker: TaskTracker,
    armed: Option<Armed>,
}

impl NodeGuard {
    pub(crate) fn new(session: &Session) -> Self {
        NodeGuard {
            client: session.client().clone(),
            options: session.options().clone(),
            tracker: session.cleanups().clone(),
            armed: None,
        }
    }

    /// From now on the node at `path` is ours to remove on failure.
    pub(crate) fn arm(&mut self, path: String) {
        self.armed = Some(Armed::Node { path, czxid: None });
    }

    /// From now on the node at `path` made by the transaction `czxid` is
    /// ours to remove on failure; another node of that name is not.
    pub(crate) fn arm_created(&mut self, path: String, czxid: i64) {
        self.armed = Some(Armed::Node {
            path,
            czxid: Some(czxid),
        });
    }

    /// A sequential create under `parent` with the protected `prefix` is
    /// about to be sent: from now on its node, wherever it landed, is ours
    /// to remove.
    pub(crate) fn arm_protected(&mut self, parent: &str, prefix: &str) {
        self.armed = Some(Armed::Protected {
            parent: parent.to_owned(),
            prefix: prefix.to_owned(),
        });
    }

    /// A create of `path` with `data` is about to be sent: on failure, the
    /// node is removed if it turns out to be ours.
    pub(crate) fn arm_pending(&mut self, path: &str, data: &[u8]) {
        self.armed = Some(Armed::Pending {
            path: path.to_owned(),
            data: data.to_vec(),
        });
    }

    /// Whether a node is armed.
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// A pending create (armed by [`NodeGuard::arm_pending`]) is settled by
    /// asking the server: its node armed as ours when it is there and ours
    /// (this session's, or persistent with exactly our data), disarmed
    /// when it is not. Left pending when the server cannot be asked.
    pub(crate) async fn resolve_pending(&mut self, session: &Session) {
        let Some(Armed::Pending { path, data }) = &self.armed else {
            return;
        };
        let client = session.client();
        match session.retry("read", path, || client.get_data(path)).await {
            Ok((found, stat)) => {
                let ours = stat.ephemeral_owner == session.id()
                    || (stat.ephemeral_owner == 0 && found == *data);
                self.armed = ours.then(|| Armed::Node {
                    path: path.clone(),
                    czxid: Some(stat.czxid),
                });
            }
            Err(super::ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => self.armed = None,
            Err(_) => {}
        }
    }

    /// The node armed by [`NodeGuard::arm`] (or `arm_created`): known to
    /// be ours, and the czxid that tells it from a later node of that name
    /// when known.
    pub(crate) fn armed_node(&self) -> Option<(&str, Option<i64>)> {
        match &self.armed {
            Some(Armed::Node { path, czxid }) => Some((path, *czxid)),
            _ => None,
        }
    }

    /// Keeps the node: the recipe succeeded (or it is not ours after all).
    pub(crate) fn disarm(&mut self) {
        self.armed = None;
    }

    /// Deletes the node now, retrying over a connection loss. A session
    /// that has ended took its ephemeral nodes with it; nothing is left to do.
    pub(crate) async fn delete_now(&mut self, session: &Session) {
        if let Some(armed) = self.armed.take() {
            let client = self.client.clone();
            let mut state = client.state_watcher();
            clean_up(&client, &self.options, armed, session.id(), &mut state).await;
        }
    }
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        let Some(armed) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!(
                ?armed,
                "no runtime to remove our node from; it stays until the session ends"
            );
            return;
        };
        let client = self.client.clone();
        let options = self.options.clone();
        let session = client.session_id().0;
        // Tracked, so that closing the session waits for it.
        self.tracker.spawn_on(
            async move {
                let mut state = client.state_watcher();
                clean_up(&client, &options, armed, session, &mut state).await;
            },
            &runtime,
        );
    }
}

/// Removes what `armed` names, retrying after connection losses while the
/// session lives (bounded: a session that never reconnects expires and
/// takes ephemeral nodes with it). Once the session has ended, a new one
/// (made with `options`) removes what is persistent of it: an expiry
/// takes only ephemeral nodes, and a persistent one left behind would be
/// counted (a barrier registration) or hold a place (a lock).
async fn clean_up(
    client: &zk::Client,
    options: &SessionOptions,
    armed: Armed,
    session: i64,
    state: &mut zk::StateWatcher,
) {
    for _ in 0..10 {
        match remove(client, &armed, session, false).await {
            // Retried once the state moves on (disconnected, then connected).
            Err(e) if is_connection_loss(&e) => {
                if state.changed().await.is_terminated() {
                    return clean_up_persistent(options, &armed, session).await;
                }
            }
            Err(zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed) => {
                return clean_up_persistent(options, &armed, session).await;
            }
            Ok(Some(path)) => {
                debug!(%path, "removed our node");
                return;
            }
            Ok(None) => return,
            Err(e) => {
                warn!(?armed, error = %e, "could not remove our node");
                return;
            }
        }
    }
    warn!(?armed, "the connection kept dropping while our node was being removed; gave up after 10 attempts: it goes with the session (ephemeral) or is removed by the controller when its pod has ended (persistent)");
}

/// [`clean_up`] from a new session, of persistent nodes only: the ended
/// session's ephemeral nodes went with it, and a node there now with an
/// owner is someone else's.
async fn clean_up_persistent(options: &SessionOptions, armed: &Armed, session: i64) {
    let mut options = options.clone();
    options.connect_timeout = options.connect_timeout.min(options.session_timeout * 2);
    let fresh = match Session::connect(&options).await {
        Ok(fresh) => fresh,
        Err(e) => {
            warn!(?armed, error = %e, "our session ended and a new one could not be made to remove our persistent node; it stays until its owner's controller removes it");
            return;
        }
    };
    match remove(fresh.client(), armed, session, true).await {
        Ok(Some(path)) => debug!(%path, "removed our persistent node from a new session"),
        Ok(None) => {}
        Err(e) => {
            warn!(?armed, error = %e, "could not remove our persistent node from a new session")
        }
    }
    let _ = fresh.close().await;
}

/// One attempt; `Some(path)` when a node was deleted.
///
/// With `persistent_only` (from a new session, ours having ended), only a
/// node without an owner is removed: an ephemeral one there now is someone
/// else's.
async fn remove(
    client: &zk::Client,
    armed: &Armed,
    session: i64,
    persistent_only: bool,
) -> std::result::Result<Option<String>, zk::Error> {
    // A persistent node there, made by `czxid` when that is known: its
    // version to delete it by.
    let persistent = |path: String, czxid: Option<i64>| async move {
        match client.check_stat(&path).await? {
            Some(stat) if stat.ephemeral_owner == 0 && czxid.is_none_or(|c| c == stat.czxid) => {
                Ok(Some((path, Some(stat.version))))
            }
            _ => Ok::<_, zk::Error>(None),
        }
    };
    let (path, version) = match armed {
        Armed::Node { path, czxid } if persistent_only => {
            match persistent(path.clone(), *czxid).await? {
                Some(found) => found,
                None => return Ok(None),
            }
        }
        // Our session lives: an ephemeral node there is ours; a persistent
        // one is ours if it is the one we made.
        Armed::Node {
            path,
            czxid: Some(czxid),
        } => match client.check_stat(path).await? {
            Some(stat) if stat.ephemeral_owner == session || stat.czxid == *czxid => {
                (path.clone(), Some(stat.version))
            }
            _ => return Ok(None),
        },
        Armed::Node { path, czxid: None } => (path.clone(), None),
        Armed::Protected { parent, prefix } => {
            // As the leader has them: a lagging server may not show the
            // node of a create whose reply was lost.
            let sync = client.sync(parent);
            let listing = client.list_children(parent);
            let children = match sync.await.and(listing.await) {
                Err(zk::Error::NoNode) => return Ok(None),
                other => other?,
            };
            // A multi may have made several (a semaphore's permits).
            let mut removed = None;
            for name in children.iter().filter(|c| c.starts_with(prefix.as_str())) {
                let node = path::join(parent, name);
                let version = if persistent_only {
                    match persistent(node.clone(), None).await? {
                        Some((_, version)) => version,
                        None => continue,
                    }
                } else {
                    None
                };
                match client.delete(&node, version).await {
                    Ok(()) => {
                        removed.get_or_insert(node);
                    }
                    Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(removed);
        }
        Armed::Pending { path, data } => match client.get_data(path).await {
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(e),
            Ok((found, stat)) => {
                let ours = stat.ephemeral_owner == session
                    || (stat.ephemeral_owner == 0 && found == *data);
                if !ours {
                    return Ok(None);
                }
                (path.clone(), Some(stat.version))
            }
        },
    };
    match client.delete(&path, version).await {
        Ok(()) => Ok(Some(path)),
        Err(zk::Error::NoNode | zk::Error::BadVersion) => Ok(None),
        Err(e) => Err(e),
    }
}
