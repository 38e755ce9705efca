//! A held lock: its fencing token, how to learn it was lost, how to
//! release it or keep it past this process.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};
use zookeeper_client as zk;

use super::contender::ContenderKind;
use super::error::{Result, ZkError};
use super::session::{is_connection_loss, Session, SessionState, StateWatcher};

/// A held lock (exclusive, read or write).
///
/// Dropping it releases the lock from a spawned task; [`LockHold::release`]
/// releases it and waits for the server; [`LockHold::into_registration`]
/// keeps a persistent hold past this process.
#[derive(Debug)]
pub struct LockHold<'s> {
    session: &'s Session,
    path: String,
    kind: ContenderKind,
    token: i64,
    persistent: bool,
    done: bool,
}

impl<'s> LockHold<'s> {
    pub(crate) fn new(
        session: &'s Session,
        path: String,
        kind: ContenderKind,
        token: i64,
        persistent: bool,
    ) -> Self {
        LockHold {
            session,
            path,
            kind,
            token,
            persistent,
            done: false,
        }
    }

    /// The fencing token: the czxid of our node. ZooKeeper's zxids only
    /// grow, so each later hold of the lock has a larger token, even after the
    /// lock node was deleted and made again (when sequence numbers restart).
    pub fn fencing_token(&self) -> i64 {
        self.token
    }

    /// The path of our node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is held.
    pub fn kind(&self) -> ContenderKind {
        self.kind
    }

    /// Whether the node outlives this session.
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// Follows the hold's state: [`HoldState::Suspended`] at once when the
    /// connection drops, [`HoldState::Lost`] when our node is deleted by
    /// someone else (revoked) or the session has (or may have) expired.
    pub fn monitor(&self) -> HoldMonitor<'s> {
        HoldMonitor::new(self.session, self.path.clone(), !self.persistent)
    }

    /// Resolves when the hold is lost, with the reason.
    pub async fn lost(&self) -> LossReason {
        self.monitor().lost().await
    }

    /// Releases the lock and waits for the server. Fails with
    /// [`ZkError::NodeRemoved`] if the hold had already been revoked.
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        release_node(self.session, &self.path).await
    }

    /// Keeps the node (a persistent hold) past this process and returns
    /// what a later process needs to release it.
    pub fn into_registration(mut self) -> Registration {
        self.done = true;
        Registration {
            path: std::mem::take(&mut self.path),
            fencing_token: self.token,
        }
    }
}

impl Drop for LockHold<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut guard = super::guard::NodeGuard::new(self.session);
            guard.arm(std::mem::take(&mut self.path));
            // Dropping the armed guard sends the delete from a task.
        }
    }
}

/// A persistent hold or barrier registration that outlived the process
/// that made it: the node's path is its identity.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Registration {
    /// The node.
    pub path: String,
    /// Its fencing token (czxid).
    pub fencing_token: i64,
}

impl Registration {
    /// Releases it from any session (a later process, the controller).
    pub async fn release(&self, session: &Session) -> Result<()> {
        release_node(session, &self.path).await
    }
}

/// Deletes a holder's node; `NodeRemoved` when it was already gone.
pub(crate) async fn release_node(session: &Session, path: &str) -> Result<()> {
    let client = session.client();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client.delete(path, None).await {
            Ok(()) => {
                debug!(%path, "released");
                return Ok(());
            }
            // A retried delete that finds nothing deleted it the first time.
            Err(zk::Error::NoNode) if attempts > 1 => return Ok(()),
            Err(zk::Error::NoNode) => {
                return Err(ZkError::NodeRemoved {
                    path: path.to_owned(),
                })
            }
            Err(e) if is_connection_loss(&e) => session.await_connected().await?,
            Err(e) => return Err(ZkError::from_client("delete", path, e)),
        }
    }
}

/// Where a hold stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldState {
    /// Connected, and our node is there.
    Held,
    /// Disconnected: the hold may be lost. Work that must not overlap
    /// another holder should pause until [`HoldState::Held`] again.
    Suspended,
    /// Lost for good.
    Lost(LossReason),
}

/// Why a hold was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// Our node was deleted by someone else (for example the controller,
    /// past the lease duration).
    Revoked,
    /// The session expired; its ephemeral nodes are gone.
    SessionExpired,
    /// The session was closed.
    SessionClosed,
    /// Disconnected for so long that the server may have expired the session
    /// already: it must be assumed lost.
    PresumedExpired,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::Revoked => "its node was deleted by someone else (revoked)",
            LossReason::SessionExpired => "the ZooKeeper session expired",
            LossReason::SessionClosed => "the ZooKeeper session was closed",
            LossReason::PresumedExpired => {
                "disconnected from ZooKeeper long enough that the session may have expired"
            }
        })
    }
}

type NodeEvent = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// Follows one hold. See [`LockHold::monitor`].
pub struct HoldMonitor<'s> {
    session: &'s Session,
    path: String,
    ephemeral: bool,
    states: StateWatcher,
    node_event: Option<NodeEvent>,
    state: HoldState,
    suspended_since: Option<Instant>,
}

impl std::fmt::Debug for HoldMonitor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldMonitor")
            .field("path", &self.path)
            .field("state", &self.state)
            .finish()
    }
}

impl<'s> HoldMonitor<'s> {
    /// Follows any node this session relies on: a hold, or a barrier
    /// registration. `ephemeral` says whether the node dies with the session.
    pub fn new(session: &'s Session, path: String, ephemeral: bool) -> Self {
        let states = session.watch_state();
        let state = if states.current() == SessionState::Connected {
            HoldState::Held
        } else {
            HoldState::Suspended
        };
        let suspended_since = (state == HoldState::Suspended).then(Instant::now);
        HoldMonitor {
            session,
            path,
            ephemeral,
            states,
            node_event: None,
            state,
            suspended_since,
        }
    }

    /// The state as last seen.
    pub fn state(&self) -> HoldState {
        self.state
    }

    /// How long a disconnected ephemeral hold is trusted: the client notices
    /// a silent connection 2/5 of the session timeout after the server last
    /// heard from it, so half the timeout after that still ends before the
    /// server can expire the session.
    fn trust_while_disconnected(&self) -> Duration {
        self.session.timeout() / 2
    }

    fn set(&mut self, state: HoldState) -> HoldState {
        if state != self.state {
            match state {
                HoldState::Lost(reason) => warn!(path = %self.path, %reason, "hold lost"),
                HoldState::Suspended => {
                    warn!(path = %self.path, "disconnected from ZooKeeper: the hold may be lost")
                }
                HoldState::Held => debug!(path = %self.path, "reconnected: hold confirmed"),
            }
        }
        self.state = state;
        state
    }

    fn lost_for(&self, state: SessionState) -> Option<LossReason> {
        match state {
            SessionState::Expired | SessionState::AuthFailed if self.ephemeral => {
                Some(LossReason::SessionExpired)
            }
            SessionState::Closed => Some(LossReason::SessionClosed),
            _ => None,
        }
    }

    /// Checks our node and watches it; `Some` when the check settled the state.
    async fn arm(&mut self) -> Option<HoldState> {
        match self.session.client().check_and_watch_stat(&self.path).await {
            Ok((None, _)) => Some(self.set(HoldState::Lost(LossReason::Revoked))),
            Ok((Some(_), watcher)) => {
                self.node_event = Some(Box::pin(watcher.changed()));
                None
            }
            // The state watcher reports the disconnection.
            Err(e) if is_connection_loss(&e) => None,
            Err(e) => {
                let state = SessionState::from_client(self.session.client().state());
                match self.lost_for(state) {
                    Some(reason) => Some(self.set(HoldState::Lost(reason))),
                    None => {
                        warn!(path = %self.path, error = %e, "could not watch the hold; retrying");
                        // Not a connection problem (say, an ACL): do not spin.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        None
                    }
                }
            }
        }
    }

    /// Waits until the state changes and returns the new one. Once lost,
    /// returns [`HoldState::Lost`] at once.
    pub async fn next(&mut self) -> HoldState {
        let entered = self.state;
        loop {
            if let HoldState::Lost(_) = self.state {
                return self.state;
            }
            if self.state != entered {
                return self.state;
            }
            if let Some(reason) = self.lost_for(self.states.current()) {
                return self.set(HoldState::Lost(reason));
            }
            if self.node_event.is_none() && self.states.current() == SessionState::Connected {
                if let Some(settled) = self.arm().await {
                    return settled;
                }
            }
            let presumed_at = self
                .suspended_since
                .filter(|_| self.ephemeral)
                .map(|t| t + self.trust_while_disconnected());
            let node_slot = &mut self.node_event;
            let states = &mut self.states;
            let node_event = async move {
                match node_slot.as_mut() {
                    Some(event) => event.await,
                    None => std::future::pending().await,
                }
            };
            let presumed = async {
                match presumed_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = node_event => {
                    self.node_event = None;
                    match event.event_type {
                        zk::EventType::NodeDeleted => { self.set(HoldState::Lost(LossReason::Revoked)); }
                        zk::EventType::Session => {
                            if let Some(reason) = self.lost_for(SessionState::from_client(event.session_state)) {
                                self.set(HoldState::Lost(reason));
                            }
                        }
                        // Data changed: re-arm and keep watching.
                        _ => {}
                    }
                }
                state = states.changed() => match state {
                    SessionState::Disconnected => {
                        self.suspended_since.get_or_insert_with(Instant::now);
                        self.set(HoldState::Suspended);
                    }
                    SessionState::Connected => {
                        self.suspended_since = None;
                        // Re-check the node before trusting the hold again:
                        // it may have been deleted while we were away.
                        self.node_event = None;
                        if self.arm().await.is_none() {
                            self.set(HoldState::Held);
                        }
                    }
                    terminal => {
                        match self.lost_for(terminal) {
                            Some(reason) => { self.set(HoldState::Lost(reason)); }
                            // A persistent hold outlives the session, but we
                            // can no longer see it: it may be lost.
                            None => { self.set(HoldState::Suspended); return self.state; }
                        }
                    }
                },
                () = presumed => { self.set(HoldState::Lost(LossReason::PresumedExpired)); }
            }
        }
    }

    /// Resolves when the hold is lost.
    pub async fn lost(mut self) -> LossReason {
        loop {
            if let HoldState::Lost(reason) = self.next().await {
                return reason;
            }
        }
    }
}
