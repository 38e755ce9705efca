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

use crate::api::{BarrierPhase, BarrierStatus, LockLeaseStatus, LockPhase};
use crate::zk::tree::Snapshot;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

const PHASES: [BarrierPhase; 5] = [
    BarrierPhase::Waiting,
    BarrierPhase::Open,
    BarrierPhase::Leaving,
    BarrierPhase::Completed,
    BarrierPhase::Failed,
];

#[derive(Default)]
struct Seen {
    barriers: HashMap<(String, String), (BarrierPhase, i64)>,
    locks: HashMap<(String, String), (i64, i64)>,
    opened: HashMap<(String, String), ()>,
    /// Waiting barriers by when their node was made (seconds).
    waiting_since: Earliest,
    /// Held locks by their earliest revocation (seconds).
    revocations: Earliest,
}

/// A time per resource and the earliest of them, kept in order so that a
/// look at one resource costs O(log n) at any scale.
#[derive(Default)]
struct Earliest {
    by_key: HashMap<(String, String), i64>,
    ordered: std::collections::BTreeSet<(i64, (String, String))>,
}

impl Earliest {
    /// Sets (or, with `None`, forgets) `key`'s time; returns the earliest
    /// time left, 0 when none (what the gauge shows then).
    fn set(&mut self, key: (String, String), at: Option<i64>) -> i64 {
        if let Some(old) = self.by_key.remove(&key) {
            self.ordered.remove(&(old, key.clone()));
        }
        if let Some(at) = at {
            self.by_key.insert(key.clone(), at);
            self.ordered.insert((at, key));
        }
        self.ordered.first().map_or(0, |(at, _)| *at)
    }
}

/// The controller's metrics and the registry that serves them.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    duration: Family<KindLabel, Histogram, fn() -> Histogram>,
    barriers: Family<PhaseLabel, Gauge>,
    lock_leases: Family<PhaseLabel, Gauge>,
    waiting_participants: Gauge,
    lock_holders: Gauge,
    lock_waiters: Gauge,
    open_latency: Histogram,
    session_connected: Gauge,
    leader: Gauge,
    term_failures: Counter,
    pod_lookups: Family<SourceLabel, Counter>,
    admissions: Family<OutcomeLabel, Counter>,
    oldest_waiting: Gauge,
    earliest_revocation: Gauge,
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
        let lock_leases = Family::<PhaseLabel, Gauge>::default();
        let waiting_participants = Gauge::default();
        let lock_holders = Gauge::default();
        let lock_waiters = Gauge::default();
        let open_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let session_connected = Gauge::default();
        let leader = Gauge::default();
        let term_failures = Counter::default();
        let pod_lookups = Family::<SourceLabel, Counter>::default();
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
            "lock_leases",
            "LockLeases by phase (Free, Held)",
            lock_leases.clone(),
        );
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
        registry.register(
            "pod_lookups",
            "Lookups of the pod behind a persistent registration, by where they were answered (cache: the watched labelled pods; api: a GET)",
            pod_lookups.clone(),
        );
        let admissions = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "webhook_admissions",
            "Labelled pods the admission webhook answered, by outcome (injected, unchanged: nothing to add, refused: a bad label, failed: the namespace could not be prepared)",
            admissions.clone(),
        );
        let oldest_waiting = Gauge::default();
        registry.register(
            "barrier_oldest_waiting_created_timestamp_seconds",
            "When the oldest barrier still waiting was made (Unix seconds; 0: none waits)",
            oldest_waiting.clone(),
        );
        let earliest_revocation = Gauge::default();
        registry.register(
            "lock_earliest_revocation_timestamp_seconds",
            "When the first hold with a lease duration will be revoked (Unix seconds; 0: none)",
            earliest_revocation.clone(),
        );
        // Every label set exists from the start, at zero: a series that
        // appears only with its first event breaks rate() and alerts (and
        // the dashboard test reads the names from a fresh controller).
        for kind in ["Barrier", "LockLease"] {
            let label = KindLabel { kind: kind.into() };
            let _ = reconciles.get_or_create(&label);
            let _ = errors.get_or_create(&label);
            let _ = duration.get_or_create(&label);
        }
        for phase in PHASES {
            let _ = barriers.get_or_create(&PhaseLabel {
                phase: format!("{phase:?}"),
            });
        }
        for phase in ["Free", "Held"] {
            let _ = lock_leases.get_or_create(&PhaseLabel {
                phase: phase.into(),
            });
        }
        for source in ["cache", "api"] {
            let _ = pod_lookups.get_or_create(&SourceLabel { source });
        }
        for outcome in ["injected", "unchanged", "refused", "failed"] {
            let _ = admissions.get_or_create(&OutcomeLabel { outcome });
        }
        Metrics {
            registry,
            admissions,
            oldest_waiting,
            earliest_revocation,
            reconciles,
            errors,
            duration,
            barriers,
            lock_leases,
            waiting_participants,
            lock_holders,
            lock_waiters,
            open_latency,
            session_connected,
            leader,
            term_failures,
            pod_lookups,
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

    /// Counts an admission answered by the webhook.
    pub fn admitted(&self, outcome: &'static str) {
        self.admissions
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Pod lookups answered from the cache and by GETs.
    pub fn pod_lookups(&self, cached: u64, fetched: u64) {
        self.pod_lookups
            .get_or_create(&SourceLabel { source: "cache" })
            .inc_by(cached);
        self.pod_lookups
            .get_or_create(&SourceLabel { source: "api" })
            .inc_by(fetched);
    }

    /// Counts a failed ZooKeeper term (connect, lead, follow).
    pub fn term_failed(&self) {
        self.term_failures.inc();
    }

    /// Sets whether this replica leads. A replica that stops leading
    /// forgets the resources it saw: its gauges would otherwise add to the
    /// new leader's in any sum across replicas.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(leader as i64);
        if !leader {
            let Ok(mut seen) = self.seen.lock() else {
                return;
            };
            *seen = Seen::default();
            for phase in PHASES {
                self.phase_gauge(phase).set(0);
            }
            for held in [false, true] {
                self.lock_phase_gauge(held).set(0);
            }
            self.waiting_participants.set(0);
            self.lock_holders.set(0);
            self.lock_waiters.set(0);
            self.oldest_waiting.set(0);
            self.earliest_revocation.set(0);
        }
    }

    fn phase_gauge(&self, phase: BarrierPhase) -> Gauge {
        self.barriers
            .get_or_create(&PhaseLabel {
                phase: format!("{phase:?}"),
            })
            .clone()
    }

    fn lock_phase_gauge(&self, held: bool) -> Gauge {
        let phase = if held {
            LockPhase::Held
        } else {
            LockPhase::Free
        };
        self.lock_leases
            .get_or_create(&PhaseLabel {
                phase: format!("{phase:?}"),
            })
            .clone()
    }

    /// Replaces what is known of one barrier, moving the gauges by the
    /// difference (a look at one resource costs the same at any scale).
    fn set_barrier(
        &self,
        seen: &mut Seen,
        key: (String, String),
        now: Option<(BarrierPhase, i64)>,
    ) {
        let before = match now {
            Some(v) => seen.barriers.insert(key, v),
            None => seen.barriers.remove(&key),
        };
        if let Some((phase, waiting)) = before {
            self.phase_gauge(phase).dec();
            self.waiting_participants.dec_by(waiting);
        }
        if let Some((phase, waiting)) = now {
            self.phase_gauge(phase).inc();
            self.waiting_participants.inc_by(waiting);
        }
    }

    /// [`Metrics::set_barrier`] for a lock: holders and waiters.
    fn set_lock(&self, seen: &mut Seen, key: (String, String), now: Option<(i64, i64)>) {
        let before = match now {
            Some(v) => seen.locks.insert(key, v),
            None => seen.locks.remove(&key),
        };
        if let Some((holders, waiters)) = before {
            self.lock_phase_gauge(holders > 0).dec();
            self.lock_holders.dec_by(holders);
            self.lock_waiters.dec_by(waiters);
        }
        if let Some((holders, waiters)) = now {
            self.lock_phase_gauge(holders > 0).inc();
            self.lock_holders.inc_by(holders);
            self.lock_waiters.inc_by(waiters);
        }
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
        let since = (phase == BarrierPhase::Waiting).then_some(node.stat.ctime / 1000);
        self.oldest_waiting
            .set(seen.waiting_since.set(key.clone(), since));
        self.set_barrier(&mut seen, key, Some((phase, waiting)));
    }

    /// Forgets a deleted barrier.
    pub fn barrier_gone(&self, namespace: &str, name: &str) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let key = (namespace.to_owned(), name.to_owned());
        seen.opened.remove(&key);
        self.oldest_waiting
            .set(seen.waiting_since.set(key.clone(), None));
        self.set_barrier(&mut seen, key, None);
    }

    /// Records a lock's latest status.
    pub fn lock_seen(&self, namespace: &str, name: &str, status: &LockLeaseStatus) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let now = (status.holder_count as i64, status.waiting_count as i64);
        let key = (namespace.to_owned(), name.to_owned());
        let revocation = status
            .holders
            .iter()
            .filter_map(|h| h.expires_at.as_ref().map(|t| t.0.as_second()))
            .min();
        self.earliest_revocation
            .set(seen.revocations.set(key.clone(), revocation));
        self.set_lock(&mut seen, key, Some(now));
    }

    /// Forgets a deleted lock.
    pub fn lock_gone(&self, namespace: &str, name: &str) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let key = (namespace.to_owned(), name.to_owned());
        self.earliest_revocation
            .set(seen.revocations.set(key.clone(), None));
        self.set_lock(&mut seen, key, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn barrier(phase: BarrierPhase) -> BarrierStatus {
        BarrierStatus {
            phase: Some(phase),
            ..BarrierStatus::default()
        }
    }

    fn node(children: usize) -> Snapshot {
        Snapshot {
            data: Vec::new(),
            stat: crate::zk::tree::test_stat(0, 1, 0),
            children: (0..children)
                .map(|i| crate::zk::tree::ChildNode {
                    name: format!("p{i}"),
                    data: Vec::new(),
                    stat: crate::zk::tree::test_stat(0, 2, 0),
                })
                .collect(),
        }
    }

    fn value(metrics: &Metrics, line_start: &str) -> f64 {
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in {}", metrics.encode()))
    }

    #[test]
    fn gauges_follow_each_resource_and_a_replica_that_stops_leading_forgets_them() {
        let metrics = Metrics::default();
        metrics.set_leader(true);
        metrics.barrier_seen("a", "x", &barrier(BarrierPhase::Waiting), &node(2));
        metrics.barrier_seen("a", "y", &barrier(BarrierPhase::Waiting), &node(1));
        metrics.barrier_seen("a", "x", &barrier(BarrierPhase::Open), &node(2));
        let lock = LockLeaseStatus {
            holder_count: 1,
            waiting_count: 3,
            ..LockLeaseStatus::default()
        };
        metrics.lock_seen("a", "db", &lock);
        assert_eq!(value(&metrics, "zkgate_barriers{phase=\"Waiting\"} "), 1.0);
        assert_eq!(value(&metrics, "zkgate_barriers{phase=\"Open\"} "), 1.0);
        assert_eq!(value(&metrics, "zkgate_barrier_participants_waiting "), 1.0);
        assert_eq!(value(&metrics, "zkgate_lock_waiters "), 3.0);
        assert_eq!(value(&metrics, "zkgate_lock_leases{phase=\"Held\"} "), 1.0);
        metrics.lock_seen("a", "free", &LockLeaseStatus::default());
        metrics.lock_seen("a", "db", &lock);
        assert_eq!(value(&metrics, "zkgate_lock_leases{phase=\"Held\"} "), 1.0);
        assert_eq!(value(&metrics, "zkgate_lock_leases{phase=\"Free\"} "), 1.0);
        metrics.barrier_gone("a", "y");
        assert_eq!(value(&metrics, "zkgate_barriers{phase=\"Waiting\"} "), 0.0);
        assert_eq!(value(&metrics, "zkgate_barrier_participants_waiting "), 0.0);

        metrics.set_leader(false);
        assert_eq!(value(&metrics, "zkgate_barriers{phase=\"Open\"} "), 0.0);
        assert_eq!(value(&metrics, "zkgate_lock_holders "), 0.0);
        assert_eq!(value(&metrics, "zkgate_lock_waiters "), 0.0);
        assert_eq!(value(&metrics, "zkgate_lock_leases{phase=\"Free\"} "), 0.0);
        // A later term starts from nothing, not from negative counts.
        metrics.set_leader(true);
        metrics.lock_seen("a", "db", &lock);
        assert_eq!(value(&metrics, "zkgate_lock_waiters "), 3.0);
    }

    #[test]
    fn the_earliest_time_follows_sets_and_removals() {
        let key = |n: &str| ("ns".to_owned(), n.to_owned());
        let mut e = Earliest::default();
        assert_eq!(e.set(key("a"), Some(30)), 30);
        assert_eq!(e.set(key("b"), Some(10)), 10);
        assert_eq!(e.set(key("b"), Some(50)), 30, "b moved later");
        assert_eq!(e.set(key("a"), None), 50);
        assert_eq!(e.set(key("b"), None), 0, "none left");
    }
}
