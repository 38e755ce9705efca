//! A double barrier in rounds: when one member of a gang fails after the
//! start, every member stops and they all meet again before anyone resumes.
//!
//! Layout: the barrier node's data says the current round `k`
//! ([`BarrierData::round`]), how many rounds may follow the first
//! ([`BarrierData::max_restarts`]) and why each round so far ended
//! ([`BarrierData::ends`]). Round `k` is a [`DoubleBarrier`] of its own at
//! `<barrier>/round-<k>`, so a late leaver of round `k` never counts in
//! round `k + 1`.
//!
//! A round ends ([`GangBarrier::end_round`]) in one transaction that marks
//! the round node ended, moves the barrier node to the next round and
//! creates the next round's node (or, past `max_restarts`, fails the
//! barrier). Every write is conditional on the versions read, so two
//! members ending the same round end it once. A round's members watch its
//! node ([`GangBarrier::round_over`]) and stop their commands when it ends
//! or when one of them vanishes (its session ended) before the round's
//! leave began. A member whose command succeeded marks the round leaving
//! first ([`GangBarrier::start_leaving`]): from then on the round cannot
//! restart (a member that completed cannot run again), and the members
//! leave it as a double barrier's.

use tracing::{debug, info};
use zookeeper_client as zk;

use super::barrier::{BarrierData, DoubleBarrier, ParticipantData, READY};
use super::error::{Result, ZkError, CONTENDED_ATTEMPTS};
use super::path;
use super::session::{is_connection_loss, Session, SessionState};

/// How many ends a barrier node records (the rounds a barrier may have
/// are bounded by its `max_restarts`; this bounds the node's size too).
pub const MAX_ENDS_KEPT: usize = 100;

/// What [`GangBarrier::end_round`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoundEnd {
    /// We ended it: the next round is open for registration.
    Restarted {
        /// The next round.
        next: u32,
    },
    /// We ended it, and that was the last restart allowed: the barrier
    /// failed with this reason.
    LimitReached(String),
    /// It had ended already (someone else ended it first), or the barrier
    /// has moved past it.
    AlreadyEnded,
    /// A member completed: the round is finishing and cannot restart.
    Finishing,
    /// The barrier failed (this reason) or is gone.
    Failed(String),
}

/// A barrier whose gang restarts together, in rounds. See the module docs.
#[derive(Clone, Debug)]
pub struct GangBarrier {
    path: String,
}

impl GangBarrier {
    /// The barrier whose node is `path`.
    pub fn new(path: impl Into<String>) -> Self {
        GangBarrier { path: path.into() }
    }

    /// The barrier node's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The node of round `k`.
    pub fn round_path(&self, k: u32) -> String {
        path::join(&self.path, &format!("round-{k}"))
    }

    /// Round `k`, a double barrier of its own.
    pub fn round(&self, k: u32) -> DoubleBarrier {
        DoubleBarrier::new(self.round_path(k))
    }

    /// The data round `k`'s node is made with: the barrier's count, owner
    /// and run; nothing of the rounds.
    fn round_data(top: &BarrierData) -> BarrierData {
        BarrierData {
            participants: top.participants,
            uid: top.uid.clone(),
            failed: None,
            run: top.run.clone(),
            ..BarrierData::default()
        }
    }

    /// Makes round `k`'s node if it is missing, with the barrier node's ACL
    /// (which only a client with ADMIN on it reads in full: its owner). The
    /// owner makes the current round's node and the next one's, so that a
    /// round's end finds its successor there. True if it made it.
    pub async fn ensure_round(&self, session: &Session, top: &BarrierData, k: u32) -> Result<bool> {
        let client = session.client();
        let round = self.round_path(k);
        let (acl, _) = session
            .retry("read ACL", &self.path, || client.get_acl(&self.path))
            .await?;
        let options = zk::CreateMode::Persistent.with_acls((&acl[..]).into());
        let bytes = Self::round_data(top).to_bytes();
        match session
            .retry("create", &round, || client.create(&round, &bytes, &options))
            .await
        {
            Ok(_) => Ok(true),
            Err(ZkError::Zk {
                source: zk::Error::NodeExists,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads the barrier node: its data and version; `None` when it is
    /// missing.
    async fn read_top(&self, session: &Session) -> Result<Option<(BarrierData, i32)>> {
        let client = session.client();
        match session
            .retry("read", &self.path, || client.get_data(&self.path))
            .await
        {
            Ok((data, stat)) => Ok(Some((
                BarrierData::parse(&self.path, &data)?.unwrap_or_default(),
                stat.version,
            ))),
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads round `k`'s node: its data and its version.
    async fn read_round(&self, session: &Session, k: u32) -> Result<Option<(BarrierData, i32)>> {
        let client = session.client();
        let round = self.round_path(k);
        match session
            .retry("read", &round, || client.get_data(&round))
            .await
        {
            Ok((data, stat)) => Ok(Some((parse(&round, &data)?, stat.version))),
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ends round `k` because of `why`, unless it ended already or is
    /// finishing: in one transaction conditional on what was read, the
    /// round node is marked ended and the barrier node moves to round
    /// `k + 1`, whose node is made; past `max_restarts` the barrier node
    /// is marked failed instead.
    pub async fn end_round(&self, session: &Session, k: u32, why: &str) -> Result<RoundEnd> {
        let client = session.client();
        let round = self.round_path(k);
        for _ in 0..CONTENDED_ATTEMPTS {
            let Some((mut top, top_version)) = self.read_top(session).await? else {
                return Ok(RoundEnd::Failed("Deleted".to_owned()));
            };
            if let Some(reason) = &top.failed {
                return Ok(RoundEnd::Failed(reason.clone()));
            }
            if top.round != Some(k) {
                return Ok(RoundEnd::AlreadyEnded);
            }
            let Some((mut marks, round_version)) = self.read_round(session, k).await? else {
                // Never made, or removed: nothing to end.
                return Ok(RoundEnd::AlreadyEnded);
            };
            if marks.leaving {
                return Ok(RoundEnd::Finishing);
            }
            // Round k ended, but the barrier node still says k: its data
            // was rewritten since (its owner repaired it). The end stands;
            // the barrier node moves on below all the same, or every
            // member would find round k ended for ever.
            let why = match &marks.ended {
                Some(ended) => ended.clone(),
                None => cap(why),
            };
            marks.ended = Some(why.clone());
            let ended = marks.to_bytes();
            top.ends.push(why.clone());
            if top.ends.len() > MAX_ENDS_KEPT {
                top.ends.remove(0);
            }
            let Some(next) = k.checked_add(1) else {
                return Ok(RoundEnd::Failed(format!(
                    "RestartLimit: round {k} is the last there can be"
                )));
            };
            let limit = top.max_restarts.filter(|max| next > *max).map(|max| {
                format!("RestartLimit: round {k} ended ({why}) and the gang has restarted {max} time(s), its limit")
            });
            let mut writer = client.new_multi_writer();
            let next_round = self.round_path(next);
            let acl;
            writer
                .add_set_data(&round, &ended, Some(round_version))
                .map_err(|e| ZkError::from_client("end round", &round, e))?;
            match &limit {
                Some(reason) => {
                    top.failed = Some(reason.clone());
                    writer
                        .add_set_data(&self.path, &top.to_bytes(), Some(top_version))
                        .map_err(|e| ZkError::from_client("end round", &self.path, e))?;
                }
                None => {
                    top.round = Some(next);
                    writer
                        .add_set_data(&self.path, &top.to_bytes(), Some(top_version))
                        .map_err(|e| ZkError::from_client("end round", &self.path, e))?;
                    // The next round's node: its owner makes it a round
                    // ahead ([`GangBarrier::ensure_round`]). Made here only
                    // when it is missing and the barrier node is open to
                    // all: ZooKeeper hides the digests of an ACL from those
                    // without ADMIN, so a participant cannot copy it, and a
                    // node made with the participant's own would shut the
                    // owner out. Without it, the members wait for it.
                    let missing = session
                        .retry("check", &next_round, || client.check_stat(&next_round))
                        .await?
                        .is_none();
                    (acl, _) = session
                        .retry("read ACL", &self.path, || client.get_acl(&self.path))
                        .await?;
                    if missing && acl.iter().all(|a| a.scheme() == "world") {
                        let options = zk::CreateMode::Persistent.with_acls((&acl[..]).into());
                        writer
                            .add_create(&next_round, &Self::round_data(&top).to_bytes(), &options)
                            .map_err(|e| ZkError::from_client("end round", &next_round, e))?;
                    }
                }
            }
            match writer.commit().await {
                Ok(_) => {
                    info!(barrier = %self.path, round = k, %why, "the round ended");
                    return Ok(match limit {
                        Some(reason) => RoundEnd::LimitReached(reason),
                        None => RoundEnd::Restarted { next },
                    });
                }
                // Something changed since we read (another member ended the
                // round, one completed, the owner rewrote the node): look
                // again. A transaction of ours that landed before a lost
                // connection is seen as the round ended, as it is.
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NodeExists,
                    ..
                }) => continue,
                Err(e) => {
                    let e = zk::Error::from(e);
                    if is_connection_loss(&e) {
                        session.await_connected().await?;
                        continue;
                    }
                    return Err(ZkError::from_client("end round", &round, e));
                }
            }
        }
        Err(ZkError::Contended {
            op: "end the round of",
            path: self.path.clone(),
            attempts: CONTENDED_ATTEMPTS,
        })
    }

    /// Fails the barrier for `reason`, unless it failed already: for a
    /// member that can no longer take part, without which the gang cannot
    /// meet again (one that completed as its round ended). The barrier node
    /// is marked failed (what a member joining a round reads), and so is
    /// the current round's node unless it has opened (its waiters stop with
    /// [`ZkError::BarrierFailed`]).
    pub async fn fail(&self, session: &Session, reason: &str) -> Result<()> {
        let client = session.client();
        for _ in 0..CONTENDED_ATTEMPTS {
            let Some((mut top, version)) = self.read_top(session).await? else {
                return Ok(());
            };
            if top.failed.is_some() {
                return Ok(());
            }
            top.failed = Some(cap(reason));
            match client
                .set_data(&self.path, &top.to_bytes(), Some(version))
                .await
            {
                Ok(_) => {
                    info!(barrier = %self.path, %reason, "the barrier failed");
                    let round = self.round(top.round.unwrap_or_default());
                    return match round.fail(session, reason).await {
                        Ok(_) => Ok(()),
                        // Never made, or removed: no one waits there.
                        Err(ZkError::Zk {
                            source: zk::Error::NoNode,
                            ..
                        }) => Ok(()),
                        Err(e) => Err(e),
                    };
                }
                Err(zk::Error::BadVersion) => continue,
                Err(e) if is_connection_loss(&e) => session.await_connected().await?,
                Err(e) => return Err(ZkError::from_client("fail", &self.path, e)),
            }
        }
        Err(ZkError::Contended {
            op: "fail",
            path: self.path.clone(),
            attempts: CONTENDED_ATTEMPTS,
        })
    }

    /// Marks round `k` leaving (a member completed) unless it ended: false
    /// when it had ended (the member's success does not stand: the gang
    /// restarts).
    pub async fn start_leaving(&self, session: &Session, k: u32) -> Result<bool> {
        let client = session.client();
        let round = self.round_path(k);
        for _ in 0..CONTENDED_ATTEMPTS {
            let Some((mut marks, version)) = self.read_round(session, k).await? else {
                return Err(ZkError::Deleted { path: round });
            };
            if marks.ended.is_some() {
                return Ok(false);
            }
            if marks.leaving {
                return Ok(true);
            }
            marks.leaving = true;
            let leaving = marks.to_bytes();
            match session
                .retry("write", &round, || {
                    client.set_data(&round, &leaving, Some(version))
                })
                .await
            {
                Ok(_) => return Ok(true),
                Err(ZkError::Zk {
                    source: zk::Error::BadVersion,
                    ..
                }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ZkError::Contended {
            op: "mark leaving",
            path: round,
            attempts: CONTENDED_ATTEMPTS,
        })
    }

    /// Resolves with why round `k` is over for its members: it was ended
    /// (by anyone), or a member vanished (its session ended, its node was
    /// removed) before the round's leave began, which this ends the round
    /// for. Never resolves once the round is leaving. `members` are the
    /// round's registrations to watch (as seen once it opened); any of them
    /// gone is a loss. Every wake-up reads the round again.
    pub async fn round_over(
        &self,
        session: &Session,
        k: u32,
        members: &[String],
    ) -> Result<String> {
        let client = session.client();
        let round = self.round_path(k);
        loop {
            let (data, _, data_watch) = or_deleted(
                session
                    .retry("watch", &round, || client.get_and_watch_data(&round))
                    .await,
                &round,
            )?;
            let marks = parse(&round, &data)?;
            if let Some(why) = marks.ended {
                session.retire_watch(data_watch.changed());
                return Ok(why);
            }
            if marks.leaving {
                session.retire_watch(data_watch.changed());
                return std::future::pending().await;
            }
            let (children, _, children_watch) = or_deleted(
                session
                    .retry("watch", &round, || client.get_and_watch_children(&round))
                    .await,
                &round,
            )?;
            let registered = children.iter().filter(|c| *c != READY).count();
            let gone: Vec<&String> = members
                .iter()
                .filter(|m| !children.iter().any(|c| c == *m))
                .collect();
            // A member gone, or fewer registrations than the round opened
            // with (one that went before our list was taken).
            let lost = match gone.first() {
                Some(lost) => Some(lost.to_string()),
                None if registered < marks.participants as usize => Some("a member".to_owned()),
                None => None,
            };
            if let Some(lost) = lost {
                // Read again after the children's change: a member that
                // completed marked the round leaving before it went.
                let Some((marks, _)) = self.read_round(session, k).await? else {
                    return Err(ZkError::Deleted { path: round });
                };
                if let Some(why) = marks.ended {
                    return Ok(why);
                }
                if !marks.leaving {
                    let why = format!("{lost} was lost in round {k}");
                    debug!(barrier = %self.path, round = k, %lost, "a member of the round vanished: ending the round");
                    match self.end_round(session, k, &why).await? {
                        RoundEnd::Restarted { .. } | RoundEnd::LimitReached(_) => return Ok(why),
                        // Ended by someone else, or finishing since: read
                        // it again (it says which).
                        RoundEnd::AlreadyEnded | RoundEnd::Finishing => continue,
                        RoundEnd::Failed(reason) => {
                            return Err(ZkError::BarrierFailed {
                                path: self.path.clone(),
                                reason,
                            })
                        }
                    }
                }
                continue;
            }
            tokio::select! {
                event = data_watch.changed() => check_session(&event)?,
                event = children_watch.changed() => check_session(&event)?,
            }
        }
    }

    /// Waits, on watches, until round `k` holds no registration: every
    /// member of it has stopped its command and withdrawn (or vanished with
    /// its session, whose zkgate stops its command before the session can
    /// expire). A member of round `k + 1` waits for this before it runs its
    /// command, so that no command of round `k` still runs (a member whose
    /// pod is stopping, say, which the next round went on without).
    pub async fn await_round_empty(&self, session: &Session, k: u32) -> Result<()> {
        let client = session.client();
        let round = self.round_path(k);
        let mut told = false;
        loop {
            let (children, _, watch) = match session
                .retry("watch", &round, || client.get_and_watch_children(&round))
                .await
            {
                Ok(found) => found,
                Err(ZkError::Zk {
                    source: zk::Error::NoNode,
                    ..
                }) => return Ok(()),
                Err(e) => return Err(e),
            };
            let left: Vec<&String> = children.iter().filter(|c| *c != READY).collect();
            if left.is_empty() {
                session.retire_watch(watch.changed());
                return Ok(());
            }
            if !told {
                info!(barrier = %self.path, round = k, members = ?left, "waiting for the members of the round before to stop their commands");
                told = true;
            }
            check_session(&watch.changed().await)?;
        }
    }

    /// Confirms that our registration `node` is there as the leader has it
    /// (a sync and a read, sent together): when the request was sent, for
    /// a [`super::HoldMonitor`]'s deadline. `NodeRemoved` when it is gone.
    pub async fn confirm(&self, session: &Session, node: &str) -> Result<tokio::time::Instant> {
        let client = session.client();
        loop {
            let at = tokio::time::Instant::now();
            let sync = client.sync(node);
            let stat = client.check_stat(node);
            match (sync.await, stat.await) {
                (Ok(_), Ok(Some(_))) => return Ok(at),
                (Ok(_), Ok(None)) => {
                    return Err(ZkError::NodeRemoved {
                        path: node.to_owned(),
                    })
                }
                (Err(e), _) | (_, Err(e)) if is_connection_loss(&e) => {
                    session.await_connected().await?;
                }
                (Err(e), _) | (_, Err(e)) => return Err(ZkError::from_client("check", node, e)),
            }
        }
    }

    /// The members of open round `k`: the registrations its opening
    /// counted (made before `ready`), so that every member running the
    /// command is told the same ranks. `None` when the round is lost
    /// already: a registration came or went since the opening and no
    /// member has completed (a member that restarted arrived, which ends
    /// the round, or a counted member went); its end follows, and no
    /// command should start.
    ///
    /// The first member to read them after the opening records them in
    /// `ready`'s data (a write conditional on `ready`'s version, so one
    /// record wins); every later reader is told the record. A member
    /// completes only after it read them, so once one has completed and
    /// left the record is there, and a slower member is not told a list
    /// without it (which would shift its rank onto another's). Costs two
    /// reads, and the first reader one write.
    pub async fn members(&self, session: &Session, k: u32) -> Result<Option<Vec<String>>> {
        let client = session.client();
        let round = self.round_path(k);
        let ready = path::join(&round, READY);
        let ((children, round_stat), opened) = or_deleted(
            session
                .retry("list", &round, || async {
                    let children = client.get_children(&round);
                    let ready = client.get_data(&ready);
                    Ok((children.await?, or_none(ready.await)?))
                })
                .await,
            &round,
        )?;
        let registrations: Vec<String> = children.into_iter().filter(|c| c != READY).collect();
        let Some((record, opened)) = opened else {
            // Not open (or over): nobody was counted yet.
            return Ok(Some(registrations));
        };
        let record = OpeningRecord::parse(&record);
        // `ready`'s creation is the last change of the round's children:
        // the ones there now are the ones its opening counted.
        if round_stat.pzxid == opened.czxid {
            return match record {
                Some(members) => Ok(Some(members)),
                None => self
                    .record(session, &ready, opened.version, registrations)
                    .await
                    .map(Some),
            };
        }
        let (data, _) = or_deleted(
            session
                .retry("read", &round, || client.get_data(&round))
                .await,
            &round,
        )?;
        let leaving = BarrierData::parse(&round, &data)?.is_some_and(|d| d.leaving);
        if !leaving {
            return Ok(None);
        }
        if let Some(members) = record {
            return Ok(Some(members));
        }
        // A member completed and left, and no record was made (members of
        // a zkgate from before records): those still there that the
        // opening counted (the ranks of those gone are not known any more).
        let made = futures::future::try_join_all(registrations.iter().map(|r| {
            let node = path::join(&round, r);
            async move {
                session
                    .retry("check", &node, || client.check_stat(&node))
                    .await
            }
        }))
        .await?;
        Ok(Some(
            registrations
                .into_iter()
                .zip(made)
                .filter(|(_, stat)| stat.is_some_and(|s| s.czxid < opened.czxid))
                .map(|(r, _)| r)
                .collect(),
        ))
    }

    /// Records `members`, the registrations the opening counted, in
    /// `ready` (at `version`, as read). Another reader's record that won
    /// is the one returned; so is `members` when no record can be made
    /// (`ready` gone with the round's leave, or a list too long for a
    /// node), which every reader then computes alike from the same
    /// unchanged children.
    async fn record(
        &self,
        session: &Session,
        ready: &str,
        version: i32,
        members: Vec<String>,
    ) -> Result<Vec<String>> {
        let client = session.client();
        let marks = self.all_honour_marks_now(session, ready, &members).await?;
        let record = OpeningRecord::to_bytes(&members, marks);
        if record.len() > MAX_RECORD_BYTES {
            debug!(
                ready,
                bytes = record.len(),
                "too many members to record; each member lists them"
            );
            return Ok(members);
        }
        match session
            .retry("write", ready, || {
                client.set_data(ready, &record, Some(version))
            })
            .await
        {
            Ok(_) => Ok(members),
            Err(ZkError::Zk {
                source: zk::Error::BadVersion,
                ..
            }) => {
                // Another reader recorded first (or our write's reply was
                // lost and it is ours): theirs stands.
                let (data, _) = match session
                    .retry("read", ready, || client.get_data(ready))
                    .await
                {
                    Ok(found) => found,
                    Err(ZkError::Zk {
                        source: zk::Error::NoNode,
                        ..
                    }) => return Ok(members),
                    Err(e) => return Err(e),
                };
                Ok(OpeningRecord::parse(&data).unwrap_or(members))
            }
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Ok(members),
            Err(e) => Err(e),
        }
    }

    /// Whether every member of open round `k` waits for the run marks of
    /// earlier rounds (see [`super::RunMarks`]), as its opening's record
    /// says: only then may a member's command run on through a lost
    /// registration. False without a record (members of a zkgate from
    /// before records, or too many to record): the rule from before holds.
    pub async fn all_honour_marks(&self, session: &Session, k: u32) -> Result<bool> {
        let client = session.client();
        let ready = path::join(&self.round_path(k), READY);
        match session
            .retry("read", &ready, || client.get_data(&ready))
            .await
        {
            Ok((data, _)) => Ok(OpeningRecord::marks(&data)),
            Err(ZkError::Zk {
                source: zk::Error::NoNode,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether each of `members`' registrations (beside `ready`) says that
    /// its member honours run marks; one gone counts as not.
    async fn all_honour_marks_now(
        &self,
        session: &Session,
        ready: &str,
        members: &[String],
    ) -> Result<bool> {
        let client = session.client();
        let round = &ready[..ready.len() - READY.len() - 1];
        let found = futures::future::try_join_all(members.iter().map(|m| {
            let node = path::join(round, m);
            async move {
                match session
                    .retry("read", &node, || client.get_data(&node))
                    .await
                {
                    Ok((data, _)) => Ok(ParticipantData::parse(&data).honours_run_marks),
                    Err(ZkError::Zk {
                        source: zk::Error::NoNode,
                        ..
                    }) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }))
        .await?;
        Ok(found.into_iter().all(|honours| honours))
    }

    /// Whether our registration `node` in round `k` was counted by its
    /// opening: made before `ready`. False for a late arrival, which passed
    /// a round that had opened without it.
    pub async fn counted(&self, session: &Session, k: u32, node: &str) -> Result<bool> {
        let client = session.client();
        let ready = path::join(&self.round_path(k), READY);
        let (ours, ready) = session
            .retry("check", node, || async {
                let ours = client.check_stat(node);
                let ready = client.check_stat(&ready);
                Ok((ours.await?, ready.await?))
            })
            .await?;
        Ok(matches!((ours, ready), (Some(o), Some(r)) if o.czxid < r.czxid))
    }
}

/// The longest reason kept for a round's end (the barrier node holds the
/// last [`MAX_ENDS_KEPT`] of them, and the status and events show them).
pub const MAX_REASON_BYTES: usize = 256;

/// `why`, cut to [`MAX_REASON_BYTES`] at a character boundary.
fn cap(why: &str) -> String {
    let mut end = why.len().min(MAX_REASON_BYTES);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    why[..end].to_owned()
}

/// The largest record of an opening's members kept in `ready` (well
/// under ZooKeeper's default 1 MB packet limit; a pod name is at most 253
/// bytes, so some two thousand members fit).
const MAX_RECORD_BYTES: usize = 512 * 1024;

/// The members an opening counted, as `ready`'s data records them.
#[derive(serde::Serialize, serde::Deserialize)]
struct OpeningRecord {
    members: Vec<String>,
    /// Whether every member honours run marks (see
    /// [`GangBarrier::all_honour_marks`]); absent in a record of a zkgate
    /// from before marks.
    #[serde(default)]
    marks: bool,
}

impl OpeningRecord {
    fn to_bytes(members: &[String], marks: bool) -> Vec<u8> {
        let record = OpeningRecord {
            members: members.to_vec(),
            marks,
        };
        // A list of strings always serializes; empty data would only
        // mean "no record" to every reader.
        serde_json::to_vec(&record).unwrap_or_default()
    }

    /// What the record in `data` says of run marks: false for none.
    fn marks(data: &[u8]) -> bool {
        serde_json::from_slice::<OpeningRecord>(data).is_ok_and(|r| r.marks)
    }

    /// The record in `data`; `None` for none (empty, as `ready` is made)
    /// or for data of nobody's making, which is then not trusted.
    fn parse(data: &[u8]) -> Option<Vec<String>> {
        if data.is_empty() {
            return None;
        }
        serde_json::from_slice::<OpeningRecord>(data)
            .ok()
            .map(|r| r.members)
    }
}

/// A read's result with a missing node as `None`.
fn or_none<T>(
    found: std::result::Result<T, zk::Error>,
) -> std::result::Result<Option<T>, zk::Error> {
    match found {
        Ok(v) => Ok(Some(v)),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `found`, with a missing round node said as the barrier deleted.
fn or_deleted<T>(found: Result<T>, round: &str) -> Result<T> {
    match found {
        Err(ZkError::Zk {
            source: zk::Error::NoNode,
            ..
        }) => Err(ZkError::Deleted {
            path: round.to_owned(),
        }),
        other => other,
    }
}

/// A session event that ends the wait: the session expired or was closed.
pub(super) fn check_session(event: &zk::WatchedEvent) -> Result<()> {
    if event.event_type == zk::EventType::Session {
        if let Some(err) = SessionState::from_client(event.session_state).terminal_error() {
            return Err(err);
        }
    }
    Ok(())
}

/// A round node's data; empty data (not of our making) has no marks.
fn parse(path: &str, data: &[u8]) -> Result<BarrierData> {
    Ok(BarrierData::parse(path, data)?.unwrap_or_default())
}
