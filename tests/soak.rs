//! The soak: random barriers and locks on a 3-node ensemble while the
//! leader is SIGKILLed at random moments and restarted. At the end, every
//! operation has completed, the hold log shows no conflicting overlap and
//! fencing tokens order every writer, and every barrier round opened with
//! all its participants registered and closed with none left.
//!
//! `ZKGATE_SOAK_SECS` sets how long it runs (default 20 s, the CI
//! version); `ZKGATE_SOAK_SEED` replays a run's random choices (timing
//! still varies). The long run, from docs/src/contributing.md:
//! `ZKGATE_SOAK_SECS=300 cargo nextest run --test soak --no-capture`.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use support::checker::{HoldLog, Share};
use support::{children, Ensemble};
use tokio::time::Instant;
use zkgate::zk::{
    BarrierData, DoubleBarrier, EnterOptions, LockOptions, Mutex, ReadWriteLock, Session, ZkError,
};

/// Releases that could not be confirmed (retried across a leader kill).
static UNCONFIRMED: AtomicUsize = AtomicUsize::new(0);

const SESSION_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one operation may take, leader elections included.
const OPERATION: Duration = Duration::from_secs(90);
const LOCK_WORKERS: usize = 6;
const MUTEXES: [&str; 2] = ["/locks/m0", "/locks/m1"];
const RW_LOCK: &str = "/locks/rw";

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn lock_options() -> LockOptions {
    LockOptions {
        create_parent: true,
        ..LockOptions::default()
    }
}

/// One lock worker: random mutexes and read/write holds until `until`.
async fn lock_worker(connect: String, n: usize, seed: u64, until: Instant, log: HoldLog) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let s = support::session_with_timeout(&connect, SESSION_TIMEOUT).await;
    let me = format!("worker{n}");
    let mut ops = 0;
    while Instant::now() < until {
        let deadline = Some(Instant::now() + OPERATION);
        let pick = rng.random_range(0..4);
        let (lock, share, hold) = match pick {
            0 | 1 => {
                let path = MUTEXES[pick];
                let hold = Mutex::new(path, lock_options()).acquire(&s, deadline).await;
                (path, Share::Exclusive, hold)
            }
            2 => {
                let hold = ReadWriteLock::new(RW_LOCK, lock_options())
                    .read(&s, deadline)
                    .await;
                (RW_LOCK, Share::Read, hold)
            }
            _ => {
                let hold = ReadWriteLock::new(RW_LOCK, lock_options())
                    .write(&s, deadline)
                    .await;
                (RW_LOCK, Share::Exclusive, hold)
            }
        };
        let hold = hold.unwrap_or_else(|e| panic!("{me}: acquiring {lock}: {e}"));
        let held = log.held(lock, share, hold.fencing_token(), &me);
        // At least a few milliseconds: long enough for an overlap to show.
        tokio::time::sleep(Duration::from_millis(rng.random_range(2..15))).await;
        held.released();
        match hold.release().await {
            Ok(()) => {}
            // Nothing revokes in the soak: a release retried across a
            // leader kill that finds its node gone was our own first
            // attempt. The library cannot tell that from a revocation and
            // must report the hold as lost; the hold ended here either way,
            // and the checker still sees every interval.
            Err(ZkError::NodeRemoved { .. }) => {
                UNCONFIRMED.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => panic!("{me}: releasing {lock}: {e}"),
        }
        ops += 1;
    }
    s.close().await.ok();
    ops
}

/// One barrier round: `x` participants enter `/barriers/r<round>`, each
/// checks by ZooKeeper's order that the barrier opened after all `x`
/// registrations once it passes, then all leave.
async fn barrier_round(sessions: &[Arc<Session>], round: usize, x: usize) {
    let path = format!("/barriers/r{round}");
    let data = BarrierData {
        participants: x as u32,
        ..BarrierData::default()
    };
    DoubleBarrier::new(&path)
        .create(&sessions[0], &data)
        .await
        .unwrap_or_else(|e| panic!("creating {path}: {e}"));
    let passed = Arc::new(tokio::sync::Barrier::new(x));
    let tasks: Vec<_> = sessions[..x]
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let (s, path, passed) = (s.clone(), path.clone(), passed.clone());
            tokio::spawn(async move {
                let barrier = DoubleBarrier::new(&path);
                let id = format!("p{n}");
                let deadline = Some(Instant::now() + OPERATION);
                barrier
                    .enter(&s, &id, &EnterOptions::default(), deadline)
                    .await
                    .unwrap_or_else(|e| panic!("{path} {id}: enter: {e}"));
                // Nobody leaves before all passed: every registration is
                // still there, and ZooKeeper's order says whether `ready`
                // came after all of them.
                let ids: Vec<String> = (0..x).map(|n| format!("p{n}")).collect();
                support::order::assert_opened_after_all(&s, &path, &ids).await;
                passed.wait().await;
                barrier
                    .leave(&s, &id, deadline)
                    .await
                    .unwrap_or_else(|e| panic!("{path} {id}: leave: {e}"));
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("no panic");
    }
    let left = children(&sessions[0], &path).await;
    assert!(
        left.iter().all(|c| c == "ready"),
        "{path}: {left:?} left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_random_barriers_and_locks_through_random_leader_kills() {
    let secs = env_u64("ZKGATE_SOAK_SECS").unwrap_or(20);
    let seed = env_u64("ZKGATE_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    println!("soak: {secs} s, ZKGATE_SOAK_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ensemble = tokio::task::spawn_blocking(Ensemble::start).await.unwrap();
    let connect = format!("{}/soak", ensemble.connect_string());
    let until = Instant::now() + Duration::from_secs(secs);
    let log = HoldLog::default();

    let workers: Vec<_> = (0..LOCK_WORKERS)
        .map(|n| {
            tokio::spawn(lock_worker(
                connect.clone(),
                n,
                rng.random(),
                until,
                log.clone(),
            ))
        })
        .collect();

    let rounds = Arc::new(AtomicUsize::new(0));
    let barriers = {
        let (connect, rounds, seed) = (connect.clone(), rounds.clone(), rng.random::<u64>());
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut sessions = Vec::new();
            for _ in 0..8 {
                sessions.push(Arc::new(
                    support::session_with_timeout(&connect, SESSION_TIMEOUT).await,
                ));
            }
            while Instant::now() < until {
                let round = rounds.load(Ordering::SeqCst);
                barrier_round(&sessions, round, rng.random_range(2..=8)).await;
                rounds.fetch_add(1, Ordering::SeqCst);
            }
        })
    };

    // The killer: one server down at a time, so a quorum always remains.
    let mut kills = 0;
    loop {
        let pause = Duration::from_millis(rng.random_range(1_500..5_000));
        if Instant::now() + pause >= until {
            break;
        }
        tokio::time::sleep(pause).await;
        let Some(leader) = ensemble.leader() else {
            continue; // mid-election: try again later
        };
        ensemble.servers[leader].kill();
        kills += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..3_000))).await;
        ensemble = tokio::task::spawn_blocking(move || {
            ensemble.servers[leader].restart();
            ensemble.servers[leader].wait_serving(Duration::from_secs(60));
            ensemble
        })
        .await
        .unwrap();
    }

    let mut holds = 0;
    for w in workers {
        holds += tokio::time::timeout(OPERATION * 2, w)
            .await
            .expect("every lock worker finishes")
            .expect("no panic");
    }
    tokio::time::timeout(OPERATION * 2, barriers)
        .await
        .expect("the barrier rounds finish")
        .expect("no panic");
    let rounds = rounds.load(Ordering::SeqCst);
    log.assert_invariants();
    println!(
        "soak: {secs} s, {kills} leader kills, {holds} lock holds ({} releases unconfirmed), {rounds} barrier rounds, no violations (seed {seed})",
        UNCONFIRMED.load(Ordering::Relaxed)
    );
    assert!(kills >= 1, "the soak killed no leader");
    assert!(holds > 0 && rounds > 0, "the soak did no work");
}
