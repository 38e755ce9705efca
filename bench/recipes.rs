//! zkgate's side of the benchmarks (`bench/run` runs it beside Curator and
//! kazoo). One scenario per run; prints one JSON line:
//!   cargo run --release -p zkgate-bench --bin recipes -- SCENARIO CONNECT N [SESSIONS]
//! Scenarios: raw (create+delete, one session), lock (acquire+release, one
//! session), contended (SESSIONS sessions x N on one lock), rw (8 readers +
//! 2 writers x N), many (64 locks x 4 sessions x N), semaphore (SESSIONS
//! sessions x N on a semaphore of 3 permits, one permit at a time),
//! barrier (N participants), idle (a read and a loopback round trip, back
//! to back and after 250 ms idle, N of each).

use std::sync::Arc;
use std::time::{Duration, Instant};

use zkgate::zk::{
    ConnectString, LockOptions, Mutex, Permits, ReadWriteLock, Semaphore, Session, SessionOptions,
    TlsSettings,
};
use zookeeper_client as zk;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(
    scenario: &str,
    ops: usize,
    elapsed: Duration,
    mut latencies: Vec<f64>,
    mut handoffs: Vec<f64>,
) {
    latencies.sort_by(f64::total_cmp);
    handoffs.sort_by(f64::total_cmp);
    println!(
        "{}",
        serde_json::json!({
            "impl": "zkgate", "scenario": scenario, "ops": ops,
            "seconds": elapsed.as_secs_f64(), "ops_per_sec": ops as f64 / elapsed.as_secs_f64(),
            "p50_ms": percentile(&latencies, 0.5), "p99_ms": percentile(&latencies, 0.99),
            "handoff_p50_ms": percentile(&handoffs, 0.5), "handoff_p99_ms": percentile(&handoffs, 0.99),
        })
    );
}

async fn session(connect: &str) -> Session {
    let connect: ConnectString = connect.parse().expect("connect string");
    // Long enough that one process driving 5,000 sessions (scenario 6)
    // keeps them all through its bursts; no scenario waits on an expiry.
    let mut options = SessionOptions::new(connect).session_timeout(Duration::from_secs(30));
    if options.connect.uses_tls() {
        // The -tls scenarios: certificates as scripts/zookeeper makes them.
        let dir = std::path::PathBuf::from(
            std::env::var_os("ZKGATE_BENCH_TLS_DIR").expect("ZKGATE_BENCH_TLS_DIR"),
        );
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("certificate");
        options = options.tls(TlsSettings {
            ca: read("ca.crt"),
            identity: Some((read("client.crt"), read("client.key"))),
        });
    }
    Session::connect(&options).await.expect("connect")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One byte to the echo server and back, in milliseconds.
async fn tcp_round_trip(tcp: &mut tokio::net::TcpStream) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = Instant::now();
    tcp.write_all(b"x").await.expect("write");
    tcp.read_exact(&mut [0u8; 1]).await.expect("read");
    ms(t.elapsed())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("lock");
    let connect = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:2181".into());
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let sessions: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);
    let root = format!("/bench-{}", uuid::Uuid::new_v4().simple());
    let connect = format!("{connect}{root}");
    let options = LockOptions {
        create_parent: true,
        ..LockOptions::default()
    };
    match scenario {
        "raw" => {
            let s = session(&connect).await;
            let create = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            let mut lat = Vec::with_capacity(n);
            let started = Instant::now();
            for _ in 0..n {
                let t = Instant::now();
                s.client()
                    .create("/node", b"", &create)
                    .await
                    .expect("create");
                s.client().delete("/node", None).await.expect("delete");
                lat.push(ms(t.elapsed()));
            }
            report(scenario, n, started.elapsed(), lat, vec![]);
        }
        "raw-seq" => {
            // A control for the lock's floor: the lock's node type
            // (ephemeral-sequential, under a parent) without any listing.
            let s = session(&connect).await;
            let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            s.client().create("/lock", b"", &dir).await.expect("parent");
            let seq = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let mut lat = Vec::with_capacity(n);
            let started = Instant::now();
            for _ in 0..n {
                let t = Instant::now();
                let (_, sequence) = s
                    .client()
                    .create("/lock/n-", b"", &seq)
                    .await
                    .expect("create");
                s.client()
                    .delete(&format!("/lock/n-{sequence}"), None)
                    .await
                    .expect("delete");
                lat.push(ms(t.elapsed()));
            }
            report(scenario, n, started.elapsed(), lat, vec![]);
        }
        "lock" => {
            let s = session(&connect).await;
            let lock = Mutex::new("/lock", options);
            lock.acquire(&s, None)
                .await
                .expect("warm up")
                .release()
                .await
                .expect("release");
            let mut lat = Vec::with_capacity(n);
            let started = Instant::now();
            for _ in 0..n {
                let t = Instant::now();
                let hold = lock.acquire(&s, None).await.expect("acquire");
                hold.release().await.expect("release");
                lat.push(ms(t.elapsed()));
            }
            report(scenario, n, started.elapsed(), lat, vec![]);
        }
        "contended" | "rw" => {
            let writers = if scenario == "rw" { 2 } else { sessions };
            let readers = if scenario == "rw" { 8 } else { 0 };
            // Handoff: from a release to the next grant, measured on one clock.
            let released = Arc::new(std::sync::Mutex::new(None::<Instant>));
            let mut all = Vec::new();
            for _ in 0..writers + readers {
                all.push(Arc::new(session(&connect).await));
            }
            let started = Instant::now();
            let mut tasks = Vec::new();
            for (i, s) in all.into_iter().enumerate() {
                let released = released.clone();
                let options = options.clone();
                let reader = i >= writers;
                let scenario = scenario.to_owned();
                tasks.push(tokio::spawn(async move {
                    let (mut lat, mut hand) = (Vec::with_capacity(n), Vec::new());
                    for _ in 0..n {
                        let t = Instant::now();
                        let hold = if scenario == "rw" {
                            let rw = ReadWriteLock::new("/lock", options.clone());
                            if reader {
                                rw.read(&s, None).await
                            } else {
                                rw.write(&s, None).await
                            }
                        } else {
                            Mutex::new("/lock", options.clone()).acquire(&s, None).await
                        }
                        .expect("acquire");
                        let now = Instant::now();
                        lat.push(ms(now - t));
                        if !reader {
                            if let Some(r) = released.lock().unwrap().take() {
                                hand.push(ms(now - r));
                            }
                        }
                        hold.release().await.expect("release");
                        if !reader {
                            *released.lock().unwrap() = Some(Instant::now());
                        }
                    }
                    (lat, hand, reader)
                }));
            }
            let (mut lat, mut hand) = (Vec::new(), Vec::new());
            for t in tasks {
                let (l, h, reader) = t.await.expect("task");
                // For rw, the figure of interest is the writers' acquire latency.
                if scenario != "rw" || !reader {
                    lat.extend(l);
                }
                hand.extend(h);
            }
            report(
                scenario,
                n * (writers + readers),
                started.elapsed(),
                lat,
                hand,
            );
        }
        "semaphore" => {
            let mut all = Vec::new();
            for _ in 0..sessions {
                all.push(Arc::new(session(&connect).await));
            }
            let started = Instant::now();
            let mut tasks = Vec::new();
            for s in all {
                let sem = Semaphore::new("/sem", Permits::Fixed(3), options.clone());
                tasks.push(tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(n);
                    for _ in 0..n {
                        let t = Instant::now();
                        let hold = sem.acquire(&s, 1, None).await.expect("acquire");
                        lat.push(ms(t.elapsed()));
                        hold.release().await.expect("release");
                    }
                    lat
                }));
            }
            let mut lat = Vec::new();
            for t in tasks {
                lat.extend(t.await.expect("task"));
            }
            report(scenario, n * sessions, started.elapsed(), lat, vec![]);
        }
        "many" => {
            let locks = 64;
            let mut all = Vec::new();
            for _ in 0..locks * 4 {
                all.push(Arc::new(session(&connect).await));
            }
            let started = Instant::now();
            let mut tasks = Vec::new();
            for (i, s) in all.into_iter().enumerate() {
                let options = options.clone();
                tasks.push(tokio::spawn(async move {
                    let lock = Mutex::new(format!("/lock-{}", i % locks), options);
                    let mut lat = Vec::with_capacity(n);
                    for _ in 0..n {
                        let t = Instant::now();
                        lock.acquire(&s, None)
                            .await
                            .expect("acquire")
                            .release()
                            .await
                            .expect("release");
                        lat.push(ms(t.elapsed()));
                    }
                    lat
                }));
            }
            let mut lat = Vec::new();
            for t in tasks {
                lat.extend(t.await.expect("task"));
            }
            report(scenario, n * locks * 4, started.elapsed(), lat, vec![]);
        }
        "barrier" => {
            // N participants, each its own session. N-1 enter and register;
            // then the last one enters. Release: from that last enter() call
            // until every enter() returned. Round: enter and leave of all.
            // Each leaves once all have passed, as a gang's pods leave after
            // their work: one that left at once would load the server with
            // its leave while later ones are still being released.
            let count = n;
            let mut all = Vec::new();
            for _ in 0..count {
                all.push(Arc::new(session(&connect).await));
            }
            let barrier = zkgate::zk::DoubleBarrier::new("/barrier");
            let data = zkgate::zk::BarrierData {
                participants: count as u32,
                ..Default::default()
            };
            barrier.create(&all[0], &data).await.expect("barrier node");
            let started = Instant::now();
            let all_passed = Arc::new(tokio::sync::Barrier::new(count));
            let enter = |s: Arc<Session>, i: usize| {
                let all_passed = all_passed.clone();
                tokio::spawn(async move {
                    let b = zkgate::zk::DoubleBarrier::new("/barrier");
                    let opts = zkgate::zk::EnterOptions::default();
                    b.enter(&s, &format!("p{i:05}"), &opts, None)
                        .await
                        .expect("enter");
                    let released = Instant::now();
                    all_passed.wait().await;
                    b.leave(&s, &format!("p{i:05}"), None).await.expect("leave");
                    (released, Instant::now())
                })
            };
            let mut tasks = Vec::new();
            for (i, s) in all.iter().enumerate().take(count - 1) {
                tasks.push(enter(s.clone(), i));
            }
            let observer = all[count - 1].clone();
            while observer
                .client()
                .list_children("/barrier")
                .await
                .expect("list")
                .len()
                < count - 1
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let last_enter = Instant::now();
            tasks.push(enter(observer.clone(), count - 1));
            let (mut released, mut done) = (last_enter, last_enter);
            let mut waiters = Vec::with_capacity(count);
            for t in tasks {
                let (r, d) = t.await.expect("task");
                released = released.max(r);
                done = done.max(d);
                waiters.push(ms(r.saturating_duration_since(last_enter)));
            }
            let release_ms = ms(released - last_enter);
            // Where the release goes: the last participant's own enter (its
            // round and the opening's transaction, on a server still busy
            // with the gang's arrivals), then the others' notifications.
            let opener_ms = waiters.pop().expect("the last participant");
            waiters.sort_by(f64::total_cmp);
            let waiter_p50_ms = percentile(&waiters, 0.5);
            // The floor under any release on this machine: the same N
            // sessions each watch a node that one of them then makes; from
            // the create call until every session was notified (no request
            // after the notification, no barrier logic).
            let mut watching = Vec::new();
            for s in &all {
                let (stat, watcher) = s
                    .client()
                    .check_and_watch_stat("/floor")
                    .await
                    .expect("watch");
                assert!(stat.is_none());
                watching.push(tokio::spawn(async move {
                    watcher.changed().await;
                    Instant::now()
                }));
            }
            let made = Instant::now();
            all[count - 1]
                .client()
                .create(
                    "/floor",
                    b"",
                    &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
                )
                .await
                .expect("create");
            let floor_create_ms = ms(made.elapsed());
            let mut notified = made;
            for w in watching {
                notified = notified.max(w.await.expect("task"));
            }
            let floor_ms = ms(notified - made);
            // The same floor after the same arrivals: N-1 of the sessions
            // each watch a node and register, in one pipelined round as an
            // arrival does; once N-1 registrations are listed (staged as the
            // barrier is) the last session makes the node. The barrier's
            // clock starts while this one process is still taking in the
            // arrivals' replies; the quiet floor above starts on an idle
            // one. What the barrier adds over this floor is its own logic.
            let anyone = zk::Acls::anyone_all();
            all[0]
                .client()
                .create(
                    "/arrivals",
                    b"",
                    &zk::CreateMode::Persistent.with_acls(anyone),
                )
                .await
                .expect("create");
            let mut waiting = Vec::new();
            for (i, s) in all.iter().enumerate().take(count - 1) {
                let s = s.clone();
                waiting.push(tokio::spawn(async move {
                    let client = s.client();
                    let node = format!("/arrivals/p{i:05}");
                    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
                    let watch_f = client.check_and_watch_stat("/gate");
                    let create_f = client.create(&node, b"", &ephemeral);
                    let (stat, watcher) = watch_f.await.expect("watch");
                    assert!(stat.is_none());
                    create_f.await.expect("register");
                    watcher.changed().await;
                    Instant::now()
                }));
            }
            while observer
                .client()
                .list_children("/arrivals")
                .await
                .expect("list")
                .len()
                < count - 1
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let made = Instant::now();
            observer
                .client()
                .create("/gate", b"", &zk::CreateMode::Persistent.with_acls(anyone))
                .await
                .expect("create");
            let mut notified = made;
            for w in waiting {
                notified = notified.max(w.await.expect("task"));
            }
            let loaded_floor_ms = ms(notified - made);
            println!(
                "{}",
                serde_json::json!({
                    "impl": "zkgate", "scenario": format!("barrier-{count}"), "ops": count,
                    "seconds": (done - started).as_secs_f64(), "ops_per_sec": count as f64 / (done - started).as_secs_f64(),
                    "release_ms": release_ms, "round_ms": ms(done - started), "watch_floor_ms": floor_ms,
                    "loaded_floor_ms": loaded_floor_ms,
                    "opener_ms": opener_ms, "waiter_p50_ms": waiter_p50_ms, "floor_create_ms": floor_create_ms,
                    "p50_ms": 0.0, "p99_ms": 0.0, "handoff_p50_ms": 0.0, "handoff_p99_ms": 0.0,
                })
            );
        }
        "idle" => {
            // What an idle pause costs on this machine: a ZooKeeper read
            // (exists) and a plain loopback TCP round trip, each timed back
            // to back and after 250 ms of idleness; N of each, medians.
            let s = session(&connect).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("listen");
            let addr = listener.local_addr().expect("address");
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let (mut peer, _) = listener.accept().await.expect("accept");
                let mut byte = [0u8; 1];
                while peer.read_exact(&mut byte).await.is_ok() {
                    if peer.write_all(&byte).await.is_err() {
                        break;
                    }
                }
            });
            let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            tcp.set_nodelay(true).expect("nodelay");
            let zk_trip = || async {
                let t = Instant::now();
                s.client().check_stat("/").await.expect("exists");
                ms(t.elapsed())
            };
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                percentile(&v, 0.5)
            };
            let (mut zk_busy, mut zk_idle, mut tcp_busy, mut tcp_idle) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let started = Instant::now();
            for _ in 0..n {
                tokio::time::sleep(Duration::from_millis(250)).await;
                zk_idle.push(zk_trip().await);
                zk_busy.push(zk_trip().await);
                tokio::time::sleep(Duration::from_millis(250)).await;
                tcp_idle.push(tcp_round_trip(&mut tcp).await);
                tcp_busy.push(tcp_round_trip(&mut tcp).await);
            }
            let elapsed = started.elapsed();
            println!(
                "{}",
                serde_json::json!({
                    "impl": "zkgate", "scenario": "idle", "ops": n * 4,
                    "seconds": elapsed.as_secs_f64(), "ops_per_sec": (n * 4) as f64 / elapsed.as_secs_f64(),
                    "zk_idle_ms": median(zk_idle), "zk_busy_ms": median(zk_busy),
                    "tcp_idle_ms": median(tcp_idle), "tcp_busy_ms": median(tcp_busy),
                })
            );
        }
        other => {
            eprintln!("unknown scenario {other}: raw, lock, contended, rw, many, barrier, idle");
            std::process::exit(2);
        }
    }
}
