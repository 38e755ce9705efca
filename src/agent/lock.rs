//! `zkgate lock acquire | sidecar | run`.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::child::{self, Ended};
use super::exit::{AgentError, Exit};
use super::ready::{self, Readiness, ReadinessOptions};
use super::{close, Participant, Termination};
use crate::api::{LockMode, LockNodeData};
use crate::zk::{
    encode_count, leader_lag, path as zpath, within, LockHold, LockOptions, LossReason, Mutex,
    Permits, ReadWriteLock, Semaphore, Session, VersionCheck, ZkError, MAX_KILL_GRACE,
};

/// Which side of the lock to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The only holder (an `Exclusive` LockLease).
    Exclusive,
    /// A reader of a `ReadWrite` LockLease.
    Read,
    /// The writer of a `ReadWrite` LockLease.
    Write,
}

/// One participant command on one lock.
pub struct LockCommand<'a> {
    participant: &'a Participant,
    path: String,
    side: Side,
    create: bool,
    /// Permits to take from a Semaphore.
    take: u32,
    /// With `create`: make a Semaphore of this many permits.
    create_permits: Option<u32>,
}

impl<'a> LockCommand<'a> {
    /// The lock `name` in the participant's namespace. With `create`, the
    /// lock node is created when missing (no controller); without, the
    /// command waits for its owner to create it.
    pub fn new(
        participant: &'a Participant,
        name: &str,
        side: Side,
        create: bool,
    ) -> Result<Self, AgentError> {
        let path = participant
            .layout
            .lock(&participant.namespace, name)
            .map_err(|e| participant.explain(e))?;
        Ok(LockCommand {
            participant,
            path,
            side,
            create,
            take: 1,
            create_permits: None,
        })
    }

    /// Permits to take if the lock is a Semaphore (the lock node says what
    /// it is); with `create`, `create_permits` makes it one.
    pub fn permits(mut self, take: u32, create_permits: Option<u32>) -> Self {
        self.take = take;
        self.create_permits = create_permits;
        self
    }

    /// How the lock is to be taken, as its node's data says (`None`: data
    /// not written by a controller or `--create`, e.g. a lock made by
    /// Curator), and the data's version.
    async fn rules(
        &self,
        session: &Session,
    ) -> Result<(Option<LockNodeData>, zookeeper_client::Stat), ZkError> {
        let client = session.client();
        let (data, stat) = session
            .retry("read", &self.path, || client.get_data(&self.path))
            .await
            .map_err(|e| self.gone_if_missing(e))?;
        Ok((serde_json::from_slice::<LockNodeData>(&data).ok(), stat))
    }

    /// Returns once the lock node's data is no longer at `version`.
    async fn rules_changed(&self, session: &Session, version: i32) -> Result<(), ZkError> {
        let client = session.client();
        let (_, stat, watcher) = session
            .retry("watch", &self.path, || {
                client.get_and_watch_data(&self.path)
            })
            .await
            .map_err(|e| self.gone_if_missing(e))?;
        if stat.version == version {
            // Any event will do: the caller reads the node again.
            watcher.changed().await;
        }
        Ok(())
    }

    fn gone_if_missing(&self, e: ZkError) -> ZkError {
        match e {
            ZkError::Zk {
                source: zookeeper_client::Error::NoNode,
                ..
            } => ZkError::Deleted {
                path: self.path.clone(),
            },
            e => e,
        }
    }

    /// `--create`: makes the lock node unless it exists, with its mode in
    /// its data, as a controller would: a Semaphore of `permits` (with its
    /// count), else `ReadWrite` for `--read`/`--write` and `Exclusive`
    /// otherwise. Later contenders read the mode there, so a reader cannot
    /// share a lock made exclusive.
    async fn create_lock(&self, session: &Session, permits: Option<u32>) -> Result<(), ZkError> {
        let client = session.client();
        let dir = zookeeper_client::CreateMode::Persistent.with_acls(session.node_acls());
        let mode = match (permits, self.side) {
            (Some(_), _) => LockMode::Semaphore,
            (None, Side::Exclusive) => LockMode::Exclusive,
            (None, Side::Read | Side::Write) => LockMode::ReadWrite,
        };
        let data = serde_json::to_vec(&LockNodeData {
            uid: String::new(),
            mode,
            lease_ms: None,
            changing_to: None,
        })
        .unwrap_or_default();
        if let Some((parent, _)) = self.path.rsplit_once('/') {
            match session
                .retry("create", parent, || client.mkdir(parent, &dir))
                .await
            {
                Ok(())
                | Err(ZkError::Zk {
                    source: zookeeper_client::Error::NodeExists,
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut nodes = vec![(self.path.clone(), data)];
        if let Some(permits) = permits {
            let count = zpath::join(&self.path, crate::zk::COUNT);
            nodes.push((count, encode_count(permits).to_vec()));
        }
        for (at, bytes) in &nodes {
            match session
                .retry("create", at, || client.create(at, bytes, &dir))
                .await
            {
                Ok(_)
                | Err(ZkError::Zk {
                    source: zookeeper_client::Error::NodeExists,
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Queues and waits for the lock. `grace`: the kill grace of the
    /// command the hold guards, published in our node so the controller
    /// revokes only once the command is surely dead (see [`lease_ended`]).
    ///
    /// [`lease_ended`]: LockCommand::lease_ended
    async fn acquire_with<'s>(
        &self,
        session: &'s Session,
        persistent: bool,
        grace: Option<Duration>,
    ) -> Result<LockHold<'s>, AgentError> {
        let p = self.participant;
        let deadline = p.deadline();
        let data = serde_json::to_vec(&crate::zk::ParticipantData {
            kill_grace_ms: grace.map(|g| g.as_millis() as u64),
            ..p.identity()
        })
        .unwrap_or_default();
        let options = LockOptions {
            data,
            persistent,
            create_parent: self.create,
            check: None,
        };
        let attempt = async {
            if self.create {
                self.create_lock(session, self.create_permits).await?;
            } else {
                session.await_node(&self.path).await?;
            }
            loop {
                let (rules, stat) = self.rules(session).await?;
                if let Some(to) = rules.as_ref().and_then(|r| r.changing_to) {
                    // The controller is changing the mode: queueing now
                    // could be under rules about to go.
                    debug!(lock = %self.path, ?to, "the lock's mode is being changed: waiting until it is done");
                    self.rules_changed(session, stat.version).await?;
                    continue;
                }
                // Our node is made only if the rules are still these (one
                // transaction, and the same lock node: not one deleted and
                // made again), so nobody can change them under our queueing.
                let options = LockOptions {
                    check: Some(VersionCheck {
                        path: self.path.clone(),
                        version: stat.version,
                        czxid: stat.czxid,
                    }),
                    ..options.clone()
                };
                match self.queue_as(session, rules.map(|r| r.mode), options).await {
                    Err(ZkError::Changed { .. }) => {
                        debug!(lock = %self.path, "the lock's data changed as we queued: reading it again");
                    }
                    taken => return taken,
                }
            }
        };
        let hold = within(
            deadline,
            || format!("waiting for the lock {}", self.path),
            attempt,
        )
        .await;
        let hold = match hold {
            Ok(hold) => hold,
            Err(e) => {
                return Err(super::explain_missing(
                    p,
                    session,
                    &self.path,
                    "LockLease",
                    p.explain(e),
                )
                .await)
            }
        };
        info!(lock = %self.path, token = hold.fencing_token(), side = ?self.side, "lock acquired");
        Ok(hold)
    }

    /// Queues for the lock as its mode says (`None`: a lock whose data no
    /// controller wrote), refusing what the mode cannot give.
    async fn queue_as<'s>(
        &self,
        session: &'s Session,
        mode: Option<LockMode>,
        options: LockOptions,
    ) -> Result<LockHold<'s>, ZkError> {
        let refuse = |reason: String| ZkError::Permits {
            path: self.path.clone(),
            reason,
        };
        if mode == Some(LockMode::Exclusive) && self.side != Side::Exclusive {
            // Readers share: on a lock made for one holder at a time,
            // a reader would run beside another reader.
            return Err(refuse(
                "it is Exclusive (one holder at a time); --read and --write are for ReadWrite locks".to_owned(),
            ));
        }
        if mode == Some(LockMode::Semaphore) {
            if self.side != Side::Exclusive {
                return Err(refuse(
                    "it is a Semaphore; --read and --write are for ReadWrite locks".to_owned(),
                ));
            }
            // The controller makes the count just after the node: a
            // pod started with its LockLease may look in between. The
            // mode may change meanwhile (no count will come for another
            // mode): then the caller reads it again.
            let count = zpath::join(&self.path, crate::zk::COUNT);
            let read_at = options.check.as_ref().map(|c| c.version);
            tokio::select! {
                made = session.await_node(&count) => made?,
                changed = async {
                    match read_at {
                        Some(version) => self.rules_changed(session, version).await,
                        None => std::future::pending().await,
                    }
                } => {
                    changed?;
                    return Err(ZkError::Changed { path: self.path.clone() });
                }
            }
            return Semaphore::new(&self.path, Permits::Shared(count), options)
                .acquire(session, self.take, None)
                .await;
        }
        if self.take > 1 {
            return Err(refuse(format!(
                "--take {} is for Semaphore LockLeases; this one is {}",
                self.take,
                match mode {
                    Some(LockMode::ReadWrite) => "ReadWrite",
                    _ => "Exclusive",
                }
            )));
        }
        match self.side {
            Side::Exclusive => Mutex::new(&self.path, options).acquire(session, None).await,
            Side::Read => {
                ReadWriteLock::new(&self.path, options)
                    .read(session, None)
                    .await
            }
            Side::Write => {
                ReadWriteLock::new(&self.path, options)
                    .write(session, None)
                    .await
            }
        }
    }

    fn lost(&self, what: &str) -> impl Fn(crate::zk::LossReason) -> AgentError + '_ {
        let what = what.to_owned();
        move |reason| {
            AgentError::new(
                Exit::LockLost,
                format!(
                    "lost the lock {}: {reason}{what} (servers {})",
                    self.path,
                    self.participant.connect_string()
                ),
            )
        }
    }

    fn waiting(&self) -> String {
        format!("waiting for the lock {}", self.path)
    }

    /// The lease the lock node names now (`None`: no lease), and a watch
    /// on the node's next change.
    async fn read_lease(
        &self,
        session: &Session,
    ) -> Result<(Option<Duration>, zookeeper_client::OneshotWatcher), zookeeper_client::Error> {
        let (data, _, watch) = session.client().get_and_watch_data(&self.path).await?;
        let lease = serde_json::from_slice::<LockNodeData>(&data)
            .ok()
            .and_then(|d| d.lease_ms)
            .map(Duration::from_millis);
        Ok((lease, watch))
    }

    /// Resolves, with the lease, once the hold has lasted the lease its
    /// lock node names (the LockLease's `leaseDuration`, followed as it
    /// changes), measured on our own monotonic clock from `held_since`;
    /// never while the node names none. `end` always holds the current
    /// lease's end. The controller revokes a hold only after its lease,
    /// the kill grace its holder published and a margin: a command stopped
    /// here is dead before the next holder can start, whatever it does
    /// with SIGTERM. Only the clocks' rates must agree; their offsets do
    /// not matter.
    async fn lease_ended(
        &self,
        session: &Session,
        held_since: Instant,
        end: &Cell<Option<Instant>>,
    ) -> Duration {
        let mut lease = None;
        loop {
            let changed = match self.read_lease(session).await {
                Ok((now, watch)) => {
                    lease = now;
                    Some(watch)
                }
                Err(e) => {
                    // The hold's own monitor tells a loss; until the node
                    // can be read again, the last lease read stands.
                    debug!(error = %e, lock = %self.path, "could not read the lock's lease; keeping the one last read");
                    None
                }
            };
            end.set(lease.map(|l| held_since + l));
            let current = lease;
            let ends = async move {
                match current {
                    Some(l) => tokio::time::sleep_until(held_since + l).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = ends => return current.unwrap_or_default(),
                _ = async move {
                    match changed {
                        Some(watch) => drop(watch.changed().await),
                        None => tokio::time::sleep(LEASE_REREAD).await,
                    }
                } => {}
            }
        }
    }

    /// The error of a hold given up at its lease's end.
    fn lease_over(&self, lease: Duration, what: &str) -> AgentError {
        AgentError::new(
            Exit::LockLost,
            format!(
                "held the lock {} for its leaseDuration ({}): the hold is revoked{what}",
                self.path,
                humantime::format_duration(lease)
            ),
        )
    }

    /// `acquire` (init container): acquires with a persistent node that
    /// outlives this process, writes the fencing token to `token_file` and
    /// returns. A restarted container adopts its own earlier hold. SIGTERM
    /// while waiting removes our node (exit 143).
    pub async fn acquire(
        &self,
        mut stop: Termination,
        token_file: &std::path::Path,
    ) -> Result<i32, AgentError> {
        ready::refuse_special(token_file)?;
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        let result = async {
            let hold = stop
                .unless_stopped(&self.waiting(), self.acquire_with(&session, true, None))
                .await?;
            if let Err(e) = ready::write_atomically(token_file, &format!("{}\n", hold.fencing_token())) {
                // Nobody could use a hold whose token is not handed on.
                let _ = hold.release().await;
                return Err(e);
            }
            let registration = hold.into_registration();
            info!(node = %registration.path, token_file = %token_file.display(), "holding the lock past this process");
            Ok(0)
        }
        .await;
        close(session).await;
        result
    }

    /// `sidecar`: acquires, writes the token and reports ready, holds until
    /// SIGTERM (then releases).
    ///
    /// It cannot stop the main container itself. What the pod sees when the
    /// hold is lost, or may be: the token file goes (with the readiness),
    /// and the sidecar exits 6. The token file goes early enough for a
    /// command run under `zkgate lock watch` to be stopped within `grace`
    /// (published beside the token, see [`grace_file`]) before the server
    /// can expire the session, as for `lock run`. And since a sidecar that
    /// is killed (an OOM kill) or frozen removes nothing, it also keeps
    /// publishing until when the hold is trusted ([`trust_file`]):
    /// `lock watch` stops its command when that passes unrenewed, in time
    /// as well. A token file found at the start (left by a predecessor
    /// that crashed) is removed before anything else.
    pub async fn sidecar(
        &self,
        mut stop: Termination,
        token_file: &std::path::Path,
        readiness: &ReadinessOptions,
        grace: Option<Duration>,
    ) -> Result<i32, AgentError> {
        if let Some(grace) = grace {
            check_kill_grace(grace, self.participant.session.session_timeout, "asked for")?;
        }
        for published in [token_file, &trust_file(token_file), &grace_file(token_file)] {
            ready::refuse_special(published)?;
        }
        // A token left by a sidecar that crashed is no longer held: a
        // watched command must not start on it while we queue.
        withdraw(token_file);
        let readiness = Readiness::start(readiness).await?;
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        let outcome = async {
            let grace = grace.unwrap_or_else(|| default_kill_grace(session.timeout()));
            check_kill_grace(grace, session.timeout(), "granted by the server")?;
            let hold = stop
                .unless_stopped(&self.waiting(), self.acquire_with(&session, false, Some(WATCH_POLL + grace)))
                .await?;
            let monitor = hold
                .monitor()
                .with_reserve(grace + safety_margin(session.timeout()) + WATCH_POLL);
            let trust = monitor.trust();
            ready::write_atomically(
                &grace_file(token_file),
                &format!("{}\n", humantime::format_duration(grace)),
            )?;
            // The trust published never reaches past the lease's end: a
            // sidecar frozen or killed just before it cannot keep a watched
            // command running into the next holder's turn.
            let lease_end = Cell::new(None);
            if let Ok((Some(lease), _)) = self.read_lease(&session).await {
                lease_end.set(Some(hold.held_since() + lease));
            }
            // The trust, then the token, then readiness: a failure on the
            // way (an unwritable ready file, a full volume) withdraws what
            // was published, and gives the hold up only once a command
            // started on it is surely dead, as any other end does.
            let published = publish_trust(token_file, trusted_until(&trust, &lease_end))
                .and_then(|()| ready::write_atomically(token_file, &format!("{}\n", hold.fencing_token())))
                .and_then(|()| readiness.set_ready());
            let loss = monitor.lost();
            tokio::pin!(loss);
            let ended = match published {
                Err(e) => SidecarEnd::Failed(e),
                Ok(()) => tokio::select! {
                    _ = stop.received() => SidecarEnd::Stopped,
                    reason = &mut loss => SidecarEnd::Lost(reason),
                    lease = self.lease_ended(&session, hold.held_since(), &lease_end) => SidecarEnd::LeaseEnded(lease),
                    () = keep_publishing(token_file, &trust, &lease_end) => SidecarEnd::Stopped,
                },
            };
            readiness.clear();
            withdraw(token_file);
            // Whether `loss` has resolved: it must not be polled again.
            let mut loss_told = false;
            let outcome = match ended {
                // Not heard from ZooKeeper in time to trust the hold, but the
                // session may live on: its node is kept through the drain
                // below, as for a stop, or our own delete could let the next
                // holder in while a watched command runs out its kill grace
                // (the server itself could not expire the session sooner).
                SidecarEnd::Lost(reason @ LossReason::PresumedExpired) => {
                    loss_told = true;
                    Err(self.lost("; the token file was withdrawn")(reason))
                }
                // Revoked, or the session is gone: the node is too.
                SidecarEnd::Lost(reason) => return Err(self.lost("; the token file was withdrawn")(reason)),
                SidecarEnd::Stopped => Ok(0),
                SidecarEnd::LeaseEnded(lease) => Err(self.lease_over(lease, "; the token file was withdrawn and the hold given up")),
                SidecarEnd::Failed(e) => Err(e),
            };
            // Asked to stop, the lease is over, publishing failed, or the
            // hold is no longer trusted. A command under `lock watch` may
            // still run: it sees the token (or its trust) go at its next
            // look and is dead its kill grace later. Only then may the next
            // holder start, so the hold is kept (and watched) until that
            // bound has passed.
            let drained = WATCH_POLL + grace + safety_margin(session.timeout());
            info!(
                wait_ms = drained.as_millis() as u64,
                "withdrew the token; releasing the lock once a watched command is surely stopped"
            );
            let drain_end = Instant::now() + drained;
            tokio::select! {
                () = tokio::time::sleep_until(drain_end) => {}
                reason = &mut loss, if !loss_told => match reason {
                    // Not heard from ZooKeeper in time to trust the hold
                    // (a stall, a busy machine), but the token is already
                    // withdrawn and any watched command stops by the trust
                    // it was given. The session may well live on: the
                    // release, in it, tells whether the hold was lost.
                    LossReason::PresumedExpired => {
                        warn!(lock = %self.path, "could not confirm the hold while stopping; the release will tell whether it was lost");
                        tokio::time::sleep_until(drain_end).await;
                    }
                    reason => return Err(self.lost("; the token file was withdrawn")(reason)),
                },
            }
            // Deleting our node in our own session proves the session never
            // expired, so nobody else held the lock meanwhile. Bounded: cut
            // off for a session timeout more, it may be lost (rather than
            // hanging until the kubelet's SIGKILL).
            let released = tokio::time::timeout(session.timeout(), hold.release()).await;
            match outcome {
                Ok(code) => match released {
                    Ok(Ok(())) => Ok(code),
                    Ok(Err(ZkError::NodeRemoved { .. })) => {
                        Err(self.lost("; its node was gone at the release (the token file was withdrawn)")(LossReason::Revoked))
                    }
                    Ok(Err(ZkError::SessionExpired)) => {
                        Err(self.lost("; the token file was withdrawn")(LossReason::SessionExpired))
                    }
                    Ok(Err(e)) => Err(self.participant.explain(e)),
                    Err(_) => Err(self.lost("; the token file was withdrawn, and the release got no reply")(LossReason::PresumedExpired)),
                },
                // What ended the hold says more than its release.
                Err(e) => {
                    match released {
                        Ok(Err(release)) => debug!(error = %release, "giving up the hold"),
                        Err(_) => debug!("giving up the hold: the release got no reply"),
                        Ok(Ok(())) => {}
                    }
                    Err(e)
                }
            }
        }
        .await;
        close(session).await;
        outcome
    }

    /// `run`: acquires, runs `command` with `ZKGATE_FENCING_TOKEN` set,
    /// releases, and returns the command's exit code.
    ///
    /// The command never outlives the hold: when the hold is lost, or may
    /// be (no reply from ZooKeeper for 0.65 of the session timeout less
    /// `grace`), the command gets SIGTERM and, `grace` later (default: a
    /// quarter of the session timeout), SIGKILL, so it has exited before
    /// the server can expire the session and grant the lock to someone
    /// else. `grace` must therefore be at most 0.35 of the session timeout
    /// (checked against what the server granted: [`check_kill_grace`]). A hold
    /// found revoked when the command ends is reported too (exit 6): the
    /// command may have overlapped another holder.
    pub async fn run(
        &self,
        mut stop: Termination,
        command: &[String],
        grace: Option<Duration>,
    ) -> Result<i32, AgentError> {
        child::check_command(command)?;
        if let Some(grace) = grace {
            check_kill_grace(grace, self.participant.session.session_timeout, "asked for")?;
        }
        let session = stop
            .unless_stopped("connecting", self.participant.connect())
            .await?;
        let outcome = async {
            let grace = grace.unwrap_or_else(|| default_kill_grace(session.timeout()));
            check_kill_grace(grace, session.timeout(), "granted by the server")?;
            let hold = stop
                .unless_stopped(&self.waiting(), self.acquire_with(&session, false, Some(grace)))
                .await?;
            let env = [("ZKGATE_FENCING_TOKEN", hold.fencing_token().to_string()), ("ZKGATE_LOCK_NODE", hold.path().to_owned())];
            let child = child::spawn(command, &env, grace)?;
            let monitor = hold.monitor().with_reserve(grace + safety_margin(session.timeout()));
            let lease_end = Cell::new(None);
            let interrupt = async {
                tokio::select! {
                    reason = monitor.lost() => Interrupt::Lost(reason),
                    lease = self.lease_ended(&session, hold.held_since(), &lease_end) => Interrupt::LeaseEnded(lease),
                }
            };
            match child::supervise(child, &mut stop, interrupt, grace).await? {
                Ended::Interrupted(Interrupt::Lost(reason), code) => {
                    Err(self.lost(&format!("; the command was terminated (it exited {code})"))(reason))
                }
                Ended::Interrupted(Interrupt::LeaseEnded(lease), code) => {
                    if let Err(e) = hold.release().await {
                        debug!(error = %e, "giving up the hold at its lease's end");
                    }
                    Err(self.lease_over(lease, &format!("; the command was terminated (it exited {code}) and the hold given up")))
                }
                Ended::Exited(code) => match hold.release().await {
                    Ok(()) => Ok(code),
                    Err(ZkError::NodeRemoved { .. }) => Err(self.lost(&format!(
                        "; it was gone when the command (exit {code}) finished, so another holder may have run beside it"
                    ))(crate::zk::LossReason::Revoked)),
                    Err(e) => {
                        warn!(error = %e, "could not release the lock; it goes with the session");
                        Ok(code)
                    }
                },
            }
        }
        .await;
        close(session).await;
        outcome
    }
}

/// How often `lock watch` looks at the token file.
const WATCH_POLL: Duration = Duration::from_millis(100);

/// How soon a lease that could not be read is read again.
const LEASE_REREAD: Duration = Duration::from_secs(1);

/// Why `lock sidecar` stopped holding.
enum SidecarEnd {
    /// Asked to (SIGTERM).
    Stopped,
    /// The hold is lost, or may be.
    Lost(crate::zk::LossReason),
    /// The hold lasted its lease (this one).
    LeaseEnded(Duration),
    /// The token or readiness could not be published.
    Failed(AgentError),
}

/// Why `lock run` stopped its command.
enum Interrupt {
    /// The hold is lost, or may be.
    Lost(crate::zk::LossReason),
    /// The hold lasted its lease (this one).
    LeaseEnded(Duration),
}

/// Where `lock sidecar` publishes the kill grace it leaves a watched
/// command: beside the token file, so `lock watch` needs no setting of its own.
pub fn grace_file(token_file: &Path) -> PathBuf {
    let mut name = token_file.as_os_str().to_owned();
    name.push(".kill-grace");
    PathBuf::from(name)
}

/// `lock watch` (the main container beside a `lock sidecar`): waits for the
/// token file, runs `command` with `ZKGATE_FENCING_TOKEN` set, and stops it
/// (SIGTERM, SIGKILL after the kill grace the sidecar published, or
/// `grace`, which may only be shorter) as soon as the token file goes or
/// changes: the sidecar lost the hold. Exits with the command's code, or 6
/// when it was stopped. Needs no ZooKeeper connection.
pub async fn watch(
    token_file: &Path,
    command: &[String],
    grace: Option<Duration>,
) -> Result<i32, AgentError> {
    child::check_command(command)?;
    let mut signals = super::Termination::install()?;
    let read_token = || {
        std::fs::read_to_string(token_file)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
    };
    // The token, once the sidecar trusts its hold: a token a crashed
    // sidecar left behind has a trust that has run out.
    let token = loop {
        if let Some(token) = read_token() {
            match read_trust(token_file) {
                Some(until) if trusted(until) => break token,
                Some(_) => {}
                None => {
                    return Err(AgentError::usage(format!(
                        "{} is missing: the lock sidecar publishes until when its hold is trusted there (run the same zkgate version in both containers)",
                        trust_file(token_file).display()
                    )))
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(WATCH_POLL) => {}
            exit = signals.received() => {
                return Err(AgentError::new(
                    exit,
                    format!(
                        "stopped by {} while waiting for the lock sidecar's token ({}); no command was started",
                        exit.signal_name(),
                        token_file.display()
                    ),
                ))
            }
        }
    };
    let published = std::fs::read_to_string(grace_file(token_file))
        .ok()
        .and_then(|g| humantime::parse_duration(g.trim()).ok());
    let grace = match (grace, published) {
        (Some(asked), Some(max)) if asked > max => {
            return Err(AgentError::usage(format!(
                "--kill-grace {} is longer than the {} the lock sidecar leaves (its --kill-grace): the command could outlive the hold",
                humantime::format_duration(asked),
                humantime::format_duration(max)
            )))
        }
        (Some(asked), _) => asked,
        (None, Some(published)) => published,
        (None, None) => {
            return Err(AgentError::usage(format!(
                "{} is missing: run `zkgate lock sidecar` with the same --token-file, or give --kill-grace",
                grace_file(token_file).display()
            )))
        }
    };
    info!(token = %token, "the lock is held by the sidecar: starting the command");
    let child = child::spawn(command, &[("ZKGATE_FENCING_TOKEN", token.clone())], grace)?;
    let withdrawn = async {
        loop {
            tokio::time::sleep(WATCH_POLL).await;
            if read_token().as_deref() != Some(token.as_str()) {
                return Withdrawn::Token;
            }
            match read_trust(token_file) {
                Some(until) if trusted(until) => {}
                _ => return Withdrawn::Unconfirmed,
            }
        }
    };
    match child::supervise(child, &mut signals, withdrawn, grace).await? {
        Ended::Exited(code) => Ok(code),
        Ended::Interrupted(Withdrawn::Token, code) => Err(AgentError::new(
            Exit::LockLost,
            format!(
                "the lock sidecar withdrew the token {token} ({}): the hold is lost; the command was terminated (it exited {code})",
                token_file.display()
            ),
        )),
        Ended::Interrupted(Withdrawn::Unconfirmed, code) => Err(AgentError::new(
            Exit::LockLost,
            format!(
                "the lock sidecar stopped confirming the hold of token {token} ({}): it crashed, is frozen or lost ZooKeeper; the command was terminated (it exited {code}) before the hold could pass to anyone else",
                trust_file(token_file).display()
            ),
        )),
    }
}

/// Why `lock watch` stopped its command.
enum Withdrawn {
    /// The sidecar removed or replaced the token: it lost the hold.
    Token,
    /// The sidecar's published trust ran out unrenewed: it is gone or
    /// cannot reach ZooKeeper, and the hold may pass to someone else soon.
    Unconfirmed,
}

/// Where `lock sidecar` publishes until when its hold is trusted (see
/// [`LockCommand::sidecar`]): beside the token file.
pub fn trust_file(token_file: &Path) -> PathBuf {
    let mut name = token_file.as_os_str().to_owned();
    name.push(".trusted-until");
    PathBuf::from(name)
}

/// The system-wide monotonic clock (`CLOCK_BOOTTIME`, in milliseconds):
/// the same in every container of a pod (one kernel), unmoved by changes
/// of the wall clock, so one process's deadline is another's.
/// `None` when the clock cannot be read: then nothing is trusted.
fn boottime() -> Option<u64> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .ok()
        .map(|t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
}

/// Whether a published deadline (on the boot clock) is still ahead.
fn trusted(until: u64) -> bool {
    boottime().is_some_and(|now| now < until)
}

/// Until when a watched command may run: while the hold is trusted, and
/// not past the lease's end.
fn trusted_until(trust: &crate::zk::Trust, lease_end: &Cell<Option<Instant>>) -> Instant {
    let until = trust.until();
    lease_end.get().map_or(until, |end| until.min(end))
}

/// Writes `until` on the boot clock.
fn publish_trust(token_file: &Path, until: Instant) -> Result<(), AgentError> {
    let now = tokio::time::Instant::now();
    let boot = boottime().ok_or_else(|| {
        AgentError::new(
            Exit::Internal,
            "cannot read the boot clock (CLOCK_BOOTTIME)",
        )
    })?;
    let until_ms = if until >= now {
        boot + (until - now).as_millis() as u64
    } else {
        boot.saturating_sub((now - until).as_millis() as u64)
    };
    ready::write_atomically(&trust_file(token_file), &format!("{until_ms}\n"))
}

/// Renews the published trust every [`WATCH_POLL`] while the hold lasts;
/// never returns. A failed write is logged: the published deadline then
/// passes and the watched command is stopped, which is safe.
async fn keep_publishing(
    token_file: &Path,
    trust: &crate::zk::Trust,
    lease_end: &Cell<Option<Instant>>,
) {
    loop {
        tokio::time::sleep(WATCH_POLL).await;
        if let Err(e) = publish_trust(token_file, trusted_until(trust, lease_end)) {
            warn!(error = %e, "could not renew the published trust in the hold");
        }
    }
}

/// The published deadline, on the boot clock.
fn read_trust(token_file: &Path) -> Option<u64> {
    std::fs::read_to_string(trust_file(token_file))
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

/// Removes the token and the trust in it.
fn withdraw(token_file: &Path) {
    ready::remove(token_file);
    ready::remove(&trust_file(token_file));
}

/// What `lock run` keeps back, beyond the kill grace, between killing the
/// command and the earliest moment the server can expire the session: for
/// the kill to be delivered and the process reaped on a busy node.
fn safety_margin(session_timeout: Duration) -> Duration {
    session_timeout / 10
}

/// The kill grace when none is asked for: a quarter of the session timeout,
/// at most [`MAX_KILL_GRACE`].
fn default_kill_grace(session_timeout: Duration) -> Duration {
    (session_timeout / 4).min(MAX_KILL_GRACE)
}

/// `lock run`'s kill grace must fit in the session timeout: the command is
/// told to stop `grace` + a margin before the server can expire the session
/// (at the soonest [`leader_lag`] earlier than *T* after the last confirmed
/// check), and at least 0.3 of the timeout must remain for ZooKeeper to be
/// silent before that (three of the hold's checks) without stopping a
/// healthy hold: the grace is at most 0.35 of the session timeout.
fn check_kill_grace(
    grace: Duration,
    session_timeout: Duration,
    which: &str,
) -> Result<(), AgentError> {
    let quiet = session_timeout * 3 / 10;
    let most = session_timeout
        .saturating_sub(quiet)
        .saturating_sub(safety_margin(session_timeout))
        .saturating_sub(leader_lag(session_timeout));
    if grace > MAX_KILL_GRACE {
        return Err(AgentError::usage(format!(
            "--kill-grace {} is longer than {}, the longest the controller waits after a lease's end before it revokes the hold: the command could outlive its revocation and run beside the next holder",
            humantime::format_duration(grace),
            humantime::format_duration(MAX_KILL_GRACE)
        )));
    }
    if grace > most {
        return Err(AgentError::usage(format!(
            "--kill-grace {} cannot fit in the session timeout {} {which}: it must be at most {} (0.35 of it), so that the command is dead before the server can expire the session and hand the lock on (lower --kill-grace or raise --session-timeout)",
            humantime::format_duration(grace),
            humantime::format_duration(session_timeout),
            humantime::format_duration(most),
        )));
    }
    Ok(())
}
