//! A TCP proxy between a client and ZooKeeper that the test controls:
//! it can cut the connection right after forwarding a create request (so
//! the create is applied but its reply is lost), or stall all traffic.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// ZooKeeper's op codes for create requests (create, create2, createContainer, createTTL).
const CREATE_OPS: [i32; 4] = [1, 15, 19, 21];

#[derive(Default)]
struct Control {
    cut_after_create: AtomicBool,
    cuts: AtomicUsize,
    stalled: AtomicBool,
    unstalled: Notify,
}

/// A running proxy; it stops with the test's runtime.
#[derive(Clone)]
pub struct Proxy {
    pub port: u16,
    control: Arc<Control>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let control = Arc::new(Control::default());
        let c = control.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let c = c.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, c).await;
                    }
                });
            }
        });
        Proxy { port, control }
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

    /// Forwards again.
    pub fn resume(&self) {
        self.control.stalled.store(false, Ordering::SeqCst);
        self.control.unstalled.notify_waiters();
    }
}

async fn relay(client: TcpStream, server: TcpStream, control: Arc<Control>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set before a doomed create is forwarded, so its reply never is.
    let cutting = Arc::new(AtomicBool::new(false));
    let up = {
        let control = control.clone();
        let cutting = cutting.clone();
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
                let is_create = !first
                    && n >= 8
                    && CREATE_OPS
                        .contains(&i32::from_be_bytes([body[4], body[5], body[6], body[7]]));
                first = false;
                let doomed = is_create && control.cut_after_create.swap(false, Ordering::SeqCst);
                if doomed {
                    cutting.store(true, Ordering::SeqCst);
                    control.cuts.fetch_add(1, Ordering::SeqCst);
                }
                server_write.write_all(&len).await?;
                server_write.write_all(&body).await?;
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
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = server_read.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<(), std::io::Error>(());
                }
                wait_unstalled(&control).await;
                if cutting.load(Ordering::SeqCst) {
                    return Ok(());
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
    }
}

async fn wait_unstalled(control: &Control) {
    while control.stalled.load(Ordering::SeqCst) {
        let notified = control.unstalled.notified();
        if !control.stalled.load(Ordering::SeqCst) {
            break;
        }
        notified.await;
    }
}
