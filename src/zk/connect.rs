//! Connect strings: `host:port[,host:port...][/chroot]`, as the Java client
//! takes them, with an optional `tcp://` or `tcp+tls://` scheme per server.

use std::fmt;
use std::str::FromStr;

use super::error::ZkError;
use super::path;

/// The port a server listens on when the connect string names none.
pub const DEFAULT_PORT: u16 = 2181;

/// One server of an ensemble.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// Host name or address (IPv6 addresses without brackets).
    pub host: String,
    /// Client port.
    pub port: u16,
    /// Whether the server is reached over TLS (`tcp+tls://`).
    pub tls: bool,
}

/// A parsed, validated connect string.
///
/// The chroot, if any, is a path below which every path of the session lives;
/// [`crate::zk::Session::connect`] creates it when it is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectString {
    servers: Vec<Server>,
    chroot: Option<String>,
}

impl ConnectString {
    /// The servers, in the order given.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// The chroot, `None` for the server's root.
    pub fn chroot(&self) -> Option<&str> {
        self.chroot.as_deref()
    }

    /// The servers alone, as the client library takes them (no chroot).
    pub fn servers_string(&self) -> String {
        self.servers
            .iter()
            .map(Server::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether any server is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        self.servers.iter().any(|s| s.tls)
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tls {
            f.write_str("tcp+tls://")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for ConnectString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.servers_string())?;
        if let Some(chroot) = &self.chroot {
            f.write_str(chroot)?;
        }
        Ok(())
    }
}

impl FromStr for ConnectString {
    type Err = ZkError;

    fn from_str(input: &str) -> Result<Self, ZkError> {
        let invalid = |reason: String| ZkError::InvalidConnectString {
            input: input.to_owned(),
            reason,
        };
        let input_trimmed = input.trim();
        if input_trimmed.is_empty() {
            return Err(invalid(
                "it is empty; expected host:port[,host:port...][/chroot]".into(),
            ));
        }
        let mut segments: Vec<&str> = input_trimmed.split(',').collect();
        // The chroot follows the last server: split it off there, after any scheme.
        let last = segments.pop().unwrap_or_default();
        let (last_scheme, last_rest) = split_scheme(last);
        let (last_host, chroot) = match last_rest.find('/') {
            Some(i) => (&last_rest[..i], Some(&last_rest[i..])),
            None => (last_rest, None),
        };
        let chroot = match chroot {
            None | Some("/") => None,
            Some(c) => {
                path::validate_path(c).map_err(|e| invalid(format!("bad chroot: {e}")))?;
                Some(c.to_owned())
            }
        };
        let mut servers = Vec::with_capacity(segments.len() + 1);
        for segment in segments {
            let (tls, rest) = split_scheme(segment);
            servers.push(parse_server(rest, tls).map_err(&invalid)?);
        }
        servers.push(parse_server(last_host, last_scheme).map_err(&invalid)?);
        Ok(ConnectString { servers, chroot })
    }
}

fn split_scheme(s: &str) -> (bool, &str) {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix("tcp+tls://") {
        (true, rest)
    } else if let Some(rest) = s.strip_prefix("tcp://") {
        (false, rest)
    } else {
        (false, s)
    }
}

fn parse_server(s: &str, tls: bool) -> Result<Server, String> {
    if s.is_empty() {
        return Err("a server is empty (stray comma?)".into());
    }
    let (host, port, bracketed) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| format!("{s:?}: unclosed '[' in IPv6 address"))?;
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(format!("{s:?}: expected ':port' after ']'")),
        };
        (host, port, true)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p), false),
            None => (s, None, false),
        }
    };
    if host.is_empty() {
        return Err(format!("{s:?}: the host is empty"));
    }
    // Found by fuzzing: an unbracketed host with a ':' ("zk:2::1]:282")
    // printed back as a different connect string.
    if !bracketed && host.contains(':') {
        return Err(format!(
            "{s:?}: an IPv6 address goes in brackets, e.g. [::1]:2181"
        ));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '/' | '@' | '[' | ']'))
    {
        return Err(format!(
            "{s:?}: the host has a character that cannot be in a host name"
        ));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => {
                return Err(format!("{s:?}: the port must be a number from 1 to 65535"))
            }
            Ok(p) => p,
        },
    };
    Ok(Server {
        host: host.to_owned(),
        port,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_and_chroot() {
        let c: ConnectString = "zk-0:2181,zk-1:2182/apps/zkgate".parse().unwrap();
        assert_eq!(c.servers().len(), 2);
        assert_eq!(c.servers()[1].port, 2182);
        assert_eq!(c.chroot(), Some("/apps/zkgate"));
        assert_eq!(c.servers_string(), "zk-0:2181,zk-1:2182");
        assert_eq!(c.to_string(), "zk-0:2181,zk-1:2182/apps/zkgate");
    }

    #[test]
    fn an_unbracketed_colon_in_a_host_is_refused() {
        for bad in [
            "zk-0.zk:2::1]:282",
            "::1",
            "a:b:2181",
            "[a]b]:1",
            "[::1]]:2",
        ] {
            assert!(bad.parse::<ConnectString>().is_err(), "{bad}");
        }
    }

    #[test]
    fn default_port_tls_and_ipv6() {
        let c: ConnectString = "tcp+tls://zk,[::1]:3000/".parse().unwrap();
        assert_eq!(
            c.servers()[0],
            Server {
                host: "zk".into(),
                port: 2181,
                tls: true
            }
        );
        assert_eq!(
            c.servers()[1],
            Server {
                host: "::1".into(),
                port: 3000,
                tls: false
            }
        );
        assert_eq!(c.chroot(), None);
        assert!(c.uses_tls());
    }

    #[test]
    fn rejects_nonsense_with_reasons() {
        for (bad, why) in [
            ("", "empty"),
            ("a:2181,,b:2181", "empty"),
            ("a:0", "port"),
            ("a:99999", "port"),
            ("a:x", "port"),
            ("a:2181/chroot/", "chroot"),
            ("a:2181/x//y", "chroot"),
            (":2181", "host"),
        ] {
            let err = bad.parse::<ConnectString>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?} gave {err}");
        }
    }
}
