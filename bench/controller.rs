//! Scenario 7: the controller at scale. Creates BARRIERS Barriers (x=3) and
//! LOCKS LockLeases on a real API server, runs `zkgate controller`, then
//! makes ZooKeeper changes at a steady pace (the third participant of each
//! barrier, a holder for each lock) and measures, through a watch on the
//! API, the time from each change to the status that reflects it. Prints
//! one JSON line with p50/p99 latencies, the controller's peak RSS and CPU.
//!   cargo bench --bench controller -- KUBECONFIG ZOOKEEPER ZKGATE_BINARY BARRIERS LOCKS

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config, ResourceExt};
use serde_json::json;
use zkgate::api::{Barrier, LockLease};
use zkgate::zk::{ConnectString, Session, SessionOptions};
use zookeeper_client as zk;

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn proc_stats(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = fields.get(11).and_then(|u| u.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf only reads a system constant.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    (hwm_kib, ticks as f64 / hz)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let (kubeconfig, zk_base, binary) = (&args[0], &args[1], &args[2]);
    let barriers: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let locks: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(100);
    let chroot = format!("/bench-{}", uuid::Uuid::new_v4().simple());
    let connect = format!("{zk_base}{chroot}");

    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    zkgate::install_crypto_provider();
    let client = Client::try_from(config).unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    for crd in zkgate::api::crds() {
        crds.patch(
            &crd.name_any(),
            &PatchParams::apply("zkgate-bench").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ns = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap(),
        )
        .await
        .unwrap();

    let mut controller = tokio::process::Command::new(binary)
        .args([
            "controller",
            "--watch-namespace",
            &ns,
            "--zookeeper",
            &connect,
            "--id",
            "bench",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("ZKGATE_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = controller.id().unwrap();

    let barrier_api: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let lock_api: Api<LockLease> = Api::namespaced(client.clone(), &ns);
    let created = Instant::now();
    futures::stream::iter(0..barriers)
        .for_each_concurrent(16, |i| {
            let api = barrier_api.clone();
            async move {
                let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": format!("b{i}") }, "spec": { "participants": 3 } })).unwrap();
                api.create(&PostParams::default(), &b).await.unwrap();
            }
        })
        .await;
    futures::stream::iter(0..locks)
        .for_each_concurrent(16, |i| {
            let api = lock_api.clone();
            async move {
                let l: LockLease = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "LockLease", "metadata": { "name": format!("l{i}") }, "spec": {} })).unwrap();
                api.create(&PostParams::default(), &l).await.unwrap();
            }
        })
        .await;
    // Every resource reconciled once (its znode made, a status written).
    loop {
        let b = barrier_api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|b| b.status.is_some())
            .count();
        let l = lock_api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|l| l.status.is_some())
            .count();
        if b == barriers && l == locks {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let provisioned = created.elapsed();

    // Watch the statuses; note when each change shows.
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let seen_b = seen.clone();
    let watch_b = tokio::spawn(
        watcher(barrier_api.clone(), watcher::Config::default()).try_for_each(move |e| {
            if let watcher::Event::Apply(b) = e {
                if b.status.as_ref().is_some_and(|s| s.entered == 3) {
                    seen_b
                        .lock()
                        .unwrap()
                        .entry(b.name_any())
                        .or_insert_with(Instant::now);
                }
            }
            futures::future::ready(Ok(()))
        }),
    );
    let seen_l = seen.clone();
    let watch_l = tokio::spawn(
        watcher(lock_api.clone(), watcher::Config::default()).try_for_each(move |e| {
            if let watcher::Event::Apply(l) = e {
                if l.status.as_ref().is_some_and(|s| s.holder_count == 1) {
                    seen_l
                        .lock()
                        .unwrap()
                        .entry(l.name_any())
                        .or_insert_with(Instant::now);
                }
            }
            futures::future::ready(Ok(()))
        }),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    let connect: ConnectString = connect.parse().unwrap();
    let session = Session::connect(&SessionOptions::new(connect))
        .await
        .unwrap();
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let seq = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    for i in 0..barriers {
        for p in 0..2 {
            session
                .client()
                .create(
                    &format!("/zkgate/namespaces/{ns}/barriers/b{i}/p{p}"),
                    b"",
                    &eph,
                )
                .await
                .unwrap();
        }
    }
    // Steady pace: 200 changes a second.
    let mut changed: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for i in 0..barriers.max(locks) {
        if i < barriers {
            tick.tick().await;
            changed.insert(format!("b{i}"), Instant::now());
            session
                .client()
                .create(
                    &format!("/zkgate/namespaces/{ns}/barriers/b{i}/p2"),
                    b"",
                    &eph,
                )
                .await
                .unwrap();
        }
        if i < locks {
            tick.tick().await;
            changed.insert(format!("l{i}"), Instant::now());
            session
                .client()
                .create(
                    &format!(
                        "/zkgate/namespaces/{ns}/locks/l{i}/_c_{}-lock-",
                        uuid::Uuid::new_v4()
                    ),
                    b"",
                    &seq,
                )
                .await
                .unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().len() < barriers + locks && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = seen.lock().unwrap().clone();
    let latencies: Vec<f64> = changed
        .iter()
        .filter_map(|(name, at)| {
            seen.get(name)
                .map(|s| s.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    let missing = barriers + locks - latencies.len();
    let (rss_kib, cpu_seconds) = proc_stats(pid);
    watch_b.abort();
    watch_l.abort();
    let _ = controller.kill().await;
    println!(
        "{}",
        json!({
            "impl": "zkgate", "scenario": "controller", "barriers": barriers, "locks": locks,
            "provision_seconds": provisioned.as_secs_f64(),
            "status_p50_ms": pct(latencies.clone(), 0.5), "status_p99_ms": pct(latencies, 0.99),
            "missing": missing, "peak_rss_mib": rss_kib as f64 / 1024.0, "cpu_seconds": cpu_seconds,
        })
    );
}
