//! A ZooKeeper session: connecting, observing its state, closing it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};
use zookeeper_client as zk;

use super::acl::{self, Credential};
use super::connect::ConnectString;
use super::error::{Result, ZkError};

/// Whether a request failed because the connection dropped, so its outcome
/// is unknown: it may or may not have been applied. Besides
/// `ConnectionLoss`, the client hands every in-flight request the error that
/// ended its connection: an I/O error or "no response from connection"
/// (`Custom`), a reply it could not match to a request ("unexpected xid",
/// `UnexpectedError`) or could not decode (`UnmarshalError`).
pub(crate) fn is_connection_loss(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::ConnectionLoss
            | zk::Error::Custom(_)
            | zk::Error::UnexpectedError(_)
            | zk::Error::UnmarshalError { .. }
    )
}

/// A new session's client, below its chroot ([`Session::connect`]).
enum Chrooted {
    Ready(zk::Client),
    /// The connection was lost before the chroot was seen.
    Lost(zk::Error),
}

/// How to reach ZooKeeper.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Servers and optional chroot.
    pub connect: ConnectString,
    /// Session timeout asked of the server (it may clamp it to its
    /// `minSessionTimeout`..`maxSessionTimeout`).
    pub session_timeout: Duration,
    /// How long [`Session::connect`] keeps trying before it reports the
    /// ensemble unreachable.
    pub connect_timeout: Duration,
    /// A digest credential added to the session. The nodes the session
    /// makes are then its own: their ACL grants everything to this
    /// credential and nothing to anyone else (see [`Session::node_acls`]).
    pub credential: Option<Credential>,
    /// Certificates for `tcp+tls://` servers.
    pub tls: Option<TlsSettings>,
}

/// What a TLS connection to ZooKeeper trusts and presents (PEM text).
#[derive(Clone)]
pub struct TlsSettings {
    /// The CA certificates the servers' certificates must chain to.
    pub ca: String,
    /// A client certificate and its private key, for servers that ask for
    /// one (`ssl.clientAuth`).
    pub identity: Option<(String, String)>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl SessionOptions {
    /// The session timeout asked for unless told.
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

    /// Options with the defaults: a 10 s session, 15 s to connect, no credentials.
    pub fn new(connect: ConnectString) -> Self {
        SessionOptions {
            connect,
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
            connect_timeout: Duration::from_secs(15),
            credential: None,
            tls: None,
        }
    }

    /// Sets the session timeout.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets how long connecting may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Adds digest credentials.
    pub fn digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credential = Some(Credential {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Sets the TLS certificates (used for `tcp+tls://` servers).
    pub fn tls(mut self, tls: TlsSettings) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// The state of a session, as far as a holder of a lock or a barrier
/// registration needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Connected: ephemeral nodes and watches are in force.
    Connected,
    /// Disconnected and reconnecting: the session may still be alive (its
    /// ephemeral nodes with it) or may have expired on the server; a hold is
    /// *maybe lost* until the client reconnects.
    Disconnected,
    /// Expired: every ephemeral node of the session is gone. Terminal.
    Expired,
    /// Closed by this process. Terminal.
    Closed,
    /// The server refused the credentials. Terminal.
    AuthFailed,
}

impl SessionState {
    /// Whether the session can never be used again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
        )
    }

    pub(crate) fn from_client(state: zk::SessionState) -> Self {
        match state {
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                SessionState::Connected
            }
            zk::SessionState::Disconnected => SessionState::Disconnected,
            zk::SessionState::Expired => SessionState::Expired,
            zk::SessionState::Closed => SessionState::Closed,
            zk::SessionState::AuthFailed => SessionState::AuthFailed,
        }
    }

    /// The error an operation gets in this terminal state.
    pub(crate) fn terminal_error(self) -> Option<ZkError> {
        match self {
            SessionState::Expired => Some(ZkError::SessionExpired),
            SessionState::Closed => Some(ZkError::SessionClosed),
            SessionState::AuthFailed => Some(ZkError::AuthFailed),
            _ => None,
        }
    }
}

/// Follows the state of a session.
#[derive(Debug)]
pub struct StateWatcher {
    inner: zk::StateWatcher,
}

impl StateWatcher {
    /// The latest state.
    pub fn current(&self) -> SessionState {
        SessionState::from_client(self.inner.peek_state())
    }

    /// Waits for the next change and returns the new state. After a terminal
    /// state it never returns.
    pub async fn changed(&mut self) -> SessionState {
        SessionState::from_client(self.inner.changed().await)
    }
}

/// Counters kept per session, for tests and metrics.
#[derive(Debug, Default)]
pub struct SessionStats {
    watch_wakeups: AtomicU64,
}

impl SessionStats {
    /// How many times a recipe waiting on a watch (a lock waiter, a barrier
    /// participant) was woken by it. A herd-free lock wakes one waiter per
    /// release.
    pub fn watch_wakeups(&self) -> u64 {
        self.watch_wakeups.load(Ordering::Relaxed)
    }

    pub(crate) fn record_wakeup(&self) {
        self.watch_wakeups.fetch_add(1, Ordering::Relaxed);
    }
}

/// One ZooKeeper session, shared by the recipes run on it.
///
/// Guarantees:
/// - every path is relative to the connect string's chroot, which
///   [`Session::connect`] creates when it is missing;
/// - [`Session::close`] ends the session on the server before it returns, so
///   the session's ephemeral nodes are gone at once rather than a session
///   timeout later.
#[derive(Debug)]
pub struct Session {
    client: zk::Client,
    connect: ConnectString,
    stats: Arc<SessionStats>,
    node_acls: Vec<zk::Acl>,
    /// How this session was made: a clean-up that outlives it (its nodes
    /// are persistent) connects again with them.
    options: SessionOptions,
    /// Clean-ups sent from tasks (a guard dropped armed): [`Session::close`]
    /// waits for them.
    cleanups: tokio_util::task::TaskTracker,
}

impl Session {
    /// Connects, retrying until `options.connect_timeout` passes.
    ///
    /// Errors: [`ZkError::Unreachable`] when no server answered in time,
    /// [`ZkError::AuthFailed`] when the credentials were refused.
    pub async fn connect(options: &SessionOptions) -> Result<Session> {
        Self::connect_as(options, None).await
    }

    /// Connects again to this session, for a holder that must not take the
    /// client's word that it expired: the client gives a session up once it
    /// has not reached a server for 1.4 session timeouts, but the servers
    /// keep it longer after an outage (a restarted server, or a quorum that
    /// formed again, gives every session a full timeout from then on). So
    /// only the server's answer says it is gone. Same options, same node
    /// ACLs; tries for `connect_timeout`.
    ///
    /// Errors: [`ZkError::SessionExpired`] when the server says the session
    /// is gone (its ephemeral nodes with it); [`ZkError::Unreachable`] when
    /// no server answered in time; [`ZkError::AuthFailed`].
    pub async fn resume(&self) -> Result<Session> {
        let mut resumed =
            Self::connect_as(&self.options, Some(self.client.session().clone())).await?;
        resumed.node_acls.clone_from(&self.node_acls);
        info!(session = %resumed.client.session_id(), "ZooKeeper session resumed");
        Ok(resumed)
    }

    /// A new session with this one's options and node ACLs, for a holder
    /// whose session expired and who must register again.
    pub async fn reconnect(&self) -> Result<Session> {
        let mut fresh = Self::connect_as(&self.options, None).await?;
        fresh.node_acls.clone_from(&self.node_acls);
        Ok(fresh)
    }

    async fn connect_as(
        options: &SessionOptions,
        session: Option<zk::SessionInfo>,
    ) -> Result<Session> {
        let servers = options.connect.servers_string();
        let started = Instant::now();
        let deadline = started + options.connect_timeout;
        let mut connector = zk::Client::connector()
            .with_session_timeout(options.session_timeout)
            .with_fail_eagerly();
        let resuming = session.is_some();
        if let Some(session) = session {
            connector = connector.with_session(session);
        }
        if let Some(credential) = &options.credential {
            connector = connector.with_auth("digest", credential.expose().as_bytes());
        }
        if options.connect.uses_tls() {
            connector = connector.with_tls(tls_options(options.tls.as_ref())?);
        }
        let node_acls = match &options.credential {
            Some(credential) => vec![credential.acl(zk::Permission::ALL)],
            None => acl::open(),
        };
        let mut backoff = Duration::from_millis(50);
        let client = loop {
            let attempt =
                tokio::time::timeout_at(deadline, connector.clone().connect(&servers)).await;
            let source = match attempt {
                Ok(Ok(client)) => {
                    match Self::chrooted(client, options, resuming, &node_acls).await? {
                        Chrooted::Ready(client) => break client,
                        // The connection went while the chroot was looked at:
                        // a new session, as for a server not reachable yet
                        // (this one made nothing but, at most, the chroot).
                        Chrooted::Lost(err) => err,
                    }
                }
                Ok(Err(zk::Error::AuthFailed)) => return Err(ZkError::AuthFailed),
                Ok(Err(zk::Error::SessionExpired)) => return Err(ZkError::SessionExpired),
                Ok(Err(err)) => err,
                Err(_) => zk::Error::Timeout,
            };
            if Instant::now() + backoff >= deadline {
                if let (Some(tls), Some(server)) = (
                    options.tls.as_ref(),
                    options.connect.servers().iter().find(|s| s.tls),
                ) {
                    if let Some(reason) = tls_diagnosis(server, tls).await {
                        return Err(ZkError::TlsHandshake { servers, reason });
                    }
                }
                return Err(ZkError::Unreachable {
                    servers,
                    waited: started.elapsed(),
                    source,
                });
            }
            debug!(%servers, error = %source, "ZooKeeper not reachable yet; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        info!(
            session = %client.session_id(),
            timeout_ms = client.session_timeout().as_millis() as u64,
            connect = %options.connect,
            "ZooKeeper session established"
        );
        Ok(Session {
            client,
            connect: options.connect.clone(),
            stats: Arc::default(),
            node_acls,
            options: options.clone(),
            cleanups: tokio_util::task::TaskTracker::new(),
        })
    }

    /// `client` below the connect string's chroot, made if missing (with
    /// `node_acls`). A connection lost meanwhile is [`Chrooted::Lost`]: the
    /// caller connects again (found by the chaos run: a lost connection
    /// here made `zkgate` exit 1, an internal error, where ZooKeeper was
    /// only not reachable yet).
    async fn chrooted(
        client: zk::Client,
        options: &SessionOptions,
        resuming: bool,
        node_acls: &[zk::Acl],
    ) -> Result<Chrooted> {
        let Some(chroot) = options.connect.chroot() else {
            return Ok(Chrooted::Ready(client));
        };
        let invalid = |_| ZkError::InvalidPath {
            path: chroot.to_owned(),
            reason: "not a valid chroot",
        };
        // A resumed session's chroot was there when it was made; and a
        // request failing here would drop the client, whose close ends the
        // very session we came back for.
        if resuming {
            return client
                .chroot(chroot.to_owned())
                .map(Chrooted::Ready)
                .map_err(invalid);
        }
        let there = match client.check_stat(chroot).await {
            Ok(stat) => stat.is_some(),
            // ZooKeeper 3.9 checks READ on an `exists` of a node that is
            // there (3.8 checks nothing): refused, it is there, and ours to
            // use as far as the ACLs below allow (another credential's
            // chroot, say).
            Err(zk::Error::NoAuth) => true,
            Err(e) if is_connection_loss(&e) => return Ok(Chrooted::Lost(e)),
            Err(e) => return Err(ZkError::from_client("check", chroot, e)),
        };
        if !there {
            let create = zk::CreateMode::Persistent.with_acls(node_acls.into());
            match client.mkdir(chroot, &create).await {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(e) if is_connection_loss(&e) => return Ok(Chrooted::Lost(e)),
                Err(e) => return Err(ZkError::from_client("create chroot", chroot, e)),
            }
        }
        client
            .chroot(chroot.to_owned())
            .map(Chrooted::Ready)
            .map_err(invalid)
    }

    /// The ACL of the nodes the recipes make for this session (their
    /// registrations, contenders, `ready`, parents they create): everything
    /// for the session's credential (and READ for those given to
    /// [`Session::grant_read`]), or open to anyone without one.
    pub fn node_acls(&self) -> zk::Acls<'_> {
        (&self.node_acls[..]).into()
    }

    /// The ACL of a `ready` node this session makes: [`Session::node_acls`]
    /// with WRITE besides READ for the other credentials given to
    /// [`Session::grant_read`]. A round's `ready` records the members its
    /// opening counted, written by the first member to read them
    /// ([`super::GangBarrier::members`]), which during a rotation's grace
    /// window may be on the other credential than the member that opened
    /// it. WRITE allows no more than that record (it cannot delete the
    /// node or add children to it), and only to the namespace's own
    /// credentials.
    pub fn ready_acls(&self) -> Vec<zk::Acl> {
        let own = self.options.credential.as_ref().map(Credential::digest_id);
        self.node_acls
            .iter()
            .map(|a| {
                let reader = a.scheme() == "digest"
                    && Some(a.id()) != own.as_deref()
                    && a.permission() == zk::Permission::READ;
                if reader {
                    zk::Acl::new(
                        zk::Permission::READ | zk::Permission::WRITE,
                        zk::AuthId::new("digest", a.id()),
                    )
                } else {
                    a.clone()
                }
            })
            .collect()
    }

    /// Also gives READ to the digest ids `readers` (but our own) on the
    /// nodes the recipes make from now on ([`Session::node_acls`]): the
    /// other credential of a namespace during a rotation's grace window,
    /// whose participants must see our registrations, `ready` and
    /// contenders (from ZooKeeper 3.9 on, `exists` and its watch check
    /// READ). Nothing without a credential of our own: our nodes are open.
    pub fn grant_read(&mut self, readers: &[String]) {
        let Some(own) = self.options.credential.as_ref().map(Credential::digest_id) else {
            return;
        };
        for id in readers {
            let granted = self
                .node_acls
                .iter()
                .any(|a| a.scheme() == "digest" && a.id() == id.as_str());
            if *id != own && !granted {
                self.node_acls.push(zk::Acl::new(
                    zk::Permission::READ,
                    zk::AuthId::new("digest", id),
                ));
            }
        }
    }

    /// Adds another digest credential to the session (the controller holds
    /// each namespace's, to read and clean up the nodes participants make).
    /// It applies to later requests and is presented again after a
    /// reconnect; it does not change [`Session::node_acls`].
    pub async fn add_credential(&self, credential: &Credential) -> Result<()> {
        self.client
            .auth("digest", credential.expose().as_bytes())
            .await
            .map_err(|e| ZkError::from_client("authenticate", "/", e))
    }

    /// The underlying client, rooted at the chroot. Requests on it are sent
    /// in call order, so several can be issued before awaiting any.
    pub fn client(&self) -> &zk::Client {
        &self.client
    }

    /// The connect string this session was made from.
    pub fn connect_string(&self) -> &ConnectString {
        &self.connect
    }

    /// The session id, as the server knows it (the `ephemeralOwner` of the
    /// session's ephemeral nodes).
    pub fn id(&self) -> i64 {
        self.client.session_id().0
    }

    /// The negotiated session timeout.
    pub fn timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// The current state.
    pub fn state(&self) -> SessionState {
        SessionState::from_client(self.client.state())
    }

    /// A watcher that reports every later state change.
    pub fn watch_state(&self) -> StateWatcher {
        StateWatcher {
            inner: self.client.state_watcher(),
        }
    }

    /// Lets go of a one-shot watch (the future of a watcher's `changed`)
    /// that is no longer wanted, without a request now.
    ///
    /// Dropping a watch that has not fired makes the client ask the server
    /// to remove it. When many sessions stop wanting a watch at once (every
    /// waiter of a barrier, released together), those removals reach the
    /// server while it is still sending the release's notifications, and
    /// slow them: a 1,000-participant barrier took twice as long to release.
    /// The watch is kept instead until it fires or one session timeout has
    /// passed, and dropped then. Outside a tokio runtime (every recipe runs
    /// in one) it is dropped at once.
    pub fn retire_watch<F>(&self, watch: F)
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send,
    {
        let linger = self.timeout();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(linger, watch).await;
            });
        }
    }

    /// The session's counters.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// Leaves the session to the server, for a process that is about to
    /// exit: no close is sent, so its ephemeral nodes stay until the
    /// session times out on the server, unless another session removes
    /// them first. What a participant whose registration must outlive it
    /// does (a barrier sidecar in rounds, whose pod's next life withdraws
    /// it). Clean-ups still under way on it are dropped with it.
    pub fn abandon(self) {
        // Dropping the client would send the close (the connection task
        // sends one when its last handle goes); forgotten, it never does,
        // and the process's exit ends the connection.
        std::mem::forget(self);
    }

    /// Ends the session on the server and waits until the server confirmed,
    /// so ephemeral nodes are removed now. Clean-up requests still running on
    /// the session (from cancelled recipes) finish first.
    ///
    /// Clean-ups of our nodes still under way (a wait cancelled just
    /// before) are waited for first, so that a process that exits after
    /// `close` leaves none of its nodes behind: at most three session
    /// timeouts, what a clean-up from a new session may take (it connects
    /// within two, see the guard's `clean_up_persistent`, then deletes).
    pub async fn close(self) -> Result<()> {
        let timeout = self.timeout() * 3;
        self.cleanups.close();
        if tokio::time::timeout(timeout, self.cleanups.wait())
            .await
            .is_err()
        {
            warn!(
                waited = ?timeout,
                "clean-up of our nodes did not finish in time; what is left goes with the session (ephemeral) or is removed by the controller when the pod has ended (persistent)"
            );
        }
        let mut watcher = self.client.state_watcher();
        if SessionState::from_client(watcher.peek_state()).is_terminal() {
            return Ok(());
        }
        let id = self.client.session_id();
        drop(self.client);
        let closed = tokio::time::timeout(timeout, async {
            loop {
                let state = SessionState::from_client(watcher.changed().await);
                if state.is_terminal() {
                    return state;
                }
            }
        })
        .await;
        match closed {
            Ok(SessionState::Closed) => {
                debug!(session = %id, "ZooKeeper session closed");
                Ok(())
            }
            Ok(SessionState::Expired) => Err(ZkError::SessionExpired),
            Ok(_) => Err(ZkError::SessionClosed),
            Err(_) => {
                warn!(session = %id, "ZooKeeper session did not confirm close; it will expire on its own");
                Err(ZkError::Timeout {
                    during: "closing the ZooKeeper session".into(),
                    waited: timeout,
                })
            }
        }
    }

    /// Waits until the node at `path` exists (its owner may not have made it
    /// yet), on a watch. Fails when the session ends.
    pub async fn await_node(&self, path: &str) -> Result<()> {
        loop {
            let (stat, watcher) = self
                .retry("watch", path, || self.client.check_and_watch_stat(path))
                .await?;
            if stat.is_some() {
                return Ok(());
            }
            debug!(%path, "waiting for the node to be created");
            let event = watcher.changed().await;
            if event.event_type == zk::EventType::Session {
                if let Some(err) = SessionState::from_client(event.session_state).terminal_error() {
                    return Err(err);
                }
            }
        }
    }

    /// Waits until the node at `path` is gone, on a watch. Fails when the
    /// session ends.
    pub(crate) async fn await_gone(&self, path: &str) -> Result<()> {
        loop {
            let (stat, watcher) = self
                .retry("watch", path, || self.client.check_and_watch_stat(path))
                .await?;
            if stat.is_none() {
                return Ok(());
            }
            let event = watcher.changed().await;
            if event.event_type == zk::EventType::Session {
                if let Some(err) = SessionState::from_client(event.session_state).terminal_error() {
                    return Err(err);
                }
            }
        }
    }

    /// Waits until the session is connected; fails when it is terminal.
    /// The options this session was made with.
    pub(crate) fn options(&self) -> &SessionOptions {
        &self.options
    }

    /// Where clean-ups sent from tasks are tracked (see [`Session::close`]).
    pub(crate) fn cleanups(&self) -> &tokio_util::task::TaskTracker {
        &self.cleanups
    }

    pub(crate) async fn await_connected(&self) -> Result<()> {
        let mut watcher = self.client.state_watcher();
        loop {
            let state = SessionState::from_client(watcher.peek_state());
            if state == SessionState::Connected {
                return Ok(());
            }
            if let Some(err) = state.terminal_error() {
                return Err(err);
            }
            watcher.changed().await;
        }
    }

    /// Runs an idempotent request, retrying it after a connection loss once
    /// the session has reconnected.
    pub(crate) async fn retry<T, F, Fut>(
        &self,
        op: &'static str,
        path: &str,
        mut request: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, zk::Error>>,
    {
        loop {
            match request().await {
                Err(e) if is_connection_loss(&e) => {
                    debug!(op, path, "connection lost; retrying after reconnect");
                    self.await_connected().await?;
                }
                Err(e) => return Err(ZkError::from_client(op, path, e)),
                Ok(v) => return Ok(v),
            }
        }
    }

    /// Makes `path` and any missing parent with `options` (retried like
    /// [`Session::retry`]); a node that is already there is success, so
    /// replicas and restarts may race to make it.
    pub async fn mkdir_all(&self, path: &str, options: &zk::CreateOptions<'_>) -> Result<()> {
        let client = self.client();
        match self
            .retry("create", path, || client.mkdir(path, options))
            .await
        {
            Ok(())
            | Err(ZkError::Zk {
                source: zk::Error::NodeExists,
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The client's TLS options (see [`crate::install_crypto_provider`] for why
/// the provider is set first).
fn tls_options(settings: Option<&TlsSettings>) -> Result<zk::TlsOptions> {
    crate::install_crypto_provider();
    let Some(settings) = settings else {
        return Err(ZkError::Tls {
            reason: "the connect string names tcp+tls:// servers but no CA certificate was given (--tls-ca)".into(),
        });
    };
    let bad = |what: &str, e: zk::Error| ZkError::Tls {
        reason: format!("{what}: {e}"),
    };
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(&settings.ca)
        .map_err(|e| bad("unreadable CA certificate", e))?;
    if let Some((cert, key)) = &settings.identity {
        options = options
            .with_pem_identity(cert, key)
            .map_err(|e| bad("unreadable client certificate or key", e))?;
    }
    Ok(options)
}

/// Why a TLS handshake with `server` fails, if it does: the client library
/// reports only that no host was available, which tells a user nothing.
/// `None` when the handshake succeeds or the server cannot be reached at
/// all (not a TLS problem).
async fn tls_diagnosis(server: &super::connect::Server, settings: &TlsSettings) -> Option<String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::AsyncReadExt;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(settings.ca.as_bytes()).flatten() {
        let _ = roots.add(cert);
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let config = match &settings.identity {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<std::result::Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).ok()?;
            builder.with_client_auth_cert(certs, key).ok()?
        }
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(server.host.clone()).ok()?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect((server.host.as_str(), server.port)),
    )
    .await
    .ok()?
    .ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    match tokio::time::timeout(Duration::from_secs(3), connector.connect(name, tcp)).await {
        Ok(Err(e)) => Some(format!("the TLS handshake with {server} failed: {e}")),
        Ok(Ok(mut stream)) => {
            // Under TLS 1.3 a server that refuses our certificate (or its
            // absence) says so only after the handshake.
            let mut byte = [0u8; 1];
            match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await {
                Ok(Err(e)) => Some(format!("{server} ended the TLS session: {e}")),
                _ => None,
            }
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_that_ends_a_connection_leaves_the_outcome_unknown() {
        for unknown in [
            zk::Error::ConnectionLoss,
            zk::Error::UnexpectedError("recv response with xid 7 but no pending request".into()),
            zk::Error::UnmarshalError {
                entity: "reply header",
                reason: &"insufficient buf",
            },
        ] {
            assert!(is_connection_loss(&unknown), "{unknown:?}");
        }
        for known in [
            zk::Error::NoNode,
            zk::Error::NodeExists,
            zk::Error::BadVersion,
            zk::Error::NoAuth,
            zk::Error::SessionExpired,
            zk::Error::AuthFailed,
        ] {
            assert!(!is_connection_loss(&known), "{known:?}");
        }
    }
}
