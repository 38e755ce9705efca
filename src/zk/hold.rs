//! A held lock: its fencing token, how to learn it was lost, how to
//! release it or keep it past this process.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};
use zookeeper_client as zk;

use super::contender::ContenderKind;
use super::error::{Result, ZkError};
use super::session::{is_connection_loss, Session, SessionState, StateWatcher};

/// A held lock (exclusive, read or write) or semaphore permits.
///
/// Dropping it releases the lock from a spawned task; [`LockHold::release`]
/// releases it and waits for the server; [`LockHold::into_registration`]
/// keeps a persistent hold past this process.
#[derive(Debug)]
pub struct LockHold<'s> {
    session: &'s Session,
    path: String,
    /// A semaphore hold's further permits: nodes made with `path` in one
    /// transaction and released with it.
    siblings: Vec<String>,
    kind: ContenderKind,
    token: i64,
    persistent: bool,
    confirmed: Confirmed,
    held_since: Instant,
    done: bool,
}

/// A hold as a queue (a lock's, a semaphore's) hands it over: what
/// [`LockHold::new`] makes a hold of.
pub(crate) struct Acquired {
    /// Our node.
    pub node: String,
    /// More nodes of the same hold (a semaphore's further permits),
    /// released with it.
    pub siblings: Vec<String>,
    /// Its czxid.
    pub token: i64,
    /// When the request that showed us holding was sent: the server knew
    /// the session alive then.
    pub confirmed_at: Instant,
}

impl<'s> LockHold<'s> {
    pub(crate) fn new(
        session: &'s Session,
        acquired: Acquired,
        kind: ContenderKind,
        persistent: bool,
    ) -> Self {
        LockHold {
            session,
            path: acquired.node,
            siblings: acquired.siblings,
            kind,
            token: acquired.token,
            persistent,
            confirmed: Confirmed::at(acquired.confirmed_at),
            held_since: acquired.confirmed_at,
            done: false,
        }
    }

    /// Since when the hold is ours, at the latest: the send time of the
    /// request that showed us holding. A lease measured from here ends no
    /// later than one measured from any moment we learned of the hold.
    pub fn held_since(&self) -> Instant {
        self.held_since
    }

    /// The fencing token: the czxid of our node. ZooKeeper's zxids only
    /// grow, so each later hold of the lock has a larger token, even after the
    /// lock node was deleted and made again (when sequence numbers restart).
    pub fn fencing_token(&self) -> i64 {
        self.token
    }

    /// The path of our node (a semaphore hold's first lease).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Every node of the hold: one for a lock, one per permit for a
    /// semaphore.
    pub fn nodes(&self) -> Vec<&str> {
        std::iter::once(self.path.as_str())
            .chain(self.siblings.iter().map(String::as_str))
            .collect()
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
    /// Every monitor of one hold shares what the others confirmed.
    ///
    /// Each check is a transaction (a `check` of our node in a multi),
    /// which only a quorum behind the leader can answer: see
    /// [`Confirmation::Quorum`].
    pub fn monitor(&self) -> HoldMonitor<'s> {
        HoldMonitor::following(
            self.session,
            self.path.clone(),
            !self.persistent,
            self.confirmed.clone(),
            Confirmation::Quorum,
        )
    }

    /// Resolves when the hold is lost, with the reason.
    pub async fn lost(&self) -> LossReason {
        self.monitor().lost().await
    }

    /// Releases the lock and waits for the server.
    ///
    /// Fails with [`ZkError::NodeRemoved`] when our node was already gone:
    /// it was revoked. That includes a release retried after a lost
    /// connection that finds no node: the first attempt may have deleted
    /// it, but so may someone else while we were cut off, and a hold that
    /// may have been lost must be reported as lost.
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        if self.siblings.is_empty() {
            release_node(self.session, &self.path).await
        } else {
            release_nodes(self.session, &self.nodes()).await
        }
    }

    /// Keeps the node (a persistent hold) past this process and returns
    /// what a later process needs to release it.
    pub fn into_registration(mut self) -> Registration {
        self.done = true;
        Registration {
            path: std::mem::take(&mut self.path),
            siblings: std::mem::take(&mut self.siblings),
            fencing_token: self.token,
        }
    }
}

impl Drop for LockHold<'_> {
    fn drop(&mut self) {
        if !self.done {
            let nodes = std::iter::once(std::mem::take(&mut self.path))
                .chain(std::mem::take(&mut self.siblings));
            for node in nodes {
                let mut guard = super::guard::NodeGuard::new(self.session);
                guard.arm(node);
                // Dropping the armed guard sends the delete from a task.
            }
        }
    }
}

/// When the server last confirmed a hold: the send time of the latest
/// request it answered with our node in place. Shared by a hold's monitors.
#[derive(Clone, Debug)]
pub(crate) struct Confirmed(Arc<std::sync::Mutex<Instant>>);

impl Confirmed {
    /// Confirmed by a request sent at `at`.
    pub(crate) fn at(at: Instant) -> Self {
        Confirmed(Arc::new(std::sync::Mutex::new(at)))
    }

    /// The latest confirmation.
    pub(crate) fn get(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn advance(&self, to: Instant) {
        let mut at = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if to > *at {
            *at = to;
        }
    }
}

/// Until when a [`HoldMonitor`] trusts its hold; see [`HoldMonitor::trust`].
#[derive(Clone, Debug)]
pub struct Trust {
    confirmed: Confirmed,
    window: Duration,
}

impl Trust {
    /// The latest confirmation's send time plus the session timeout less
    /// the leader's possible lag ([`leader_lag`]) and the monitor's
    /// reserve.
    pub fn until(&self) -> Instant {
        self.confirmed.get() + self.window
    }
}

/// A persistent hold or barrier registration that outlived the process
/// that made it: the node's path is its identity.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Registration {
    /// The node.
    pub path: String,
    /// A semaphore hold's further permits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub siblings: Vec<String>,
    /// Its fencing token (czxid).
    pub fencing_token: i64,
}

impl Registration {
    /// Releases it from any session (a later process, the controller).
    pub async fn release(&self, session: &Session) -> Result<()> {
        if self.siblings.is_empty() {
            return release_node(session, &self.path).await;
        }
        let nodes: Vec<&str> = std::iter::once(self.path.as_str())
            .chain(self.siblings.iter().map(String::as_str))
            .collect();
        release_nodes(session, &nodes).await
    }
}

/// Deletes a holder's node; `NodeRemoved` when it was already gone, even
/// on a retry (see [`LockHold::release`]).
pub(crate) async fn release_node(session: &Session, path: &str) -> Result<()> {
    let client = session.client();
    let mut retried = false;
    loop {
        match client.delete(path, None).await {
            Ok(()) => {
                debug!(%path, "released");
                return Ok(());
            }
            Err(zk::Error::NoNode) => {
                if retried {
                    warn!(%path, "the node was gone when the release was retried after a lost connection: revoked, or deleted by our first attempt; reporting the hold as lost");
                }
                return Err(ZkError::NodeRemoved {
                    path: path.to_owned(),
                });
            }
            Err(e) if is_connection_loss(&e) => {
                retried = true;
                session.await_connected().await?;
            }
            Err(e) => return Err(ZkError::from_client("delete", path, e)),
        }
    }
}

/// Deletes a semaphore hold's nodes in one transaction; `NodeRemoved` when
/// any was already gone (revoked), as for one node.
pub(crate) async fn release_nodes(session: &Session, paths: &[&str]) -> Result<()> {
    let client = session.client();
    let mut retried = false;
    loop {
        let mut writer = client.new_multi_writer();
        for path in paths {
            writer
                .add_delete(path, None)
                .map_err(|e| ZkError::from_client("delete", path, e))?;
        }
        match writer.commit().await {
            Ok(_) => {
                debug!(nodes = paths.len(), first = %paths[0], "released");
                return Ok(());
            }
            Err(zk::MultiWriteError::OperationFailed {
                index,
                source: zk::Error::NoNode,
            }) => {
                if retried {
                    warn!(first = %paths[0], "a node was gone when the release was retried after a lost connection: revoked, or deleted by our first attempt; reporting the hold as lost");
                }
                // The others stay ours to delete: the hold is lost anyway.
                for path in paths.iter().filter(|p| **p != paths[index]) {
                    let _ = client.delete(path, None).await;
                }
                return Err(ZkError::NodeRemoved {
                    path: paths[index].to_owned(),
                });
            }
            Err(e) => {
                let e = zk::Error::from(e);
                if !is_connection_loss(&e) {
                    return Err(ZkError::from_client("delete", paths[0], e));
                }
                retried = true;
                session.await_connected().await?;
            }
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
    /// The server refused the session's credentials: the session is
    /// unusable here, and the hold can no longer be confirmed (its node
    /// lives on until the server expires the session).
    AuthFailed,
    /// No reply from the server for so long that it may expire the session
    /// before we hear from it again: the hold must be given up now, while
    /// there is still time to stop what depends on it (see
    /// [`HoldMonitor::with_reserve`]).
    PresumedExpired,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::Revoked => "its node was deleted by someone else (revoked)",
            LossReason::SessionExpired => "the ZooKeeper session expired",
            LossReason::SessionClosed => "the ZooKeeper session was closed",
            LossReason::AuthFailed => "ZooKeeper refused the session's credentials",
            LossReason::PresumedExpired => {
                "no reply from ZooKeeper for so long that the session may expire"
            }
        })
    }
}

/// What a terminal session state means for a hold; `None` for the states
/// a hold survives (and for a persistent hold, which outlives its session).
fn loss_for(state: SessionState, ephemeral: bool) -> Option<LossReason> {
    match state {
        SessionState::Expired if ephemeral => Some(LossReason::SessionExpired),
        SessionState::AuthFailed if ephemeral => Some(LossReason::AuthFailed),
        SessionState::Closed => Some(LossReason::SessionClosed),
        _ => None,
    }
}

/// How a monitor has the server confirm that its node is still there.
///
/// Any server answers a plain read from its own copy of the tree, and a
/// follower cut from its leader keeps doing so until it notices
/// (`syncLimit` × `tickTime`), while the leader, no longer hearing our
/// session, may expire it and grant the lock to someone else. So a check
/// must be one the leader orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confirmation {
    /// A `check` of the node in a multi: a transaction, committed by a
    /// quorum, so neither a follower cut from its leader nor a leader cut
    /// from its quorum can answer it. One logged transaction per check:
    /// what a lock or semaphore hold uses (few holders, mutual exclusion
    /// at stake).
    Quorum,
    /// A `sync` followed by the read, sent together: the server answers
    /// the read only once the leader has answered the sync, so a follower
    /// cut from its leader cannot. Nothing is logged, so it suits many
    /// watchers (a gang's barrier registrations); a leader cut from its
    /// quorum still answers until it steps down (`syncLimit` × `tickTime`).
    LeaderSync,
}

type NodeEvent<'s> = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send + 's>>;
/// A check's reply: whether our node is there, and the watch set with it.
type ProbeReply<'s> = Pin<
    Box<
        dyn Future<Output = std::result::Result<(bool, Option<NodeEvent<'s>>), zk::Error>>
            + Send
            + 's,
    >,
>;

/// How much earlier than a confirmed check's send time the leader may have
/// last heard from the session: its expiry clock may have started that much
/// sooner.
///
/// The leader hears of a session connected to a follower only from the
/// follower's replies to its pings (every half tick, *h*), which list the
/// sessions the follower heard a request from since the last one; the
/// requests the follower forwards (our checks among them) refresh nothing
/// at the leader. So when the follower is cut from the leader just after a
/// check's commit reached it, the leader last heard from us at the last
/// ping reply before the cut that listed us. If a request of ours reaches
/// the follower in every half tick, that reply is less than *h* before the
/// check; if our requests are further apart (a gap *g* > *h*), a reply may
/// list nothing and the lag is less than *h* + *g* < 2*g*. A monitor sends
/// a request every *T*/10 from the last send, whatever its replies take
/// ([`HoldMonitor::touch`]), so the lag is less than max(*h*, *T*/5).
/// ZooKeeper negotiates no session shorter than its `minSessionTimeout`,
/// two ticks unless an operator lowers it (or servers run with different
/// ticks), so *h* is at most *T*/4, which covers both. (Expiry rounds up to
/// the next tick, but may add next to nothing.) Measured by
/// `partitions::a_holder_through_a_follower_is_dead_before_the_next_starts_at_zookeepers_default_tick`.
pub fn leader_lag(session_timeout: Duration) -> Duration {
    session_timeout / 4
}

/// A request in flight that checks our node: when it was sent, and its reply.
struct Probe<'s> {
    sent: Instant,
    reply: ProbeReply<'s>,
}

/// Follows one hold (a lock's node or a barrier registration) and tells
/// when it is, or may be, lost. See [`LockHold::monitor`].
///
/// Guarantee: for an ephemeral node, [`HoldState::Lost`] with
/// [`LossReason::PresumedExpired`] is reported no later than the session
/// timeout *T* less [`leader_lag`] (*T*/4) less the reserve after the send
/// time of the last request the leader ordered with our node in place (see
/// [`Confirmation`]). The leader cannot expire the session sooner than *T*
/// after it last heard from us, which is at most [`leader_lag`] before that
/// send time, so whatever the holder stops within the reserve is stopped
/// before anyone else can be granted the lock. The monitor checks its node
/// every *T*/10 while it runs, so a healthy connection keeps the hold
/// confirmed; every wait, including the check after a reconnect, runs under
/// that deadline, and nothing but a reply showing our node reports
/// [`HoldState::Held`] again.
pub struct HoldMonitor<'s> {
    session: &'s Session,
    path: String,
    ephemeral: bool,
    states: StateWatcher,
    node_event: Option<NodeEvent<'s>>,
    probe: Option<Probe<'s>>,
    next_probe: Instant,
    confirmed: Confirmed,
    confirmation: Confirmation,
    reserve: Duration,
    state: HoldState,
}

impl std::fmt::Debug for HoldMonitor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldMonitor")
            .field("path", &self.path)
            .field("state", &self.state)
            .field("reserve", &self.reserve)
            .finish()
    }
}

impl<'s> HoldMonitor<'s> {
    /// Follows any node this session relies on: a hold, or a barrier
    /// registration. `ephemeral` says whether the node dies with the
    /// session; `confirmed_at` is the send time of the last request the
    /// server answered with the node in place (see [`crate::zk::Entered`]).
    /// Checks are [`Confirmation::LeaderSync`]; a lock's own monitor
    /// ([`LockHold::monitor`]) uses [`Confirmation::Quorum`].
    pub fn new(session: &'s Session, path: String, ephemeral: bool, confirmed_at: Instant) -> Self {
        Self::following(
            session,
            path,
            ephemeral,
            Confirmed::at(confirmed_at),
            Confirmation::LeaderSync,
        )
    }

    fn following(
        session: &'s Session,
        path: String,
        ephemeral: bool,
        confirmed: Confirmed,
        confirmation: Confirmation,
    ) -> Self {
        let states = session.watch_state();
        let state = if states.current() == SessionState::Connected {
            HoldState::Held
        } else {
            HoldState::Suspended
        };
        HoldMonitor {
            session,
            path,
            ephemeral,
            states,
            node_event: None,
            probe: None,
            next_probe: Instant::now(),
            confirmed,
            confirmation,
            reserve: session.timeout() / 10,
            state,
        }
    }

    /// Reports [`LossReason::PresumedExpired`] `reserve` before the server
    /// could expire the session (default: a tenth of the session timeout),
    /// that is *T* − [`leader_lag`] − `reserve` after the last confirmation.
    /// Make it at least as long as stopping whatever depends on the hold
    /// takes; it must leave room for a few of the monitor's checks
    /// (*T*/10 each), or a healthy hold is given up.
    pub fn with_reserve(mut self, reserve: Duration) -> Self {
        self.reserve = reserve;
        self
    }

    /// The state as last seen.
    pub fn state(&self) -> HoldState {
        self.state
    }

    /// Until when the hold can be trusted (ephemeral nodes only).
    fn trusted_until(&self) -> Option<Instant> {
        self.ephemeral.then(|| self.trust().until())
    }

    /// A handle that tells, from anywhere and at any time, until when this
    /// monitor trusts the hold: the deadline at which it reports
    /// [`LossReason::PresumedExpired`] unless the server confirms the hold
    /// again. For a process that cannot reach ZooKeeper itself (a
    /// container beside a lock sidecar), to stop its work by then.
    pub fn trust(&self) -> Trust {
        Trust {
            confirmed: self.confirmed.clone(),
            window: self
                .session
                .timeout()
                .saturating_sub(leader_lag(self.session.timeout()))
                .saturating_sub(self.reserve),
        }
    }

    fn heartbeat(&self) -> Duration {
        (self.session.timeout() / 10).max(Duration::from_millis(20))
    }

    /// A request that only tells the server we are here, sent when a
    /// heartbeat has passed and our check's reply has not come (a slow
    /// commit): its reply is not waited for. A server hears from the
    /// session every heartbeat whatever its replies take, which is what
    /// bounds [`leader_lag`] (each request refreshes the session at the
    /// server it reaches when it arrives, and that server's next ping reply
    /// tells the leader).
    fn touch(&mut self) {
        // The request goes out as it is asked for; dropping its reply.
        drop(self.session.client().check_stat(&self.path));
        self.next_probe = Instant::now() + self.heartbeat();
    }

    fn set(&mut self, state: HoldState) -> HoldState {
        if state != self.state {
            match state {
                HoldState::Lost(reason) => warn!(path = %self.path, %reason, "hold lost"),
                HoldState::Suspended => {
                    warn!(path = %self.path, "disconnected from ZooKeeper: the hold may be lost")
                }
                HoldState::Held => debug!(path = %self.path, "hold confirmed"),
            }
        }
        self.state = state;
        state
    }

    /// Sends a check of our node that the leader orders (see
    /// [`Confirmation`]), and a watch of it when none is set. The check's
    /// send time is what a reply confirms. The next request goes a
    /// heartbeat after this one is sent, whenever its reply comes (see
    /// [`HoldMonitor::touch`]).
    fn send_probe(&mut self) {
        let client = self.session.client();
        let sent = Instant::now();
        self.next_probe = sent + self.heartbeat();
        let path = self.path.clone();
        let confirmed: Pin<
            Box<dyn Future<Output = std::result::Result<bool, zk::Error>> + Send + 's>,
        > = match self.confirmation {
            Confirmation::Quorum => {
                let mut writer = client.new_multi_writer();
                match writer.add_check_version(&path, -1) {
                    Ok(()) => {
                        let commit = writer.commit();
                        Box::pin(async move {
                            match commit.await {
                                Ok(_) => Ok(true),
                                Err(zk::MultiWriteError::OperationFailed {
                                    source: zk::Error::NoNode,
                                    ..
                                }) => Ok(false),
                                Err(e) => Err(zk::Error::from(e)),
                            }
                        })
                    }
                    Err(e) => Box::pin(std::future::ready(Err(e))),
                }
            }
            Confirmation::LeaderSync => {
                let sync = client.sync(&path);
                let read = client.check_stat(&path);
                Box::pin(async move {
                    sync.await?;
                    Ok(read.await?.is_some())
                })
            }
        };
        let watch = self
            .node_event
            .is_none()
            .then(|| client.check_and_watch_stat(&path));
        let reply: ProbeReply<'s> = Box::pin(async move {
            let present = confirmed.await?;
            let event = match watch {
                Some(watch) => {
                    let (_, watcher) = watch.await?;
                    Some(Box::pin(watcher.changed()) as NodeEvent<'s>)
                }
                None => None,
            };
            Ok((present, event))
        });
        self.probe = Some(Probe { sent, reply });
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
            let session_state = self.states.current();
            if let Some(reason) = loss_for(session_state, self.ephemeral) {
                return self.set(HoldState::Lost(reason));
            }
            let connected = session_state == SessionState::Connected;
            if connected && Instant::now() >= self.next_probe {
                if self.probe.is_none() {
                    self.send_probe();
                } else {
                    self.touch();
                }
            }
            let deadline = self.trusted_until();
            let next_probe = self.next_probe;
            let probe = &mut self.probe;
            let node_slot = &mut self.node_event;
            let states = &mut self.states;
            let reply = async {
                match probe.as_mut() {
                    Some(p) => (p.sent, p.reply.as_mut().await),
                    None => std::future::pending().await,
                }
            };
            let node_event = async {
                match node_slot.as_mut() {
                    Some(event) => event.await,
                    None => std::future::pending().await,
                }
            };
            let expiry = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = expiry => { self.set(HoldState::Lost(LossReason::PresumedExpired)); }
                (sent, result) = reply => {
                    self.probe = None;
                    self.on_probe(sent, result).await;
                }
                event = node_event => {
                    self.node_event = None;
                    match event.event_type {
                        zk::EventType::NodeDeleted => { self.set(HoldState::Lost(LossReason::Revoked)); }
                        zk::EventType::Session => {
                            if let Some(reason) = loss_for(SessionState::from_client(event.session_state), self.ephemeral) {
                                self.set(HoldState::Lost(reason));
                            }
                        }
                        // Data changed: check again (and watch again) now.
                        _ => self.next_probe = Instant::now(),
                    }
                }
                // A check (or, one still awaited, a touch) is due.
                () = tokio::time::sleep_until(next_probe), if connected => {}
                state = states.changed() => match state {
                    SessionState::Disconnected => { self.set(HoldState::Suspended); }
                    SessionState::Connected => {
                        // A request of the old connection has failed or
                        // will: check again on this one. Held only once a
                        // reply shows our node (it may have been deleted
                        // while we were away).
                        self.probe = None;
                        self.next_probe = Instant::now();
                    }
                    terminal => match loss_for(terminal, self.ephemeral) {
                        Some(reason) => { self.set(HoldState::Lost(reason)); }
                        // A persistent hold outlives the session, but we
                        // can no longer see it: it may be lost.
                        None => { self.set(HoldState::Suspended); return self.state; }
                    },
                },
            }
        }
    }

    async fn on_probe(
        &mut self,
        sent: Instant,
        result: std::result::Result<(bool, Option<NodeEvent<'s>>), zk::Error>,
    ) {
        match result {
            Ok((false, _)) => {
                self.set(HoldState::Lost(LossReason::Revoked));
            }
            Ok((true, event)) => {
                self.confirmed.advance(sent);
                if event.is_some() {
                    self.node_event = event;
                }
                // The next check is due a heartbeat after this one's send
                // (send_probe): a late reply is followed by a check at once.
                if self.state == HoldState::Suspended {
                    self.set(HoldState::Held);
                }
            }
            // The state watcher reports the disconnection; the reconnect
            // sends the next check.
            Err(e) if is_connection_loss(&e) => self.next_probe = Instant::now(),
            Err(e) => {
                let state = SessionState::from_client(self.session.client().state());
                match loss_for(state, self.ephemeral) {
                    Some(reason) => {
                        self.set(HoldState::Lost(reason));
                    }
                    None => {
                        // Not a connection problem (an ACL, say): check
                        // again later, under the same deadline.
                        warn!(path = %self.path, error = %e, "could not check the hold; retrying");
                        self.next_probe = Instant::now() + Duration::from_secs(1);
                    }
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_failure_is_not_expiry() {
        assert_eq!(
            loss_for(SessionState::AuthFailed, true),
            Some(LossReason::AuthFailed)
        );
        assert_eq!(
            loss_for(SessionState::Expired, true),
            Some(LossReason::SessionExpired)
        );
        assert_eq!(loss_for(SessionState::Expired, false), None);
        assert_eq!(loss_for(SessionState::AuthFailed, false), None);
        assert_eq!(
            loss_for(SessionState::Closed, false),
            Some(LossReason::SessionClosed)
        );
        assert_eq!(loss_for(SessionState::Disconnected, true), None);
        assert_ne!(
            LossReason::AuthFailed.to_string(),
            LossReason::SessionExpired.to_string()
        );
    }
}
