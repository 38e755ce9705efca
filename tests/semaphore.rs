//! The counting semaphore against a real ZooKeeper: never more than N
//! permits in use, arrival order, k permits at once, N changed while in
//! use, a holder's session ending, the layout Curator reads.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use support::checker::{HoldLog, Share};
use support::{children, eventually, isolated_connect, session, session_with_timeout};
use tokio::time::Instant;
use zkgate::zk::{encode_count, LockOptions, Permits, Semaphore, ZkError};
use zookeeper_client as zk;

const SEM: &str = "/sem";

fn semaphore(permits: Permits) -> Semaphore {
    Semaphore::new(
        SEM,
        permits,
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    )
}

fn secs(n: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(n))
}

/// Counts permits in use in this process: raised after an acquire
/// returns, lowered before the release is sent, so if ZooKeeper ever let
/// more than N in at once the count would show it.
#[derive(Clone, Default)]
struct InUse {
    now: Arc<AtomicU32>,
    most: Arc<AtomicU32>,
}

impl InUse {
    fn take(&self, k: u32, limit: u32) {
        let now = self.now.fetch_add(k, Ordering::SeqCst) + k;
        self.most.fetch_max(now, Ordering::SeqCst);
        assert!(
            now <= limit,
            "{now} permits in use, the semaphore has {limit}"
        );
    }
    fn give(&self, k: u32) {
        self.now.fetch_sub(k, Ordering::SeqCst);
    }
    fn most(&self) -> u32 {
        self.most.load(Ordering::SeqCst)
    }
}

/// 16 sessions × 50 acquisitions of one permit of 3, random hold times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_sessions_never_hold_more_than_n_permits() {
    let connect = isolated_connect();
    let in_use = InUse::default();
    let log = HoldLog::default();
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (connect, in_use, log) = (connect.clone(), in_use.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(i);
            let s = session(&connect).await;
            let sem = semaphore(Permits::Fixed(3));
            for _ in 0..50 {
                let hold = sem.acquire(&s, 1, secs(120)).await.expect("acquire");
                let held = log.held(
                    "/sem",
                    Share::Permits { taken: 1, of: 3 },
                    hold.fencing_token(),
                    &format!("s{i}"),
                );
                in_use.take(1, 3);
                // Longer than an admission takes, so that the permits run out.
                tokio::time::sleep(Duration::from_micros(rng.random_range(5_000..30_000))).await;
                in_use.give(1);
                held.released();
                hold.release().await.expect("release");
            }
            s.close().await.expect("close");
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        in_use.most(),
        3,
        "the permits were never all in use at once"
    );
    assert_eq!(log.len(), 800);
    log.assert_invariants();
    let s = session(&connect).await;
    assert!(children(&s, &format!("{SEM}/leases")).await.is_empty());
    assert!(children(&s, &format!("{SEM}/locks")).await.is_empty());
}

/// k permits at once, k from 1 to 3 of 4: never more than 4 in use, and
/// every acquisition completes (nobody holds some while waiting for more).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn k_permits_at_once_never_exceed_n_and_never_deadlock() {
    let connect = isolated_connect();
    let in_use = InUse::default();
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (connect, in_use) = (connect.clone(), in_use.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(100 + i);
            let s = session(&connect).await;
            let sem = semaphore(Permits::Fixed(4));
            for _ in 0..25 {
                let k = rng.random_range(1..=3u32);
                let hold = sem.acquire(&s, k, secs(120)).await.expect("acquire");
                assert_eq!(hold.nodes().len(), k as usize);
                in_use.take(k, 4);
                // A few milliseconds: long enough for holds to overlap.
                tokio::time::sleep(Duration::from_micros(rng.random_range(2_000..6_000))).await;
                in_use.give(k);
                hold.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        in_use.most(),
        4,
        "the 4 permits were never all in use at once"
    );
}

/// Waiters are served in the order they arrived.
#[tokio::test]
async fn waiters_are_served_in_arrival_order() {
    let connect = isolated_connect();
    let admin = session(&connect).await;
    let sem = semaphore(Permits::Fixed(1));
    let first = sem.acquire(&admin, 1, secs(10)).await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (connect, order) = (connect.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let s = session(&connect).await;
            let hold = semaphore(Permits::Fixed(1))
                .acquire(&s, 1, secs(30))
                .await
                .expect("acquire");
            order.lock().unwrap().push(i);
            hold.release().await.unwrap();
            s.close().await.unwrap();
        }));
        // The next arrives only once this one queued (its mutex node).
        eventually(Duration::from_secs(10), "the waiter to queue", || async {
            (children(&admin, &format!("{SEM}/locks")).await.len() == i + 1).then_some(())
        })
        .await;
    }
    first.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
}

/// More permits than the semaphore has, or none, are refused at once.
#[tokio::test]
async fn asking_for_more_permits_than_exist_is_refused() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    for wanted in [0, 3] {
        let err = semaphore(Permits::Fixed(2))
            .acquire(&s, wanted, secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ZkError::Permits { .. }), "{err}");
    }
}

/// The number of permits in a shared count node: raising it admits the
/// waiter at once (a watch, no polling); lowering it revokes nobody and
/// admits no one until the permits in use are below the new number.
#[tokio::test]
async fn changing_n_takes_effect_for_the_next_admission() {
    let connect = isolated_connect();
    let admin = session(&connect).await;
    let count = format!("{SEM}/count");
    admin
        .client()
        .mkdir(
            SEM,
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    admin
        .client()
        .create(
            &count,
            &encode_count(2),
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let shared = || semaphore(Permits::Shared(count.clone()));
    let a = shared().acquire(&admin, 1, secs(10)).await.unwrap();
    let b = shared().acquire(&admin, 1, secs(10)).await.unwrap();

    let waiter = {
        let (connect, sem) = (connect.clone(), shared());
        tokio::spawn(async move {
            let s = session(&connect).await;
            let hold = sem.acquire(&s, 1, secs(30)).await.expect("acquire");
            hold.into_registration();
            s
        })
    };
    eventually(Duration::from_secs(10), "the waiter to queue", || async {
        (children(&admin, &format!("{SEM}/locks")).await.len() == 1).then_some(())
    })
    .await;
    assert!(!waiter.is_finished());
    admin
        .client()
        .set_data(&count, &encode_count(3), None)
        .await
        .unwrap();
    let waiter_session = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("raising N admits the waiter")
        .unwrap();
    assert_eq!(children(&admin, &format!("{SEM}/leases")).await.len(), 3);

    // Lowered to 1 with 3 in use: nobody is revoked, nobody admitted.
    admin
        .client()
        .set_data(&count, &encode_count(1), None)
        .await
        .unwrap();
    let err = shared()
        .acquire(&admin, 1, Some(Instant::now() + Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    assert_eq!(children(&admin, &format!("{SEM}/leases")).await.len(), 3);
    a.release().await.unwrap();
    waiter_session.close().await.unwrap();
    let err = shared()
        .acquire(&admin, 1, Some(Instant::now() + Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ZkError::Timeout { .. }),
        "1 in use of 1: {err}"
    );
    b.release().await.unwrap();
    shared()
        .acquire(&admin, 1, secs(10))
        .await
        .expect("none in use")
        .release()
        .await
        .unwrap();
}

/// A holder whose session expires frees its permit.
#[tokio::test]
async fn a_holders_expired_session_frees_its_permit() {
    let connect = isolated_connect();
    let proxy = support::proxy::Proxy::start(support::shared_zookeeper().to_owned()).await;
    let chroot = connect.split_once('/').map(|(_, c)| c).unwrap();
    let through_proxy = format!("{}/{chroot}", proxy.address());
    let holder = session_with_timeout(&through_proxy, Duration::from_secs(2)).await;
    let sem = semaphore(Permits::Fixed(1));
    let hold = sem.acquire(&holder, 1, secs(10)).await.unwrap();
    let monitor = hold.monitor();
    proxy.stall();
    let waiter = session(&connect).await;
    let second = sem
        .acquire(&waiter, 1, secs(30))
        .await
        .expect("the expired holder's permit");
    assert!(second.fencing_token() > hold.fencing_token());
    let lost = tokio::time::timeout(Duration::from_secs(10), monitor.lost())
        .await
        .expect("the holder learns it lost the permit");
    eprintln!("holder: {lost}");
    second.release().await.unwrap();
    std::mem::forget(hold);
}

/// A hold of k permits is released in one transaction; dropping a hold
/// removes its nodes; the nodes are Curator's lease names.
#[tokio::test]
async fn k_permits_are_curator_leases_released_together() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let sem = semaphore(Permits::Fixed(5));
    let hold = sem.acquire(&s, 3, secs(10)).await.unwrap();
    let leases = children(&s, &format!("{SEM}/leases")).await;
    assert_eq!(leases.len(), 3);
    let uuid = zkgate::zk::contender::protection_id(&leases[0])
        .unwrap()
        .to_owned();
    for lease in &leases {
        assert!(
            lease.starts_with(&uuid) && lease.contains("-lease-"),
            "{lease}"
        );
    }
    hold.release().await.unwrap();
    assert!(children(&s, &format!("{SEM}/leases")).await.is_empty());

    let dropped = sem.acquire(&s, 2, secs(10)).await.unwrap();
    drop(dropped);
    eventually(
        Duration::from_secs(10),
        "a dropped hold's leases to go",
        || async {
            children(&s, &format!("{SEM}/leases"))
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
}

/// A change of mode must see a semaphore contender wherever it is. Taking
/// a permit moves a contender from `locks` (its internal lock's node,
/// queued under the lock node's version) to `leases` in one transaction
/// that checks only the count; so a look at the two that lists `leases`
/// first, then `locks`, can see neither when the move falls between, and
/// the mode changes under a holder whose lease it then deletes (found in
/// review). The look stalls just before it lists `locks`; the contender
/// moves then. Failed before the fix (`leases` listed first: "not in use").
#[tokio::test]
async fn a_contender_moving_from_locks_to_leases_is_seen_in_use() {
    use support::proxy::{op, routes};
    let (direct, through_proxy, proxy) = routes().await;
    let mover = session(&direct).await;
    let looker = session(&through_proxy).await;
    let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let lock = "/modes/sem";
    mover
        .client()
        .mkdir(&format!("{lock}/locks"), &dir)
        .await
        .unwrap();
    mover
        .client()
        .mkdir(&format!("{lock}/leases"), &dir)
        .await
        .unwrap();
    let queued = format!("{lock}/locks/_c_x-lock-0000000000");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    mover
        .client()
        .create(&queued, b"", &ephemeral)
        .await
        .unwrap();

    proxy.stall_at(&[op::GET_CHILDREN, op::GET_CHILDREN2], "sem/locks");
    let look = tokio::spawn(async move {
        let in_use =
            zkgate::zk::lock_mode::in_use(&looker, lock, &[], zkgate::zk::LockMode::Semaphore)
                .await;
        (in_use, looker)
    });
    proxy.stalled_at().await;
    // The permit taken: the lease made and the queued node gone, at once.
    let mut move_it = mover.client().new_multi_writer();
    move_it
        .add_create(
            &format!("{lock}/leases/_c_y-lease-0000000000"),
            b"",
            &ephemeral,
        )
        .unwrap();
    move_it.add_delete(&queued, None).unwrap();
    move_it.commit().await.unwrap();
    proxy.resume();
    let (in_use, looker) = tokio::time::timeout(Duration::from_secs(30), look)
        .await
        .expect("the look ends")
        .unwrap();
    assert!(
        in_use.expect("the look"),
        "a contender taking its permit as the mode change looked was not seen"
    );
    let _ = looker.close().await;
}
