//! A 3-node ensemble on loopback: the leader is killed while 8 sessions
//! contend for a lock; exclusion holds and every session finishes.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{eventually, Ensemble};
use tokio::time::Instant;
use zkgate::zk::{LockOptions, Mutex};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_keeps_exclusion_and_everyone_finishes() {
    let mut ensemble = tokio::task::spawn_blocking(Ensemble::start).await.unwrap();
    let connect = format!("{}/ensemble", ensemble.connect_string());
    let held = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (connect, held, done, tokens) =
            (connect.clone(), held.clone(), done.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let s = support::session_with_timeout(&connect, Duration::from_secs(15)).await;
            let lock = Mutex::new(
                "/lock",
                LockOptions {
                    create_parent: true,
                    ..LockOptions::default()
                },
            );
            for _ in 0..30 {
                let hold = lock
                    .acquire(&s, Some(Instant::now() + Duration::from_secs(90)))
                    .await
                    .expect("acquire");
                assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                tokens.lock().unwrap().push(hold.fencing_token());
                tokio::time::sleep(Duration::from_millis(1)).await;
                held.store(false, Ordering::SeqCst);
                hold.release().await.expect("release");
                done.fetch_add(1, Ordering::SeqCst);
            }
            s.close().await.ok();
        }));
    }
    eventually(
        Duration::from_secs(60),
        "a third of the work done",
        || async { (done.load(Ordering::SeqCst) >= 80).then_some(()) },
    )
    .await;
    let leader = ensemble.leader().expect("a leader");
    ensemble.servers[leader].kill();
    let killed_at = done.load(Ordering::SeqCst);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(180), t)
            .await
            .expect("every session finishes")
            .expect("no panic");
    }
    assert!(
        done.load(Ordering::SeqCst) == 240 && killed_at < 240,
        "work went on after the leader died"
    );
    let increasing = tokens.lock().unwrap().windows(2).all(|w| w[0] < w[1]);
    assert!(increasing, "fencing tokens strictly increase");
    // The killed server comes back and catches up.
    tokio::task::spawn_blocking(move || {
        ensemble.servers[leader].restart();
        ensemble.servers[leader].wait_serving(Duration::from_secs(60));
    })
    .await
    .unwrap();
}
