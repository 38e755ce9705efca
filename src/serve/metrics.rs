//! Prometheus metrics of a zkgate server: the controller's and admission's.

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

/// A tenant's namespace. Not `namespace`: Prometheus sets that on every
/// series of a Kubernetes target (the controller's own namespace), and a
/// series' own label of that name would be renamed `exported_namespace`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    barrier_namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstallLabel {
    install_namespace: String,
    version: &'static str,
}

/// Why a Barrier fails ([`crate::api::BarrierStatus::reason`]); `other` for
/// anything else, so the label's values stay these.
const FAILURE_REASONS: [&str; 6] = [
    "TimedOut",
    "ParticipantLost",
    "AfterFailed",
    "RestartLimit",
    "Deleted",
    "other",
];

/// What the credential handout answered.
pub const HANDOUT_OUTCOMES: [&str; 3] = ["granted", "refused", "failed"];

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
    /// When this replica's term began (Unix ms): openings before it were
    /// the last leader's to count.
    leading_since_ms: i64,
    /// Each barrier's `status.restarts`, for the restarts counter.
    restarts: HashMap<(String, String), u32>,
    /// Barriers seen per namespace: a namespace's held-time series goes
    /// with its last Barrier (namespaces come and go; series must not
    /// pile up).
    per_namespace: HashMap<String, usize>,
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
    held: Family<TenantLabel, Histogram, fn() -> Histogram>,
    failures: Family<ReasonLabel, Counter>,
    gang_restarts: Counter,
    handouts: Family<OutcomeLabel, Counter>,
    admission_duration: Histogram,
    certificate_expiry: Gauge,
    install: Family<InstallLabel, Gauge>,
    seen: Mutex<Seen>,
}

/// From half a second to about four and a half hours: how long a pod may
/// sit at a barrier.
fn held_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.5, 2.0, 16))
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
            "Labelled pods the admission webhook answered, by outcome (injected; unchanged: nothing to add; refused: what the pod asks for is wrong or missing; failed: an API read it needed, or encoding the patch, failed: the pod is refused too)",
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
        let held = Family::<TenantLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            held_buckets as fn() -> Histogram,
        );
        registry.register(
            "barrier_held_seconds",
            "How long each participant waited at a barrier, from its registration to the opening (the time pods hold their nodes idle), by the Barrier's namespace",
            held.clone(),
        );
        let failures = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "barrier_failures",
            "Barriers that failed, by reason (TimedOut, ParticipantLost, AfterFailed, RestartLimit, Deleted, other), counted by the leader that saw them fail",
            failures.clone(),
        );
        let gang_restarts = Counter::default();
        registry.register(
            "barrier_gang_restarts",
            "Restarts of gangs in rounds (RestartGang), counted by the leader that saw them",
            gang_restarts.clone(),
        );
        let handouts = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "handout_requests",
            "Credential handout requests by outcome (granted; refused: no valid pod token, or not a labelled pod; failed: ZooKeeper or the API server could not answer)",
            handouts.clone(),
        );
        let admission_duration = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "webhook_admission_duration_seconds",
            "How long the admission webhook took to answer a labelled pod",
            admission_duration.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "When the certificate the webhook serves expires (Unix seconds; 0: no webhook)",
            certificate_expiry.clone(),
        );
        let install = Family::<InstallLabel, Gauge>::default();
        registry.register(
            "install_info",
            "1, labelled with the controller's namespace (install_namespace) and release (version): alerts pick an install's replicas by it whatever labels the scrape adds",
            install.clone(),
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
        for reason in FAILURE_REASONS {
            let _ = failures.get_or_create(&ReasonLabel { reason });
        }
        for outcome in HANDOUT_OUTCOMES {
            let _ = handouts.get_or_create(&OutcomeLabel { outcome });
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
            held,
            failures,
            gang_restarts,
            handouts,
            admission_duration,
            certificate_expiry,
            install,
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

    /// Says which install this replica belongs to (its namespace) in
    /// `zkgate_install_info`.
    pub fn set_install(&self, namespace: &str) {
        self.install
            .get_or_create(&InstallLabel {
                install_namespace: namespace.to_owned(),
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
    }

    /// Counts a credential handout answer (one of [`HANDOUT_OUTCOMES`]).
    pub fn handed_out(&self, outcome: &'static str) {
        self.handouts.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Records how long an admission took.
    pub fn admission_took(&self, took: Duration) {
        self.admission_duration.observe(took.as_secs_f64());
    }

    /// Sets when the served webhook certificate expires (Unix seconds).
    pub fn set_certificate_expiry(&self, not_after: i64) {
        self.certificate_expiry.set(not_after);
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
        if leader {
            if let Ok(mut seen) = self.seen.lock() {
                seen.leading_since_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
            }
        }
        if !leader {
            let Ok(mut seen) = self.seen.lock() else {
                return;
            };
            *seen = Seen::default();
            // Its series would otherwise stay, namespaces gone included.
            self.held.clear();
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
        let namespace = key.0.clone();
        let before = match now {
            Some(v) => seen.barriers.insert(key, v),
            None => seen.barriers.remove(&key),
        };
        match (before.is_some(), now.is_some()) {
            (false, true) => *seen.per_namespace.entry(namespace).or_default() += 1,
            (true, false) => {
                let left = seen.per_namespace.get_mut(&namespace).map(|n| {
                    *n = n.saturating_sub(1);
                    *n
                });
                if left == Some(0) {
                    seen.per_namespace.remove(&namespace);
                    self.held.remove(&TenantLabel {
                        barrier_namespace: namespace,
                    });
                }
            }
            _ => {}
        }
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
            // Opened before this term: the last leader counted it.
            let ready = ready.filter(|at| *at >= seen.leading_since_ms);
            if let (Some(ready), Some(last)) = (ready, last) {
                self.open_latency
                    .observe(((ready - last).max(0) as f64) / 1000.0);
                // Each participant's wait: from its registration to `ready`.
                let held = self.held.get_or_create(&TenantLabel {
                    barrier_namespace: namespace.to_owned(),
                });
                for c in node.children.iter().filter(|c| c.name != crate::zk::READY) {
                    held.observe(((ready - c.stat.ctime).max(0) as f64) / 1000.0);
                }
            }
            seen.opened.insert(key.clone(), ());
        }
        // Changes seen by this leader only: a replica that starts leading
        // knows no barrier's before, and counts nothing it did not see.
        if let Some((before, _)) = seen.barriers.get(&key) {
            if phase == BarrierPhase::Failed && *before != BarrierPhase::Failed {
                let reason = status.reason.as_deref().unwrap_or("other");
                let reason = FAILURE_REASONS
                    .iter()
                    .find(|r| **r == reason)
                    .copied()
                    .unwrap_or("other");
                self.failures.get_or_create(&ReasonLabel { reason }).inc();
            }
        }
        if let Some(before) = seen.restarts.insert(key.clone(), status.restarts) {
            self.gang_restarts
                .inc_by(u64::from(status.restarts.saturating_sub(before)));
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
        seen.restarts.remove(&key);
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
    fn waits_failures_and_restarts_are_counted_once_by_the_leader_that_saw_them() {
        let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        // Two registrations, 4 s and 1 s before the opening.
        let opened = |at: i64| Snapshot {
            data: Vec::new(),
            stat: crate::zk::tree::test_stat(at - 5000, 1, 0),
            children: [("p0", at - 4000), ("p1", at - 1000), (crate::zk::READY, at)]
                .into_iter()
                .map(|(name, ctime)| crate::zk::tree::ChildNode {
                    name: name.into(),
                    data: Vec::new(),
                    stat: crate::zk::tree::test_stat(ctime, 2, 0),
                })
                .collect(),
        };
        let metrics = Metrics::default();
        metrics.set_leader(true);
        metrics.barrier_seen("team-a", "x", &barrier(BarrierPhase::Waiting), &node(1));
        metrics.barrier_seen(
            "team-a",
            "x",
            &barrier(BarrierPhase::Open),
            &opened(now + 60_000),
        );
        metrics.barrier_seen(
            "team-a",
            "x",
            &barrier(BarrierPhase::Open),
            &opened(now + 60_000),
        );
        let held = "zkgate_barrier_held_seconds_sum{barrier_namespace=\"team-a\"} ";
        assert_eq!(value(&metrics, held), 5.0, "4 s and 1 s, once");
        assert_eq!(
            value(
                &metrics,
                "zkgate_barrier_held_seconds_count{barrier_namespace=\"team-a\"} "
            ),
            2.0
        );

        let failed = |reason: &str, restarts: u32| BarrierStatus {
            phase: Some(BarrierPhase::Failed),
            reason: Some(reason.into()),
            restarts,
            ..BarrierStatus::default()
        };
        let waiting = |restarts: u32| BarrierStatus {
            phase: Some(BarrierPhase::Waiting),
            restarts,
            ..BarrierStatus::default()
        };
        metrics.barrier_seen("team-a", "g", &waiting(0), &node(1));
        metrics.barrier_seen("team-a", "g", &waiting(2), &node(1));
        metrics.barrier_seen("team-a", "g", &failed("RestartLimit", 2), &node(0));
        metrics.barrier_seen("team-a", "g", &failed("RestartLimit", 2), &node(0));
        metrics.barrier_seen("team-a", "h", &waiting(0), &node(1));
        metrics.barrier_seen("team-a", "h", &failed("a tenant's words", 0), &node(0));
        assert_eq!(value(&metrics, "zkgate_barrier_gang_restarts_total "), 2.0);
        assert_eq!(
            value(
                &metrics,
                "zkgate_barrier_failures_total{reason=\"RestartLimit\"} "
            ),
            1.0
        );
        assert_eq!(
            value(&metrics, "zkgate_barrier_failures_total{reason=\"other\"} "),
            1.0
        );

        // A namespace's held-time series goes with its last Barrier.
        metrics.barrier_seen("team-b", "y", &barrier(BarrierPhase::Waiting), &node(1));
        metrics.barrier_seen(
            "team-b",
            "y",
            &barrier(BarrierPhase::Open),
            &opened(now + 60_000),
        );
        assert!(metrics.encode().contains("barrier_namespace=\"team-b\""));
        metrics.barrier_gone("team-b", "y");
        assert!(!metrics.encode().contains("barrier_namespace=\"team-b\""));

        // A new term sees the same barriers for the first time: what it
        // did not see happen is not counted again.
        metrics.set_leader(false);
        metrics.set_leader(true);
        // (Its term began after the opening, whatever this clock says.)
        metrics.seen.lock().unwrap().leading_since_ms = now + 120_000;
        metrics.barrier_seen(
            "team-a",
            "x",
            &barrier(BarrierPhase::Open),
            &opened(now + 60_000),
        );
        metrics.barrier_seen("team-a", "g", &failed("RestartLimit", 2), &node(0));
        assert!(
            !metrics.encode().contains("barrier_namespace=\"team-a\""),
            "an opening before the term was counted again (the last term's series go with it)"
        );
        assert_eq!(value(&metrics, "zkgate_barrier_gang_restarts_total "), 2.0);
        assert_eq!(
            value(
                &metrics,
                "zkgate_barrier_failures_total{reason=\"RestartLimit\"} "
            ),
            1.0
        );
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
