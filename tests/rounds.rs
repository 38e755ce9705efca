//! A gang that restarts together (issue 27, item 2): `zkgate barrier run`
//! on a barrier in rounds ([`GangBarrier`]), against a real ZooKeeper. A
//! member's failure after the opening ends the round: every member's
//! command is stopped, and the gang meets again in the next round before
//! any command runs again; a member that is lost ends it too; past
//! `maxRestarts` the barrier fails.

mod support;

use std::path::Path;
use std::time::Duration;

use support::{eventually, session};
use zkgate::zk::{BarrierData, DoubleBarrier, GangBarrier, Session};

const BARRIERS: &str = "/zkgate/namespaces/default/barriers";

/// A fresh chroot on the shared server, an admin session in it, and a
/// barrier `g` in rounds of `participants` made there as the controller
/// makes it.
async fn gang(participants: u32, max_restarts: Option<u32>) -> (String, Session, GangBarrier) {
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let connect = format!("{}{chroot}", support::shared_zookeeper());
    let admin = session(&connect).await;
    let path = format!("{BARRIERS}/g");
    let data = BarrierData {
        participants,
        uid: Some("the-barrier".into()),
        run: Some(String::new()),
        round: Some(0),
        max_restarts,
        ..BarrierData::default()
    };
    DoubleBarrier::new(&path)
        .create(&admin, &data)
        .await
        .expect("make the barrier");
    let gang = GangBarrier::new(&path);
    gang.ensure_round(&admin, &data, 0)
        .await
        .expect("make round 0");
    (connect, admin, gang)
}

/// `zkgate barrier run g --id ID -- sh -c SCRIPT`, its standard error piped.
fn member(connect: &str, id: &str, script: &str) -> tokio::process::Child {
    support::zkgate(
        connect,
        &[
            "barrier",
            "run",
            "g",
            "--id",
            id,
            "--pod-uid",
            &format!("uid-{id}"),
            "--session-timeout",
            "4s",
            "--kill-grace",
            "2s",
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start zkgate")
}

/// A member's command: it records each run's start and end (in ns, one
/// clock) in `DIR/ID.log` and, on its `n`th run, does `nth[n]` (the last
/// entry for any later run). A SIGTERM ends a run, recorded as `stop`.
fn script(dir: &Path, id: &str, nth: &[&str]) -> String {
    let log = dir.join(format!("{id}.log"));
    let log = log.display();
    let mut cases = String::new();
    for (n, what) in nth.iter().enumerate() {
        let pattern = if n + 1 == nth.len() {
            "*".to_owned()
        } else {
            n.to_string()
        };
        cases.push_str(&format!("{pattern}) {what} ;; "));
    }
    format!(
        "n=$(grep -c start {log} 2>/dev/null); n=${{n:-0}}; \
         echo \"start $(date +%s%N)\" >> {log}; \
         trap 'echo \"stop $(date +%s%N)\" >> {log}; exit 143' TERM; \
         ( case $n in {cases} esac ); \
         code=$?; echo \"end $(date +%s%N)\" >> {log}; exit $code"
    )
}

/// What `DIR/ID.log` says: each run as (start, end or stop), in ns.
fn runs(dir: &Path, id: &str) -> Vec<(u128, Option<u128>)> {
    let text = std::fs::read_to_string(dir.join(format!("{id}.log"))).unwrap_or_default();
    let mut out: Vec<(u128, Option<u128>)> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(what), Some(at)) = (words.next(), words.next()) else {
            continue;
        };
        let at: u128 = at.parse().unwrap_or_default();
        match what {
            "start" => out.push((at, None)),
            _ => {
                if let Some(last) = out.last_mut() {
                    last.1.get_or_insert(at);
                }
            }
        }
    }
    out
}

/// A long wait the command leaves only when stopped (a `sleep` in the
/// background, so that the shell's trap runs at once).
const STAYS: &str = "sleep 60 & wait $!";

/// The barrier node's data.
async fn top(admin: &Session, gang: &GangBarrier) -> BarrierData {
    DoubleBarrier::new(gang.path())
        .data_if_there(admin)
        .await
        .expect("read the barrier")
        .expect("the barrier has data")
}

/// No run of round `k + 1` started before every run of round `k` ended:
/// each member's runs, paired up by their order. A run without an end is
/// one SIGKILLed with its zkgate (by its guardian, at once: see
/// found_in_review.rs), which records nothing.
fn rounds_never_overlap(dir: &Path, ids: &[&str], rounds: usize) -> Vec<Vec<(u128, Option<u128>)>> {
    let all: Vec<_> = ids.iter().map(|id| runs(dir, id)).collect();
    for (id, r) in ids.iter().zip(&all) {
        assert_eq!(
            r.len(),
            rounds,
            "{id} ran {} time(s), not {rounds}: {all:?}",
            r.len()
        );
    }
    for k in 1..rounds {
        let last_end = all
            .iter()
            .filter_map(|r| r[k - 1].1)
            .max()
            .unwrap_or_default();
        let first_start = all.iter().map(|r| r[k].0).min().unwrap_or_default();
        assert!(
            first_start > last_end,
            "a run of round {k} started {:.1} ms before the last run of round {} ended: {all:?}",
            (last_end - first_start) as f64 / 1e6,
            k - 1
        );
    }
    all
}

/// One member's command fails after the opening: every member's command is
/// stopped (the others' by SIGTERM), the gang meets again in round 1 before
/// any command runs again, and round 1 completes.
#[tokio::test]
async fn a_failed_member_restarts_the_whole_gang_and_the_next_round_completes() {
    let (connect, admin, gang) = gang(3, Some(3)).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS, "true"]));
    let p1 = member(
        &connect,
        "p1",
        &script(d, "p1", &["sleep 1; exit 3", "true"]),
    );
    let p2 = member(&connect, "p2", &script(d, "p2", &[STAYS, "true"]));
    for (id, p) in [("p0", p0), ("p1", p1), ("p2", p2)] {
        let (code, err) = support::finished(p, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{id}: {err}");
    }
    let all = rounds_never_overlap(d, &["p0", "p1", "p2"], 2);
    let data = top(&admin, &gang).await;
    assert_eq!(data.round, Some(1), "{data:?}");
    assert_eq!(data.ends, ["p1's command exited 3"], "{data:?}");
    // The others' first runs were stopped, not finished by themselves.
    let p0_log = std::fs::read_to_string(d.join("p0.log")).unwrap();
    assert!(
        p0_log.contains("stop"),
        "p0's first run was not stopped: {p0_log} {all:?}"
    );
}

/// A member's zkgate is killed (its session then expires and its node
/// goes): the others end the round and stop their commands; its
/// replacement (a fresh process of the same pod) joins the next round,
/// which completes.
#[tokio::test]
async fn a_lost_member_restarts_the_gang_and_its_replacement_joins_the_next_round() {
    let (connect, admin, gang) = gang(3, None).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS, "true"]));
    let mut p1 = member(&connect, "p1", &script(d, "p1", &[STAYS, "true"]));
    let p2 = member(&connect, "p2", &script(d, "p2", &[STAYS, "true"]));
    eventually(
        Duration::from_secs(30),
        "round 0's commands run",
        || async { (["p0", "p1", "p2"].iter().all(|id| runs(d, id).len() == 1)).then_some(()) },
    )
    .await;
    p1.start_kill().unwrap();
    let _ = p1.wait().await;
    let waited = eventually(Duration::from_secs(30), "round 0 ended", || async {
        (top(&admin, &gang).await.round == Some(1)).then_some(())
    });
    waited.await;
    let p1 = member(&connect, "p1", &script(d, "p1", &[STAYS, "true"]));
    for (id, p) in [("p0", p0), ("p1", p1), ("p2", p2)] {
        let (code, err) = support::finished(p, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{id}: {err}");
    }
    rounds_never_overlap(d, &["p0", "p1", "p2"], 2);
    let data = top(&admin, &gang).await;
    assert_eq!(data.round, Some(1), "{data:?}");
    assert_eq!(data.ends, ["p1 was lost in round 0"], "{data:?}");
}

/// A member's zkgate is killed and its container restarts at once (a
/// fresh process of the same pod, while the killed one's session still
/// holds its registration): the fresh process never passes the open round;
/// round 0 ends (on the loss, or on its arrival, whichever the others see
/// first), and round 1 completes.
#[tokio::test]
async fn a_member_killed_and_restarted_at_once_meets_the_gang_in_the_next_round() {
    let (connect, admin, gang) = gang(2, None).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS, "true"]));
    let mut p1 = member(&connect, "p1", &script(d, "p1", &[STAYS, "true"]));
    eventually(
        Duration::from_secs(30),
        "round 0's commands run",
        || async { (["p0", "p1"].iter().all(|id| runs(d, id).len() == 1)).then_some(()) },
    )
    .await;
    p1.start_kill().unwrap();
    let _ = p1.wait().await;
    let p1 = member(&connect, "p1", &script(d, "p1", &[STAYS, "true"]));
    for (id, p) in [("p0", p0), ("p1", p1)] {
        let (code, err) = support::finished(p, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{id}: {err}");
    }
    rounds_never_overlap(d, &["p0", "p1"], 2);
    let data = top(&admin, &gang).await;
    assert_eq!(data.round, Some(1), "{data:?}");
    assert!(
        data.ends.len() == 1 && data.ends[0].starts_with("p1 "),
        "{data:?}"
    );
}

/// A member that arrives once the round has opened without it (a
/// replacement whose predecessor's registration was counted) does not pass
/// it: it ends the round. With three members for two places and one
/// restart allowed, round 1 opens for two again and the third ends it too,
/// which fails the barrier: each end is named, and nobody hangs.
#[tokio::test]
async fn a_member_arriving_after_the_opening_ends_the_round_instead_of_passing_it() {
    let (connect, admin, gang) = gang(2, Some(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS]));
    let p1 = member(&connect, "p1", &script(d, "p1", &[STAYS]));
    eventually(
        Duration::from_secs(30),
        "round 0's commands run",
        || async { (["p0", "p1"].iter().all(|id| runs(d, id).len() == 1)).then_some(()) },
    )
    .await;
    let p2 = member(&connect, "p2", &script(d, "p2", &[STAYS]));
    let mut codes = Vec::new();
    for (id, p) in [("p0", p0), ("p1", p1), ("p2", p2)] {
        let (code, err) = support::finished(p, Duration::from_secs(60)).await;
        codes.push((id, code, err));
    }
    let data = top(&admin, &gang).await;
    assert_eq!(
        data.ends.first().map(String::as_str),
        Some("p2 restarted after round 0 opened"),
        "{data:?} {codes:?}"
    );
    assert!(
        data.failed
            .as_deref()
            .is_some_and(|f| f.starts_with("RestartLimit")),
        "{data:?} {codes:?}"
    );
    assert!(runs(d, "p2").len() <= 1, "p2 ran in round 0: {codes:?}");
    for (id, code, err) in &codes {
        assert_ne!(*code, 0, "{id} completed on a failed barrier: {err}");
    }
}

/// Past `maxRestarts` the barrier fails: the failing member exits with its
/// command's code, the others are stopped and exit 4 saying why.
#[tokio::test]
async fn past_max_restarts_the_barrier_fails_and_everyone_is_told() {
    let (connect, admin, gang) = gang(2, Some(0)).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS]));
    let p1 = member(&connect, "p1", &script(d, "p1", &["sleep 1; exit 7"]));
    let (code0, err0) = support::finished(p0, Duration::from_secs(60)).await;
    let (code1, err1) = support::finished(p1, Duration::from_secs(60)).await;
    assert_eq!(code1, 7, "p1: {err1}");
    assert_eq!(code0, 4, "p0: {err0}");
    assert!(err0.contains("RestartLimit"), "p0: {err0}");
    let data = top(&admin, &gang).await;
    assert!(
        data.failed
            .as_deref()
            .is_some_and(|f| f.starts_with("RestartLimit")),
        "{data:?}"
    );
    assert_eq!(runs(d, "p0").len(), 1, "p0 ran again after the limit");
}
