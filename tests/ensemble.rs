//! A 3-node ensemble on loopback: the leader is SIGKILLed while (a) 8
//! sessions contend for a lock, (b) 20 participants enter and leave a
//! barrier, (c) sessions mix reads and writes on a read/write lock, (d) 8
//! sessions take permits of a semaphore of 3. Every
//! operation completes, the hold log shows no conflicting overlap and
//! fencing tokens order every writer, and the killed server comes back.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::checker::{HoldLog, Share};
use support::{children, eventually, Ensemble};
use tokio::time::Instant;
use zkgate::zk::{
    BarrierData, DoubleBarrier, EnterOptions, LockOptions, Mutex, Permits, ReadWriteLock,
    Semaphore, Session, ZkError,
};

const SESSION_TIMEOUT: Duration = Duration::from_secs(15);

fn options() -> LockOptions {
    LockOptions {
        create_parent: true,
        ..LockOptions::default()
    }
}

fn within(secs: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(secs))
}

async fn start_ensemble() -> (Ensemble, String) {
    let ensemble = tokio::task::spawn_blocking(Ensemble::start).await.unwrap();
    let connect = format!("{}/ensemble", ensemble.connect_string());
    (ensemble, connect)
}

/// SIGKILLs the current leader; returns its index.
fn kill_leader(ensemble: &mut Ensemble) -> usize {
    let leader = ensemble.leader().expect("a leader");
    ensemble.servers[leader].kill();
    leader
}

/// Waits for every task (each must finish, none may panic), then restarts
/// the killed server and waits until it serves again.
async fn finish_and_restart(
    mut ensemble: Ensemble,
    killed: usize,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(180), t)
            .await
            .expect("every session finishes")
            .expect("no panic");
    }
    tokio::task::spawn_blocking(move || {
        ensemble.servers[killed].restart();
        ensemble.servers[killed].wait_serving(Duration::from_secs(60));
    })
    .await
    .unwrap();
}

/// Kills the leader once a third of the 240 operations counted by `done`
/// are done, waits for the rest; returns how many were done at the kill.
async fn kill_leader_a_third_in(
    mut ensemble: Ensemble,
    done: &AtomicUsize,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> usize {
    eventually(Duration::from_secs(90), "a third of the work", || async {
        (done.load(Ordering::SeqCst) >= 80).then_some(())
    })
    .await;
    let killed = kill_leader(&mut ensemble);
    let killed_at = done.load(Ordering::SeqCst);
    finish_and_restart(ensemble, killed, tasks).await;
    killed_at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_keeps_exclusion_and_everyone_finishes() {
    let (ensemble, connect) = start_ensemble().await;
    let log = HoldLog::default();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (connect, log, done) = (connect.clone(), log.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let s = support::session_with_timeout(&connect, SESSION_TIMEOUT).await;
            let lock = Mutex::new("/lock", options());
            for _ in 0..30 {
                let hold = lock.acquire(&s, within(90)).await.expect("acquire");
                let held = log.held(
                    "/lock",
                    Share::Exclusive,
                    hold.fencing_token(),
                    &format!("s{n}"),
                );
                // A few milliseconds: long enough for an overlap to show.
                tokio::time::sleep(Duration::from_millis(3)).await;
                held.released();
                match hold.release().await {
                    // A release retried across the leader kill that finds
                    // its node gone cannot be told from a revocation (none
                    // happens here): reported as lost, as it must be.
                    Ok(()) | Err(ZkError::NodeRemoved { .. }) => {}
                    Err(e) => panic!("release: {e}"),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            s.close().await.ok();
        }));
    }
    let killed_at = kill_leader_a_third_in(ensemble, &done, tasks).await;
    assert!(
        done.load(Ordering::SeqCst) == 240 && killed_at < 240,
        "work went on after the leader died"
    );
    assert_eq!(log.len(), 240);
    log.assert_invariants();
}

/// Issue 15: the leader dies while 8 sessions take permits of a semaphore
/// of 3; everyone finishes, and no moment saw more than 3 holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_during_semaphore_contention_keeps_at_most_n_holders() {
    let (ensemble, connect) = start_ensemble().await;
    let log = HoldLog::default();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (connect, log, done) = (connect.clone(), log.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let s = support::session_with_timeout(&connect, SESSION_TIMEOUT).await;
            let sem = Semaphore::new("/sem", Permits::Fixed(3), options());
            for _ in 0..30 {
                let hold = sem.acquire(&s, 1, within(90)).await.expect("acquire");
                // From after the grant to before the release is sent: if
                // the server ever let a fourth in, intervals would overlap.
                let held = log.held(
                    "/sem",
                    Share::Permits { taken: 1, of: 3 },
                    hold.fencing_token(),
                    &format!("s{n}"),
                );
                // Longer than an admission (a quorum write or two), so that
                // the permits run out.
                tokio::time::sleep(Duration::from_millis(25)).await;
                held.released();
                match hold.release().await {
                    Ok(()) | Err(ZkError::NodeRemoved { .. }) => {}
                    Err(e) => panic!("release: {e}"),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            s.close().await.ok();
        }));
    }
    let killed_at = kill_leader_a_third_in(ensemble, &done, tasks).await;
    assert!(killed_at < 240 && done.load(Ordering::SeqCst) == 240);
    assert_eq!(log.len(), 240);
    log.assert_invariants();
    assert_eq!(
        log.most_at_once("/sem"),
        3,
        "the semaphore never had all 3 permits in use"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_during_a_read_write_mix_keeps_writers_exclusive() {
    let (ensemble, connect) = start_ensemble().await;
    let log = HoldLog::default();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (connect, log, done) = (connect.clone(), log.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let s = support::session_with_timeout(&connect, SESSION_TIMEOUT).await;
            let lock = ReadWriteLock::new("/rw", options());
            for round in 0..30 {
                // Two writers in eight, rotating, so readers pile up behind
                // writers and share among themselves.
                let write = (n + round) % 4 == 0;
                let (hold, share) = if write {
                    (
                        lock.write(&s, within(90)).await.expect("write"),
                        Share::Exclusive,
                    )
                } else {
                    (lock.read(&s, within(90)).await.expect("read"), Share::Read)
                };
                let held = log.held("/rw", share, hold.fencing_token(), &format!("s{n}"));
                tokio::time::sleep(Duration::from_millis(3)).await;
                held.released();
                match hold.release().await {
                    // A release retried across the leader kill that finds
                    // its node gone cannot be told from a revocation (none
                    // happens here): reported as lost, as it must be.
                    Ok(()) | Err(ZkError::NodeRemoved { .. }) => {}
                    Err(e) => panic!("release: {e}"),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            s.close().await.ok();
        }));
    }
    let killed_at = kill_leader_a_third_in(ensemble, &done, tasks).await;
    assert!(
        done.load(Ordering::SeqCst) == 240 && killed_at < 240,
        "work went on after the leader died"
    );
    log.assert_invariants();
    assert!(
        log.most_at_once("/rw") >= 2,
        "readers never overlapped: the read/write lock behaved as exclusive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_while_20_participants_enter_opens_only_with_all_and_loses_none() {
    const X: u32 = 20;
    let (mut ensemble, connect) = start_ensemble().await;
    let observer = support::session_with_timeout(&connect, SESSION_TIMEOUT).await;
    let barrier = DoubleBarrier::new("/gang");
    let data = BarrierData {
        participants: X,
        ..BarrierData::default()
    };
    barrier
        .create(&observer, &data)
        .await
        .expect("create the barrier");
    // Participants leave only once all 20 have passed `enter`, so a passed
    // participant can check that `ready` came after all 20 registrations.
    let passed = Arc::new(tokio::sync::Barrier::new(X as usize));
    let participant = |n: u32| {
        let (connect, passed) = (connect.clone(), passed.clone());
        tokio::spawn(async move {
            let s: Session = support::session_with_timeout(&connect, SESSION_TIMEOUT).await;
            let id = format!("p{n:02}");
            let barrier = DoubleBarrier::new("/gang");
            let entered = barrier
                .enter(&s, &id, &EnterOptions::default(), within(120))
                .await
                .expect("enter");
            assert_eq!(entered.participants, X);
            // By ZooKeeper's order: `ready` made after all 20 registrations
            // (all still there: nobody leaves before all passed).
            let ids: Vec<String> = (0..X).map(|n| format!("p{n:02}")).collect();
            support::order::assert_opened_after_all(&s, "/gang", &ids).await;
            passed.wait().await;
            barrier.leave(&s, &id, within(120)).await.expect("leave");
            let (left, _) = barrier
                .participants(&s)
                .await
                .expect("list")
                .expect("barrier");
            assert!(left.is_empty(), "{id} left while {left:?} remain");
            s.close().await.ok();
        })
    };
    // The leader dies with part of the gang registered; the rest register
    // while the ensemble elects a new one.
    let mut tasks: Vec<_> = (0..12).map(participant).collect();
    eventually(Duration::from_secs(60), "12 registered", || async {
        (children(&observer, "/gang").await.len() >= 12).then_some(())
    })
    .await;
    let killed = kill_leader(&mut ensemble);
    tasks.extend((12..X).map(participant));
    finish_and_restart(ensemble, killed, tasks).await;
    assert!(
        children(&observer, "/gang")
            .await
            .iter()
            .all(|c| c == "ready"),
        "no registration left behind"
    );
}

#[test]
#[should_panic(expected = "held at once")]
fn the_checker_catches_a_writer_overlapping_a_reader() {
    let log = HoldLog::default();
    let reader = log.held("/rw", Share::Read, 1, "r");
    let writer = log.held("/rw", Share::Exclusive, 2, "w");
    writer.released();
    reader.released();
    log.assert_invariants();
}

#[test]
#[should_panic(expected = "4 permits held at once of 3")]
fn the_checker_catches_more_permits_than_a_semaphore_has() {
    let log = HoldLog::default();
    let holds: Vec<_> = (0..4)
        .map(|i| {
            log.held(
                "/s",
                Share::Permits { taken: 1, of: 3 },
                i,
                &format!("h{i}"),
            )
        })
        .collect();
    for h in holds {
        h.released();
    }
    log.assert_invariants();
}

#[test]
#[should_panic(expected = "is not below")]
fn the_checker_catches_a_token_that_goes_backwards() {
    let log = HoldLog::default();
    log.held("/lock", Share::Exclusive, 7, "a").released();
    log.held("/lock", Share::Exclusive, 5, "b").released();
    log.assert_invariants();
}

#[test]
fn the_checker_lets_readers_share_in_any_token_order() {
    let log = HoldLog::default();
    let first = log.held("/rw", Share::Read, 9, "r1");
    log.held("/rw", Share::Read, 3, "r2").released();
    first.released();
    log.held("/rw", Share::Exclusive, 10, "w").released();
    log.assert_invariants();
}

/// The order check of the barrier tests (here, in soak.rs and e2e.rs)
/// catches a `ready` made before the last registration, which a listing
/// taken once everyone passed cannot tell from a correct opening.
#[tokio::test]
#[should_panic(expected = "the barrier opened without them")]
async fn the_order_check_catches_a_barrier_opened_before_its_last_registration() {
    let s = support::session(&support::isolated_connect()).await;
    let path = "/early";
    support::barrier_made(&s, path, 2).await;
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for node in ["p0", "ready", "p1"] {
        s.client()
            .create(&format!("{path}/{node}"), b"", &persistent)
            .await
            .unwrap();
    }
    assert_eq!(children(&s, path).await, ["p0", "p1", "ready"]);
    support::order::assert_opened_after_all(&s, path, &["p0".into(), "p1".into()]).await;
}
