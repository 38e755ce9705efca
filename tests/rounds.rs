//! A gang that restarts together (issue 27, item 2): `zkgate barrier run`
//! on a barrier in rounds ([`GangBarrier`]), against a real ZooKeeper. A
//! member's failure after the opening ends the round: every member's
//! command is stopped, and the gang meets again in the next round before
//! any command runs again; a member that is lost ends it too; past
//! `maxRestarts` the barrier fails.

mod support;

use std::path::{Path, PathBuf};
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
    let gang =
        support::make_gang(&admin, &format!("{BARRIERS}/g"), participants, max_restarts).await;
    (connect, admin, gang)
}

/// `zkgate barrier ACTION g --id ID` as a member of the gang (its pod
/// uid, a 4 s session, a 60 s timeout) with `rest` after, its standard
/// error piped.
fn gang_member(connect: &str, action: &str, id: &str, rest: &[&str]) -> tokio::process::Child {
    let uid = format!("uid-{id}");
    let mut args = vec![
        "barrier",
        action,
        "g",
        "--id",
        id,
        "--pod-uid",
        &uid,
        "--session-timeout",
        "4s",
        "--timeout",
        "60s",
    ];
    args.extend_from_slice(rest);
    support::zkgate(connect, &args)
        .env("ZKGATE_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start zkgate")
}

/// `zkgate barrier run g --id ID -- sh -c SCRIPT`, its standard error piped.
fn member(connect: &str, id: &str, script: &str) -> tokio::process::Child {
    gang_member(
        connect,
        "run",
        id,
        &["--kill-grace", "2s", "--", "sh", "-c", script],
    )
}

/// Waits for a member with a deadline: its exit code and its log; one
/// that does not exit in time is killed and its log shown.
async fn ended(mut member: tokio::process::Child, id: &str) -> (i32, String) {
    use tokio::io::AsyncReadExt;
    let mut stderr = member.stderr.take().expect("stderr piped");
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    match tokio::time::timeout(Duration::from_secs(60), member.wait()).await {
        Ok(status) => (
            status.expect("wait for zkgate").code().unwrap_or(-1),
            log.await.unwrap_or_default(),
        ),
        Err(_) => {
            let _ = member.kill().await;
            panic!(
                "{id} did not exit within 60 s:\n{}",
                log.await.unwrap_or_default()
            );
        }
    }
}

/// [`ended`] for several members at once: a hang shows every log.
async fn all_ended(members: Vec<(&str, tokio::process::Child)>) -> Vec<(String, i32, String)> {
    let waits = members.into_iter().map(|(id, m)| {
        let id = id.to_owned();
        tokio::spawn(async move {
            let (code, log) = ended(m, &id).await;
            (id, code, log)
        })
    });
    let mut out = Vec::new();
    let mut hung = Vec::new();
    for w in waits.collect::<Vec<_>>() {
        match w.await {
            Ok(ended) => out.push(ended),
            Err(e) => hung.push(e.to_string()),
        }
    }
    assert!(hung.is_empty(), "{hung:?}\nthe others: {out:?}");
    out
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
         trap 'trap \"\" TERM; echo \"stop $(date +%s%N)\" >> {log}; exit 143' TERM; \
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
        // A time its `date` did not print (stopped with the tree) is no
        // time: that run's end is unknown, as for one SIGKILLed.
        let Ok(at) = at.parse::<u128>() else {
            continue;
        };
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
        let (code, err) = ended(p, id).await;
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
        let (code, err) = ended(p, id).await;
        assert_eq!(code, 0, "{id}: {err}");
    }
    rounds_never_overlap(d, &["p0", "p1", "p2"], 2);
    let data = top(&admin, &gang).await;
    assert_eq!(data.round, Some(1), "{data:?}");
    assert_eq!(data.ends, ["p1 was lost in round 0"], "{data:?}");
}

/// Issue 42: `--released-file` (the wrap form's readiness, which a
/// queue's `waitForPodsReady` reads) exists only while the member is
/// released: not while it waits for its gang, there when each round's
/// command starts, gone while the gang meets again after a loss, and gone
/// once the member is done.
#[tokio::test]
async fn the_released_file_is_there_only_while_a_member_is_released_in_rounds() {
    let (connect, admin, gang) = gang(2, None).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let released = d.join("released");
    let file = released.to_str().unwrap();
    let seen = d.join("seen");
    let script = format!(
        "if test -f {file}; then echo released-$ZKGATE_ROUND >> {}; fi; \
         if [ $ZKGATE_ROUND = 0 ]; then {STAYS}; fi",
        seen.display()
    );
    let p0 = gang_member(
        &connect,
        "run",
        "p0",
        &[
            "--released-file",
            file,
            "--kill-grace",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let round_0 = format!("{}/round-0", gang.path());
    eventually(Duration::from_secs(30), "p0 waiting in round 0", || async {
        support::children(&admin, &round_0)
            .await
            .iter()
            .any(|c| c == "p0")
            .then_some(())
    })
    .await;
    assert!(!released.exists(), "released before the gang met");
    let mut p1 = member(&connect, "p1", STAYS);
    let seen_text = || std::fs::read_to_string(&seen).unwrap_or_default();
    eventually(
        Duration::from_secs(30),
        "round 0's command released",
        || async { (seen_text() == "released-0\n").then_some(()) },
    )
    .await;
    assert!(released.exists());
    // p1 is lost: round 0 ends, p0's command is stopped, and p0 waits for
    // the gang in round 1 without its file.
    p1.start_kill().unwrap();
    let _ = p1.wait().await;
    eventually(Duration::from_secs(30), "round 1 begun", || async {
        (top(&admin, &gang).await.round == Some(1)).then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the released file removed",
        || async { (!released.exists()).then_some(()) },
    )
    .await;
    let p1 = member(&connect, "p1", "true");
    let (code, err) = ended(p0, "p0").await;
    assert_eq!(code, 0, "{err}");
    let (code, err) = ended(p1, "p1").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(seen_text(), "released-0\nreleased-1\n");
    assert!(!released.exists(), "left behind by a member that is done");
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
        let (code, err) = ended(p, id).await;
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
/// it: it ends the round, and runs its command only in the next round,
/// after every command of this one ended. (Three members for two places:
/// the next round opens with whoever is counted, and a member late to it
/// ends it too, which with one restart allowed fails the barrier. Either
/// way nobody hangs.)
#[tokio::test]
async fn a_member_arriving_after_the_opening_ends_the_round_instead_of_passing_it() {
    let (connect, admin, gang) = gang(2, Some(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS, "true"]));
    let p1 = member(&connect, "p1", &script(d, "p1", &[STAYS, "true"]));
    eventually(
        Duration::from_secs(30),
        "round 0's commands run",
        || async { (["p0", "p1"].iter().all(|id| runs(d, id).len() == 1)).then_some(()) },
    )
    .await;
    let p2 = member(&connect, "p2", &script(d, "p2", &["true"]));
    let codes = all_ended(vec![("p0", p0), ("p1", p1), ("p2", p2)]).await;
    let data = top(&admin, &gang).await;
    assert_eq!(
        data.ends.first().map(String::as_str),
        Some("p2 restarted after round 0 opened"),
        "{data:?} {codes:?}"
    );
    let round_0_ended = ["p0", "p1"]
        .iter()
        .map(|id| runs(d, id)[0].1.expect("round 0's runs were stopped"))
        .max()
        .unwrap();
    if let Some((p2_start, _)) = runs(d, "p2").first() {
        assert!(
            *p2_start > round_0_ended,
            "p2 ran while round 0's commands still ran: {codes:?}"
        );
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
    let (code0, err0) = ended(p0, "p0").await;
    let (code1, err1) = ended(p1, "p1").await;
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

// ---- Found by the adversarial review of the rounds (each failed before). ----

/// A member's pod is stopping (SIGTERM) and its command takes its time to
/// stop; its replacement arrives at once and ends the round, and the next
/// round fills without the stopping member. No command of the next round
/// may start before the stopping member's command has ended.
#[tokio::test]
async fn the_next_round_waits_for_a_stopping_members_command_to_end() {
    let (connect, _admin, _gang) = gang(3, None).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let slow_log = d.join("p2.log");
    // p2 takes 1.5 s to stop (ignoring the signals that follow, within
    // its kill grace of 2 s), and records its end then.
    let slow = format!(
        "echo \"start $(date +%s%N)\" >> {l}; \
         trap 'trap \"\" TERM; sleep 1.5; echo \"stop $(date +%s%N)\" >> {l}; exit 143' TERM; \
         sleep 60 & wait $!",
        l = slow_log.display()
    );
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS, "true"]));
    let p1 = member(&connect, "p1", &script(d, "p1", &[STAYS, "true"]));
    let p2 = member(&connect, "p2", &slow);
    eventually(
        Duration::from_secs(30),
        "round 0's commands run",
        || async { (["p0", "p1", "p2"].iter().all(|id| runs(d, id).len() == 1)).then_some(()) },
    )
    .await;
    signal(&p2, libc::SIGTERM);
    // p2's replacement (another pod of the Job).
    let p3 = member(&connect, "p3", &script(d, "p3", &["true"]));
    for (id, p) in [("p0", p0), ("p1", p1), ("p3", p3)] {
        let (code, err) = ended(p, id).await;
        assert_eq!(code, 0, "{id}: {err}");
    }
    let (code2, err2) = ended(p2, "p2").await;
    assert_eq!(code2, 143, "p2: {err2}");
    let p2_end = runs(d, "p2")[0].1.expect("p2's command recorded its end");
    let first_of_round_1 = ["p0", "p1"]
        .iter()
        .map(|id| runs(d, id)[1].0)
        .chain(std::iter::once(runs(d, "p3")[0].0))
        .min()
        .unwrap();
    assert!(
        first_of_round_1 > p2_end,
        "a command of round 1 started {:.1} ms before p2's command of round 0 ended",
        (p2_end - first_of_round_1) as f64 / 1e6
    );
}

fn signal(child: &tokio::process::Child, sig: i32) {
    // SAFETY: kill(2) of a process this test spawned.
    assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, sig) }, 0);
}

/// The init container's `barrier enter` on a barrier in rounds would
/// register in the barrier node itself, whose children are the rounds: it
/// is refused (exit 2, saying why), and nothing of it stays.
#[tokio::test]
async fn enter_and_leave_on_a_barrier_in_rounds_are_refused_with_the_reason() {
    let (connect, admin, gang) = gang(2, None).await;
    for args in [
        &["barrier", "enter", "g", "--id", "p0"][..],
        &["barrier", "leave", "g", "--id", "p0"][..],
    ] {
        let (code, err) = support::output(support::zkgate(&connect, args)).await;
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("meets in rounds"), "{args:?}: {err}");
    }
    let left = support::children(&admin, gang.path()).await;
    assert_eq!(
        left,
        ["round-0", "running"],
        "something of the refused commands stayed"
    );
}

/// A member whose command catches SIGTERM and exits 0 (its pod is being
/// deleted) did not complete: the round ends for the others, and the
/// member exits 143, so that its pod does not count as succeeded.
#[tokio::test]
async fn a_member_stopped_whose_command_exits_0_ends_the_round_and_exits_143() {
    let (connect, admin, gang) = gang(2, None).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS, "true"]));
    let graceful = "trap 'exit 0' TERM; sleep 60 & wait $!";
    let p1 = member(&connect, "p1", graceful);
    eventually(Duration::from_secs(30), "round 0 opened", || async {
        (runs(d, "p0").len() == 1).then_some(())
    })
    .await;
    // p1 runs too once the round is open: give its shell a moment to set
    // its trap (the round's opening is not its command's start).
    eventually(Duration::from_secs(10), "p1's command runs", || async {
        let out = std::process::Command::new("pgrep")
            .args(["-f", "trap 'exit 0' TERM"])
            .output()
            .ok()?;
        (!out.stdout.is_empty()).then_some(())
    })
    .await;
    signal(&p1, libc::SIGTERM);
    let (code1, err1) = ended(p1, "p1").await;
    assert_eq!(code1, 143, "p1: {err1}");
    let data = top(&admin, &gang).await;
    assert_eq!(data.ends, ["p1 was stopped by SIGTERM"], "{data:?}");
    drop(p0);
}

/// The Barrier is deleted while its members run their commands (its
/// subtree goes, as the controller's clean-up does it): every member stops
/// its command and exits 4, none waits for a node that will never come.
#[tokio::test]
async fn deleting_a_barrier_in_rounds_stops_every_member() {
    let (connect, admin, gang) = gang(2, None).await;
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
    DoubleBarrier::new(gang.path())
        .fail(&admin, "Deleted")
        .await
        .ok();
    zkgate::zk::tree::delete_tree(&admin, gang.path())
        .await
        .expect("delete the barrier");
    // Told the barrier went (4), or that their registration did, which
    // went first (5): either way at once, and nobody waits on.
    for (id, p) in [("p0", p0), ("p1", p1)] {
        let (code, err) = ended(p, id).await;
        assert!(code == 4 || code == 5, "{id} exited {code}: {err}");
    }
}

/// Two members register and open round 0 (library sessions); one member
/// completes and marks the round finishing; then the other member's node
/// goes. `round_over` must not end a finishing round, nor return: it stays
/// pending. And a member gone before the list was taken is still a loss:
/// fewer registrations than the round's count end the round.
#[tokio::test]
async fn round_over_leaves_a_finishing_round_alone_and_counts_what_it_did_not_list() {
    let plain = zkgate::zk::EnterOptions::default();
    let (connect, admin, gang) = gang(2, None).await;
    let round = gang.round(0);
    let a = session(&connect).await;
    let b = session(&connect).await;
    let (ra, rb) = tokio::join!(
        round.enter(&a, "a", &plain, None),
        round.enter(&b, "b", &plain, None),
    );
    ra.unwrap();
    rb.unwrap();
    let members = gang
        .members(&a, 0)
        .await
        .unwrap()
        .expect("nothing changed since the opening");
    assert!(gang.start_leaving(&b, 0).await.unwrap());
    b.close().await.unwrap();
    let over = tokio::time::timeout(Duration::from_secs(2), gang.round_over(&a, 0, &members)).await;
    assert!(
        over.is_err(),
        "a finishing round was reported over: {over:?}"
    );
    assert_eq!(top(&admin, &gang).await.round, Some(0));

    // A fresh gang: c's node goes before d lists the members.
    let (connect, admin, gang) = self::gang(2, None).await;
    let round = gang.round(0);
    let c = session(&connect).await;
    let d = session(&connect).await;
    let (rc, rd) = tokio::join!(
        round.enter(&c, "c", &plain, None),
        round.enter(&d, "d", &plain, None),
    );
    rc.unwrap();
    rd.unwrap();
    c.close().await.unwrap();
    // A counted member went before d's command started: no members (d
    // ends the round rather than start its command with a rank of 1 of 1).
    eventually(Duration::from_secs(10), "c's node gone", || async {
        gang.members(&d, 0).await.unwrap().is_none().then_some(())
    })
    .await;
    let members = vec!["d".to_owned()];
    let why = tokio::time::timeout(Duration::from_secs(10), gang.round_over(&d, 0, &members))
        .await
        .expect("the round is over")
        .expect("round_over");
    assert_eq!(why, "a member was lost in round 0");
    assert_eq!(top(&admin, &gang).await.round, Some(1));
}

/// The members a command is told of (`ZKGATE_RANK`, `ZKGATE_MEMBERS`) are
/// the registrations round 0's opening counted, the same for every member:
/// a registration made after `ready` (a member that restarted, which ends
/// the round) or one gone since (a member lost) leaves the round without
/// members, so no command starts with ranks that another member was not
/// told; once a member completed (the round is finishing), those still
/// there that the opening counted.
#[tokio::test]
async fn members_are_those_the_opening_counted_or_none_once_the_round_is_lost() {
    let plain = zkgate::zk::EnterOptions::default();
    let (connect, _admin, gang) = gang(2, None).await;
    let round = gang.round(0);
    let (a, b, late) = (
        session(&connect).await,
        session(&connect).await,
        session(&connect).await,
    );
    let (ra, rb) = tokio::join!(
        round.enter(&a, "b-first", &plain, None),
        round.enter(&b, "c-second", &plain, None),
    );
    ra.unwrap();
    rb.unwrap();
    let mut members = gang.members(&a, 0).await.unwrap().expect("members");
    members.sort();
    assert_eq!(members, ["b-first", "c-second"]);
    // A late arrival, sorted before both: it would shift their ranks.
    round
        .enter(&late, "a-late", &plain, None)
        .await
        .expect("a late arrival passes the open round");
    assert!(!gang
        .counted(&late, 0, &format!("{}/a-late", gang.round_path(0)))
        .await
        .unwrap());
    assert_eq!(gang.members(&a, 0).await.unwrap(), None);
    // Finishing: a member completed; the late arrival is not a member.
    assert!(gang.start_leaving(&b, 0).await.unwrap());
    let mut members = gang.members(&a, 0).await.unwrap().expect("members");
    members.sort();
    assert_eq!(members, ["b-first", "c-second"]);
}

/// One life of a pod's containers in the sidecar form in rounds, as the
/// kubelet runs them: on a new life, the init container `zkgate install
/// --pod-dir` first (it marks the life); then the sidecar `zkgate barrier
/// sidecar g --pod-dir`, whose ready file lets the main containers start.
async fn sidecar_life(
    connect: &str,
    id: &str,
    pod: &Path,
    new_life: bool,
) -> tokio::process::Child {
    if new_life {
        let bin = pod.join("bin");
        let (code, err) = support::output(support::zkgate(
            connect,
            &[
                "install",
                bin.to_str().unwrap(),
                "--pod-dir",
                pod.to_str().unwrap(),
            ],
        ))
        .await;
        assert_eq!(code, 0, "install: {err}");
    }
    let ready = pod.join("ready");
    gang_member(
        connect,
        "sidecar",
        id,
        &[
            "--ready-file",
            ready.to_str().unwrap(),
            "--pod-dir",
            pod.to_str().unwrap(),
        ],
    )
}

/// A `preStop` hook `zkgate barrier stopping` in pod `pod`: a main
/// container's, or (`sidecar`) the sidecar's own.
async fn stopping(connect: &str, pod: &Path, sidecar: bool) {
    let mut args = vec!["barrier", "stopping", "--pod-dir", pod.to_str().unwrap()];
    if sidecar {
        args.push("--sidecar");
    }
    let (code, err) = support::output(support::zkgate(connect, &args)).await;
    assert_eq!(code, 0, "stopping: {err}");
}

/// The round a pod's main containers were told (`round.env`), once its
/// sidecar reported ready: (round, rank, members).
async fn told(pod: &Path) -> (u32, u32, u32) {
    eventually(
        Duration::from_secs(30),
        "the sidecar to report ready",
        || async {
            if !pod.join("ready").exists() {
                return None;
            }
            let env = std::fs::read_to_string(pod.join("round.env")).ok()?;
            let value = |key: &str| -> Option<u32> {
                env.lines()
                    .find_map(|l| l.strip_prefix(&format!("{key}=")))?
                    .parse()
                    .ok()
            };
            Some((
                value("ZKGATE_ROUND")?,
                value("ZKGATE_RANK")?,
                value("ZKGATE_MEMBERS")?,
            ))
        },
    )
    .await
}

/// Issue 41, item 4, the sidecar form in rounds with processes standing
/// for the kubelet. Pod p0's main container fails: the kubelet kills its
/// sidecar (SIGKILL) and starts a new life, whose sidecar ends round 0.
/// The others' sidecars exit 7 and leave their registrations of round 0
/// in place (their commands run until the kubelet stops them); p1's next
/// life withdraws its own, and p2's pod never comes back (its node died):
/// a replacement p3 completes round 1's count, but no sidecar of round 1
/// reports ready while p2's registration of round 0 is there (its session
/// expires, 4 s). SIGTERM without the preStop mark (the main containers
/// completed) then has every sidecar leave with the others: exit 0.
#[tokio::test]
async fn sidecars_in_rounds_restart_in_place_and_no_round_runs_beside_a_registration_of_the_one_before(
) {
    let (connect, admin, gang) = gang(3, Some(3)).await;
    let dir = tempfile::tempdir().unwrap();
    let pod = |id: &str| {
        let p = dir.path().join(id);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let (d0, d1, d2, d3) = (pod("p0"), pod("p1"), pod("p2"), pod("p3"));
    let s0 = sidecar_life(&connect, "p0", &d0, true).await;
    let s1 = sidecar_life(&connect, "p1", &d1, true).await;
    let s2 = sidecar_life(&connect, "p2", &d2, true).await;
    let mut ranks = Vec::new();
    for d in [&d0, &d1, &d2] {
        let (round, rank, members) = told(d).await;
        assert_eq!((round, members), (0, 3), "{}", d.display());
        ranks.push(rank);
    }
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2], "each pod told its own rank");

    // p0's main container fails: the kubelet stops every container of the
    // pod (SIGTERM, SIGKILL 2 s later, no preStop), and runs its init
    // containers again. The sidecar's SIGTERM without its preStop mark is
    // no completion: it changes nothing, and leaves the round to the next
    // life.
    signal(&s0, libc::SIGTERM);
    let (code, err) = ended(s0, "p0").await;
    assert_eq!(code, 143, "{err}");
    assert!(
        d0.join("opened").exists(),
        "the round is left to the next life: {err}"
    );
    let data = top(&admin, &gang).await;
    assert!(
        data.round == Some(0) && data.ends.is_empty(),
        "the SIGTERM of an in-place restart changed the gang: {data:?}"
    );
    let s0 = sidecar_life(&connect, "p0", &d0, true).await;
    let round_0 = format!("{}/round-0", gang.path());
    for (id, s) in [("p1", s1), ("p2", s2)] {
        let (code, err) = ended(s, id).await;
        assert_eq!(code, 7, "{id}'s round ended: {err}");
    }
    let left = support::children(&admin, &round_0).await;
    for id in ["p1", "p2"] {
        assert!(
            left.iter().any(|c| c == id),
            "{id} withdrew its registration of round 0 before its commands were stopped: {left:?}"
        );
    }
    let data = top(&admin, &gang).await;
    assert_eq!(data.round, Some(1), "{data:?}");
    assert!(
        data.ends.len() == 1 && data.ends[0].contains("p0's containers restarted in round 0"),
        "{data:?}"
    );
    // p1's next life; p2's pod is gone for good, and p3 replaces it.
    let s1 = sidecar_life(&connect, "p1", &d1, true).await;
    let s3 = sidecar_life(&connect, "p3", &d3, true).await;
    let round_1 = format!("{}/round-1", gang.path());
    eventually(Duration::from_secs(30), "round 1's count", || async {
        let members = support::children(&admin, &round_1).await;
        (["p0", "p1", "p3"]
            .iter()
            .all(|m| members.iter().any(|c| c == m)))
        .then_some(())
    })
    .await;
    // Until p2's registration of round 0 goes, no command of round 1 runs.
    loop {
        let p2_there = support::children(&admin, &round_0)
            .await
            .iter()
            .any(|c| c == "p2");
        let ready: Vec<&PathBuf> = [&d0, &d1, &d3]
            .into_iter()
            .filter(|d| d.join("ready").exists())
            .collect();
        if !p2_there {
            break;
        }
        assert!(
            ready.is_empty(),
            "{ready:?} reported ready in round 1 beside p2's registration of round 0"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its main containers marked as running, p2's pod holds round 1 back
    // after its registration went, until the controller sees the pod gone
    // and removes the mark (done here as it does it).
    let p2_mark = format!("{}/running/p2", gang.path());
    let marks = support::children(&admin, &format!("{}/running", gang.path())).await;
    assert!(
        marks.iter().any(|m| m == "p2"),
        "p2's main containers were not marked: {marks:?}"
    );
    assert!(
        [&d0, &d1, &d3].iter().all(|d| !d.join("ready").exists()),
        "round 1 reported ready beside p2's marked main containers"
    );
    admin.client().delete(&p2_mark, None).await.unwrap();
    for d in [&d0, &d1, &d3] {
        let (round, _, members) = told(d).await;
        assert_eq!((round, members), (1, 3), "{}", d.display());
    }
    // The main containers complete: the kubelet ends the pods, running
    // each sidecar's preStop hook, then SIGTERM.
    let sidecars = [("p0", s0, &d0), ("p1", s1, &d1), ("p3", s3, &d3)];
    for (_, s, d) in &sidecars {
        stopping(&connect, d, true).await;
        signal(s, libc::SIGTERM);
    }
    let sidecars = sidecars.map(|(id, s, _)| (id, s));
    for (id, code, err) in all_ended(sidecars.into_iter().collect()).await {
        assert_eq!(code, 0, "{id} left with the gang: {err}");
    }
    assert_eq!(top(&admin, &gang).await.round, Some(1));
}

/// A pod deleted (its main containers' preStop hook marks it) stops its
/// sidecar after them: the round ends for the others (exit 7), and the
/// sidecar exits 143. A sidecar killed alone (OOM) while the commands run
/// comes back in the same life: it ends the round and exits 7 without
/// withdrawing its registration, which its pod's next life withdraws.
#[tokio::test]
async fn a_sidecar_in_rounds_tells_a_deleted_pod_and_a_crash_from_a_new_life() {
    let (connect, admin, gang) = gang(2, None).await;
    let dir = tempfile::tempdir().unwrap();
    let [d0, d1, d2] = ["p0", "p1", "p2"].map(|id| dir.path().join(id));
    let s0 = sidecar_life(&connect, "p0", &d0, true).await;
    let s1 = sidecar_life(&connect, "p1", &d1, true).await;
    told(&d0).await;
    told(&d1).await;
    // p1's pod is deleted: the preStop hooks first (the main containers'
    // and the sidecar's), then SIGTERM to the sidecar.
    stopping(&connect, &d1, false).await;
    stopping(&connect, &d1, true).await;
    signal(&s1, libc::SIGTERM);
    let (code, err) = ended(s1, "p1").await;
    assert_eq!(code, 143, "{err}");
    let (code, err) = ended(s0, "p0").await;
    assert_eq!(code, 7, "p0's round ended with p1's pod: {err}");
    let data = top(&admin, &gang).await;
    assert!(
        data.round == Some(1) && data.ends[0].contains("p1's pod is being stopped"),
        "{data:?}"
    );
    // Its main containers may outlive the grace period that the kubelet
    // gives them before it stops the sidecar: the mark stays until the pod
    // is gone, when the controller removes it (done here as it does it).
    let marks = format!("{}/running", gang.path());
    assert!(
        support::children(&admin, &marks)
            .await
            .contains(&"p1".to_owned()),
        "the stopped pod's mark was removed before the pod was gone"
    );
    admin
        .client()
        .delete(&format!("{marks}/p1"), None)
        .await
        .unwrap();

    // p0's next life, and p1's replacement p2, meet in round 1.
    let mut s0 = sidecar_life(&connect, "p0", &d0, true).await;
    let s2 = sidecar_life(&connect, "p2", &d2, true).await;
    assert_eq!(told(&d0).await.0, 1);
    assert_eq!(told(&d2).await.0, 1);
    // p0's sidecar alone is killed while the commands run, and the kubelet
    // starts it again in the same life (no install ran).
    s0.kill().await.unwrap();
    s0.wait().await.unwrap();
    let s0 = sidecar_life(&connect, "p0", &d0, false).await;
    let (code, err) = ended(s0, "p0").await;
    assert_eq!(code, 7, "{err}");
    assert!(
        err.contains("may still run"),
        "the restarted sidecar says why: {err}"
    );
    assert!(
        d0.join("opened").exists(),
        "the record stays for the next life"
    );
    let (code, err) = ended(s2, "p2").await;
    assert_eq!(code, 7, "p2's round ended with p0's sidecar: {err}");
    assert_eq!(top(&admin, &gang).await.round, Some(2));
    // The next life withdraws p0's registration of round 1 and waits in
    // round 2 (p2 is not back).
    let s0 = sidecar_life(&connect, "p0", &d0, true).await;
    let round_1 = format!("{}/round-1", gang.path());
    eventually(
        Duration::from_secs(30),
        "p0's registration of round 1 withdrawn, then its record cleared",
        // The record is cleared only after the withdrawal (a life stopped
        // between the two withdraws again), so both are waited for: the
        // file read right after the node went could still be there.
        || async {
            (!support::children(&admin, &round_1)
                .await
                .iter()
                .any(|c| c == "p0")
                && !d0.join("opened").exists())
            .then_some(())
        },
    )
    .await;
    signal(&s0, libc::SIGTERM);
    let (code, err) = ended(s0, "p0").await;
    assert_eq!(code, 143, "stopped while waiting for round 2: {err}");
}

/// A sidecar restarted alone (OOM) while its commands run, in the last
/// round the gang may have (`maxRestarts: 0`): ending the round fails the
/// barrier, and still it exits 7, keeping its record, so that the kubelet
/// stops the commands (an exit 4 would leave them running alone in a
/// failed gang); the next life then says the barrier failed (exit 4).
/// And a gang that cannot meet again is failed, saying why.
#[tokio::test]
async fn a_sidecar_restarted_alone_in_a_failed_gang_still_has_its_commands_stopped() {
    let (connect, admin, gang) = gang(2, Some(0)).await;
    let dir = tempfile::tempdir().unwrap();
    let [d0, d1] = ["p0", "p1"].map(|id| dir.path().join(id));
    let mut s0 = sidecar_life(&connect, "p0", &d0, true).await;
    let s1 = sidecar_life(&connect, "p1", &d1, true).await;
    told(&d0).await;
    told(&d1).await;
    s0.kill().await.unwrap();
    s0.wait().await.unwrap();
    let s0 = sidecar_life(&connect, "p0", &d0, false).await;
    let (code, err) = ended(s0, "p0").await;
    assert_eq!(code, 7, "{err}");
    assert!(d0.join("opened").exists(), "kept for the next life");
    let (code, err) = ended(s1, "p1").await;
    assert_eq!(code, 7, "{err}");
    let data = top(&admin, &gang).await;
    assert!(
        data.failed
            .as_deref()
            .is_some_and(|f| f.contains("RestartLimit")),
        "{data:?}"
    );
    let (code, err) = ended(sidecar_life(&connect, "p0", &d0, true).await, "p0").await;
    assert_eq!(code, 4, "the next life: {err}");
    assert!(!d0.join("opened").exists());
    // A sidecar of the same life that finds its exit 7 not acted on:
    // the kubelet does not restart pods in place.
    let (code, err) = ended(sidecar_life(&connect, "p1", &d1, false).await, "p1").await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("does not restart pods in place"), "{err}");
}

/// `GangBarrier::fail`: the barrier node says why, and a member waiting
/// in the current round stops with it.
#[tokio::test]
async fn failing_a_gang_stops_the_members_waiting_in_its_round() {
    let (connect, admin, gang) = gang(2, None).await;
    let dir = tempfile::tempdir().unwrap();
    let d0 = dir.path().join("p0");
    let s0 = sidecar_life(&connect, "p0", &d0, true).await;
    let round_0 = format!("{}/round-0", gang.path());
    eventually(Duration::from_secs(30), "p0 to wait in round 0", || async {
        (!support::children(&admin, &round_0).await.is_empty()).then_some(())
    })
    .await;
    gang.fail(&admin, "p1 completed as round 0 ended")
        .await
        .expect("fail the gang");
    let (code, err) = ended(s0, "p0").await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("p1 completed as round 0 ended"), "{err}");
    assert_eq!(
        top(&admin, &gang).await.failed.as_deref(),
        Some("p1 completed as round 0 ended")
    );
    // Failed once: a second reason does not replace the first.
    gang.fail(&admin, "another").await.expect("idempotent");
    assert_eq!(
        top(&admin, &gang).await.failed.as_deref(),
        Some("p1 completed as round 0 ended")
    );
}

/// Issue 44, item 7: every member of a round is told the same ranks, even
/// one that reads them after another member completed and left. Three
/// members open round 0; `a` reads the members (and so its rank), runs,
/// completes, and leaves (its node goes); only then does `b` read them.
/// Failed before the fix: `b` was told `[b, c]` (rank 0 of 2) while `a`
/// had been told `[a, b, c]` (and `b` rank 1 of 3): two ranks 0.
#[tokio::test]
async fn a_member_reading_its_rank_after_another_left_is_told_the_same_ranks() {
    let plain = zkgate::zk::EnterOptions::default();
    let (connect, _admin, gang) = gang(3, None).await;
    let round = gang.round(0);
    let (a, b, c) = (
        session(&connect).await,
        session(&connect).await,
        session(&connect).await,
    );
    let (ra, rb, rc) = tokio::join!(
        round.enter(&a, "a", &plain, None),
        round.enter(&b, "b", &plain, None),
        round.enter(&c, "c", &plain, None),
    );
    ra.unwrap();
    rb.unwrap();
    rc.unwrap();
    let mut told_a = gang.members(&a, 0).await.unwrap().expect("members");
    told_a.sort();
    assert_eq!(told_a, ["a", "b", "c"]);
    // `a` completed: the round is finishing, and `a` leaves.
    assert!(gang.start_leaving(&a, 0).await.unwrap());
    a.close().await.unwrap();
    let a_node = format!("{}/a", gang.round_path(0));
    eventually(Duration::from_secs(10), "a's node gone", || async {
        b.client()
            .check_stat(&a_node)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    for (who, s) in [("b", &b), ("c", &c)] {
        let mut told = gang.members(s, 0).await.unwrap().expect("members");
        told.sort();
        assert_eq!(told, told_a, "{who} was told other ranks than a");
    }
}

/// Review of issue 44, item 7: during a credential rotation's grace window
/// a gang's members work on two credentials, each granting the other READ
/// on the nodes it makes. The member on the old credential opens the round
/// (it makes `ready`); the one on the new credential is the first to read
/// the members, and so the one to record them in `ready`. Failed before the
/// fix: its write was refused (`NoAuth`: READ alone on `ready`), its
/// `members` failed, and with it the member.
#[tokio::test]
async fn a_member_on_the_other_credential_of_a_rotation_records_the_opening() {
    use zkgate::zk::Credential;
    let plain = zkgate::zk::EnterOptions::default();
    let (connect, _admin, gang) = gang(2, None).await;
    let round = gang.round(0);
    let (old, new) = (
        Credential::parse("namespace-t:old-password").unwrap(),
        Credential::parse("namespace-t:new-password").unwrap(),
    );
    let mut a = support::session_as(&connect, Some(&old)).await;
    a.grant_read(&[new.digest_id()]);
    let mut b = support::session_as(&connect, Some(&new)).await;
    b.grant_read(&[old.digest_id()]);
    // `b` registers first; `a`, the last to come, makes `ready`.
    let b_node = format!("{}/b", gang.round_path(0));
    let (entered_b, entered_a) = tokio::join!(round.enter(&b, "b", &plain, None), async {
        eventually(Duration::from_secs(10), "b registered", || async {
            a.client().check_stat(&b_node).await.unwrap().map(|_| ())
        })
        .await;
        round.enter(&a, "a", &plain, None).await
    });
    entered_b.unwrap();
    entered_a.unwrap();
    let mut told_b = gang
        .members(&b, 0)
        .await
        .expect("b, on the other credential, reads the members")
        .expect("members");
    told_b.sort();
    assert_eq!(told_b, ["a", "b"]);
    let mut told_a = gang.members(&a, 0).await.unwrap().expect("members");
    told_a.sort();
    assert_eq!(told_a, told_b);
}

/// `connect` (a chrooted connect string to the shared server) through a
/// proxy of its own, which the test can stall: the proxy, and the connect
/// string through it.
async fn proxied(connect: &str) -> (support::proxy::Proxy, String) {
    let chroot = &connect[support::shared_zookeeper().len()..];
    let proxy = support::proxy::Proxy::start(support::shared_zookeeper()).await;
    let through = format!("{}{chroot}", proxy.address());
    (proxy, through)
}

/// A command that writes the time (ns) to `beat` every 20 ms until killed,
/// with `on_term` as its SIGTERM trap (`''`: ignored).
fn beating(beat: &Path, on_term: &str) -> String {
    format!(
        "trap {on_term} TERM; while :; do date +%s%N > {b}.tmp && mv {b}.tmp {b}; sleep 0.02; done",
        b = beat.display()
    )
}

/// A member cut off from ZooKeeper mid-round while the server runs on (its
/// connection stalls): the server expires its session, its registration
/// goes, and the other member ends the round and waits in the next for it.
/// Its command, marked as running, runs on while it is cut off (before,
/// it was stopped before the session could expire, as a hold is), and the
/// next round waits for it: once the member is back, told its session
/// expired, it stops its command (which ignores SIGTERM: SIGKILL after the
/// kill grace), removes the mark and meets the gang in round 1. No command
/// of round 1 started before the cut-off command's last sign of life.
#[tokio::test]
async fn a_cut_off_members_command_runs_on_and_the_next_round_waits_for_it() {
    let (connect, admin, gang) = gang(2, None).await;
    let (proxy, through_proxy) = proxied(&connect).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let beat = d.join("beat");
    let cut_off = gang_member(
        &through_proxy,
        "run",
        "p0",
        &[
            "--kill-grace",
            "3s",
            "--",
            "sh",
            "-c",
            &script(d, "p0", &[&beating(&beat, "''"), "true"]),
        ],
    );
    let p1 = member(&connect, "p1", &script(d, "p1", &[STAYS, "true"]));
    eventually(
        Duration::from_secs(30),
        "round 0's commands run",
        || async { (beat.exists() && runs(d, "p1").len() == 1).then_some(()) },
    )
    .await;
    proxy.stall();
    eventually(Duration::from_secs(30), "round 0 ended", || async {
        (top(&admin, &gang).await.round == Some(1)).then_some(())
    })
    .await;
    let ended_at = support::now_nanos();
    // Cut off, the command goes on well past the round's end for the
    // others, who wait for it.
    eventually(
        Duration::from_secs(30),
        "the cut-off command to run on",
        || async { (support::read_nanos(&beat) > ended_at + 2_000_000_000).then_some(()) },
    )
    .await;
    assert_eq!(
        runs(d, "p1").len(),
        1,
        "round 1 started beside the cut-off command"
    );
    proxy.resume();
    for (id, p) in [("p0", cut_off), ("p1", p1)] {
        let (code, err) = ended(p, id).await;
        assert_eq!(code, 0, "{id}: {err}");
        if id == "p0" {
            assert!(
                err.contains("our registration in the round was lost"),
                "{err}"
            );
        }
    }
    let last_beat = support::read_nanos(&beat);
    let next_round = [runs(d, "p0")[1].0, runs(d, "p1")[1].0];
    let first = *next_round.iter().min().unwrap();
    assert!(
        last_beat < first,
        "the cut-off member's command ran {} ms into the next round",
        (last_beat - first) / 1_000_000
    );
}

/// A member whose round ended for another reason (a member failed) gives
/// its command the whole `--kill-grace`, as a round over asks, and is cut
/// off from ZooKeeper meanwhile, for longer than its session timeout: the
/// next round waits for its command's mark, so the grace is not cut short
/// (before, the loss cut it short to have the command dead before the
/// session could expire) and still no command of the next round starts
/// before it is dead.
#[tokio::test]
async fn a_member_cut_off_while_its_command_stops_has_it_dead_before_the_next_round() {
    let (connect, admin, gang) = gang(2, None).await;
    let (proxy, through_proxy) = proxied(&connect).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (beat, termed, fail) = (d.join("beat"), d.join("termed"), d.join("fail"));
    let slow_to_stop = beating(&beat, &format!("'touch {}'", termed.display()));
    let cut_off = gang_member(
        &through_proxy,
        "run",
        "p0",
        &[
            "--kill-grace",
            "8s",
            "--",
            "sh",
            "-c",
            &script(d, "p0", &[&slow_to_stop, "true"]),
        ],
    );
    let fails_when_told = format!(
        "while [ ! -e {f} ]; do sleep 0.05; done; exit 1",
        f = fail.display()
    );
    let p1 = member(
        &connect,
        "p1",
        &script(d, "p1", &[&fails_when_told, "true"]),
    );
    eventually(
        Duration::from_secs(30),
        "round 0's commands run",
        || async { (beat.exists() && runs(d, "p1").len() == 1).then_some(()) },
    )
    .await;
    std::fs::write(&fail, "").unwrap();
    // p0 saw the round end (its command got SIGTERM): cut it off now.
    eventually(
        Duration::from_secs(30),
        "p0's command told to stop",
        || async { termed.exists().then_some(()) },
    )
    .await;
    let termed_at = support::now_nanos();
    proxy.stall();
    eventually(Duration::from_secs(30), "round 0 ended", || async {
        (top(&admin, &gang).await.round == Some(1)).then_some(())
    })
    .await;
    // The whole grace: still running past the session timeout (4 s).
    eventually(
        Duration::from_secs(30),
        "the command to run out its grace",
        || async { (support::read_nanos(&beat) > termed_at + 5_000_000_000).then_some(()) },
    )
    .await;
    proxy.resume();
    for (id, p) in [("p0", cut_off), ("p1", p1)] {
        let (code, err) = ended(p, id).await;
        assert_eq!(code, 0, "{id}: {err}");
    }
    let last_beat = support::read_nanos(&beat);
    let next_round = [runs(d, "p0")[1].0, runs(d, "p1")[1].0];
    let first = *next_round.iter().min().unwrap();
    assert!(
        last_beat < first,
        "the cut-off member's command ran {} ms into the next round",
        (last_beat - first) / 1_000_000
    );
}

/// Found in review: a finishing round (a member completed and is
/// leaving) whose other member is cut off while the servers run on: the
/// cut-off member's session expires and its registration goes, but its
/// command, marked as running, runs on. The completed member's leave must
/// not say "everyone has left" (and exit 0) while that command still runs:
/// it waits for the mark too. Failed before the fix: p1 exited 0 with
/// p0's command beating and its mark there.
#[tokio::test]
async fn a_finishing_round_is_not_left_while_a_cut_off_members_command_runs() {
    let (connect, admin, gang) = gang(2, None).await;
    let (proxy, through_proxy) = proxied(&connect).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (beat, done) = (d.join("beat"), d.join("done"));
    let runs_until_done = format!(
        "while [ ! -e {f} ]; do date +%s%N > {b}.tmp && mv {b}.tmp {b}; sleep 0.02; done",
        f = done.display(),
        b = beat.display()
    );
    let cut_off = gang_member(
        &through_proxy,
        "run",
        "p0",
        &["--kill-grace", "2s", "--", "sh", "-c", &runs_until_done],
    );
    let mut p1 = member(&connect, "p1", "true");
    eventually(Duration::from_secs(30), "p0's command runs", || async {
        beat.exists().then_some(())
    })
    .await;
    let round0 = DoubleBarrier::new(gang.round_path(0));
    eventually(Duration::from_secs(30), "round 0 is leaving", || async {
        round0
            .data_if_there(&admin)
            .await
            .ok()
            .flatten()
            .is_some_and(|d| d.leaving)
            .then_some(())
    })
    .await;
    proxy.stall();
    // p0's session (4 s) expires on the server meanwhile, its
    // registration with it; its command beats on throughout.
    let window = tokio::time::Instant::now() + Duration::from_secs(12);
    while tokio::time::Instant::now() < window {
        if let Some(status) = p1.try_wait().unwrap() {
            let marks = support::children(&admin, &format!("{}/running", gang.path())).await;
            panic!(
                "p1 exited {status} (everyone has left) while p0's command ran; marks: {marks:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&done, "").unwrap();
    proxy.resume();
    // p0's command ran to its end (p0 had seen the round finishing
    // before it was cut off), or was stopped once p0 was back and told
    // its session expired (a finishing round cannot restart: exit 5).
    let (code, err) = ended(cut_off, "p0").await;
    assert!(code == 0 || code == 5, "p0: {err}");
    let (code, err) = ended(p1, "p1").await;
    assert_eq!(code, 0, "p1: {err}");
}

/// Found in review: a gang across an upgrade, with a member of a zkgate
/// from before run marks (its registration does not say it honours them):
/// that member would start the next round without waiting for a mark, so
/// nobody in the round may run on through a lost registration. The
/// opening's record says so, and the new member keeps the rule from
/// before: it marks nothing (and so gives up its registration before its
/// session could expire, as the cut-off tests before marks showed).
#[tokio::test]
async fn a_gang_with_a_member_from_before_run_marks_keeps_the_rule_from_before() {
    let (connect, admin, gang) = gang(2, None).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = session(&connect).await;
    let round0 = gang.round(0);
    let from_before = tokio::spawn(async move {
        // Its registration says who it is, and nothing of marks.
        let options = zkgate::zk::EnterOptions::default();
        round0
            .enter(&old, "p-old", &options, None)
            .await
            .expect("the member from before enters");
        old
    });
    let p0 = member(&connect, "p0", &script(d, "p0", &[STAYS]));
    eventually(Duration::from_secs(30), "p0's command runs", || async {
        (runs(d, "p0").len() == 1).then_some(())
    })
    .await;
    assert!(
        !gang.all_honour_marks(&admin, 0).await.unwrap(),
        "the opening's record says every member honours marks"
    );
    assert_eq!(
        support::children(&admin, &format!("{}/running", gang.path())).await,
        Vec::<String>::new(),
        "a mark was made in a gang with a member from before marks"
    );
    signal(&p0, libc::SIGTERM);
    let (code, err) = ended(p0, "p0").await;
    assert_eq!(code, 143, "{err}");
    let _ = from_before.await.unwrap().close().await;
}
