//! Marks of the commands of a barrier in rounds that may still run.
//!
//! A member's registration in a round is ephemeral: it goes with the
//! member's session, which a ZooKeeper outage does not end (no session
//! expires without a quorum, and a quorum formed again gives every session
//! a full timeout) but a member cut off while the servers run on loses.
//! A round must not start beside a command of the round before, and a
//! registration's going does not say that its command is dead. So a
//! member marks its command before it starts it, with a persistent node
//! of its own under the barrier (`<barrier>/running/<id>`, data: its
//! round and who it is), and removes the mark once the command is dead.
//! A round's commands start only when no mark of an earlier round is left
//! ([`RunMarks::await_none_before`]).
//!
//! Who removes a mark, then: its member, once its command is dead; a new
//! life of the same member (its container restarted: the process before
//! it, and its command, are dead), which re-marks; and the barrier's
//! owner, the controller, once the member's pod has finished or is gone.
//! That way a member's command needs ZooKeeper only to start and to end,
//! not to go on: however long the servers are away, it runs on, and the
//! next round (if the gang restarts meanwhile) waits for it.
//!
//! The `running` node is made by the barrier's owner, with the barrier
//! node's ACL (which only the owner can read in full). A barrier without
//! one (its controller predates marks) cannot have marks: its members then
//! keep to the rule from before, and stop their command before their
//! session could expire ([`RunMarks::mark`] says which).

use serde::{Deserialize, Serialize};
use tracing::info;
use zookeeper_client as zk;

use super::barrier::ParticipantData;
use super::error::{Result, ZkError};
use super::path;
use super::rounds::check_session;
use super::session::Session;

/// The name of the node under a barrier in rounds that holds the marks.
pub const RUNNING: &str = "running";

/// What a mark says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunMark {
    /// The round whose command the member runs.
    pub round: u32,
    /// Who runs it (the pod, whose end the controller watches).
    #[serde(flatten)]
    pub who: ParticipantData,
}

impl RunMark {
    /// The mark in `data`; `None` for data of nobody's making.
    pub fn parse(data: &[u8]) -> Option<RunMark> {
        serde_json::from_slice(data).ok()
    }

    fn to_bytes(&self) -> Vec<u8> {
        // Plain strings and numbers: always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The marks of the barrier in rounds at `barrier`. See the module docs.
#[derive(Clone, Debug)]
pub struct RunMarks {
    path: String,
}

impl RunMarks {
    /// The marks of the barrier whose node is `barrier`.
    pub fn of(barrier: &str) -> Self {
        RunMarks {
            path: path::join(barrier, RUNNING),
        }
    }

    /// The node that holds the marks.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The owner makes the marks' node, with the barrier node's ACL, if it
    /// is missing. True if it made it.
    pub async fn ensure(&self, session: &Session, barrier: &str) -> Result<bool> {
        let client = session.client();
        let (acl, _) = session
            .retry("read ACL", barrier, || client.get_acl(barrier))
            .await?;
        let options = zk::CreateMode::Persistent.with_acls((&acl[..]).into());
        match session
            .retry("create", &self.path, || {
                client.create(&self.path, &[], &options)
            })
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

    fn mark_path(&self, id: &str) -> String {
        path::join(&self.path, id)
    }

    /// Marks `id`'s command as running in round `k` (a mark of an earlier
    /// life of ours is replaced: its command is dead). False when the
    /// barrier has no marks' node (see the module docs): nothing marked.
    pub async fn mark(
        &self,
        session: &Session,
        id: &str,
        k: u32,
        who: &ParticipantData,
    ) -> Result<bool> {
        path::validate_name(id)?;
        let client = session.client();
        let node = self.mark_path(id);
        let data = RunMark {
            round: k,
            who: who.clone(),
        }
        .to_bytes();
        let options = zk::CreateMode::Persistent.with_acls(session.node_acls());
        loop {
            match session
                .retry("create", &node, || client.create(&node, &data, &options))
                .await
            {
                Ok(_) => return Ok(true),
                Err(ZkError::Zk {
                    source: zk::Error::NoNode,
                    ..
                }) => return Ok(false),
                Err(ZkError::Zk {
                    source: zk::Error::NodeExists,
                    ..
                }) => {
                    // An earlier life's, or ours of an earlier round (a
                    // create whose reply was lost, even): either way no
                    // command of it runs now. Replaced.
                    match session
                        .retry("write", &node, || client.set_data(&node, &data, None))
                        .await
                    {
                        Ok(_) => return Ok(true),
                        // Removed meanwhile (the controller, say): make it.
                        Err(ZkError::Zk {
                            source: zk::Error::NoNode,
                            ..
                        }) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes a mark of `id` that an earlier life of `who` left (its
    /// process, and so its command, are dead: our container restarted), so
    /// that it does not hold up the round we join. A mark of another pod of
    /// the same name (another uid) is left to the controller, which
    /// removes it once that pod has ended; so is one that changed since
    /// read.
    pub async fn unmark_earlier_life(
        &self,
        session: &Session,
        id: &str,
        who: &ParticipantData,
    ) -> Result<()> {
        let client = session.client();
        let node = self.mark_path(id);
        let Some((data, stat)) = unless_missing(
            session
                .retry("read", &node, || client.get_data(&node))
                .await,
        )?
        else {
            return Ok(());
        };
        if RunMark::parse(&data).is_some_and(|m| m.who.pod_uid != who.pod_uid) {
            info!(marks = %self.path, id, "a mark of another pod of our name: left to the controller");
            return Ok(());
        }
        match session
            .retry("delete", &node, || client.delete(&node, Some(stat.version)))
            .await
        {
            Ok(())
            | Err(ZkError::Zk {
                source: zk::Error::NoNode | zk::Error::BadVersion,
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes `id`'s mark, if it is there: its command is dead.
    pub async fn unmark(&self, session: &Session, id: &str) -> Result<()> {
        super::tree::delete_if_present(session, &self.mark_path(id))
            .await
            .map(|_| ())
    }

    /// Waits, on watches, until no mark of a round before `k` is left but
    /// `ours` (the caller's own: a command of ours is dead by the time we
    /// wait, so a mark of it that we could not remove must not hold us):
    /// no command of an earlier round still runs. Returns at once when the
    /// barrier has no marks' node. Every wake-up lists the marks again.
    pub async fn await_none_before(&self, session: &Session, k: u32, ours: &str) -> Result<()> {
        let client = session.client();
        let mut told = false;
        loop {
            let Some((children, _, watch)) = unless_missing(
                session
                    .retry("watch", &self.path, || {
                        client.get_and_watch_children(&self.path)
                    })
                    .await,
            )?
            else {
                return Ok(());
            };
            let mut earlier = Vec::new();
            for id in children.iter().filter(|id| *id != ours) {
                let node = self.mark_path(id);
                let found = unless_missing(
                    session
                        .retry("read", &node, || client.get_data(&node))
                        .await,
                )?;
                // Unreadable data is nobody's mark of ours: a round's number
                // we cannot tell is taken as earlier. (Gone since: ended.)
                if found.is_some_and(|(data, _)| RunMark::parse(&data).is_none_or(|m| m.round < k))
                {
                    earlier.push(id.clone());
                }
            }
            if earlier.is_empty() {
                session.retire_watch(watch.changed());
                return Ok(());
            }
            if !told {
                info!(marks = %self.path, round = k, members = ?earlier, "waiting for the commands of earlier rounds to end");
                told = true;
            }
            // A mark replaced (set) does not change the children: the
            // members watched here are of earlier rounds, and a member
            // re-marks only for a later round after unmarking, or in a new
            // life, which the watch on the children does not see; so the
            // wait also looks again every few seconds.
            if let Ok(event) = tokio::time::timeout(RELOOK, watch.changed()).await {
                check_session(&event)?;
            }
        }
    }
}

/// `found`, with a missing node as `None`.
fn unless_missing<T>(found: Result<T>) -> Result<Option<T>> {
    match found {
        Ok(found) => Ok(Some(found)),
        Err(ZkError::Zk {
            source: zk::Error::NoNode,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// How often a wait for earlier rounds' commands looks again without a
/// change of the marks' children (a mark replaced in place).
const RELOOK: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_says_its_round_and_who_beside_what_a_participant_says() {
        let mark = RunMark {
            round: 3,
            who: ParticipantData {
                id: Some("train-0".into()),
                pod: Some("train-0".into()),
                pod_uid: Some("u-1".into()),
                ..ParticipantData::default()
            },
        };
        let bytes = mark.to_bytes();
        assert_eq!(RunMark::parse(&bytes), Some(mark.clone()));
        // The controller reads the pod from it as from a registration.
        assert_eq!(ParticipantData::parse(&bytes), mark.who);
        assert_eq!(RunMark::parse(b"not json"), None);
    }
}
