//! zkgate's two promises under faults, at the recipe level: a lock is held
//! by one process at a time, and a barrier round has one outcome for all.
//! Each test drives one interleaving that broke them, with a proxy that
//! freezes, cuts or delays a connection at a chosen request.

mod support;

use std::time::Duration;

use support::proxy::{op, routes, Proxy};
use support::{children, eventually, read_nanos, session, session_with_timeout};
use tokio::time::Instant;
use zkgate::zk::{
    BarrierData, DoubleBarrier, EnterOptions, HoldState, LockOptions, Mutex, ParticipantData,
    ZkError,
};

const LOCK: &str = "/lock";
const BARRIER: &str = "/b";

fn mutex(persistent: bool) -> Mutex {
    Mutex::new(
        LOCK,
        LockOptions {
            create_parent: true,
            persistent,
            ..LockOptions::default()
        },
    )
}

/// Enters `id` from a task that keeps its session (and so its ephemeral
/// registration) until the result is taken.
fn spawn_enter(
    barrier: &DoubleBarrier,
    s: zkgate::zk::Session,
    id: &'static str,
    uid: Option<&'static str>,
    deadline: Option<Instant>,
) -> tokio::task::JoinHandle<(Result<zkgate::zk::Entered, ZkError>, zkgate::zk::Session)> {
    let barrier = barrier.clone();
    tokio::spawn(async move {
        let r = barrier.enter(&s, id, &ephemeral(uid), deadline).await;
        (r, s)
    })
}

/// Waits until the barrier's children are exactly `ids`.
async fn registered(admin: &zkgate::zk::Session, ids: &[&str]) {
    eventually(
        Duration::from_secs(5),
        &format!("{ids:?} registered"),
        || async { (children(admin, BARRIER).await == ids).then_some(()) },
    )
    .await;
}

/// A task's result, within `within`.
async fn joined<T>(task: tokio::task::JoinHandle<T>, within: Duration) -> T {
    tokio::time::timeout(within, task)
        .await
        .expect("the participant finishes in time")
        .expect("the participant's task")
}

fn ephemeral(uid: Option<&str>) -> EnterOptions {
    EnterOptions {
        data: ParticipantData {
            pod: None,
            pod_uid: uid.map(str::to_owned),
            ..ParticipantData::default()
        },
        ..EnterOptions::default()
    }
}

/// Issue 12, item 3: after a reconnect the monitor re-checks its node; a
/// connection that freezes during that check must not end in `Held`
/// (nothing confirmed the node), and the loss must be reported before the
/// server can expire the session.
#[tokio::test]
async fn a_connection_that_freezes_while_the_hold_is_rechecked_is_never_reported_held() {
    let (_, through_proxy, proxy) = routes().await;
    let timeout = Duration::from_secs(4);
    let a = session_with_timeout(&through_proxy, timeout).await;
    let hold = mutex(false).acquire(&a, None).await.unwrap();
    let mut monitor = hold.monitor();
    assert_eq!(monitor.state(), HoldState::Held);

    // The connection ends; its reconnection waits until the freeze is set.
    proxy.stall();
    proxy.cut_all();
    let suspended = tokio::time::timeout(timeout * 2, monitor.next())
        .await
        .expect("the monitor notices the disconnection");
    assert_eq!(suspended, HoldState::Suspended);
    // The client reconnects; the monitor's check of its node reaches the
    // server, and then the network freezes for good (a partition).
    proxy.freeze_at(&[op::EXISTS], hold.path(), true);
    proxy.resume();
    let mut frozen_at = None;
    let mut seen = Vec::new();
    let lost_at = tokio::time::timeout(timeout * 3, async {
        loop {
            tokio::select! {
                state = monitor.next() => {
                    seen.push((state, frozen_at.is_some()));
                    if let HoldState::Lost(_) = state {
                        return Instant::now();
                    }
                }
                () = proxy.frozen(), if frozen_at.is_none() => {
                    // From here the pod is partitioned: nothing gets through.
                    proxy.stall();
                    frozen_at = Some(Instant::now());
                }
            }
        }
    })
    .await
    .expect("the monitor reports the hold lost");
    let frozen_at =
        frozen_at.expect("the proxy froze the connection at the recheck (the fault under test)");
    assert!(
        !seen
            .iter()
            .any(|(state, after_freeze)| *after_freeze && *state == HoldState::Held),
        "nothing confirmed the node after the freeze, yet the monitor said Held: {seen:?}"
    );
    assert!(
        lost_at < frozen_at + timeout,
        "the loss was reported {:?} after the last request reached the server, past the session timeout",
        lost_at - frozen_at
    );
}

/// Issue 12, item 4: a release whose delete is lost with the connection
/// and that, retried, finds the node gone cannot claim it released the
/// lock: someone else deleted it (revoked) while we were cut off.
#[tokio::test]
async fn a_retried_release_that_finds_the_node_gone_reports_the_hold_lost() {
    let (direct, through_proxy, proxy) = routes().await;
    let a = session_with_timeout(&through_proxy, Duration::from_secs(10)).await;
    let admin = session(&direct).await;
    // The release's delete never reaches the server; the connection freezes.
    proxy.freeze_at(&[op::DELETE], "/lock/_c_", false);
    let (node_tx, node_rx) = tokio::sync::oneshot::channel();
    let release = tokio::spawn(async move {
        let hold = mutex(false).acquire(&a, None).await.unwrap();
        node_tx.send(hold.path().to_owned()).unwrap();
        hold.release().await
    });
    let node = node_rx.await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), proxy.frozen())
        .await
        .expect("the release was sent");
    admin.client().delete(&node, None).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), release)
        .await
        .expect("the release finishes after reconnecting")
        .unwrap();
    assert!(
        matches!(result, Err(ZkError::NodeRemoved { .. })),
        "a revoked hold must be reported, not released: {result:?}"
    );
}

/// Issue 12, item 11: a persistent contender whose create reached the
/// server but whose reply was lost, in a wait that is then cancelled, is
/// found by its protected name and removed.
#[tokio::test]
async fn a_cancelled_wait_removes_a_persistent_node_whose_create_reply_was_lost() {
    let (direct, through_proxy, proxy) = routes().await;
    let a = session_with_timeout(&through_proxy, Duration::from_secs(4)).await;
    let admin = session(&direct).await;
    admin
        .client()
        .create(
            LOCK,
            &[],
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    proxy.freeze_at(&op::CREATES, "/lock/_c_", true);
    let lock = mutex(true);
    let attempt = tokio::time::timeout(Duration::from_millis(800), lock.acquire(&a, None)).await;
    assert!(attempt.is_err(), "the reply never came: {attempt:?}");
    assert_eq!(proxy.freezes(), 1);
    eventually(
        Duration::from_secs(20),
        "the persistent node to be removed",
        || async { children(&admin, LOCK).await.is_empty().then_some(()) },
    )
    .await;
}

/// Issue 12, item 11: an early return after the registration was sent
/// (here: the barrier node's data is unreadable) removes the registration.
#[tokio::test]
async fn an_error_after_the_registration_was_sent_leaves_no_node() {
    let (direct, _, _proxy) = routes().await;
    let s = session(&direct).await;
    s.client()
        .create(
            BARRIER,
            b"not barrier json",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let options = EnterOptions {
        persistent: true,
        ..ephemeral(Some("uid-p"))
    };
    let result = DoubleBarrier::new(BARRIER)
        .enter(&s, "p", &options, None)
        .await;
    assert!(
        matches!(result, Err(ZkError::InvalidData { .. })),
        "{result:?}"
    );
    assert!(
        children(&s, BARRIER).await.is_empty(),
        "the registration was left behind"
    );
}

/// Issue 12, item 5: a participant acting on a view older than the
/// barrier's failure must not open it: everyone gets the same outcome.
#[tokio::test]
async fn a_participant_with_a_stale_view_cannot_open_a_failed_barrier() {
    let (direct, through_proxy, proxy) = routes().await;
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 2).await;
    let a = session(&direct).await;
    let b = session_with_timeout(&through_proxy, Duration::from_secs(10)).await;

    let first = spawn_enter(&barrier, a, "a", None, None);
    registered(&admin, &["a"]).await;
    // b's requests reach the server, its replies are held back: it reads
    // the barrier as it is now, and acts on that view later.
    proxy.stall_replies();
    let second = spawn_enter(&barrier, b, "b", None, None);
    registered(&admin, &["a", "b"]).await;
    let marked = barrier.fail(&admin, "TimedOut").await.unwrap();
    assert!(marked, "the barrier had not opened");
    let (first, _) = joined(first, Duration::from_secs(10)).await;
    assert!(
        matches!(first, Err(ZkError::BarrierFailed { .. })),
        "{first:?}"
    );
    proxy.resume();
    let (second, _) = joined(second, Duration::from_secs(10)).await;
    assert!(
        matches!(second, Err(ZkError::BarrierFailed { .. })),
        "a failed the barrier, b must too, not pass alone: {second:?}"
    );
    assert!(!children(&admin, BARRIER)
        .await
        .contains(&"ready".to_owned()));
}

/// Issue 12, item 5: once a barrier has opened, marking it failed does not
/// land: its outcome is settled.
#[tokio::test]
async fn an_opened_barrier_cannot_be_marked_failed() {
    let (direct, _, _proxy) = routes().await;
    let s = session(&direct).await;
    let barrier = support::barrier_made(&s, BARRIER, 1).await;
    barrier
        .enter(&s, "a", &ephemeral(None), None)
        .await
        .unwrap();
    let marked = barrier.fail(&s, "TimedOut").await.unwrap();
    assert!(!marked, "an opened barrier was marked failed");
    let (data, _) = s.client().get_data(BARRIER).await.unwrap();
    let data = BarrierData::parse(BARRIER, &data).unwrap().unwrap();
    assert_eq!(data.failed, None);
}

/// Issue 12, item 5: a participant count raised before the barrier opened
/// is not skipped by a participant acting on the old count.
#[tokio::test]
async fn a_raised_participant_count_is_not_skipped_by_a_stale_view() {
    let (direct, through_proxy, proxy) = routes().await;
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 2).await;
    let a = session(&direct).await;
    let b = session_with_timeout(&through_proxy, Duration::from_secs(10)).await;
    let c = session(&direct).await;
    let first = spawn_enter(&barrier, a, "a", None, None);
    registered(&admin, &["a"]).await;
    proxy.stall_replies();
    let second = spawn_enter(&barrier, b, "b", None, None);
    registered(&admin, &["a", "b"]).await;
    let raised = barrier.set_participants(&admin, 3).await.unwrap();
    assert!(raised, "the barrier had not opened");
    proxy.resume();
    // b acts on its stale view: it opens the barrier, or it finds the
    // barrier changed and reads it again.
    let ready = format!("{BARRIER}/ready");
    eventually(Duration::from_secs(10), "b acted on its view", || async {
        let opened = admin.client().check_stat(&ready).await.unwrap().is_some();
        let read_again = proxy.forwarded(&[op::GET_DATA], BARRIER) >= 2;
        (opened || read_again).then_some(())
    })
    .await;
    // Not open with two: the third registration opens it.
    let third = spawn_enter(&barrier, c, "c", None, None);
    // The sessions stay open (their registrations with them) until the end.
    let mut sessions = Vec::new();
    for task in [first, second, third] {
        let (result, session) = joined(task, Duration::from_secs(10)).await;
        result.unwrap();
        sessions.push(session);
    }
    let ready = admin
        .client()
        .check_stat(&ready)
        .await
        .unwrap()
        .expect("opened");
    let c_node = admin
        .client()
        .check_stat(&format!("{BARRIER}/c"))
        .await
        .unwrap()
        .expect("c registered");
    assert!(
        ready.czxid > c_node.czxid,
        "the barrier opened before its third participant registered"
    );
}

/// Issue 12, item 6: a participant whose deadline fires while the create
/// that opens the barrier is in flight settles that create first: the
/// barrier opened, so it entered too.
#[tokio::test]
async fn a_deadline_racing_the_opening_create_settles_its_outcome() {
    let (direct, through_proxy, proxy) = routes().await;
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 2).await;
    let a = session(&direct).await;
    let b = session_with_timeout(&through_proxy, Duration::from_secs(4)).await;
    let first = spawn_enter(&barrier, a, "a", None, None);
    registered(&admin, &["a"]).await;
    proxy.freeze_at(&op::CREATES, "/ready", true);
    let deadline = Instant::now() + Duration::from_secs(1);
    let second = barrier
        .enter(&b, "b", &ephemeral(None), Some(deadline))
        .await;
    assert_eq!(proxy.freezes(), 1, "the opening create was sent");
    let (first, _a) = joined(first, Duration::from_secs(5)).await;
    first.expect("a passes: the barrier opened");
    let second = second.expect("b's create opened the barrier: b entered too");
    assert_eq!(second.participants, 2);
    assert!(children(&admin, BARRIER).await.contains(&"b".to_owned()));
}

/// Issue 12, item 10: a restarted container of the same pod (same pod uid)
/// whose previous session still holds its registration waits for that
/// session to end instead of failing with a conflict.
#[tokio::test]
async fn a_restart_of_the_same_pod_waits_for_its_old_registration_to_go() {
    let (direct, through_proxy, proxy) = routes().await;
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 2).await;
    let old = session_with_timeout(&through_proxy, Duration::from_secs(4)).await;
    let old_wait = spawn_enter(&barrier, old, "w", Some("uid-1"), None);
    registered(&admin, &["w"]).await;
    // The old container is cut off (killed on a frozen node): its session
    // lives on until the server expires it.
    proxy.stall();
    let new = session_with_timeout(&direct, Duration::from_secs(4)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let restarted = spawn_enter(&barrier, new, "w", Some("uid-1"), Some(deadline));
    let other = spawn_enter(&barrier, session(&direct).await, "x", None, None);
    let (restarted, _s) = joined(restarted, Duration::from_secs(30)).await;
    let entered =
        restarted.expect("the restarted container registers once the old session is gone");
    assert!(!entered.was_registered);
    let (other, _s) = joined(other, Duration::from_secs(10)).await;
    other.unwrap();
    old_wait.abort();
}

// ---- The commands, as the processes a pod runs ----

const LOCKS: &str = "/zkgate/namespaces/default/locks";
const BARRIERS: &str = "/zkgate/namespaces/default/barriers";

/// A holder cut off from ZooKeeper (its connection through `proxy` stalls)
/// while the next holder waits on a direct connection. `start_holder` gets
/// the command to run under the lock (it ignores SIGTERM, as slow shutdowns
/// effectively do, and writes the time every 20 ms while it lives) and
/// starts the processes that hold the lock with it; they must all exit 6
/// with `lost` in their message. Then the command must have been dead
/// before the next holder's command started.
async fn cut_off_holder_stops_before_the_next_starts(
    start_holder: impl FnOnce(&str, &str) -> Vec<(tokio::process::Child, &'static [&'static str])>,
) {
    cut_off_holder_stops_before_the_next_starts_resumed(None, start_holder).await
}

/// As [`cut_off_holder_stops_before_the_next_starts`], the proxy flowing
/// again `resume_after` the stall began (when given): a holder that gave
/// up on the hold, but whose session lives on, must still not let the next
/// holder in before its command is surely dead.
async fn cut_off_holder_stops_before_the_next_starts_resumed(
    resume_after: Option<Duration>,
    start_holder: impl FnOnce(&str, &str) -> Vec<(tokio::process::Child, &'static [&'static str])>,
) {
    let (direct, through_proxy, proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let (started, beat, next_started) = (
        dir.path().join("started"),
        dir.path().join("beat"),
        dir.path().join("next"),
    );
    let script = format!(
        "trap '' TERM; touch {s}; while :; do date +%s%N > {b}.tmp && mv {b}.tmp {b}; sleep 0.02; done",
        s = started.display(),
        b = beat.display()
    );
    let holders = start_holder(&through_proxy, &script);
    eventually(Duration::from_secs(10), "the holder's command", || async {
        started.exists().then_some(())
    })
    .await;
    let next_script = format!("date +%s%N > {}", next_started.display());
    let next = support::zkgate(
        &direct,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "next",
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            &next_script,
        ],
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let observer = session(&direct).await;
    eventually(
        Duration::from_secs(10),
        "the next holder queued",
        || async { (children(&observer, &format!("{LOCKS}/db")).await.len() == 2).then_some(()) },
    )
    .await;
    proxy.stall();
    let resume = async {
        if let Some(after) = resume_after {
            tokio::time::sleep(after).await;
            proxy.resume();
        }
    };
    let holders_end = async {
        for (holder, lost) in holders {
            let (code, err) = support::finished(holder, Duration::from_secs(40)).await;
            assert_eq!(code, 6, "{err}");
            assert!(lost.iter().any(|l| err.contains(l)), "{err}");
        }
    };
    tokio::join!(resume, holders_end);
    let (code, err) = support::finished(next, Duration::from_secs(40)).await;
    assert_eq!(code, 0, "{err}");
    let (last_beat, next_start) = (read_nanos(&beat), read_nanos(&next_started));
    assert!(
        last_beat < next_start,
        "the cut-off holder's command was still running {} ms after the next holder's started",
        (last_beat - next_start) / 1_000_000
    );
    proxy.resume();
}

fn piped(mut cmd: tokio::process::Command) -> tokio::process::Child {
    cmd.stderr(std::process::Stdio::piped()).spawn().unwrap()
}

/// Issue 12, item 1: a `lock run` holder cut off from ZooKeeper has its
/// command dead (SIGKILL if it ignores SIGTERM) before the server can
/// expire its session, so the next holder's command never runs beside it.
#[tokio::test]
async fn a_cut_off_holders_command_is_dead_before_the_next_holder_starts() {
    cut_off_holder_stops_before_the_next_starts(|through_proxy, script| {
        let holder = support::zkgate(
            through_proxy,
            &[
                "lock",
                "run",
                "db",
                "--create",
                "--id",
                "holder",
                "--session-timeout",
                "10s",
                "--kill-grace",
                "3s",
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        vec![(piped(holder), &["lost the lock"][..])]
    })
    .await;
}

/// Issue 12, item 2: a `lock sidecar` cut off from ZooKeeper withdraws its
/// token early enough that the main container's command, run under
/// `zkgate lock watch`, is dead before the next holder starts; both exit 6.
#[tokio::test]
async fn a_cut_off_sidecars_main_container_command_is_dead_before_the_next_holder_starts() {
    let dir = tempfile::tempdir().unwrap();
    cut_off_holder_stops_before_the_next_starts(|through_proxy, script| {
        sidecar_and_watched_command(through_proxy, dir.path(), script)
    })
    .await;
}

/// A `lock sidecar` (session 8 s, kill grace 3 s) through `through_proxy`
/// and its main container's `script` under `lock watch` (no ZooKeeper,
/// only the shared volume `dir`), with what each must say when cut off.
fn sidecar_and_watched_command(
    through_proxy: &str,
    dir: &std::path::Path,
    script: &str,
) -> Vec<(tokio::process::Child, &'static [&'static str])> {
    let (sidecar, main) =
        support::lock_sidecar_and_watch(through_proxy, dir, "10s", "3s", &["sh", "-c", script]);
    vec![
        // Whichever the main container sees first: the sidecar's
        // withdrawal, or its trust deadline passing (the same moment,
        // give or take the sidecar's scheduling).
        (
            piped(main),
            &["withdrew the token", "stopped confirming the hold"][..],
        ),
        (piped(sidecar), &["lost the lock"][..]),
    ]
}

/// Found in review: a `lock sidecar` that stops trusting its hold (no
/// reply for the trust window: a stall, or a busy node) while its session
/// lives on must keep its node until the watched command is surely dead:
/// here the proxy flows again just after the trust ends (4.1 s in), so the
/// sidecar's own delete would reach the server at once. Failed before the
/// fix: the sidecar dropped its hold at once, and the next holder's command
/// started while the watched one (which ignores SIGTERM) ran out its kill
/// grace.
#[tokio::test]
async fn a_sidecar_that_stops_trusting_its_hold_keeps_it_until_the_watched_command_is_dead() {
    let dir = tempfile::tempdir().unwrap();
    cut_off_holder_stops_before_the_next_starts_resumed(
        Some(Duration::from_millis(4300)),
        |through_proxy, script| sidecar_and_watched_command(through_proxy, dir.path(), script),
    )
    .await;
}

/// A `lock sidecar` stopped (SIGTERM at the pod's end) while ZooKeeper's
/// replies stall for less than the session timeout: the hold stops being
/// trusted during the drain that follows the token's withdrawal, but the
/// session and its node live on. Its release, in that session, proves that
/// nobody else held the lock meanwhile: it exits 0 and the lock is free.
/// Failed before the fix: exit 6, "lost the lock", for a hold never lost
/// (the lock-sidecar example's sidecar did so once in CI, on a busy
/// machine).
#[tokio::test]
async fn a_sidecar_stopped_through_a_stall_shorter_than_the_session_releases_cleanly() {
    let (code, err) = sidecar_stopped_through_a_stall(true).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("could not confirm the hold"),
        "the stall did not reach past the hold's trust, so this tested nothing: {err}"
    );
}

/// As above, but the stall outlasts the session: the release cannot tell,
/// and the sidecar says the hold may be lost (exit 6) in bounded time,
/// rather than hang until the kubelet's SIGKILL.
#[tokio::test]
async fn a_sidecar_stopped_through_a_stall_longer_than_the_session_says_it_lost_the_lock() {
    let (code, err) = sidecar_stopped_through_a_stall(false).await;
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("lost the lock"), "{err}");
}

/// A `lock sidecar` (session 10 s, kill grace 3 s: trusted for 3.4 s after
/// the last confirmation, 10 − 2.5 (the leader's lag) − 3 − 1 − the watch's
/// poll, which comes every 1 s; a drain of 4.1 s) holds through the proxy,
/// its watched command done. The replies stall; 1.5 s in it gets SIGTERM,
/// so the trust ends during its drain (2.4 to 3.4 s in); with `resume`, the
/// proxy flows again at 4.5 s, before the drain's end (5.6 s) and long
/// before the server could expire the session (7.5 s at the soonest). The
/// sidecar's exit code and standard error; the lock's nodes are checked
/// gone once the proxy flows again.
async fn sidecar_stopped_through_a_stall(resume: bool) -> (i32, String) {
    let (direct, through_proxy, proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let observer = session(&direct).await;
    let (sidecar, main) =
        support::lock_sidecar_and_watch(&through_proxy, dir.path(), "10s", "3s", &["true"]);
    let sidecar = piped(sidecar);
    let (code, err) = support::finished(piped(main), Duration::from_secs(30)).await;
    assert_eq!(code, 0, "the watched command: {err}");
    let lock = format!("{LOCKS}/db");
    assert_eq!(
        children(&observer, &lock).await.len(),
        1,
        "the sidecar holds"
    );
    proxy.stall();
    let stalled = Instant::now();
    tokio::time::sleep_until(stalled + Duration::from_millis(1500)).await;
    signal_pid(sidecar.id().unwrap(), libc::SIGTERM);
    if resume {
        tokio::time::sleep_until(stalled + Duration::from_millis(4500)).await;
        proxy.resume();
    }
    let outcome = support::finished(sidecar, Duration::from_secs(40)).await;
    proxy.resume();
    eventually(Duration::from_secs(30), "the lock free", || async {
        children(&observer, &lock).await.is_empty().then_some(())
    })
    .await;
    outcome
}

/// Issue 44, item 1: zkgate's own log lines must never hold it up. The
/// holder's standard error is a pipe that is full and never read (a reader
/// that stopped, a terminal after Ctrl-S); the first line it logs when cut
/// off from ZooKeeper must not block its only thread, or nothing stops the
/// command before the server expires the session. Failed before the fix:
/// the command ran on beside the next holder's.
#[tokio::test]
async fn a_holder_whose_stderr_is_full_still_stops_its_command_in_time() {
    let full = FullPipe::new();
    cut_off_holder_stops_before_the_next_starts(|through_proxy, script| {
        let mut holder = support::zkgate(
            through_proxy,
            &[
                "lock",
                "run",
                "db",
                "--create",
                "--id",
                "holder",
                "--session-timeout",
                "10s",
                "--kill-grace",
                "3s",
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        holder.env("ZKGATE_LOG", "info").stderr(full.writer());
        // What it says cannot be read: any exit 6 will do.
        vec![(holder.spawn().unwrap(), &[""][..])]
    })
    .await;
    drop(full);
}

/// A pipe filled to capacity whose read end stays open and unread.
struct FullPipe {
    _read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl FullPipe {
    fn new() -> FullPipe {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (read, write) = unsafe {
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        let w = fds[1];
        unsafe {
            let flags = libc::fcntl(w, libc::F_GETFL);
            libc::fcntl(w, libc::F_SETFL, flags | libc::O_NONBLOCK);
            let chunk = [b'x'; 4096];
            while libc::write(w, chunk.as_ptr().cast(), chunk.len()) > 0 {}
            // Whatever is left below a page.
            while libc::write(w, chunk.as_ptr().cast(), 1) > 0 {}
            libc::fcntl(w, libc::F_SETFL, flags);
        }
        FullPipe { _read: read, write }
    }

    /// The write end, for a child's standard error (blocking, as inherited).
    fn writer(&self) -> std::process::Stdio {
        std::process::Stdio::from(self.write.try_clone().unwrap())
    }
}

/// Issue 12, item 1: a kill grace that cannot fit in the session timeout
/// (the command could outlive the hold) is refused before anything is made.
#[tokio::test]
async fn a_kill_grace_that_cannot_fit_in_the_session_timeout_is_refused() {
    let (direct, _, _proxy) = routes().await;
    let (code, err) = support::output(support::zkgate(
        &direct,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--session-timeout",
            "4s",
            "--kill-grace",
            "3s",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--kill-grace") && err.contains("session timeout"),
        "{err}"
    );
    let observer = session(&direct).await;
    assert!(
        children(&observer, "/").await.iter().all(|c| c != "zkgate"),
        "something was made"
    );
    let help = support::zkgate(&direct, &["lock", "run", "--help"])
        .output()
        .await
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("0.35 of the session timeout"), "{help}");
}

/// Issue 12, item 7, as issue 43 left it: a `barrier run` cut off from
/// ZooKeeper while the servers run on, long enough for them to expire its
/// session (its registration with it), goes on until it hears from a
/// server again (it cannot tell this from an outage of the whole
/// ensemble, which it must run through); told then that its session
/// expired, it terminates its command and exits 5, and does not register
/// again: the peers have counted it as gone (the peer here left, and
/// exited 0, meanwhile).
#[tokio::test]
async fn barrier_run_stops_its_command_once_told_its_session_expired() {
    let (direct, through_proxy, proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let done = dir.path().join("done");
    let script = format!(
        "touch {}; sleep 60; touch {}",
        started.display(),
        done.display()
    );
    let cut_off = support::zkgate(
        &through_proxy,
        &[
            "barrier",
            "run",
            "g",
            "--participants",
            "2",
            "--id",
            "a",
            "--session-timeout",
            "4s",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .env("ZKGATE_LOG", "info")
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let peer = support::zkgate(
        &direct,
        &[
            "barrier",
            "run",
            "g",
            "--participants",
            "2",
            "--id",
            "b",
            "--",
            "sleep",
            "1",
        ],
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(10), "a's command", || async {
        started.exists().then_some(())
    })
    .await;
    proxy.stall_until_expired().await;
    let (code, err) = support::finished(peer, Duration::from_secs(20)).await;
    assert_eq!(code, 0, "{err}");
    proxy.resume();
    let (code, err) = support::finished(cut_off, Duration::from_secs(30)).await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("registration"), "{err}");
    assert!(err.contains("expired"), "{err}");
    assert!(!done.exists(), "a's command ran on: {err}");
    let admin = session(&direct).await;
    assert!(
        children(&admin, "/zkgate/namespaces/default/barriers/g")
            .await
            .iter()
            .all(|n| n != "a"),
        "a registered again"
    );
}

/// Issue 12, item 8: a barrier made without a controller can be used for
/// another round: the first arrival of the next round waits for the rest.
#[tokio::test]
async fn a_barrier_without_a_controller_can_be_used_again() {
    let (direct, _, _proxy) = routes().await;
    let round = |id: &str, timeout: &str| {
        support::zkgate(
            &direct,
            &[
                "barrier",
                "run",
                "r",
                "--participants",
                "2",
                "--id",
                id,
                "--timeout",
                timeout,
                "--",
                "true",
            ],
        )
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (round("a", "30s"), round("b", "30s"));
    for p in [a, b] {
        let (code, err) = support::finished(p, Duration::from_secs(30)).await;
        assert_eq!(code, 0, "{err}");
    }
    let (code, err) = support::finished(round("c", "2s"), Duration::from_secs(30)).await;
    assert_eq!(
        code, 3,
        "alone, the next round must wait (and time out): {err}"
    );
    let (c, d) = (round("c", "30s"), round("d", "30s"));
    for p in [c, d] {
        let (code, err) = support::finished(p, Duration::from_secs(30)).await;
        assert_eq!(code, 0, "{err}");
    }
    let observer = session(&direct).await;
    assert!(children(&observer, &format!("{BARRIERS}/r"))
        .await
        .is_empty());
}

/// The host pid of the process `unshare --fork` started (PID 1 inside).
async fn namespace_init(unshare: &tokio::process::Child) -> i32 {
    let pid = unshare.id().expect("running");
    eventually(
        Duration::from_secs(5),
        "the namespace's init",
        || async move {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
        },
    )
    .await
}

/// `zkgate ARGS` as PID 1 of a new PID namespace, as in a container.
fn as_pid_1(connect: &str, args: &[&str]) -> tokio::process::Child {
    let mut all = vec![
        "--pid",
        "--fork",
        "--kill-child",
        "--",
        env!("CARGO_BIN_EXE_zkgate"),
    ];
    all.extend_from_slice(args);
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(&all)
        .env("ZKGATE_ZOOKEEPER", connect)
        .envs(support::tls_env(connect))
        .env("ZKGATE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd.spawn().expect("unshare (util-linux) runs")
}

/// Issue 12, item 9: SIGTERM to a waiting `barrier enter` or `lock
/// acquire` running as PID 1 (which gets no default signal handlers)
/// removes its persistent registration, closes the session and exits 143;
/// so do the sidecars, with their ephemeral ones.
#[tokio::test]
async fn sigterm_to_a_waiting_pid_1_removes_its_registration_and_exits() {
    let (direct, _, _proxy) = routes().await;
    let observer = session(&direct).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let token = token.to_str().unwrap();
    // Someone holds the lock, so the second acquire waits.
    let holder = support::zkgate(
        &direct,
        &[
            "lock",
            "sidecar",
            "db",
            "--create",
            "--id",
            "holder",
            "--token-file",
            token,
            "--ready-file",
            &format!("{}/ready", dir.path().display()),
        ],
    )
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(10), "the holder", || async {
        (children(&observer, &format!("{LOCKS}/db")).await.len() == 1).then_some(())
    })
    .await;
    let other_token = format!("{}/other", dir.path().display());
    let sidecar_ready = format!("{}/sidecar-ready", dir.path().display());
    let cases: [(Vec<&str>, String); 4] = [
        (
            vec![
                "barrier",
                "enter",
                "g",
                "--participants",
                "2",
                "--id",
                "p1",
                "--pod-uid",
                "u1",
            ],
            format!("{BARRIERS}/g"),
        ),
        (
            vec![
                "lock",
                "acquire",
                "db",
                "--id",
                "p2",
                "--pod-uid",
                "u2",
                "--token-file",
                &other_token,
            ],
            format!("{LOCKS}/db"),
        ),
        (
            vec![
                "barrier",
                "sidecar",
                "g",
                "--participants",
                "2",
                "--id",
                "p3",
                "--ready-file",
                &sidecar_ready,
            ],
            format!("{BARRIERS}/g"),
        ),
        (
            vec![
                "lock",
                "sidecar",
                "db",
                "--id",
                "p4",
                "--token-file",
                &other_token,
                "--ready-file",
                &sidecar_ready,
            ],
            format!("{LOCKS}/db"),
        ),
    ];
    for (args, parent) in cases {
        let before = children(&observer, &parent).await.len();
        let waiting = as_pid_1(&direct, &args);
        eventually(Duration::from_secs(10), "the registration", || async {
            (children(&observer, &parent).await.len() == before + 1).then_some(())
        })
        .await;
        let init = namespace_init(&waiting).await;
        assert_eq!(unsafe { libc::kill(init, libc::SIGTERM) }, 0);
        let (code, err) = support::finished(waiting, Duration::from_secs(10)).await;
        assert_eq!(code, 143, "{args:?}: {err}");
        assert_eq!(
            children(&observer, &parent).await.len(),
            before,
            "{args:?} left its registration behind"
        );
    }
    drop(holder);
}

/// Found by the soak (seed 1796013422618736417): a participant whose first
/// round is lost with its connection (here: nothing of it reaches the
/// server) must register on the next round, not take the registration it
/// never made for granted and then find itself "removed".
#[tokio::test]
async fn a_registration_lost_with_the_connection_is_made_on_the_next_round() {
    let (direct, through_proxy, proxy) = routes().await;
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 2).await;
    let b = session_with_timeout(&through_proxy, Duration::from_secs(4)).await;
    // b's first round dies with its connection before reaching the server.
    proxy.freeze_at(&[op::GET_DATA], BARRIER, false);
    let second = spawn_enter(&barrier, b, "b", None, None);
    tokio::time::timeout(Duration::from_secs(5), proxy.frozen())
        .await
        .expect("b's first round was sent");
    let first = spawn_enter(&barrier, session(&direct).await, "a", None, None);
    for task in [first, second] {
        let (entered, _s) = joined(task, Duration::from_secs(20)).await;
        entered.expect("both enter");
    }
}

// ---- Issue 24: nothing of a holder outlives its hold ----

/// A worker that ignores SIGTERM and beats until killed; it writes its pid
/// into `pids` first.
fn write_worker(dir: &std::path::Path) -> std::path::PathBuf {
    let worker = dir.join("worker.sh");
    std::fs::write(
        &worker,
        format!(
            "trap '' TERM\necho $$ >> {pids}\nwhile :; do sleep 0.02; done\n",
            pids = dir.join("pids").display()
        ),
    )
    .unwrap();
    worker
}

/// The next holder's command: which of `pids` still run at the moment it
/// starts, into `report`. A process runs while any of its threads is not a
/// zombie (its main thread may have exited before the others).
fn survivors_script(dir: &std::path::Path) -> String {
    format!(
        "for p in $(cat {pids}); do for t in /proc/$p/task/*/status; do if [ -r $t ] && ! grep -q '^State:.*Z' $t; then echo $p; break; fi; done; done > {report}.tmp; mv {report}.tmp {report}",
        pids = dir.join("pids").display(),
        report = dir.join("report").display()
    )
}

/// Waits until `pids` lists `n` workers.
async fn workers_started(dir: &std::path::Path, n: usize) {
    let pids = dir.join("pids");
    eventually(Duration::from_secs(10), "the workers started", || async {
        (std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .count()
            == n)
            .then_some(())
    })
    .await;
}

/// The next holder: queues on `db` (direct connection), and once it holds,
/// reports which workers of the previous holder still run.
fn next_holder(direct: &str, dir: &std::path::Path) -> tokio::process::Child {
    piped(support::next_lock_holder(direct, &survivors_script(dir)))
}

/// [`next_holder`], once it queued behind the holder.
async fn next_holder_queued(
    direct: &str,
    dir: &std::path::Path,
    observer: &zkgate::zk::Session,
) -> tokio::process::Child {
    let next = next_holder(direct, dir);
    eventually(
        Duration::from_secs(10),
        "the next holder queued",
        || async { (children(observer, &format!("{LOCKS}/db")).await.len() == 2).then_some(()) },
    )
    .await;
    next
}

/// Issue 24, item 2: a command that leaves children behind (one in its
/// process group, one that left the group with setsid; both ignore
/// SIGTERM) exits; `lock run` stops them all before it releases, so none
/// runs beside the next holder's command.
#[tokio::test]
async fn nothing_of_a_commands_process_tree_outlives_its_hold() {
    let (direct, _, _proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = write_worker(dir.path());
    let script = format!(
        "sh {w} >/dev/null 2>&1 & setsid sh {w} >/dev/null 2>&1 & while [ $(wc -l < {pids} 2>/dev/null || echo 0) -lt 2 ]; do sleep 0.01; done; exit 0",
        w = worker.display(),
        pids = dir.path().join("pids").display()
    );
    let observer = session(&direct).await;
    let holder = piped(support::zkgate(
        &direct,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--id",
            "holder",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    eventually(Duration::from_secs(10), "the holder holds", || async {
        (children(&observer, &format!("{LOCKS}/db")).await.len() == 1).then_some(())
    })
    .await;
    let next = next_holder(&direct, dir.path());
    let (code, err) = support::finished(holder, Duration::from_secs(30)).await;
    assert_eq!(code, 0, "{err}");
    let (code, err) = support::finished(next, Duration::from_secs(30)).await;
    assert_eq!(code, 0, "{err}");
    let survivors = std::fs::read_to_string(dir.path().join("report")).unwrap();
    let started = std::fs::read_to_string(dir.path().join("pids")).unwrap();
    assert_eq!(started.lines().count(), 2, "{started}");
    assert!(
        survivors.trim().is_empty(),
        "workers {} of the first holder's command (of {}) still ran when the next holder's command started",
        survivors.trim().replace('\n', ", "),
        started.trim().replace('\n', ", ")
    );
    for pid in started.lines() {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .status();
    }
}

/// Issue 44: a worker whose main thread has exited (`pthread_exit` from
/// `main`, here through Python's ctypes) while another of its threads runs
/// shows `Z` in `/proc/PID/stat`. It still runs, and must be stopped with
/// the rest of the command's tree before the lock is released. Failed
/// before the fix: taken for an exited process, it was never signalled,
/// and ran on beside the next holder's command.
#[tokio::test]
async fn a_worker_whose_main_thread_exited_does_not_outlive_the_hold() {
    let (direct, _, _proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = dir.path().join("worker.py");
    std::fs::write(&worker, THREAD_ONLY_WORKER).unwrap();
    let gone = dir.path().join("main-thread-gone");
    // The command leaves the worker behind once its main thread is gone.
    let script = format!(
        "python3 {w} {pids} {gone} >/dev/null 2>&1 & while [ ! -e {gone} ]; do sleep 0.01; done; exit 0",
        w = worker.display(),
        pids = dir.path().join("pids").display(),
        gone = gone.display(),
    );
    let observer = session(&direct).await;
    let holder = piped(support::zkgate(
        &direct,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--id",
            "holder",
            "--timeout",
            "30s",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    eventually(Duration::from_secs(10), "the holder holds", || async {
        (children(&observer, &format!("{LOCKS}/db")).await.len() == 1).then_some(())
    })
    .await;
    let next = next_holder_queued(&direct, dir.path(), &observer).await;
    let (code, err) = support::finished(holder, Duration::from_secs(30)).await;
    let started = std::fs::read_to_string(dir.path().join("pids")).unwrap_or_default();
    let kill_workers = || {
        for pid in started.lines() {
            let _ = std::process::Command::new("kill")
                .args(["-9", pid])
                .status();
        }
    };
    if code != 0 {
        kill_workers();
    }
    assert_eq!(code, 0, "{err}");
    let (code, err) = support::finished(next, Duration::from_secs(30)).await;
    kill_workers();
    assert_eq!(code, 0, "{err}");
    assert_eq!(started.lines().count(), 1, "{started}");
    let survivors = std::fs::read_to_string(dir.path().join("report")).unwrap();
    assert!(
        survivors.trim().is_empty(),
        "the worker {} whose main thread had exited still ran when the next holder's command started",
        survivors.trim()
    );
}

/// A Python worker that ignores SIGTERM and writes its pid; a thread of it
/// touches `gone` once the main thread has ended and runs on; the main
/// thread ends with `pthread_exit` (ctypes releases the GIL for the call).
const THREAD_ONLY_WORKER: &str = r#"
import ctypes, os, signal, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pids, gone = sys.argv[1:3]
with open(pids, "a") as f:
    f.write("%d\n" % os.getpid())
def run_on():
    while True:
        with open("/proc/self/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "Z" and not os.path.exists(gone):
            open(gone, "w").close()
        time.sleep(0.02)
threading.Thread(target=run_on).start()
ctypes.CDLL(None).pthread_exit(None)
"#;

/// Issue 24, item 2, the limit left in session 9: `lock run` SIGKILLed
/// (an OOM kill; it is not PID 1 here, so the kernel does not take its
/// descendants with it) while its command's children run, one in the
/// command's group and one that left it with setsid, both ignoring
/// SIGTERM. None of them may run beside the next holder's command.
#[tokio::test]
async fn a_sigkilled_zkgate_takes_its_commands_whole_tree_with_it() {
    let (direct, _, _proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = write_worker(dir.path());
    let script = format!(
        "sh {w} >/dev/null 2>&1 & setsid sh {w} >/dev/null 2>&1 & wait",
        w = worker.display(),
    );
    let observer = session(&direct).await;
    let holder = piped(support::zkgate(
        &direct,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--id",
            "holder",
            "--session-timeout",
            "4s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    workers_started(dir.path(), 2).await;
    let next = next_holder_queued(&direct, dir.path(), &observer).await;
    signal_pid(holder.id().unwrap(), libc::SIGKILL);
    let (code, err) = support::finished(next, Duration::from_secs(60)).await;
    assert_eq!(code, 0, "{err}");
    let survivors = std::fs::read_to_string(dir.path().join("report")).unwrap();
    let started = std::fs::read_to_string(dir.path().join("pids")).unwrap();
    for pid in started.lines() {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .status();
    }
    assert!(
        survivors.trim().is_empty(),
        "workers {} of the SIGKILLed holder's command (of {}) still ran when the next holder's command started",
        survivors.trim().replace('\n', ", "),
        started.trim().replace('\n', ", ")
    );
    drop(holder);
}

/// Issue 24, item 3: a `lock sidecar` that is SIGKILLed (an OOM kill) while
/// `lock watch` runs the main container's command: the command is stopped
/// before the server can expire the dead sidecar's session, so it never
/// runs beside the next holder's command; `lock watch` exits 6 and says why.
#[tokio::test]
async fn a_crashed_sidecars_watched_command_is_dead_before_the_next_holder_starts() {
    let (direct, _, _proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = write_worker(dir.path());
    let observer = session(&direct).await;
    let (sidecar, main) = support::lock_sidecar_and_watch(
        &direct,
        dir.path(),
        "4s",
        "1s",
        &["sh", worker.to_str().unwrap()],
    );
    let (sidecar, main) = (piped(sidecar), piped(main));
    workers_started(dir.path(), 1).await;
    let next = next_holder_queued(&direct, dir.path(), &observer).await;
    signal_pid(sidecar.id().unwrap(), libc::SIGKILL);
    let (code, err) = support::finished(main, Duration::from_secs(30)).await;
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("sidecar"), "{err}");
    let (code, err) = support::finished(next, Duration::from_secs(30)).await;
    assert_eq!(code, 0, "{err}");
    let survivors = std::fs::read_to_string(dir.path().join("report")).unwrap();
    assert!(
        survivors.trim().is_empty(),
        "the watched command ({}) still ran when the next holder's command started",
        survivors.trim()
    );
    drop(sidecar);
}

/// Issue 24, item 3: a restarted sidecar withdraws the token its crashed
/// predecessor left before it queues again, so a watched command never
/// starts on a token that is no longer held.
#[tokio::test]
async fn a_restarted_sidecar_withdraws_the_old_token_before_it_queues() {
    let (direct, _, _proxy) = routes().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("fencing-token");
    let ready = dir.path().join("ready");
    let observer = session(&direct).await;
    let lock = format!("{LOCKS}/db");
    let _holder = Mutex::new(
        &lock,
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    )
    .acquire(&observer, None)
    .await
    .unwrap();
    std::fs::write(&token, "12345\n").unwrap();
    let sidecar = piped(support::zkgate(
        &direct,
        &[
            "lock",
            "sidecar",
            "db",
            "--create",
            "--id",
            "restarted",
            "--token-file",
            token.to_str().unwrap(),
            "--ready-file",
            ready.to_str().unwrap(),
        ],
    ));
    eventually(Duration::from_secs(10), "the sidecar queued", || async {
        (children(&observer, &lock).await.len() == 2).then_some(())
    })
    .await;
    assert!(
        !token.exists(),
        "the old token was still there while the restarted sidecar waited: {:?}",
        std::fs::read_to_string(&token)
    );
    drop(sidecar);
}

fn signal_pid(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid this test spawned.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// Issue 24, item 9: three participants passed; b leaves and waits on the
/// lowest, a; a's own leave times out (its node is removed all the same).
/// b must not be told that everyone has left while c is still in: it waits
/// for c, and returns once c has left.
#[tokio::test]
async fn a_leave_waits_for_everyone_even_when_the_lowest_gives_up() {
    let (direct, _, _proxy) = routes().await;
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 3).await;
    let entering: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|id| {
            let direct = direct.clone();
            spawn_enter_on(&barrier, direct, id)
        })
        .collect();
    let mut sessions = Vec::new();
    for task in entering {
        let (entered, s) = joined(task, Duration::from_secs(10)).await;
        entered.expect("entered");
        sessions.push(s);
    }
    let c = sessions.pop().unwrap();
    let b = sessions.pop().unwrap();
    let a = sessions.pop().unwrap();
    let b_id = b.id();
    let b_leaving = {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let r = barrier
                .leave(&b, "b", Some(Instant::now() + Duration::from_secs(30)))
                .await;
            (r, b)
        })
    };
    // b has removed its node and waits on a.
    registered(&admin, &["a", "c", "ready"]).await;
    // a (the lowest) waits on c, and gives up.
    let a_left = barrier
        .leave(&a, "a", Some(Instant::now() + Duration::from_millis(300)))
        .await;
    assert!(matches!(a_left, Err(ZkError::Timeout { .. })), "{a_left:?}");
    registered(&admin, &["c", "ready"]).await;
    // b must now wait on c, not return.
    let c_path = format!("{}{BARRIER}/c", support::chroot_of(&direct));
    let mut b_leaving = b_leaving;
    tokio::select! {
        done = &mut b_leaving => panic!("b was told everyone had left while c was still in: {:?}", done.unwrap().0),
        () = eventually(Duration::from_secs(10), "b waiting on c", || async {
            support::watchers_of(&c_path).contains(&b_id).then_some(())
        }) => {}
    }
    barrier
        .leave(&c, "c", Some(Instant::now() + Duration::from_secs(10)))
        .await
        .expect("c leaves last");
    let (b_left, _b) = joined(b_leaving, Duration::from_secs(10)).await;
    b_left.expect("b is told once c has left");
    assert!(children(&admin, BARRIER).await.is_empty());
}

/// Enters `id` on a session of its own, kept until the result is taken.
fn spawn_enter_on(
    barrier: &DoubleBarrier,
    connect: String,
    id: &'static str,
) -> tokio::task::JoinHandle<(Result<zkgate::zk::Entered, ZkError>, zkgate::zk::Session)> {
    let barrier = barrier.clone();
    tokio::spawn(async move {
        let s = session(&connect).await;
        let r = barrier
            .enter(
                &s,
                id,
                &ephemeral(None),
                Some(Instant::now() + Duration::from_secs(10)),
            )
            .await;
        (r, s)
    })
}

/// Issue 24, item 4: the limit is lowered from 2 to 1 while an admission
/// that read 2 (with 1 in use) has its multi on the way: the multi must
/// fail on the count's version and the acquirer wait, so never more than
/// N leases exist.
#[tokio::test]
async fn a_limit_lowered_during_an_admission_admits_nobody_beyond_it() {
    use zkgate::zk::{encode_count, Permits, Semaphore};
    let (direct, through_proxy, proxy) = routes().await;
    let admin = session(&direct).await;
    let sem = "/sem";
    let count = format!("{sem}/count");
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    admin.client().mkdir(sem, &persistent).await.unwrap();
    admin
        .client()
        .create(&count, &encode_count(2), &persistent)
        .await
        .unwrap();
    let semaphore = || {
        Semaphore::new(
            sem,
            Permits::Shared(count.clone()),
            LockOptions {
                create_parent: true,
                ..LockOptions::default()
            },
        )
    };
    let first = semaphore().acquire(&admin, 1, None).await.unwrap();
    let late = session(&through_proxy).await;
    let late_id = late.id();
    proxy.stall_at(&[op::MULTI], "lease-");
    let acquiring = {
        let sem = semaphore();
        tokio::spawn(async move {
            let r = sem
                .acquire(&late, 1, Some(Instant::now() + Duration::from_secs(30)))
                .await
                .map(|hold| hold.into_registration());
            (r, late)
        })
    };
    tokio::time::timeout(Duration::from_secs(10), proxy.stalled_at())
        .await
        .expect("the admission's multi reached the proxy");
    admin
        .client()
        .set_data(&count, &encode_count(1), None)
        .await
        .unwrap();
    proxy.resume();
    let leases = format!("{sem}/leases");
    // Waiting, the acquirer watches the count (a data watch, which the
    // server's watch listing shows) for a new limit.
    let count_watched = format!("{}{count}", support::chroot_of(&direct));
    let overrun = async {
        while children(&admin, &leases).await.len() <= 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = overrun => panic!("2 leases exist with a limit of 1: the admission used the count it read before the limit was lowered"),
        () = eventually(Duration::from_secs(20), "the late acquirer waiting", || async {
            support::watchers_of(&count_watched).contains(&late_id).then_some(())
        }) => {}
    }
    assert_eq!(children(&admin, &leases).await.len(), 1);
    first.release().await.unwrap();
    let (r, _late) = joined(acquiring, Duration::from_secs(20)).await;
    r.expect("admitted once the first lease went");
}

/// Issue 24, item 11: `barrier leave` waiting for the others, as PID 1 (no
/// default signal handlers), exits 143 on SIGTERM and removes its node,
/// as `barrier enter` does.
#[tokio::test]
async fn sigterm_to_a_waiting_pid_1_leave_removes_its_node_and_exits() {
    let (direct, _, _proxy) = routes().await;
    let observer = session(&direct).await;
    for id in ["p1", "p2"] {
        let (code, err) = support::output(support::zkgate(
            &direct,
            &[
                "barrier",
                "enter",
                "g",
                "--participants",
                "1",
                "--id",
                id,
                "--pod-uid",
                id,
            ],
        ))
        .await;
        assert_eq!(code, 0, "{err}");
    }
    let barrier = format!("{BARRIERS}/g");
    assert_eq!(children(&observer, &barrier).await, ["p1", "p2", "ready"]);
    // p1 is the lowest: it waits for p2 to leave.
    let leaving = as_pid_1(&direct, &["barrier", "leave", "g", "--id", "p1"]);
    let p2 = format!("{}{barrier}/p2", support::chroot_of(&direct));
    eventually(Duration::from_secs(10), "p1 waiting on p2", || async {
        (!support::watchers_of(&p2).is_empty()).then_some(())
    })
    .await;
    let init = namespace_init(&leaving).await;
    assert_eq!(unsafe { libc::kill(init, libc::SIGTERM) }, 0);
    let (code, err) = support::finished(leaving, Duration::from_secs(10)).await;
    assert_eq!(code, 143, "{err}");
    assert_eq!(children(&observer, &barrier).await, ["p2", "ready"]);
}

/// Issue 24, item 8: a participant's deadline passes while the opening
/// that counted it is on its way. Its withdrawal must settle, with the
/// server, whether the barrier opened with it: here it did (the opening
/// commits between the participant's look and its withdrawal), so the
/// participant has entered, never "timed out" while the other passes
/// counting it.
#[tokio::test]
async fn a_withdrawal_racing_the_opening_that_counted_it_reports_entered() {
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let (proxy_a, proxy_b) = (
        Proxy::start(support::shared_zookeeper()).await,
        Proxy::start(support::shared_zookeeper()).await,
    );
    let direct = format!("{}{chroot}", support::shared_zookeeper());
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 2).await;
    // Sessions that outlast the stalls below.
    let long = Duration::from_secs(20);
    let a = session_with_timeout(&format!("{}{chroot}", proxy_a.address()), long).await;
    let b = session_with_timeout(&format!("{}{chroot}", proxy_b.address()), long).await;
    let a_deadline = Instant::now() + Duration::from_secs(2);
    let waiting = spawn_enter(&barrier, a, "a", None, Some(a_deadline));
    registered(&admin, &["a"]).await;
    // b's opening (the multi that makes `ready`) is held at its proxy.
    proxy_b.stall_at(&[op::MULTI], READY_NAME);
    let opening = spawn_enter(&barrier, b, "b", None, None);
    tokio::time::timeout(Duration::from_secs(10), proxy_b.stalled_at())
        .await
        .expect("b's opening reached its proxy");
    // a's way out (whatever it sends to remove its node) is held too, once
    // its deadline has passed.
    proxy_a.stall_at(&[op::DELETE, op::MULTI], &format!("{BARRIER}/a"));
    tokio::time::timeout(Duration::from_secs(10), proxy_a.stalled_at())
        .await
        .expect("a's withdrawal reached its proxy");
    assert!(Instant::now() >= a_deadline);
    // The opening commits, counting a; then a's withdrawal goes on.
    proxy_b.resume();
    let (opened, _b) = joined(opening, Duration::from_secs(10)).await;
    opened.expect("b passes");
    proxy_a.resume();
    let (outcome, _a) = joined(waiting, Duration::from_secs(10)).await;
    assert!(
        outcome.is_ok(),
        "the barrier opened counting a, but a was told: {outcome:?}"
    );
}

const READY_NAME: &str = "/ready";

/// Issue 24, item 8, the other order: the participant's withdrawal commits
/// while the opening that counted it is still on its way. The opening
/// must fail (the withdrawal changed the barrier's version) and the opener
/// count again and wait, never open one short.
#[tokio::test]
async fn an_opening_that_counted_a_withdrawn_participant_counts_again() {
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let proxy_b = Proxy::start(support::shared_zookeeper()).await;
    let direct = format!("{}{chroot}", support::shared_zookeeper());
    let admin = session(&direct).await;
    let barrier = support::barrier_made(&admin, BARRIER, 2).await;
    let long = Duration::from_secs(20);
    let a = session_with_timeout(&direct, long).await;
    let b = session_with_timeout(&format!("{}{chroot}", proxy_b.address()), long).await;
    let a_deadline = Instant::now() + Duration::from_secs(2);
    let waiting = spawn_enter(&barrier, a, "a", None, Some(a_deadline));
    registered(&admin, &["a"]).await;
    proxy_b.stall_at(&[op::MULTI], READY_NAME);
    let opening = spawn_enter(
        &barrier,
        b,
        "b",
        None,
        Some(Instant::now() + Duration::from_secs(30)),
    );
    tokio::time::timeout(Duration::from_secs(10), proxy_b.stalled_at())
        .await
        .expect("b's opening reached its proxy");
    let (withdrawn, _a) = joined(waiting, Duration::from_secs(10)).await;
    assert!(
        matches!(withdrawn, Err(ZkError::Timeout { .. })),
        "{withdrawn:?}"
    );
    registered(&admin, &["b"]).await;
    // b's first look (one watch of `ready`) is behind it; a second look is
    // what a failed opening leads to.
    let looks = || proxy_b.forwarded(&[op::EXISTS], READY_NAME);
    assert_eq!(looks(), 1);
    proxy_b.resume();
    let mut opening = opening;
    tokio::select! {
        done = &mut opening => panic!("b passed a barrier of 2 with only itself in: {:?}", done.unwrap().0),
        () = eventually(Duration::from_secs(10), "b looking again", || async {
            (looks() >= 2).then_some(())
        }) => {}
    }
    assert_eq!(children(&admin, BARRIER).await, ["b"]);
    opening.abort();
}

/// `zkgate barrier enter g --id p1 --pod-uid UID` (an init container's
/// persistent registration: 2 participants, a 4 s session) through
/// `connect`, waiting at most `timeout`.
fn enter_as_p1(connect: &str, uid: &str, timeout: &str) -> tokio::process::Child {
    piped(support::zkgate(
        connect,
        &[
            "barrier",
            "enter",
            "g",
            "--participants",
            "2",
            "--id",
            "p1",
            "--pod-uid",
            uid,
            "--timeout",
            timeout,
            "--session-timeout",
            "4s",
        ],
    ))
}

/// p1's `barrier enter g` (pod uid u1, 3 s to enter) through `connect`,
/// once registered.
async fn p1_registered(connect: &str, observer: &zkgate::zk::Session) -> tokio::process::Child {
    let entering = enter_as_p1(connect, "u1", "3s");
    let barrier = format!("{BARRIERS}/g");
    eventually(Duration::from_secs(10), "p1 registered", || async {
        (children(observer, &barrier).await == ["p1"]).then_some(())
    })
    .await;
    entering
}

/// Issue 24, item 12: a persistent registration (an init container's)
/// whose session expired while the command gave up waiting is removed all
/// the same, by a new session: nothing of ours stays behind to be counted.
#[tokio::test]
async fn a_persistent_registration_outlives_no_expired_session() {
    let (direct, through_proxy, proxy) = routes().await;
    let observer = session(&direct).await;
    let entering = p1_registered(&through_proxy, &observer).await;
    let barrier = format!("{BARRIERS}/g");
    proxy.stall_until_expired().await;
    proxy.resume();
    let (code, err) = support::finished(entering, Duration::from_secs(30)).await;
    assert!(code == 3 || code == 5, "{code}: {err}");
    assert!(
        children(&observer, &barrier).await.is_empty(),
        "p1's persistent registration stayed after its session expired: {err}"
    );
}

/// Issue 24, item 12, what its clean-up must not do: p1's persistent
/// registration went while its session was expired (the controller
/// removed it: its pod ended), and a new pod of the same name registered
/// under the same id. When p1's zkgate comes back and cleans up from a
/// new session, the node there is not the one it made (another czxid): it
/// must stay.
#[tokio::test]
async fn a_clean_up_after_expiry_leaves_a_new_registration_of_the_same_name_alone() {
    let (direct, through_proxy, proxy) = routes().await;
    let observer = session(&direct).await;
    let entering = p1_registered(&through_proxy, &observer).await;
    let barrier = format!("{BARRIERS}/g");
    let node = format!("{barrier}/p1");
    proxy.stall_until_expired().await;
    let (created, _again) = replaced_by_a_new_pod(&direct, &observer, &node).await;
    proxy.resume();
    gave_up_leaving_the_new_pods_node(entering, &observer, &node, created).await;
}

/// Registration `node` of barrier `g` removed as the controller removes a
/// lost participant's (its pod ended, or was deleted), with the barrier's
/// version moved in the same transaction; then a new pod of the same name
/// (uid u2) registering as p1, directly, and waiting on. Returns its
/// node's czxid and the process.
async fn replaced_by_a_new_pod(
    direct: &str,
    observer: &zkgate::zk::Session,
    node: &str,
) -> (i64, tokio::process::Child) {
    let barrier = format!("{BARRIERS}/g");
    let first = observer.client().check_stat(node).await.unwrap();
    let first = first.expect("our registration is there").czxid;
    let (data, stat) = observer.client().get_data(&barrier).await.unwrap();
    let mut writer = observer.client().new_multi_writer();
    writer
        .add_set_data(&barrier, &data, Some(stat.version))
        .unwrap();
    writer.add_delete(node, None).unwrap();
    writer.commit().await.unwrap();
    let again = enter_as_p1(direct, "u2", "60s");
    let created = eventually(
        Duration::from_secs(10),
        "the new pod registered",
        || async {
            let stat = observer.client().check_stat(node).await.ok()??;
            (stat.czxid != first).then_some(stat.czxid)
        },
    )
    .await;
    (created, again)
}

/// p1 (`entering`, through the resumed proxy) gives up unsettled (exit 3
/// or 5), and the new pod's registration `node`, made at `created`, is
/// still there.
async fn gave_up_leaving_the_new_pods_node(
    entering: tokio::process::Child,
    observer: &zkgate::zk::Session,
    node: &str,
    created: i64,
) {
    let (code, err) = support::finished(entering, Duration::from_secs(30)).await;
    assert!(code == 3 || code == 5, "{code}: {err}");
    let after = observer.client().check_stat(node).await.unwrap();
    assert_eq!(
        after.map(|s| s.czxid),
        Some(created),
        "the new pod's registration was removed by p1 giving up: {err}"
    );
}

/// The same when the reply to our create was lost (the create applied,
/// the connection frozen) and our session expired before we learnt of it:
/// the clean-up, from a new session, has no czxid to know our node by,
/// only what it wrote, and the new pod wrote another uid.
#[tokio::test]
async fn a_clean_up_of_a_create_whose_reply_was_lost_leaves_a_new_registration_alone() {
    let (direct, through_proxy, proxy) = routes().await;
    let observer = session(&direct).await;
    let node = format!("{BARRIERS}/g/p1");
    // There first: a create sent before it would fail, not be lost.
    DoubleBarrier::new(format!("{BARRIERS}/g"))
        .create(
            &observer,
            &BarrierData {
                participants: 2,
                ..BarrierData::default()
            },
        )
        .await
        .unwrap();
    proxy.freeze_at(&op::CREATES, "barriers/g/p1", true);
    let entering = enter_as_p1(&through_proxy, "u1", "3s");
    proxy.frozen().await;
    // No reconnect learns of it before the session expires.
    proxy.stall();
    proxy.stall_until_expired().await;
    let (created, _again) = replaced_by_a_new_pod(&direct, &observer, &node).await;
    proxy.resume();
    gave_up_leaving_the_new_pods_node(entering, &observer, &node, created).await;
}

/// A withdrawal racing the controller: p1 gives up (its deadline), has
/// checked that its node is the one it made, and is about to read the
/// barrier and withdraw, when the controller removes that node (its pod
/// was deleted, its process cut off and still running) and the new pod of
/// the same name registers. Every registration is at version 0, so a
/// withdrawal by version alone took the new pod's node. The stall holds
/// p1's read of the barrier (a get without a watch: only the withdrawal's)
/// while that happens. Failed on the code before: the new pod's node gone.
#[tokio::test]
async fn a_withdrawal_racing_the_controllers_removal_leaves_the_new_pods_registration_alone() {
    let (direct, through_proxy, proxy) = routes().await;
    let observer = session(&direct).await;
    let entering = p1_registered(&through_proxy, &observer).await;
    let node = format!("{BARRIERS}/g/p1");
    // The path's last byte, then the watch flag: false.
    proxy.stall_at(&[op::GET_DATA], "barriers/g\u{0}");
    proxy.stalled_at().await;
    let (created, _again) = replaced_by_a_new_pod(&direct, &observer, &node).await;
    proxy.resume();
    gave_up_leaving_the_new_pods_node(entering, &observer, &node, created).await;
}

/// A token file that is not a regular file (a pipe here; `/dev/null` in a
/// test once, which zkgate's rename replaced for the whole machine, as
/// root): refused before anything is registered (exit 2), the file left as
/// it was.
#[tokio::test]
async fn a_token_file_that_is_not_a_regular_file_is_refused_and_left_alone() {
    use std::os::unix::fs::FileTypeExt;
    let (direct, _, _proxy) = routes().await;
    let observer = session(&direct).await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("token");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let ready = dir.path().join("ready");
    for command in ["acquire", "sidecar"] {
        let mut args = vec![
            "lock",
            command,
            "db",
            "--create",
            "--token-file",
            fifo.to_str().unwrap(),
        ];
        if command == "sidecar" {
            args.extend(["--ready-file", ready.to_str().unwrap()]);
        }
        let (code, err) = support::output(support::zkgate(&direct, &args)).await;
        assert_eq!(code, 2, "{command}: {err}");
        assert!(err.contains("not a regular file"), "{command}: {err}");
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo(),
            "{command} replaced the pipe"
        );
        assert!(children(&observer, &format!("{LOCKS}/db")).await.is_empty());
    }
}
