//! Names of lock contenders: parsing the layouts of Curator and kazoo, and
//! ordering them exactly as Curator does.
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
        ContenderKind::Lease => LEASE_MARKER,
    }
}

/// The marker of a lease node's name before its sequence number.
pub const LEASE_MARKER: &str = "lease-";

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
    pub sequence: SequenceKey,
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

/// A contender's place in its lock's queue: the sequence suffix of its
/// name, compared as Curator compares it (`fixForSorting`, then
/// `String.compareTo`): as text.
///
/// ZooKeeper prints the parent's 32-bit counter as `%010d`, so before the
/// counter wraps the text order is the creation order. After 2³¹ creations
/// under one lock node the counter wraps to negative numbers (`-2147483648`,
/// then up to `-000000001`), which Curator sorts *before* every positive
/// one; zkgate sorts them the same way, so that zkgate and Curator clients
/// on one lock always agree on who is first. (At the wrap itself both then
/// see a new contender ahead of older ones: a lock node that may see 2³¹
/// acquisitions should be made again before, which the controller's
/// `LockLease` deletion does.)
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SequenceKey(String);

impl SequenceKey {
    /// The suffix as it appears in the name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The ordering key of a sequence suffix: `None` when the suffix is not a
/// sequence number (optional `-`, 1 to 19 digits, as ZooKeeper's 32-bit
/// `%010d` and 64-bit `%019d` counters print).
pub fn sequence_key(suffix: &str) -> Option<SequenceKey> {
    let digits = suffix.strip_prefix('-').unwrap_or(suffix);
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(SequenceKey(suffix.to_owned()))
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
        assert_eq!(
            (c.kind, c.sequence.as_str()),
            (ContenderKind::Exclusive, "0000000042")
        );
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
    fn sequence_order_is_curators_across_int32_overflow() {
        // Curator compares the suffixes as text: a wrapped (negative)
        // counter sorts before every positive one.
        assert!(sequence_key("-2147483648") < sequence_key("2147483647"));
        assert!(sequence_key("-000000001") < sequence_key("-2147483648"));
        assert!(sequence_key("0000000009") < sequence_key("0000000010"));
        assert_eq!(sequence_key("-"), None);
        assert_eq!(sequence_key("12a"), None);
        assert_eq!(sequence_key("-99999999999999999999"), None);
    }

    /// Curator's `StandardLockInternalsDriver.fixForSorting`, transcribed:
    /// the text after the last occurrence of the marker.
    fn curator_fix_for_sorting<'a>(name: &'a str, marker: &str) -> &'a str {
        match name.rfind(marker) {
            Some(at) => &name[at + marker.len()..],
            None => name,
        }
    }

    /// How ZooKeeper prints a parent's 32-bit counter (`%010d`).
    fn printed(counter: i32) -> String {
        format!("{counter:010}")
    }

    proptest::proptest! {
        /// Issue 24, item 5: over counters around ±2³¹ (and anywhere),
        /// zkgate's queue is in exactly the order Curator sorts the same
        /// names in (`LockInternals.getSortedChildren`).
        #[test]
        fn the_queue_is_in_curators_order(
            counters in proptest::collection::hash_set(
                proptest::prop_oneof![
                    i32::MAX - 1000..=i32::MAX,
                    i32::MIN..=i32::MIN + 1000,
                    -1000i32..=1000,
                    proptest::num::i32::ANY,
                ],
                1..40,
            ),
            kinds in proptest::collection::vec(0usize..3, 40),
        ) {
            let markers = ["lock-", "__READ__", "__WRIT__"];
            let names: Vec<String> = counters
                .iter()
                .zip(&kinds)
                .map(|(c, k)| format!("_c_{}-{}{}", uuid_like(*c), markers[*k], printed(*c)))
                .collect();
            let ours: Vec<String> = queue(&names).into_iter().map(|c| c.name).collect();
            let mut curators = names.clone();
            // Java's String.compareTo on these ASCII names is byte order.
            curators.sort_by(|a, b| {
                let key = |n: &str| {
                    let n = curator_fix_for_sorting(n, "__READ__");
                    let n = curator_fix_for_sorting(n, "__WRIT__");
                    curator_fix_for_sorting(n, "lock-").to_owned()
                };
                key(a).cmp(&key(b))
            });
            proptest::prop_assert_eq!(ours, curators);
        }
    }

    /// A stand-in for a protection uuid, distinct per counter.
    fn uuid_like(counter: i32) -> String {
        format!(
            "{:08x}-0000-4000-8000-{:012x}",
            counter as u32, counter as u32
        )
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
