//! Real servers for the integration tests: ZooKeeper (standalone or a
//! 3-node ensemble) started from Debian's package on free loopback ports,
//! and a TCP proxy that injects connection faults.
#![allow(dead_code, unused_imports)]

pub mod checker;
pub mod docs;
pub mod handout;
pub mod https;
pub mod jobset;
pub mod kube;
pub mod net;
pub mod order;
pub mod proxy;
pub mod release;
pub mod tls;
pub mod zookeeper;

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;
use zkgate::zk::{ConnectString, Session, SessionOptions};

pub use net::{http_get, http_get_at};
pub use zookeeper::{Ensemble, ZkServer};

/// A command-line tool the tests run (`helm`, `kubectl`): in
/// `$ZKGATE_TOOLS`, by default `~/.cache/zkgate/tools`, where
/// scripts/install-helm puts them (scripts/test runs it).
pub fn tool(name: &str) -> std::path::PathBuf {
    let dir = std::env::var("ZKGATE_TOOLS")
        .unwrap_or_else(|_| format!("{}/.cache/zkgate/tools", std::env::var("HOME").unwrap()));
    let path = std::path::Path::new(&dir).join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/install-helm (scripts/test does)",
        path.display()
    );
    path
}

/// The ZooKeeper every test of this process shares: `ZKGATE_TEST_ZOOKEEPER`
/// when set (the test script starts one for the whole run), else a server
/// this process starts once and that dies with it.
pub fn shared_zookeeper() -> String {
    if let Ok(addr) = std::env::var("ZKGATE_TEST_ZOOKEEPER") {
        if !addr.is_empty() {
            return addr;
        }
    }
    zookeeper::process_server().to_owned()
}

/// A connect string to the shared server, chrooted to a fresh path so the
/// test is isolated from every other. In the TLS pass of `scripts/test`
/// (`ZKGATE_TEST_ZOOKEEPER_TLS` set) it names the server's TLS port.
pub fn isolated_connect() -> String {
    let server = match std::env::var("ZKGATE_TEST_ZOOKEEPER_TLS") {
        Ok(tls) if !tls.is_empty() => tls,
        _ => shared_zookeeper(),
    };
    format!("{server}/t-{}", uuid::Uuid::new_v4().simple())
}

/// In the TLS pass, the directory with the shared server's certificates
/// (`scripts/zookeeper start DIR --tls` made them in `DIR/tls`).
fn tls_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("ZKGATE_TEST_TLS_DIR")
        .filter(|d| !d.is_empty())
        .map(Into::into)
}

/// What a `zkgate` command needs in its environment to reach `connect`:
/// the CA and client certificate when it names TLS servers.
pub fn tls_env(connect: &str) -> Vec<(&'static str, std::path::PathBuf)> {
    match tls_dir() {
        Some(dir) if connect.contains("tcp+tls://") => vec![
            ("ZKGATE_TLS_CA", dir.join("ca.crt")),
            ("ZKGATE_TLS_CERT", dir.join("client.crt")),
            ("ZKGATE_TLS_KEY", dir.join("client.key")),
        ],
        _ => Vec::new(),
    }
}

/// A Java class path with Apache Curator 5.9 and the ZooKeeper 3.9 client
/// (with slf4j-simple: set `org.slf4j.simpleLogger.defaultLogLevel`), the
/// jars `scripts/maven-jars` fetched from Maven Central (it fetches them
/// the first time: `scripts/install-deps` and `scripts/test` call it).
pub fn curator_classpath() -> &'static str {
    static CLASSPATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CLASSPATH.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/maven-jars");
        let out = std::process::Command::new(script)
            .arg("classpath")
            .output()
            .expect("run scripts/maven-jars");
        assert!(
            out.status.success(),
            "scripts/maven-jars failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("a class path")
            .trim()
            .to_owned()
    })
}

/// Connects a session with a short session timeout.
pub async fn session(connect: &str) -> Session {
    session_with_timeout(connect, Duration::from_secs(4)).await
}

/// Connects a session with the given timeout (over TLS when `connect`
/// names TLS servers, with the TLS pass's certificates).
pub async fn session_with_timeout(connect: &str, timeout: Duration) -> Session {
    Session::connect(&options(connect).session_timeout(timeout))
        .await
        .expect("connect to ZooKeeper")
}

/// Connects a session (4 s timeout) that presents `credential` (none: an
/// anonymous one), as a participant holding it would.
pub async fn session_as(connect: &str, credential: Option<&zkgate::zk::Credential>) -> Session {
    let mut options = options(connect);
    options.credential = credential.cloned();
    Session::connect(&options.session_timeout(Duration::from_secs(4)))
        .await
        .expect("connect to ZooKeeper")
}

/// Session options for `connect`, with the TLS pass's certificates when it
/// names TLS servers.
pub fn options(connect: &str) -> SessionOptions {
    let connect: ConnectString = connect.parse().expect("connect string");
    let options = SessionOptions::new(connect);
    if !options.connect.uses_tls() {
        return options;
    }
    let dir = tls_dir().expect("a tcp+tls:// server in a test needs ZKGATE_TEST_TLS_DIR");
    options.tls(tls::client_settings(&dir, "ca.crt"))
}

/// This machine's wall clock in microseconds: the clock a command's
/// `$EPOCHREALTIME`, the pods' `now-us` and ZooKeeper's ctime read.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Polls `check` until it returns `Some`, failing the test after `within`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The count `read` gives once it has stopped changing: the same for a
/// second (four looks a quarter second apart). For counts of work that
/// follows a change within milliseconds (requests, reconciles); fails the
/// test if the count still changes after a minute.
pub async fn settled<F, Fut>(read: F) -> f64
where
    F: Fn() -> Fut,
    Fut: Future<Output = f64>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = read().await;
    let mut stable = 0;
    while stable < 4 {
        assert!(Instant::now() < deadline, "the count kept changing: {last}");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = read().await;
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
    }
    last
}

/// Whether process `pid` has ended: gone, or a zombie nobody reaped yet.
pub fn process_ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) STATE ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// The children of `path`, sorted (empty when it does not exist).
pub async fn children(session: &Session, path: &str) -> Vec<String> {
    let mut c = session
        .client()
        .list_children(path)
        .await
        .unwrap_or_default();
    c.sort();
    c
}

/// Makes a barrier node at `path` for `participants`, owned by no resource
/// (as a test needs it: no controller is running).
pub async fn barrier_made(
    session: &Session,
    path: &str,
    participants: u32,
) -> zkgate::zk::DoubleBarrier {
    let barrier = zkgate::zk::DoubleBarrier::new(path);
    barrier
        .create(
            session,
            &zkgate::zk::BarrierData {
                participants,
                ..Default::default()
            },
        )
        .await
        .expect("barrier node");
    barrier
}

/// Every watch the shared server holds, as (path, session id) pairs
/// (server-side paths, chroot included), from the `wchp` command.
fn server_watches() -> Vec<(String, i64)> {
    let server = shared_zookeeper();
    let port: u16 = server
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let dump = zookeeper::four_letter(port, "wchp").unwrap_or_default();
    let mut watches = Vec::new();
    let mut path = "";
    for line in dump.lines() {
        if line.starts_with('/') {
            path = line;
        } else if let Some(hex) = line.trim().strip_prefix("0x") {
            if let Ok(id) = u64::from_str_radix(hex, 16) {
                watches.push((path.to_owned(), id as i64));
            }
        }
    }
    watches
}

/// How many watches the shared server holds on paths starting with
/// `prefix` (server-side paths, chroot included).
pub fn watches_under(prefix: &str) -> usize {
    server_watches()
        .iter()
        .filter(|(path, _)| path.starts_with(prefix))
        .count()
}

/// The sessions (ids) the shared server holds a watch for on exactly
/// `path` (server-side, chroot included).
pub fn watchers_of(path: &str) -> Vec<i64> {
    server_watches()
        .into_iter()
        .filter(|(p, _)| p == path)
        .map(|(_, id)| id)
        .collect()
}

/// The chroot of a connect string made by [`isolated_connect`].
pub fn chroot_of(connect: &str) -> String {
    connect
        .parse::<ConnectString>()
        .expect("connect string")
        .chroot()
        .expect("a chroot")
        .to_owned()
}

/// `zkgate ARGS...` against `connect` (with the TLS pass's certificates
/// when it names TLS servers), logging warnings, killed when dropped.
pub fn zkgate(connect: &str, args: &[&str]) -> tokio::process::Command {
    zkgate_binary(Path::new(env!("CARGO_BIN_EXE_zkgate")), connect, args)
}

/// [`zkgate`] running the zkgate binary `bin` (another release's, for an
/// upgrade).
pub fn zkgate_binary(bin: &Path, connect: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .env("ZKGATE_ZOOKEEPER", connect)
        .envs(tls_env(connect))
        .env("ZKGATE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// `zkgate_binary`, run as an ordinary user (uid and gid 1000), with the
/// TLS material from [`readable_tls_env`] in `dir`.
pub fn zkgate_binary_as_user(
    bin: &Path,
    connect: &str,
    args: &[&str],
    dir: &Path,
) -> tokio::process::Command {
    let mut cmd = zkgate_binary(bin, connect, args);
    cmd.envs(readable_tls_env(connect, dir)).uid(1000).gid(1000);
    cmd
}

/// [`tls_env`] for an ordinary user: the TLS material (root's alone where
/// the test server made it) copied into `dir`, readable by anyone.
pub fn readable_tls_env(connect: &str, dir: &Path) -> Vec<(&'static str, std::path::PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    tls_env(connect)
        .into_iter()
        .map(|(name, file)| {
            let file_name = file.file_name().expect("a TLS file's name");
            let copy = dir.join(format!("user-{}", file_name.to_string_lossy()));
            std::fs::copy(&file, &copy).expect("copy the TLS material");
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644))
                .expect("make the TLS material readable");
            (name, copy)
        })
        .collect()
}

/// Runs a command to its end; its exit code and standard error.
pub async fn output(mut cmd: tokio::process::Command) -> (i32, String) {
    let out = cmd
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .expect("run zkgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// This machine's clock in nanoseconds, as `date +%s%N` prints it.
#[allow(dead_code)]
pub fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_nanos()
}

/// The nanoseconds since the epoch a command wrote into `path`
/// (`date +%s%N`): its start, its last heartbeat.
pub fn read_nanos(path: &std::path::Path) -> u128 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Waits for a process with a deadline and returns its exit code and
/// standard error (which must have been piped).
pub async fn finished(child: tokio::process::Child, within: Duration) -> (i32, String) {
    let out = tokio::time::timeout(within, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the process did not exit within {within:?}"))
        .expect("wait for the process");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A pod's lock sidecar and its main container, as processes: `zkgate lock
/// sidecar db --create --id holder` against `connect` with a session
/// timeout and kill grace, and `zkgate lock watch -- COMMAND...` beside it
/// with no ZooKeeper, only the token file they share (in `dir`, with the
/// sidecar's ready file). The sidecar first, then the watch.
pub fn lock_sidecar_and_watch(
    connect: &str,
    dir: &std::path::Path,
    session_timeout: &str,
    kill_grace: &str,
    command: &[&str],
) -> (tokio::process::Command, tokio::process::Command) {
    let token = dir.join("fencing-token");
    let ready = dir.join("ready");
    let (token, ready) = (
        token.to_str().expect("utf-8"),
        ready.to_str().expect("utf-8"),
    );
    let sidecar = zkgate(
        connect,
        &[
            "lock",
            "sidecar",
            "db",
            "--create",
            "--id",
            "holder",
            "--session-timeout",
            session_timeout,
            "--kill-grace",
            kill_grace,
            "--token-file",
            token,
            "--ready-file",
            ready,
        ],
    );
    let mut watch_args = vec!["lock", "watch", "--token-file", token, "--"];
    watch_args.extend_from_slice(command);
    let watch = zkgate("127.0.0.1:1", &watch_args);
    (sidecar, watch)
}

/// The next holder of the lock `db`: `zkgate lock run db --create --id next
/// --timeout 60s -- sh -c SCRIPT` against `connect` (queues behind the
/// current holder; the script runs once it holds).
pub fn next_lock_holder(connect: &str, script: &str) -> tokio::process::Command {
    zkgate(
        connect,
        &[
            "lock",
            "run",
            "db",
            "--create",
            "--id",
            "next",
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
}

/// The barrier `g` in rounds of `participants` at `path`, made with
/// `admin` as the controller makes it: the barrier node, round 0 and the
/// node for the members' run marks.
#[allow(dead_code)]
pub async fn make_gang(
    admin: &Session,
    path: &str,
    participants: u32,
    max_restarts: Option<u32>,
) -> zkgate::zk::GangBarrier {
    use zkgate::zk::{BarrierData, DoubleBarrier, GangBarrier, RunMarks};
    let data = BarrierData {
        participants,
        uid: Some("the-barrier".into()),
        run: Some(String::new()),
        round: Some(0),
        max_restarts,
        ..BarrierData::default()
    };
    DoubleBarrier::new(path)
        .create(admin, &data)
        .await
        .expect("make the barrier");
    let gang = GangBarrier::new(path);
    gang.ensure_round(admin, &data, 0)
        .await
        .expect("make round 0");
    RunMarks::of(path)
        .ensure(admin, path)
        .await
        .expect("make the run marks' node");
    gang
}
