//! ZooKeeper's double barrier: start together once `x` participants have
//! entered, finish together once all have left.
//!
//! Layout (compatible with Curator's DistributedDoubleBarrier): the barrier
//! node holds one child per participant, named by its id, and `ready`,
//! made by the participant whose arrival completes the count. Every waiter
//! watches `ready` (and the barrier node, to learn that the barrier failed
//! or was deleted); nobody polls.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};
use zookeeper_client as zk;

use super::error::{within, Result, ZkError, CONTENDED_ATTEMPTS};
use super::guard::NodeGuard;
use super::path;
use super::session::{is_connection_loss, Session, SessionState};

/// The name of the child made when the barrier opens.
pub const READY: &str = "ready";

/// The data of a barrier node (JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BarrierData {
    /// How many participants open the barrier (x).
    pub participants: u32,
    /// The owning resource's uid, which tells a barrier from an earlier one
    /// of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Set by the owner when the barrier failed (for example `TimedOut`):
    /// waiters stop with [`ZkError::BarrierFailed`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// The run the barrier belongs to (opaque here; zkgate's controller
    /// writes the uid of the Job it made the barrier for, and `""` for a
    /// barrier of no run). `None`: the barrier does not say (made before
    /// runs were recorded; its owner writes it). See [`BarrierData::admits`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// A barrier in rounds (see [`super::GangBarrier`]): the current round.
    /// `None`: a plain double barrier, entered at this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    /// A barrier in rounds: how many rounds may follow the first; past
    /// them the barrier fails. `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// A barrier in rounds: why each round so far ended, oldest first (at
    /// most [`super::rounds::MAX_ENDS_KEPT`], the latest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ends: Vec<String>,
    /// A round's node: why the round ended (its members stop, and meet
    /// again in the next round).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// A round's node: a member completed, so the round is finishing and
    /// can no longer restart.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
    /// Set by the owner while the barrier must not open even with its
    /// count reached (zkgate's controller: it starts after other barriers,
    /// `spec.after`): why. Participants keep waiting, and saying why; the
    /// owner's write that lifts it wakes them, and the arrival that sees
    /// the count then opens. A participant that knows no holds (Curator,
    /// kazoo, zkgate before 0.2) opens regardless.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// A barrier in rounds: its members' ranks order the numbers in their
    /// ids by value (`pod-2` before `pod-10`), not as text. Written by the
    /// owner when it makes the barrier, so that every member of one gang
    /// ranks alike across an upgrade: a barrier made before says nothing,
    /// and is ranked as text, as the members of then did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub numeric_ranks: bool,
}

impl BarrierData {
    /// Parses a barrier node's data; empty data (a barrier made by another
    /// client, such as Curator) gives `None`.
    pub fn parse(path: &str, data: &[u8]) -> Result<Option<BarrierData>> {
        if data.is_empty() {
            return Ok(None);
        }
        let parsed: BarrierData =
            serde_json::from_slice(data).map_err(|e| ZkError::InvalidData {
                path: path.to_owned(),
                reason: format!("not barrier JSON: {e}"),
            })?;
        if parsed.participants == 0 {
            return Err(ZkError::InvalidData {
                path: path.to_owned(),
                reason: "participants must be at least 1".into(),
            });
        }
        Ok(Some(parsed))
    }

    /// Whether a participant of run `run` may register: `Some(true)` for a
    /// barrier of that run or of none, `Some(false)` for another run's,
    /// `None` while the barrier does not say (a participant of a run waits:
    /// it could be an earlier run's, opened).
    pub fn admits(&self, run: &str) -> Option<bool> {
        self.run.as_deref().map(|r| r.is_empty() || r == run)
    }

    /// Serializes it.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The data of a participant node (JSON): who registered it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantData {
    /// The participant's id (free text: the node name for a barrier; a
    /// lock's contender node is named by the recipe, so the id is here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The pod's name (`metadata.name`), when the participant is a pod: the
    /// pod whose end the controller watches. Not the id, which may differ
    /// (`--id worker-0`, a host name cut at 63 characters, `spec.hostname`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's uid: a new pod with the same name is a different participant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// A lock holder's kill grace, in milliseconds: how long after its
    /// lease's end its command may still run (SIGTERM to SIGKILL). The
    /// controller revokes a hold only once that, and a margin, have passed
    /// (at most [`MAX_KILL_GRACE`] of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_grace_ms: Option<u64>,
    /// A member of a barrier in rounds that waits for the run marks of
    /// earlier rounds before its command starts ([`super::RunMarks`]).
    /// Members run on through a lost registration only when every member
    /// of their round does: one that does not (a zkgate from before marks,
    /// in a gang across an upgrade) could start beside them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub honours_run_marks: bool,
}

/// The longest kill grace a holder may take, and the longest the controller
/// waits for after a lease's end: more than any grace a participant can
/// use (at most 0.35 of its session timeout, which admission bounds at
/// 120 s). The holders zkgate runs refuse more
/// (a usage error), so a revocation never comes before their command is
/// dead; a foreign holder publishing more is revoked after this much.
pub const MAX_KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

impl ParticipantData {
    /// Parses a participant node's data; anything unreadable counts as
    /// anonymous (participants from other clients write what they like).
    pub fn parse(data: &[u8]) -> ParticipantData {
        serde_json::from_slice(data).unwrap_or_default()
    }
}

/// How to enter.
#[derive(Clone, Debug, Default)]
pub struct EnterOptions {
    /// Who we are, written into our node.
    pub data: ParticipantData,
    /// Register with a persistent node that outlives this process (an init
    /// container); someone else (the controller, `leave`) removes it.
    /// Default: ephemeral, held by the session.
    pub persistent: bool,
    /// When the barrier node is missing, create it with this many
    /// participants. Default: wait for its owner to create it.
    pub create_with_participants: Option<u32>,
    /// Log progress (entered k of x) this often while waiting.
    pub progress_every: Option<Duration>,
    /// Our run (see [`BarrierData::run`]): a barrier node of another run,
    /// such as an earlier run's still being replaced or a concurrent run's,
    /// is waited out as if it were missing, and never registered in, until
    /// one of ours (or of no run) is there. Default: enter any.
    pub run: Option<String>,
}

/// The outcome of a successful [`DoubleBarrier::enter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entered {
    /// Our node.
    pub node: String,
    /// The participant count that opened it.
    pub participants: u32,
    /// Whether our registration was there already (a restarted process).
    pub was_registered: bool,
    /// When the last request that showed the barrier open with our
    /// registration in it was sent (for a [`crate::zk::HoldMonitor`] of
    /// the registration).
    pub confirmed_at: Instant,
}

/// How [`DoubleBarrier::enter_unless`] ended.
#[derive(Debug)]
pub enum Entry<S> {
    /// The barrier opened with us.
    Entered(Entered),
    /// Stopped first, with what `stop` resolved to; our registration was
    /// withdrawn and nobody counted it.
    Stopped(S),
    /// Stopped, but the barrier had opened with us by then: the others
    /// count us, so the caller should leave rather than vanish.
    OpenedAsStopped(Entered, S),
    /// Stopped, but our registration could not be withdrawn in the
    /// transaction that settles it (the error says why: the session
    /// expired, the node was removed by someone else): the barrier may
    /// have opened counting it. What is left of it has been removed.
    StoppedUnsettled(S, ZkError),
}

/// How a withdrawal ended.
enum Withdrawal {
    /// Our node is gone and no opening counted it.
    Withdrawn,
    /// The barrier had opened: we are in.
    Opened,
    /// Our node went before we withdrew it (our session expired, or
    /// someone removed it): an opening may have counted it while it was
    /// there, and nothing here can tell.
    Gone,
}

/// The result of trying to open the barrier.
enum Opening {
    /// `ready` is there (we made it, or someone else did).
    Opened,
    /// The barrier node changed since our view: look again.
    Changed,
}

/// What became of an existing registration of our id.
enum Claim {
    /// It is ours (this node, by its czxid): counted once.
    Ours(i64),
    /// It was an earlier session's of the same pod, and that session has
    /// ended: register again.
    Gone,
}

/// A double barrier on one barrier node. See the module docs.
#[derive(Clone, Debug)]
pub struct DoubleBarrier {
    path: String,
}

impl DoubleBarrier {
    /// The barrier whose node is `path`.
    pub fn new(path: impl Into<String>) -> Self {
        DoubleBarrier { path: path.into() }
    }

    /// The barrier node's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Creates the barrier node (and its parents) with `data` and the
    /// session's [`Session::node_acls`]. Returns the existing node's data
    /// instead when it is already there.
    pub async fn create(
        &self,
        session: &Session,
        data: &BarrierData,
    ) -> Result<Option<BarrierData>> {
        let acls = session.node_acls().to_vec();
        self.create_with_acls(session, data, &acls).await
    }

    /// [`DoubleBarrier::create`] with the given ACL, for the barrier node
    /// and any parent it makes (the controller lets a namespace's
    /// participants read the node and add and remove children, nothing more).
    pub async fn create_with_acls(
        &self,
        session: &Session,
        data: &BarrierData,
        acls: &[zk::Acl],
    ) -> Result<Option<BarrierData>> {
        path::validate_path(&self.path)?;
        let client = session.client();
        let bytes = data.to_bytes();
        let options = zk::CreateMode::Persistent.with_acls(acls.into());
        loop {
            match session
                .retry("create", &self.path, || {
                    client.create(&self.path, &bytes, &options)
                })
                .await
            {
                Ok(_) => return Ok(None),
                Err(ZkError::Zk {
                    source: zk::Error::NodeExists,
                    ..
                }) => {
                    match session
                        .retry("read", &self.path, || client.get_data(&self.path))
                        .await
                    {
                        Ok((existing, _)) => {
                            return Ok(Some(
                                BarrierData::parse(&self.path, &existing)?.unwrap_or_default(),
                            ))
                        }
                        Err(ZkError::Zk {
                            source: zk::Error::NoNode,
                            ..
                        }) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(ZkError::Zk {
                    source: zk::Error::NoNode,
                    ..
                }) => {
                    let (parent, _) = self.path.rsplit_once('/').unwrap_or(("", ""));
                    if !parent.is_empty() {
                        match session
                            .retry("create", parent, || client.mkdir(parent, &options))
                            .await
                        {
                            Ok(())
                            | Err(ZkError::Zk {
                                source: zk::Error::NodeExists,
                                ..
                            }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Registers participant `id` and waits until x participants are there
    /// (x from the barrier node's data, or `create_with_participants` for
    /// data-less nodes). The participant whose arrival completes the count
    /// makes `ready`; everyone else wakes on it.
    ///
    /// A registration of `id` already there is ours when this session owns
    /// it or, for a persistent one, when it names the same pod uid: it is
    /// then counted once, not twice. On a timeout, an error or cancellation
    /// our registration is removed.
    ///
    /// Errors: `Timeout`, `BarrierFailed`, `Deleted` (the barrier node was
    /// deleted while we waited), `ParticipantConflict`, `NodeRemoved`,
    /// `SessionExpired`.
    pub async fn enter(
        &self,
        session: &Session,
        id: &str,
        options: &EnterOptions,
        deadline: Option<Instant>,
    ) -> Result<Entered> {
        let never = std::future::pending::<std::convert::Infallible>();
        match self
            .enter_unless(session, id, options, deadline, never)
            .await?
        {
            Entry::Entered(entered) => Ok(entered),
            Entry::Stopped(never)
            | Entry::OpenedAsStopped(_, never)
            | Entry::StoppedUnsettled(never, _) => match never {},
        }
    }

    /// [`DoubleBarrier::enter`], unless `stop` resolves first (a signal,
    /// say). A timeout or a stop withdraws our registration the same way:
    /// in one transaction that fails if the barrier has opened (then we
    /// entered, and the outcome says so) and that rewrites the barrier's
    /// data as it is, so that an opening that counted us and has not
    /// committed yet fails its version check and counts again. Never is a
    /// participant told it timed out or was stopped while the others pass
    /// counting it: when the withdrawal cannot be settled (our session
    /// expired while we were cut off, our node was removed by someone
    /// else), the outcome says the barrier may have counted us
    /// ([`ZkError::Unsettled`], [`Entry::StoppedUnsettled`]).
    pub async fn enter_unless<S>(
        &self,
        session: &Session,
        id: &str,
        options: &EnterOptions,
        deadline: Option<Instant>,
        stop: impl std::future::Future<Output = S>,
    ) -> Result<Entry<S>> {
        path::validate_path(&self.path)?;
        path::validate_name(id)?;
        if id == READY {
            return Err(ZkError::InvalidPath {
                path: id.to_owned(),
                reason: "'ready' is reserved for the barrier",
            });
        }
        let mut guard = NodeGuard::new(session);
        let outcome = tokio::select! {
            outcome = within(
                deadline,
                || format!("waiting for the barrier {} to open", self.path),
                self.enter_and_wait(session, id, options, &mut guard),
            ) => outcome.map(Entry::Entered),
            signal = stop => Ok(Entry::Stopped(signal)),
        };
        let gave_up = match outcome {
            Ok(Entry::Entered(entered)) => {
                guard.disarm();
                return Ok(Entry::Entered(entered));
            }
            Ok(Entry::Stopped(signal)) => Err(signal),
            Ok(Entry::OpenedAsStopped(entered, signal)) => {
                guard.disarm();
                return Ok(Entry::OpenedAsStopped(entered, signal));
            }
            Ok(Entry::StoppedUnsettled(signal, _)) => Err(signal),
            // The deadline may have cut off the create that opened the
            // barrier, or another participant's: the outcome is settled by
            // the server, not by our clock.
            Err(e @ ZkError::Timeout { .. }) => Ok(e),
            // A persistent registration outlives the session: it may have
            // been counted before the session ended. Settled from a new one.
            Err(e @ ZkError::SessionExpired) if options.persistent => {
                return match self.give_up_after_expiry(session, id, &mut guard).await {
                    Ok(Some(entered)) => {
                        info!(barrier = %self.path, "the barrier opened with our registration before our session expired");
                        Ok(Entry::Entered(entered))
                    }
                    Ok(None) => Err(e),
                    Err(after) => Err(after),
                };
            }
            Err(e) => {
                guard.delete_now(session).await;
                return Err(e);
            }
        };
        let settled = match self.give_up(session, id, &mut guard).await {
            Err(ZkError::SessionExpired) if options.persistent => {
                self.give_up_after_expiry(session, id, &mut guard).await
            }
            settled => settled,
        };
        let opened = match settled {
            Ok(opened) => opened,
            // Not withdrawn in the transaction that settles it (an expired
            // session took our node, or someone removed it): an opening
            // may have counted it, and the participant is told so, never
            // that nobody did.
            Err(e) => {
                warn!(barrier = %self.path, error = %e, "could not withdraw our registration in the transaction that settles it; removing what is left: the barrier may have opened counting it");
                guard.delete_now(session).await;
                return match gave_up {
                    Ok(timeout) => Err(ZkError::Unsettled {
                        path: self.path.clone(),
                        gave_up: Box::new(timeout),
                        source: Box::new(e),
                    }),
                    Err(signal) => Ok(Entry::StoppedUnsettled(signal, e)),
                };
            }
        };
        match (opened, gave_up) {
            (Some(entered), Ok(_timeout)) => {
                guard.disarm();
                info!(barrier = %self.path, "the barrier opened with us as our deadline passed");
                Ok(Entry::Entered(entered))
            }
            (Some(entered), Err(signal)) => {
                guard.disarm();
                info!(barrier = %self.path, "the barrier opened with us as we were stopped");
                Ok(Entry::OpenedAsStopped(entered, signal))
            }
            (None, Ok(timeout)) => Err(timeout),
            (None, Err(signal)) => Ok(Entry::Stopped(signal)),
        }
    }

    /// Settles a registration we give up on `session`: withdrawn unless
    /// the barrier has opened with it (then the entry, `Some`). A create
    /// whose reply we have not seen is settled first: if its node is there
    /// and ours, it may have been counted like any other. A node still of
    /// unknown outcome when this returns `Ok(None)` has been removed.
    async fn give_up(
        &self,
        session: &Session,
        id: &str,
        guard: &mut NodeGuard,
    ) -> Result<Option<Entered>> {
        guard.resolve_pending(session).await;
        match guard.armed_node() {
            Some((node, czxid)) => {
                let node = node.to_owned();
                match self.withdraw(session, &node, czxid).await? {
                    Withdrawal::Withdrawn => {
                        guard.disarm();
                        Ok(None)
                    }
                    Withdrawal::Gone => {
                        guard.disarm();
                        Err(ZkError::NodeRemoved { path: node })
                    }
                    // Open with our node in it: it may be counted, so it
                    // stays whatever settling says (never removed on an
                    // error here).
                    Withdrawal::Opened => {
                        guard.disarm();
                        self.settle(session, id, true).await
                    }
                }
            }
            // A create whose outcome we still do not know (the server could
            // not be asked): settle by looking, then remove the node if it
            // turns out to be ours.
            None => {
                let entered = self.settle(session, id, guard.is_armed()).await?;
                if entered.is_none() {
                    guard.delete_now(session).await;
                }
                Ok(entered)
            }
        }
    }

    /// [`DoubleBarrier::give_up`] for a persistent registration whose
    /// session expired, from a new session: the node outlived the session
    /// and may have been counted, so it is withdrawn the same way (never
    /// removed by itself: that would take a counted participant out of an
    /// open round). When even that cannot be done, the node is left for
    /// the controller (it goes when its pod has ended) and the error says
    /// why: removing it blindly could break the round.
    async fn give_up_after_expiry(
        &self,
        expired: &Session,
        id: &str,
        guard: &mut NodeGuard,
    ) -> Result<Option<Entered>> {
        let mut options = expired.options().clone();
        options.connect_timeout = options.connect_timeout.min(options.session_timeout * 2);
        let fresh = match Session::connect(&options).await {
            Ok(fresh) => fresh,
            Err(e) => {
                guard.disarm();
                warn!(barrier = %self.path, error = %e, "our session expired and a new one could not be made to settle our persistent registration; it stays until the controller removes it");
                return Err(e);
            }
        };
        let settled = self.give_up(&fresh, id, guard).await;
        if let Err(e) = &settled {
            warn!(barrier = %self.path, error = %e, "our session expired and our persistent registration could not be settled from a new one; it stays until the controller removes it");
        }
        guard.disarm();
        let _ = fresh.close().await;
        settled
    }

    /// Removes our registration `node` unless the barrier has opened, in one
    /// transaction: the barrier's data rewritten as it is (at the version
    /// read: an opening decided on that version fails), `ready` made and
    /// removed (fails when the barrier has opened), our node removed.
    /// Waiters see the data change before the transient `ready` (see
    /// `enter_and_wait`), so they look again rather than pass.
    ///
    /// With `czxid`, only the node made by that transaction is ours: a node
    /// there now made later (a new pod's, after ours was removed) is left
    /// alone. Our node gone before our transaction landed is
    /// [`Withdrawal::Gone`]: it may have been counted while it was there.
    async fn withdraw(
        &self,
        session: &Session,
        node: &str,
        czxid: Option<i64>,
    ) -> Result<Withdrawal> {
        let client = session.client();
        let ready = path::join(&self.path, READY);
        let ready_acls = session.ready_acls();
        let ready_options = zk::CreateMode::Persistent.with_acls((&ready_acls[..]).into());
        // Whether a transaction of ours was sent and its outcome not seen
        // (the connection was lost): our node found gone since is then
        // taken for that transaction's doing.
        let mut sent = false;
        let gone = |sent: bool| {
            if sent {
                Withdrawal::Withdrawn
            } else {
                Withdrawal::Gone
            }
        };
        loop {
            // One round trip, in this order on the server: with `czxid`, a
            // sync (as the leader has it: a new session's server may be a
            // follower behind our node's create), then the barrier's data,
            // then our node. The barrier is read first because the
            // controller removes a registration in a transaction that moves
            // the barrier's version: a removal after our read fails our
            // transaction below (we read again), and one before it shows
            // here, our node gone or another's of its name (a new pod's,
            // left alone). Read the other way round, a removal and a new
            // node in between went unseen: all are at version 0.
            let (barrier, ours) = session
                .retry("read", &self.path, || async {
                    let sync = czxid.map(|_| client.sync(node));
                    let barrier = client.get_data(&self.path);
                    let ours = czxid.map(|_| client.check_stat(node));
                    if let Some(sync) = sync {
                        sync.await?;
                    }
                    let barrier = match barrier.await {
                        Err(zk::Error::NoNode) => None,
                        found => Some(found?),
                    };
                    let ours = match ours {
                        Some(stat) => Some(stat.await?),
                        None => None,
                    };
                    Ok::<_, zk::Error>((barrier, ours))
                })
                .await?;
            let node_version = match (czxid, ours) {
                (None, _) => None,
                (Some(czxid), Some(Some(stat))) if stat.czxid == czxid => Some(stat.version),
                (Some(_), _) => return Ok(gone(sent)),
            };
            // The barrier is gone: nothing of ours can be counted any more.
            let Some((data, stat)) = barrier else {
                return Ok(Withdrawal::Withdrawn);
            };
            let mut writer = client.new_multi_writer();
            writer
                .add_set_data(&self.path, &data, Some(stat.version))
                .and_then(|()| writer.add_create(&ready, &[], &ready_options))
                .and_then(|()| writer.add_delete(&ready, None))
                .and_then(|()| writer.add_delete(node, node_version))
                .map_err(|e| ZkError::from_client("withdraw", node, e))?;
            match writer.commit().await {
                Ok(_) => {
                    debug!(%node, "withdrew our registration");
                    return Ok(Withdrawal::Withdrawn);
                }
                Err(zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NodeExists,
                }) => return Ok(Withdrawal::Opened),
                // Changed since we read it: read again.
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::BadVersion,
                }) => continue,
                // The barrier node's ACL predates participants' WRITE (a
                // controller not yet upgraded): withdraw without the
                // version bump, which still settles "already opened".
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NoAuth,
                }) => return self.withdraw_unversioned(session, node, node_version).await,
                // The barrier is gone: nothing of ours can be counted any
                // more (the others are told it was deleted).
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NoNode,
                }) => return Ok(Withdrawal::Withdrawn),
                // Our node is gone: removed by our own transaction whose
                // reply was lost, or by someone else.
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::NoNode,
                    ..
                }) => return Ok(gone(sent)),
                Err(e) => {
                    let e = zk::Error::from(e);
                    if is_connection_loss(&e) {
                        sent = true;
                        session.await_connected().await?;
                        continue;
                    }
                    return Err(ZkError::from_client("withdraw", node, e));
                }
            }
        }
    }

    /// After a deadline: whether the barrier is open with our registration
    /// in it (our node is the one we made or claimed, so `registered`
    /// tells it is ours). An error when the server could not be asked.
    async fn settle(
        &self,
        session: &Session,
        id: &str,
        registered: bool,
    ) -> Result<Option<Entered>> {
        if !registered {
            return Ok(None);
        }
        let client = session.client();
        let node = path::join(&self.path, id);
        let ready = path::join(&self.path, READY);
        let sent = Instant::now();
        let looked = session
            .retry("check", &ready, || async {
                let ready_f = client.check_stat(&ready);
                let ours_f = client.check_stat(&node);
                let data_f = client.get_data(&self.path);
                Ok((ready_f.await?, ours_f.await?, data_f.await?))
            })
            .await;
        let (ready, ours, data) = match looked {
            Ok(found) => found,
            // The barrier is gone: nothing can have opened with us.
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if ready.is_none() || ours.is_none() {
            return Ok(None);
        }
        let participants = BarrierData::parse(&self.path, &data.0)
            .ok()
            .flatten()
            .map(|b| b.participants)
            .unwrap_or_default();
        Ok(Some(Entered {
            node,
            participants,
            was_registered: false,
            confirmed_at: sent,
        }))
    }

    /// The barrier node's data as it is now: `None` when the node is
    /// missing or has no data.
    pub async fn data_if_there(&self, session: &Session) -> Result<Option<BarrierData>> {
        path::validate_path(&self.path)?;
        let client = session.client();
        match session
            .retry("read", &self.path, || client.get_data(&self.path))
            .await
        {
            Ok((data, _)) => BarrierData::parse(&self.path, &data),
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits until the barrier node is there (and, with `run`, of that run
    /// or of none: see [`EnterOptions::run`]) and returns its data: `None`
    /// for a node without data (made by another client). A participant
    /// reads it to learn how to enter (a barrier in rounds, say).
    pub async fn data_when_there(
        &self,
        session: &Session,
        run: Option<&str>,
    ) -> Result<Option<BarrierData>> {
        path::validate_path(&self.path)?;
        let client = session.client();
        loop {
            match run {
                Some(run) => _ = self.await_run(session, run).await?,
                None => session.await_node(&self.path).await?,
            }
            match session
                .retry("read", &self.path, || client.get_data(&self.path))
                .await
            {
                Ok((data, _)) => {
                    let found = BarrierData::parse(&self.path, &data)?;
                    // Replaced by another run's since the wait: wait again.
                    match (run, &found) {
                        (Some(run), Some(d)) if d.admits(run) != Some(true) => continue,
                        _ => return Ok(found),
                    }
                }
                // Deleted since: wait again.
                Err(ZkError::Zk {
                    source: zk::Error::NoNode,
                    ..
                }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until the barrier node is there and of `run` (or of no run),
    /// on watches: every wake-up looks again. Returns the node's czxid.
    async fn await_run(&self, session: &Session, run: &str) -> Result<i64> {
        let client = session.client();
        let mut told = false;
        loop {
            let (data, czxid, watcher) = match session
                .retry("read", &self.path, || client.get_and_watch_data(&self.path))
                .await
            {
                Ok((data, stat, watcher)) => (data, stat.czxid, watcher),
                Err(ZkError::Zk {
                    source: zk::Error::NoNode,
                    ..
                }) => {
                    session.await_node(&self.path).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let found = BarrierData::parse(&self.path, &data)?;
            // A node without data (made by another client) has no run.
            if found.as_ref().is_none_or(|d| d.admits(run) == Some(true)) {
                session.retire_watch(watcher.changed());
                return Ok(czxid);
            }
            if !told {
                let other = found
                    .and_then(|d| d.run)
                    .unwrap_or_else(|| "not recorded yet".to_owned());
                info!(barrier = %self.path, %run, %other, "the barrier is another run's (or does not say): waiting for this run's");
                told = true;
            }
            let event = watcher.changed().await;
            if event.event_type == zk::EventType::Session {
                if let Some(err) = SessionState::from_client(event.session_state).terminal_error() {
                    return Err(err);
                }
            }
        }
    }

    /// The czxid of the barrier node if it is there and admits `run`.
    async fn node_of_run(&self, session: &Session, run: &str) -> Result<Option<i64>> {
        let client = session.client();
        match session
            .retry("read", &self.path, || client.get_data(&self.path))
            .await
        {
            Ok((data, stat)) => {
                let found = BarrierData::parse(&self.path, &data)?;
                Ok(found
                    .as_ref()
                    .is_none_or(|d| d.admits(run) == Some(true))
                    .then_some(stat.czxid))
            }
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn enter_and_wait(
        &self,
        session: &Session,
        id: &str,
        options: &EnterOptions,
        guard: &mut NodeGuard,
    ) -> Result<Entered> {
        let client = session.client();
        let node = path::join(&self.path, id);
        let ready = path::join(&self.path, READY);
        let our_data = serde_json::to_vec(&options.data).unwrap_or_default();
        let mode = if options.persistent {
            zk::CreateMode::Persistent
        } else {
            zk::CreateMode::Ephemeral
        };
        let create_options = mode.with_acls(session.node_acls());
        let mut was_registered = false;
        // Whether our registration is known to be there. A create whose
        // outcome was lost with the connection is not: the next round sends
        // it again (and claims the node if the first one was applied), while
        // the guard keeps it pending for clean-up meanwhile.
        let mut registered = false;
        let mut last_progress = Instant::now();
        let mut last_count = None;
        // The barrier node our run's check approved (its czxid): a create
        // sent in the same round trip may land in a node made since.
        let mut run_czxid = None;
        loop {
            // Before anything of ours is there: one more round trip for a
            // participant of a run, so that it never registers in a barrier
            // of another run (its count would open that run's gang).
            if let (false, Some(run)) = (registered, &options.run) {
                run_czxid = Some(self.await_run(session, run).await?);
            }
            // One round trip: the barrier's data (and a watch on it), a watch
            // on `ready`, our registration, then whether it is there and how
            // many children the barrier has, in that order on the server.
            // Counted from the barrier's stat, not by listing: N arrivals
            // listing N children each is quadratic in what the server sends
            // (87 MB for a gang of 5,000). The count is read after our
            // create, so the last of any arrivals sees all of them.
            let sent = Instant::now();
            let barrier_f = client.get_and_watch_data(&self.path);
            let ready_f = client.check_and_watch_stat(&ready);
            let create_f = (!registered).then(|| {
                // Ours to remove from the moment it is sent (if it turns out
                // to be ours: someone else may hold the name).
                guard.arm_pending(&node, &our_data);
                client.create(&node, &our_data, &create_options)
            });
            let ours_f = client.check_stat(&node);
            let count_f = client.check_stat(&self.path);

            let (barrier, version, barrier_watch) = match barrier_f.await {
                Ok((data, stat, watcher)) => {
                    let barrier = BarrierData::parse(&self.path, &data)?;
                    // Its rounds are barriers of their own (our create, if
                    // sent, is removed on the way out).
                    if barrier.as_ref().is_some_and(|b| b.round.is_some()) {
                        return Err(ZkError::InRounds {
                            path: self.path.clone(),
                        });
                    }
                    (barrier, stat.version, watcher)
                }
                Err(zk::Error::NoNode) => {
                    match create_f {
                        // Registered in an earlier round: the barrier went.
                        None => {
                            return Err(ZkError::Deleted {
                                path: self.path.clone(),
                            })
                        }
                        // Sent with the barrier missing: it fails, unless
                        // the barrier was made in between. Settle which.
                        Some(create_f) => match create_f.await {
                            Ok((stat, _)) => {
                                guard.arm_created(node.clone(), stat.czxid);
                                registered = true;
                                // In a node no run check has seen.
                                run_czxid = None;
                                continue;
                            }
                            Err(e) if is_connection_loss(&e) => {
                                session.await_connected().await?;
                                continue;
                            }
                            Err(_) => guard.disarm(),
                        },
                    }
                    match options.create_with_participants {
                        Some(participants) => {
                            let data = BarrierData {
                                participants,
                                // Says its run, or that it has none.
                                run: Some(options.run.clone().unwrap_or_default()),
                                ..BarrierData::default()
                            };
                            self.create(session, &data).await?;
                        }
                        None => session.await_node(&self.path).await?,
                    }
                    continue;
                }
                Err(e) if is_connection_loss(&e) => {
                    session.await_connected().await?;
                    continue;
                }
                Err(e) => return Err(ZkError::from_client("read", &self.path, e)),
            };
            // Of another run now: ours was deleted and replaced since we
            // looked (our registration, if made, is removed on the way out).
            if let (Some(ours), Some(barrier)) = (&options.run, &barrier) {
                if barrier.admits(ours) == Some(false) {
                    return Err(ZkError::Deleted {
                        path: self.path.clone(),
                    });
                }
            }
            // Checked after `ready`: a barrier that opened stays open, even if
            // its owner marked it failed a moment later (a timeout racing the
            // last arrival); every participant then sees the same outcome.
            let failed = barrier.as_ref().and_then(|b| b.failed.clone());
            let participants = match (
                barrier.as_ref().map(|b| b.participants),
                options.create_with_participants,
            ) {
                (Some(x), _) | (None, Some(x)) => x,
                (None, None) => {
                    return Err(ZkError::InvalidData {
                        path: self.path.clone(),
                        reason: "the barrier node has no participant count; give one".into(),
                    })
                }
            };
            if let Some(create_f) = create_f {
                match create_f.await {
                    Ok((stat, _)) => {
                        debug!(%node, "registered");
                        guard.arm_created(node.clone(), stat.czxid);
                        registered = true;
                    }
                    Err(zk::Error::NodeExists) => {
                        // Not known to be ours until claimed.
                        guard.disarm();
                        match self.claim_existing(session, id, &node, options).await? {
                            Claim::Ours(czxid) => {
                                was_registered = true;
                                guard.arm_created(node.clone(), czxid);
                                registered = true;
                            }
                            Claim::Gone => continue,
                        }
                    }
                    Err(e) if is_connection_loss(&e) => {
                        // Whether the create was applied is settled by the
                        // next round: NodeExists with our session as owner.
                        // The guard stays pending until then.
                        session.await_connected().await?;
                        continue;
                    }
                    Err(zk::Error::NoNode) => {
                        guard.disarm();
                        continue;
                    }
                    Err(e) => return Err(ZkError::from_client("create", &node, e)),
                }
            }
            let (ready_stat, ready_watch) = match ready_f.await {
                Ok(v) => v,
                Err(e) if is_connection_loss(&e) => {
                    session.await_connected().await?;
                    continue;
                }
                Err(e) => return Err(ZkError::from_client("watch", &ready, e)),
            };
            let entered = Entered {
                node: node.clone(),
                participants,
                was_registered,
                confirmed_at: sent,
            };
            if ready_stat.is_some() {
                session.retire_watch(barrier_watch.changed());
                session.retire_watch(ready_watch.changed());
                return Ok(entered);
            }
            if let Some(reason) = failed {
                return Err(ZkError::BarrierFailed {
                    path: self.path.clone(),
                    reason,
                });
            }
            let (ours, barrier_stat) = match (ours_f.await, count_f.await) {
                (Ok(ours), Ok(barrier_stat)) => (ours, barrier_stat),
                (Err(e), _) | (_, Err(e)) if is_connection_loss(&e) => {
                    session.await_connected().await?;
                    continue;
                }
                (Err(e), _) => return Err(ZkError::from_client("check", &node, e)),
                (_, Err(e)) => return Err(ZkError::from_client("check", &self.path, e)),
            };
            if ours.is_none() {
                return Err(ZkError::NodeRemoved { path: node.clone() });
            }
            let Some(barrier_stat) = barrier_stat else {
                return Err(ZkError::Deleted {
                    path: self.path.clone(),
                });
            };
            if let Some(run) = &options.run {
                if run_czxid != Some(barrier_stat.czxid) {
                    // Our create went to a node other than the one our run's
                    // check approved (made since): it stands only if that
                    // node is our run's too. Otherwise ours went, and our
                    // node is removed on the way out. (Until then, for one
                    // round trip, another run's count may include it.)
                    match self.node_of_run(session, run).await? {
                        Some(czxid) if czxid == barrier_stat.czxid => run_czxid = Some(czxid),
                        _ => {
                            return Err(ZkError::Deleted {
                                path: self.path.clone(),
                            })
                        }
                    }
                }
            }
            // Every child but `ready` is a participant. `ready` was absent
            // earlier in this round; made since, it is counted here, and
            // opening then finds it there (which is the outcome anyway).
            let count = barrier_stat.num_children.max(0) as usize;
            // Held by its owner: not opened, whatever the count (the
            // opening's version check makes a hold set since our read
            // refuse it too).
            let held = barrier.as_ref().and_then(|b| b.held.clone());
            if count >= participants as usize && held.is_none() {
                // Ours is the arrival that completes the count, as far as
                // this round's view goes: open only if the barrier node is
                // still as we read it (not failed, x not raised since).
                let opening = Instant::now();
                match self.open(session, version).await? {
                    Opening::Opened => {
                        session.retire_watch(barrier_watch.changed());
                        session.retire_watch(ready_watch.changed());
                        info!(barrier = %self.path, participants, "barrier opened");
                        return Ok(Entered {
                            confirmed_at: opening,
                            ..entered
                        });
                    }
                    Opening::Changed => continue,
                }
            }
            let seen = Some((count, held));
            if last_count != seen
                || options
                    .progress_every
                    .is_some_and(|every| last_progress.elapsed() >= every)
            {
                // The sentence the Barrier's status carries (its Ready
                // condition), so a log and `kubectl describe` read alike.
                match seen.as_ref().and_then(|(_, held)| held.as_deref()) {
                    Some(why) => {
                        info!(barrier = %self.path, entered = count, of = participants, held = %why, "{count} of {participants} participants entered; held: {why}")
                    }
                    None => {
                        info!(barrier = %self.path, entered = count, of = participants, "{count} of {participants} participants entered")
                    }
                }
                last_count = seen;
                last_progress = Instant::now();
            }
            let progress = async {
                match options.progress_every {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            let mut barrier_changed = Box::pin(barrier_watch.changed());
            tokio::select! {
                // The barrier's watch first: see below.
                biased;
                event = &mut barrier_changed => check_event(&event)?,
                event = ready_watch.changed() => {
                    check_event(&event)?;
                    if event.event_type == zk::EventType::NodeCreated {
                        // `ready` was made. A fail or a change of x also
                        // makes `ready` (and deletes it, in the transaction
                        // that asserts the barrier had not opened), but
                        // always after rewriting the barrier's data in that
                        // same transaction (`update_unopened`). Both watches
                        // were set in one round, the barrier's first, so the
                        // server sent that data change's notification before
                        // this one, and the client hands notifications over
                        // in the order they came: had the barrier changed,
                        // its watch would have fired and been taken above.
                        // So this is an opening, known without a read (a
                        // read by each of N waiters is what bounded the
                        // release of a large barrier). Nor a removal of
                        // the barrier's watch, sent by every waiter at once.
                        session.stats().record_wakeup();
                        session.retire_watch(barrier_changed);
                        // `confirmed_at` is when this round was sent. A
                        // wait long past it (rounds are sent again only for
                        // progress) would start a registration monitor with
                        // its deadline gone; confirm afresh then (a sync and
                        // a read of our node, sent together: the leader
                        // orders them). A quick opening costs no request.
                        if sent.elapsed() > session.timeout() / 4 {
                            let at = Instant::now();
                            let sync_f = client.sync(&node);
                            let ours_f = client.check_stat(&node);
                            match (sync_f.await, ours_f.await) {
                                (Ok(_), Ok(Some(_))) => {
                                    return Ok(Entered {
                                        confirmed_at: at,
                                        ..entered
                                    })
                                }
                                (Ok(_), Ok(None)) => {
                                    return Err(ZkError::NodeRemoved { path: node.clone() })
                                }
                                // A new round settles it (`ready` is there).
                                (Err(e), _) | (_, Err(e)) if is_connection_loss(&e) => {
                                    session.await_connected().await?;
                                    continue;
                                }
                                (Err(e), _) | (_, Err(e)) => {
                                    return Err(ZkError::from_client("check", &node, e))
                                }
                            }
                        }
                        return Ok(entered);
                    }
                }
                () = progress => continue,
            }
            session.stats().record_wakeup();
        }
    }

    /// Makes `ready` if the barrier node's data is still at `version`.
    /// The version check makes the opening conditional on the view that
    /// decided it: a barrier marked failed, or whose count was raised,
    /// since that view is not opened. A connection lost on the way is
    /// settled by looking for `ready`.
    async fn open(&self, session: &Session, version: i32) -> Result<Opening> {
        let client = session.client();
        let ready = path::join(&self.path, READY);
        let ready_acls = session.ready_acls();
        let ready_options = zk::CreateMode::Persistent.with_acls((&ready_acls[..]).into());
        let mut writer = client.new_multi_writer();
        writer
            .add_check_version(&self.path, version)
            .and_then(|()| writer.add_create(&ready, &[], &ready_options))
            .map_err(|e| ZkError::from_client("open", &self.path, e))?;
        match writer.commit().await {
            Ok(_) => Ok(Opening::Opened),
            Err(zk::MultiWriteError::OperationFailed { index: 0, source }) => match source {
                zk::Error::BadVersion => Ok(Opening::Changed),
                zk::Error::NoNode => Err(ZkError::Deleted {
                    path: self.path.clone(),
                }),
                e => Err(ZkError::from_client("open", &self.path, e)),
            },
            // Someone else opened it.
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NodeExists,
                ..
            }) => Ok(Opening::Opened),
            Err(e) => {
                let e = zk::Error::from(e);
                if !is_connection_loss(&e) {
                    return Err(ZkError::from_client("open", &self.path, e));
                }
                session.await_connected().await?;
                let open = session
                    .retry("check", &ready, || client.check_stat(&ready))
                    .await?;
                Ok(if open.is_some() {
                    Opening::Opened
                } else {
                    Opening::Changed
                })
            }
        }
    }

    /// Decides whether an existing registration of `id` is ours. A live
    /// session's registration that names our pod uid is a restarted
    /// container's predecessor (killed, its session not yet expired): wait
    /// for it to go, at most twice our session timeout, rather than report
    /// a conflict.
    async fn claim_existing(
        &self,
        session: &Session,
        id: &str,
        node: &str,
        options: &EnterOptions,
    ) -> Result<Claim> {
        let client = session.client();
        let (data, stat) = match session.retry("read", node, || client.get_data(node)).await {
            Ok(found) => found,
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => return Ok(Claim::Gone),
            Err(e) => return Err(e),
        };
        let existing = ParticipantData::parse(&data);
        let conflict = |holder: String| ZkError::ParticipantConflict {
            id: id.to_owned(),
            path: node.to_owned(),
            holder,
        };
        let same_pod = existing.pod_uid.is_some() && existing.pod_uid == options.data.pod_uid;
        if stat.ephemeral_owner == session.id() {
            debug!(%node, "found our registration from a create whose reply was lost");
            return Ok(Claim::Ours(stat.czxid));
        }
        if stat.ephemeral_owner != 0 && same_pod {
            let bound = session.timeout() * 2;
            info!(%node, session = format!("{:#x}", stat.ephemeral_owner), "an earlier container of this pod still holds our registration; waiting for its session to end");
            return match within(
                Some(Instant::now() + bound),
                || format!("waiting for the earlier registration {node} of this pod to go"),
                session.await_gone(node),
            )
            .await
            {
                Ok(()) => Ok(Claim::Gone),
                Err(ZkError::Timeout { .. }) => Err(conflict(format!(
                    "another live session ({:#x}) of this pod that did not end within {bound:?}",
                    stat.ephemeral_owner
                ))),
                Err(e) => Err(e),
            };
        }
        if stat.ephemeral_owner != 0 {
            return Err(conflict(format!(
                "another live session ({:#x})",
                stat.ephemeral_owner
            )));
        }
        if existing.pod_uid == options.data.pod_uid {
            info!(%node, "found our earlier registration; counting it once");
            return Ok(Claim::Ours(stat.czxid));
        }
        Err(conflict(format!(
            "an earlier pod (uid {}); it is removed once that pod has ended",
            existing.pod_uid.as_deref().unwrap_or("unknown")
        )))
    }

    /// Leaves: removes participant `id` and waits until every participant
    /// has left, per the recipe: the lowest participant waits for the
    /// highest to go and leaves last; every other one removes its node and
    /// waits for the lowest. Each time the node waited on goes, the
    /// children are listed again (as ZooKeeper's recipe and Curator do): a
    /// lowest participant that gave up (its deadline) does not mean that
    /// everyone has left. On a timeout, or when the future is dropped, our
    /// node is removed all the same.
    ///
    /// On a barrier no controller owns (its data names no resource uid),
    /// the last participant out removes `ready` with its own node in one
    /// transaction, so the barrier can serve another round, as in
    /// Curator's recipe: a leaver whose node is gone and who finds `ready`
    /// gone knows its round has ended, whoever has arrived since for the
    /// next one, and no `ready` outlives the last of its round.
    ///
    /// Errors: `Timeout`, `Deleted`, `SessionExpired`.
    pub async fn leave(
        &self,
        session: &Session,
        id: &str,
        deadline: Option<Instant>,
    ) -> Result<()> {
        path::validate_path(&self.path)?;
        path::validate_name(id)?;
        let node = path::join(&self.path, id);
        let mut guard = NodeGuard::new(session);
        guard.arm(node.clone());
        let outcome = within(
            deadline,
            || format!("waiting for everyone to leave the barrier {}", self.path),
            self.leave_and_wait(session, id, &node),
        )
        .await;
        if outcome.is_ok() {
            guard.disarm();
        } else {
            guard.delete_now(session).await;
        }
        outcome
    }

    async fn leave_and_wait(&self, session: &Session, id: &str, node: &str) -> Result<()> {
        let client = session.client();
        let unowned = self.is_unowned(session).await?;
        let ready = path::join(&self.path, READY);
        // Our round's `ready` (on a barrier no controller owns): the one to
        // remove if the last of the round vanished without removing it.
        let our_ready = if unowned {
            session
                .retry("check", &ready, || client.check_stat(&ready))
                .await?
                .map(|stat| stat.czxid)
        } else {
            None
        };
        loop {
            let children = match session
                .retry("list", &self.path, || client.list_children(&self.path))
                .await
            {
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
            let open = children.iter().any(|c| c == READY);
            let mut members: Vec<&String> = children.iter().filter(|c| *c != READY).collect();
            members.sort();
            let ours = members.iter().position(|m| *m == id);
            if ours.is_none() && unowned && !open {
                // The last of our round removed `ready` with its own node:
                // whoever is here now came for the next round.
                debug!(barrier = %self.path, "everyone has left");
                return Ok(());
            }
            let Some(lowest) = members.first() else {
                if open && our_ready.is_some() {
                    // Everyone has left, but the last one out (the lowest)
                    // vanished (its process died, or it gave up) without
                    // removing `ready`: remove it if it is still our
                    // round's, or the next round would open for its first
                    // arrival alone.
                    self.remove_ready_of(session, &ready, our_ready).await?;
                }
                debug!(barrier = %self.path, "everyone has left");
                return Ok(());
            };
            let watch = match ours {
                Some(0) if members.len() == 1 => {
                    if self
                        .leave_last(session, node, unowned && open, &ready)
                        .await?
                    {
                        return Ok(());
                    }
                    continue;
                }
                // The lowest leaves last: it waits for the highest.
                Some(0) => path::join(&self.path, members[members.len() - 1]),
                Some(_) => {
                    super::tree::delete_if_present(session, node).await?;
                    path::join(&self.path, lowest)
                }
                None => path::join(&self.path, lowest),
            };
            let (stat, watcher) = session
                .retry("watch", &watch, || client.check_and_watch_stat(&watch))
                .await?;
            if stat.is_some() {
                check_event(&watcher.changed().await)?;
                session.stats().record_wakeup();
            }
        }
    }

    /// Removes `ready` if it is the one made at `czxid` (a later round's
    /// is left alone; a `ready` can only be made again once this one is
    /// gone).
    async fn remove_ready_of(
        &self,
        session: &Session,
        ready: &str,
        czxid: Option<i64>,
    ) -> Result<()> {
        let client = session.client();
        let stat = session
            .retry("check", ready, || client.check_stat(ready))
            .await?;
        if stat.is_some_and(|s| Some(s.czxid) == czxid) {
            super::tree::delete_if_present(session, ready).await?;
            debug!(barrier = %self.path, "removed the ready of a round whose last participant vanished");
        }
        Ok(())
    }

    /// The last participant out removes its node, and with `reset` also
    /// `ready` in the same transaction. `false` when the state changed
    /// under us (look again).
    async fn leave_last(
        &self,
        session: &Session,
        node: &str,
        reset: bool,
        ready: &str,
    ) -> Result<bool> {
        if !reset {
            super::tree::delete_if_present(session, node).await?;
            return Ok(true);
        }
        let client = session.client();
        let mut writer = client.new_multi_writer();
        writer
            .add_delete(node, None)
            .map_err(|e| ZkError::from_client("delete", node, e))?;
        writer
            .add_delete(ready, None)
            .map_err(|e| ZkError::from_client("delete", ready, e))?;
        match writer.commit().await {
            Ok(_) => {
                debug!(barrier = %self.path, "last out: reset for the next round");
                Ok(true)
            }
            // Our node or `ready` went meanwhile: look again.
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NoNode,
                ..
            }) => Ok(false),
            Err(e) => {
                let e = zk::Error::from(e);
                if is_connection_loss(&e) {
                    // Applied or not, the next look tells.
                    session.await_connected().await?;
                    Ok(false)
                } else {
                    Err(ZkError::from_client("delete", node, e))
                }
            }
        }
    }

    /// [`DoubleBarrier::withdraw`] for a participant that may not write the
    /// barrier's data: `ready` made and removed (fails when the barrier has
    /// opened) and our node removed, in one transaction. An opening that
    /// counted us and has not landed yet is not stopped by it.
    async fn withdraw_unversioned(
        &self,
        session: &Session,
        node: &str,
        node_version: Option<i32>,
    ) -> Result<Withdrawal> {
        error!(barrier = %self.path, "this participant may not write the barrier node (its ACL predates zkgate's participant WRITE): withdrawing without moving its version, so an opening in flight that counted us can still land; upgrade the controller");
        let client = session.client();
        let ready = path::join(&self.path, READY);
        let ready_acls = session.ready_acls();
        let ready_options = zk::CreateMode::Persistent.with_acls((&ready_acls[..]).into());
        // As in `withdraw`: a node gone after a transaction of ours whose
        // outcome we did not see is taken for its doing.
        let mut sent = false;
        loop {
            let mut writer = client.new_multi_writer();
            writer
                .add_create(&ready, &[], &ready_options)
                .and_then(|()| writer.add_delete(&ready, None))
                .and_then(|()| writer.add_delete(node, node_version))
                .map_err(|e| ZkError::from_client("withdraw", node, e))?;
            return match writer.commit().await {
                Ok(_) => Ok(Withdrawal::Withdrawn),
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NodeExists,
                }) => Ok(Withdrawal::Opened),
                // The barrier is gone.
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0 | 1,
                    source: zk::Error::NoNode,
                }) => Ok(Withdrawal::Withdrawn),
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::NoNode,
                    ..
                }) if !sent => Ok(Withdrawal::Gone),
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::NoNode,
                    ..
                }) => Ok(Withdrawal::Withdrawn),
                Err(e) => {
                    let e = zk::Error::from(e);
                    if is_connection_loss(&e) {
                        sent = true;
                        session.await_connected().await?;
                        continue;
                    }
                    Err(ZkError::from_client("withdraw", node, e))
                }
            };
        }
    }

    /// Whether no controller owns the barrier (its data names no resource
    /// uid): then its participants reset it for the next round.
    async fn is_unowned(&self, session: &Session) -> Result<bool> {
        let client = session.client();
        match session
            .retry("read", &self.path, || client.get_data(&self.path))
            .await
        {
            Ok((data, _)) => {
                let barrier = BarrierData::parse(&self.path, &data).ok().flatten();
                if barrier.as_ref().is_some_and(|b| b.round.is_some()) {
                    return Err(ZkError::InRounds {
                        path: self.path.clone(),
                    });
                }
                Ok(barrier.is_none_or(|b| b.uid.is_none()))
            }
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Err(ZkError::Deleted {
                path: self.path.clone(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Lists the participants (children other than `ready`) and whether the
    /// barrier is open; `None` when the barrier node does not exist.
    pub async fn participants(&self, session: &Session) -> Result<Option<(Vec<String>, bool)>> {
        let client = session.client();
        match session
            .retry("list", &self.path, || client.list_children(&self.path))
            .await
        {
            Ok(children) => {
                let open = children.iter().any(|c| c == READY);
                Ok(Some((
                    children.into_iter().filter(|c| c != READY).collect(),
                    open,
                )))
            }
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Changes the participant count, unless the barrier has opened.
    /// Returns whether it was changed (`false`: the barrier is open, its
    /// count is settled). A participant whose view predates the change
    /// cannot open the barrier on the old count (see the module docs).
    pub async fn set_participants(&self, session: &Session, participants: u32) -> Result<bool> {
        self.update_unopened(session, |data| data.participants = participants)
            .await
    }

    /// Holds the barrier (`Some(why)`: its participants do not open it,
    /// whatever their count) or lifts its hold (`None`: the write wakes
    /// them, and the arrival that sees the count opens it), unless it has
    /// opened. Returns whether the barrier is unopened with that hold.
    pub async fn set_held(&self, session: &Session, held: Option<&str>) -> Result<bool> {
        self.update_unopened(session, |data| data.held = held.map(str::to_owned))
            .await
    }

    /// Writes `run` into the barrier's data where it names none (a node
    /// made before runs were recorded), opened or not: a participant of
    /// another run must not pass its `ready`. Returns whether it was
    /// written.
    pub async fn set_run(&self, session: &Session, run: &str) -> Result<bool> {
        let client = session.client();
        for _ in 0..CONTENDED_ATTEMPTS {
            let (data, stat) = session
                .retry("read", &self.path, || client.get_data(&self.path))
                .await?;
            let mut barrier = BarrierData::parse(&self.path, &data)?.unwrap_or_default();
            if barrier.run.is_some() {
                return Ok(false);
            }
            barrier.run = Some(run.to_owned());
            let bytes = barrier.to_bytes();
            match client
                .set_data(&self.path, &bytes, Some(stat.version))
                .await
            {
                Ok(_) => return Ok(true),
                Err(zk::Error::BadVersion) => continue,
                Err(e) if is_connection_loss(&e) => session.await_connected().await?,
                Err(e) => return Err(ZkError::from_client("write", &self.path, e)),
            }
        }
        Err(ZkError::Contended {
            op: "write",
            path: self.path.clone(),
            attempts: CONTENDED_ATTEMPTS,
        })
    }

    /// Marks the barrier failed, unless it has opened: every waiter stops
    /// with [`ZkError::BarrierFailed`] carrying `reason`. Returns whether it
    /// was marked (`false`: the barrier had opened; its outcome stands).
    pub async fn fail(&self, session: &Session, reason: &str) -> Result<bool> {
        self.update_unopened(session, |data| data.failed = Some(reason.to_owned()))
            .await
    }

    /// Rewrites the barrier's data with `change` in one transaction that
    /// also asserts `ready` is absent (it creates and deletes `ready`, which
    /// fails if it exists). The data write moves the node's version, so a
    /// participant's opening based on the old data fails its version check:
    /// either the opening or this change lands, never both. The data write
    /// must stay first in the transaction: a waiter takes a `ready` made
    /// with no barrier change notified before it for an opening.
    async fn update_unopened(
        &self,
        session: &Session,
        change: impl Fn(&mut BarrierData),
    ) -> Result<bool> {
        let client = session.client();
        let ready = path::join(&self.path, READY);
        let ready_acls = session.ready_acls();
        let ready_options = zk::CreateMode::Persistent.with_acls((&ready_acls[..]).into());
        // Bounded: a participant may rewrite the node (a withdrawal moves
        // its version), and one that does so without pause must not hold
        // the caller (the controller's reconcile) forever.
        let mut lost = 0;
        loop {
            if lost == CONTENDED_ATTEMPTS {
                return Err(ZkError::Contended {
                    op: "write",
                    path: self.path.clone(),
                    attempts: lost,
                });
            }
            let (data, stat) = session
                .retry("read", &self.path, || client.get_data(&self.path))
                .await?;
            let mut barrier = BarrierData::parse(&self.path, &data)?.unwrap_or_default();
            change(&mut barrier);
            let bytes = barrier.to_bytes();
            if bytes == data {
                // Already so: nothing to write (a write would wake every
                // watcher of the node, the controller's own among them,
                // for nothing). Unopened unless `ready` is there.
                let ready_there = session
                    .retry("read", &ready, || client.check_stat(&ready))
                    .await?
                    .is_some();
                return Ok(!ready_there);
            }
            let mut writer = client.new_multi_writer();
            writer
                .add_set_data(&self.path, &bytes, Some(stat.version))
                .and_then(|()| writer.add_create(&ready, &[], &ready_options))
                .and_then(|()| writer.add_delete(&ready, None))
                .map_err(|e| ZkError::from_client("write", &self.path, e))?;
            match writer.commit().await {
                Ok(_) => return Ok(true),
                Err(zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NodeExists,
                }) => return Ok(false),
                // Changed since we read it (or our own write landed before
                // a lost connection): read and apply again.
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::BadVersion,
                    ..
                }) => {
                    lost += 1;
                    continue;
                }
                Err(e) => {
                    let e = zk::Error::from(e);
                    if is_connection_loss(&e) {
                        session.await_connected().await?;
                        continue;
                    }
                    return Err(ZkError::from_client("write", &self.path, e));
                }
            }
        }
    }
}

/// A watch fired: fail when it reports the end of the session.
fn check_event(event: &zk::WatchedEvent) -> Result<()> {
    if event.event_type == zk::EventType::Session {
        if let Some(err) = SessionState::from_client(event.session_state).terminal_error() {
            return Err(err);
        }
    }
    Ok(())
}
