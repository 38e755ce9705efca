//! `/doctor`: what this replica knows of its ZooKeeper, for `kubectl
//! zkgate doctor`, which reads it through the API server's pod proxy (the
//! plugin runs where ZooKeeper's addresses may mean nothing, a laptop; the
//! controller runs where the participants do).
//!
//! What it reports: the session (connected, ever reached, why the last
//! term failed), each server's version and role (`srvr`), whether the
//! ensemble grants the session timeouts asked for (the controller's, and the
//! participants' default, which the webhook injects), and the ACL on the
//! root (whether ACLs are on). Credentials never appear: an ACL's digest id
//! is shown by its user alone.
//!
//! A diagnosis costs a session and a `srvr` per server, so at most one is
//! begun per [`FRESH_FOR`] whoever asks (the metrics port is reachable
//! from every pod): it runs as a task of its own, which every caller until
//! the next one awaits, so a caller that hangs up stops nothing and costs
//! nothing more. What it shows a pod is what a labelled pod is given (the
//! servers) or may ask ZooKeeper itself (`srvr`, the timeouts granted), and
//! whether ACLs are on; not who the root's ACL names.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::serve::health::Health;
use crate::zk::probe::{self, ServerStat};
use crate::zk::{Session, SessionOptions};

/// How long a diagnosis is served again before a new one is made.
pub const FRESH_FOR: Duration = Duration::from_secs(15);
/// How long each server gets to answer `srvr`.
const SRVR_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the probe session gets to connect.
const PROBE_CONNECT: Duration = Duration::from_secs(5);
/// How long the root's ACL read may take.
const ACL_READ: Duration = Duration::from_secs(3);
/// How long a probe session may take in all (connecting, a TLS
/// diagnosis, closing): the whole diagnosis stays well within the
/// plugin's wait for it.
const PROBE_LIMIT: Duration = Duration::from_secs(9);

/// A diagnosis begun, shared by every caller until the next.
type Pending = futures::future::Shared<futures::future::BoxFuture<'static, Diagnosis>>;

/// What `/doctor` answers (JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnosis {
    /// This controller's release.
    pub version: String,
    /// The servers of the connect string, `host:port`.
    pub servers: Vec<String>,
    /// The connect string's chroot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chroot: Option<String>,
    /// The root of this install's nodes, under the chroot.
    pub root: String,
    /// Whether the controller's session is connected now.
    pub connected: bool,
    /// Whether this replica has had a session since it started.
    pub reached: bool,
    /// Why the last term failed (a ZooKeeper that cannot be reached, a
    /// refused credential, a root held by another cluster), while the
    /// controller waits to try again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing: Option<String>,
    /// What each server said to `srvr`.
    pub server_stats: Vec<ServerReport>,
    /// Whether the controller has a credential (then it sets ACLs).
    pub credential: bool,
    /// The root's ACL, `scheme perms` each (`world:anyone perms` for an
    /// open one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_acl: Option<Vec<String>>,
    /// Why the root's ACL could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_acl_error: Option<String>,
    /// The session timeouts asked for, and what the ensemble grants.
    pub session_timeouts: Vec<TimeoutReport>,
    /// The CRDs this controller's release makes: each one's name and
    /// [`crate::api::schema_fingerprint`], which `kubectl zkgate doctor`
    /// compares with the cluster's (empty from a release before it).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub crds: std::collections::BTreeMap<String, String>,
}

/// One server's answer to `srvr`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerReport {
    /// `host:port`.
    pub server: String,
    /// Its release, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `leader`, `follower`, `observer`, `standalone`, or `not serving`
    /// (no quorum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Why it did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A session timeout asked for, and what the ensemble grants for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeoutReport {
    /// Whose: `controller` or `participants`.
    pub of: String,
    /// Asked for, in milliseconds.
    pub requested_ms: u64,
    /// Granted, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_ms: Option<u64>,
    /// Why it is not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Makes diagnoses for `/doctor`, at most one per [`FRESH_FOR`].
pub struct Diagnostician {
    options: SessionOptions,
    root: String,
    participants_timeout: Option<Duration>,
    session: watch::Receiver<Option<Arc<Session>>>,
    health: Arc<Health>,
    last: std::sync::Mutex<Option<(Instant, Pending)>>,
}

impl Diagnostician {
    /// One for a controller reaching ZooKeeper with `options` under `root`,
    /// whose webhook injects `participants_timeout` (`None`: no webhook);
    /// `session` follows the controller's session.
    pub fn new(
        options: SessionOptions,
        root: &str,
        participants_timeout: Option<Duration>,
        session: watch::Receiver<Option<Arc<Session>>>,
        health: Arc<Health>,
    ) -> Diagnostician {
        Diagnostician {
            options,
            root: if root.is_empty() { "/" } else { root }.to_owned(),
            participants_timeout,
            session,
            health,
            last: std::sync::Mutex::new(None),
        }
    }

    /// The diagnosis begun within [`FRESH_FOR`], else a new one.
    pub async fn diagnosis(self: &Arc<Self>) -> Diagnosis {
        let pending = {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            match last.as_ref() {
                Some((begun, pending)) if begun.elapsed() < FRESH_FOR => pending.clone(),
                _ => {
                    let this = self.clone();
                    let task = tokio::spawn(async move { this.make().await });
                    let pending: Pending = futures::FutureExt::shared(Box::pin(async move {
                        task.await.unwrap_or_else(|e| Diagnosis {
                            failing: Some(format!("the diagnosis failed: {e}")),
                            ..Default::default()
                        })
                    })
                        as futures::future::BoxFuture<'static, Diagnosis>);
                    *last = Some((Instant::now(), pending.clone()));
                    pending
                }
            }
        };
        pending.await
    }

    async fn make(&self) -> Diagnosis {
        let connect = &self.options.connect;
        // The controller's own session first, and let go at once: a term
        // that ends meanwhile must find itself the session's last holder,
        // or it cannot close it (and its leader lock outlives it).
        let (connected, own_timeout, root_acl, root_acl_error) = {
            let session = self.session.borrow().clone();
            let connected = session
                .as_ref()
                .filter(|s| s.state() == crate::zk::SessionState::Connected);
            let (acl, error) = match connected {
                // A request on a disconnected session waits for it: not asked.
                Some(session) => self.root_acl(session).await,
                None => (None, Some("no connected session".into())),
            };
            (
                connected.is_some(),
                connected.map(|s| s.timeout()),
                acl,
                error,
            )
        };
        let server_stats =
            futures::future::join_all(connect.servers().iter().map(|s| async move {
                let mut report = ServerReport {
                    server: format!("{}:{}", s.host, s.port),
                    ..Default::default()
                };
                match probe::server_stat(s, SRVR_TIMEOUT).await {
                    Ok(ServerStat::Serving { version, mode }) => {
                        report.version = Some(version);
                        report.mode = Some(mode);
                    }
                    Ok(ServerStat::NotServing) => report.mode = Some("not serving".into()),
                    Ok(ServerStat::NotAllowed) => {
                        report.error = Some("srvr is not in its 4lw.commands.whitelist".into())
                    }
                    Err(e) => report.error = Some(e.to_string()),
                }
                report
            }));
        let mut asked = vec![("controller", self.options.session_timeout, own_timeout)];
        if let Some(participants) = self.participants_timeout {
            asked.push(("participants", participants, None));
        }
        let timeouts =
            futures::future::join_all(asked.into_iter().map(|(of, requested, known)| async move {
                let mut report = TimeoutReport {
                    of: of.into(),
                    requested_ms: requested.as_millis() as u64,
                    ..Default::default()
                };
                let granted = match known {
                    Some(granted) => Ok(granted),
                    None => {
                        let options = self.options.clone().connect_timeout(PROBE_CONNECT);
                        match tokio::time::timeout(
                            PROBE_LIMIT,
                            probe::granted_session_timeout(&options, requested),
                        )
                        .await
                        {
                            Ok(granted) => granted.map_err(|e| e.to_string()),
                            Err(_) => Err("no answer in time".to_owned()),
                        }
                    }
                };
                match granted {
                    Ok(granted) => report.granted_ms = Some(granted.as_millis() as u64),
                    Err(e) => report.error = Some(e),
                }
                report
            }));
        let (server_stats, session_timeouts) = futures::join!(server_stats, timeouts);
        Diagnosis {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            servers: connect
                .servers()
                .iter()
                .map(|s| format!("{}:{}", s.host, s.port))
                .collect(),
            chroot: connect.chroot().map(str::to_owned),
            root: self.root.clone(),
            connected,
            reached: self
                .health
                .zookeeper_reached
                .load(std::sync::atomic::Ordering::SeqCst),
            failing: self.health.failing(),
            server_stats,
            credential: self.options.credential.is_some(),
            root_acl,
            root_acl_error,
            session_timeouts,
            crds: crate::api::crd_fingerprints(),
        }
    }

    /// The root's ACL as reported (who else is named is not for every
    /// pod), or why it is not known.
    async fn root_acl(&self, session: &Session) -> (Option<Vec<String>>, Option<String>) {
        match tokio::time::timeout(ACL_READ, session.client().get_acl(&self.root)).await {
            Ok(Ok((acls, _))) => (
                Some(
                    acls.iter()
                        .map(|acl| match acl.scheme() {
                            "world" => format!("world:{} {}", acl.id(), acl.permission()),
                            scheme => format!("{scheme} {}", acl.permission()),
                        })
                        .collect(),
                ),
                None,
            ),
            Ok(Err(e)) => (
                None,
                Some(format!("cannot read the ACL of {}: {e}", self.root)),
            ),
            Err(_) => (
                None,
                Some(format!("no answer reading the ACL of {}", self.root)),
            ),
        }
    }
}
