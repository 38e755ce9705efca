//! Certificates made with `openssl` and `keytool` for a ZooKeeper 3.8 that
//! serves TLS on a `secureClientPort` (Netty connection factory) and asks
//! every client for a certificate.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::zookeeper::{free_port, ZkServer};
use zkgate::zk::TlsSettings;

const STORE_PASSWORD: &str = "zkgate-test";

/// A CA, a server certificate for 127.0.0.1, a client certificate, and a
/// second CA that signed none of them.
pub struct TestCerts {
    _dir: tempfile::TempDir,
    pub dir: PathBuf,
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ca(dir: &Path, name: &str) {
    run(
        dir,
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
        ],
    );
}

fn signed(dir: &Path, name: &str, ext: &str) {
    run(
        dir,
        "openssl",
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext");
    run(
        dir,
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ],
    );
}

impl TestCerts {
    /// Makes them all (a second or two).
    pub fn new() -> TestCerts {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().to_owned();
        ca(&dir, "ca");
        ca(&dir, "other-ca");
        signed(
            &dir,
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        signed(&dir, "client", "extendedKeyUsage=clientAuth\n");
        // The server's key store (PKCS#12 by openssl) and trust store
        // (the CA, imported by keytool as a trusted entry).
        run(
            &dir,
            "openssl",
            &[
                "pkcs12",
                "-export",
                "-in",
                "server.crt",
                "-inkey",
                "server.key",
                "-certfile",
                "ca.crt",
                "-name",
                "server",
                "-out",
                "server.p12",
                "-passout",
                &format!("pass:{STORE_PASSWORD}"),
            ],
        );
        run(
            &dir,
            "keytool",
            &[
                "-importcert",
                "-noprompt",
                "-alias",
                "ca",
                "-file",
                "ca.crt",
                "-keystore",
                "trust.p12",
                "-storetype",
                "PKCS12",
                "-storepass",
                STORE_PASSWORD,
            ],
        );
        TestCerts { _dir: tmp, dir }
    }

    /// A file's path.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).expect("certificate")
    }

    /// What a client presents: the right CA and the client certificate.
    pub fn client(&self) -> TlsSettings {
        TlsSettings {
            ca: self.read("ca.crt"),
            identity: Some((self.read("client.crt"), self.read("client.key"))),
        }
    }

    /// The client certificate with a CA that did not sign the server's.
    pub fn wrong_ca(&self) -> TlsSettings {
        TlsSettings {
            ca: self.read("other-ca.crt"),
            ..self.client()
        }
    }

    /// A standalone server with a plain port (for four-letter words) and a
    /// TLS port that requires a client certificate. Returns the server and
    /// the TLS address, `tcp+tls://127.0.0.1:<port>`.
    pub fn server(&self) -> (ZkServer, String) {
        let secure = free_port();
        let extra = format!(
            "secureClientPort={secure}\nsecureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.password={STORE_PASSWORD}\nssl.keyStore.type=PKCS12\n\
             ssl.trustStore.location={}\nssl.trustStore.password={STORE_PASSWORD}\nssl.trustStore.type=PKCS12\n\
             ssl.clientAuth=need\n",
            self.path("server.p12").display(),
            self.path("trust.p12").display(),
        );
        let server = ZkServer::standalone_configured(&extra);
        (server, format!("tcp+tls://127.0.0.1:{secure}"))
    }
}
