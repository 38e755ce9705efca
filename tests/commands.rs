//! The `zkgate` participant commands as processes against a real ZooKeeper.

mod support;

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::{children, eventually, isolated_connect, output, session, zkgate};
use tokio::process::Child;
use zkgate::zk::{BarrierData, DoubleBarrier};

const BARRIERS: &str = "/zkgate/namespaces/default/barriers";
const LOCKS: &str = "/zkgate/namespaces/default/locks";

async fn exited(child: &mut Child, within: Duration) -> ExitStatus {
    tokio::time::timeout(within, child.wait())
        .await
        .expect("the command exits in time")
        .expect("wait")
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn signal(child: &Child, sig: i32) {
    let pid = child.id().expect("running") as i32;
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

#[tokio::test]
async fn staggered_barrier_runs_start_only_after_the_last_registration() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    let mut last_launch = 0;
    for i in 0..4 {
        let mark = dir.path().join(format!("start-{i}"));
        let script = format!(
            "date +%s%N > {}; exit {}",
            mark.display(),
            if i == 3 { 7 } else { 0 }
        );
        last_launch = now_nanos();
        runs.push(
            zkgate(
                &connect,
                &[
                    "barrier",
                    "run",
                    "gang",
                    "--participants",
                    "4",
                    "--id",
                    &format!("p{i}"),
                    "--timeout",
                    "30s",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ],
            )
            .spawn()
            .unwrap(),
        );
        if i < 3 {
            let observer = session(&connect).await;
            eventually(Duration::from_secs(10), "registration", || async {
                (children(&observer, &format!("{BARRIERS}/gang")).await.len() == i + 1)
                    .then_some(())
            })
            .await;
        }
    }
    let mut codes = Vec::new();
    for run in runs.iter_mut() {
        codes.push(exited(run, Duration::from_secs(30)).await.code());
    }
    assert_eq!(
        codes,
        [Some(0), Some(0), Some(0), Some(7)],
        "each run exits with its command's status"
    );
    for i in 0..4 {
        let started: u128 = std::fs::read_to_string(dir.path().join(format!("start-{i}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            started >= last_launch,
            "p{i}'s command started before the last participant was launched"
        );
    }
    let observer = session(&connect).await;
    // Everyone left, and the last one out reset the barrier (no
    // controller owns it) for a next round (issue 12, item 8).
    assert!(
        children(&observer, &format!("{BARRIERS}/gang"))
            .await
            .is_empty(),
        "everyone left"
    );
}

#[tokio::test]
async fn a_restarted_init_container_is_counted_once() {
    let connect = isolated_connect();
    let observer = session(&connect).await;
    let barrier = format!("{BARRIERS}/gang");
    let enter = |id: &str| {
        zkgate(
            &connect,
            &[
                "barrier",
                "enter",
                "gang",
                "--participants",
                "2",
                "--id",
                id,
                "--pod-uid",
                &format!("uid-{id}"),
                "--timeout",
                "30s",
            ],
        )
    };
    // The first attempt registers, then the container is killed.
    let mut first = enter("p0").spawn().unwrap();
    eventually(Duration::from_secs(10), "p0 registered", || async {
        children(&observer, &barrier)
            .await
            .contains(&"p0".into())
            .then_some(())
    })
    .await;
    first.kill().await.unwrap();
    // Restarted twice more: still one registration.
    let mut second = enter("p0").spawn().unwrap();
    let mut third = enter("p0").spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(children(&observer, &barrier).await, ["p0"]);
    assert!(
        second.try_wait().unwrap().is_none() && third.try_wait().unwrap().is_none(),
        "one of two must not open the barrier"
    );
    let mut other = enter("p1").spawn().unwrap();
    for c in [&mut second, &mut third, &mut other] {
        assert!(exited(c, Duration::from_secs(30)).await.success());
    }
    assert_eq!(
        children(&observer, &barrier).await,
        ["p0", "p1", "ready"],
        "registrations stay after the init containers exit"
    );
}

#[tokio::test]
async fn sidecars_report_ready_only_once_open_and_leave_on_sigterm() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let port = support::zookeeper::free_port();
    let ready0 = dir.path().join("ready0");
    let ready1 = dir.path().join("ready1");
    let probe = |ready: &Path| {
        zkgate(
            &connect,
            &["probe", "--ready-file", ready.to_str().unwrap()],
        )
    };
    let sidecar = |id: &str, ready: &Path, extra: &[&str]| {
        let mut args = vec![
            "barrier",
            "sidecar",
            "gang",
            "--participants",
            "2",
            "--id",
            id,
            "--ready-file",
            ready.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        zkgate(&connect, &args).spawn().unwrap()
    };
    let probe_addr = format!("127.0.0.1:{port}");
    let mut s0 = sidecar("p0", &ready0, &["--probe-addr", &probe_addr]);
    let observer = session(&connect).await;
    eventually(Duration::from_secs(10), "p0 registered", || async {
        children(&observer, &format!("{BARRIERS}/gang"))
            .await
            .contains(&"p0".into())
            .then_some(())
    })
    .await;
    let http = |path: &'static str| async move {
        support::http_get(port, path)
            .await
            .map(|(status, _)| status)
    };
    let status = eventually(Duration::from_secs(5), "the probe endpoint", || {
        http("/readyz")
    })
    .await;
    assert_eq!(status, 503, "not ready before the barrier opens");
    assert!(!ready0.exists());
    assert_eq!(
        output(probe(&ready0)).await.0,
        1,
        "zkgate probe fails before the barrier opens"
    );

    let mut s1 = sidecar("p1", &ready1, &[]);
    eventually(Duration::from_secs(10), "both ready files", || async {
        (ready0.exists() && ready1.exists()).then_some(())
    })
    .await;
    assert_eq!(output(probe(&ready0)).await.0, 0);
    assert_eq!(http("/readyz").await, Some(200));

    signal(&s0, libc::SIGTERM);
    signal(&s1, libc::SIGTERM);
    assert!(exited(&mut s0, Duration::from_secs(20)).await.success());
    assert!(exited(&mut s1, Duration::from_secs(20)).await.success());
    assert!(
        !ready0.exists() && !ready1.exists(),
        "ready files removed on the way out"
    );
    // Everyone left, and the last one out reset the barrier (no
    // controller owns it) for a next round (issue 12, item 8).
    assert!(
        children(&observer, &format!("{BARRIERS}/gang"))
            .await
            .is_empty(),
        "both left"
    );
}

#[tokio::test]
async fn lock_runs_never_overlap_and_see_increasing_tokens() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start $ZKGATE_FENCING_TOKEN >> {0}; sleep 0.05; echo end $ZKGATE_FENCING_TOKEN >> {0}",
        log.display()
    );
    let mut runs: Vec<Child> = (0..6)
        .map(|i| {
            zkgate(
                &connect,
                &[
                    "lock",
                    "run",
                    "db",
                    "--create",
                    "--id",
                    &format!("w{i}"),
                    "--timeout",
                    "60s",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ],
            )
            .spawn()
            .unwrap()
        })
        .collect();
    for r in runs.iter_mut() {
        assert!(exited(r, Duration::from_secs(60)).await.success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<(&str, i64)> = text
        .lines()
        .map(|l| {
            let (what, token) = l.split_once(' ').unwrap();
            (what, token.parse().unwrap())
        })
        .collect();
    assert_eq!(lines.len(), 12);
    for pair in lines.chunks(2) {
        assert_eq!(pair[0].0, "start");
        assert_eq!(
            pair[1],
            ("end", pair[0].1),
            "a command started inside another's hold: {text}"
        );
    }
    let tokens: Vec<i64> = lines.iter().step_by(2).map(|l| l.1).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens increase: {tokens:?}"
    );
    let observer = session(&connect).await;
    assert!(children(&observer, &format!("{LOCKS}/db")).await.is_empty());
}

/// Issue 44: a lock made Exclusive (`lock run --create`, no `--read`) is
/// one holder at a time for every later contender: a `--read` (or
/// `--write`) contender is refused (exit 2, saying why) instead of holding
/// beside another reader. Failed before the fix: two `--read` holders ran
/// at once on the Exclusive lock.
#[tokio::test]
async fn a_read_hold_on_an_exclusive_lock_is_refused() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("inside");
    // The lock made Exclusive by its first user, who holds it a while.
    let mut maker = zkgate(
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--id",
            "maker",
            "--",
            "sh",
            "-c",
            &format!("touch {}; sleep 1", inside.display()),
        ],
    )
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(10), "the maker holds", || async {
        inside.exists().then_some(())
    })
    .await;
    for side in ["--read", "--write"] {
        let (code, err) = output(zkgate(
            &connect,
            &[
                "lock",
                "run",
                "db",
                side,
                "--id",
                "reader",
                "--timeout",
                "20s",
                "--",
                "true",
            ],
        ))
        .await;
        assert_eq!(code, 2, "{side}: {err}");
        assert!(err.contains("Exclusive"), "{side}: {err}");
    }
    assert!(exited(&mut maker, Duration::from_secs(30)).await.success());
    let observer = session(&connect).await;
    assert!(children(&observer, &format!("{LOCKS}/db")).await.is_empty());
    // A lock made for readers takes readers.
    let (code, err) = output(zkgate(
        &connect,
        &[
            "lock", "run", "rw", "--create", "--read", "--id", "r1", "--", "true",
        ],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
}

#[tokio::test]
async fn a_stopped_holder_loses_the_lock_its_command_is_terminated_and_it_exits_6() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("child.pid");
    let script = format!("echo $$ > {}; exec sleep 120", pid_file.display());
    let mut holder = zkgate(
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--id",
            "h",
            "--session-timeout",
            "3s",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(10), "the holder's command", || async {
        pid_file.exists().then_some(())
    })
    .await;
    let child_pid: i32 = eventually(Duration::from_secs(5), "the child's pid", || async {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
    .await;

    signal(&holder, libc::SIGSTOP);
    // Meanwhile another process gets the lock once the holder's session expires.
    let (code, _) = output(zkgate(
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "next",
            "--timeout",
            "30s",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(
        code, 0,
        "another process acquired the lock while the holder was stopped"
    );
    signal(&holder, libc::SIGCONT);

    let status = exited(&mut holder, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(6), "lock lost is exit 6");
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    holder
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    assert!(
        stderr.contains("lost the lock") && stderr.contains("terminated"),
        "says what happened: {stderr}"
    );
    assert!(
        support::process_ended(child_pid),
        "the command was terminated"
    );
}

#[tokio::test]
async fn every_exit_code_is_reached_by_a_real_scenario() {
    let connect = isolated_connect();
    // 2: bad flags and bad environment.
    let (code, err) = output(zkgate(
        &connect,
        &["barrier", "enter", "b", "--timeout", "5x"],
    ))
    .await;
    assert_eq!(code, 2);
    assert!(err.contains("Usage:"), "{err}");
    let (code, _) = output(zkgate(
        &connect,
        &["lock", "run", "db", "--read", "--write", "--", "true"],
    ))
    .await;
    assert_eq!(code, 2);
    let (code, err) = output(zkgate("a:1,,b", &["barrier", "enter", "b"])).await;
    assert_eq!(code, 2, "{err}");
    let (code, err) = output(zkgate(
        &connect,
        &["lock", "run", "db", "--create", "--", "/no/such/program"],
    ))
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/no/such/program"));

    // 3: a deadline, and nothing left behind.
    let (code, err) = output(zkgate(
        &connect,
        &[
            "barrier",
            "enter",
            "b",
            "--participants",
            "2",
            "--id",
            "p0",
            "--timeout",
            "500ms",
        ],
    ))
    .await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("timed out"), "{err}");
    let observer = session(&connect).await;
    assert!(children(&observer, &format!("{BARRIERS}/b"))
        .await
        .is_empty());
    let (code, err) = output(zkgate(
        &connect,
        &[
            "lock",
            "acquire",
            "never-made",
            "--timeout",
            "300ms",
            "--token-file",
            "/tmp/unused",
        ],
    ))
    .await;
    assert_eq!(code, 3);
    assert!(
        err.contains("never created"),
        "says the resource was never reconciled: {err}"
    );

    // 4: the barrier node is deleted while a participant waits.
    DoubleBarrier::new(format!("{BARRIERS}/doomed"))
        .create(
            &observer,
            &BarrierData {
                participants: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut waiter = zkgate(
        &connect,
        &[
            "barrier",
            "enter",
            "doomed",
            "--id",
            "p0",
            "--timeout",
            "30s",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(10), "p0 registered", || async {
        children(&observer, &format!("{BARRIERS}/doomed"))
            .await
            .contains(&"p0".into())
            .then_some(())
    })
    .await;
    observer
        .client()
        .delete(&format!("{BARRIERS}/doomed/p0"), None)
        .await
        .unwrap();
    observer
        .client()
        .delete(&format!("{BARRIERS}/doomed"), None)
        .await
        .unwrap();
    assert_eq!(
        exited(&mut waiter, Duration::from_secs(10)).await.code(),
        Some(4)
    );

    // 5: nothing listening.
    let port = support::zookeeper::free_port();
    let (code, err) = output(zkgate(
        &format!("127.0.0.1:{port}"),
        &["barrier", "enter", "b", "--connect-timeout", "1s"],
    ))
    .await;
    assert_eq!(code, 5);
    assert!(
        err.contains(&format!("127.0.0.1:{port}")),
        "names the servers: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[tokio::test]
async fn an_exiting_command_closes_its_session_at_once() {
    // A private server, so the session list is ours alone.
    let server = tokio::task::spawn_blocking(support::ZkServer::standalone)
        .await
        .unwrap();
    let connect = server.address();
    let (code, err) = output(zkgate(
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--session-timeout",
            "30s",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, err) = output(zkgate(
        &connect,
        &[
            "barrier",
            "run",
            "b",
            "--participants",
            "1",
            "--session-timeout",
            "30s",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    // With a 30 s timeout, a session left open would still be listed.
    let dump = support::zookeeper::four_letter(server.port, "dump").unwrap();
    // "Session Sets (buckets)/(sessions):"
    let sessions: usize = dump
        .lines()
        .find_map(|l| l.strip_prefix("Session Sets ("))
        .and_then(|rest| rest.split_once(")/(")?.1.split_once(')')?.0.parse().ok())
        .expect("dump lists the session sets");
    assert_eq!(sessions, 0, "no session outlives its process:\n{dump}");
}

#[tokio::test]
async fn run_passes_signals_on_to_its_command() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("got-term");
    let started = dir.path().join("started");
    let script = format!(
        "trap 'echo TERM > {}; exit 42' TERM; touch {}; while true; do sleep 0.05; done",
        marker.display(),
        started.display()
    );
    let mut run = zkgate(
        &connect,
        &[
            "barrier",
            "run",
            "solo",
            "--participants",
            "1",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(10), "the command started", || async {
        started.exists().then_some(())
    })
    .await;
    signal(&run, libc::SIGTERM);
    let status = exited(&mut run, Duration::from_secs(10)).await;
    assert_eq!(
        status.code(),
        Some(42),
        "exits with the command's status after it handled the signal"
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "TERM");
}

/// Issue 44, item 2: a `lock sidecar` whose readiness cannot be written (a
/// ready file under a regular file: ENOTDIR, root or not) fails after it
/// published the token. Nothing may be left that `lock watch` would start a
/// command on: the token and its trust are withdrawn before the hold goes.
/// Failed before the fix: both files were left behind.
#[tokio::test]
async fn a_lock_sidecar_that_cannot_report_ready_withdraws_its_token() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let (code, err) = output(zkgate(
        &connect,
        &[
            "lock",
            "sidecar",
            "db",
            "--create",
            "--id",
            "s",
            "--token-file",
            token.to_str().unwrap(),
            "--ready-file",
            not_a_dir.join("ready").to_str().unwrap(),
        ],
    ))
    .await;
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("ready"), "says what it could not write: {err}");
    for left in [token.clone(), dir.path().join("token.trusted-until")] {
        assert!(!left.exists(), "{} was left behind: {err}", left.display());
    }
    let observer = session(&connect).await;
    assert!(children(&observer, &format!("{LOCKS}/db")).await.is_empty());
}

#[tokio::test]
async fn lock_sidecar_holds_until_sigterm_and_exits_6_when_revoked() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let (token, ready) = (dir.path().join("token"), dir.path().join("ready"));
    let sidecar = || {
        zkgate(
            &connect,
            &[
                "lock",
                "sidecar",
                "db",
                "--create",
                "--id",
                "s",
                "--token-file",
                token.to_str().unwrap(),
                "--ready-file",
                ready.to_str().unwrap(),
            ],
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let mut holder = sidecar();
    eventually(Duration::from_secs(10), "token and ready files", || async {
        (token.exists() && ready.exists()).then_some(())
    })
    .await;
    let first: i64 = std::fs::read_to_string(&token)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (code, _) = output(zkgate(
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "other",
            "--timeout",
            "300ms",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code, 3, "the sidecar holds the lock");
    signal(&holder, libc::SIGTERM);
    assert!(exited(&mut holder, Duration::from_secs(10)).await.success());
    assert!(
        !token.exists() && !ready.exists(),
        "token and ready files removed"
    );

    // Revoked: the controller deletes the holder's node.
    let mut holder = sidecar();
    eventually(Duration::from_secs(10), "token file", || async {
        token.exists().then_some(())
    })
    .await;
    let second: i64 = std::fs::read_to_string(&token)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(second > first);
    let observer = session(&connect).await;
    let nodes = children(&observer, &format!("{LOCKS}/db")).await;
    observer
        .client()
        .delete(&format!("{LOCKS}/db/{}", nodes[0]), None)
        .await
        .unwrap();
    assert_eq!(
        exited(&mut holder, Duration::from_secs(10)).await.code(),
        Some(6)
    );
    assert!(!ready.exists(), "no longer ready once the hold is lost");
}

#[tokio::test]
async fn lock_acquire_keeps_the_hold_past_the_process_and_a_restart_adopts_it() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let acquire = || {
        zkgate(
            &connect,
            &[
                "lock",
                "acquire",
                "db",
                "--create",
                "--id",
                "pod-0",
                "--pod-uid",
                "u0",
                "--timeout",
                "5s",
                "--token-file",
                token.to_str().unwrap(),
            ],
        )
    };
    assert_eq!(output(acquire()).await.0, 0);
    let first = std::fs::read_to_string(&token).unwrap();
    let observer = session(&connect).await;
    assert_eq!(
        children(&observer, &format!("{LOCKS}/db")).await.len(),
        1,
        "the hold outlives the init container"
    );
    let (code, _) = output(zkgate(
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "other",
            "--timeout",
            "300ms",
            "--",
            "true",
        ],
    ))
    .await;
    assert_eq!(code, 3, "still held");
    // The init container runs again (a pod restart): it adopts its hold.
    assert_eq!(output(acquire()).await.0, 0);
    assert_eq!(
        std::fs::read_to_string(&token).unwrap(),
        first,
        "the same hold, the same token"
    );
    assert_eq!(children(&observer, &format!("{LOCKS}/db")).await.len(), 1);
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let connect = isolated_connect();
    let mut cmd = zkgate(
        &connect,
        &[
            "--log-format",
            "json",
            "barrier",
            "run",
            "solo",
            "--participants",
            "1",
            "--",
            "true",
        ],
    );
    cmd.env("ZKGATE_LOG", "zkgate=info");
    let (code, err) = output(cmd).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines.len() >= 3, "{err}");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("fields").is_some(),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_killed_wrapper_takes_its_command_with_it() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("child.pid");
    let script = format!("echo $$ > {}; exec sleep 120", pid_file.display());
    let mut holder = zkgate(
        &connect,
        &["lock", "run", "db", "--create", "--", "sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let child_pid: i32 = eventually(Duration::from_secs(10), "the command's pid", || async {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
    .await;
    signal(&holder, libc::SIGKILL);
    let _ = holder.wait().await;
    eventually(
        Duration::from_secs(5),
        "the command to die with its wrapper",
        || async { (unsafe { libc::kill(child_pid, 0) } != 0).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn invalid_values_from_the_environment_are_refused_up_front() {
    let connect = isolated_connect();
    for (var, value) in [
        ("ZKGATE_ID", "a/b"),
        ("ZKGATE_NAMESPACE", ".."),
        ("ZKGATE_TIMEOUT", "soon"),
        ("ZKGATE_ROOT", "relative"),
        ("ZKGATE_ZOOKEEPER", "zk:2::1]:282"),
        ("ZKGATE_ZOOKEEPER", "zk:99999"),
    ] {
        let mut cmd = zkgate(&connect, &["barrier", "enter", "b", "--participants", "1"]);
        cmd.env(var, value);
        let (code, err) = output(cmd).await;
        assert_eq!(code, 2, "{var}={value}: {err}");
        assert!(err.contains("Usage:"), "{var}={value}: {err}");
    }
    // A credential file that is missing or holds no user:password.
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("auth");
    std::fs::write(&garbage, "no-colon-here\n").unwrap();
    for file in [dir.path().join("missing"), garbage] {
        let mut cmd = zkgate(&connect, &["lock", "acquire", "l"]);
        cmd.env("ZKGATE_AUTH_FILE", &file);
        let (code, err) = output(cmd).await;
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&file.display().to_string()),
            "names the file: {err}"
        );
    }
    // Ids that cannot be a node name: empty, with '/', longer than 253 bytes.
    let long = "p".repeat(254);
    for id in ["", "a/b", "..", &long] {
        for command in [
            &["barrier", "enter", "b"][..],
            &["lock", "acquire", "l"][..],
        ] {
            let mut args = command.to_vec();
            args.extend(["--id", id]);
            let (code, err) = output(zkgate(&connect, &args)).await;
            assert_eq!(code, 2, "{args:?}: {err}");
            assert!(err.contains("Usage:"), "{args:?}: {err}");
        }
    }
    let observer = session(&connect).await;
    assert!(
        children(&observer, "/").await.is_empty(),
        "nothing was created"
    );
}

/// Review of issue 43, item 2: the controller waits at most 60 s of kill
/// grace after a lease's end before it revokes; a holder that asked for
/// more was accepted (with a long enough session timeout) and its command
/// could outlive the revocation. Failed before: both commands started.
#[tokio::test]
async fn a_kill_grace_longer_than_the_controller_waits_is_refused() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let token = token.to_str().unwrap();
    for args in [
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--session-timeout",
            "300s",
            "--kill-grace",
            "61s",
            "--",
            "true",
        ][..],
        &[
            "lock",
            "sidecar",
            "db",
            "--create",
            "--session-timeout",
            "300s",
            "--kill-grace",
            "61s",
            "--token-file",
            token,
        ][..],
    ] {
        let (code, err) = output(zkgate(&connect, args)).await;
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("longer than 1m"),
            "{args:?} says the bound: {err}"
        );
    }
    let observer = session(&connect).await;
    assert!(
        children(&observer, "/").await.is_empty(),
        "nothing was created"
    );
}

/// Issue 12, item 16: the examples reference the credential Secret without
/// `optional`, so with open ACLs it is made with an empty value: an empty
/// `ZKGATE_AUTH` means no credential (not a usage error), while a malformed
/// one is still refused.
#[tokio::test]
async fn an_empty_credential_means_none_and_a_malformed_one_is_refused() {
    let connect = isolated_connect();
    let mut cmd = zkgate(
        &connect,
        &[
            "barrier",
            "run",
            "solo",
            "--participants",
            "1",
            "--",
            "true",
        ],
    );
    cmd.env("ZKGATE_AUTH", "");
    let (code, err) = output(cmd).await;
    assert_eq!(code, 0, "{err}");
    let mut cmd = zkgate(
        &connect,
        &["barrier", "enter", "solo", "--participants", "1"],
    );
    cmd.env("ZKGATE_AUTH", "no-colon-here");
    let (code, err) = output(cmd).await;
    assert_eq!(code, 2, "{err}");
}

/// Asking the controller for credentials (`--credentials-url`): with nobody
/// answering, the command gives up at its `--timeout` with exit 5 and says
/// where it asked; a bad CA is bad input (exit 2); SIGTERM while it asks
/// ends it at once with 143 (PID 1 gets no default handler: the command
/// must install its own before it waits). Nothing is registered.
#[tokio::test]
async fn asking_for_credentials_nobody_hands_out_exits_5_and_sigterm_ends_the_wait() {
    use tokio::io::AsyncBufReadExt;
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "not-a-real-token").unwrap();
    let ca = rcgen::generate_simple_self_signed(vec!["controller".into()])
        .unwrap()
        .cert
        .pem();
    // A port nobody listens on.
    let url = format!("https://127.0.0.1:{}", support::zookeeper::free_port());
    let asking = |args: &[&str], ca: &str| {
        let mut cmd = zkgate(&connect, args);
        cmd.env("ZKGATE_CREDENTIALS_URL", &url)
            .env("ZKGATE_CREDENTIALS_CA", ca)
            .env("ZKGATE_CREDENTIALS_TOKEN_FILE", &token)
            .env("ZKGATE_PARTICIPANTS", "1");
        cmd
    };
    let (code, err) = output(asking(&["barrier", "enter", "b", "--timeout", "2s"], &ca)).await;
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("no controller handed out") && err.contains(&url),
        "{err}"
    );
    let (code, err) = output(asking(
        &["barrier", "enter", "b", "--timeout", "2s"],
        "junk",
    ))
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("credentials CA"), "{err}");

    let mut waiting = asking(&["barrier", "enter", "b"], &ca);
    waiting
        .env("ZKGATE_LOG", "zkgate=debug")
        .stderr(Stdio::piped());
    let mut child = waiting.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // Asking (and failing) at least once: its signal handlers are in.
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("no credential handout") {
                return;
            }
        }
        panic!("the command ended without asking");
    })
    .await
    .expect("the command asks for its credentials");
    signal(&child, libc::SIGTERM);
    let status = exited(&mut child, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(143));
    let observer = session(&connect).await;
    assert!(
        children(&observer, BARRIERS).await.is_empty(),
        "nothing registered"
    );
}

/// A handout of our own on loopback: its CA (PEM), and a listener whose
/// connections get `body` as the answer to any request.
async fn handout_that_answers() -> (String, tokio::net::TcpListener, tokio_rustls::TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(leaf.der().to_vec())],
        PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    (
        ca.pem(),
        listener,
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
    )
}

/// Issue 25 (left from its item 4): the participant installs its signal
/// handlers once, before it asks for its credentials, and the same ones
/// serve the command. A SIGTERM that came just after the answer (between
/// the asking's handlers and the command's, in the old code) was lost: a
/// process that is PID 1 has no default action, so the command went on,
/// registered and waited. The handout here answers and, once the command
/// has closed the connection, sends SIGTERM: the command must stop with
/// 143, nothing registered. The old gap was microseconds wide: this test
/// did not catch it on the old code (it guards the single set of handlers
/// from here on; it is not a proof that the gap existed).
#[tokio::test]
async fn sigterm_just_after_the_credentials_came_ends_the_command() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "a-token").unwrap();
    let (ca, listener, acceptor) = handout_that_answers().await;
    let url = format!("https://{}", listener.local_addr().unwrap());
    let answer = serde_json::json!({ "namespace": "default", "auth": "namespace-default:secret" })
        .to_string();
    for round in 0..6 {
        let mut cmd = zkgate(
            &connect,
            &[
                "barrier",
                "enter",
                "b",
                "--participants",
                "2",
                "--timeout",
                "8s",
            ],
        );
        cmd.env("ZKGATE_CREDENTIALS_URL", &url)
            .env("ZKGATE_CREDENTIALS_CA", &ca)
            .env("ZKGATE_CREDENTIALS_TOKEN_FILE", &token)
            .env("ZKGATE_NAMESPACE", "default")
            .env("ZKGATE_ID", format!("p{round}"))
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        // The request: headers, then its body.
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tls.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended early");
            request.extend_from_slice(&buf[..n]);
        }
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        );
        tls.write_all(response.as_bytes()).await.unwrap();
        tls.flush().await.unwrap();
        // Once the command has closed the connection it is done asking:
        // the signal lands after the asking, where the gap was.
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await;
        signal(&child, libc::SIGTERM);
        let status = exited(&mut child, Duration::from_secs(20)).await;
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err).await;
        assert_eq!(status.code(), Some(143), "round {round}: {err}");
    }
    let observer = session(&connect).await;
    assert!(
        children(&observer, &format!("{BARRIERS}/b"))
            .await
            .is_empty(),
        "nothing registered"
    );
}

/// `zkgate barrier enter gang --run later` (id `new-0`), once it logs
/// `says` (that it waits for its run's barrier); it must not pass before.
async fn waiting_for_its_run(connect: &str, says: &str) -> Child {
    use tokio::io::AsyncBufReadExt;
    let mut waiting = zkgate(
        connect,
        &[
            "barrier", "enter", "gang", "--id", "new-0", "--run", "later",
        ],
    );
    waiting.env("ZKGATE_LOG", "info").stderr(Stdio::piped());
    let mut child = waiting.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            assert!(!line.contains("barrier open"), "passed: {line}");
            if line.contains(says) {
                return;
            }
        }
        panic!("the command ended without waiting");
    })
    .await
    .expect("the participant says it waits for its run's barrier");
    child
}

/// A participant of one run (a Job's) waits out another run's barrier of
/// the same name without registering in it (its count would open the
/// other gang), and enters its own run's once that replaces it.
#[tokio::test]
async fn a_participant_never_enters_another_runs_barrier_and_enters_its_own() {
    let connect = isolated_connect();
    let observer = session(&connect).await;
    let path = format!("{BARRIERS}/gang");
    let made = |run: &str, participants| BarrierData {
        participants,
        run: Some(run.to_owned()),
        ..BarrierData::default()
    };
    DoubleBarrier::new(&path)
        .create(&observer, &made("earlier", 2))
        .await
        .unwrap();
    let mut child = waiting_for_its_run(&connect, "another run's").await;
    // The earlier run's last participant arrives: it must not find the
    // later run's participant counted (x = 2).
    let earlier = {
        let connect = connect.clone();
        tokio::spawn(async move {
            let session = session(&connect).await;
            let options = zkgate::zk::EnterOptions {
                run: Some("earlier".into()),
                ..Default::default()
            };
            DoubleBarrier::new(format!("{BARRIERS}/gang"))
                .enter(&session, "old-0", &options, None)
                .await
        })
    };
    eventually(
        Duration::from_secs(20),
        "the earlier run's participant in",
        || async { (children(&observer, &path).await == ["old-0"]).then_some(()) },
    )
    .await;
    // The earlier run is over: its barrier goes (its waiter is told), and
    // the later run's is made.
    zkgate::zk::tree::delete_tree(&observer, &path)
        .await
        .unwrap();
    let told = earlier.await.unwrap();
    assert!(
        matches!(told, Err(zkgate::zk::ZkError::Deleted { .. })),
        "{told:?}"
    );
    DoubleBarrier::new(&path)
        .create(&observer, &made("later", 1))
        .await
        .unwrap();
    let status = exited(&mut child, Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "entered its own run's barrier");
    assert_eq!(children(&observer, &path).await, ["new-0", "ready"]);
}

/// A barrier node that does not say its run (made before runs were
/// recorded) may be an earlier run's, opened: a participant of a run waits
/// until its owner writes the run, rather than pass its `ready`.
#[tokio::test]
async fn a_participant_of_a_run_waits_while_the_barrier_does_not_say_its_run() {
    let connect = isolated_connect();
    let observer = session(&connect).await;
    let path = format!("{BARRIERS}/gang");
    let barrier = DoubleBarrier::new(&path);
    let unstamped = BarrierData {
        participants: 1,
        uid: Some("earlier".into()),
        ..BarrierData::default()
    };
    barrier.create(&observer, &unstamped).await.unwrap();
    // Opened by the earlier run.
    observer
        .client()
        .create(
            &format!("{path}/ready"),
            b"",
            &zookeeper_client::CreateMode::Persistent.with_acls(observer.node_acls()),
        )
        .await
        .unwrap();
    let mut child = waiting_for_its_run(&connect, "not recorded yet").await;
    assert_eq!(
        children(&observer, &path).await,
        ["ready"],
        "nothing registered"
    );
    // Its owner says it is of this run (a node of the same Barrier).
    assert!(barrier.set_run(&observer, "later").await.unwrap());
    let status = exited(&mut child, Duration::from_secs(20)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "entered once the barrier said its run"
    );
}

/// Issue 44, item 6: a process of the command that zkgate may not signal
/// (here another user's, started through a set-user-ID program, with
/// zkgate not root) could not be stopped when the hold is lost, and on a
/// normal exit zkgate spun for ever waiting for it with the hold
/// unwatched. It is refused: the command is stopped, that process is
/// waited for (the hold is kept until it ends), and zkgate exits 2 naming
/// it. Failed before the fix: the command ran on to its end and zkgate
/// exited 0.
#[tokio::test]
async fn a_command_that_starts_a_process_zkgate_may_not_signal_is_refused() {
    let connect = isolated_connect();
    let (dir, bin, become_other) = another_users_kit();
    let at = dir.path();
    let (done, ran_on) = (at.join("done"), at.join("ran-on"));
    let script = format!(
        "{} --reuid 65534 --regid 65534 --clear-groups sh -c 'sleep 2; touch {}' & sleep 30; touch {}",
        become_other.display(),
        done.display(),
        ran_on.display()
    );
    let holder = support::zkgate_binary_as_user(
        &bin,
        &connect,
        &["lock", "run", "db", "--create", "--", "sh", "-c", &script],
        at,
    );
    let (code, err) = tokio::time::timeout(Duration::from_secs(25), output(holder))
        .await
        .expect("zkgate refused the command before it ended");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("may not signal") && err.contains("uid 65534"),
        "{err}"
    );
    assert!(
        done.exists(),
        "the other user's process was waited for before zkgate went on: {err}"
    );
    assert!(!ran_on.exists(), "the command was stopped");
    // And the lock was given up once it ended.
    let s = session(&connect).await;
    assert!(s
        .client()
        .check_stat(&format!("{LOCKS}/db"))
        .await
        .unwrap()
        .is_some());
    eventually(Duration::from_secs(10), "the lock free", || async {
        children(&s, &format!("{LOCKS}/db"))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
}

/// Review of issue 44, item 6: while zkgate waits for a process it may
/// not signal to end, the hold is still watched. Revoked meanwhile (its
/// node deleted), zkgate says at once that the process runs on beside
/// whoever comes next, still waits for it, and exits 6, the exit of a
/// lost hold. Failed before the fix: nothing was said until the process
/// ended, and zkgate exited 2 as if the hold had been kept.
#[tokio::test]
async fn a_hold_lost_while_waiting_for_a_process_zkgate_may_not_signal_is_said_and_exits_6() {
    use tokio::io::AsyncBufReadExt;
    let connect = isolated_connect();
    let (dir, bin, become_other) = another_users_kit();
    let at = dir.path();
    let done = at.join("done");
    let script = format!(
        "{} --reuid 65534 --regid 65534 --clear-groups sh -c 'sleep 6; touch {}' & sleep 30",
        become_other.display(),
        done.display(),
    );
    let mut holder = support::zkgate_binary_as_user(
        &bin,
        &connect,
        &["lock", "run", "db", "--create", "--", "sh", "-c", &script],
        at,
    );
    holder.stderr(Stdio::piped());
    let mut holder = holder.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(holder.stderr.take().unwrap()).lines();
    let mut err = String::new();
    read_until(&mut lines, &mut err, "waiting for them to end").await;
    // Revoked, as the controller revokes: the holder's node deleted.
    let s = session(&connect).await;
    let lock = format!("{LOCKS}/db");
    for node in children(&s, &lock).await {
        s.client()
            .delete(&format!("{lock}/{node}"), None)
            .await
            .unwrap();
    }
    read_until(&mut lines, &mut err, "run on beside whoever comes next").await;
    assert!(
        !done.exists(),
        "said while the process still ran, not after it ended"
    );
    let status = exited(&mut holder, Duration::from_secs(20)).await;
    while let Some(line) = lines.next_line().await.unwrap() {
        err.push_str(&line);
        err.push('\n');
    }
    assert_eq!(status.code(), Some(6), "{err}");
    assert!(done.exists(), "the process was still waited for: {err}");
}

/// Review of issue 44, item 6: with `/proc` mounted `hidepid=2`, another
/// user's processes are not in zkgate's `/proc` at all, so the command's
/// tree looked empty while one ran. A process of the command that /proc
/// hides is waited for (zkgate has a child still) before the hold is
/// given up, and zkgate says so. Failed before the fix: zkgate released
/// the lock and exited at once, the hidden process running on.
#[tokio::test]
async fn a_process_of_the_command_that_proc_hides_is_waited_for() {
    let connect = isolated_connect();
    let (dir, bin, become_other) = another_users_kit();
    let at = dir.path();
    let (started, done) = (at.join("started"), at.join("done"));
    // The command starts another user's process and exits once that runs
    // as the other user (before, it was visible, and stopped as any).
    let script = format!(
        "{} --reuid 65534 --regid 65534 --clear-groups sh -c 'touch {}; sleep 3; touch {}' & \
         while [ ! -e {} ]; do sleep 0.05; done",
        become_other.display(),
        started.display(),
        done.display(),
        started.display(),
    );
    // zkgate as uid 1000, in namespaces of its own whose /proc hides the
    // processes of other users from it (the host's /proc untouched).
    let mut holder = tokio::process::Command::new("unshare");
    holder
        .args([
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "sh",
            "-c",
        ])
        .arg("mount -t proc -o hidepid=2 proc /proc && exec \"$@\"")
        .args([
            "sh",
            "setpriv",
            "--reuid",
            "1000",
            "--regid",
            "1000",
            "--clear-groups",
        ])
        .arg(&bin)
        .args(["lock", "run", "db", "--create", "--", "sh", "-c", &script])
        .env("ZKGATE_ZOOKEEPER", &connect)
        .envs(support::readable_tls_env(&connect, at))
        .env("ZKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let (code, err) = tokio::time::timeout(Duration::from_secs(25), output(holder))
        .await
        .expect("zkgate ended");
    assert_eq!(code, 0, "{err}");
    assert!(
        done.exists(),
        "the hidden process was waited for before the lock was given up: {err}"
    );
    assert!(err.contains("/proc does not show"), "{err}");
}

/// What a test of a process zkgate may not signal needs: a directory
/// anyone may write, with a copy of zkgate an ordinary user may run (the
/// build dir is root's alone) and a set-user-ID root program that makes
/// its command another user's for good (real, effective and saved user
/// IDs alike): `become-other --reuid 65534 --regid 65534 --clear-groups
/// COMMAND...`.
fn another_users_kit() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path();
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = at.join("zkgate");
    std::fs::copy(env!("CARGO_BIN_EXE_zkgate"), &bin).unwrap();
    let become_other = at.join("become-other");
    std::fs::copy("/usr/bin/setpriv", &become_other).unwrap();
    std::fs::set_permissions(&become_other, std::fs::Permissions::from_mode(0o4755)).unwrap();
    (dir, bin, become_other)
}

/// Reads `lines` into `err` until one contains `needle` (20 s at most).
async fn read_until(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    err: &mut String,
    needle: &str,
) {
    let reading = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            err.push_str(&line);
            err.push('\n');
            if line.contains(needle) {
                return true;
            }
        }
        false
    };
    match tokio::time::timeout(Duration::from_secs(20), reading).await {
        Ok(true) => {}
        Ok(false) => panic!("zkgate ended without saying {needle:?}: {err}"),
        Err(_) => panic!("zkgate did not say {needle:?} in time: {err}"),
    }
}

/// The state letter of a process (`/proc/PID/stat`), `None` once gone.
fn proc_state(pid: u32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].trim_start().chars().next()
}

/// Every live process below `pid` (by `/proc`'s parent links).
fn processes_below(pid: u32) -> Vec<u32> {
    let all: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = text[text.rfind(')')? + 1..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![pid];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        found.extend(all.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        at += 1;
    }
    found.remove(0);
    found
        .into_iter()
        .filter(|&p| !matches!(proc_state(p), None | Some('Z') | Some('X')))
        .collect()
}

/// Issue 44, item 5: Ctrl-Z (SIGTSTP) stopped zkgate but not its command,
/// which is in a process group of its own: while zkgate was stopped its
/// session expired and the command ran on beside the next holder. Now the
/// command is stopped with zkgate; continued soon, it continues; continued
/// after its session expired, it is killed where it stands, never run
/// again, and zkgate exits 6. Failed before the fix: the command kept
/// running while zkgate was stopped.
#[tokio::test]
async fn ctrl_z_stops_the_command_with_its_holder_and_a_lost_hold_never_continues_it() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let ticks = dir.path().join("ticks");
    let script = format!(
        "while :; do echo x >> {}; sleep 0.02; done",
        ticks.display()
    );
    let mut holder = zkgate(
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--session-timeout",
            "4s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let holder = holder.stderr(Stdio::piped()).spawn().unwrap();
    let zk_pid = holder.id().unwrap();
    let count = || {
        std::fs::read_to_string(&ticks)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let all_stopped = || async {
        (proc_state(zk_pid) == Some('T')
            && processes_below(zk_pid)
                .iter()
                .all(|&p| proc_state(p) == Some('T')))
        .then_some(())
    };
    eventually(Duration::from_secs(10), "the command runs", || async {
        (count() > 0).then_some(())
    })
    .await;

    // Stopped for a moment, then continued: the command goes on.
    kill(Pid::from_raw(zk_pid as i32), Signal::SIGTSTP).unwrap();
    eventually(
        Duration::from_secs(5),
        "zkgate and its command stopped",
        all_stopped,
    )
    .await;
    let stopped_at = count();
    kill(Pid::from_raw(zk_pid as i32), Signal::SIGCONT).unwrap();
    eventually(Duration::from_secs(5), "the command continued", || async {
        (count() > stopped_at).then_some(())
    })
    .await;

    // Stopped until the server expired the session: never continued.
    kill(Pid::from_raw(zk_pid as i32), Signal::SIGTSTP).unwrap();
    eventually(
        Duration::from_secs(5),
        "zkgate and its command stopped",
        all_stopped,
    )
    .await;
    let stopped_at = count();
    let s = session(&connect).await;
    eventually(
        Duration::from_secs(20),
        "the holder's session expired",
        || async {
            children(&s, &format!("{LOCKS}/db"))
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    kill(Pid::from_raw(zk_pid as i32), Signal::SIGCONT).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), holder.wait_with_output())
        .await
        .expect("zkgate ends")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert_eq!(
        count(),
        stopped_at,
        "the command ran again after its hold was lost: {err}"
    );
}

/// Review of issue 44, item 3: a contender that read "Semaphore" waits for
/// the count the controller makes just after the lock node. If the mode
/// is changed meanwhile (to Exclusive: no count will come), it reads the
/// mode again and takes the lock as it is now, leaving nothing of a
/// semaphore under it. Failed before the fix: it waited for the count
/// until its timeout (exit 3).
#[tokio::test]
async fn a_contender_waiting_for_a_semaphores_count_follows_a_change_of_mode() {
    use zkgate::api::LockMode;
    use zkgate::controller::LockNodeData;
    let connect = isolated_connect();
    let observer = session(&connect).await;
    let lock = format!("{LOCKS}/sem");
    let rules = |mode| {
        serde_json::to_vec(&LockNodeData {
            uid: "the-lock".into(),
            mode,
            lease_ms: None,
            changing_to: None,
        })
        .unwrap()
    };
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    observer.client().mkdir(LOCKS, &open).await.unwrap();
    observer
        .client()
        .create(&lock, &rules(LockMode::Semaphore), &open)
        .await
        .unwrap();
    let mut contender = zkgate(
        &connect,
        &[
            "lock",
            "run",
            "sem",
            "--id",
            "w",
            "--timeout",
            "30s",
            "--",
            "true",
        ],
    )
    .spawn()
    .unwrap();
    let count = format!("{}{lock}/count", support::chroot_of(&connect));
    eventually(Duration::from_secs(10), "waiting for the count", || async {
        (!support::watchers_of(&count).is_empty()).then_some(())
    })
    .await;
    observer
        .client()
        .set_data(&lock, &rules(LockMode::Exclusive), None)
        .await
        .unwrap();
    let status = exited(&mut contender, Duration::from_secs(20)).await;
    assert!(status.success(), "took the Exclusive lock: {status:?}");
    assert!(
        children(&observer, &lock).await.is_empty(),
        "nothing of a semaphore left under an Exclusive lock"
    );
}

/// `zkgate barrier run pair` as member `id` of 2 (no controller, a 60 s
/// timeout) with `rest` after, logging at info to `stderr`.
fn pair_member(connect: &str, id: &str, rest: &[&str], stderr: Stdio) -> Child {
    let mut args = vec![
        "barrier",
        "run",
        "pair",
        "--participants",
        "2",
        "--id",
        id,
        "--timeout",
        "60s",
    ];
    args.extend_from_slice(rest);
    zkgate(connect, &args)
        .env("ZKGATE_LOG", "info")
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Issue 42 (found in review): `barrier run --released-file` keeps the file
/// from just before the command starts (after the opening) until the
/// member has left: a member whose command completed waits for the others
/// to finish, and its pod must stay Ready meanwhile (Kueue's
/// `waitForPodsReady` would otherwise count a running gang as not ready
/// and evict it once its recovery timeout passed). Not there while the
/// member waits for its gang, gone once it is done.
#[tokio::test]
async fn the_released_file_lasts_until_the_member_has_left() {
    use tokio::io::AsyncBufReadExt;
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let released = dir.path().join("released");
    let go = dir.path().join("go");
    let run = |id: &str, rest: &[&str]| pair_member(&connect, id, rest, Stdio::piped());
    let mut p0 = run(
        "p0",
        &["--released-file", released.to_str().unwrap(), "--", "true"],
    );
    let mut lines = tokio::io::BufReader::new(p0.stderr.take().unwrap()).lines();
    let mut err = String::new();
    read_until(&mut lines, &mut err, "participants entered").await;
    assert!(!released.exists(), "released before the gang met: {err}");
    let script = format!("while [ ! -f {} ]; do sleep 0.1; done", go.display());
    let mut p1 = run("p1", &["--", "sh", "-c", &script]);
    read_until(
        &mut lines,
        &mut err,
        "the command exited; leaving the barrier",
    )
    .await;
    // p0's command is done, p1's runs: p0 waits to leave, still released.
    assert!(
        released.exists(),
        "gone while the member waits to leave: {err}"
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(
        exited(&mut p1, Duration::from_secs(30)).await.code(),
        Some(0)
    );
    assert_eq!(
        exited(&mut p0, Duration::from_secs(30)).await.code(),
        Some(0)
    );
    assert!(!released.exists(), "left behind");
}

/// Found in review (helper 18): a member stopped (SIGTERM: its pod is
/// going) whose command then exits 0 is no longer released while it
/// leaves: its pod must not stay Ready while it is being stopped.
#[tokio::test]
async fn a_stopped_member_is_not_released_while_it_leaves() {
    let connect = isolated_connect();
    let dir = tempfile::tempdir().unwrap();
    let released = dir.path().join("released");
    let go = dir.path().join("go");
    let run = |id: &str, rest: &[&str]| pair_member(&connect, id, rest, Stdio::null());
    let mut p0 = run(
        "p0",
        &[
            "--released-file",
            released.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "trap 'exit 0' TERM; sleep 60 & wait $!",
        ],
    );
    let script = format!("while [ ! -f {} ]; do sleep 0.1; done", go.display());
    let mut p1 = run("p1", &["--", "sh", "-c", &script]);
    eventually(Duration::from_secs(30), "p0 released", || async {
        released.exists().then_some(())
    })
    .await;
    signal(&p0, libc::SIGTERM);
    // p0's command exits 0 at once; p0 leaves, waiting for p1.
    eventually(Duration::from_secs(30), "p0 no longer released", || async {
        (!released.exists()).then_some(())
    })
    .await;
    assert!(
        p0.try_wait().unwrap().is_none(),
        "p0 still leaves (it waits for p1): the file went with the stop, not with p0"
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(
        exited(&mut p1, Duration::from_secs(30)).await.code(),
        Some(0)
    );
    exited(&mut p0, Duration::from_secs(30)).await;
    assert!(!released.exists());
}
