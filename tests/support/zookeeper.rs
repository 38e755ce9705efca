//! Starting ZooKeeper 3.8 (Debian's `zookeeper` package) for tests.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `zookeeper.jar` names the rest of its class path in its manifest.
const CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Sends a four-letter command and returns the answer.
pub fn four_letter(port: u16, cmd: &str) -> Option<String> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
            .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(cmd.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// One ZooKeeper server process. Killed when dropped, and also when the
/// test process dies (parent-death signal), so no server outlives a run.
pub struct ZkServer {
    pub port: u16,
    dir: PathBuf,
    config: PathBuf,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
    /// Kill the server when the spawning thread ends: only for the shared
    /// server, whose spawner lives as long as the process (the signal
    /// follows the thread, and tokio retires idle blocking threads).
    die_with_spawner: bool,
}

impl ZkServer {
    /// Starts a standalone server and waits until it answers `ruok`.
    pub fn standalone() -> ZkServer {
        Self::standalone_tied(false)
    }

    /// [`ZkServer::standalone`]; with `die_with_spawner`, the server is
    /// killed when the calling thread ends (see the field).
    fn standalone_tied(die_with_spawner: bool) -> ZkServer {
        let tmp = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let dir = tmp.path().to_owned();
        let config = write_config(&dir, port, &[], 0);
        let mut server = ZkServer {
            port,
            dir,
            config,
            child: None,
            _tmp: Some(tmp),
            die_with_spawner,
        };
        server.start();
        server.wait_serving(Duration::from_secs(30));
        server
    }

    fn start(&mut self) {
        let log = std::fs::File::create(self.dir.join("server.log")).expect("log file");
        let mut command = Command::new("java");
        command
            .args([
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Dzookeeper.admin.enableServer=false",
            ])
            .arg(format!("-Dzookeeper.log.dir={}", self.dir.display()))
            .args([
                "-cp",
                CLASSPATH,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        if self.die_with_spawner {
            // SAFETY: prctl is async-signal-safe; it only sets a flag of the child.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        self.child = Some(
            command
                .spawn()
                .expect("start java (is Debian's zookeeper package installed?)"),
        );
    }

    /// Waits until the server serves requests (`ruok` says `imok` and, for an
    /// ensemble member, it has a mode).
    pub fn wait_serving(&self, within: Duration) {
        if let Err(log) = self.serving(within) {
            panic!(
                "ZooKeeper on port {} did not start within {within:?}; log:\n{log}",
                self.port
            );
        }
    }

    /// [`ZkServer::wait_serving`], the server's log as the error.
    fn serving(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(srvr) = four_letter(self.port, "srvr") {
                if srvr.contains("Mode:") {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(
                    std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether `srvr` says this server leads the ensemble.
    pub fn is_leader(&self) -> bool {
        four_letter(self.port, "srvr").is_some_and(|s| s.contains("Mode: leader"))
    }

    /// Kills the server at once (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed server again with its data.
    pub fn restart(&mut self) {
        self.kill();
        self.start();
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn write_config(dir: &std::path::Path, port: u16, peers: &[(u16, u16)], myid: usize) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let mut cfg = format!(
        "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
         4lw.commands.whitelist=*\nextendedTypesEnabled=true\nmaxClientCnxns=0\nmaxSessionTimeout=60000\n",
        data.display()
    );
    if !peers.is_empty() {
        cfg.push_str("initLimit=10\nsyncLimit=5\n");
        for (i, (quorum, election)) in peers.iter().enumerate() {
            cfg.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1));
        }
        std::fs::write(data.join("myid"), format!("{myid}\n")).expect("myid");
    }
    let path = dir.join("zoo.cfg");
    std::fs::write(&path, cfg).expect("zoo.cfg");
    path
}

/// The server this test process shares, started on first use. It is
/// spawned from a thread that lives as long as the process, because the
/// parent-death signal follows the spawning thread.
pub fn process_server() -> &'static str {
    static ADDRESS: OnceLock<String> = OnceLock::new();
    ADDRESS.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let server = ZkServer::standalone_tied(true);
            tx.send(server.address()).expect("report address");
            // Keep the server (and this thread) for the life of the process.
            loop {
                std::thread::park();
            }
            #[allow(unreachable_code)]
            drop(server);
        });
        rx.recv().expect("shared ZooKeeper started")
    })
}

/// A 3-node ensemble on loopback.
pub struct Ensemble {
    pub servers: Vec<ZkServer>,
    _tmp: tempfile::TempDir,
}

impl Ensemble {
    /// Starts three servers and waits until they form a quorum. The ports
    /// are picked free but not held, so another process may take one before
    /// a server binds it (a server then exits: "Address already in use"):
    /// that start is retried on new ports.
    pub fn start() -> Ensemble {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(ensemble) => return ensemble,
                Err(log) => failures.push(log),
            }
        }
        panic!(
            "the ensemble did not start in 3 attempts; last log:\n{}",
            failures.pop().unwrap_or_default()
        );
    }

    fn try_start() -> Result<Ensemble, String> {
        let tmp = tempfile::tempdir().expect("temp dir");
        let peers: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let mut servers: Vec<ZkServer> = (0..3)
            .map(|i| {
                let dir = tmp.path().join(format!("zk{}", i + 1));
                std::fs::create_dir_all(&dir).expect("dir");
                let port = free_port();
                let config = write_config(&dir, port, &peers, i + 1);
                ZkServer {
                    port,
                    dir,
                    config,
                    child: None,
                    _tmp: None,
                    die_with_spawner: false,
                }
            })
            .collect();
        for s in servers.iter_mut() {
            s.start();
        }
        for s in &servers {
            s.serving(Duration::from_secs(60))?;
        }
        Ok(Ensemble { servers, _tmp: tmp })
    }

    /// All servers as a connect string.
    pub fn connect_string(&self) -> String {
        self.servers
            .iter()
            .map(ZkServer::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the leader.
    pub fn leader(&self) -> Option<usize> {
        self.servers.iter().position(ZkServer::is_leader)
    }
}
