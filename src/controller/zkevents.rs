//! ZooKeeper changes as reconcile triggers: one persistent recursive watch
//! on `<root>/namespaces` turns every create, delete or data change below
//! it into a reconcile of the resource it belongs to.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_util::time::DelayQueue;
use tracing::{debug, info};
use zookeeper_client as zk;

use crate::api::{Barrier, LockLease};
use crate::layout::{Layout, ResourceKind};
use crate::zk::{Session, SessionState, ZkError};

/// Where triggers go.
pub struct Triggers {
    /// Barriers to reconcile.
    pub barriers: UnboundedSender<ObjectRef<Barrier>>,
    /// LockLeases to reconcile.
    pub locks: UnboundedSender<ObjectRef<LockLease>>,
    /// Reconcile every Barrier (events may have been missed).
    pub all_barriers: UnboundedSender<()>,
    /// Reconcile every LockLease.
    pub all_locks: UnboundedSender<()>,
    /// At most one trigger per resource per `interval` (see [`Throttle`]).
    pub interval: Duration,
}

/// Follows the changes until the session ends.
pub async fn follow(session: &Session, layout: &Layout, triggers: Triggers) -> Result<(), ZkError> {
    let root = layout.namespaces_root();
    let client = session.client();
    let dir = zk::CreateMode::Persistent.with_acls(session.node_acls());
    session.mkdir_all(&root, &dir).await?;
    let mut watcher = session
        .retry("watch", &root, || {
            client.watch(&root, zk::AddWatchMode::PersistentRecursive)
        })
        .await
        .map_err(|e| match e {
            ZkError::Zk {
                source: zk::Error::Unimplemented,
                ..
            } => ZkError::Unsupported {
                what: "persistent recursive watches",
                needs: "ZooKeeper 3.6 or newer",
            },
            e => e,
        })?;
    info!(%root, "following ZooKeeper changes");
    let mut barriers = Throttle::new(triggers.interval);
    let mut locks = Throttle::new(triggers.interval);
    loop {
        let event = tokio::select! {
            event = watcher.changed() => event,
            Some(barrier) = barriers.next_owed() => {
                let _ = triggers.barriers.send(barrier);
                continue;
            }
            Some(lock) = locks.next_owed() => {
                let _ = triggers.locks.send(lock);
                continue;
            }
        };
        if event.event_type == zk::EventType::Session {
            let state = SessionState::from_client(event.session_state);
            if let Some(err) = state.terminal_error() {
                // The watcher must not be polled after a terminal event.
                return Err(err);
            }
            if state == SessionState::Connected {
                // Changes made while disconnected may not be delivered.
                debug!("reconnected: reconciling everything");
                let _ = triggers.all_barriers.send(());
                let _ = triggers.all_locks.send(());
            }
            continue;
        }
        if own_creation(layout, &event) {
            continue;
        }
        let now = Instant::now();
        match layout.resource_of(&event.path) {
            Some((ResourceKind::Barrier, namespace, name)) => {
                if let Some(barrier) = barriers.offer(ObjectRef::new(&name).within(&namespace), now)
                {
                    let _ = triggers.barriers.send(barrier);
                }
            }
            Some((ResourceKind::Lock, namespace, name)) => {
                if let Some(lock) = locks.offer(ObjectRef::new(&name).within(&namespace), now) {
                    let _ = triggers.locks.send(lock);
                }
            }
            None => {}
        }
    }
}

/// Whether `event` is the creation of a resource's own node (a barrier or
/// lock node), which only the controller makes, in a reconcile that looks
/// at the node after making it: a trigger would repeat that look (the
/// second of the two reconciles a new resource cost). Any other path (a
/// registration, a hold, `ready`) and any deletion or data change of the
/// node still triggers; a node made again after a deletion was preceded by
/// the deletion's own trigger.
fn own_creation(layout: &Layout, event: &zk::WatchedEvent) -> bool {
    event.event_type == zk::EventType::NodeCreated
        && layout
            .resource_of(&event.path)
            .is_some_and(|(kind, namespace, name)| {
                let own = match kind {
                    ResourceKind::Barrier => layout.barrier(&namespace, &name),
                    ResourceKind::Lock => layout.lock(&namespace, &name),
                };
                own.is_ok_and(|own| own == event.path)
            })
}

/// Passes on at most one trigger per key per interval: the first at once,
/// and one at the end of the interval for all that came during it.
///
/// Why: the controller debounces its triggers, and a request asked again
/// before it runs is put off again. Unthrottled, the changes of a lock in
/// constant use (or a node a tenant rewrites without pause) would put its
/// reconcile off for as long as they go on: its spec changes unapplied, its
/// deletion stuck. The interval must be longer than the debounce.
struct Throttle<K> {
    interval: Duration,
    /// When each key was last passed on (pruned of those past the interval).
    passed: HashMap<K, Instant>,
    /// The keys owed a trigger at the end of their interval.
    owed: DelayQueue<K>,
    owed_keys: HashSet<K>,
}

impl<K: Hash + Eq + Clone> Throttle<K> {
    fn new(interval: Duration) -> Self {
        Throttle {
            interval,
            passed: HashMap::new(),
            owed: DelayQueue::new(),
            owed_keys: HashSet::new(),
        }
    }

    /// A trigger for `key` at `now`: `Some` to pass on now; otherwise it is
    /// owed, and [`Throttle::next_owed`] yields it when its interval ends.
    fn offer(&mut self, key: K, now: Instant) -> Option<K> {
        match self.passed.get(&key) {
            Some(&last) if now.duration_since(last) < self.interval => {
                if self.owed_keys.insert(key.clone()) {
                    self.owed.insert_at(key, last + self.interval);
                }
                None
            }
            _ => {
                if self.passed.len() >= PRUNE_AT {
                    let interval = self.interval;
                    self.passed
                        .retain(|_, last| now.duration_since(*last) < interval);
                }
                self.passed.insert(key.clone(), now);
                Some(key)
            }
        }
    }

    /// The next owed trigger, when its interval ends; `None` at once when
    /// none is owed (so a `select!` branch on it is disabled).
    async fn next_owed(&mut self) -> Option<K> {
        let key = futures::future::poll_fn(|cx| self.owed.poll_expired(cx))
            .await?
            .into_inner();
        self.owed_keys.remove(&key);
        self.passed.insert(key.clone(), Instant::now());
        Some(key)
    }
}

/// How many keys [`Throttle`] remembers before it forgets those past their
/// interval.
const PRUNE_AT: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    #[tokio::test(start_paused = true)]
    async fn the_first_trigger_passes_at_once_and_the_rest_once_at_the_intervals_end() {
        let mut throttle = Throttle::new(INTERVAL);
        let start = Instant::now();
        assert_eq!(throttle.offer("a", start), Some("a"));
        assert_eq!(throttle.offer("b", start), Some("b"), "keys are apart");
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(5)).await;
            assert_eq!(throttle.offer("a", Instant::now()), None);
        }
        assert_eq!(throttle.next_owed().await, Some("a"));
        assert_eq!(
            Instant::now(),
            start + INTERVAL,
            "owed until the interval ends"
        );
        assert_eq!(throttle.next_owed().await, None, "owed once");
        // Passed on at the interval's end: the next interval starts there.
        assert_eq!(throttle.offer("a", Instant::now()), None);
        assert_eq!(throttle.next_owed().await, Some("a"));
        assert_eq!(Instant::now(), start + INTERVAL * 2);
        tokio::time::advance(INTERVAL).await;
        assert_eq!(
            throttle.offer("a", Instant::now()),
            Some("a"),
            "quiet: at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn triggers_without_pause_pass_once_per_interval() {
        let mut throttle = Throttle::new(INTERVAL);
        let start = Instant::now();
        let mut passed = Vec::new();
        let mut at = start;
        while at < start + INTERVAL * 10 {
            tokio::select! {
                biased;
                Some(key) = throttle.next_owed() => passed.push((key, Instant::now())),
                () = tokio::time::sleep_until(at) => {
                    if let Some(key) = throttle.offer("busy", at) {
                        passed.push((key, at));
                    }
                    at += Duration::from_millis(1);
                }
            }
        }
        assert!(
            (10..=11).contains(&passed.len()),
            "one per interval: {passed:?}"
        );
        for pair in passed.windows(2) {
            assert!(pair[1].1 - pair[0].1 >= INTERVAL, "{passed:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keys_past_their_interval_are_forgotten() {
        let mut throttle = Throttle::new(INTERVAL);
        for key in 0..PRUNE_AT {
            throttle.offer(key, Instant::now());
        }
        tokio::time::advance(INTERVAL).await;
        throttle.offer(PRUNE_AT, Instant::now());
        assert_eq!(throttle.passed.len(), 1);
    }
}
