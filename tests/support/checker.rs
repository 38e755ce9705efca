//! The invariant checker the fault tests share: every holder records the
//! interval it believed it held a lock and the fencing token it was given;
//! at the end the record must show no conflicting overlap and tokens that
//! order every writer against everything else.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How a hold shares its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// Exclusive: a mutex hold or a write hold.
    Exclusive,
    /// Shared with other readers.
    Read,
    /// `taken` permits of a semaphore of `of`: holds may overlap as long as
    /// the permits they take together never exceed `of`.
    Permits { taken: u32, of: u32 },
}

#[derive(Clone, Debug)]
struct Interval {
    lock: String,
    share: Share,
    token: i64,
    start: Instant,
    end: Instant,
    holder: String,
}

/// Records hold intervals from many tasks; cheap to clone.
#[derive(Clone, Default)]
pub struct HoldLog {
    intervals: Arc<Mutex<Vec<Interval>>>,
}

/// One hold being recorded: started when the acquire returned.
pub struct Recording {
    log: HoldLog,
    lock: String,
    share: Share,
    token: i64,
    start: Instant,
    holder: String,
}

impl HoldLog {
    /// Starts recording a hold of `lock` with fencing token `token`; call
    /// right after the acquire returned.
    pub fn held(&self, lock: &str, share: Share, token: i64, holder: &str) -> Recording {
        Recording {
            log: self.clone(),
            lock: lock.to_owned(),
            share,
            token,
            start: Instant::now(),
            holder: holder.to_owned(),
        }
    }

    /// How many holds were recorded.
    pub fn len(&self) -> usize {
        self.intervals.lock().unwrap().len()
    }

    /// The most of `lock` held at once: readers count one each, a
    /// semaphore's holds the permits they took, an exclusive hold one. The
    /// lower bound of a shared lock's checks (readers did overlap, a
    /// semaphore did reach N): a lock that became fully exclusive reads 1.
    pub fn most_at_once(&self, lock: &str) -> u32 {
        let intervals = self.intervals.lock().unwrap();
        let mut edges: Vec<(Instant, i64)> = Vec::new();
        for h in intervals.iter().filter(|h| h.lock == lock) {
            let n = match h.share {
                Share::Permits { taken, .. } => i64::from(taken),
                Share::Read | Share::Exclusive => 1,
            };
            edges.push((h.start, n));
            edges.push((h.end, -n));
        }
        // An end before a start at the same instant: touching is no overlap.
        edges.sort_by_key(|e| (e.0, e.1));
        let (mut now, mut most) = (0i64, 0i64);
        for (_, step) in edges {
            now += step;
            most = most.max(now);
        }
        most as u32
    }

    /// Panics with the first violation: an exclusive hold overlapping any
    /// other hold of the same lock, or a token that does not order an
    /// exclusive hold against a hold that ended before it began (or began
    /// after it ended). Readers may overlap and need no order among
    /// themselves.
    pub fn assert_invariants(&self) {
        let intervals = self.intervals.lock().unwrap().clone();
        let mut by_lock: std::collections::BTreeMap<&str, Vec<&Interval>> = Default::default();
        for i in &intervals {
            by_lock.entry(&i.lock).or_default().push(i);
        }
        for (lock, holds) in by_lock {
            let mut tokens = std::collections::HashSet::new();
            for h in &holds {
                assert!(
                    tokens.insert(h.token),
                    "{lock}: token {} handed out twice",
                    h.token
                );
            }
            // Permits: a sweep over the intervals' ends (an end before a
            // start at the same instant) finds the most held at once.
            let mut edges: Vec<(Instant, i64, u32)> = Vec::new();
            for h in &holds {
                if let Share::Permits { taken, of } = h.share {
                    edges.push((h.start, i64::from(taken), of));
                    edges.push((h.end, -i64::from(taken), of));
                }
            }
            edges.sort_by_key(|e| (e.0, e.1));
            let mut now = 0;
            for (at, step, of) in edges {
                now += step;
                assert!(
                    now <= i64::from(of),
                    "{lock}: {now} permits held at once of {of} (at {at:?})"
                );
            }
            for (n, a) in holds.iter().enumerate() {
                for b in &holds[n + 1..] {
                    let shared = |s: Share| matches!(s, Share::Read | Share::Permits { .. });
                    if shared(a.share) && shared(b.share) {
                        continue;
                    }
                    let (first, second) = if a.start <= b.start { (a, b) } else { (b, a) };
                    assert!(
                        first.end <= second.start,
                        "{lock}: {} ({:?}, token {}) and {} ({:?}, token {}) held at once",
                        first.holder,
                        first.share,
                        first.token,
                        second.holder,
                        second.share,
                        second.token
                    );
                    assert!(
                        first.token < second.token,
                        "{lock}: {} held before {} but its token {} is not below {}",
                        first.holder,
                        second.holder,
                        first.token,
                        second.token
                    );
                }
            }
        }
    }
}

impl Recording {
    /// Ends the interval; call right before releasing.
    pub fn released(self) {
        let end = Instant::now();
        self.log.intervals.lock().unwrap().push(Interval {
            lock: self.lock,
            share: self.share,
            token: self.token,
            start: self.start,
            end,
            holder: self.holder,
        });
    }
}
