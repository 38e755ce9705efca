//! ZooKeeper out of the path of running work (issue 43): once a barrier
//! has opened, an outage of any length delays what needs ZooKeeper (a
//! leave's answer) and stops nothing. Each test runs its own server, which
//! it takes away and brings back on its data.

mod support;

use std::path::Path;
use std::time::Duration;

use support::{eventually, finished, zkgate, ZkServer};
use tokio::time::Instant;

/// How long the server is away: longer than 1.4 session timeouts (the
/// participants' 4 s), after which the client gives its session up.
const OUTAGE: Duration = Duration::from_secs(8);

/// Starts `server` again on its data and returns once it serves.
async fn back_on_its_data(mut server: ZkServer) -> ZkServer {
    tokio::task::spawn_blocking(move || {
        server.restart();
        server.wait_serving(Duration::from_secs(30));
        server
    })
    .await
    .unwrap()
}

/// Starts a zkgate participant, logging at info, its standard error piped.
fn spawned(mut command: tokio::process::Command) -> tokio::process::Child {
    command
        .env("ZKGATE_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn zkgate")
}

/// A server of this test's own with the barrier `g` in rounds of
/// `participants` on it, made as the controller makes it.
async fn server_with_gang(participants: u32) -> (ZkServer, String, zkgate::zk::GangBarrier) {
    let server = tokio::task::spawn_blocking(ZkServer::standalone)
        .await
        .unwrap();
    let connect = server.address();
    let admin = support::session(&connect).await;
    let path = "/zkgate/namespaces/default/barriers/g";
    let gang = support::make_gang(&admin, path, participants, Some(3)).await;
    let _ = admin.close().await;
    (server, connect, gang)
}

/// The round the barrier node of `gang` is at, and why each round ended.
async fn round_of(
    admin: &zkgate::zk::Session,
    gang: &zkgate::zk::GangBarrier,
) -> (Option<u32>, Vec<String>) {
    let (data, _) = admin.client().get_data(gang.path()).await.unwrap();
    let top = zkgate::zk::BarrierData::parse(gang.path(), &data)
        .unwrap()
        .unwrap();
    (top.round, top.ends)
}

fn wrap_participant(connect: &str, dir: &Path, id: &str, work_secs: u32) -> tokio::process::Child {
    let script = format!(
        "touch {dir}/started-{id}; sleep {work_secs}; touch {dir}/done-{id}",
        dir = dir.display()
    );
    spawned(zkgate(
        connect,
        &[
            "barrier",
            "run",
            "outage",
            "--participants",
            "3",
            "--id",
            id,
            "--session-timeout",
            "4s",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ))
}

/// The first failure, as a user met it: three `barrier run`
/// participants pass their barrier; ZooKeeper goes away for longer than
/// the session timeout and comes back on its data. Before, every command
/// was terminated and every participant exited 5. Now the commands run to
/// their end, the one that ended during the outage waits for ZooKeeper to
/// leave, and all three exit 0 once all have left.
#[tokio::test]
async fn a_zookeeper_outage_longer_than_the_session_timeout_stops_no_opened_gang() {
    let mut server = tokio::task::spawn_blocking(ZkServer::standalone)
        .await
        .unwrap();
    let connect = server.address();
    let dir = tempfile::tempdir().unwrap();
    // c's command ends during the outage: its leave needs ZooKeeper.
    let work = [("a", 16), ("b", 16), ("c", 4)];
    let members: Vec<_> = work
        .iter()
        .map(|(id, secs)| (*id, wrap_participant(&connect, dir.path(), id, *secs)))
        .collect();
    eventually(Duration::from_secs(20), "every command started", || async {
        work.iter()
            .all(|(id, _)| dir.path().join(format!("started-{id}")).exists())
            .then_some(())
    })
    .await;
    let down_at = Instant::now();
    server.kill();
    tokio::time::sleep(OUTAGE).await;
    let server = back_on_its_data(server).await;
    let mut logs = Vec::new();
    // c first: its leave reports everyone left, which must come after the
    // others' commands ended.
    let mut members = members;
    members.reverse();
    for (id, child) in members {
        let (code, err) = finished(child, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{id} exited {code}: {err}");
        for (other, _) in work {
            assert!(
                dir.path().join(format!("done-{other}")).exists(),
                "{id} left before {other}'s command ended: {err}"
            );
        }
        assert!(!err.contains("terminated"), "{id}: {err}");
        logs.push((id, err));
    }
    // The outage was seen, and waited out, not missed.
    let (_, c_log) = logs.iter().find(|(id, _)| *id == "c").unwrap();
    assert!(
        c_log.contains("ZooKeeper is needed now and unreachable"),
        "c left without waiting for ZooKeeper: {c_log}"
    );
    // The servers kept every session through the outage (a restarted
    // server gives each a full timeout again), though the clients had
    // given theirs up: each came back on its own, its registration never
    // gone for the others.
    for (id, log) in &logs {
        assert!(
            log.contains("ZooKeeper session resumed"),
            "{id} did not resume its session: {log}"
        );
        assert!(!log.contains("registering again"), "{id}: {log}");
    }
    assert!(down_at.elapsed() > OUTAGE);
    drop(server);
}

fn sidecar(connect: &str, dir: &Path, id: &str) -> tokio::process::Child {
    spawned(zkgate(
        connect,
        &[
            "barrier",
            "sidecar",
            "outage-sidecar",
            "--participants",
            "2",
            "--id",
            id,
            "--session-timeout",
            "4s",
            "--ready-file",
            &dir.join(format!("ready-{id}")).display().to_string(),
        ],
    ))
}

/// The sidecar form: once the barrier opened, the sidecar stays, and stays
/// ready, through an outage longer than its session timeout (before, it
/// exited 5 and its readiness went; the kubelet restarted it), and leaves
/// as usual when its pod stops.
#[tokio::test]
async fn an_opened_barriers_sidecar_stays_ready_through_an_outage_and_leaves_after() {
    let mut server = tokio::task::spawn_blocking(ZkServer::standalone)
        .await
        .unwrap();
    let connect = server.address();
    let dir = tempfile::tempdir().unwrap();
    let mut sidecars: Vec<_> = ["p", "q"]
        .iter()
        .map(|id| (*id, sidecar(&connect, dir.path(), id)))
        .collect();
    eventually(Duration::from_secs(20), "both sidecars ready", || async {
        ["p", "q"]
            .iter()
            .all(|id| dir.path().join(format!("ready-{id}")).exists())
            .then_some(())
    })
    .await;
    server.kill();
    tokio::time::sleep(OUTAGE).await;
    let server = back_on_its_data(server).await;
    // Back on their sessions before they are asked to leave: the keeper's
    // own resume, not the leave's.
    eventually(Duration::from_secs(30), "both sidecars resumed", || async {
        let cons = support::zookeeper::four_letter(server.port, "cons").unwrap_or_default();
        let sessions = cons
            .lines()
            .filter(|l| l.contains("sid=0x") && !l.contains("sid=0xffffffffffffffff"))
            .count();
        (sessions >= 2).then_some(())
    })
    .await;
    for (id, child) in &mut sidecars {
        assert!(
            child.try_wait().unwrap().is_none(),
            "{id}'s sidecar exited during the outage"
        );
        assert!(
            dir.path().join(format!("ready-{id}")).exists(),
            "{id}'s sidecar is no longer ready"
        );
    }
    for (_, child) in &sidecars {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    }
    for (id, child) in sidecars {
        let (code, err) = finished(child, Duration::from_secs(30)).await;
        assert_eq!(code, 0, "{id} exited {code}: {err}");
        assert!(err.contains("everyone has left"), "{id}: {err}");
    }
    drop(server);
}

/// Issue 43, item 3: a pod admitted while ZooKeeper is down (admission
/// needs none) waits for it. Its injected containers say
/// `--connect-timeout 0`: the init form's `barrier enter` started with
/// the server away keeps trying, says that it waits, and passes the
/// barrier with its peer once the server is back (before, its first
/// attempt gave up after 15 s with exit 5, which `restartPolicy: Never`
/// makes the pod's failure). With `--timeout`, it gives up at the
/// timeout, exit 3, nothing registered.
#[tokio::test]
async fn a_participant_started_while_zookeeper_is_down_waits_for_it() {
    let mut server = tokio::task::spawn_blocking(ZkServer::standalone)
        .await
        .unwrap();
    let connect = server.address();
    server.kill();
    let enter = |id: &str, extra: &[&str]| {
        let mut args = vec![
            "barrier",
            "enter",
            "late",
            "--participants",
            "2",
            "--id",
            id,
            "--connect-timeout",
            "0",
        ];
        args.extend_from_slice(extra);
        zkgate(&connect, &args)
            .env("ZKGATE_LOG", "info")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn zkgate")
    };
    let bounded = enter("bounded", &["--timeout", "3s"]);
    let (code, err) = finished(bounded, Duration::from_secs(30)).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no ZooKeeper server"), "{err}");
    let mut waiting: Vec<_> = ["a", "b"].iter().map(|id| (*id, enter(id, &[]))).collect();
    // The outage: longer than an attempt (15 s) and than the default
    // --connect-timeout, by which the code before had given up.
    tokio::time::sleep(Duration::from_secs(20)).await;
    for (id, child) in &mut waiting {
        assert!(
            child.try_wait().expect("look at the process").is_none(),
            "{id} ended before ZooKeeper came back"
        );
    }
    let server = back_on_its_data(server).await;
    for (id, child) in waiting {
        let (code, err) = finished(child, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{id}: {err}");
        assert!(
            err.contains("ZooKeeper unreachable: waiting for it")
                && err.contains("could not reach ZooKeeper at"),
            "{id} never said it waited, and why: {err}"
        );
    }
    drop(server);
}

/// `zkgate barrier run g` as member `id` of a gang in rounds (a 4 s
/// session, a 1 s kill grace): its command appends its start to
/// `DIR/runs-ID`, works `work_secs`, and touches `DIR/done-ID`.
fn gang_member(connect: &str, dir: &Path, id: &str, work_secs: u32) -> tokio::process::Child {
    let script = format!(
        "echo start >> {dir}/runs-{id}; sleep {work_secs}; touch {dir}/done-{id}",
        dir = dir.display()
    );
    let uid = format!("uid-{id}");
    spawned(zkgate(
        connect,
        &[
            "barrier",
            "run",
            "g",
            "--id",
            id,
            "--pod-uid",
            &uid,
            "--session-timeout",
            "4s",
            "--kill-grace",
            "1s",
            "--timeout",
            "90s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ))
}

/// Issue 43, item 1, in rounds: a gang whose round opened runs through an
/// outage longer than the session timeout without a restart. Before, each
/// member's registration was watched like a hold and given up before the
/// session could expire: every command was stopped, each member exited 5,
/// and the gang would have met again in round 1. Now each member's command
/// is marked as running (the next round, were there one, would wait for
/// it), so nothing needs stopping: the commands run once, to their end,
/// and round 0 completes.
#[tokio::test]
async fn a_gang_in_rounds_runs_through_an_outage_longer_than_the_session_timeout() {
    let (server, connect, gang) = server_with_gang(3).await;
    let dir = tempfile::tempdir().unwrap();
    let work = [("a", 16), ("b", 16), ("c", 4)];
    let members: Vec<_> = work
        .iter()
        .map(|(id, secs)| (*id, gang_member(&connect, dir.path(), id, *secs)))
        .collect();
    eventually(Duration::from_secs(20), "every command started", || async {
        work.iter()
            .all(|(id, _)| dir.path().join(format!("runs-{id}")).exists())
            .then_some(())
    })
    .await;
    let mut server = server;
    server.kill();
    tokio::time::sleep(OUTAGE).await;
    let server = back_on_its_data(server).await;
    for (id, child) in members {
        let (code, err) = finished(child, Duration::from_secs(60)).await;
        assert_eq!(code, 0, "{id} exited {code}: {err}");
        let runs = std::fs::read_to_string(dir.path().join(format!("runs-{id}"))).unwrap();
        assert_eq!(runs.lines().count(), 1, "{id}'s command ran again: {err}");
        assert!(!err.contains("terminated"), "{id}: {err}");
    }
    let admin = support::session(&server.address()).await;
    let (round, ends) = round_of(&admin, &gang).await;
    assert_eq!(round, Some(0), "the gang restarted: {ends:?}");
    assert!(ends.is_empty(), "{ends:?}");
    let _ = admin.close().await;
}

/// Issue 43, item 1: a member that dies during an outage is found once
/// ZooKeeper is back, not before. Its session expires a session timeout
/// after the server's return, its registration with it; the members still
/// running then end the round and meet again (a restart). Round 1 waits
/// for the dead member's run mark (its command may have outlived it, for
/// all they know) until the controller removes it, its pod having ended
/// (done here as the controller does it); then a replacement pod meets
/// the others, and round 1 runs to its end.
#[tokio::test]
async fn a_member_that_died_during_an_outage_restarts_the_gang_once_zookeeper_is_back() {
    let (server, connect, gang) = server_with_gang(3).await;
    let dir = tempfile::tempdir().unwrap();
    let mut members: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|id| (id, gang_member(&connect, dir.path(), id, 25)))
        .collect();
    eventually(Duration::from_secs(20), "every command started", || async {
        ["a", "b", "c"]
            .iter()
            .all(|id| dir.path().join(format!("runs-{id}")).exists())
            .then_some(())
    })
    .await;
    let mut server = server;
    server.kill();
    // c dies during the outage, as a pod's process killed on its node
    // (its guardian stops its command).
    let (_, mut c) = members.pop().expect("c");
    c.kill().await.expect("kill c");
    tokio::time::sleep(OUTAGE).await;
    let server = back_on_its_data(server).await;
    let back = Instant::now();
    let admin = support::session(&server.address()).await;
    let ends = eventually(Duration::from_secs(30), "round 0 to end", || async {
        let (round, ends) = round_of(&admin, &gang).await;
        (round == Some(1)).then_some(ends)
    })
    .await;
    // Not at the return: once c's session expired, a session timeout (4 s,
    // counted from the server's start) later; the outage itself lost
    // nobody.
    assert!(
        back.elapsed() >= Duration::from_secs(2),
        "the round ended {:?} after ZooKeeper was back, before c's session could expire: {ends:?}",
        back.elapsed()
    );
    assert_eq!(ends.len(), 1, "{ends:?}");
    // Round 1 waits for c's mark: no command of it starts.
    let c_mark = format!("{}/running/c", gang.path());
    assert!(
        admin.client().check_stat(&c_mark).await.unwrap().is_some(),
        "the dead member's mark is gone before the controller removed it"
    );
    let runs = |id: &str| {
        std::fs::read_to_string(dir.path().join(format!("runs-{id}")))
            .unwrap_or_default()
            .lines()
            .count()
    };
    // A replacement pod (another name and uid) registers for round 1;
    // still no round-1 command runs while c's mark is there.
    let d = gang_member(&connect, dir.path(), "d", 25);
    eventually(
        Duration::from_secs(30),
        "d registered in round 1",
        || async {
            let round_1 = gang.round_path(1);
            let there = admin
                .client()
                .list_children(&round_1)
                .await
                .unwrap_or_default();
            there.iter().any(|c| c == "d").then_some(())
        },
    )
    .await;
    assert_eq!(
        (runs("a"), runs("b"), runs("d")),
        (1, 1, 0),
        "a command of round 1 started beside c's mark"
    );
    admin.client().delete(&c_mark, None).await.unwrap();
    members.push(("d", d));
    for (id, child) in members {
        let (code, err) = finished(child, Duration::from_secs(90)).await;
        assert_eq!(code, 0, "{id} exited {code}: {err}");
    }
    assert_eq!(
        (runs("a"), runs("b"), runs("d")),
        (2, 2, 1),
        "a and b ran once a round, d in round 1"
    );
    let (round, ends) = round_of(&admin, &gang).await;
    assert_eq!(round, Some(1), "{ends:?}");
    let _ = admin.close().await;
}

/// One life of a pod in the sidecar form in rounds, as the kubelet starts
/// it: `zkgate install --pod-dir` (it marks the life), then `zkgate
/// barrier sidecar g --pod-dir` (a 4 s session).
async fn sidecar_in_rounds(connect: &str, id: &str, pod: &Path) -> tokio::process::Child {
    std::fs::create_dir_all(pod).unwrap();
    let bin = pod.join("bin");
    let (code, err) = support::output(zkgate(
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
    let uid = format!("uid-{id}");
    let ready = pod.join("ready");
    spawned(zkgate(
        connect,
        &[
            "barrier",
            "sidecar",
            "g",
            "--id",
            id,
            "--pod-uid",
            &uid,
            "--session-timeout",
            "4s",
            "--timeout",
            "90s",
            "--ready-file",
            ready.to_str().unwrap(),
            "--pod-dir",
            pod.to_str().unwrap(),
        ],
    ))
}

/// Issue 43, item 1, the sidecar form in rounds: once its round opened,
/// the sidecar stays, and stays ready, through an outage longer than its
/// session timeout, so its pod's main containers run on (before, it
/// exited 7 by 4/5 T, and the kubelet restarted every container of the
/// pod: the gang met again in round 1). Its pod's main containers are
/// marked as running; when they complete, the sidecar leaves (exit 0) and
/// the gang completes in round 0.
#[tokio::test]
async fn a_gang_of_sidecars_in_rounds_stays_ready_through_an_outage() {
    let (server, connect, gang) = server_with_gang(2).await;
    let dir = tempfile::tempdir().unwrap();
    let pods = ["p0", "p1"].map(|id| (id, dir.path().join(id)));
    let mut sidecars = Vec::new();
    for (id, pod) in &pods {
        sidecars.push((*id, sidecar_in_rounds(&connect, id, pod).await));
    }
    eventually(Duration::from_secs(20), "both sidecars ready", || async {
        pods.iter()
            .all(|(_, pod)| pod.join("ready").exists())
            .then_some(())
    })
    .await;
    let mut server = server;
    server.kill();
    tokio::time::sleep(OUTAGE).await;
    let server = back_on_its_data(server).await;
    let admin = support::session(&server.address()).await;
    // Back on their sessions (the keeper's resume) before they are asked
    // to leave; their main containers still marked as running.
    let marks = format!("{}/running", gang.path());
    eventually(Duration::from_secs(30), "both sidecars resumed", || async {
        let cons = server.four_letter("cons").unwrap_or_default();
        let sessions = cons
            .lines()
            .filter(|l| l.contains("sid=0x") && !l.contains("sid=0xffffffffffffffff"))
            .count();
        (sessions >= 3).then_some(())
    })
    .await;
    assert_eq!(support::children(&admin, &marks).await, ["p0", "p1"]);
    for (id, child) in &mut sidecars {
        assert!(
            child.try_wait().unwrap().is_none(),
            "{id}'s sidecar exited during the outage"
        );
    }
    for (id, pod) in &pods {
        assert!(
            pod.join("ready").exists(),
            "{id}'s sidecar is no longer ready"
        );
    }
    // The main containers completed: the kubelet runs the sidecar's
    // preStop hook, then sends it SIGTERM.
    for ((_, pod), (_, child)) in pods.iter().zip(&sidecars) {
        let hook = pod.to_str().unwrap();
        let (code, err) = support::output(zkgate(
            &connect,
            &["barrier", "stopping", "--pod-dir", hook, "--sidecar"],
        ))
        .await;
        assert_eq!(code, 0, "stopping: {err}");
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    }
    for (id, child) in sidecars {
        let (code, err) = finished(child, Duration::from_secs(30)).await;
        assert_eq!(code, 0, "{id} exited {code}: {err}");
    }
    let (round, ends) = round_of(&admin, &gang).await;
    assert_eq!(round, Some(0), "the gang restarted: {ends:?}");
    assert_eq!(
        support::children(&admin, &marks).await,
        Vec::<String>::new()
    );
    let _ = admin.close().await;
}
