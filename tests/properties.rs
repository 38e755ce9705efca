//! Property tests for the pure parts: sequence suffixes and queue order
//! (including int32 overflow), connect strings, durations, and the mapping
//! from a lock or barrier node's children to its status.

use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use zkgate::api::{
    parse_duration, BarrierPhase, BarrierSpec, BarrierStatus, HoldMode, LockLeaseSpec,
    LockLeaseStatus, LockMode, DURATION_PATTERN,
};
use zkgate::controller::status::{self, BarrierObservation};
use zkgate::zk::contender::{blocker, queue, sequence_key, ContenderKind};
use zkgate::zk::tree::{ChildNode, Snapshot};
use zkgate::zk::ConnectString;
use zookeeper_client::Stat;

/// How ZooKeeper prints the parent's 32-bit counter.
fn suffix(counter: u32) -> String {
    format!("{:010}", counter as i32)
}

fn stat(czxid: i64) -> Stat {
    Stat {
        czxid,
        mzxid: czxid,
        pzxid: czxid,
        ctime: 0,
        mtime: 0,
        version: 0,
        cversion: 0,
        aversion: 0,
        ephemeral_owner: 1,
        data_length: 0,
        num_children: 0,
    }
}

/// Near-valid connect strings: a valid one (names, IPv4 and bracketed
/// IPv6 addresses, with or without a scheme, ports from 0 to past 65535,
/// maybe a chroot) with up to two edits of the characters the parser cares
/// about, so that both its accepting and its refusing paths run (random
/// text almost never gets past the first server).
fn near_valid_connect_string() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        "[a-z][a-z0-9.-]{0,8}",
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
        "\\[(::1|fe80::[0-9a-f]{1,4}|[0-9a-f]{1,4}:[0-9a-f]{1,4}::[0-9a-f]{1,4})\\]",
    ];
    let scheme = prop::sample::select(vec!["", "tcp://", "tcp+tls://"]);
    let server = (scheme, host, 0u32..70_000).prop_map(|(s, h, p)| format!("{s}{h}:{p}"));
    let chroot = prop::option::of(prop::collection::vec("[a-z0-9_]{1,6}", 1..3));
    let valid = (prop::collection::vec(server, 1..4), chroot).prop_map(|(servers, chroot)| {
        let chroot = chroot
            .map(|c| format!("/{}", c.join("/")))
            .unwrap_or_default();
        format!("{}{chroot}", servers.join(","))
    });
    let structural = prop::sample::select(vec![',', ':', '/', '[', ']', ' ', '0', '9', 'a', '.']);
    let edit = (any::<prop::sample::Index>(), structural, 0u8..3);
    (valid, prop::collection::vec(edit, 0..3)).prop_map(|(text, edits)| {
        let mut chars: Vec<char> = text.chars().collect();
        for (at, c, kind) in edits {
            let at = at.index(chars.len() + 1);
            match kind {
                0 => chars.insert(at, c),
                1 if at < chars.len() => {
                    chars.remove(at);
                }
                _ if at < chars.len() => chars[at] = c,
                _ => chars.push(c),
            }
        }
        chars.into_iter().collect()
    })
}

/// The generator above reaches both outcomes often (so the property below
/// checks accepted strings, not only refusals).
#[test]
fn near_valid_connect_strings_are_both_accepted_and_refused() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = near_valid_connect_string();
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..2000 {
        let text = strategy.new_tree(&mut runner).unwrap().current();
        match text.parse::<ConnectString>() {
            Ok(_) => accepted += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(
        accepted >= 400 && refused >= 400,
        "{accepted} accepted, {refused} refused of 2000"
    );
}

proptest! {
    #[test]
    fn sequence_order_is_creation_order_until_the_counter_wraps(start in 0u32..=i32::MAX as u32, steps in 1u32..1000) {
        // Counters created one after another, before the 32-bit counter
        // wraps (after it, the order is Curator's: see contender.rs).
        let a = start.min(i32::MAX as u32 - steps);
        let b = a + steps;
        prop_assert!(sequence_key(&suffix(a)).unwrap() < sequence_key(&suffix(b)).unwrap());
    }

    #[test]
    fn anything_that_is_not_a_sequence_is_refused(s in "\\PC{0,24}") {
        if let Some(key) = sequence_key(&s) {
            prop_assert!(s.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit()));
            prop_assert_eq!(key.as_str(), s.as_str());
        }
    }

    #[test]
    fn the_queue_is_sorted_and_drops_only_foreign_children(
        entries in prop::collection::vec((0u32..3, any::<u32>()), 0..30),
        foreign in prop::collection::vec("[a-z]{1,8}", 0..5),
    ) {
        let markers = ["-lock-", "-__READ__", "-__WRIT__"];
        let mut names: Vec<String> = entries.iter().enumerate()
            .map(|(i, (m, c))| format!("_c_{i:08}{}{}", markers[*m as usize], suffix(*c)))
            .collect();
        names.extend(foreign.iter().cloned());
        let q = queue(&names);
        prop_assert_eq!(q.len(), entries.len());
        prop_assert!(q.windows(2).all(|w| w[0].sequence <= w[1].sequence));
        // Whoever has no blocker holds; all holders are compatible.
        let holders: Vec<_> = (0..q.len()).filter(|&i| blocker(&q, i).is_none()).collect();
        if !q.is_empty() {
            prop_assert!(holders.contains(&0), "the head of the queue always holds");
        }
        if holders.iter().any(|&i| q[i].kind.is_exclusive()) {
            prop_assert_eq!(holders.len(), 1, "an exclusive holder holds alone");
        }
        // A reader holds exactly when no exclusive contender is ahead of it.
        for (i, c) in q.iter().enumerate() {
            if c.kind == ContenderKind::Read {
                let writer_ahead = q[..i].iter().any(|o| o.kind.is_exclusive());
                prop_assert_eq!(blocker(&q, i).is_none(), !writer_ahead);
            }
        }
    }

    #[test]
    fn connect_strings_round_trip(
        hosts in prop::collection::vec(("[a-z][a-z0-9.-]{0,12}", 1u16..=65535, any::<bool>()), 1..5),
        chroot in prop::option::of(prop::collection::vec("[a-z0-9_]{1,8}", 1..4)),
    ) {
        let servers: Vec<String> = hosts.iter()
            .map(|(h, p, tls)| format!("{}{h}:{p}", if *tls { "tcp+tls://" } else { "" }))
            .collect();
        let text = format!("{}{}", servers.join(","), chroot.as_ref().map(|c| format!("/{}", c.join("/"))).unwrap_or_default());
        let parsed: ConnectString = text.parse().unwrap();
        prop_assert_eq!(parsed.servers().len(), hosts.len());
        prop_assert_eq!(parsed.to_string(), text.clone());
        prop_assert_eq!(parsed.to_string().parse::<ConnectString>().unwrap(), parsed);
    }

    #[test]
    fn connect_string_parsing_never_panics(s in "\\PC{0,40}") {
        let _ = s.parse::<ConnectString>();
    }

    /// Near-valid input: what is accepted prints as a string that parses
    /// back to the same servers and chroot, with every port in range; what
    /// is refused is refused as an invalid connect string naming the input.
    #[test]
    fn near_valid_connect_strings_round_trip_or_are_refused_clearly(text in near_valid_connect_string()) {
        match text.parse::<ConnectString>() {
            Ok(parsed) => {
                let printed = parsed.to_string();
                let again: ConnectString = printed.parse().map_err(|e| {
                    TestCaseError::fail(format!("{text:?} printed as {printed:?}, which does not parse: {e}"))
                })?;
                prop_assert_eq!(&again, &parsed, "{:?} printed as {:?}", text, printed);
                prop_assert!(!parsed.servers().is_empty());
                prop_assert!(parsed.servers().iter().all(|s| s.port > 0 && !s.host.is_empty()), "{:?}", text);
            }
            Err(e) => {
                prop_assert!(
                    matches!(&e, zkgate::zk::ZkError::InvalidConnectString { input, .. } if input == &text),
                    "{:?}: {}", text, e
                );
            }
        }
    }

    #[test]
    fn durations_the_schema_accepts_are_parsed(parts in prop::collection::vec((1u64..1000, 0usize..5), 1..4)) {
        let units = ["ms", "s", "m", "h", "d"];
        let text: String = parts.iter().map(|(n, u)| format!("{n}{}", units[*u])).collect();
        prop_assert!(regex_lite::Regex::new(DURATION_PATTERN).unwrap().is_match(&text));
        prop_assert!(parse_duration(&text).is_ok(), "{}", text);
    }

    #[test]
    fn lock_status_accounts_for_every_contender(
        entries in prop::collection::vec((0u32..3, 0u32..100_000), 0..20),
        lease in prop::option::of(1u64..20),
        now_s in 0i64..40,
    ) {
        let markers = ["-lock-", "-__READ__", "-__WRIT__"];
        let mut seen = std::collections::HashSet::new();
        let children: Vec<ChildNode> = entries.iter().enumerate()
            .filter(|(_, (_, c))| seen.insert(*c))
            .map(|(i, (m, c))| ChildNode {
                name: format!("_c_{i:08}{}{}", markers[*m as usize], suffix(*c)),
                data: format!(r#"{{"pod":"p{i}"}}"#).into_bytes(),
                stat: stat(1000 + i as i64),
            })
            .collect();
        let node = Snapshot { data: vec![], stat: stat(1), children: children.clone() };
        let spec = LockLeaseSpec { mode: LockMode::ReadWrite, lease_duration: lease.map(|l| format!("{l}s")), permits: None };
        let previous = LockLeaseStatus::default();
        let out = status::lock(&status::LockObservation {
            spec: &spec,
            nodes: status::LockNodes::Queue(&node.children),
            previous: &previous,
            generation: Some(1),
            znode: "/l",
            now: Timestamp::from_second(now_s).unwrap(),
            spec_problem: None,
        });
        let st = &out.status;
        prop_assert_eq!(st.holders.len() + st.waiting.len() + out.revoke.len(), children.len());
        prop_assert_eq!(st.holder_count as usize, st.holders.len());
        prop_assert_eq!(st.waiting_count as usize, st.waiting.len());
        if st.holders.iter().any(|h| h.mode != HoldMode::Read) {
            prop_assert_eq!(st.holders.len(), 1);
        }
    }

    /// Any sequence of observed barrier children (participants coming and
    /// going, `ready` appearing once): each participant is listed once, the
    /// counts agree with the list, and an opened barrier never goes back.
    #[test]
    fn barrier_status_counts_each_participant_once(
        steps in prop::collection::vec((any::<u8>(), prop::bool::weighted(0.2)), 1..16),
    ) {
        let spec: BarrierSpec = serde_json::from_value(serde_json::json!({ "participants": 8 })).unwrap();
        let mut previous = BarrierStatus::default();
        let mut opened = false;
        for (i, (members, open_now)) in steps.iter().enumerate() {
            opened |= *open_now;
            let mut children: Vec<ChildNode> = (0..8u8)
                .filter(|b| members & (1 << b) != 0)
                .map(|b| ChildNode { name: format!("p{b}"), data: vec![], stat: stat(100 + i64::from(b)) })
                .collect();
            let present = children.len();
            if opened {
                children.push(ChildNode { name: "ready".into(), data: vec![], stat: stat(50) });
            }
            let node = Snapshot { data: br#"{"participants":8}"#.to_vec(), stat: stat(1), children };
            let out = status::barrier(&BarrierObservation {
                spec: &spec,
                participants: 8,
                created: Some(Timestamp::from_second(0).unwrap()),
                node: &node,
                previous: &previous,
                generation: Some(1),
                znode: "/b",
                now: Timestamp::from_second(i as i64 + 1).unwrap(),
                spec_problem: None,
                held: None,
                after_failed: None,
                still_running: 0,
            });
            let st = out.status;
            let mut ids: Vec<_> = st.participants.iter().map(|p| p.id.as_str()).collect();
            ids.sort();
            ids.dedup();
            prop_assert_eq!(ids.len(), st.participants.len(), "an id listed twice");
            for b in (0..8u8).filter(|b| members & (1 << b) != 0) {
                let id = format!("p{b}");
                prop_assert!(st.participants.iter().any(|p| p.id == id && p.left_at.is_none()), "{} missing", id);
            }
            // Those seen, or x once it opened (an opened barrier had x).
            let seen = st.participants.iter().filter(|p| !p.lost).count();
            prop_assert_eq!(st.entered as usize, if opened { seen.max(8) } else { seen });
            prop_assert!(st.left <= st.entered);
            match st.phase {
                Some(BarrierPhase::Completed) => prop_assert!(opened && present == 0),
                Some(BarrierPhase::Open | BarrierPhase::Leaving) => prop_assert!(opened && present > 0),
                Some(BarrierPhase::Waiting | BarrierPhase::Failed) => prop_assert!(!opened),
                other => prop_assert!(false, "phase {:?}", other),
            }
            previous = st;
        }
    }
}
