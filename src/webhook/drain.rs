//! Leaving the webhook's Service before the webhook stops serving.
//!
//! The API server calls the webhook through its Service, and with
//! `failurePolicy: Fail` a call that fails refuses the pod. A replica that
//! is told to stop (its pod deleted by a rolling update, a drain, an
//! eviction: SIGTERM) is still an endpoint of the Service for a moment:
//! the endpoints controllers drop it, then kube-proxy on every node
//! rewrites its rules, and meanwhile new calls still arrive. And the API
//! server keeps its HTTP/1.1 connections to the replica open and sends
//! calls on them for as long as they stay open; a connection closed under
//! a call fails that call (a POST is never retried). So the replica, once
//! told to stop, goes on serving while it leaves:
//!
//! 1. its readiness fails at once (for a SIGTERM that is not a deletion,
//!    the readiness probe is what takes it out of the Service);
//! 2. every answer says `Connection: close`, so each connection ends with
//!    a call answered, never under one, and the next call opens a new
//!    connection, which the Service sends elsewhere once it has left;
//! 3. it waits until the Service's endpoints no longer list it as ready
//!    ([`DRAIN_LIMIT`] at most), then [`SETTLE`] more for the nodes'
//!    proxies to follow (nothing tells when every node's has);
//!
//! and only then stops taking connections, letting calls in flight end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue};
use axum::response::Response;
use tracing::{info, warn};

use super::endpoints::{self, Endpoint};
use crate::serve::health::Health;

/// The longest a stopping replica waits to leave the Service: within the
/// pod's default 30 s grace, with room for the calls in flight and the
/// controllers' own stop.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(15);
/// How long after the endpoints dropped the replica it still serves:
/// kube-proxy applies endpoint changes within about a second
/// (`--iptables-min-sync-period`, 1 s by default).
pub const SETTLE: Duration = Duration::from_secs(2);
/// What `/readyz` says while the replica leaves.
const STOPPING: &str = "stopping: leaving the webhook's Service before it stops serving";

/// Marks the webhook serving (ready) once it listens, unless it is leaving
/// already: whichever of this and [`leave`] runs last, a leaving replica
/// ends unready.
pub fn ready_unless_leaving(health: &Health, leaving: &Leaving) {
    if leaving.is_set() {
        return;
    }
    health.set_webhook(None);
    if leaving.is_set() {
        health.set_webhook(Some(STOPPING.into()));
    }
}

/// How often the endpoints are read while waiting.
const POLL: Duration = Duration::from_millis(250);

/// Whether the webhook is leaving its Service (shared with the responses).
#[derive(Clone, Debug, Default)]
pub struct Leaving(Arc<AtomicBool>);

impl Leaving {
    /// Whether leaving has begun.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Adds `Connection: close` to `response` once leaving has begun.
    pub fn close_connections(&self, mut response: Response) -> Response {
        if self.is_set() {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Where this replica is listed: the Service (namespace, name) and its own
/// pod address.
#[derive(Clone, Debug)]
pub struct Listing {
    /// The webhook's Service.
    pub service: (String, String),
    /// This replica's pod address.
    pub pod_ip: String,
}

/// Leaves the Service (steps 1 to 3 of the module's doc) and returns when
/// the webhook may stop taking connections. Without a [`Listing`] (a
/// controller run outside the cluster, reached by a URL of its own) there
/// is no Service to leave, and it returns at once.
pub async fn leave(
    client: &kube::Client,
    health: &Health,
    leaving: &Leaving,
    listing: Option<&Listing>,
) {
    // Leaving first: the webhook's start, were it still on its way,
    // then cannot make the replica ready again (see `ready_unless_leaving`).
    leaving.set();
    health.set_webhook(Some(STOPPING.into()));
    let Some(listing) = listing else { return };
    let (namespace, name) = &listing.service;
    let left = async {
        loop {
            match endpoints::of_service(client, namespace, name).await {
                Ok(now) if !lists_ready(&now, &listing.pod_ip) => return,
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e, "cannot read the webhook Service's endpoints while leaving it")
                }
            }
            tokio::time::sleep(POLL).await;
        }
    };
    match tokio::time::timeout(DRAIN_LIMIT, left).await {
        Ok(()) => {
            info!(service = %name, "left the webhook's Service; serving a little longer for the proxies to follow")
        }
        Err(_) => {
            warn!(service = %name, limit = ?DRAIN_LIMIT, "the webhook's Service still lists this replica; stopping anyway")
        }
    }
    tokio::time::sleep(SETTLE).await;
}

/// Whether `endpoints` list `ip` among their ready addresses.
fn lists_ready(endpoints: &[Endpoint], ip: &str) -> bool {
    endpoints.iter().any(|e| e.ready && e.ip == ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(ip: &str, ready: bool) -> Endpoint {
        Endpoint {
            ip: ip.to_owned(),
            port: Some(8443),
            ready,
        }
    }

    #[test]
    fn only_a_ready_address_keeps_the_replica_in_the_service() {
        let e = [endpoint("10.0.0.1", true), endpoint("10.0.0.2", false)];
        assert!(lists_ready(&e, "10.0.0.1"));
        assert!(!lists_ready(&e, "10.0.0.2"));
        assert!(!lists_ready(&e, "10.0.0.3"));
        assert!(!lists_ready(&[], "10.0.0.1"));
    }

    fn health() -> Health {
        Health {
            metrics: Default::default(),
            ready: Default::default(),
            failing: Default::default(),
            webhook: std::sync::Mutex::new(Some("not yet".into())),
            serves_admission: true,
            zookeeper_reached: true.into(),
        }
    }

    /// Found in review: the webhook's start, if it came after the stop,
    /// made the leaving replica ready again (and a SIGTERM that is not a
    /// deletion then never took it out of the Service).
    #[test]
    fn a_webhook_that_starts_while_leaving_stays_unready() {
        let (h, leaving) = (health(), Leaving::default());
        leaving.set();
        h.set_webhook(Some(STOPPING.into()));
        ready_unless_leaving(&h, &leaving);
        assert!(h.readiness().is_err());
        let (h, leaving) = (health(), Leaving::default());
        ready_unless_leaving(&h, &leaving);
        assert!(h.readiness().is_ok());
    }

    #[test]
    fn answers_close_their_connection_once_leaving() {
        let leaving = Leaving::default();
        let kept = leaving.close_connections(Response::new(Default::default()));
        assert!(kept.headers().get(header::CONNECTION).is_none());
        leaving.set();
        let closed = leaving.close_connections(Response::new(Default::default()));
        assert_eq!(closed.headers()[header::CONNECTION], "close");
    }
}
