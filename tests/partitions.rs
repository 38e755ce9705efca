//! Partitions inside the ensemble: a holder connected to a follower whose
//! quorum link to the leader is cut. The leader stops hearing the holder's
//! session and expires it while the follower, until it notices the lost
//! leader (`syncLimit` × `tickTime`, here longer than the session
//! timeout), keeps answering the holder's reads from its own copy. A hold
//! must never be taken as confirmed by such an answer.
//!
//! Needs root and iptables (the links are cut with packet rules on their
//! loopback ports); a machine without them fails the test with the reason.

mod support;

use std::time::Duration;

use support::zookeeper::{Cut, EnsembleConfig};
use support::{session_with_timeout, Ensemble};
use tokio::time::Instant;
use zkgate::zk::{HoldState, LockOptions, Mutex};

/// The holder's session timeout: shorter than the follower's window.
const SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// Followers notice a lost leader only after 10 s (20 ticks of 500 ms),
/// as with ZooKeeper's defaults (5 ticks of 2 s) against a 4 s session.
fn slow_to_notice() -> EnsembleConfig {
    EnsembleConfig {
        tick: Duration::from_millis(500),
        sync_limit: 20,
    }
}

async fn ensemble() -> Ensemble {
    if let Err(why) = Cut::available() {
        panic!("this test cuts links between ZooKeeper servers: {why}");
    }
    tokio::task::spawn_blocking(|| Ensemble::start_with(slow_to_notice()))
        .await
        .unwrap()
}

fn mutex() -> Mutex {
    Mutex::new(
        "/lock",
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    )
}

/// Issue 24, item 1: a holder whose follower is cut from the leader is told
/// its hold is lost before another session (on the leader's side) can
/// acquire the lock.
#[tokio::test]
async fn a_holder_on_a_follower_cut_from_its_leader_gives_up_before_another_acquires() {
    let ensemble = ensemble().await;
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let leader = ensemble.leader().expect("a leader");
    let follower = (leader + 1) % 3;
    let on_follower = format!("{}{chroot}", ensemble.servers[follower].address());
    let on_leader = format!("{}{chroot}", ensemble.servers[leader].address());

    let a = session_with_timeout(&on_follower, SESSION_TIMEOUT).await;
    let b = session_with_timeout(&on_leader, SESSION_TIMEOUT).await;
    let hold = mutex().acquire(&a, None).await.expect("a acquires");
    let mut monitor = hold.monitor();
    assert_eq!(monitor.state(), HoldState::Held);

    let cut = ensemble.cut_from_leader(follower);
    let cut_at = Instant::now();
    let b_acquired = tokio::spawn(async move {
        let hold = mutex()
            .acquire(&b, Some(Instant::now() + Duration::from_secs(60)))
            .await
            .expect("b acquires once a's session is gone");
        let at = Instant::now();
        drop(hold);
        let _ = b.close().await;
        at
    });
    let a_lost_at = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let HoldState::Lost(reason) = monitor.next().await {
                return (Instant::now(), reason);
            }
        }
    })
    .await
    .expect("a is told within a minute");
    let b_acquired_at = tokio::time::timeout(Duration::from_secs(60), b_acquired)
        .await
        .expect("b acquires within a minute")
        .unwrap();
    let ms = |at: Instant| at.duration_since(cut_at).as_millis();
    assert!(
        a_lost_at.0 < b_acquired_at,
        "a was told its hold was lost ({}) {} ms after the cut, b acquired {} ms after it",
        a_lost_at.1,
        ms(a_lost_at.0),
        ms(b_acquired_at)
    );
    drop(cut);
    drop(monitor);
    drop(hold);
    let _ = a.close().await;
}
