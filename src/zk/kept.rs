//! A barrier registration kept through ZooKeeper outages.
//!
//! Once a barrier has opened, the work it started needs nothing from
//! ZooKeeper until it ends: unlike a lock, nobody else is waiting to take
//! its place, and stopping it buys no safety. So a participant's
//! registration after the opening is not a hold that a lost connection
//! gives up. [`KeptRegistration`] keeps it there for the peers (their
//! `leave` waits for it) however long ZooKeeper is away, and says so in
//! the log while it waits.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};
use zookeeper_client as zk;

use super::error::{Result, ZkError};
use super::hold::LossReason;
use super::session::{is_connection_loss, Session, SessionState};

/// How often a keeper that cannot reach ZooKeeper says so.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// A participant's ephemeral registration in an opened barrier, kept for as
/// long as its work runs.
///
/// Guarantees:
/// - A lost connection, however long, never ends the keeping by itself:
///   the client reconnects, and when it has given the session up (it does
///   so after 1.4 session timeouts without a server), the keeper resumes
///   it ([`Session::resume`]) as soon as a server answers, since only the
///   server knows whether it expired. A server restarted on its data, or a
///   quorum formed again, gives every session a full timeout from then on,
///   so a keeper that resumes at once finds its session and its node as
///   they were: the peers never saw it go.
/// - When the server says the session expired (ours was cut off while the
///   servers ran on), the registration went with it, and the peers may
///   have counted us as gone: that is a loss, known from then on
///   ([`LossReason::SessionExpired`]); the registration is not made again
///   (a node made again could count in a barrier's next use).
/// - [`KeptRegistration::keep`] returns only when the registration is
///   known to be gone: its node deleted by someone else while we were
///   connected (the Barrier deleted, say), the server saying our session
///   expired, or the session closed or its credentials refused.
///
/// What it cannot promise: while we are cut off and the servers run on,
/// they expire our session after one timeout, and until we reach one of
/// them again our work goes on though a peer's `leave` has counted us as
/// left. (A barrier in rounds does not use a keeper for that reason: a
/// replacement could start the next round beside us.)
///
/// The session to use for anything else (leaving, say) is
/// [`KeptRegistration::session`]: it may be a new one after `keep`.
#[derive(Debug)]
pub struct KeptRegistration {
    session: Session,
    node: String,
}

impl KeptRegistration {
    /// Keeps `node`, an ephemeral node of `session`.
    pub fn new(session: Session, node: String) -> Self {
        KeptRegistration { session, node }
    }

    /// The session the registration is on now.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The session, for closing it.
    pub fn into_session(self) -> Session {
        self.session
    }

    /// Our node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Keeps the registration until it is known to be gone, and says why
    /// (see the type's guarantees). Cancel-safe: dropped at any await, the
    /// keeper still holds the newest session it made.
    pub async fn keep(&mut self) -> LossReason {
        loop {
            // Set before the check, so no change after it is missed.
            let mut states = self.session.watch_state();
            let watch = match self.reachable(true).await {
                Ok(Some(watch)) => watch,
                Ok(None) => continue,
                Err(reason) => return reason,
            };
            tokio::select! {
                event = watch.changed() => {
                    if event.event_type == zk::EventType::NodeDeleted {
                        warn!(node = %self.node, "our registration was deleted by someone else");
                        return LossReason::Revoked;
                    }
                    // A session event or a data change: look again.
                }
                _ = states.changed() => {}
            }
        }
    }

    /// Waits until our session is connected again (resumed: only the
    /// server knows whether it expired) and our node is confirmed there.
    /// However long ZooKeeper is away; `Err` only when the registration is
    /// known gone: the server says our session expired, or our node was
    /// deleted by someone else. For work watching something else with the
    /// session, which failed for want of ZooKeeper
    /// ([`for_want_of_zookeeper`]).
    pub async fn back(&mut self) -> std::result::Result<(), LossReason> {
        self.reachable(true).await.map(|_| ())
    }

    /// Waits until our session is connected again (resumed, or a new one)
    /// and, with `registered`, our node confirmed there (made again on a
    /// new session), returning a watch of it. Without, the node is not
    /// looked at (we are leaving: it may be gone by our own hand) and
    /// never made again. However long ZooKeeper is away, logging while it
    /// is; `Err` only when the registration is known gone.
    async fn reachable(
        &mut self,
        registered: bool,
    ) -> std::result::Result<Option<zk::OneshotWatcher>, LossReason> {
        let mut unreachable_since: Option<Instant> = None;
        loop {
            let mut states = self.session.watch_state();
            match states.current() {
                SessionState::Closed => return Err(LossReason::SessionClosed),
                SessionState::AuthFailed => return Err(LossReason::AuthFailed),
                SessionState::Expired => {
                    let since = *unreachable_since.get_or_insert_with(Instant::now);
                    self.come_back(since, registered).await?;
                }
                SessionState::Connected if !registered => return Ok(None),
                SessionState::Connected => match self.watch_node().await {
                    Ok(Some(watch)) => {
                        if let Some(since) = unreachable_since {
                            info!(node = %self.node, after = ?since.elapsed(), "ZooKeeper is back; our registration is there");
                        }
                        return Ok(Some(watch));
                    }
                    Ok(None) => {
                        warn!(node = %self.node, "our registration is gone, and our session is not: deleted by someone else");
                        return Err(LossReason::Revoked);
                    }
                    // The connection dropped under the check: the state
                    // says what next.
                    Err(e) => {
                        debug!(node = %self.node, error = %e, "could not check our registration");
                        if is_connection_loss(&e) && states.current() == SessionState::Connected {
                            let _ =
                                tokio::time::timeout(Duration::from_millis(200), states.changed())
                                    .await;
                        } else if !is_connection_loss(&e) {
                            // Not the connection (an ACL, say): look again
                            // shortly, the work going on meanwhile.
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                },
                SessionState::Disconnected => {
                    let since = *unreachable_since.get_or_insert_with(Instant::now);
                    warn!(node = %self.node, "ZooKeeper unreachable: the work goes on, and our registration is kept");
                    let ticker = async {
                        let mut next = since + PROGRESS_EVERY;
                        loop {
                            tokio::time::sleep_until(next).await;
                            warn!(node = %self.node, waited = ?since.elapsed(), "ZooKeeper still unreachable: the work goes on");
                            next += PROGRESS_EVERY;
                        }
                    };
                    tokio::select! {
                        _ = states.changed() => {}
                        () = ticker => {}
                    }
                }
            }
        }
    }

    /// Our node is there: `Some` watch of it, set by a check the leader
    /// orders (a `sync` first: a resumed session may have reached a server
    /// behind the others); `None` when it is not there.
    async fn watch_node(&self) -> std::result::Result<Option<zk::OneshotWatcher>, zk::Error> {
        let client = self.session.client();
        let sync = client.sync(&self.node);
        let check = client.check_and_watch_stat(&self.node);
        sync.await?;
        let (stat, watcher) = check.await?;
        Ok(stat.map(|_| watcher))
    }

    /// The client gave our session up: resumes it once a server answers,
    /// or, when the server says it expired, makes a new session (with
    /// `registered`, our registration made again on it). Tries until one
    /// of those works; `Err` only when the registration is known gone.
    async fn come_back(
        &mut self,
        since: Instant,
        registered: bool,
    ) -> std::result::Result<(), LossReason> {
        let mut last_said = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.session.resume().await {
                Ok(resumed) => {
                    self.session = resumed;
                    return Ok(());
                }
                Err(ZkError::SessionExpired) if registered => {
                    warn!(node = %self.node, waited = ?since.elapsed(), "our ZooKeeper session expired while we were cut off, our registration with it: the peers may have counted us as gone");
                    return Err(LossReason::SessionExpired);
                }
                Err(ZkError::SessionExpired) => {
                    info!(node = %self.node, waited = ?since.elapsed(), "our ZooKeeper session expired while we were cut off (we were leaving): going on with a new one");
                    return self.register_again(since).await;
                }
                Err(ZkError::AuthFailed) => return Err(LossReason::AuthFailed),
                Err(e) => {
                    if last_said.elapsed() >= PROGRESS_EVERY {
                        warn!(node = %self.node, waited = ?since.elapsed(), error = %e, "ZooKeeper still unreachable: the work goes on");
                        last_said = Instant::now();
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Makes a new session (the old one expired while we were leaving), to
    /// go on leaving with: our registration is not made again.
    async fn register_again(&mut self, since: Instant) -> std::result::Result<(), LossReason> {
        let mut last_said = Instant::now();
        loop {
            match self.fresh_session().await {
                Ok(session) => {
                    self.session = session;
                    info!(node = %self.node, after = ?since.elapsed(), "a new session, to go on leaving");
                    return Ok(());
                }
                Err(Gone(reason)) => return Err(reason),
                Err(Retry(e)) => {
                    if last_said.elapsed() >= PROGRESS_EVERY {
                        warn!(node = %self.node, waited = ?since.elapsed(), error = %e, "could not make a new session yet");
                        last_said = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    async fn fresh_session(&self) -> std::result::Result<Session, Again> {
        self.session.reconnect().await.map_err(|e| match e {
            ZkError::AuthFailed => Gone(LossReason::AuthFailed),
            e => Retry(e),
        })
    }
}

/// Why making a new session did not work.
enum Again {
    /// Known gone: stop keeping it.
    Gone(LossReason),
    /// Not yet (ZooKeeper unreachable, say): try again.
    Retry(ZkError),
}
use Again::{Gone, Retry};

/// Runs `work` (something that needs ZooKeeper, such as leaving the
/// barrier) on the kept registration's session, as often as it takes: a
/// failure because ZooKeeper was unreachable, or the session was given up
/// or expired, waits until the session is connected again (resumed, or a new one)
/// and tries again. Other failures are returned; so is the registration's
/// loss, as [`ZkError::SessionExpired`] or [`ZkError::Deleted`].
pub async fn when_reachable<T>(
    kept: &mut KeptRegistration,
    mut work: impl AsyncFnMut(&Session) -> Result<T>,
) -> Result<T> {
    loop {
        match work(kept.session()).await {
            Ok(done) => return Ok(done),
            Err(e) if for_want_of_zookeeper(&e) => {
                warn!(node = %kept.node, error = %e, "ZooKeeper is needed now and unreachable: waiting for it");
                if let Err(reason) = kept.reachable(false).await {
                    return Err(match reason {
                        LossReason::Revoked => ZkError::Deleted {
                            path: kept.node.clone(),
                        },
                        LossReason::AuthFailed => ZkError::AuthFailed,
                        LossReason::SessionClosed => ZkError::SessionClosed,
                        LossReason::SessionExpired | LossReason::PresumedExpired => {
                            ZkError::SessionExpired
                        }
                    });
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether `error` says only that ZooKeeper could not be reached (or our
/// session was lost with it): worth trying again once it is back.
pub fn for_want_of_zookeeper(error: &ZkError) -> bool {
    match error {
        ZkError::Unreachable { .. } | ZkError::SessionExpired => true,
        ZkError::Zk { source, .. } => is_connection_loss(source),
        _ => false,
    }
}
