//! HTTPS to the controller's webhook port as anyone who can reach it would
//! talk to it: no client certificate, the server verified against a CA.
//! Written against the raw TLS stream so that a test sees exactly the
//! status and body the server sent.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

/// Where a test connects: an address, and the name its certificate must
/// carry (an IP address or a DNS name).
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The host to connect to (an IP address here).
    pub host: String,
    /// The port.
    pub port: u16,
    /// The name the served certificate is verified for.
    pub server_name: String,
}

impl Endpoint {
    /// A server on loopback whose certificate names 127.0.0.1.
    pub fn loopback(port: u16) -> Endpoint {
        Endpoint {
            host: "127.0.0.1".into(),
            port,
            server_name: "127.0.0.1".into(),
        }
    }

    /// A TLS connection, the served certificate verified against `ca`.
    pub async fn connect(&self, ca: &[u8]) -> TlsStream<tokio::net::TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .unwrap_or_else(|e| panic!("connect to {}:{}: {e}", self.host, self.port));
        let name = ServerName::try_from(self.server_name.clone()).expect("a server name");
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the served certificate must chain to the CA and name {}: {e}",
                    self.server_name
                )
            })
    }

    /// POSTs `body` (JSON) to `path` with `headers` (each line ending in
    /// CRLF): the HTTP status and the response body.
    pub async fn post(&self, ca: &[u8], path: &str, headers: &str, body: &str) -> (u16, String) {
        let mut tls = self.connect(ca).await;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.server_name,
            body.len()
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response).into_owned();
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }
}

/// An AdmissionReview for the creation of `pod` (JSON) named `name` in
/// `namespace`, as `user` would have it sent: what anyone who reaches the
/// webhook's port can forge.
pub fn pod_creation_review(
    namespace: &str,
    name: &str,
    user: &str,
    pod: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-00000000000f",
            "kind": { "group": "", "version": "v1", "kind": "Pod" },
            "resource": { "group": "", "version": "v1", "resource": "pods" },
            "operation": "CREATE",
            "namespace": namespace,
            "name": name,
            "userInfo": { "username": user },
            "object": pod,
            "dryRun": false
        }
    })
}
