//! Sessions against a real ZooKeeper: chroot, credentials, state.

mod support;

use std::time::Duration;

use support::{isolated_connect, session};
use zkgate::zk::{
    ConnectString, HoldState, LockOptions, Mutex, Session, SessionOptions, SessionState, ZkError,
};
use zookeeper_client as zk;

#[tokio::test]
async fn the_chroot_is_created_and_paths_live_below_it() {
    let chroot = format!("/t-{}/deeper/still", uuid::Uuid::new_v4().simple());
    let s = session(&format!("{}{chroot}", support::shared_zookeeper())).await;
    s.client()
        .create(
            "/x",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let root = session(&support::shared_zookeeper()).await;
    assert!(root
        .client()
        .check_stat(&format!("{chroot}/x"))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn digest_credentials_authenticate_the_session() {
    let connect = isolated_connect();
    let alice = Session::connect(&support::options(&connect).digest("alice", "secret"))
        .await
        .unwrap();
    let anonymous = Session::connect(&support::options(&connect)).await.unwrap();
    alice
        .client()
        .create(
            "/private",
            b"x",
            // An explicit digest ACL, as zkgate makes them: a creator ACL
            // would also admit the session's x509 identity over TLS, which
            // every client with the same certificate shares.
            &zk::CreateMode::Persistent.with_acls(alice.node_acls()),
        )
        .await
        .unwrap();
    assert_eq!(alice.client().get_data("/private").await.unwrap().0, b"x");
    assert_eq!(
        anonymous.client().get_data("/private").await.unwrap_err(),
        zk::Error::NoAuth
    );
    let again = Session::connect(&support::options(&connect).digest("alice", "secret"))
        .await
        .unwrap();
    assert!(
        again.client().get_data("/private").await.is_ok(),
        "the same credentials authenticate the same identity"
    );
}

#[tokio::test]
async fn an_unreachable_ensemble_is_reported_in_time() {
    let port = support::zookeeper::free_port();
    let connect: ConnectString = format!("127.0.0.1:{port}").parse().unwrap();
    let started = std::time::Instant::now();
    let err =
        Session::connect(&SessionOptions::new(connect).connect_timeout(Duration::from_millis(800)))
            .await
            .unwrap_err();
    assert!(matches!(err, ZkError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(&port.to_string()));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_disconnected_hold_is_suspended_and_confirmed_again_on_reconnect() {
    let root = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let proxy = support::proxy::Proxy::start(support::shared_zookeeper()).await;
    let s = support::session_with_timeout(
        &format!("{}{root}", proxy.address()),
        Duration::from_secs(10),
    )
    .await;
    let hold = Mutex::new(
        "/lock",
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    )
    .acquire(&s, None)
    .await
    .unwrap();
    let mut monitor = hold.monitor();
    let mut states = s.watch_state();

    proxy.stall();
    let next = tokio::time::timeout(Duration::from_secs(10), monitor.next())
        .await
        .expect("told at once");
    assert_eq!(
        next,
        HoldState::Suspended,
        "a disconnected hold may be lost"
    );
    assert_eq!(states.current(), SessionState::Disconnected);

    proxy.resume();
    let next = tokio::time::timeout(Duration::from_secs(10), monitor.next())
        .await
        .expect("told on reconnect");
    assert_eq!(
        next,
        HoldState::Held,
        "reconnected within the session timeout: the hold stands"
    );
    assert_eq!(states.changed().await, SessionState::Connected);
    hold.release().await.unwrap();
}

/// The connection is lost while a new session looks at its chroot (the
/// first request of a session): that is ZooKeeper not reachable yet, and
/// the session is made again, on a new connection. Failed before the fix:
/// `connect` returned the lost connection as a failed check (the chaos run
/// saw `lock run` exit 1, an internal error, for it).
#[tokio::test]
async fn a_connection_lost_at_the_chroot_check_connects_again() {
    let (_direct, through_proxy, proxy) = support::proxy::routes().await;
    let chroot = through_proxy
        .split_once('/')
        .map(|(_, c)| format!("/{c}"))
        .expect("a chroot");
    // The chroot's `exists` never reaches the server, and its connection
    // goes silent; a new connection flows.
    proxy.freeze_at(&[support::proxy::op::EXISTS], &chroot, false);
    let options = support::options(&through_proxy)
        .session_timeout(Duration::from_secs(4))
        .connect_timeout(Duration::from_secs(30));
    let s = tokio::time::timeout(Duration::from_secs(40), Session::connect(&options))
        .await
        .expect("connect ends")
        .expect("a session on a second connection");
    assert_eq!(
        proxy.freezes(),
        1,
        "the first connection was frozen at the chroot"
    );
    assert!(s.client().check_stat("/").await.unwrap().is_some());
    let _ = s.close().await;
}
