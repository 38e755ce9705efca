//! A TCP proxy between a client and ZooKeeper that the test controls:
//! it can cut the connection right after forwarding a create request (so
//! the create is applied but its reply is lost), stall all traffic, or
//! freeze one connection at a chosen request (the network goes silent
//! without closing, as a partitioned pod sees it).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// ZooKeeper's op codes for create requests (create, create2, createContainer, createTTL).
const CREATE_OPS: [i32; 4] = [1, 15, 19, 21];

/// ZooKeeper's op codes, for [`Proxy::freeze_at`].
pub mod op {
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_CHILDREN: i32 = 8;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    /// Every create request.
    pub const CREATES: [i32; 5] = [1, 15, 19, 21, 14];
}

/// A request that freezes its connection when it passes.
struct Freeze {
    ops: Vec<i32>,
    pattern: Vec<u8>,
    /// Whether the request itself reaches the server.
    forward: bool,
}

#[derive(Default)]
struct Control {
    cut_after_create: AtomicBool,
    cuts: AtomicUsize,
    stalled: AtomicBool,
    replies_stalled: AtomicBool,
    unstalled: Notify,
    freeze: std::sync::Mutex<Option<Freeze>>,
    freezes: AtomicUsize,
    /// Closes every open connection when notified.
    cut_all: Notify,
    /// Every request forwarded: its op and bytes.
    forwarded: std::sync::Mutex<Vec<(i32, Vec<u8>)>>,
    frozen: Notify,
    /// A request that stalls everything (see [`Proxy::stall_at`]).
    stall_at: std::sync::Mutex<Option<(Vec<i32>, Vec<u8>)>>,
    stalled_at: AtomicUsize,
    /// The session ids the server gave connections through the proxy (read
    /// from its connect replies).
    sessions: std::sync::Mutex<Vec<i64>>,
    /// The local ports of the connections to the server, as the server
    /// lists its clients (`cons`).
    upstream_ports: std::sync::Mutex<Vec<u16>>,
}

/// A running proxy; it stops with the test's runtime.
#[derive(Clone)]
pub struct Proxy {
    pub port: u16,
    control: Arc<Control>,
    upstream: Arc<std::sync::Mutex<String>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let control = Arc::new(Control::default());
        let c = control.clone();
        let upstream = Arc::new(std::sync::Mutex::new(upstream));
        let target = upstream.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = target.lock().unwrap().clone();
                let c = c.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        if let Ok(local) = server.local_addr() {
                            c.upstream_ports.lock().unwrap().push(local.port());
                        }
                        relay(client, server, c).await;
                    }
                });
            }
        });
        Proxy {
            port,
            control,
            upstream,
        }
    }

    /// The local ports of every connection the proxy made to its server.
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.control.upstream_ports.lock().unwrap().clone()
    }

    /// Connections made from now on go to `upstream` (`host:port`); open
    /// ones stay where they are.
    pub fn redirect(&self, upstream: String) {
        *self.upstream.lock().unwrap() = upstream;
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Cut the connection right after the next create request reached the server.
    pub fn cut_after_next_create(&self) {
        self.control.cut_after_create.store(true, Ordering::SeqCst);
    }

    /// How many connections were cut after a create.
    pub fn cuts(&self) -> usize {
        self.control.cuts.load(Ordering::SeqCst)
    }

    /// Stops forwarding (both ways) until [`Proxy::resume`].
    pub fn stall(&self) {
        self.control.stalled.store(true, Ordering::SeqCst);
    }

    /// Stalls (as [`Proxy::stall`]) until the server has expired the
    /// sessions that came through the proxy: its session tracker (`dump`)
    /// no longer lists them, and it has closed their connections (`cons`).
    /// A connection alone going is not enough: a client gives up on a
    /// silent one and opens another while its session lives on. Resume
    /// with [`Proxy::resume`].
    pub async fn stall_until_expired(&self) {
        self.stall();
        let upstream = self.upstream.lock().unwrap().clone();
        let port: u16 = upstream
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the proxy's server has a port");
        let ours = self.upstream_ports();
        super::eventually(
            std::time::Duration::from_secs(20),
            "the sessions through the proxy expired",
            || async {
                let cons = super::zookeeper::four_letter(port, "cons")?;
                let dump = super::zookeeper::four_letter(port, "dump")?;
                let tracked = dump
                    .split("ephemeral nodes dump")
                    .next()
                    .unwrap_or_default();
                let sessions = self.control.sessions.lock().unwrap().clone();
                (!ours
                    .iter()
                    .any(|p| cons.contains(&format!("127.0.0.1:{p}[")))
                    && !sessions.iter().any(|id| {
                        tracked
                            .lines()
                            .any(|l| l.split_whitespace().next() == Some(&format!("{id:#x}")))
                    }))
                .then_some(())
            },
        )
        .await;
    }

    /// Freezes the connection that next sends a request whose op is one of
    /// `ops` and whose bytes contain `pattern` (a path, say): with
    /// `forward`, the request reaches the server first (it is applied, its
    /// reply is lost); without, it never does. From then on nothing passes
    /// on that connection either way, and it stays open until the client
    /// gives up on it. Other connections (a reconnect) flow as usual.
    pub fn freeze_at(&self, ops: &[i32], pattern: &str, forward: bool) {
        *self.control.freeze.lock().unwrap() = Some(Freeze {
            ops: ops.to_vec(),
            pattern: pattern.as_bytes().to_vec(),
            forward,
        });
    }

    /// Closes every connection open now (frames held back by a stall are
    /// dropped with them); the client sees the connection end at once.
    pub fn cut_all(&self) {
        self.control.cut_all.notify_waiters();
    }

    /// How many requests with an op in `ops` and `pattern` in their bytes
    /// were forwarded to the server.
    pub fn forwarded(&self, ops: &[i32], pattern: &str) -> usize {
        let pattern = pattern.as_bytes();
        self.control
            .forwarded
            .lock()
            .unwrap()
            .iter()
            .filter(|(op, body)| {
                ops.contains(op) && body.windows(pattern.len().max(1)).any(|w| w == pattern)
            })
            .count()
    }

    /// How many connections were frozen.
    pub fn freezes(&self) -> usize {
        self.control.freezes.load(Ordering::SeqCst)
    }

    /// Waits until a connection has been frozen.
    pub async fn frozen(&self) {
        loop {
            let notified = self.control.frozen.notified();
            if self.freezes() > 0 {
                return;
            }
            notified.await;
        }
    }

    /// Stalls all traffic (as [`Proxy::stall`]) the moment the next request
    /// with an op in `ops` and `pattern` in its bytes arrives, before that
    /// request is forwarded: the test acts while the client's request is
    /// on its way, then [`Proxy::resume`] lets it reach the server.
    pub fn stall_at(&self, ops: &[i32], pattern: &str) {
        *self.control.stall_at.lock().unwrap() = Some((ops.to_vec(), pattern.as_bytes().to_vec()));
    }

    /// Waits until a request armed by [`Proxy::stall_at`] has arrived and
    /// stalled the proxy.
    pub async fn stalled_at(&self) {
        loop {
            let notified = self.control.frozen.notified();
            if self.control.stalled_at.load(Ordering::SeqCst) > 0 {
                return;
            }
            notified.await;
        }
    }

    /// Holds the server's replies back (requests still reach the server)
    /// until [`Proxy::resume`]: the client acts on a stale view.
    pub fn stall_replies(&self) {
        self.control.replies_stalled.store(true, Ordering::SeqCst);
    }

    /// Forwards again.
    pub fn resume(&self) {
        self.control.stalled.store(false, Ordering::SeqCst);
        self.control.replies_stalled.store(false, Ordering::SeqCst);
        self.control.unstalled.notify_waiters();
    }
}

async fn relay(client: TcpStream, server: TcpStream, control: Arc<Control>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set before a doomed create is forwarded, so its reply never is.
    let cutting = Arc::new(AtomicBool::new(false));
    // Set when this connection freezes: nothing passes either way after.
    let frozen = Arc::new(AtomicBool::new(false));
    let up = {
        let control = control.clone();
        let cutting = cutting.clone();
        let frozen = frozen.clone();
        async move {
            // Client to server, frame by frame; the first frame is the
            // connect request, which has no request header.
            let mut first = true;
            loop {
                let mut len = [0u8; 4];
                client_read.read_exact(&mut len).await?;
                let n = i32::from_be_bytes(len).max(0) as usize;
                let mut body = vec![0u8; n];
                client_read.read_exact(&mut body).await?;
                wait_unstalled(&control).await;
                let op = (!first && n >= 8)
                    .then(|| i32::from_be_bytes([body[4], body[5], body[6], body[7]]));
                first = false;
                let is_create = op.is_some_and(|op| CREATE_OPS.contains(&op));
                let freeze = op.and_then(|op| {
                    let mut slot = control.freeze.lock().unwrap();
                    let hit = slot.as_ref().is_some_and(|f| {
                        f.ops.contains(&op)
                            && body
                                .windows(f.pattern.len().max(1))
                                .any(|w| w == &f.pattern[..])
                    });
                    if hit {
                        slot.take()
                    } else {
                        None
                    }
                });
                if let Some(freeze) = freeze {
                    frozen.store(true, Ordering::SeqCst);
                    if freeze.forward {
                        server_write.write_all(&len).await?;
                        server_write.write_all(&body).await?;
                    }
                    control.freezes.fetch_add(1, Ordering::SeqCst);
                    control.frozen.notify_waiters();
                    // Swallow whatever the client sends until it hangs up.
                    let mut sink = vec![0u8; 64 * 1024];
                    while client_read.read(&mut sink).await? > 0 {}
                    return Ok(());
                }
                let stall = op.is_some_and(|op| {
                    let mut slot = control.stall_at.lock().unwrap();
                    let hit = slot.as_ref().is_some_and(|(ops, pattern)| {
                        ops.contains(&op)
                            && body
                                .windows(pattern.len().max(1))
                                .any(|w| w == &pattern[..])
                    });
                    if hit {
                        *slot = None;
                    }
                    hit
                });
                if stall {
                    control.stalled.store(true, Ordering::SeqCst);
                    control.stalled_at.fetch_add(1, Ordering::SeqCst);
                    control.frozen.notify_waiters();
                    wait_unstalled(&control).await;
                }
                let doomed = is_create && control.cut_after_create.swap(false, Ordering::SeqCst);
                if doomed {
                    cutting.store(true, Ordering::SeqCst);
                    control.cuts.fetch_add(1, Ordering::SeqCst);
                }
                server_write.write_all(&len).await?;
                server_write.write_all(&body).await?;
                if let Some(op) = op {
                    control.forwarded.lock().unwrap().push((op, body));
                }
                if doomed {
                    // Give the server time to apply it, then drop both sides
                    // without passing the reply on.
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    return Ok::<(), std::io::Error>(());
                }
            }
        }
    };
    let down = {
        let control = control.clone();
        let cutting = cutting.clone();
        let frozen = frozen.clone();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut first = true;
            loop {
                let n = server_read.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<(), std::io::Error>(());
                }
                // The connect reply: length, protocol version, timeout,
                // session id (0 when the session was refused).
                if std::mem::take(&mut first) && n >= 20 {
                    let id = i64::from_be_bytes(buf[12..20].try_into().unwrap());
                    if id != 0 {
                        control.sessions.lock().unwrap().push(id);
                    }
                }
                wait_unstalled(&control).await;
                wait_while(&control, &control.replies_stalled).await;
                if cutting.load(Ordering::SeqCst) {
                    return Ok(());
                }
                if frozen.load(Ordering::SeqCst) {
                    // Silent, not closed: the client must notice by itself.
                    std::future::pending::<()>().await;
                }
                client_write.write_all(&buf[..n]).await?;
            }
        }
    };
    // Either direction ending (or the cut) drops both halves: the client
    // sees the connection close.
    tokio::select! {
        _ = up => {}
        _ = down => {}
        () = control.cut_all.notified() => {}
    }
}

async fn wait_unstalled(control: &Control) {
    wait_while(control, &control.stalled).await;
}

async fn wait_while(control: &Control, flag: &AtomicBool) {
    while flag.load(Ordering::SeqCst) {
        let notified = control.unstalled.notified();
        if !flag.load(Ordering::SeqCst) {
            break;
        }
        notified.await;
    }
}

/// A fresh chroot on the shared server, reached directly and through a new
/// proxy: the two connect strings and the proxy.
pub async fn routes() -> (String, String, Proxy) {
    let chroot = format!("/t-{}", uuid::Uuid::new_v4().simple());
    let proxy = Proxy::start(super::shared_zookeeper()).await;
    (
        format!("{}{chroot}", super::shared_zookeeper()),
        format!("{}{chroot}", proxy.address()),
        proxy,
    )
}
