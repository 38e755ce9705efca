//! Double barrier against a real ZooKeeper.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{children, eventually, isolated_connect, session, session_with_timeout};
use tokio::time::Instant;
use zkgate::zk::{BarrierData, DoubleBarrier, EnterOptions, ParticipantData, Session, ZkError};

const BARRIER: &str = "/b";

fn options(x: u32) -> EnterOptions {
    EnterOptions {
        create_with_participants: Some(x),
        ..EnterOptions::default()
    }
}

fn within(secs: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(secs))
}

#[tokio::test]
async fn nobody_passes_before_the_last_registration_and_leave_waits_for_all() {
    let connect = isolated_connect();
    let observer = session(&connect).await;
    let mut sessions = Vec::new();
    for _ in 0..5 {
        sessions.push(Arc::new(session(&connect).await));
    }
    let enter = |s: Arc<Session>, id: String| {
        tokio::spawn(async move {
            DoubleBarrier::new(BARRIER)
                .enter(&s, &id, &options(5), within(30))
                .await
                .expect("enter");
            Instant::now()
        })
    };
    let mut waiting: Vec<_> = (0..4)
        .map(|i| enter(sessions[i].clone(), format!("p{i}")))
        .collect();
    eventually(Duration::from_secs(10), "4 registrations", || async {
        (children(&observer, BARRIER).await.len() == 4).then_some(())
    })
    .await;
    // The barrier cannot open on 4 of 5: give the waiters a chance to be wrong.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "someone passed with 4 of 5 registered"
    );
    assert!(!children(&observer, BARRIER)
        .await
        .contains(&"ready".to_string()));
    let last_registration = Instant::now();
    waiting.push(enter(sessions[4].clone(), "p4".into()));
    for w in waiting {
        assert!(w.await.unwrap() >= last_registration);
    }
    assert!(children(&observer, BARRIER)
        .await
        .contains(&"ready".to_string()));

    // Leave: four leave, they must wait for the fifth.
    let leave = |s: Arc<Session>, id: String| {
        tokio::spawn(async move {
            DoubleBarrier::new(BARRIER)
                .leave(&s, &id, within(30))
                .await
                .expect("leave")
        })
    };
    let leaving: Vec<_> = (0..4)
        .map(|i| leave(sessions[i].clone(), format!("p{i}")))
        .collect();
    eventually(
        Duration::from_secs(10),
        "p1..p3 gone, p0 (lowest) and p4 left",
        || async {
            let c = children(&observer, BARRIER).await;
            (c == ["p0", "p4", "ready"]).then_some(())
        },
    )
    .await;
    assert!(
        leaving.iter().all(|l| !l.is_finished()),
        "someone finished leaving while p4 is still in"
    );
    leave(sessions[4].clone(), "p4".into()).await.unwrap();
    for l in leaving {
        l.await.unwrap();
    }
    // The last one out of a barrier no controller owns resets it for the
    // next round (issue 12, item 8).
    assert!(children(&observer, BARRIER).await.is_empty());
}

/// Dropping a watch that has not fired sends the server a removal; every
/// waiter of a barrier released at once would send one into the release
/// (what made a 1,000-participant barrier release twice as slowly as the
/// server can notify). After a release, both sides still hold their
/// un-fired watch of the barrier node: nothing was sent for it.
#[tokio::test]
async fn a_release_sends_no_watch_removals() {
    let connect = isolated_connect();
    let chroot = support::chroot_of(&connect);
    let barrier = format!("{chroot}{BARRIER}");
    let waiter = Arc::new(session(&connect).await);
    let opener = session(&connect).await;
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            DoubleBarrier::new(BARRIER)
                .enter(&waiter, "p0", &options(2), within(30))
                .await
        }
    });
    eventually(Duration::from_secs(10), "the waiter watching", || async {
        support::watchers_of(&barrier)
            .contains(&waiter.id())
            .then_some(())
    })
    .await;
    DoubleBarrier::new(BARRIER)
        .enter(&opener, "p1", &options(2), within(30))
        .await
        .expect("the last one opens");
    waiting.await.unwrap().expect("the waiter passes");
    // Whatever either session sent on its way out of enter() reached the
    // server before these round trips come back.
    waiter.client().check_stat(BARRIER).await.unwrap();
    opener.client().check_stat(BARRIER).await.unwrap();
    let watching = support::watchers_of(&barrier);
    assert!(
        watching.contains(&waiter.id()) && watching.contains(&opener.id()),
        "a watch was removed in the release: the barrier node is watched by {watching:x?}, \
         the waiter is {:x}, the opener {:x}",
        waiter.id(),
        opener.id()
    );
}

/// A waiter's registration removed by someone else (the controller, for a
/// pod that ended) is reported at the waiter's next look, not counted.
#[tokio::test]
async fn a_waiter_whose_registration_was_removed_is_told() {
    let connect = isolated_connect();
    let admin = session(&connect).await;
    let barrier = support::barrier_made(&admin, BARRIER, 3).await;
    let waiter = Arc::new(session(&connect).await);
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            DoubleBarrier::new(BARRIER)
                .enter(&waiter, "p0", &EnterOptions::default(), within(30))
                .await
        }
    });
    eventually(Duration::from_secs(10), "p0 registered", || async {
        (children(&admin, BARRIER).await == ["p0"]).then_some(())
    })
    .await;
    admin
        .client()
        .delete(&format!("{BARRIER}/p0"), None)
        .await
        .unwrap();
    // Changing x (to 2: still more than the 0 registered) rewrites the
    // barrier node: every waiter looks again.
    assert!(barrier.set_participants(&admin, 2).await.unwrap());
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter looked again")
        .unwrap();
    assert!(
        matches!(outcome, Err(ZkError::NodeRemoved { .. })),
        "{outcome:?}"
    );
    assert!(children(&admin, BARRIER).await.is_empty());
}

#[tokio::test]
async fn a_deadline_leaves_no_registration_behind() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let barrier = DoubleBarrier::new(BARRIER);
    let err = barrier
        .enter(
            &s,
            "p0",
            &options(3),
            Some(Instant::now() + Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    assert!(children(&s, BARRIER).await.is_empty());
    // Cancellation too.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        barrier.enter(&s, "p0", &options(3), None),
    )
    .await;
    assert!(cancelled.is_err());
    eventually(
        Duration::from_secs(5),
        "the cancelled registration to go",
        || async { children(&s, BARRIER).await.is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_restarted_participant_is_counted_once() {
    let connect = isolated_connect();
    let opts = EnterOptions {
        persistent: true,
        data: ParticipantData {
            pod: Some("job-0".into()),
            pod_uid: Some("uid-1".into()),
            ..ParticipantData::default()
        },
        create_with_participants: Some(2),
        ..EnterOptions::default()
    };
    let barrier = DoubleBarrier::new(BARRIER);
    let observer = session(&connect).await;
    // An init container registered, then was killed before the barrier
    // opened: what it leaves is its persistent node naming its pod uid.
    support::barrier_made(&observer, BARRIER, 2).await;
    let data = serde_json::to_vec(&opts.data).unwrap();
    observer
        .client()
        .create(
            &format!("{BARRIER}/job-0"),
            &data,
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();

    // The restarted container enters again: recognised, not counted twice.
    let second = session(&connect).await;
    let waiting = tokio::spawn({
        let connect = connect.clone();
        async move {
            let s = session(&connect).await;
            DoubleBarrier::new(BARRIER)
                .enter(&s, "job-1", &EnterOptions::default(), within(30))
                .await
                .expect("job-1 enters");
            s // job-1's node is ephemeral: keep its session
        }
    });
    let entered = barrier
        .enter(&second, "job-0", &opts, within(30))
        .await
        .expect("restarted job-0 enters");
    assert!(entered.was_registered);
    let _job1 = waiting.await.unwrap();
    assert_eq!(
        children(&observer, BARRIER).await,
        ["job-0", "job-1", "ready"]
    );
}

#[tokio::test]
async fn an_id_held_by_another_live_session_is_refused() {
    let connect = isolated_connect();
    let (a, b) = (session(&connect).await, session(&connect).await);
    let barrier = DoubleBarrier::new(BARRIER);
    let _a_waits = tokio::spawn({
        let connect = connect.clone();
        async move {
            let a2 = session(&connect).await;
            let _ = DoubleBarrier::new(BARRIER)
                .enter(&a2, "p0", &options(2), within(30))
                .await;
        }
    });
    eventually(Duration::from_secs(5), "p0 registered", || async {
        children(&a, BARRIER)
            .await
            .contains(&"p0".to_string())
            .then_some(())
    })
    .await;
    let err = barrier
        .enter(&b, "p0", &options(2), within(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ZkError::ParticipantConflict { .. }), "{err}");
    assert_eq!(
        children(&a, BARRIER).await,
        ["p0"],
        "the refused participant removed nothing and added nothing"
    );
}

#[tokio::test]
async fn a_failed_or_deleted_barrier_stops_its_waiters() {
    let connect = isolated_connect();
    let owner = session(&connect).await;
    let barrier = DoubleBarrier::new(BARRIER);
    barrier
        .create(
            &owner,
            &BarrierData {
                participants: 3,
                uid: Some("u1".into()),
                ..BarrierData::default()
            },
        )
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let connect = connect.clone();
        async move {
            let s = session(&connect).await;
            DoubleBarrier::new(BARRIER)
                .enter(&s, "p0", &EnterOptions::default(), within(30))
                .await
        }
    });
    eventually(Duration::from_secs(5), "p0 registered", || async {
        children(&owner, BARRIER)
            .await
            .contains(&"p0".to_string())
            .then_some(())
    })
    .await;
    barrier.fail(&owner, "TimedOut").await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert!(
        matches!(&err, ZkError::BarrierFailed { reason, .. } if reason == "TimedOut"),
        "{err}"
    );
    assert!(
        children(&owner, BARRIER).await.is_empty(),
        "the failed waiter removed its registration"
    );

    // Deleted while waiting.
    support::barrier_made(&owner, "/b2", 2).await;
    let waiter = tokio::spawn({
        let connect = connect.clone();
        async move {
            let s = session(&connect).await;
            DoubleBarrier::new("/b2")
                .enter(&s, "p0", &EnterOptions::default(), within(30))
                .await
        }
    });
    eventually(Duration::from_secs(5), "p0 registered", || async {
        children(&owner, "/b2")
            .await
            .contains(&"p0".to_string())
            .then_some(())
    })
    .await;
    owner.client().delete("/b2/p0", None).await.unwrap();
    owner.client().delete("/b2", None).await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert!(matches!(err, ZkError::Deleted { .. }), "{err}");
}

#[tokio::test]
async fn enter_waits_for_the_barrier_node_to_be_created() {
    let connect = isolated_connect();
    let owner = session(&connect).await;
    let waiter = tokio::spawn({
        let connect = connect.clone();
        async move {
            let s = session(&connect).await;
            DoubleBarrier::new(BARRIER)
                .enter(&s, "p0", &EnterOptions::default(), within(30))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    support::barrier_made(&owner, BARRIER, 1).await;
    let entered = waiter
        .await
        .unwrap()
        .expect("entered once the node appeared");
    assert_eq!(entered.participants, 1);
}

/// A fail (or a change of x) makes and deletes `ready` in the transaction
/// that rewrites the barrier's data; a waiter takes a `ready` made with no
/// barrier change before it for an opening, without reading. Many waiters
/// on one session get both notifications in one batch, so each sees both
/// at once: every one must stop failed, none pass.
#[tokio::test]
async fn a_fail_never_reads_as_an_opening_even_with_both_notifications_at_once() {
    let connect = isolated_connect();
    let owner = session(&connect).await;
    let barrier = support::barrier_made(&owner, BARRIER, 100).await;
    let shared = Arc::new(session(&connect).await);
    let waiters: Vec<_> = (0..40)
        .map(|i| {
            let s = shared.clone();
            tokio::spawn(async move {
                DoubleBarrier::new(BARRIER)
                    .enter(
                        &s,
                        &format!("w{i:02}"),
                        &EnterOptions::default(),
                        within(30),
                    )
                    .await
            })
        })
        .collect();
    eventually(Duration::from_secs(10), "40 registered", || async {
        (children(&owner, BARRIER).await.len() == 40).then_some(())
    })
    .await;
    assert!(barrier.fail(&owner, "TimedOut").await.unwrap());
    for (i, w) in waiters.into_iter().enumerate() {
        let outcome = w.await.unwrap();
        assert!(
            matches!(&outcome, Err(ZkError::BarrierFailed { .. })),
            "waiter {i}: {outcome:?}"
        );
    }
}

/// A barrier its owner holds (`held`: issue 28, roles that start in
/// order) does not open though its count is reached; the owner's write
/// that lifts the hold lets the waiters open it, and they pass.
#[tokio::test]
async fn a_held_barrier_opens_only_when_its_owner_lifts_the_hold() {
    let connect = isolated_connect();
    let owner = session(&connect).await;
    let held = BarrierData {
        participants: 2,
        held: Some("waiting for Barrier workers to be Ready".into()),
        ..BarrierData::default()
    };
    DoubleBarrier::new(BARRIER)
        .create(&owner, &held)
        .await
        .unwrap();
    let enter = |id: &'static str| {
        let connect = connect.clone();
        tokio::spawn(async move {
            let s = session(&connect).await;
            DoubleBarrier::new(BARRIER)
                .enter(&s, id, &options(2), within(30))
                .await
                .expect("enter");
            s
        })
    };
    let waiting = [enter("launcher-0"), enter("launcher-1")];
    eventually(Duration::from_secs(10), "2 registrations", || async {
        (children(&owner, BARRIER).await.len() == 2).then_some(())
    })
    .await;
    // The count is reached: give the waiters a chance to be wrong.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "someone passed a held barrier"
    );
    assert!(!children(&owner, BARRIER).await.contains(&"ready".into()));
    let lifted = BarrierData { held: None, ..held };
    owner
        .client()
        .set_data(BARRIER, &lifted.to_bytes(), None)
        .await
        .unwrap();
    for w in waiting {
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("the waiters pass once the hold is lifted")
            .unwrap();
    }
    assert!(children(&owner, BARRIER).await.contains(&"ready".into()));
}

/// Curator's GH-1290: Curator's double barrier returned from `enter` on any
/// wake-up of its wait, a spurious one or the SyncConnected event a
/// reconnect hands every watcher, without counting again, so a participant
/// passed with too few entered. zkgate's waiters must count again on every
/// wake-up and pass only with all 4 in: `spurious` is woken by its progress
/// timer every 50 ms (and is cut with a round in flight, which fails with
/// ConnectionLoss and is sent again once SyncConnected), `watching`
/// waits on its watches alone (so the watches its reconnect registers again
/// are what wake it, for a change made while it was cut off). What wakes
/// them: participants that join and leave (a withdrawal rewrites the
/// barrier's data and makes and deletes `ready`: both watches fire, the
/// opening's own notification among them), one that joins and goes, a
/// hold set and lifted, the connection cut and found again.
#[tokio::test]
async fn enter_passes_only_with_the_count_whatever_wakes_it() {
    use std::cell::Cell;
    use support::proxy::{op, Proxy};
    use zkgate::zk::SessionState;

    let (direct, spurious_route, spurious_proxy) = support::proxy::routes().await;
    let chroot = support::chroot_of(&direct);
    let watching_proxy = Proxy::start(support::shared_zookeeper()).await;
    let watching_route = format!("{}{chroot}", watching_proxy.address());
    let owner = session(&direct).await;
    let barrier = support::barrier_made(&owner, BARRIER, 4).await;
    // Sessions that outlive a few seconds cut off, each through its own
    // proxy (which counts its rounds: one `ready` check each).
    let spurious = session_with_timeout(&spurious_route, Duration::from_secs(10)).await;
    let watching = session_with_timeout(&watching_route, Duration::from_secs(10)).await;
    let ready_path = format!("{BARRIER}/ready");
    let rounds = |proxy: &Proxy| proxy.forwarded(&[op::EXISTS], &ready_path);
    // Every state each session goes through.
    let states = |s: &Session| {
        let mut watcher = s.watch_state();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let state = watcher.changed().await;
                log.lock().unwrap().push(state);
            }
        });
        seen
    };
    let (spurious_states, watching_states) = (states(&spurious), states(&watching));

    let timer = EnterOptions {
        progress_every: Some(Duration::from_millis(50)),
        ..EnterOptions::default()
    };
    let first = barrier.enter(&spurious, "a-spurious", &timer, within(120));
    let watches_only = EnterOptions::default();
    let second = barrier.enter(&watching, "b-watching", &watches_only, within(120));
    tokio::pin!(first, second);
    let stage = Cell::new("registering");
    // A participant that joins and leaves: enters, and gives up before
    // the count is reached (its withdrawal wakes every waiter).
    let join_and_leave = |id: &'static str| {
        let direct = direct.clone();
        async move {
            let s = session(&direct).await;
            let deadline = Some(Instant::now() + Duration::from_millis(300));
            let err = DoubleBarrier::new(BARRIER)
                .enter(&s, id, &EnterOptions::default(), deadline)
                .await
                .expect_err("nobody can pass with 3 of 4");
            assert!(matches!(err, ZkError::Timeout { .. }), "{id}: {err}");
        }
    };
    let wakeups = |s: &Session| s.stats().watch_wakeups();
    // `watching` waits on its watches, set on the server: its last round
    // sent (one per wake-up after the first) and its watch of the barrier
    // node there (a change made before would go unseen, read by the round).
    let barrier_on_server = format!("{chroot}{BARRIER}");
    let idle = || {
        eventually(
            Duration::from_secs(10),
            "watching waits on its watches",
            || async {
                let sent = rounds(&watching_proxy) as u64 == wakeups(&watching) + 1;
                let set = support::watchers_of(&barrier_on_server).contains(&watching.id());
                (sent && set).then_some(())
            },
        )
    };
    let events = async {
        eventually(
            Duration::from_secs(10),
            "both waiters registered",
            || async {
                (children(&owner, BARRIER).await == ["a-spurious", "b-watching"]).then_some(())
            },
        )
        .await;

        stage.set("spurious wake-ups (the progress timer)");
        let before = rounds(&spurious_proxy);
        eventually(Duration::from_secs(10), "5 rounds on the timer", || async {
            (rounds(&spurious_proxy) >= before + 5).then_some(())
        })
        .await;

        stage.set("a participant that joined and left");
        idle().await;
        let before = wakeups(&watching);
        join_and_leave("c-left").await;
        eventually(
            Duration::from_secs(10),
            "woken by its withdrawal",
            || async { (wakeups(&watching) > before).then_some(()) },
        )
        .await;

        stage.set("a participant that joined and went");
        let open =
            zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
        let gone = format!("{BARRIER}/c-gone");
        owner.client().create(&gone, b"", &open).await.unwrap();
        owner.client().delete(&gone, None).await.unwrap();

        stage.set("a hold set and lifted");
        idle().await;
        let before = wakeups(&watching);
        assert!(barrier.set_held(&owner, Some("a test")).await.unwrap());
        assert!(barrier.set_held(&owner, None).await.unwrap());
        eventually(Duration::from_secs(10), "woken by the hold", || async {
            (wakeups(&watching) > before).then_some(())
        })
        .await;

        stage.set("the connection cut and found again");
        idle().await;
        // `spurious` is cut with a round on its way: its next `ready` check
        // is held at the proxy (which stalls), and so fails with the
        // connection. Both reconnects are held back while the barrier
        // changes (a withdrawal: data rewritten, `ready` made and deleted).
        spurious_proxy.stall_at(&[op::EXISTS], &ready_path);
        tokio::time::timeout(Duration::from_secs(10), spurious_proxy.stalled_at())
            .await
            .expect("spurious sends a round on its timer");
        watching_proxy.stall();
        let before = (rounds(&spurious_proxy), rounds(&watching_proxy));
        for proxy in [&spurious_proxy, &watching_proxy] {
            proxy.cut_all();
        }
        for (name, seen) in [
            ("spurious", &spurious_states),
            ("watching", &watching_states),
        ] {
            eventually(
                Duration::from_secs(10),
                &format!("{name} disconnected"),
                || async {
                    seen.lock()
                        .unwrap()
                        .contains(&SessionState::Disconnected)
                        .then_some(())
                },
            )
            .await;
        }
        join_and_leave("c-left-while-cut").await;
        for proxy in [&spurious_proxy, &watching_proxy] {
            proxy.resume();
        }
        for (name, seen) in [
            ("spurious", &spurious_states),
            ("watching", &watching_states),
        ] {
            eventually(
                Duration::from_secs(20),
                &format!("{name} reconnected"),
                || async {
                    let seen = seen.lock().unwrap();
                    let cut = seen.iter().position(|s| *s == SessionState::Disconnected)?;
                    seen[cut..].contains(&SessionState::Connected).then_some(())
                },
            )
            .await;
        }
        // Both went round again: `spurious` on its timer (its round cut
        // off retried), `watching` woken by the watch its reconnect set
        // again on the barrier's changed data (or, had its last round
        // still been on the way, by that round's connection loss).
        eventually(
            Duration::from_secs(10),
            "both counted again after the reconnect",
            || async {
                (rounds(&spurious_proxy) >= before.0 + 3 && rounds(&watching_proxy) > before.1)
                    .then_some(())
            },
        )
        .await;
        assert!(
            !children(&owner, BARRIER).await.contains(&"ready".into()),
            "nothing opened the barrier"
        );
    };
    tokio::select! {
        outcome = &mut first => panic!(
            "the waiter woken by its timer passed with too few entered, at {}: {outcome:?}",
            stage.get()
        ),
        outcome = &mut second => panic!(
            "the waiter woken by its watches passed with too few entered, at {}: {outcome:?}",
            stage.get()
        ),
        () = events => {}
    }
    for seen in [&spurious_states, &watching_states] {
        assert!(
            !seen.lock().unwrap().iter().any(|s| s.is_terminal()),
            "a session ended: {:?}",
            seen.lock().unwrap()
        );
    }

    // The last two enter: everyone passes, after the last registration.
    let last = |id: &'static str| {
        let direct = direct.clone();
        tokio::spawn(async move {
            let s = session(&direct).await;
            let entered = DoubleBarrier::new(BARRIER)
                .enter(&s, id, &EnterOptions::default(), within(30))
                .await
                .expect("the last two enter");
            (s, entered)
        })
    };
    let last = [last("c"), last("d")];
    for (name, outcome) in [("spurious", first.await), ("watching", second.await)] {
        let entered = outcome.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(entered.participants, 4, "{name}");
    }
    let mut sessions = Vec::new();
    for l in last {
        sessions.push(l.await.unwrap());
    }
    let czxid = |path: String| {
        let owner = &owner;
        async move {
            owner
                .client()
                .check_stat(&path)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{path} is there"))
                .czxid
        }
    };
    let ready = czxid(ready_path.clone()).await;
    for id in ["a-spurious", "b-watching", "c", "d"] {
        assert!(
            czxid(format!("{BARRIER}/{id}")).await < ready,
            "`ready` was made after {id}'s registration"
        );
    }
}
