//! Faults against real servers (issue 7's suite grows here).

mod support;

use std::process::Stdio;
use std::time::Duration;

use kube::api::{Api, PostParams};
use serde_json::json;
use support::kube::{client, install_crds, namespace, ControllerProcess};
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
    let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "gang" }, "spec": { "participants": 2 } })).unwrap();
    barriers.create(&PostParams::default(), &b).await.unwrap();
    let within = Duration::from_secs(30);
    eventually(within, "Waiting", || async {
        (barriers.get("gang").await.ok()?.status?.phase == Some(BarrierPhase::Waiting))
            .then_some(())
    })
    .await;
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
