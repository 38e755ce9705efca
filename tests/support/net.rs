//! Loopback ports and plain HTTP GETs: std and tokio only, so that the
//! benchmarks' programs (bench/controller.rs) use them too.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::OnceLock;

/// A free TCP port on loopback, for a server a test starts.
///
/// Not one the kernel would hand out (`bind(0)` does, from the ephemeral
/// range): a port from that range, free when asked, is soon some outgoing
/// connection's local port (a client of the API server or of ZooKeeper,
/// in this or a parallel test process), and the server then fails with
/// "address in use" (CI, 2026-12-07). So the ports come from below the
/// ephemeral range, walked from a point of this process's own, each one
/// checked free by binding it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Below the kernel's ephemeral range (32768 by default).
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let low = 10_000u32;
    let span = ephemeral_low.saturating_sub(low).max(1000);
    // One starting point a process, so a process never hands out a port
    // twice, and parallel test processes start far apart.
    static START: OnceLock<u32> = OnceLock::new();
    let start = *START.get_or_init(|| {
        std::process::id().wrapping_mul(7919)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
    });
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(low + start.wrapping_add(n) % span) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// `GET path` on a loopback port: the status line and the body, or `None`
/// when nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_at("127.0.0.1", port, path).await
}

/// `GET path` on `host:port` (a pod's address on the local cluster's bridge).
pub async fn http_get_at(host: &str, port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((host, port)).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, out))
}
