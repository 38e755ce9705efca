//! What the servers say of themselves, for a diagnosis (`kubectl zkgate
//! doctor` asks the controller, which asks here): each server's version
//! and role by the `srvr` four-letter word (the one ZooKeeper allows by
//! default), and the session timeout the ensemble grants for a requested
//! one (it clamps every request into `[minSessionTimeout,
//! maxSessionTimeout]`, by default 2 and 20 `tickTime`s, and says nothing
//! else about those bounds to a client).
//!
//! Nothing here holds a session beyond its call or writes anything.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{ConnectString, Result, Server, Session, SessionOptions};

/// The most of a `srvr` answer read (a real one is about 300 bytes).
const SRVR_LIMIT: u64 = 8 * 1024;

/// What one server said to `srvr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerStat {
    /// It serves: its version (`3.8.4-…`) and mode (`leader`, `follower`,
    /// `observer`, `standalone`).
    Serving {
        /// The version line's value.
        version: String,
        /// The mode line's value.
        mode: String,
    },
    /// It answers but serves no client: it has no quorum (or is starting).
    NotServing,
    /// `srvr` is not in its `4lw.commands.whitelist`.
    NotAllowed,
}

/// Asks `server` `srvr` and reads its answer, within `timeout`. A server
/// reached over TLS is not asked (its client port speaks TLS only): an
/// error says so.
pub async fn server_stat(server: &Server, timeout: Duration) -> std::io::Result<ServerStat> {
    if server.tls {
        return Err(std::io::Error::other(
            "reached over TLS, where four-letter words are not answered",
        ));
    }
    let ask = async {
        let mut stream =
            tokio::net::TcpStream::connect((server.host.as_str(), server.port)).await?;
        stream.write_all(b"srvr").await?;
        let mut answer = Vec::new();
        stream.take(SRVR_LIMIT).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))??;
    parse_srvr(&String::from_utf8_lossy(&answer))
}

/// Reads a `srvr` answer (ZooKeeper 3.5 to 3.9 print the same lines).
pub fn parse_srvr(answer: &str) -> std::io::Result<ServerStat> {
    if answer.contains("not in the whitelist") {
        return Ok(ServerStat::NotAllowed);
    }
    if answer.contains("not currently serving requests") {
        return Ok(ServerStat::NotServing);
    }
    let field = |name: &str| {
        answer.lines().find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(':'))
                .map(|value| value.trim().to_owned())
        })
    };
    match (field("Zookeeper version"), field("Mode")) {
        (Some(version), Some(mode)) => Ok(ServerStat::Serving {
            // "3.8.4-9316c2a7…, built on …": the release alone.
            version: version
                .split(['-', ',', ' '])
                .next()
                .unwrap_or_default()
                .to_owned(),
            mode,
        }),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "not a srvr answer: {:?}",
                answer.chars().take(80).collect::<String>()
            ),
        )),
    }
}

/// Whether ZooKeeper `version` (`3.8.4`, as [`ServerStat::Serving`] has
/// it) tells a persistent recursive watch the paths of nodes its client
/// may not read (CVE-2024-23944, fixed in 3.8.4 and 3.9.2): on a shared
/// ensemble, a tenant's watch on `/` then sees every namespace's node
/// names (its pods' names among them). Persistent watches came in 3.6; an
/// unreadable version is not judged.
pub fn leaks_paths_to_watchers(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) else {
        return false;
    };
    let patch = parts.next().flatten().unwrap_or(0);
    match (major, minor) {
        (3, 6 | 7) => true,
        (3, 8) => patch < 4,
        (3, 9) => patch < 2,
        _ => false,
    }
}

/// Asks each of `servers` `srvr` once and warns of those whose version
/// leaks node paths to watchers ([`leaks_paths_to_watchers`]); a server
/// that does not answer is not judged (`kubectl zkgate doctor` asks again).
pub async fn warn_of_path_leaks(servers: &[Server]) {
    for server in servers {
        if let Ok(ServerStat::Serving { version, .. }) =
            server_stat(server, Duration::from_secs(2)).await
        {
            if leaks_paths_to_watchers(&version) {
                tracing::warn!(
                    server = %format!("{}:{}", server.host, server.port),
                    %version,
                    "this ZooKeeper tells a persistent watch the paths of nodes its client may not read (CVE-2024-23944): any namespace's participant can learn every namespace's node names; upgrade to 3.8.4 or 3.9.2 or later"
                );
            }
        }
    }
}

/// The session timeout the ensemble grants when `requested` is asked for:
/// a session is made with `options` (no chroot: nothing is read or made)
/// and closed at once.
pub async fn granted_session_timeout(
    options: &SessionOptions,
    requested: Duration,
) -> Result<Duration> {
    let mut options = options.clone().session_timeout(requested);
    // The servers alone: the chroot would be checked (and made) on connect.
    if let Ok(servers) = options.connect.servers_string().parse::<ConnectString>() {
        options.connect = servers;
    }
    let session = Session::connect(&options).await?;
    let granted = session.timeout();
    let _ = session.close().await;
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_before_the_watch_fix_are_told_apart() {
        for leaking in ["3.6.4", "3.7.2", "3.8.0", "3.8.3", "3.9.0", "3.9.1"] {
            assert!(leaks_paths_to_watchers(leaking), "{leaking}");
        }
        for fixed in [
            "3.8.4", "3.8.10", "3.9.2", "3.9.4", "3.10.0", "4.0.0", "3.5.9", "garbage", "",
        ] {
            assert!(!leaks_paths_to_watchers(fixed), "{fixed}");
        }
    }

    #[test]
    fn a_srvr_answer_is_read_for_its_version_and_mode() {
        let answer = "Zookeeper version: 3.8.0-5a02a05eddb59aee6ac762f7ea82e92a68eb9c0f, built on 2022-02-25 08:49 UTC\n\
                      Latency min/avg/max: 0/0.5/3\nReceived: 12\nSent: 11\nConnections: 2\n\
                      Outstanding: 0\nZxid: 0x10000002a\nMode: follower\nNode count: 9\n";
        assert_eq!(
            parse_srvr(answer).unwrap(),
            ServerStat::Serving {
                version: "3.8.0".into(),
                mode: "follower".into()
            }
        );
        assert_eq!(
            parse_srvr("This ZooKeeper instance is not currently serving requests\n").unwrap(),
            ServerStat::NotServing
        );
        assert_eq!(
            parse_srvr("srvr is not executed because it is not in the whitelist.\n").unwrap(),
            ServerStat::NotAllowed
        );
        assert!(parse_srvr("HTTP/1.1 400 Bad Request\r\n").is_err());
    }
}
