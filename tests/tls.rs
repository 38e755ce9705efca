//! TLS to ZooKeeper 3.8 on a `secureClientPort` (Netty, client
//! certificates required): the recipes and the commands work over it, and a
//! wrong CA, a missing client certificate or a missing CA fail clearly.

mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use support::checker::{HoldLog, Share};
use support::tls::TlsZooKeeper;
use tokio::process::Command;
use tokio::time::Instant;
use zkgate::zk::{
    DoubleBarrier, EnterOptions, LockOptions, Mutex, ReadWriteLock, Session, SessionOptions,
    TlsSettings, ZkError,
};

async fn tls_server() -> TlsZooKeeper {
    tokio::task::spawn_blocking(TlsZooKeeper::start)
        .await
        .unwrap()
}

async fn connect(address: &str, tls: TlsSettings) -> Result<Session, ZkError> {
    let connect = address.parse().expect("connect string");
    Session::connect(
        &SessionOptions::new(connect)
            .session_timeout(Duration::from_secs(6))
            .connect_timeout(Duration::from_secs(4))
            .tls(tls),
    )
    .await
}

fn within(secs: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(secs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_barriers_and_read_write_locks_work_over_tls() {
    let tls = tls_server().await;
    let chroot = format!("{}/recipes", tls.address);
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(Arc::new(
            connect(&chroot, tls.client()).await.expect("TLS session"),
        ));
    }
    // Exclusion and fencing over TLS: a mutex, and reads and writes of a
    // read/write lock, each held a few milliseconds (long enough for an
    // overlap to show).
    let log = HoldLog::default();
    let options = LockOptions {
        create_parent: true,
        ..LockOptions::default()
    };
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let (s, log, options) = (s.clone(), log.clone(), options.clone());
            tokio::spawn(async move {
                for round in 0..12 {
                    let rw = ReadWriteLock::new("/rw", options.clone());
                    let (path, hold, share) = match (n + round) % 3 {
                        0 => (
                            "/rw",
                            rw.read(&s, within(30)).await.expect("read"),
                            Share::Read,
                        ),
                        1 => (
                            "/rw",
                            rw.write(&s, within(30)).await.expect("write"),
                            Share::Exclusive,
                        ),
                        _ => (
                            "/lock",
                            Mutex::new("/lock", options.clone())
                                .acquire(&s, within(30))
                                .await
                                .expect("lock"),
                            Share::Exclusive,
                        ),
                    };
                    let held = log.held(path, share, hold.fencing_token(), &format!("s{n}"));
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    held.released();
                    hold.release().await.expect("release");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(log.len(), 48);
    log.assert_invariants();

    // Readers share over TLS: all four take a read hold and keep it until
    // all four hold one (a lock that became exclusive never gets there).
    let all_hold = Arc::new(tokio::sync::Barrier::new(sessions.len()));
    let log = HoldLog::default();
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let (s, log, options, all_hold) =
                (s.clone(), log.clone(), options.clone(), all_hold.clone());
            tokio::spawn(async move {
                let hold = ReadWriteLock::new("/rw", options)
                    .read(&s, within(30))
                    .await
                    .expect("read");
                let held = log.held("/rw", Share::Read, hold.fencing_token(), &format!("s{n}"));
                tokio::time::timeout(Duration::from_secs(30), all_hold.wait())
                    .await
                    .expect("all four readers hold at once");
                held.released();
                hold.release().await.expect("release");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(log.most_at_once("/rw"), 4, "the four readers held at once");

    // A double barrier of four over TLS.
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let s = s.clone();
            tokio::spawn(async move {
                let barrier = DoubleBarrier::new("/gang");
                let options = EnterOptions {
                    create_with_participants: Some(4),
                    ..EnterOptions::default()
                };
                let id = format!("p{n}");
                barrier
                    .enter(&s, &id, &options, within(30))
                    .await
                    .expect("enter");
                barrier.leave(&s, &id, within(30)).await.expect("leave");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    for s in sessions {
        Arc::try_unwrap(s).unwrap().close().await.unwrap();
    }
}

fn zkgate(tls: &TlsZooKeeper, connect: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zkgate"));
    cmd.args(args)
        .env("ZKGATE_ZOOKEEPER", connect)
        .env("ZKGATE_TLS_CA", tls.path("ca.crt"))
        .env("ZKGATE_TLS_CERT", tls.path("client.crt"))
        .env("ZKGATE_TLS_KEY", tls.path("client.key"))
        .env("ZKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: Command) -> (i32, String, String) {
    let out = cmd
        .stdout(Stdio::piped())
        .output()
        .await
        .expect("run zkgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_commands_work_over_tls() {
    let tls = tls_server().await;
    let connect = format!("{}/commands", tls.address);
    let gang = |id: &str| {
        output(zkgate(
            &tls,
            &connect,
            &[
                "barrier",
                "run",
                "gang",
                "--participants",
                "2",
                "--id",
                id,
                "--timeout",
                "30s",
                "--",
                "true",
            ],
        ))
    };
    let (a, b) = tokio::join!(gang("a"), gang("b"));
    assert_eq!(a.0, 0, "{}", a.2);
    assert_eq!(b.0, 0, "{}", b.2);
    let (code, out, err) = output(zkgate(
        &tls,
        &connect,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            "echo token=$ZKGATE_FENCING_TOKEN",
        ],
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.trim()
            .strip_prefix("token=")
            .is_some_and(|t| t.parse::<i64>().is_ok_and(|t| t > 0)),
        "{out}"
    );
}

#[tokio::test]
async fn a_wrong_ca_a_missing_client_certificate_or_a_missing_ca_fail_clearly() {
    let tls = tls_server().await;
    // The library: the handshake's reason is in the error.
    let err = connect(&tls.address, tls.wrong_ca())
        .await
        .expect_err("wrong CA");
    let message = err.to_string();
    assert!(
        message.contains(&tls.address.replace("tcp+tls://", "")) || message.contains("127.0.0.1"),
        "{message}"
    );
    assert!(message.to_lowercase().contains("certificate"), "{message}");

    // The commands: exit 5 naming the servers and the certificate problem.
    let mut cmd = zkgate(
        &tls,
        &tls.address,
        &["lock", "acquire", "db", "--connect-timeout", "3s"],
    );
    cmd.env("ZKGATE_TLS_CA", tls.path("other-ca.crt"));
    let (code, _, err) = output(cmd).await;
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("127.0.0.1") && err.to_lowercase().contains("certificate"),
        "{err}"
    );

    // The server requires a client certificate.
    let mut cmd = zkgate(
        &tls,
        &tls.address,
        &["lock", "acquire", "db", "--connect-timeout", "3s"],
    );
    cmd.env_remove("ZKGATE_TLS_CERT")
        .env_remove("ZKGATE_TLS_KEY");
    let (code, _, err) = output(cmd).await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("TLS handshake"), "{err}");

    // tcp+tls:// without a CA, or a CA file that is not there: usage errors.
    let mut cmd = zkgate(&tls, &tls.address, &["lock", "acquire", "db"]);
    cmd.env_remove("ZKGATE_TLS_CA");
    let (code, _, err) = output(cmd).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--tls-ca"), "{err}");
    let mut cmd = zkgate(&tls, &tls.address, &["lock", "acquire", "db"]);
    cmd.env("ZKGATE_TLS_CA", "/nonexistent/ca.crt");
    let (code, _, err) = output(cmd).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/ca.crt"), "{err}");
}

#[tokio::test]
async fn the_controller_reconciles_over_tls() {
    use kube::api::Api;
    use support::kube::{client, install_crds, kubeconfig, namespace, ControllerProcess};
    use zkgate::api::{Barrier, BarrierPhase};

    let tls = tls_server().await;
    let connect = format!("{}/controller", tls.address);
    let client = client().await;
    install_crds(&client).await;
    let ns = namespace(&client).await;
    let mut args = vec!["--watch-namespace".to_owned(), ns.clone()];
    args.extend(tls.controller_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let controller =
        ControllerProcess::start_with(&kubeconfig(), &connect, "controller-tls", &args);
    let barriers: Api<Barrier> = Api::namespaced(client.clone(), &ns);
    let within = Duration::from_secs(30);
    support::kube::barrier_waiting(&barriers, "gang", 2, within).await;
    let run = |id: &'static str| {
        let mut cmd = zkgate(
            &tls,
            &connect,
            &[
                "barrier",
                "run",
                "gang",
                "--id",
                id,
                "--timeout",
                "30s",
                "--",
                "true",
            ],
        );
        cmd.env("ZKGATE_NAMESPACE", &ns);
        tokio::spawn(output(cmd))
    };
    let first = run("p0");
    // The controller sees the first registration over TLS before the second comes.
    support::eventually(within, "1 entered", || async {
        (barriers.get("gang").await.ok()?.status?.entered == 1).then_some(())
    })
    .await;
    let second = run("p1");
    for p in [first, second] {
        let (code, _, err) = p.await.unwrap();
        assert_eq!(code, 0, "{err}");
    }
    let status = support::eventually(within, "Completed", || async {
        let status = barriers.get("gang").await.ok()?.status?;
        (status.phase == Some(BarrierPhase::Completed)).then_some(status)
    })
    .await;
    assert_eq!((status.entered, status.left), (2, 2), "{status:?}");
    assert_eq!(controller.status_of("/readyz").await, Some(200));
}
