//! Names of lock contenders: parsing the layouts of Curator and kazoo, and
//! ordering them by sequence number.
//!
//! Curator's protected names are `_c_<uuid>-<marker><seq>` with the markers
//! `lock-` (InterProcessMutex), `__READ__` and `__WRIT__`
//! (InterProcessReadWriteLock); kazoo's are `<hex>__lock__<seq>` and
//! `<hex>__rlock__<seq>`. Anything else under a lock node is foreign and
//! ignored.

use std::cmp::Ordering;

/// What a contender asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContenderKind {
    /// An exclusive lock (Curator `lock-`, kazoo `__lock__`).
    Exclusive,
    /// The read side of a read/write lock (Curator `__READ__`, kazoo `__rlock__`).
    Read,
    /// The write side of a read/write lock (Curator `__WRIT__`).
    Write,
    /// A permit of a semaphore (Curator InterProcessSemaphoreV2 `lease-`,
    /// under the semaphore's `leases` node; never in a lock's queue).
    Lease,
}

impl ContenderKind {
    /// Whether it excludes everyone (exclusive or writer).
    pub fn is_exclusive(self) -> bool {
        matches!(self, ContenderKind::Exclusive | ContenderKind::Write)
    }
}

/// The markers that end a contender's name before its sequence number.
/// Longer kazoo markers come first so `__rlock__` is not read as `lock-`.
const MARKERS: [(&str, ContenderKind); 5] = [
    ("__rlock__", ContenderKind::Read),
    ("__lock__", ContenderKind::Exclusive),
    ("__READ__", ContenderKind::Read),
    ("__WRIT__", ContenderKind::Write),
    ("lock-", ContenderKind::Exclusive),
];

/// The marker zkgate (like Curator) writes for a kind.
pub fn marker(kind: ContenderKind) -> &'static str {
    match kind {
        ContenderKind::Exclusive => "lock-",
        ContenderKind::Read => "__READ__",
        ContenderKind::Write => "__WRIT__",
        ContenderKind::Lease => super::semaphore::LEASE_MARKER,
    }
}

/// Curator's prefix for protected names: `_c_<uuid>-`.
pub const PROTECTED_PREFIX: &str = "_c_";

/// One contender in a lock's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contender {
    /// The node name.
    pub name: String,
    /// What it asks for.
    pub kind: ContenderKind,
    /// Its place in the queue (see [`sequence_key`]).
    pub sequence: u64,
}

impl Contender {
    /// Parses a child of a lock node; `None` for foreign children.
    pub fn parse(name: &str) -> Option<Contender> {
        MARKERS.iter().find_map(|(marker, kind)| {
            let at = name.rfind(marker)?;
            let sequence = sequence_key(&name[at + marker.len()..])?;
            Some(Contender {
                name: name.to_owned(),
                kind: *kind,
                sequence,
            })
        })
    }

    /// The protection id of a Curator-style name (`_c_<uuid>-`), by which a
    /// client finds the node its lost create made.
    pub fn protection_id(&self) -> Option<&str> {
        protection_id(&self.name)
    }
}

/// The `_c_<uuid>-` prefix of a protected name.
pub fn protection_id(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(PROTECTED_PREFIX)?;
    // A UUID in its hyphenated form is 36 characters.
    let uuid = rest.get(..36)?;
    (rest.as_bytes().get(36) == Some(&b'-')
        && uuid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
    .then(|| &name[..PROTECTED_PREFIX.len() + 37])
}

/// The ordering key of a sequence suffix.
///
/// ZooKeeper prints the parent's 32-bit counter as `%010d`; after 2^31
/// creations it wraps to negative numbers, which come *after* every
/// positive one. Reading a negative value as its unsigned 32-bit twin keeps
/// the order; 64-bit suffixes (19 digits) keep their value. `None` when the
/// suffix is not a sequence number.
pub fn sequence_key(suffix: &str) -> Option<u64> {
    let digits = suffix.strip_prefix('-').unwrap_or(suffix);
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: i64 = suffix.parse().ok()?;
    if value < 0 {
        let wrapped = i32::try_from(value).ok()?;
        Some(u64::from(wrapped as u32))
    } else {
        Some(value as u64)
    }
}

/// Parses and sorts a lock node's children into its queue, dropping
/// foreign children.
pub fn queue(children: &[String]) -> Vec<Contender> {
    let mut queue: Vec<Contender> = children
        .iter()
        .filter_map(|c| Contender::parse(c))
        .collect();
    queue.sort_by(compare);
    queue
}

fn compare(a: &Contender, b: &Contender) -> Ordering {
    a.sequence
        .cmp(&b.sequence)
        .then_with(|| a.name.cmp(&b.name))
}

/// The contender that `queue[index]` must wait for, or `None` when it holds
/// the lock: an exclusive contender or a writer waits for its predecessor;
/// a reader waits for the nearest exclusive contender or writer before it.
pub fn blocker(queue: &[Contender], index: usize) -> Option<&Contender> {
    let me = queue.get(index)?;
    let before = &queue[..index];
    if me.kind.is_exclusive() {
        before.last()
    } else {
        before.iter().rev().find(|c| c.kind.is_exclusive())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_curator_and_kazoo_names() {
        let c =
            Contender::parse("_c_0f8f7b3c-8c87-4e0b-9a43-9ad05a6c7a77-lock-0000000042").unwrap();
        assert_eq!((c.kind, c.sequence), (ContenderKind::Exclusive, 42));
        assert_eq!(
            c.protection_id(),
            Some("_c_0f8f7b3c-8c87-4e0b-9a43-9ad05a6c7a77-")
        );
        assert_eq!(
            Contender::parse("_c_x-__READ__0000000001").unwrap().kind,
            ContenderKind::Read
        );
        assert_eq!(
            Contender::parse("_c_x-__WRIT__0000000001").unwrap().kind,
            ContenderKind::Write
        );
        assert_eq!(
            Contender::parse("ab12__lock__0000000007").unwrap().kind,
            ContenderKind::Exclusive
        );
        assert_eq!(
            Contender::parse("ab12__rlock__0000000007").unwrap().kind,
            ContenderKind::Read
        );
        assert_eq!(Contender::parse("ready"), None);
        assert_eq!(Contender::parse("lock-abc"), None);
        assert_eq!(Contender::parse("lock-"), None);
    }

    #[test]
    fn sequence_order_survives_int32_overflow() {
        assert!(sequence_key("2147483647") < sequence_key("-2147483648"));
        assert!(sequence_key("-2147483648") < sequence_key("-1"));
        assert!(sequence_key("0000000009") < sequence_key("0000000010"));
        assert_eq!(sequence_key("-"), None);
        assert_eq!(sequence_key("12a"), None);
        assert_eq!(sequence_key("-9999999999"), None);
    }

    #[test]
    fn readers_wait_only_for_writers() {
        let names: Vec<String> = [
            "a__READ__0000000001",
            "b__WRIT__0000000002",
            "c__READ__0000000003",
            "d__READ__0000000004",
            "x-foreign",
            "e__WRIT__0000000005",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let q = queue(&names);
        assert_eq!(q.len(), 5);
        assert_eq!(blocker(&q, 0), None);
        assert_eq!(blocker(&q, 1).unwrap().name, "a__READ__0000000001");
        assert_eq!(blocker(&q, 2).unwrap().name, "b__WRIT__0000000002");
        assert_eq!(blocker(&q, 3).unwrap().name, "b__WRIT__0000000002");
        assert_eq!(blocker(&q, 4).unwrap().name, "d__READ__0000000004");
    }
}
