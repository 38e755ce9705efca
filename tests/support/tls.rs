//! A ZooKeeper 3.8 that also serves TLS on a `secureClientPort` (Netty,
//! client certificates required), with certificates made by
//! `scripts/zookeeper` (openssl, keytool).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use zkgate::zk::TlsSettings;

/// The server; stopped when dropped.
pub struct TlsZooKeeper {
    dir: tempfile::TempDir,
    /// `tcp+tls://127.0.0.1:<port>`.
    pub address: String,
}

fn script(args: &[&str]) -> String {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/zookeeper"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/zookeeper");
    assert!(out.status.success(), "scripts/zookeeper {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The TLS settings of a client of a server whose certificates are in
/// `dir` (as `scripts/zookeeper certs` makes them), trusting `ca`.
pub fn client_settings(dir: &std::path::Path, ca: &str) -> TlsSettings {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("certificate");
    TlsSettings {
        ca: read(ca),
        identity: Some((read("client.crt"), read("client.key"))),
    }
}

impl TlsZooKeeper {
    /// Starts one (blocking: a few seconds).
    pub fn start() -> TlsZooKeeper {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().to_string_lossy().into_owned();
        script(&["start", &state, "--tls"]);
        let address = std::fs::read_to_string(dir.path().join("tls-address"))
            .expect("tls-address")
            .trim()
            .to_owned();
        TlsZooKeeper { dir, address }
    }

    /// A certificate file: `ca.crt`, `other-ca.crt`, `client.crt`, `client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join("tls").join(name)
    }

    /// The options giving a `zkgate controller` this server's CA and the
    /// client certificate.
    pub fn controller_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (option, file) in [
            ("--tls-ca", "ca.crt"),
            ("--tls-cert", "client.crt"),
            ("--tls-key", "client.key"),
        ] {
            args.push(option.to_owned());
            args.push(self.path(file).to_string_lossy().into_owned());
        }
        args
    }

    /// What a client presents: the right CA and the client certificate.
    pub fn client(&self) -> TlsSettings {
        client_settings(&self.dir.path().join("tls"), "ca.crt")
    }

    /// The client certificate with a CA that did not sign the server's.
    pub fn wrong_ca(&self) -> TlsSettings {
        client_settings(&self.dir.path().join("tls"), "other-ca.crt")
    }
}

impl Drop for TlsZooKeeper {
    fn drop(&mut self) {
        let _ = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/zookeeper"))
            .args(["stop", &self.dir.path().to_string_lossy()])
            .status();
    }
}
