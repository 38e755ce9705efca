//! Scenario 7: the controller at scale. Creates BARRIERS Barriers (x=3),
//! LOCKS LockLeases and one Barrier of GANG participants on a real API
//! server, then starts `zkgate controller` and measures:
//! - the first full sync: from the controller's start to a status on every
//!   resource (each needs its znodes made);
//! - ZooKeeper change to status: changes at a steady pace (every
//!   registration of each barrier, a holder for each lock), the time from
//!   each to the status that shows it (through a watch on the API);
//! - the gang: GANG registrations made at once, and the time from the last
//!   one to the status counting them all, with the status writes it took;
//! - API requests per ZooKeeper change: the API server's request counter
//!   (`apiserver_request_total`) across the measured phases, in which only
//!   the controller sends requests;
//! - the controller's peak RSS and CPU;
//! - the sync after a restart: the controller stopped and started again
//!   (every resource already has its finalizer, status and znodes), the
//!   time until it has looked at every resource (its `zkgate_barriers` and
//!   `zkgate_lock_leases` gauges count them all) and the API writes it took;
//! - the API server's floor under these figures: the same writes (a
//!   finalizer and a first status for as many new objects; status writes
//!   at the same pace) by a writer that does nothing else;
//! - what one status write costs the API server, by server-side apply, merge
//!   patch and replace, side by side.
//!
//! Prints one JSON line.
//!   cargo run --release -p zkgate-bench --bin controller -- KUBECONFIG ZOOKEEPER ZKGATE_BINARY BARRIERS LOCKS GANG

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

// The integration tests' free port and plain HTTP GET.
#[path = "../tests/support/net.rs"]
mod net;

/// A namespace of a fresh name (the controller's objects go there).
async fn namespace(client: &Client) -> String {
    let name = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({ "metadata": { "name": name } })).expect("a namespace");
    Api::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");
    name
}

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

/// The API server's `apiserver_request_total`, summed, and by verb and
/// resource.
async fn api_requests(client: &Client) -> (f64, HashMap<String, f64>) {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut total = 0.0;
    let mut by = HashMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("")
                .to_owned()
        };
        total += value;
        *by.entry(format!(
            "{} {}{}",
            label("verb"),
            label("resource"),
            match label("subresource").as_str() {
                "" => String::new(),
                sub => format!("/{sub}"),
            }
        ))
        .or_insert(0.0) += value;
    }
    (total, by)
}

/// Notes when each resource's status first satisfies `done`.
fn watch_until<K>(
    api: Api<K>,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    done: impl Fn(&K) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<Result<(), watcher::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(
        watcher(api, watcher::Config::default()).try_for_each(move |e| {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = e {
                if done(&o) {
                    seen.lock()
                        .unwrap()
                        .entry(o.name_any())
                        .or_insert_with(Instant::now);
                }
            }
            futures::future::ready(Ok(()))
        }),
    )
}

async fn wait_for(seen: &Mutex<HashMap<String, Instant>>, count: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while seen.lock().unwrap().len() < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 10 minutes) until `count` objects have synced; the
/// seconds from `started` to the last of them.
async fn synced_after(
    synced: &Mutex<HashMap<String, Instant>>,
    count: usize,
    started: Instant,
) -> f64 {
    wait_for(synced, count, Duration::from_secs(600)).await;
    synced
        .lock()
        .unwrap()
        .values()
        .max()
        .map(|last| last.saturating_duration_since(started).as_secs_f64())
        .unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (kubeconfig, zk_base, binary) = (&args[0], &args[1], &args[2]);
    let barriers: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let locks: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1_000);
    let gang: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(2_000);
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
    let ns = namespace(&client).await;

    // Every resource first, then the controller: its first full sync.
    let barrier_api: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let lock_api: Api<LockLease> = Api::namespaced(client.clone(), &ns);
    let gang_name = "gang";
    let specs = (0..barriers)
        .map(|i| (format!("b{i}"), 3))
        .chain(std::iter::once((gang_name.to_owned(), gang)));
    futures::stream::iter(specs)
        .for_each_concurrent(16, |(name, x)| {
            let api = barrier_api.clone();
            async move {
                let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": name }, "spec": { "participants": x } })).unwrap();
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

    let synced: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let sync_b = watch_until(barrier_api.clone(), synced.clone(), |b: &Barrier| {
        b.status.is_some()
    });
    let sync_l = watch_until(lock_api.clone(), synced.clone(), |l: &LockLease| {
        l.status.is_some()
    });
    let metrics_port = net::free_port();
    let start_controller = || {
        tokio::process::Command::new(binary)
            .args([
                "controller",
                "--watch-namespace",
                &ns,
                "--zookeeper",
                &connect,
                "--id",
                "bench",
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("ZKGATE_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let started = Instant::now();
    let mut controller = start_controller();
    let pid = controller.id().unwrap();
    let everything = barriers + 1 + locks;
    let first_sync = synced_after(&synced, everything, started).await;
    let unsynced = everything - synced.lock().unwrap().len();
    sync_b.abort();
    sync_l.abort();

    // Watch the statuses (one watch per kind: every watch costs the API
    // server a copy of each write); note when each count first shows.
    let seen: Arc<Mutex<HashMap<(u32, String), Instant>>> = Arc::default();
    let watches = [
        tokio::spawn({
            let seen = seen.clone();
            watcher(barrier_api.clone(), watcher::Config::default()).try_for_each(move |e| {
                if let watcher::Event::Apply(b) = e {
                    let entered = b.status.as_ref().map_or(0, |s| s.entered);
                    seen.lock()
                        .unwrap()
                        .entry((entered, b.name_any()))
                        .or_insert_with(Instant::now);
                }
                futures::future::ready(Ok(()))
            })
        }),
        tokio::spawn({
            let seen = seen.clone();
            watcher(lock_api.clone(), watcher::Config::default()).try_for_each(move |e| {
                if let watcher::Event::Apply(l) = e {
                    if l.status.as_ref().is_some_and(|s| s.holder_count == 1) {
                        seen.lock()
                            .unwrap()
                            .entry((1, l.name_any()))
                            .or_insert_with(Instant::now);
                    }
                }
                futures::future::ready(Ok(()))
            })
        }),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;

    let connect: ConnectString = connect.parse().unwrap();
    let session = Session::connect(&SessionOptions::new(connect))
        .await
        .unwrap();
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let seq = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (requests_before, by_before) = api_requests(&client).await;
    // Steady pace: 200 changes a second, every registration of a barrier
    // (1, 2, 3) and every lock's holder timed.
    let mut changed: HashMap<(u32, String), Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut changes = 0usize;
    for p in 0..3u32 {
        for i in 0..barriers {
            tick.tick().await;
            changed.insert((p + 1, format!("b{i}")), Instant::now());
            session
                .client()
                .create(
                    &format!("/zkgate/namespaces/{ns}/barriers/b{i}/p{p}"),
                    b"",
                    &eph,
                )
                .await
                .unwrap();
            changes += 1;
        }
    }
    for i in 0..locks {
        tick.tick().await;
        changed.insert((1, format!("l{i}")), Instant::now());
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
        changes += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while changed
        .keys()
        .any(|k| !seen.lock().unwrap().contains_key(k))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let latencies: Vec<f64> = changed
        .iter()
        .filter_map(|(key, at)| {
            let seen = seen.lock().unwrap().get(key).copied()?;
            Some(seen.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    // Changes whose status never showed within the deadline: not in the
    // percentiles, so reported (and bench/run fails the run on any).
    let missing = changed.len() - latencies.len();
    let steady_changes = changes;

    // The gang: every registration at once (64 requests in flight).
    let (gang_before, _) = api_requests(&client).await;
    let gang_path = format!("/zkgate/namespaces/{ns}/barriers/{gang_name}");
    let burst = Instant::now();
    let last_create = Arc::new(Mutex::new(burst));
    futures::stream::iter(0..gang)
        .for_each_concurrent(64, |p| {
            let (session, path, eph, last) = (&session, &gang_path, &eph, last_create.clone());
            async move {
                session
                    .client()
                    .create(&format!("{path}/p{p}"), b"", eph)
                    .await
                    .unwrap();
                *last.lock().unwrap() = Instant::now();
            }
        })
        .await;
    changes += gang;
    let burst_seconds = burst.elapsed().as_secs_f64();
    let key = (gang as u32, gang_name.to_owned());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.lock().unwrap().contains_key(&key) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = *last_create.lock().unwrap();
    let gang_ms = seen
        .lock()
        .unwrap()
        .get(&key)
        .map(|at| at.saturating_duration_since(last).as_secs_f64() * 1000.0);
    let (requests_after, by_after) = api_requests(&client).await;
    let gang_requests = requests_after - gang_before;

    let (rss_kib, cpu_seconds) = proc_stats(pid);
    for w in watches {
        w.abort();
    }
    // Stopped as Kubernetes stops a pod (SIGTERM): it gives up leadership
    // as it goes, so the new one need not wait out the old session.
    // SAFETY: kill(2) on the child's pid, which has not been reaped yet.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = controller.wait().await;

    // A restart: everything is there already; until the new controller has
    // looked at every resource (its gauges count them).
    let (restart_before, restart_by_before) = api_requests(&client).await;
    let restarted = Instant::now();
    let mut controller = start_controller();
    let mut restart_sync = None;
    while restarted.elapsed() < Duration::from_secs(600) {
        let seen = |family: &str, body: &str| -> f64 {
            body.lines()
                .filter(|l| l.starts_with(&format!("{family}{{")))
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                .sum()
        };
        if let Some((_, body)) = net::http_get(metrics_port, "/metrics").await {
            if seen("zkgate_barriers", &body) as usize == barriers + 1
                && seen("zkgate_lock_leases", &body) as usize == locks
            {
                restart_sync = Some(restarted.elapsed().as_secs_f64());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (restart_after, restart_by_after) = api_requests(&client).await;
    let writes_of = |by: &HashMap<String, f64>| -> f64 {
        by.iter()
            .filter(|(k, _)| {
                ["PATCH", "APPLY", "PUT", "POST", "DELETE"]
                    .iter()
                    .any(|v| k.starts_with(v))
            })
            .map(|(_, v)| v)
            .sum()
    };
    let restart_writes = writes_of(&restart_by_after) - writes_of(&restart_by_before);
    let _ = controller.kill().await;
    let floor = api_floor(&client, everything, (barriers * 3).min(10_000)).await;
    let writes = status_write_costs(&client, (barriers * 3).clamp(150, 1500)).await;
    let mut by: Vec<(String, f64)> = by_after
        .into_iter()
        .map(|(k, v)| (k.clone(), v - by_before.get(&k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    by.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "{}",
        json!({
            "impl": "zkgate", "scenario": "controller", "barriers": barriers, "locks": locks, "gang": gang,
            "first_sync_seconds": first_sync, "unsynced": unsynced,
            "status_p50_ms": pct(latencies.clone(), 0.5), "status_p99_ms": pct(latencies, 0.99),
            "changes": steady_changes, "missing": missing,
            "gang_burst_seconds": burst_seconds, "gang_status_ms": gang_ms, "gang_api_requests": gang_requests,
            // With the gang's registrations (coalesced: GANG changes, a few
            // requests) and without them (the steady changes alone).
            "api_requests_per_change": (requests_after - requests_before) / changes as f64,
            "api_requests_per_change_steady": (gang_before - requests_before) / steady_changes as f64,
            "api_requests_by": by.into_iter().take(8).collect::<Vec<_>>(),
            "peak_rss_mib": rss_kib as f64 / 1024.0, "cpu_seconds": cpu_seconds,
            "restart_sync_seconds": restart_sync, "restart_api_requests": restart_after - restart_before,
            "restart_api_writes": restart_writes,
            "status_writes": writes,
            "api_floor": floor,
            "first_sync_over_floor": first_sync / floor["first_sync_seconds"].as_f64().unwrap_or(f64::NAN),
        })
    );
}

/// `n` Barriers (x=3) named `<prefix><i>`, in a namespace of their own.
async fn barriers_of_their_own(client: &Client, n: usize, prefix: &str) -> Api<Barrier> {
    let ns = namespace(client).await;
    let api: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let b: Barrier = serde_json::from_value(json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "metadata": { "name": format!("{prefix}{i}") }, "spec": { "participants": 3 } })).unwrap();
                api.create(&PostParams::default(), &b).await.unwrap();
            }
        })
        .await;
    api
}

/// A status of the size the controller writes for a barrier of 3.
fn barrier_status(entered: u32) -> serde_json::Value {
    json!({
        "phase": "Waiting", "entered": entered, "left": 0, "required": 3,
        "participants": [{ "id": "p0", "pod": "p0", "enteredAt": "2026-11-30T10:00:00Z" }],
        "conditions": [{ "type": "Open", "status": "False", "reason": "Waiting",
            "message": format!("{entered} of 3 participants entered"),
            "lastTransitionTime": "2026-11-30T10:00:00Z", "observedGeneration": 1 }],
        "observedGeneration": 1, "znode": "/zkgate/namespaces/x/barriers/w"
    })
}

/// The API server's floor under the controller's figures: the writes the
/// controller must make, made by a writer that does nothing else (no
/// ZooKeeper, no reconcile), on the same server, watched the same way.
/// - First sync: `n` new Barriers each given a finalizer and a first status
///   (the two writes a new resource needs), 64 objects in flight as the
///   controller's reconciles; from the first write to the watch seeing a
///   status on every one.
/// - Status latency: `changes` status writes at the controller phase's
///   pace (200 a second, each to a different object), each timed from when
///   it was due to the watch seeing it.
async fn api_floor(client: &Client, n: usize, changes: usize) -> serde_json::Value {
    let api = barriers_of_their_own(client, n, "f").await;
    let apply = |api: Api<Barrier>, name: String, entered: u32| async move {
        let p = json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "status": barrier_status(entered) });
        api.patch_status(
            &name,
            &PatchParams::apply("zkgate").force(),
            &Patch::Apply(&p),
        )
        .await
        .unwrap();
    };

    let synced: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let sync = watch_until(api.clone(), synced.clone(), |b: &Barrier| {
        b.status.is_some()
    });
    let started = Instant::now();
    futures::stream::iter(0..n)
        .for_each_concurrent(64, |i| {
            let api = api.clone();
            async move {
                let name = format!("f{i}");
                let p = json!({ "metadata": { "finalizers": [zkgate::controller::FINALIZER] } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&p))
                    .await
                    .unwrap();
                apply(api, name, 0).await;
            }
        })
        .await;
    let first_sync = synced_after(&synced, n, started).await;
    sync.abort();

    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = watch_until(api.clone(), seen.clone(), |b: &Barrier| {
        b.status.as_ref().is_some_and(|s| s.entered == 1)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut due = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut writes = Vec::new();
    for i in 0..changes.min(n) {
        tick.tick().await;
        let name = format!("f{i}");
        due.insert(name.clone(), Instant::now());
        writes.push(tokio::spawn(apply(api.clone(), name, 1)));
    }
    for w in writes {
        w.await.unwrap();
    }
    wait_for(&seen, due.len(), Duration::from_secs(120)).await;
    watch.abort();
    let latencies: Vec<f64> = {
        let seen = seen.lock().unwrap();
        due.iter()
            .filter_map(|(name, at)| {
                Some(seen.get(name)?.saturating_duration_since(*at).as_secs_f64() * 1000.0)
            })
            .collect()
    };
    json!({
        "objects": n, "first_sync_seconds": first_sync,
        "changes": due.len(), "missing": due.len() - latencies.len(),
        "status_p50_ms": pct(latencies.clone(), 0.5), "status_p99_ms": pct(latencies, 0.99),
    })
}

/// What a status write costs the API server, by the way it is written:
/// server-side apply (what the controller does), a JSON merge patch, and a
/// replace of the status subresource (conditioned on the resourceVersion
/// the writer has cached). `n` Barriers of their own namespace, 64 writes in
/// flight, the three ways interleaved over three rounds (this machine's
/// speed drifts); writes a second, median of the rounds, and each way's
/// ratio to apply.
async fn status_write_costs(client: &Client, n: usize) -> serde_json::Value {
    let api = barriers_of_their_own(client, n, "w").await;
    let ways = ["apply", "merge", "replace"];
    let mut rates: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut entered = 0;
    for _round in 0..3 {
        for way in ways {
            entered += 1;
            // The objects as a writer's cache holds them (for replace).
            let cached: HashMap<String, Barrier> = api
                .list(&Default::default())
                .await
                .unwrap()
                .into_iter()
                .map(|b| (b.name_any(), b))
                .collect();
            let started = Instant::now();
            futures::stream::iter(cached.into_values())
                .for_each_concurrent(64, |mut b| {
                    let (api, st) = (api.clone(), barrier_status(entered));
                    async move {
                        let name = b.name_any();
                        match way {
                            "apply" => {
                                let p = json!({ "apiVersion": "zkgate.io/v1alpha1", "kind": "Barrier", "status": st });
                                api.patch_status(&name, &PatchParams::apply("zkgate").force(), &Patch::Apply(&p))
                                    .await
                                    .unwrap();
                            }
                            "merge" => {
                                let p = json!({ "status": st });
                                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&p))
                                    .await
                                    .unwrap();
                            }
                            _ => {
                                b.status = Some(serde_json::from_value(st).unwrap());
                                api.replace_status(&name, &PostParams::default(), &b)
                                    .await
                                    .unwrap();
                            }
                        }
                    }
                })
                .await;
            rates
                .entry(way)
                .or_default()
                .push(n as f64 / started.elapsed().as_secs_f64());
        }
    }
    let median = |way: &str| {
        let mut r = rates[way].clone();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    json!({
        "objects": n,
        "per_second": { "apply": median("apply"), "merge": median("merge"), "replace": median("replace") },
        "merge_over_apply": median("merge") / median("apply"),
        "replace_over_apply": median("replace") / median("apply"),
    })
}
