//! Prometheus metrics of the controller.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::api::{BarrierPhase, BarrierStatus, LockLeaseStatus};
use crate::zk::tree::Snapshot;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

#[derive(Default)]
struct Seen {
    barriers: HashMap<(String, String), (BarrierPhase, i64)>,
    locks: HashMap<(String, String), (i64, i64)>,
    opened: HashMap<(String, String), ()>,
}

/// The controller's metrics and the registry that serves them.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    duration: Family<KindLabel, Histogram, fn() -> Histogram>,
    barriers: Family<PhaseLabel, Gauge>,
    waiting_participants: Gauge,
    lock_holders: Gauge,
    lock_waiters: Gauge,
    open_latency: Histogram,
    session_connected: Gauge,
    leader: Gauge,
    term_failures: Counter,
    seen: Mutex<Seen>,
}

fn reconcile_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("zkgate");
        let reconciles = Family::<KindLabel, Counter>::default();
        let errors = Family::<KindLabel, Counter>::default();
        let duration = Family::<KindLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            reconcile_buckets as fn() -> Histogram,
        );
        let barriers = Family::<PhaseLabel, Gauge>::default();
        let waiting_participants = Gauge::default();
        let lock_holders = Gauge::default();
        let lock_waiters = Gauge::default();
        let open_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let session_connected = Gauge::default();
        let leader = Gauge::default();
        let term_failures = Counter::default();
        registry.register("reconciles", "Reconciles run, by kind", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by kind",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles take, by kind",
            duration.clone(),
        );
        registry.register("barriers", "Barriers by phase", barriers.clone());
        registry.register(
            "barrier_participants_waiting",
            "Participants registered in barriers that have not opened",
            waiting_participants.clone(),
        );
        registry.register(
            "lock_holders",
            "Holders across all LockLeases",
            lock_holders.clone(),
        );
        registry.register(
            "lock_waiters",
            "Waiters across all LockLeases",
            lock_waiters.clone(),
        );
        registry.register(
            "barrier_open_latency_seconds",
            "Time from the last participant's registration to the barrier opening",
            open_latency.clone(),
        );
        registry.register(
            "zookeeper_session_connected",
            "1 while the controller's ZooKeeper session is connected",
            session_connected.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica leads (reconciles)",
            leader.clone(),
        );
        registry.register(
            "term_failures",
            "ZooKeeper terms (connect, lead) that ended in an error and are retried with backoff",
            term_failures.clone(),
        );
        Metrics {
            registry,
            reconciles,
            errors,
            duration,
            barriers,
            waiting_participants,
            lock_holders,
            lock_waiters,
            open_latency,
            session_connected,
            leader,
            term_failures,
            seen: Mutex::default(),
        }
    }
}

impl Metrics {
    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts a reconcile.
    pub fn observe_reconcile(&self, kind: &str, took: Duration, failed: bool) {
        let label = KindLabel {
            kind: kind.to_owned(),
        };
        self.reconciles.get_or_create(&label).inc();
        self.duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        if failed {
            self.errors.get_or_create(&label).inc();
        }
    }

    /// Sets whether the ZooKeeper session is connected.
    pub fn set_session_connected(&self, connected: bool) {
        self.session_connected.set(connected as i64);
    }

    /// Counts a failed ZooKeeper term (connect, lead, follow).
    pub fn term_failed(&self) {
        self.term_failures.inc();
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(leader as i64);
    }

    /// Records a barrier's latest status.
    pub fn barrier_seen(
        &self,
        namespace: &str,
        name: &str,
        status: &BarrierStatus,
        node: &Snapshot,
    ) {
        let key = (namespace.to_owned(), name.to_owned());
        let Some(phase) = status.phase else { return };
        let waiting = if phase == BarrierPhase::Waiting {
            node.children.len() as i64
        } else {
            0
        };
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        if phase != BarrierPhase::Waiting
            && phase != BarrierPhase::Failed
            && !seen.opened.contains_key(&key)
        {
            // Time from the last registration to `ready`.
            let ready = node
                .children
                .iter()
                .find(|c| c.name == crate::zk::READY)
                .map(|c| c.stat.ctime);
            let last = node
                .children
                .iter()
                .filter(|c| c.name != crate::zk::READY)
                .map(|c| c.stat.ctime)
                .max();
            if let (Some(ready), Some(last)) = (ready, last) {
                self.open_latency
                    .observe(((ready - last).max(0) as f64) / 1000.0);
            }
            seen.opened.insert(key.clone(), ());
        }
        seen.barriers.insert(key, (phase, waiting));
        self.refresh(&seen);
    }

    /// Forgets a deleted barrier.
    pub fn barrier_gone(&self, namespace: &str, name: &str) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let key = (namespace.to_owned(), name.to_owned());
        seen.barriers.remove(&key);
        seen.opened.remove(&key);
        self.refresh(&seen);
    }

    /// Records a lock's latest status.
    pub fn lock_seen(&self, namespace: &str, name: &str, status: &LockLeaseStatus) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        seen.locks.insert(
            (namespace.to_owned(), name.to_owned()),
            (status.holder_count as i64, status.waiting_count as i64),
        );
        self.refresh(&seen);
    }

    /// Forgets a deleted lock.
    pub fn lock_gone(&self, namespace: &str, name: &str) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        seen.locks.remove(&(namespace.to_owned(), name.to_owned()));
        self.refresh(&seen);
    }

    fn refresh(&self, seen: &Seen) {
        for phase in [
            BarrierPhase::Waiting,
            BarrierPhase::Open,
            BarrierPhase::Leaving,
            BarrierPhase::Completed,
            BarrierPhase::Failed,
        ] {
            let count = seen.barriers.values().filter(|(p, _)| *p == phase).count() as i64;
            self.barriers
                .get_or_create(&PhaseLabel {
                    phase: format!("{phase:?}"),
                })
                .set(count);
        }
        self.waiting_participants
            .set(seen.barriers.values().map(|(_, w)| w).sum());
        self.lock_holders
            .set(seen.locks.values().map(|(h, _)| h).sum());
        self.lock_waiters
            .set(seen.locks.values().map(|(_, w)| w).sum());
    }
}
