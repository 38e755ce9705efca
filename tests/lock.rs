//! Exclusive lock against a real ZooKeeper: exclusion, fencing, herd
//! freedom, deadlines, cancellation, ghost nodes, lost holds.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{children, eventually, isolated_connect, session};
use tokio::time::Instant;
use zkgate::zk::{HoldState, LockOptions, LossReason, Mutex, ZkError};
use zookeeper_client as zk;

const LOCK: &str = "/lock";

fn mutex() -> Mutex {
    Mutex::new(
        LOCK,
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    )
}

fn secs(n: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_sessions_never_overlap_and_tokens_increase() {
    let connect = isolated_connect();
    let held = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (connect, held, tokens) = (connect.clone(), held.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let s = session(&connect).await;
            let lock = mutex();
            for _ in 0..50 {
                let hold = lock.acquire(&s, secs(60)).await.expect("acquire");
                assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                tokens.lock().unwrap().push(hold.fencing_token());
                // A few milliseconds: long enough for a second holder to show.
                tokio::time::sleep(Duration::from_millis(2)).await;
                held.store(false, Ordering::SeqCst);
                hold.release().await.expect("release");
            }
            s.close().await.expect("close");
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let tokens = std::mem::take(&mut *tokens.lock().unwrap());
    assert_eq!(tokens.len(), 800);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens must strictly increase in acquisition order"
    );
    let s = session(&connect).await;
    assert!(children(&s, LOCK).await.is_empty(), "no node left behind");
}

#[tokio::test]
async fn a_release_wakes_only_the_next_waiter() {
    let connect = isolated_connect();
    let holder = session(&connect).await;
    let lock = mutex();
    let hold = lock.acquire(&holder, None).await.unwrap();
    let mut waiters = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..10 {
        sessions.push(Arc::new(session(&connect).await));
    }
    for s in &sessions {
        let s = s.clone();
        waiters.push(tokio::spawn(async move {
            let lock = mutex();
            let hold = lock.acquire(&s, secs(60)).await.expect("acquire");
            let token = hold.fencing_token();
            // Keep holding until the test ends: only one waiter gets through.
            std::mem::forget(hold);
            token
        }));
    }
    // Queued is not enough: wait until every waiter has set its watch.
    let chroot = support::chroot_of(&connect);
    eventually(Duration::from_secs(10), "10 waiters watching", || async {
        (children(&holder, LOCK).await.len() == 11
            && support::watches_under(&format!("{chroot}{LOCK}/")) == 10)
            .then_some(())
    })
    .await;
    let wakeups = |sessions: &Vec<Arc<zkgate::zk::Session>>| {
        sessions
            .iter()
            .map(|s| s.stats().watch_wakeups())
            .sum::<u64>()
    };
    assert_eq!(wakeups(&sessions), 0);
    hold.release().await.unwrap();
    eventually(Duration::from_secs(10), "one waiter to acquire", || async {
        waiters.iter().any(|w| w.is_finished()).then_some(())
    })
    .await;
    assert_eq!(waiters.iter().filter(|w| w.is_finished()).count(), 1);
    assert_eq!(
        wakeups(&sessions),
        1,
        "a release must wake exactly one waiter"
    );
    for w in waiters {
        w.abort();
    }
}

#[tokio::test]
async fn a_deadline_or_a_cancel_leaves_no_node() {
    let connect = isolated_connect();
    let holder = session(&connect).await;
    let waiter = session(&connect).await;
    let lock = mutex();
    let hold = lock.acquire(&holder, None).await.unwrap();

    let started = Instant::now();
    let err = lock
        .acquire(&waiter, Some(Instant::now() + Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        children(&holder, LOCK).await.len(),
        1,
        "the timed-out waiter removed its node"
    );

    // Cancel: drop the acquire future while it waits.
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), lock.acquire(&waiter, None)).await;
    assert!(cancelled.is_err());
    eventually(
        Duration::from_secs(5),
        "the cancelled waiter's node to go",
        || async { (children(&holder, LOCK).await.len() == 1).then_some(()) },
    )
    .await;
    hold.release().await.unwrap();
    assert!(children(&holder, LOCK).await.is_empty());
}

#[tokio::test]
async fn the_node_of_a_create_whose_reply_was_lost_is_found_again() {
    let root = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let proxy = support::proxy::Proxy::start(support::shared_zookeeper()).await;
    let s = session(&format!("{}{root}", proxy.address())).await;
    let lock = mutex();
    // Make the lock node first so the cut create is the contender's.
    let first = lock.acquire(&s, secs(10)).await.unwrap();
    first.release().await.unwrap();

    proxy.cut_after_next_create();
    let hold = lock
        .acquire(&s, secs(20))
        .await
        .expect("acquire across a lost create reply");
    assert_eq!(
        proxy.cuts(),
        1,
        "the proxy cut the connection after the create"
    );
    let direct = session(&format!("{}{root}", support::shared_zookeeper())).await;
    let nodes = children(&direct, LOCK).await;
    assert_eq!(
        nodes.len(),
        1,
        "exactly one contender node, not a ghost plus a retry: {nodes:?}"
    );
    assert_eq!(format!("{LOCK}/{}", nodes[0]), hold.path());
    let (_, stat) = direct.client().get_data(hold.path()).await.unwrap();
    assert_eq!(stat.ephemeral_owner, s.id());
    assert_eq!(stat.czxid, hold.fencing_token());
    hold.release().await.unwrap();
}

#[tokio::test]
async fn session_expiry_hands_the_lock_on_and_tells_the_old_holder() {
    let root = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let proxy = support::proxy::Proxy::start(support::shared_zookeeper()).await;
    // The holder reaches ZooKeeper through a proxy the test can stall.
    let a = support::session_with_timeout(
        &format!("{}{root}", proxy.address()),
        Duration::from_secs(2),
    )
    .await;
    let b = Arc::new(session(&format!("{}{root}", support::shared_zookeeper())).await);
    let lock = mutex();
    let hold = lock.acquire(&a, None).await.unwrap();
    let mut monitor = hold.monitor();
    assert_eq!(monitor.state(), HoldState::Held);

    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            mutex()
                .acquire(&b, secs(30))
                .await
                .map(|h| h.fencing_token())
        }
    });
    eventually(Duration::from_secs(5), "the waiter queued", || async {
        (children(&b, LOCK).await.len() == 2).then_some(())
    })
    .await;

    // Cut the holder off past its session timeout: the server expires it.
    proxy.stall();
    let lost = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let HoldState::Lost(reason) = monitor.next().await {
                return reason;
            }
        }
    })
    .await
    .expect("the old holder is told");
    assert!(
        matches!(
            lost,
            LossReason::SessionExpired | LossReason::PresumedExpired
        ),
        "{lost:?}"
    );
    let token = waiter
        .await
        .unwrap()
        .expect("the waiter gets the lock once the holder's session expired");
    assert!(token > hold.fencing_token());
    proxy.resume();
    let reason = tokio::time::timeout(Duration::from_secs(20), hold.lost())
        .await
        .expect("still lost after reconnecting");
    assert!(
        matches!(
            reason,
            LossReason::SessionExpired | LossReason::PresumedExpired
        ),
        "{reason:?}"
    );
}

#[tokio::test]
async fn a_revoked_hold_is_reported_and_release_says_so() {
    let connect = isolated_connect();
    let holder = session(&connect).await;
    let admin = session(&connect).await;
    let lock = mutex();
    let hold = lock.acquire(&holder, None).await.unwrap();
    let lost = hold.lost();
    let revoke = async {
        admin.client().delete(hold.path(), None).await.unwrap();
    };
    let (reason, ()) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(5), lost)
                .await
                .unwrap()
        },
        revoke
    );
    assert_eq!(reason, LossReason::Revoked);
    let err = hold.release().await.unwrap_err();
    assert!(matches!(err, ZkError::NodeRemoved { .. }), "{err}");
}

#[tokio::test]
async fn kazoo_contenders_are_queued_behind() {
    let connect = isolated_connect();
    let kazoo = session(&connect).await;
    let s = session(&connect).await;
    kazoo
        .client()
        .mkdir(
            LOCK,
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let (_, seq) = kazoo
        .client()
        .create(
            &format!("{LOCK}/0123abcd__lock__"),
            b"",
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    // Foreign children are ignored, not waited for.
    kazoo
        .client()
        .create(
            &format!("{LOCK}/notes"),
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let lock = mutex();
    let err = lock
        .acquire(&s, Some(Instant::now() + Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    kazoo
        .client()
        .delete(&format!("{LOCK}/0123abcd__lock__{seq}"), None)
        .await
        .unwrap();
    let hold = lock
        .acquire(&s, secs(5))
        .await
        .expect("acquire after kazoo released");
    hold.release().await.unwrap();
}

#[tokio::test]
async fn a_persistent_hold_outlives_its_process_and_is_released_later() {
    let connect = isolated_connect();
    let first = session(&connect).await;
    let lock = Mutex::new(
        LOCK,
        LockOptions {
            persistent: true,
            create_parent: true,
            data: b"pod-0".to_vec(),
            check: None,
        },
    );
    let registration = lock
        .acquire(&first, None)
        .await
        .unwrap()
        .into_registration();
    first.close().await.unwrap();

    let other = session(&connect).await;
    let err = mutex()
        .acquire(&other, Some(Instant::now() + Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ZkError::Timeout { .. }),
        "still held after its process ended: {err}"
    );
    let later = session(&connect).await;
    registration.release(&later).await.unwrap();
    let hold = mutex().acquire(&other, secs(5)).await.unwrap();
    assert!(hold.fencing_token() > registration.fencing_token);
}

#[tokio::test]
async fn a_missing_lock_node_is_reported_not_created() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let err = Mutex::new("/nope", LockOptions::default())
        .acquire(&s, secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ZkError::Deleted { .. }), "{err}");
    assert!(children(&s, "/").await.is_empty());
}

#[tokio::test]
async fn closing_a_session_removes_its_nodes_at_once() {
    let connect = isolated_connect();
    let s = session_with_long_timeout(&connect).await;
    let observer = session(&connect).await;
    let hold = mutex().acquire(&s, None).await.unwrap();
    std::mem::forget(hold);
    let started = Instant::now();
    s.close().await.unwrap();
    assert!(
        children(&observer, LOCK).await.is_empty(),
        "ephemeral node gone when close returns"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

async fn session_with_long_timeout(connect: &str) -> zkgate::zk::Session {
    support::session_with_timeout(connect, Duration::from_secs(30)).await
}

#[tokio::test]
async fn a_restarted_holder_adopts_its_persistent_registration() {
    let connect = isolated_connect();
    let options = LockOptions {
        persistent: true,
        create_parent: true,
        data: br#"{"pod":"p","podUid":"u1"}"#.to_vec(),
        check: None,
    };
    let first = session(&connect).await;
    let before = Mutex::new(LOCK, options.clone())
        .acquire(&first, secs(5))
        .await
        .unwrap()
        .into_registration();
    first.close().await.unwrap();
    let second = session(&connect).await;
    let again = Mutex::new(LOCK, options)
        .acquire(&second, secs(5))
        .await
        .expect("adopts, does not queue behind itself");
    assert_eq!(again.path(), before.path);
    assert_eq!(again.fencing_token(), before.fencing_token);
    assert_eq!(children(&second, LOCK).await.len(), 1);
    again.release().await.unwrap();
}

/// Review of issue 44, item 3: a contender queues on condition that the
/// lock node's data (its mode) is what it read. A lock node deleted and
/// made again (the LockLease deleted and re-created with another mode)
/// starts its data version over at 0, so the version alone passes.
/// Failed before the fix: the contender held under the new node, by the
/// rules of the old one.
#[tokio::test]
async fn a_contender_does_not_queue_under_a_lock_node_made_again() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let lock = "/made-again";
    s.client().create(lock, b"old rules", &open).await.unwrap();
    let (_, read) = s.client().get_data(lock).await.unwrap();
    s.client().delete(lock, None).await.unwrap();
    s.client().create(lock, b"new rules", &open).await.unwrap();
    let (_, now) = s.client().get_data(lock).await.unwrap();
    assert_eq!(now.version, read.version, "the version alone cannot tell");
    let contender = Mutex::new(
        lock,
        LockOptions {
            check: Some(zkgate::zk::VersionCheck {
                path: lock.to_owned(),
                version: read.version,
                czxid: read.czxid,
            }),
            ..LockOptions::default()
        },
    );
    let err = contender
        .acquire(&s, Some(Instant::now() + Duration::from_secs(10)))
        .await
        .expect_err("no hold under rules nobody read");
    assert!(matches!(err, ZkError::Changed { .. }), "{err:?}");
    assert!(children(&s, lock).await.is_empty(), "our node is gone");
}
