//! zkgate and Apache Curator 5.9 (with the ZooKeeper 3.9 client: Maven
//! Central's jars, `scripts/maven-jars`) on the same paths: locks exclude
//! each other in both directions; barriers count each other.

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::{children, eventually, isolated_connect, session};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;
use zkgate::zk::{
    encode_count, DoubleBarrier, EnterOptions, LockOptions, Mutex, Permits, ReadWriteLock,
    Semaphore, ZkError,
};

/// A Curator participant (tests/peers/CuratorPeer.java) driven over stdin.
struct Curator {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Curator {
    async fn start(connect: &str) -> Curator {
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/CuratorPeer.java");
        // Off the runtime's thread: the first call may download jars while
        // the test's sessions wait on it.
        let classpath = tokio::task::spawn_blocking(support::curator_classpath)
            .await
            .unwrap();
        let mut child = Command::new("java")
            .args([
                // slf4j-simple logs to stderr: warnings only.
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp",
                classpath,
                source,
                connect,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("java must be installed (scripts/install-deps)");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut peer = Curator {
            _child: child,
            stdin,
            lines,
        };
        peer.expect("READY").await;
        peer
    }

    async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn expect(&mut self, want: &str) {
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("Curator did not say {want} in time"))
            .unwrap()
            .unwrap_or_default();
        assert_eq!(line, want);
    }

    /// Asserts that Curator says nothing for a while (it is blocked).
    async fn stays_blocked(&mut self) {
        let said = tokio::time::timeout(Duration::from_millis(500), self.lines.next_line()).await;
        assert!(
            said.is_err(),
            "Curator should still be waiting, but said {said:?}"
        );
    }
}

fn short() -> Option<Instant> {
    Some(Instant::now() + Duration::from_millis(500))
}

#[tokio::test]
async fn mutex_excludes_curator_and_curator_excludes_mutex() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let mut curator = Curator::start(&connect).await;
    let lock = Mutex::new(
        "/lock",
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    );

    // zkgate holds; Curator queues behind it.
    let hold = lock.acquire(&s, short()).await.unwrap();
    curator.send("mutex /lock").await;
    eventually(Duration::from_secs(10), "Curator queued", || async {
        (children(&s, "/lock").await.len() == 2).then_some(())
    })
    .await;
    curator.stays_blocked().await;
    hold.release().await.unwrap();
    curator.expect("ACQUIRED").await;

    // Curator holds; zkgate queues behind it.
    let err = lock.acquire(&s, short()).await.unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    curator.send("release").await;
    curator.expect("RELEASED").await;
    lock.acquire(&s, short())
        .await
        .expect("free after Curator released")
        .release()
        .await
        .unwrap();
    curator.send("quit").await;
}

#[tokio::test]
async fn read_write_lock_interoperates_with_curator() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let mut curator = Curator::start(&connect).await;
    let lock = ReadWriteLock::new(
        "/rw",
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    );

    // Curator's writer excludes zkgate's reader.
    curator.send("write /rw").await;
    curator.expect("ACQUIRED").await;
    let err = lock.read(&s, short()).await.unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    curator.send("release").await;
    curator.expect("RELEASED").await;

    // Readers share across implementations.
    let ours = lock.read(&s, short()).await.unwrap();
    curator.send("read /rw").await;
    curator.expect("ACQUIRED").await;
    ours.release().await.unwrap();
    curator.send("release").await;
    curator.expect("RELEASED").await;

    // zkgate's writer excludes Curator's reader.
    let ours = lock.write(&s, short()).await.unwrap();
    curator.send("read /rw").await;
    eventually(Duration::from_secs(10), "Curator queued", || async {
        (children(&s, "/rw").await.len() == 2).then_some(())
    })
    .await;
    curator.stays_blocked().await;
    ours.release().await.unwrap();
    curator.expect("ACQUIRED").await;
    curator.send("release").await;
    curator.expect("RELEASED").await;
}

#[tokio::test]
async fn a_double_barrier_counts_curator_participants() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let mut curator = Curator::start(&connect).await;
    let barrier = DoubleBarrier::new("/barrier");
    curator.send("barrier /barrier 2").await;
    eventually(Duration::from_secs(10), "Curator registered", || async {
        (children(&s, "/barrier").await.len() == 1).then_some(())
    })
    .await;
    curator.stays_blocked().await;
    let options = EnterOptions {
        create_with_participants: Some(2),
        ..EnterOptions::default()
    };
    barrier
        .enter(
            &s,
            "zkgate-0",
            &options,
            Some(Instant::now() + Duration::from_secs(10)),
        )
        .await
        .expect("enter with Curator");
    curator.expect("ENTERED").await;
    curator.send("leave").await;
    barrier
        .leave(
            &s,
            "zkgate-0",
            Some(Instant::now() + Duration::from_secs(10)),
        )
        .await
        .expect("leave with Curator");
    curator.expect("LEFT").await;
}

/// Issue 15: zkgate's semaphore and Curator's InterProcessSemaphoreV2 on one
/// path share the permits both ways.
#[tokio::test]
async fn semaphore_permits_are_shared_with_curator() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let mut curator = Curator::start(&connect).await;
    let sem = Semaphore::new(
        "/sem",
        Permits::Fixed(3),
        LockOptions {
            create_parent: true,
            ..LockOptions::default()
        },
    );

    // zkgate holds 2 of 3: Curator gets one of the two it asks for, then waits.
    let ours = sem.acquire(&s, 2, short()).await.unwrap();
    curator.send("semaphore /sem 3 2").await;
    eventually(Duration::from_secs(10), "Curator's first lease", || async {
        (children(&s, "/sem/leases").await.len() >= 3).then_some(())
    })
    .await;
    curator.stays_blocked().await;
    ours.release().await.unwrap();
    curator.expect("ACQUIRED").await;

    // Curator holds 2 of 3: zkgate gets 1, not 2.
    let err = sem.acquire(&s, 2, short()).await.unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    let one = sem.acquire(&s, 1, short()).await.expect("the third permit");
    curator.send("return").await;
    curator.expect("RELEASED").await;
    one.release().await.unwrap();
    sem.acquire(&s, 3, short())
        .await
        .expect("all 3 once Curator returned its leases")
        .release()
        .await
        .unwrap();
    assert!(children(&s, "/sem/leases").await.is_empty());
    curator.send("quit").await;
}

/// Issue 15: the number of permits in zkgate's count node is a Curator
/// SharedCount: a Curator client built on it follows a change at once.
#[tokio::test]
async fn curator_follows_the_shared_count() {
    let connect = isolated_connect();
    let s = session(&connect).await;
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    s.client().mkdir("/sem", &open).await.unwrap();
    s.client()
        .create("/sem/count", &encode_count(1), &open)
        .await
        .unwrap();
    let sem = Semaphore::new(
        "/sem",
        Permits::Shared("/sem/count".into()),
        LockOptions::default(),
    );
    let ours = sem.acquire(&s, 1, short()).await.unwrap();
    let mut curator = Curator::start(&connect).await;
    curator.send("shared /sem /sem/count 1").await;
    curator.stays_blocked().await;
    s.client()
        .set_data("/sem/count", &encode_count(2), None)
        .await
        .unwrap();
    curator.expect("ACQUIRED").await;
    // Two in use of two: zkgate waits too.
    let err = sem.acquire(&s, 1, short()).await.unwrap_err();
    assert!(matches!(err, ZkError::Timeout { .. }), "{err}");
    curator.send("return").await;
    curator.expect("RELEASED").await;
    ours.release().await.unwrap();
    curator.send("quit").await;
}
