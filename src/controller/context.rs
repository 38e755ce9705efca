//! What every reconcile shares.

use std::sync::Arc;

use kube::runtime::events::{Event, EventType, Recorder};
use kube::Resource;
use tracing::warn;

use super::metrics::Metrics;
use super::status::Note;
use crate::layout::Layout;
use crate::zk::Session;

/// The name on status writes (server-side apply) and events.
pub const MANAGER: &str = "zkgate-controller";

pub use crate::api::FINALIZER;

/// Shared by all reconciles of one leadership term.
pub struct Context {
    /// The Kubernetes client.
    pub client: kube::Client,
    /// The ZooKeeper session.
    pub zk: Arc<Session>,
    /// Where resources live in ZooKeeper.
    pub layout: Layout,
    /// Records events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The namespaces' ZooKeeper credentials and ACLs.
    pub credentials: super::credentials::Credentials,
    /// Reconcile failures in a row, per object (the error policy's backoff).
    pub failures: super::backoff::Failures,
    /// The Barrier statuses this term applied.
    pub barrier_status: StatusMemory<crate::api::BarrierStatus>,
    /// The LockLease statuses this term applied.
    pub lock_status: StatusMemory<crate::api::LockLeaseStatus>,
    /// The fates of participants' pods.
    pub pods: super::pods::Pods,
    /// The Jobs that size Barriers.
    pub jobs: super::jobs::Jobs,
    /// This replica's node in the leader lock's queue (the one holding it).
    pub leader_node: String,
    /// Which Barriers wait on which (`spec.after`).
    pub after: super::waits::Waits,
}

/// The last status the controller applied, per resource uid: its memory of
/// lease starts, transitions (events) and leave times.
///
/// Why not the status read back: the controller's watch cache can lag its
/// own last write (a reconcile racing its own patch would restart a lease,
/// repeatedly under contention, and repeat events), and anyone with access
/// to the status subresource can edit it. A new term (another replica, a
/// restart) starts from the status read back, which is then as new as
/// anything written: the previous term's last write.
#[derive(Debug)]
pub struct StatusMemory<S> {
    last: std::sync::Mutex<std::collections::HashMap<String, S>>,
    /// A digest of the last status written per uid, as the API server
    /// hands it back: how the controller tells its own writes, coming back
    /// through the watch, from anyone else's (see `super::worth`). A digest,
    /// not a copy: a copy of every status was a third of the controller's
    /// memory at 10,000 resources.
    written: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl<S> Default for StatusMemory<S> {
    fn default() -> Self {
        StatusMemory {
            last: Default::default(),
            written: Default::default(),
        }
    }
}

impl<S: Clone + Default> StatusMemory<S> {
    /// What the status was: the last one applied for `uid` in this term,
    /// else `read` (the status read back).
    pub fn previous(&self, uid: &str, read: Option<&S>) -> S {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.get(uid).or(read).cloned().unwrap_or_default()
    }

    /// `status` was applied for `uid`.
    pub fn remember(&self, uid: &str, status: &S) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), status.clone());
    }

    /// `status` (in the form the API server hands back) was written for
    /// `uid`, or found already there.
    pub fn written(&self, uid: &str, status: &S)
    where
        S: std::fmt::Debug,
    {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), super::worth::digest(Some(status)));
    }

    /// Writes `status` (in the form the API server hands back) for `uid`
    /// through `write`, known as this term's own from before the write goes
    /// out. Why before: the watch can hand the write back before its
    /// response comes, and a status not yet known as the controller's own
    /// is taken for someone else's, worth a reconcile (a new resource cost
    /// two when the machine was busy). A failed write puts back what was
    /// known before it.
    pub async fn write_as_own<E>(
        &self,
        uid: &str,
        status: &S,
        write: impl std::future::Future<Output = Result<(), E>>,
    ) -> Result<(), E>
    where
        S: std::fmt::Debug,
    {
        let before = self
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), super::worth::digest(Some(status)));
        let outcome = write.await;
        if outcome.is_err() {
            let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
            match before {
                Some(before) => written.insert(uid.to_owned(), before),
                None => written.remove(uid),
            };
        }
        outcome
    }

    /// Whether `status`, read back for `uid`, is the last one this term
    /// wrote (or found there).
    pub fn is_written(&self, uid: &str, status: Option<&S>) -> bool
    where
        S: std::fmt::Debug,
    {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.get(uid) == Some(&super::worth::digest(status))
    }

    /// The resource is gone.
    pub fn forget(&self, uid: &str) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }
}

impl Context {
    /// Confirms, by a round trip to ZooKeeper, that this replica still
    /// holds the leader lock: the check before each status write, so a
    /// replica that was paused past its session (and deposed) does not
    /// overwrite the new leader's status with what it saw before the pause.
    pub async fn confirm_leading(&self) -> Result<(), super::Error> {
        match self.zk.client().check_stat(&self.leader_node).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(super::Error::NotLeading(self.leader_node.clone())),
            Err(source) => Err(crate::zk::ZkError::Zk {
                op: "check",
                path: self.leader_node.clone(),
                source,
            }
            .into()),
        }
    }

    /// The ACLs for `namespace`'s nodes (see [`super::credentials`]).
    /// `rotation`: a rotation asked for by the resource reconciled.
    pub async fn namespace_acls(
        &self,
        namespace: &str,
        rotation: Option<&super::credentials::Rotation>,
    ) -> Result<
        (
            super::credentials::NamespaceAcls,
            Option<super::credentials::Rotated>,
        ),
        super::Error,
    > {
        self.credentials
            .namespace_acls(namespace, &self.zk, &self.layout, &self.client, rotation)
            .await
    }
}

impl Context {
    /// Records `note` on `obj`; a failure to record is logged, not fatal.
    pub async fn record<K: Resource<DynamicType = ()>>(&self, obj: &K, note: &Note) {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.to_owned(),
            note: Some(note.message.clone()),
            action: note.reason.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            warn!(error = %e, reason = note.reason, "could not record the event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BarrierPhase, BarrierStatus};

    #[test]
    fn a_status_is_the_controllers_own_only_if_it_is_the_last_one_written() {
        let memory = StatusMemory::<BarrierStatus>::default();
        let waiting = BarrierStatus {
            entered: 1,
            ..BarrierStatus::default()
        };
        let open = BarrierStatus {
            phase: Some(BarrierPhase::Open),
            entered: 3,
            ..BarrierStatus::default()
        };
        assert!(
            !memory.is_written("u", Some(&waiting)),
            "nothing written yet"
        );
        memory.written("u", &waiting);
        assert!(memory.is_written("u", Some(&waiting.clone())));
        assert!(!memory.is_written("u", Some(&open)), "someone else's");
        assert!(!memory.is_written("u", None), "a status removed");
        assert!(
            !memory.is_written("v", Some(&waiting)),
            "another resource's"
        );
        memory.written("u", &open);
        assert!(
            !memory.is_written("u", Some(&waiting)),
            "an older write of ours"
        );
        memory.forget("u");
        assert!(!memory.is_written("u", Some(&open)));
    }

    #[tokio::test]
    async fn a_status_is_known_as_the_controllers_own_before_its_write_goes_out() {
        let memory = StatusMemory::<BarrierStatus>::default();
        let waiting = BarrierStatus {
            entered: 1,
            ..BarrierStatus::default()
        };
        // The watch hands the write back before the write's response.
        let write = async {
            assert!(
                memory.is_written("u", Some(&waiting)),
                "the write came back through the watch as someone else's"
            );
            Ok::<_, ()>(())
        };
        memory.write_as_own("u", &waiting, write).await.unwrap();
        assert!(memory.is_written("u", Some(&waiting)));

        let open = BarrierStatus {
            phase: Some(BarrierPhase::Open),
            entered: 3,
            ..BarrierStatus::default()
        };
        let failed = memory.write_as_own("u", &open, async { Err(()) }).await;
        assert!(failed.is_err());
        assert!(
            memory.is_written("u", Some(&waiting)),
            "a failed write leaves the last one that went through"
        );
        assert!(!memory.is_written("u", Some(&open)));
        let failed = memory.write_as_own("v", &open, async { Err(()) }).await;
        assert!(failed.is_err());
        assert!(
            !memory.is_written("v", Some(&open)),
            "nothing was written for v"
        );
    }

    #[test]
    fn a_status_that_differs_only_below_the_second_is_someone_elses() {
        // The API server keeps what a client writes, fractions of a second
        // included; the controller writes whole seconds.
        let ours: BarrierStatus = serde_json::from_value(serde_json::json!({
            "phase": "Open", "entered": 3, "left": 0,
            "openedAt": "2026-12-03T10:00:00Z"
        }))
        .unwrap();
        let forged: BarrierStatus = serde_json::from_value(serde_json::json!({
            "phase": "Open", "entered": 3, "left": 0,
            "openedAt": "2026-12-03T10:00:00.999Z"
        }))
        .unwrap();
        assert_ne!(forged, ours);
        let memory = StatusMemory::<BarrierStatus>::default();
        memory.written("u", &ours);
        assert!(memory.is_written("u", Some(&ours)));
        assert!(!memory.is_written("u", Some(&forged)));
    }
}
