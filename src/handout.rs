//! The credential handout: how a participant pod gets its namespace's
//! ZooKeeper credential and TLS client certificate from the controller,
//! without any Secret.
//!
//! The pod proves which namespace it runs in with a projected
//! ServiceAccount token of audience [`AUDIENCE`] (the kubelet writes it to
//! [`TOKEN_FILE`] and renews it); it POSTs to the controller's
//! [`PATH`] with that token as its bearer, the controller checks the token
//! with a TokenReview and answers with a [`Handout`] for that namespace and
//! no other. So the controller needs no right on Secrets outside its own
//! namespace (the RBAC table in docs/src/security.md says why: with Secret `create`
//! anywhere, whoever acts as the controller can make a
//! `service-account-token` Secret and read a token back).
//!
//! This module is both sides' contract and the participant's client; the
//! controller's side is `webhook::handout`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The audience of the tokens a handout accepts: a token made for the API
/// server (or anything else) is refused, so one leaked elsewhere is no key
/// here, and a handout token is no key to the API server.
pub const AUDIENCE: &str = "zkgate";
/// Where the controller serves the handout (POST, on the webhook's port).
pub const PATH: &str = "/credentials";
/// Where an injected container finds its projected token.
pub const TOKEN_FILE: &str = "/var/run/secrets/zkgate/token";

/// What a participant is handed: its namespace's ZooKeeper credential and
/// TLS material. Never the controller's own.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Handout {
    /// The namespace the token proved (the one whose nodes this opens).
    pub namespace: String,
    /// The namespace's digest credential, `user:password`; absent when the
    /// controller runs without one (open ACLs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    /// With TLS to ZooKeeper: the server CA, and a client certificate of the
    /// namespace's own when the controller has a participant CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<HandoutTls>,
}

impl std::fmt::Debug for Handout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handout")
            .field("namespace", &self.namespace)
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.as_ref().map(|t| t.cert.is_some()))
            .finish()
    }
}

/// ZooKeeper TLS material in a [`Handout`] (PEM).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandoutTls {
    /// The CA bundle the servers' certificates chain to.
    pub ca: String,
    /// A client certificate naming the namespace (`CN=zkgate-participant.NS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// Its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Why no handout came.
#[derive(Debug, thiserror::Error)]
pub enum HandoutError {
    /// The controller refused the token (401/403): it will not change by
    /// asking again.
    #[error("the controller at {url} refused the credential request: {message}")]
    Refused {
        /// Who refused.
        url: String,
        /// Its reason.
        message: String,
    },
    /// No controller answered with a handout within the time given.
    #[error("no controller handed out the namespace's credential within {within:?} (tried {urls}): {last}")]
    Unavailable {
        /// How long it was tried.
        within: Duration,
        /// The addresses tried.
        urls: String,
        /// The last failure.
        last: String,
    },
    /// The request cannot be made as given (a bad URL, CA or token file).
    #[error("{0}")]
    Invalid(String),
}

/// Where and how a participant asks for its handout.
#[derive(Clone, Debug)]
pub struct Source {
    /// The controller's addresses (`https://HOST:PORT`), tried in turn: the
    /// controller pods' own, then the Service's.
    pub urls: Vec<String>,
    /// The name the controller's certificate is checked against (its
    /// Service's DNS name), whatever address is dialled.
    pub server_name: Option<String>,
    /// The CA (PEM) the controller's certificate chains to.
    pub ca: String,
    /// The projected ServiceAccount token (audience [`AUDIENCE`]).
    pub token_file: PathBuf,
}

impl Source {
    /// Asks each address in turn until one hands out, for up to `within`
    /// (`None`: no limit), retrying from 0.2 s to 2 s apart: the controller
    /// may be starting, or the namespace's credential not made yet. A
    /// refusal ends it at once. An address that cannot be used (not
    /// `https://`, not a URL) is skipped with a warning, so one bad entry
    /// does not hide the others.
    pub async fn fetch(&self, within: Option<Duration>) -> Result<Handout, HandoutError> {
        let mut clients = Vec::new();
        let mut unusable = Vec::new();
        for url in self.urls.iter().filter(|u| !u.trim().is_empty()) {
            match self.client(url) {
                Ok(client) => clients.push((url.clone(), client)),
                Err(HandoutError::Invalid(why)) if why.starts_with("the credentials URL") => {
                    tracing::warn!(%url, reason = %why, "skipping a credentials address");
                    unusable.push(why);
                }
                Err(e) => return Err(e),
            }
        }
        if clients.is_empty() {
            return Err(HandoutError::Invalid(if unusable.is_empty() {
                "no address to ask for the credentials (--credentials-url)".into()
            } else {
                unusable.join("; ")
            }));
        }
        let deadline = within.map(|w| tokio::time::Instant::now() + w);
        let past = |at: tokio::time::Instant| deadline.is_some_and(|d| at >= d);
        let mut wait = Duration::from_millis(200);
        let mut attempts: u64 = 0;
        loop {
            let mut last = String::new();
            for (url, client) in &clients {
                if past(tokio::time::Instant::now()) {
                    break;
                }
                match ask(client).await {
                    Ok(handout) => return Ok(handout),
                    Err(kube::Error::Api(status)) if matches!(status.code, 401 | 403) => {
                        return Err(HandoutError::Refused {
                            url: url.clone(),
                            message: status.message.clone(),
                        })
                    }
                    Err(e) => {
                        tracing::debug!(%url, error = %e, "no credential handout");
                        last = format!("{url}: {e}");
                    }
                }
            }
            if past(tokio::time::Instant::now() + wait) {
                return Err(HandoutError::Unavailable {
                    within: within.unwrap_or_default(),
                    urls: self.urls.join(", "),
                    last,
                });
            }
            attempts += 1;
            if attempts % 30 == 0 {
                tracing::warn!(urls = %self.urls.join(", "), last = %last, "still asking the controller for the namespace's credentials");
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }

    /// A client of one address: the token read from its file at each
    /// request (the kubelet renews it), the certificate checked against the
    /// CA and the server name.
    fn client(&self, url: &str) -> Result<kube::Client, HandoutError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let uri: axum::http::Uri = url
            .parse()
            .map_err(|e| HandoutError::Invalid(format!("the credentials URL {url:?}: {e}")))?;
        // The token goes as the bearer: never in clear.
        if uri.scheme_str() != Some("https") {
            return Err(HandoutError::Invalid(format!(
                "the credentials URL {url:?}: must be https://"
            )));
        }
        let roots = CertificateDer::pem_slice_iter(self.ca.as_bytes())
            .map(|c| c.map(|c| c.to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| HandoutError::Invalid(format!("the credentials CA is not PEM: {e}")))?;
        if roots.is_empty() {
            return Err(HandoutError::Invalid(
                "the credentials CA holds no certificate".into(),
            ));
        }
        let mut config = kube::Config::new(uri);
        config.root_cert = Some(roots);
        config.tls_server_name = self.server_name.clone();
        config.connect_timeout = Some(Duration::from_secs(2));
        config.read_timeout = Some(Duration::from_secs(10));
        config.default_retry = false;
        config.auth_info.token_file = Some(self.token_file.to_string_lossy().into_owned());
        kube::Client::try_from(config)
            .map_err(|e| HandoutError::Invalid(format!("the credentials client for {url}: {e}")))
    }
}

async fn ask(client: &kube::Client) -> Result<Handout, kube::Error> {
    let request = axum::http::Request::post(PATH)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(b"{}".to_vec())
        .map_err(kube::Error::HttpError)?;
    client.request(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(urls: &[&str]) -> (Source, tempfile::NamedTempFile) {
        let token = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(token.path(), "t").unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["controller".into()])
            .unwrap()
            .cert
            .pem();
        let source = Source {
            urls: urls.iter().map(|u| (*u).to_owned()).collect(),
            server_name: None,
            ca,
            token_file: token.path().to_owned(),
        };
        (source, token)
    }

    #[tokio::test]
    async fn an_unusable_address_is_skipped_and_the_others_asked() {
        crate::install_crypto_provider();
        // A port nobody listens on: asked, and unavailable.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let good = format!("https://127.0.0.1:{port}");
        let (s, _token) = source(&["https://fd00::5:9443", "http://10.0.0.1:80", "", &good]);
        match s.fetch(Some(Duration::from_millis(500))).await {
            Err(HandoutError::Unavailable { urls, .. }) => assert!(urls.contains(&good)),
            other => panic!("expected the good address asked: {other:?}"),
        }
        let (s, _token) = source(&["http://10.0.0.1:80"]);
        match s.fetch(Some(Duration::from_millis(500))).await {
            Err(HandoutError::Invalid(why)) => assert!(why.contains("https://"), "{why}"),
            other => panic!("expected no usable address: {other:?}"),
        }
    }
}
