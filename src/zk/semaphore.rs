//! A counting semaphore in Apache Curator's `InterProcessSemaphoreV2`
//! layout, so that Curator clients and zkgate share the permits:
//!
//! ```text
//! <path>                      the semaphore node (its owner's, e.g. the controller's)
//!   locks/_c_<uuid>-lock-<seq>    Curator InterProcessMutex: acquirers queue here
//!   leases/_c_<uuid>-lease-<seq>  one node per permit held
//!   count                     (optional) a Curator SharedCount: the number of
//!                             permits, a 4-byte big-endian integer
//! ```
//!
//! An acquirer takes the internal mutex, so acquirers are served in arrival
//! order and only one at a time looks at the leases. Holding it, it waits
//! until the leases leave room for every permit it wants, then creates them
//! all and deletes its mutex node in one multi (the next acquirer is woken
//! the moment the leases exist). Only the mutex holder watches the
//! leases (and the count): a release wakes one waiter, not all of them.
//!
//! Taking k permits is all or nothing between zkgate clients: nobody else
//! adds a lease while we wait, and we create none until all k fit. A Curator
//! client's `acquire(qty)` takes its permits one at a time, each under its
//! own turn of the mutex, so it may hold some while waiting for the rest;
//! it never makes the total exceed the limit, but two such clients can
//! starve each other (Curator's behaviour, not changed by sharing with us).
//!
//! Curator's waiter creates its lease first and then waits for the total to
//! fit, so while a Curator client waits the leases may number one more than
//! the limit; that lease is not yet a holder.

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;
use tracing::{debug, info, trace};
use zookeeper_client as zk;

use super::contender::{ContenderKind, LEASE_MARKER, PROTECTED_PREFIX};
use super::error::{within, Result, ZkError};
use super::guard::NodeGuard;
use super::hold::{Acquired, LockHold};
use super::lock::{LockOptions, Mutex};
use super::path;
use super::session::{is_connection_loss, Session, SessionState};

/// The internal mutex's node, under the semaphore node (Curator's name).
pub const LOCKS: &str = "locks";
/// The parent of the lease nodes (Curator's name).
pub const LEASES: &str = "leases";
/// Where zkgate keeps the number of permits, as a Curator `SharedCount`.
pub const COUNT: &str = "count";

/// Resolves when a watched node may have changed.
type Changed = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send + 'static>>;

/// How often a waiter reports where it stands.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the number of permits comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Permits {
    /// A number fixed by this client (Curator's `maxLeases` constructor).
    Fixed(u32),
    /// The 4-byte big-endian integer in this node (a Curator `SharedCount`),
    /// read and watched on every round: a change takes effect for the next
    /// admission.
    Shared(String),
}

/// Encodes a number of permits as a Curator `SharedCount` stores it.
pub fn encode_count(permits: u32) -> [u8; 4] {
    (permits.min(i32::MAX as u32) as i32).to_be_bytes()
}

/// Decodes a Curator `SharedCount`'s value; `None` unless it is 4 bytes.
pub fn decode_count(data: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(data.try_into().ok()?))
}

/// A counting semaphore of N permits.
///
/// ```no_run
/// # async fn demo(session: &zkgate::zk::Session) -> Result<(), zkgate::zk::ZkError> {
/// use zkgate::zk::{LockOptions, Permits, Semaphore};
///
/// let path = "/zkgate/namespaces/default/locks/bucket";
/// let semaphore = Semaphore::new(path, Permits::Fixed(4), LockOptions::default());
/// let hold = semaphore.acquire(session, 2, None).await?;
/// println!("2 of 4 permits, fencing token {}", hold.fencing_token());
/// hold.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    path: String,
    permits: Permits,
    options: LockOptions,
}

impl Semaphore {
    /// A semaphore on the node `path` with `permits`. `options` are a
    /// lock's: the data written into our lease nodes, persistent leases,
    /// and whether to create the semaphore node when it is missing.
    pub fn new(path: impl Into<String>, permits: Permits, options: LockOptions) -> Self {
        Semaphore {
            path: path.into(),
            permits,
            options,
        }
    }

    /// The semaphore node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The parent of the lease nodes.
    pub fn leases(&self) -> String {
        path::join(&self.path, LEASES)
    }

    /// Waits until `wanted` permits are free and takes them all at once,
    /// waiting at most until `deadline` (`None`: no limit). Waiters are
    /// served in arrival order. On a timeout, an error or cancellation our
    /// nodes (the mutex's and any lease) are removed.
    ///
    /// The hold's fencing token is the czxid of its lease nodes (one multi
    /// makes them all, in one transaction); releasing it deletes them all.
    ///
    /// Errors: [`ZkError::Permits`] when `wanted` is 0 or more than the
    /// semaphore has (it could never be served and would block the queue),
    /// `Timeout`, `Deleted` (the semaphore node or its count is gone),
    /// `NodeRemoved`, `SessionExpired`.
    pub async fn acquire<'s>(
        &self,
        session: &'s Session,
        wanted: u32,
        deadline: Option<Instant>,
    ) -> Result<LockHold<'s>> {
        path::validate_path(&self.path)?;
        if wanted == 0 {
            return Err(self.refuse(0, None));
        }
        if let Permits::Fixed(n) = self.permits {
            if wanted > n {
                return Err(self.refuse(wanted, Some(n)));
            }
        }
        let started = Instant::now();
        let mut guard = NodeGuard::new(session);
        let outcome = within(
            deadline,
            || {
                format!(
                    "waiting for {wanted} permit(s) of the semaphore {}",
                    self.path
                )
            },
            self.take(session, wanted, &mut guard),
        )
        .await;
        match outcome {
            Ok(acquired) => {
                guard.disarm();
                debug!(semaphore = %self.path, wanted, token = acquired.token, waited_ms = started.elapsed().as_millis() as u64, "permits acquired");
                Ok(LockHold::new(
                    session,
                    acquired,
                    ContenderKind::Lease,
                    self.options.persistent,
                ))
            }
            Err(e) => {
                guard.delete_now(session).await;
                Err(e)
            }
        }
    }

    fn refuse(&self, wanted: u32, permits: Option<u32>) -> ZkError {
        ZkError::Permits {
            path: self.path.clone(),
            reason: match permits {
                None => "at least one permit must be asked for".to_owned(),
                Some(n) => format!("{wanted} permits asked for, but the semaphore has {n}"),
            },
        }
    }

    /// Takes the internal mutex, then the permits.
    async fn take(
        &self,
        session: &Session,
        wanted: u32,
        guard: &mut NodeGuard,
    ) -> Result<Acquired> {
        self.ensure_layout(session).await?;
        // A persistent hold outlives its process: a restarted process (an
        // init container run again) adopts its own leases.
        if self.options.persistent && !self.options.data.is_empty() {
            if let Some(adopted) = self.find_registration(session, wanted).await? {
                return Ok(adopted);
            }
        }
        let mutex = Mutex::new(
            path::join(&self.path, LOCKS),
            LockOptions {
                data: self.options.data.clone(),
                persistent: false,
                create_parent: false,
                // Its node is the first this acquirer makes: checked there.
                check: self.options.check.clone(),
            },
        );
        let turn = mutex.acquire(session, None).await?;
        let admitted = self.admit(session, wanted, guard, turn.path()).await;
        if admitted.is_ok() {
            // The multi that made our leases deleted the turn's node too.
            turn.into_registration();
        } else if let Err(e) = turn.release().await {
            // The mutex only orders the acquirers: give the turn back (if
            // this future is dropped instead, the turn's drop deletes its
            // node from a task).
            debug!(semaphore = %self.path, error = %e, "releasing the semaphore's internal mutex");
        }
        admitted
    }

    /// Makes `locks` and `leases` under the semaphore node; a missing
    /// semaphore node is made only with `create_parent`. With a check
    /// ([`LockOptions::check`]), each is made only while the checked data
    /// is as read: a contender that read an old mode leaves no semaphore
    /// under a lock that is no longer one.
    async fn ensure_layout(&self, session: &Session) -> Result<()> {
        let client = session.client();
        let dir = zk::CreateMode::Persistent.with_acls(session.node_acls());
        let check = self.options.check.as_ref();
        for child in [LOCKS, LEASES] {
            let at = path::join(&self.path, child);
            loop {
                let made = session
                    .retry("create", &at, || async {
                        let Some(check) = check else {
                            return client.create(&at, &[], &dir).await.map(|_| ());
                        };
                        let mut writer = client.new_multi_writer();
                        writer.add_check_version(&check.path, check.version)?;
                        writer.add_create(&at, &[], &dir)?;
                        match writer.commit().await {
                            Ok(_) => Ok(()),
                            Err(zk::MultiWriteError::OperationFailed { index: 0, .. }) => {
                                Err(zk::Error::BadVersion)
                            }
                            Err(zk::MultiWriteError::OperationFailed { source, .. })
                            | Err(zk::MultiWriteError::RequestFailed { source }) => Err(source),
                        }
                    })
                    .await;
                match made {
                    Err(ZkError::Zk {
                        source: zk::Error::BadVersion,
                        ..
                    }) => {
                        return Err(ZkError::Changed {
                            path: check.map_or_else(|| self.path.clone(), |c| c.path.clone()),
                        })
                    }
                    Ok(()) => break,
                    Err(ZkError::Zk {
                        source: zk::Error::NodeExists,
                        ..
                    }) => break,
                    Err(ZkError::Zk {
                        source: zk::Error::NoNode,
                        ..
                    }) if self.options.create_parent => {
                        match session
                            .retry("create", &self.path, || client.mkdir(&self.path, &dir))
                            .await
                        {
                            Ok(())
                            | Err(ZkError::Zk {
                                source: zk::Error::NodeExists,
                                ..
                            }) => continue,
                            Err(e) => return Err(e),
                        }
                    }
                    Err(ZkError::Zk {
                        source: zk::Error::NoNode,
                        ..
                    }) => {
                        return Err(ZkError::Deleted {
                            path: self.path.clone(),
                        })
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Holding the mutex: waits until `wanted` more leases fit, then makes
    /// them in one multi.
    async fn admit(
        &self,
        session: &Session,
        wanted: u32,
        guard: &mut NodeGuard,
        turn: &str,
    ) -> Result<Acquired> {
        let client = session.client();
        let leases = self.leases();
        let protection = format!("{PROTECTED_PREFIX}{}-", uuid::Uuid::new_v4());
        let prefix = path::join(&leases, &format!("{protection}{LEASE_MARKER}"));
        let mode = if self.options.persistent {
            zk::CreateMode::PersistentSequential
        } else {
            zk::CreateMode::EphemeralSequential
        };
        let create = mode.with_acls(session.node_acls());
        let mut last_progress: Option<Instant> = None;
        // The first look sets no watch: when the permits fit at once (the
        // common case), a watch would only fire on our own create, a wasted
        // notification. Once we must wait, every look sets its watches
        // before it decides, so no release can slip between them.
        let mut watching = false;
        loop {
            let listed_at = Instant::now();
            let listing = if watching {
                session
                    .retry("watch", &leases, || client.list_and_watch_children(&leases))
                    .await
                    .map(|(children, watcher)| (children, Some(watcher)))
            } else {
                session
                    .retry("list", &leases, || client.list_children(&leases))
                    .await
                    .map(|children| (children, None))
            };
            let (children, leases_changed) = match listing {
                Err(ZkError::Zk {
                    source: zk::Error::NoNode,
                    ..
                }) => {
                    return Err(ZkError::Deleted {
                        path: self.path.clone(),
                    })
                }
                other => other?,
            };
            let (permits, count_version, count_changed) =
                self.current_permits(session, watching).await?;
            if wanted > permits {
                return Err(self.refuse(wanted, Some(permits)));
            }
            let in_use = u32::try_from(children.len()).unwrap_or(u32::MAX);
            if in_use.saturating_add(wanted) <= permits {
                // From the moment the multi is sent, its nodes are ours to
                // remove, found by their protected names if the reply is lost.
                guard.arm_protected(&leases, &protection);
                match self
                    .create_leases(session, &prefix, &create, wanted, turn, count_version)
                    .await
                {
                    Ok(None) => {
                        // The limit changed since we read it: nothing was
                        // made; look again.
                        guard.disarm();
                        watching = false;
                        continue;
                    }
                    Ok(Some(mut nodes)) => {
                        let token = self.token_of(session, &nodes[0].0, nodes[0].1).await?;
                        let node = nodes.remove(0).0;
                        return Ok(Acquired {
                            node,
                            siblings: nodes.into_iter().map(|(n, _)| n).collect(),
                            token,
                            confirmed_at: listed_at,
                        });
                    }
                    Err(ZkError::Zk { source, .. }) if is_connection_loss(&source) => {
                        // One transaction: all our leases were made or none.
                        session.await_connected().await?;
                        // What the listing shows is confirmed as of its send time.
                        let listed_at = Instant::now();
                        let now = crate::zk::lock::list_synced(session, &leases).await?;
                        let mut ours: Vec<String> = now
                            .into_iter()
                            .filter(|c| c.starts_with(&protection))
                            .collect();
                        if !ours.is_empty() {
                            ours.sort();
                            debug!(semaphore = %self.path, "found the leases of a multi whose reply was lost");
                            let node = path::join(&leases, &ours.remove(0));
                            let token = self.token_of(session, &node, None).await?;
                            return Ok(Acquired {
                                node,
                                siblings: ours.iter().map(|n| path::join(&leases, n)).collect(),
                                token,
                                confirmed_at: listed_at,
                            });
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let Some(leases_changed) = leases_changed else {
                watching = true;
                continue;
            };
            if last_progress.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
                info!(semaphore = %self.path, in_use, permits, wanted, "first in line for permits");
                last_progress = Some(Instant::now());
            } else {
                trace!(semaphore = %self.path, in_use, permits, wanted, "first in line for permits");
            }
            // A release (the leases change) or a new limit (the count
            // changes) can let us through; every wake-up re-reads both.
            let event = tokio::select! {
                event = leases_changed.changed() => event,
                event = count_changed => event,
            };
            if event.event_type == zk::EventType::Session {
                if let Some(err) = SessionState::from_client(event.session_state).terminal_error() {
                    return Err(err);
                }
            }
            session.stats().record_wakeup();
            // A release woke us: most likely the permits fit now, so look
            // once more without setting a watch our own create would fire.
            watching = false;
        }
    }

    /// The number of permits now, the version of the count node it was
    /// read from (`None` for a fixed number), and a future that resolves
    /// when it may have changed (never, for a fixed number).
    async fn current_permits(
        &self,
        session: &Session,
        watch: bool,
    ) -> Result<(u32, Option<i32>, Changed)> {
        let count = match &self.permits {
            Permits::Fixed(n) => return Ok((*n, None, Box::pin(std::future::pending()))),
            Permits::Shared(count) => count,
        };
        let client = session.client();
        let read = if watch {
            session
                .retry("watch", count, || client.get_and_watch_data(count))
                .await
                .map(|(data, stat, watcher)| (data, stat, Box::pin(watcher.changed()) as Changed))
        } else {
            session
                .retry("read", count, || client.get_data(count))
                .await
                .map(|(data, stat)| (data, stat, Box::pin(std::future::pending()) as Changed))
        };
        match read {
            Ok((data, stat, changed)) => {
                let value = decode_count(&data).ok_or_else(|| ZkError::InvalidData {
                    path: count.clone(),
                    reason: format!("a SharedCount holds 4 bytes, not {}", data.len()),
                })?;
                Ok((value.max(0) as u32, Some(stat.version), changed))
            }
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Err(ZkError::Deleted {
                path: count.clone(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Creates `wanted` lease nodes and deletes our mutex node `turn` in one
    /// multi: the next acquirer is woken the moment our leases exist, one
    /// round trip sooner than with a separate delete. Their paths and stats.
    ///
    /// With a shared count, the same multi checks that the count is still
    /// at `count_version`, the version the admission read its limit from:
    /// a limit lowered in between fails the multi (`Ok(None)`, nothing
    /// made), so nobody is admitted beyond the limit in force.
    async fn create_leases(
        &self,
        session: &Session,
        prefix: &str,
        create: &zk::CreateOptions<'_>,
        wanted: u32,
        turn: &str,
        count_version: Option<i32>,
    ) -> Result<Option<Vec<(String, Option<zk::Stat>)>>> {
        let client = session.client();
        let mut writer = client.new_multi_writer();
        let checked = match (&self.permits, count_version) {
            (Permits::Shared(count), Some(version)) => {
                writer
                    .add_check_version(count, version)
                    .map_err(|e| ZkError::from_client("check", count, e))?;
                1
            }
            _ => 0,
        };
        for _ in 0..wanted {
            writer
                .add_create(prefix, &self.options.data, create)
                .map_err(|e| ZkError::from_client("create", prefix, e))?;
        }
        writer
            .add_delete(turn, None)
            .map_err(|e| ZkError::from_client("delete", turn, e))?;
        let results = match writer.commit().await {
            Ok(results) => results,
            // The limit changed since it was read.
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::BadVersion,
            }) if checked == 1 => return Ok(None),
            // Someone deleted our place in the mutex's queue.
            Err(zk::MultiWriteError::OperationFailed {
                index,
                source: zk::Error::NoNode,
            }) if index == checked + wanted as usize => {
                return Err(ZkError::NodeRemoved {
                    path: turn.to_owned(),
                })
            }
            // The count node itself is gone.
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NoNode,
            }) if checked == 1 => {
                return Err(ZkError::Deleted {
                    path: self.path.clone(),
                })
            }
            Err(e) => return Err(ZkError::from_client("create", prefix, zk::Error::from(e))),
        };
        let mut nodes: Vec<(String, Option<zk::Stat>)> = results
            .into_iter()
            .filter_map(|r| match r {
                zk::MultiWriteResult::Create { path, stat } => {
                    Some((path, (!stat.is_invalid()).then_some(stat)))
                }
                _ => None,
            })
            .collect();
        nodes.sort_by(|a, b| a.0.cmp(&b.0));
        if nodes.len() != wanted as usize {
            return Err(ZkError::InvalidData {
                path: self.leases(),
                reason: format!("a multi of {wanted} creates answered {} paths", nodes.len()),
            });
        }
        Ok(Some(nodes))
    }

    /// The czxid of a lease node (from the create's stat when the server
    /// sent a valid one).
    async fn token_of(&self, session: &Session, node: &str, stat: Option<zk::Stat>) -> Result<i64> {
        if let Some(stat) = stat {
            return Ok(stat.czxid);
        }
        let client = session.client();
        match session
            .retry("check", node, || client.check_stat(node))
            .await?
        {
            Some(stat) => Ok(stat.czxid),
            None => Err(ZkError::NodeRemoved {
                path: node.to_owned(),
            }),
        }
    }

    /// Finds `wanted` persistent leases whose data is exactly ours: a hold
    /// made earlier by the same holder.
    async fn find_registration(&self, session: &Session, wanted: u32) -> Result<Option<Acquired>> {
        let client = session.client();
        let leases = self.leases();
        let children = crate::zk::lock::list(session, &leases).await?;
        if children.is_empty() {
            return Ok(None);
        }
        let results = session
            .retry("read", &leases, || {
                let mut reader = client.new_multi_reader();
                for name in &children {
                    // The names come from the server under a valid parent.
                    let _ = reader.add_get_data(&path::join(&leases, name));
                }
                reader.commit()
            })
            .await?;
        let mut ours: Vec<(String, i64)> = children
            .iter()
            .zip(results)
            .filter_map(|(name, result)| match result {
                zk::MultiReadResult::Data { data, stat }
                    if stat.ephemeral_owner == 0 && data == self.options.data =>
                {
                    Some((path::join(&leases, name), stat.czxid))
                }
                _ => None,
            })
            .collect();
        if ours.len() != wanted as usize {
            return Ok(None);
        }
        ours.sort();
        debug!(semaphore = %self.path, "adopting our earlier leases");
        let (node, token) = ours.remove(0);
        Ok(Some(Acquired {
            node,
            siblings: ours.into_iter().map(|(n, _)| n).collect(),
            token,
            confirmed_at: Instant::now(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_curators_shared_count_bytes() {
        assert_eq!(encode_count(3), [0, 0, 0, 3]);
        assert_eq!(decode_count(&[0, 0, 1, 0]), Some(256));
        assert_eq!(decode_count(&encode_count(u32::MAX)), Some(i32::MAX));
        assert_eq!(decode_count(b"12"), None);
    }
}
