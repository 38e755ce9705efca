//! Faults against real servers (issue 7's suite grows here).

mod support;

use std::process::Stdio;
use std::time::Duration;

use kube::api::{Api, PostParams};
use serde_json::json;
use support::kube::{
    barrier_waiting, client, client_of, install_crds, namespace, ControllerProcess,
    PrivateApiServer,
};
use support::{eventually, ZkServer};
use zkgate::api::{Barrier, BarrierPhase};
use zkgate::zk::{DoubleBarrier, EnterOptions};

/// How long ZooKeeper stays down (the soak uses 30 s; longer than
/// the session timeouts either way). `ZKGATE_FAULT_DOWNTIME_SECS` overrides.
fn downtime() -> Duration {
    Duration::from_secs(
        std::env::var("ZKGATE_FAULT_DOWNTIME_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    )
}

/// A namespace with a controller of its own (on an isolated ZooKeeper
/// chroot) and a Barrier `gang` of `x` that it has reconciled.
struct Reconciled {
    client: kube::Client,
    ns: String,
    zk: String,
    barriers: Api<Barrier>,
    created: Barrier,
    _controller: ControllerProcess,
}

async fn reconciled_barrier(x: u32, id: &str) -> Reconciled {
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let zk = support::isolated_connect();
    let controller = ControllerProcess::start(&ns, &zk, id);
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let created = barrier_waiting(&barriers, "gang", x, Duration::from_secs(30)).await;
    Reconciled {
        client,
        ns,
        zk,
        barriers,
        created,
        _controller: controller,
    }
}

#[tokio::test]
async fn zookeeper_down_and_back_the_controller_is_unready_then_recovers_and_converges() {
    let mut server = tokio::task::spawn_blocking(ZkServer::standalone)
        .await
        .unwrap();
    let zk = format!("{}/faults", server.address());
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let controller = ControllerProcess::start(&ns, &zk, "controller-f");
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let within = Duration::from_secs(30);
    barrier_waiting(&barriers, "gang", 2, within).await;
    assert_eq!(controller.status_of("/readyz").await, Some(200));

    let down_at = std::time::Instant::now();
    server.kill();
    eventually(within, "the controller reports not ready", || async {
        (controller.status_of("/readyz").await == Some(503)).then_some(())
    })
    .await;
    assert_eq!(
        controller.status_of("/healthz").await,
        Some(200),
        "alive, just not ready"
    );

    // A participant with a deadline fails with a message that names the servers.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_zkgate"))
        .args([
            "barrier",
            "enter",
            "gang",
            "--id",
            "p0",
            "--namespace",
            &ns,
            "--timeout",
            "3s",
            "--connect-timeout",
            "2s",
        ])
        .env("ZKGATE_ZOOKEEPER", &zk)
        .env("ZKGATE_LOG", "off")
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(3) | Some(5)), "{err}");
    assert!(err.contains(&server.address()), "names the servers: {err}");

    let rest = downtime().saturating_sub(down_at.elapsed());
    tokio::time::sleep(rest).await;
    let _server = tokio::task::spawn_blocking(move || {
        server.restart();
        server.wait_serving(Duration::from_secs(60));
        server
    })
    .await
    .unwrap();

    eventually(Duration::from_secs(60), "ready again by itself", || async {
        (controller.status_of("/readyz").await == Some(200)
            && controller.metric("zkgate_leader").await == Some(1.0))
        .then_some(())
    })
    .await;
    // Status converges with what happens in ZooKeeper after the outage.
    let path = format!("/zkgate/namespaces/{ns}/barriers/gang");
    let mut waits = Vec::new();
    for i in 0..2 {
        let (zk, path) = (zk.clone(), path.clone());
        waits.push(tokio::spawn(async move {
            let s = support::session(&zk).await;
            DoubleBarrier::new(&path)
                .enter(&s, &format!("p{i}"), &EnterOptions::default(), None)
                .await
                .expect("enter");
            s
        }));
    }
    let _sessions: Vec<_> = futures::future::join_all(waits)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    eventually(within, "Open after the outage", || async {
        (barriers.get("gang").await.ok()?.status?.phase == Some(BarrierPhase::Open)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_stalled_holder_is_told_its_hold_is_lost_while_another_holds_the_lock() {
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let proxy = support::proxy::Proxy::start(support::shared_zookeeper()).await;
    let through_proxy = format!("{}{chroot}", proxy.address());
    let direct = format!("{}{chroot}", support::shared_zookeeper());
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let script = format!("touch {}; exec sleep 120", started.display());
    let zkgate = |connect: &str, args: &[&str]| {
        let mut c = support::zkgate(connect, args);
        c.stderr(Stdio::piped());
        c
    };
    let holder = zkgate(
        &through_proxy,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--id",
            "stalled",
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
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(10), "the holder's command", || async {
        started.exists().then_some(())
    })
    .await;
    let next = zkgate(
        &direct,
        &[
            "lock",
            "run",
            "db",
            "--id",
            "next",
            "--timeout",
            "30s",
            "--",
            "sleep",
            "3",
        ],
    )
    .spawn()
    .unwrap();
    proxy.stall();
    // Without any traffic getting through, the holder gives the hold up on
    // its own once the server may have expired its session: exit 6.
    let (code, err) = support::finished(holder, Duration::from_secs(20)).await;
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("lost the lock") && err.contains("terminated"),
        "{err}"
    );
    // Meanwhile the other process got the lock and finishes normally.
    let (code, err) = support::finished(next, Duration::from_secs(30)).await;
    assert_eq!(code, 0, "{err}");
    proxy.resume();
}

#[tokio::test]
async fn a_stalled_sidecar_loses_its_registration_and_the_barrier_status_shows_it() {
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let direct = format!("{}{chroot}", support::shared_zookeeper());
    let proxy = support::proxy::Proxy::start(support::shared_zookeeper()).await;
    let _controller = ControllerProcess::start(&ns, &direct, "controller-s");
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "gang" }, "spec": { "participants": 3 } })).unwrap();
    barriers.create(&PostParams::default(), &b).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _sidecar = tokio::process::Command::new(env!("CARGO_BIN_EXE_zkgate"))
        .args([
            "barrier",
            "sidecar",
            "gang",
            "--id",
            "s0",
            "--namespace",
            &ns,
            "--session-timeout",
            "2s",
        ])
        .arg("--ready-file")
        .arg(dir.path().join("ready"))
        .env("ZKGATE_ZOOKEEPER", format!("{}{chroot}", proxy.address()))
        .env("ZKGATE_LOG", "off")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let within = Duration::from_secs(30);
    eventually(within, "s0 entered", || async {
        (barriers.get("gang").await.ok()?.status?.entered == 1).then_some(())
    })
    .await;
    proxy.stall();
    let status = eventually(within, "s0 lost in the status", || async {
        let st = barriers.get("gang").await.ok()?.status?;
        st.participants
            .iter()
            .any(|p| p.id == "s0" && p.lost)
            .then_some(st)
    })
    .await;
    assert_eq!(status.entered, 0, "a lost participant no longer counts");
    assert_eq!(status.phase, Some(BarrierPhase::Waiting));
    proxy.resume();
}

#[tokio::test]
async fn garbage_in_a_barrier_node_is_repaired_without_losing_registrations() {
    let Reconciled {
        client,
        ns,
        zk,
        barriers,
        _controller,
        ..
    } = reconciled_barrier(3, "controller-g").await;
    let within = Duration::from_secs(30);
    let path = format!("/zkgate/namespaces/{ns}/barriers/gang");
    let participant = support::session(&zk).await;
    let eph =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    participant
        .client()
        .create(&format!("{path}/p0"), b"", &eph)
        .await
        .unwrap();
    eventually(within, "p0 entered", || async {
        (barriers.get("gang").await.ok()?.status?.entered == 1).then_some(())
    })
    .await;

    // A waiter meets the garbage: a clear error, not a panic.
    participant
        .client()
        .set_data(&path, b"\x00not json", None)
        .await
        .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_zkgate"))
        .args([
            "barrier",
            "enter",
            "gang",
            "--id",
            "p9",
            "--namespace",
            &ns,
            "--timeout",
            "1s",
        ])
        .env("ZKGATE_ZOOKEEPER", &zk)
        .env("ZKGATE_LOG", "off")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Either it met the garbage (a clear error) or the controller had already repaired it.
    assert!(
        out.status.code() == Some(1) && err.contains("not barrier JSON")
            || out.status.code() == Some(3),
        "{err}"
    );

    // The controller repairs the data and keeps the registration.
    participant
        .client()
        .set_data(&path, b"\x00not json", None)
        .await
        .unwrap();
    eventually(within, "the data repaired", || async {
        let (data, _) = participant.client().get_data(&path).await.ok()?;
        zkgate::zk::BarrierData::parse(&path, &data)
            .ok()
            .flatten()
            .filter(|d| d.participants == 3)
            .map(|_| ())
    })
    .await;
    assert!(
        support::children(&participant, &path)
            .await
            .contains(&"p0".to_string()),
        "the registration survived"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    eventually(within, "a Repaired event", || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Repaired"))
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn garbage_in_a_lock_node_is_repaired_without_revoking_the_holder() {
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let zk = support::isolated_connect();
    let _controller = ControllerProcess::start(&ns, &zk, "controller-l");
    let locks: Api<zkgate::api::LockLease> = Api::namespaced(client.clone(), &ns);
    let lock: zkgate::api::LockLease = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease", "metadata": { "name": "db" }, "spec": {} })).unwrap();
    locks.create(&PostParams::default(), &lock).await.unwrap();
    let within = Duration::from_secs(30);
    eventually(within, "reconciled", || async {
        locks.get("db").await.ok()?.status.map(|_| ())
    })
    .await;
    let path = format!("/zkgate/namespaces/{ns}/locks/db");
    let holder = support::session(&zk).await;
    let hold = zkgate::zk::Mutex::new(&path, Default::default())
        .acquire(&holder, None)
        .await
        .unwrap();
    eventually(within, "held", || async {
        (locks.get("db").await.ok()?.status?.holder_count == 1).then_some(())
    })
    .await;
    holder
        .client()
        .set_data(&path, b"garbage", None)
        .await
        .unwrap();
    eventually(within, "the data repaired", || async {
        let (data, _) = holder.client().get_data(&path).await.ok()?;
        serde_json::from_slice::<zkgate::controller::LockNodeData>(&data)
            .ok()
            .map(|_| ())
    })
    .await;
    assert!(
        holder
            .client()
            .check_stat(hold.path())
            .await
            .unwrap()
            .is_some(),
        "the hold was not revoked"
    );
    hold.release().await.expect("still ours to release");
}

#[tokio::test]
async fn a_barrier_node_deleted_by_hand_stops_its_waiters_and_is_made_again() {
    let Reconciled {
        ns,
        zk,
        barriers,
        created,
        _controller,
        ..
    } = reconciled_barrier(2, "controller-d").await;
    let within = Duration::from_secs(30);
    let waiter = tokio::process::Command::new(env!("CARGO_BIN_EXE_zkgate"))
        .args([
            "barrier",
            "run",
            "gang",
            "--id",
            "p0",
            "--namespace",
            &ns,
            "--timeout",
            "30s",
            "--",
            "true",
        ])
        .env("ZKGATE_ZOOKEEPER", &zk)
        .env("ZKGATE_LOG", "off")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    eventually(within, "p0 entered", || async {
        (barriers.get("gang").await.ok()?.status?.entered == 1).then_some(())
    })
    .await;
    let path = format!("/zkgate/namespaces/{ns}/barriers/gang");
    let admin = support::session(&zk).await;
    let left = zkgate::zk::tree::delete_tree(&admin, &path).await.unwrap();
    assert!(left.is_empty(), "{left:?}");
    let (code, err) = support::finished(waiter, within).await;
    assert_eq!(code, 4, "{err}");
    // The controller makes the node again, for the same resource.
    let data = eventually(within, "the node made again", || async {
        let (data, _) = admin.client().get_data(&path).await.ok()?;
        zkgate::zk::BarrierData::parse(&path, &data).ok().flatten()
    })
    .await;
    assert_eq!(data.uid, kube::ResourceExt::uid(&created));
}

#[tokio::test]
async fn the_api_server_crashing_mid_barrier_watches_resume_and_status_converges() {
    let api = tokio::task::spawn_blocking(PrivateApiServer::start)
        .await
        .unwrap();
    let client = client_of(&api.kubeconfig()).await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let zk = support::isolated_connect();
    let _controller = ControllerProcess::start_on(&api.kubeconfig(), &ns, &zk, "controller-api");
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let within = Duration::from_secs(60);
    barrier_waiting(&barriers, "gang", 3, within).await;

    let path = format!("/zkgate/namespaces/{ns}/barriers/gang");
    let enter = |id: &'static str| {
        let (zk, path) = (zk.clone(), path.clone());
        tokio::spawn(async move {
            let s = support::session(&zk).await;
            let deadline = Some(tokio::time::Instant::now() + Duration::from_secs(90));
            DoubleBarrier::new(&path)
                .enter(&s, id, &EnterOptions::default(), deadline)
                .await
                .expect("enter");
            s // held open: the registrations stay until the test ends
        })
    };
    let first = [enter("p0"), enter("p1")];
    eventually(within, "2 entered in the status", || async {
        (barriers.get("gang").await.ok()?.status?.entered == 2).then_some(())
    })
    .await;

    // The API server dies; the gang completes while it is away.
    // Off the runtime's thread: p0's and p1's sessions live on it.
    let api = tokio::task::spawn_blocking(move || {
        api.crash();
        api
    })
    .await
    .unwrap();
    let last = enter("p2");
    let mut sessions = vec![last.await.unwrap()];
    for f in first {
        sessions.push(f.await.unwrap());
    }
    let api = tokio::task::spawn_blocking(move || {
        api.restart();
        api
    })
    .await
    .unwrap();

    // The status converges: open with exactly three, counted once.
    let status = eventually(within, "Open after the restart", || async {
        let status = barriers.get("gang").await.ok()?.status?;
        (status.phase == Some(BarrierPhase::Open)).then_some(status)
    })
    .await;
    assert_eq!(status.entered, 3, "{status:?}");
    // The controller's watches resumed: a Barrier made after the restart is
    // reconciled, its znode made.
    barrier_waiting(&barriers, "later", 1, within).await;
    let observer = support::session(&zk).await;
    assert!(observer
        .client()
        .check_stat(&format!("/zkgate/namespaces/{ns}/barriers/later"))
        .await
        .unwrap()
        .is_some());
    for s in sessions {
        s.close().await.ok();
    }
    drop(api);
}

/// Foreign children are part of the contract: under a barrier node every
/// child but `ready` is a participant (Curator's layout, which is what lets
/// a Curator `DistributedDoubleBarrier` share a barrier with zkgate), so a
/// foreign node counts, shows in the status, and is removed with the
/// resource; under a lock node, children whose names are not contender
/// names are ignored by the queue and removed with the resource.
#[tokio::test]
async fn foreign_children_count_in_a_barrier_are_ignored_in_a_lock_and_go_with_the_resource() {
    let Reconciled {
        client,
        ns,
        zk,
        barriers,
        _controller,
        ..
    } = reconciled_barrier(2, "controller-fc").await;
    let within = Duration::from_secs(30);
    let barrier = format!("/zkgate/namespaces/{ns}/barriers/gang");
    let s = support::session(&zk).await;
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    // A foreign child with garbage data and a subtree of its own.
    s.client()
        .create(&format!("{barrier}/intruder"), b"\xffnot json", &persistent)
        .await
        .unwrap();
    s.client()
        .create(&format!("{barrier}/intruder/deeper"), b"", &persistent)
        .await
        .unwrap();
    let status = eventually(within, "the intruder in the status", || async {
        let status = barriers.get("gang").await.ok()?.status?;
        (status.entered == 1).then_some(status)
    })
    .await;
    assert_eq!(status.participants[0].id, "intruder", "{status:?}");
    // It counts: one more participant opens the barrier of two.
    let deadline = Some(tokio::time::Instant::now() + Duration::from_secs(30));
    let entered = DoubleBarrier::new(&barrier)
        .enter(&s, "p0", &EnterOptions::default(), deadline)
        .await
        .expect("enter");
    assert_eq!(entered.participants, 2);
    eventually(within, "Open", || async {
        (barriers.get("gang").await.ok()?.status?.phase == Some(BarrierPhase::Open)).then_some(())
    })
    .await;

    // A lock node with foreign children: the queue ignores them.
    let locks: Api<zkgate::api::LockLease> = Api::namespaced(client.clone(), &ns);
    let lock: zkgate::api::LockLease = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease", "metadata": { "name": "db" }, "spec": {} })).unwrap();
    locks.create(&PostParams::default(), &lock).await.unwrap();
    let lock_path = format!("/zkgate/namespaces/{ns}/locks/db");
    s.await_node(&lock_path).await.unwrap();
    for junk in ["junk", "lock-", "_c_x-lock-notanumber"] {
        s.client()
            .create(&format!("{lock_path}/{junk}"), b"", &persistent)
            .await
            .unwrap();
    }
    s.client()
        .create(&format!("{lock_path}/junk/deeper"), b"", &persistent)
        .await
        .unwrap();
    let hold = zkgate::zk::Mutex::new(&lock_path, Default::default())
        .acquire(&s, deadline)
        .await
        .expect("foreign children do not block the lock");
    let status = eventually(within, "held", || async {
        let status = locks.get("db").await.ok()?.status?;
        (status.holder_count == 1).then_some(status)
    })
    .await;
    assert_eq!(status.waiting_count, 0, "{status:?}");
    hold.release().await.unwrap();

    // Deleting the resources removes their whole subtrees, foreign nodes
    // included, and the finalizers with them.
    barriers.delete("gang", &Default::default()).await.unwrap();
    locks.delete("db", &Default::default()).await.unwrap();
    eventually(within, "both resources gone", || async {
        (barriers.get_opt("gang").await.ok()?.is_none()
            && locks.get_opt("db").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    for gone in [&barrier, &lock_path] {
        assert!(
            s.client().check_stat(gone).await.unwrap().is_none(),
            "{gone} left behind"
        );
    }
}

/// Issue 12, item 13: a ZooKeeper term that fails at once (here: the root
/// belongs to another credential, so taking the leader lock is refused) is
/// retried with exponential backoff, not in a tight loop; `/readyz` says
/// why and a metric counts the failures.
#[tokio::test]
async fn a_term_that_fails_fast_is_retried_with_backoff_and_readyz_says_why() {
    let zk = support::isolated_connect();
    let owner = zkgate::zk::Session::connect(&support::options(&zk).digest("other", "secret"))
        .await
        .unwrap();
    owner
        .client()
        .create(
            "/zkgate",
            &[],
            &zookeeper_client::CreateMode::Persistent.with_acls(owner.node_acls()),
        )
        .await
        .unwrap();
    let (controller, mut lines) = ControllerProcess::start_logged(
        &support::kube::kubeconfig(),
        &zk,
        "refused",
        &[
            "--auth",
            "controller:secret",
            "--watch-namespace",
            "default",
        ],
    );
    let port = controller.metrics_port;
    // Count the sessions it opens (one per attempt) for six seconds.
    let mut attempts = 0;
    let mut log = Vec::new();
    let window = tokio::time::sleep(Duration::from_secs(6));
    tokio::pin!(window);
    loop {
        tokio::select! {
            line = lines.next_line() => match line.unwrap() {
                Some(line) => {
                    if line.contains("ZooKeeper session established") {
                        attempts += 1;
                    }
                    log.push(line);
                }
                None => panic!("the controller exited: {log:#?}"),
            },
            () = &mut window => break,
        }
    }
    // 0.2 s doubling (±20 %): attempts at about 0, 0.2, 0.6, 1.4, 3 and 6.2 s.
    assert!(
        (2..=7).contains(&attempts),
        "{attempts} attempts in 6 s: {:#?}",
        &log[log.len().saturating_sub(10)..]
    );
    assert!(
        log.iter()
            .any(|l| l.contains("retrying") && l.contains("not authorized")),
        "each attempt logs its cause: {log:#?}"
    );
    let (code, body) = support::http_get(port, "/readyz").await.expect("served");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("not authorized"), "{body}");
    let (_, metrics) = support::http_get(port, "/metrics").await.expect("served");
    let failures: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("zkgate_term_failures_total ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no zkgate_term_failures_total in {metrics}"));
    assert!(failures >= 2.0, "{failures}");
}

/// Issue 12, item 15: a reconcile that keeps failing (here: the barrier's
/// node is someone else's, so the controller may not read it) is retried
/// with a backoff of its own, and every warning names the object.
#[tokio::test]
async fn a_failing_reconcile_backs_off_per_object_and_names_it() {
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let zk = support::isolated_connect();
    let other = zkgate::zk::Session::connect(&support::options(&zk).digest("other", "secret"))
        .await
        .unwrap();
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let barriers = format!("/zkgate/namespaces/{ns}/barriers");
    other.client().mkdir(&barriers, &open).await.unwrap();
    other
        .client()
        .create(
            &format!("{barriers}/stuck"),
            &[],
            &zookeeper_client::CreateMode::Persistent.with_acls(other.node_acls()),
        )
        .await
        .unwrap();
    let (_controller, mut lines) = ControllerProcess::start_logged(
        &support::kube::kubeconfig(),
        &zk,
        "backoff",
        &["--watch-namespace", &ns],
    );
    let api: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let stuck: Barrier = serde_json::from_value(json!({
        "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier",
        "metadata": { "name": "stuck" }, "spec": { "participants": 2 }
    }))
    .unwrap();
    api.create(&PostParams::default(), &stuck).await.unwrap();
    let mut failures = Vec::new();
    let window = tokio::time::sleep(Duration::from_secs(16));
    tokio::pin!(window);
    loop {
        tokio::select! {
            line = lines.next_line() => match line.unwrap() {
                Some(line) if line.contains("reconcile failed") => failures.push(line),
                Some(_) => {}
                None => panic!("the controller exited"),
            },
            () = &mut window => break,
        }
    }
    assert!(!failures.is_empty(), "the reconcile did not fail");
    assert!(
        failures
            .iter()
            .all(|l| l.contains(&format!("Barrier/{ns}/stuck"))),
        "each warning names the object: {failures:#?}"
    );
    // 1 s doubling (±20 %): about 0, 1, 3, 7 and 15 s; a fixed 2 s would be 9.
    assert!(
        failures.len() <= 6,
        "{} retries in 16 s: {failures:#?}",
        failures.len()
    );
}
