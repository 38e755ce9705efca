//! Read/write lock against a real ZooKeeper.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{children, eventually, isolated_connect, session};
use tokio::time::Instant;
use zkgate::zk::{LockOptions, ReadWriteLock, ZkError};

const LOCK: &str = "/rw";

fn rw() -> ReadWriteLock {
    ReadWriteLock::new(
        LOCK,
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    )
}

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_millis(300))
}

#[tokio::test]
async fn readers_share_and_a_writer_excludes_everyone() {
    let connect = isolated_connect();
    let (a, b, c, w) = (
        session(&connect).await,
        session(&connect).await,
        session(&connect).await,
        session(&connect).await,
    );
    let lock = rw();
    let r1 = lock.read(&a, soon()).await.expect("first reader");
    let r2 = lock.read(&b, soon()).await.expect("readers overlap");
    let r3 = lock.read(&c, soon()).await.expect("readers overlap");
    let err = lock.write(&w, soon()).await.unwrap_err();
    assert!(
        matches!(err, ZkError::Timeout { .. }),
        "a writer waits for readers: {err}"
    );
    for r in [r1, r2, r3] {
        r.release().await.unwrap();
    }
    let wh = lock
        .write(&w, soon())
        .await
        .expect("writer after readers left");
    let err = lock.read(&a, soon()).await.unwrap_err();
    assert!(
        matches!(err, ZkError::Timeout { .. }),
        "a reader waits for the writer: {err}"
    );
    wh.release().await.unwrap();
    assert!(children(&a, LOCK).await.is_empty());
}

#[tokio::test]
async fn a_queued_writer_is_not_starved_by_later_readers() {
    let connect = isolated_connect();
    let (a, b, w) = (
        session(&connect).await,
        session(&connect).await,
        Arc::new(session(&connect).await),
    );
    let lock = rw();
    let first_reader = lock.read(&a, soon()).await.unwrap();
    let writer = tokio::spawn({
        let w = w.clone();
        async move {
            let lock = rw();
            let hold = lock
                .write(&w, Some(Instant::now() + Duration::from_secs(20)))
                .await
                .expect("writer");
            let token = hold.fencing_token();
            std::mem::forget(hold);
            token
        }
    });
    eventually(Duration::from_secs(5), "the writer queued", || async {
        (children(&a, LOCK).await.len() == 2).then_some(())
    })
    .await;
    // A reader arriving after the writer queues behind it.
    let err = lock.read(&b, soon()).await.unwrap_err();
    assert!(
        matches!(err, ZkError::Timeout { .. }),
        "a later reader must not overtake the writer: {err}"
    );
    assert!(!writer.is_finished());
    first_reader.release().await.unwrap();
    let writer_token = writer.await.unwrap();
    let later = lock
        .read(&b, Some(Instant::now() + Duration::from_millis(500)))
        .await;
    assert!(later.is_err(), "the writer holds it now");
    // The writer's session ends: the later reader gets through.
    Arc::into_inner(w)
        .expect("only owner")
        .close()
        .await
        .unwrap();
    let r = lock
        .read(&b, Some(Instant::now() + Duration::from_secs(5)))
        .await
        .expect("reader after writer");
    assert!(r.fencing_token() > writer_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mix_of_readers_and_writers_keeps_the_invariant() {
    #[derive(Default)]
    struct Occupancy {
        readers: usize,
        writer: bool,
        max_readers: usize,
    }
    let connect = isolated_connect();
    let state = Arc::new(std::sync::Mutex::new(Occupancy::default()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (connect, state) = (connect.clone(), state.clone());
        let writer = i < 2;
        tasks.push(tokio::spawn(async move {
            let s = session(&connect).await;
            let lock = rw();
            for _ in 0..20 {
                let deadline = Some(Instant::now() + Duration::from_secs(60));
                let hold = if writer {
                    lock.write(&s, deadline).await
                } else {
                    lock.read(&s, deadline).await
                }
                .expect("acquire");
                {
                    let mut o = state.lock().unwrap();
                    assert!(!o.writer, "someone holds while a writer does");
                    if writer {
                        assert_eq!(o.readers, 0, "a writer got in beside readers");
                        o.writer = true;
                    } else {
                        o.readers += 1;
                        o.max_readers = o.max_readers.max(o.readers);
                    }
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                {
                    let mut o = state.lock().unwrap();
                    if writer {
                        o.writer = false;
                    } else {
                        o.readers -= 1;
                    }
                }
                hold.release().await.expect("release");
            }
            s.close().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        state.lock().unwrap().max_readers >= 2,
        "readers should have overlapped at least once"
    );
}
