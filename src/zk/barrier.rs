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
use tracing::{debug, info};
use zookeeper_client as zk;

use super::error::{within, Result, ZkError};
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
    /// The pod's name, when the participant is a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's uid: a new pod with the same name is a different participant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

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
        path::validate_path(&self.path)?;
        path::validate_name(id)?;
        if id == READY {
            return Err(ZkError::InvalidPath {
                path: id.to_owned(),
                reason: "'ready' is reserved for the barrier",
            });
        }
        let mut guard = NodeGuard::new(session);
        let outcome = within(
            deadline,
            || format!("waiting for the barrier {} to open", self.path),
            self.enter_and_wait(session, id, options, &mut guard),
        )
        .await;
        match outcome {
            Ok(entered) => {
                guard.disarm();
                Ok(entered)
            }
            Err(e) => {
                guard.delete_now(session).await;
                Err(e)
            }
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
        let mut last_progress = Instant::now();
        let mut last_count = None;
        loop {
            // One round trip: the barrier's data (and a watch on it), a watch
            // on `ready`, our registration, and the participant list, in that
            // order on the server.
            let barrier_f = client.get_and_watch_data(&self.path);
            let ready_f = client.check_and_watch_stat(&ready);
            let create_f =
                (!guard.is_armed()).then(|| client.create(&node, &our_data, &create_options));
            let list_f = client.list_children(&self.path);

            let (barrier, barrier_watch) = match barrier_f.await {
                Ok((data, _, watcher)) => (BarrierData::parse(&self.path, &data)?, watcher),
                Err(zk::Error::NoNode) => {
                    if guard.is_armed() {
                        return Err(ZkError::Deleted {
                            path: self.path.clone(),
                        });
                    }
                    match options.create_with_participants {
                        Some(participants) => {
                            let data = BarrierData {
                                participants,
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
                    Ok(_) => {
                        debug!(%node, "registered");
                        guard.arm(node.clone());
                    }
                    Err(zk::Error::NodeExists) => {
                        self.claim_existing(session, id, &node, options).await?;
                        was_registered = true;
                        guard.arm(node.clone());
                    }
                    Err(e) if is_connection_loss(&e) => {
                        // Whether the create was applied is settled by the
                        // next round: NodeExists with our session as owner.
                        session.await_connected().await?;
                        continue;
                    }
                    Err(zk::Error::NoNode) => continue,
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
            };
            if ready_stat.is_some() {
                return Ok(entered);
            }
            if let Some(reason) = failed {
                return Err(ZkError::BarrierFailed {
                    path: self.path.clone(),
                    reason,
                });
            }
            let children = match list_f.await {
                Ok(children) => children,
                Err(e) if is_connection_loss(&e) => {
                    session.await_connected().await?;
                    continue;
                }
                Err(zk::Error::NoNode) => {
                    return Err(ZkError::Deleted {
                        path: self.path.clone(),
                    })
                }
                Err(e) => return Err(ZkError::from_client("list", &self.path, e)),
            };
            if !children.iter().any(|c| c == id) {
                return Err(ZkError::NodeRemoved { path: node.clone() });
            }
            let count = children.iter().filter(|c| *c != READY).count();
            if count >= participants as usize {
                // Ours is the arrival that completes the count.
                match session
                    .retry("create", &ready, || {
                        client.create(
                            &ready,
                            &[],
                            &zk::CreateMode::Persistent.with_acls(session.node_acls()),
                        )
                    })
                    .await
                {
                    Ok(_)
                    | Err(ZkError::Zk {
                        source: zk::Error::NodeExists,
                        ..
                    }) => {}
                    Err(e) => return Err(e),
                }
                info!(barrier = %self.path, participants, "barrier opened");
                return Ok(entered);
            }
            if last_count != Some(count)
                || options
                    .progress_every
                    .is_some_and(|every| last_progress.elapsed() >= every)
            {
                info!(barrier = %self.path, entered = count, of = participants, "waiting for the barrier to open");
                last_count = Some(count);
                last_progress = Instant::now();
            }
            let progress = async {
                match options.progress_every {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = ready_watch.changed() => check_event(&event)?,
                event = barrier_watch.changed() => check_event(&event)?,
                () = progress => continue,
            }
            session.stats().record_wakeup();
        }
    }

    /// Decides whether an existing registration of `id` is ours.
    async fn claim_existing(
        &self,
        session: &Session,
        id: &str,
        node: &str,
        options: &EnterOptions,
    ) -> Result<()> {
        let client = session.client();
        let (data, stat) = session
            .retry("read", node, || client.get_data(node))
            .await?;
        let existing = ParticipantData::parse(&data);
        let conflict = |holder: String| ZkError::ParticipantConflict {
            id: id.to_owned(),
            path: node.to_owned(),
            holder,
        };
        if stat.ephemeral_owner == session.id() {
            debug!(%node, "found our registration from a create whose reply was lost");
            return Ok(());
        }
        if stat.ephemeral_owner != 0 {
            return Err(conflict(format!(
                "another live session ({:#x})",
                stat.ephemeral_owner
            )));
        }
        if existing.pod_uid == options.data.pod_uid {
            info!(%node, "found our earlier registration; counting it once");
            return Ok(());
        }
        Err(conflict(format!(
            "an earlier pod (uid {}); it is removed once that pod has ended",
            existing.pod_uid.as_deref().unwrap_or("unknown")
        )))
    }

    /// Leaves: removes participant `id` and waits until every participant
    /// has left, per the recipe: the lowest participant waits for the
    /// highest to go and leaves last; every other one removes its node and
    /// waits for the lowest. On a timeout our node is removed all the same.
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
        let outcome = within(
            deadline,
            || format!("waiting for everyone to leave the barrier {}", self.path),
            self.leave_and_wait(session, id, &node),
        )
        .await;
        if outcome.is_err() {
            let mut guard = NodeGuard::new(session);
            guard.arm(node);
            guard.delete_now(session).await;
        }
        outcome
    }

    async fn leave_and_wait(&self, session: &Session, id: &str, node: &str) -> Result<()> {
        let client = session.client();
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
            let mut members: Vec<&String> = children.iter().filter(|c| *c != READY).collect();
            members.sort();
            let Some(lowest) = members.first() else {
                debug!(barrier = %self.path, "everyone has left");
                return Ok(());
            };
            let ours = members.iter().position(|m| *m == id);
            let watch = match ours {
                Some(0) if members.len() == 1 => {
                    super::tree::delete_if_present(session, node).await?;
                    return Ok(());
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

    /// Changes the participant count (old behaviour, test scaffolding).
    pub async fn set_participants(&self, session: &Session, participants: u32) -> Result<bool> {
        let client = session.client();
        let (data, stat) = session
            .retry("read", &self.path, || client.get_data(&self.path))
            .await?;
        let mut barrier = BarrierData::parse(&self.path, &data)?.unwrap_or_default();
        barrier.participants = participants;
        let bytes = barrier.to_bytes();
        session
            .retry("write", &self.path, || {
                client.set_data(&self.path, &bytes, Some(stat.version))
            })
            .await?;
        Ok(true)
    }

    /// Marks the barrier failed: every waiter stops with
    /// [`ZkError::BarrierFailed`] carrying `reason`.
    pub async fn fail(&self, session: &Session, reason: &str) -> Result<bool> {
        let client = session.client();
        loop {
            let (data, stat) = session
                .retry("read", &self.path, || client.get_data(&self.path))
                .await?;
            let mut barrier = BarrierData::parse(&self.path, &data)?.unwrap_or_default();
            barrier.failed = Some(reason.to_owned());
            let bytes = barrier.to_bytes();
            match session
                .retry("write", &self.path, || {
                    client.set_data(&self.path, &bytes, Some(stat.version))
                })
                .await
            {
                Err(ZkError::Zk {
                    source: zk::Error::BadVersion,
                    ..
                }) => continue,
                other => return other.map(|_| true),
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
