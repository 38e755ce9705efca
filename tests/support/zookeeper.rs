//! Starting ZooKeeper 3.8 (Debian's `zookeeper` package) for tests.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `zookeeper.jar` names the rest of its class path in its manifest.
const CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

pub use super::net::free_port;

/// Sends a four-letter command to a server on loopback and returns the
/// answer.
pub fn four_letter(port: u16, cmd: &str) -> Option<String> {
    four_letter_at((Ipv4Addr::LOCALHOST, port).into(), cmd)
}

/// [`four_letter`] to a server at `addr`.
pub fn four_letter_at(addr: SocketAddr, cmd: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
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
    /// The address its client port is bound to.
    host: Ipv4Addr,
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
        let config = write_config(&dir, port, &[], 0, &EnsembleConfig::default());
        let mut server = ZkServer {
            port,
            host: Ipv4Addr::LOCALHOST,
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
            if let Some(srvr) = self.four_letter("srvr") {
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
        format!("{}:{}", self.host, self.port)
    }

    /// Sends a four-letter command to this server.
    pub fn four_letter(&self, cmd: &str) -> Option<String> {
        four_letter_at((self.host, self.port).into(), cmd)
    }

    /// Whether `srvr` says this server leads the ensemble.
    pub fn is_leader(&self) -> bool {
        self.four_letter("srvr")
            .is_some_and(|s| s.contains("Mode: leader"))
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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

/// How an ensemble's servers are tuned: the tick, and how many ticks a
/// follower may go without its leader before it notices
/// (`syncLimit` × `tickTime`: the window in which a follower cut from its
/// leader still answers reads from its own copy).
#[derive(Clone, Copy, Debug)]
pub struct EnsembleConfig {
    pub tick: Duration,
    pub sync_limit: u32,
    /// Where the servers take clients: loopback, or the local cluster's
    /// bridge for pods to reach them (never an outside address).
    pub host: Ipv4Addr,
}

impl Default for EnsembleConfig {
    fn default() -> Self {
        EnsembleConfig {
            tick: Duration::from_millis(500),
            sync_limit: 5,
            host: Ipv4Addr::LOCALHOST,
        }
    }
}

fn write_config(
    dir: &std::path::Path,
    port: u16,
    peers: &[(u16, u16)],
    myid: usize,
    tuning: &EnsembleConfig,
) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let mut cfg = format!(
        "tickTime={}\ndataDir={}\nclientPort={port}\nclientPortAddress={}\nadmin.enableServer=false\n\
         4lw.commands.whitelist=*\nextendedTypesEnabled=true\nmaxClientCnxns=0\nmaxSessionTimeout=60000\n",
        tuning.tick.as_millis(),
        data.display(),
        tuning.host
    );
    if !peers.is_empty() {
        cfg.push_str(&format!("initLimit=20\nsyncLimit={}\n", tuning.sync_limit));
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
    /// Each server's quorum and election ports, by index.
    pub peers: Vec<(u16, u16)>,
    pub config: EnsembleConfig,
    _tmp: tempfile::TempDir,
}

impl Ensemble {
    /// Starts three servers and waits until they form a quorum. The ports
    /// are picked free but not held, so another process may take one before
    /// a server binds it (a server then exits: "Address already in use"):
    /// that start is retried on new ports.
    pub fn start() -> Ensemble {
        Self::start_with(EnsembleConfig::default())
    }

    /// [`Ensemble::start`] with the servers tuned as `config` says.
    pub fn start_with(config: EnsembleConfig) -> Ensemble {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::try_start(config) {
                Ok(ensemble) => return ensemble,
                Err(log) => failures.push(log),
            }
        }
        panic!(
            "the ensemble did not start in 3 attempts; last log:\n{}",
            failures.pop().unwrap_or_default()
        );
    }

    fn try_start(tuning: EnsembleConfig) -> Result<Ensemble, String> {
        let tmp = tempfile::tempdir().expect("temp dir");
        let peers: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let mut servers: Vec<ZkServer> = (0..3)
            .map(|i| {
                let dir = tmp.path().join(format!("zk{}", i + 1));
                std::fs::create_dir_all(&dir).expect("dir");
                let port = free_port();
                let config = write_config(&dir, port, &peers, i + 1, &tuning);
                ZkServer {
                    port,
                    host: tuning.host,
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
        Ok(Ensemble {
            servers,
            peers,
            config: tuning,
            _tmp: tmp,
        })
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

impl Ensemble {
    /// Cuts server `follower`'s quorum link to the leader, both ways,
    /// leaving every client link up: the follower keeps serving its clients
    /// from its own copy until it notices (`syncLimit` × `tickTime`). The
    /// link is found by the follower's end of its connection to the
    /// leader's quorum port (`ss`), and dropped by two `iptables` rules on
    /// exactly those ports, removed when the returned [`Cut`] is dropped. A
    /// follower that reconnects (a new local port) after it noticed is not
    /// cut: the partition heals as ZooKeeper's own recovery would see it.
    pub fn cut_from_leader(&self, follower: usize) -> Cut {
        let (local, quorum) = self.quorum_link(follower);
        Cut::install(vec![drop_rule(local, quorum), drop_rule(quorum, local)])
    }

    /// Drops what the leader sends on server `follower`'s quorum link,
    /// and only that: the follower still forwards its clients' requests to
    /// the leader, which commits them without it, but hears of no commit,
    /// so it answers its clients' reads from a copy that falls behind
    /// (until it notices the silent leader, `syncLimit` × `tickTime`).
    pub fn deafen(&self, follower: usize) -> Cut {
        let (local, quorum) = self.quorum_link(follower);
        Cut::install(vec![drop_rule(quorum, local)])
    }

    /// The follower's local port on its link to the leader, and the
    /// leader's quorum port.
    fn quorum_link(&self, follower: usize) -> (u16, u16) {
        let leader = self.leader().expect("a leader");
        assert_ne!(leader, follower, "server {follower} leads: cut a follower");
        let quorum = self.peers[leader].0;
        let pid = self.servers[follower].pid().expect("the follower runs");
        let out = Command::new("ss")
            .args(["-tnpH", "state", "established"])
            .arg(format!("( dport = :{quorum} )"))
            .output()
            .expect("run ss (iproute2)");
        let listing = String::from_utf8_lossy(&out.stdout);
        let local = listing
            .lines()
            .find(|l| l.contains(&format!("pid={pid},")))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|local| local.rsplit_once(':'))
            .and_then(|(_, port)| port.parse::<u16>().ok())
            .unwrap_or_else(|| {
                panic!("no connection of server {follower} (pid {pid}) to the leader's quorum port {quorum}:\n{listing}")
            });
        (local, quorum)
    }
}

/// An iptables rule (for `-I`/`-D`) dropping loopback TCP from port
/// `from` to port `to`.
fn drop_rule(from: u16, to: u16) -> Vec<String> {
    [
        "OUTPUT",
        "-p",
        "tcp",
        "-s",
        "127.0.0.1",
        "--sport",
        &from.to_string(),
        "--dport",
        &to.to_string(),
        "-j",
        "DROP",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Packet rules that cut a link; removed (exactly these) when dropped,
/// also when the test fails.
pub struct Cut {
    rules: Vec<Vec<String>>,
}

impl Cut {
    /// Whether this machine lets a test cut links: root and `iptables`.
    pub fn available() -> Result<(), String> {
        if unsafe { libc::geteuid() } != 0 {
            return Err("cutting links needs root".into());
        }
        match Command::new("iptables").args(["-S", "OUTPUT"]).output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!(
                "iptables fails: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Err(format!(
                "no iptables ({e}): scripts/install-deps installs it"
            )),
        }
    }

    fn install(rules: Vec<Vec<String>>) -> Cut {
        let mut cut = Cut { rules: Vec::new() };
        for rule in rules {
            let status = Command::new("iptables")
                .arg("-I")
                .args(&rule)
                .status()
                .expect("run iptables");
            assert!(status.success(), "iptables -I {}", rule.join(" "));
            cut.rules.push(rule);
        }
        cut
    }

    /// Removes the rules now: the link carries packets again.
    pub fn heal(mut self) {
        self.remove();
    }

    fn remove(&mut self) {
        for rule in self.rules.drain(..) {
            let _ = Command::new("iptables").arg("-D").args(&rule).status();
        }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.remove();
    }
}
