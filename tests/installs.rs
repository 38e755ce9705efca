//! Several installs on one ZooKeeper ensemble: each lives under a root its
//! cluster owns, and installs of one cluster with disjoint scopes share a
//! root. Real ZooKeeper, real kube-apiservers.

mod support;

use std::time::Duration;

use kube::api::{Api, PostParams};
use serde_json::json;
use support::kube::{client, install_crds, namespace, ControllerProcess, PrivateApiServer};
use support::{eventually, isolated_connect, session};
use zkgate::api::Barrier;
use zkgate::zk::Session;

const WITHIN: Duration = Duration::from_secs(30);

/// Creates Barrier `g` (3 participants) in `ns` and waits for a status from
/// a controller.
async fn reconciled(client: &kube::Client, ns: &str) {
    let api: Api<Barrier> = Api::namespaced(client.clone(), ns);
    let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": "g" }, "spec": { "participants": 3 } })).unwrap();
    api.create(&PostParams::default(), &b).await.unwrap();
    eventually(WITHIN, &format!("a status for {ns}/g"), || async {
        api.get("g").await.ok()?.status.map(|_| ())
    })
    .await;
}

/// Every node under `path` with its data and last-modified zxid: what
/// "touches nothing" compares.
async fn dump(zk: &Session, path: &str) -> Vec<(String, Vec<u8>, i64)> {
    let mut out = Vec::new();
    let mut todo = vec![path.to_owned()];
    while let Some(at) = todo.pop() {
        let Ok((data, stat)) = zk.client().get_data(&at).await else {
            continue;
        };
        out.push((at.clone(), data, stat.mzxid));
        for child in zk.client().list_children(&at).await.unwrap_or_default() {
            todo.push(zkgate::zk::path::join(&at, &child));
        }
    }
    out.sort();
    out
}

/// Reads the controller's log until a line holds `needle`.
async fn logged(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    needle: &str,
) -> String {
    tokio::time::timeout(WITHIN, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains(needle) {
                return line;
            }
        }
        panic!("the controller's log ended without {needle:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("no log line with {needle:?} within {WITHIN:?}"))
}

/// When a log line was written (text format: its first word).
fn logged_at(line: &str) -> k8s_openapi::jiff::Timestamp {
    line.split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no timestamp in {line:?}"))
}

#[tokio::test]
async fn installs_share_an_ensemble_and_a_root_of_another_cluster_is_refused_untouched() {
    let client = client().await;
    install_crds(&client).await;
    let zk = isolated_connect();
    let (a, b, c) = (
        namespace(&client).await,
        namespace(&client).await,
        namespace(&client).await,
    );
    // Two installs of this cluster on the default root with disjoint
    // scopes, and a third under a root of its own: all three lead.
    let kubeconfig = support::kube::kubeconfig();
    let _a = ControllerProcess::start_on(&kubeconfig, &a, &zk, "install-a");
    let _b = ControllerProcess::start_on(&kubeconfig, &b, &zk, "install-b");
    let _c = ControllerProcess::start_with(
        &kubeconfig,
        &zk,
        "install-c",
        &["--watch-namespace", &c, "--root", "/other"],
    );
    for ns in [&a, &b, &c] {
        reconciled(&client, ns).await;
    }
    let observer = session(&zk).await;
    let record: serde_json::Value =
        serde_json::from_slice(&observer.client().get_data("/zkgate").await.unwrap().0).unwrap();
    let mut scopes: Vec<String> = serde_json::from_value(record["scopes"].clone()).unwrap();
    scopes.sort();
    let mut expected = vec![a.clone(), b.clone()];
    expected.sort();
    assert_eq!(scopes, expected, "the root records both scopes: {record}");
    assert!(record["cluster"].as_str().is_some_and(|c| !c.is_empty()));

    // Another cluster's controller on the same root refuses, in one line,
    // and leaves every node as it was.
    let before = dump(&observer, "/zkgate").await;
    let (other, other_client) = PrivateApiServer::with_crds().await;
    let (mut stranger, mut log) = ControllerProcess::start_logged(
        &other.kubeconfig(),
        &zk,
        "stranger",
        &["--watch-namespace", &a],
    );
    let line = loop {
        let line = logged(&mut log, "belongs to another cluster").await;
        if line.contains("retry_in") {
            break line;
        }
    };
    assert!(line.contains("/zkgate"), "{line}");
    assert_eq!(stranger.metric("zkgate_leader").await, Some(0.0));
    eventually(WITHIN, "the refused controller is not ready", || async {
        (stranger.status_of("/readyz").await? == 503).then_some(())
    })
    .await;
    // It retries with backoff: refused again and again, nothing touched,
    // and the gaps between refusals (by the log's own timestamps) grow over
    // the retries (waits that double from 0.2 s, each within ±20 %; the
    // first gap, 0.2 s against 0.4 s, is left out: a slow term could hide
    // its growth).
    let mut refusals = vec![logged_at(&line)];
    while refusals.len() < 5 {
        let next = logged(&mut log, "belongs to another cluster").await;
        if next.contains("retry_in") {
            refusals.push(logged_at(&next));
        }
    }
    let gaps: Vec<f64> = refusals
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    assert!(
        gaps[1..].windows(2).all(|w| w[1] > w[0]),
        "the gaps between refusals must grow: {gaps:?} s"
    );
    assert_eq!(stranger.status_of("/readyz").await, Some(503));
    assert_eq!(dump(&observer, "/zkgate").await, before);
    stranger.kill().await;

    // Under a root of its own the other cluster's controller works beside
    // this cluster's.
    let ns = namespace(&other_client).await;
    let _own = ControllerProcess::start_with(
        &other.kubeconfig(),
        &zk,
        "other-cluster",
        &["--watch-namespace", &ns, "--root", "/second-cluster"],
    );
    reconciled(&other_client, &ns).await;
    assert_eq!(dump(&observer, "/zkgate").await, before);
}

#[tokio::test]
async fn an_install_for_every_namespace_refuses_to_lead_beside_one_for_a_namespace() {
    // A private API server: an install watching every namespace must not
    // touch the shared one's.
    let (api, client) = PrivateApiServer::with_crds().await;
    let zk = isolated_connect();
    let ns = namespace(&client).await;
    let _one = ControllerProcess::start_on(&api.kubeconfig(), &ns, &zk, "one-namespace");
    reconciled(&client, &ns).await;
    let (mut all, mut log) = ControllerProcess::start_logged(&api.kubeconfig(), &zk, "all", &[]);
    let line = logged(&mut log, "overlapping scope").await;
    assert!(line.contains(&format!("/zkgate/leader-{ns}")), "{line}");
    assert_eq!(all.metric("zkgate_leader").await, Some(0.0));
    all.kill().await;
}
