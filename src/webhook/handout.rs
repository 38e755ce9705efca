//! The controller's side of the credential handout ([`crate::handout`]):
//! `POST /credentials` on the webhook's port.
//!
//! A caller gets its namespace's credential only by proving it runs there:
//! its bearer token must pass a TokenReview for the audience
//! [`crate::handout::AUDIENCE`] and name a ServiceAccount of that namespace.
//! Nothing in the request body counts. Every replica with a ZooKeeper
//! session answers (reading the stored credential needs no leadership);
//! the credential itself is made by the leader at the namespace's first
//! reconcile, and until then the answer is 503 (the participant retries).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

use super::certs::ParticipantCa;
use crate::handout::{Handout, HandoutTls, AUDIENCE};
use crate::layout::Layout;
use crate::zk::Session;

/// What the handout gives out.
#[derive(Clone, Debug)]
pub struct HandoutOptions {
    /// Whether namespaces have credentials (the controller has its own).
    pub credentials: bool,
    /// With TLS to ZooKeeper: the server CA (PEM).
    pub tls_ca: Option<String>,
    /// With TLS: the CA each namespace's client certificate is issued from.
    pub participant_ca: Option<ParticipantCa>,
    /// Where the stored credentials are.
    pub layout: Layout,
    /// The one namespace the controller serves, if limited to one.
    pub scope: Option<String>,
}

/// How the handout reads a namespace's current credential (session,
/// layout, namespace, the namespace object's uid): `None` when none is
/// stored for that namespace object. The stored form is the controller's
/// (`controller::credentials`), which passes this in, so that admission
/// stands beside the controller, not on it.
pub type CurrentCredential =
    for<'a> fn(
        &'a Session,
        &'a crate::layout::Layout,
        &'a str,
        &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<String>, String>>;

/// The handout's state: its options, the API client for TokenReviews, and
/// this replica's current ZooKeeper session (`None` between terms).
pub struct Handouts {
    /// What it gives out.
    pub options: HandoutOptions,
    /// The current session.
    pub session: watch::Receiver<Option<Arc<Session>>>,
    /// Reviews tokens; reads namespaces.
    pub client: kube::Client,
    /// Counts the answers.
    pub metrics: Arc<crate::serve::metrics::Metrics>,
    /// Reads a namespace's current credential.
    pub current: CurrentCredential,
}

/// A refusal or failure, answered as a Kubernetes `Status` (what the
/// participant's client reads).
struct Refusal {
    code: StatusCode,
    message: String,
}

impl Refusal {
    fn new(code: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = kube::core::Status::failure(
            &self.message,
            self.code.canonical_reason().unwrap_or_default(),
        )
        .with_code(self.code.as_u16());
        (self.code, Json(status)).into_response()
    }
}

/// `POST /credentials`.
pub async fn serve(State(handouts): State<Arc<Handouts>>, headers: HeaderMap) -> Response {
    match handouts.hand_out(&headers).await {
        Ok(handout) => {
            handouts.metrics.handed_out("granted");
            info!(namespace = %handout.namespace, "handed out a namespace's ZooKeeper credentials");
            Json(handout).into_response()
        }
        Err(refusal) => {
            if refusal.code.is_server_error() {
                handouts.metrics.handed_out("failed");
                warn!(code = refusal.code.as_u16(), reason = %refusal.message, "no credential handout");
            } else {
                handouts.metrics.handed_out("refused");
                info!(code = refusal.code.as_u16(), reason = %refusal.message, "refused a credential request");
            }
            refusal.into_response()
        }
    }
}

impl Handouts {
    async fn hand_out(&self, headers: &HeaderMap) -> Result<Handout, Refusal> {
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::UNAUTHORIZED,
                    format!("no bearer token: send a projected ServiceAccount token of audience {AUDIENCE}"),
                )
            })?;
        let namespace = self.review(token).await?;
        if self
            .options
            .scope
            .as_ref()
            .is_some_and(|scope| *scope != namespace)
        {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                format!(
                    "this controller serves only namespace {}, not {namespace}",
                    self.options.scope.as_deref().unwrap_or_default()
                ),
            ));
        }
        let auth = match self.options.credentials {
            false => None,
            true => Some(self.credential(&namespace).await?),
        };
        let tls = match &self.options.tls_ca {
            None => None,
            Some(ca) => {
                let issued = self
                    .options
                    .participant_ca
                    .as_ref()
                    .map(|p| p.issue(&namespace))
                    .transpose()
                    .map_err(|e| {
                        Refusal::new(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("cannot issue the namespace's client certificate: {e}"),
                        )
                    })?;
                Some(HandoutTls {
                    ca: ca.clone(),
                    cert: issued.as_ref().map(|i| i.cert.clone()),
                    key: issued.map(|i| i.key),
                })
            }
        };
        Ok(Handout {
            namespace,
            auth,
            tls,
        })
    }

    /// The namespace whose ServiceAccount `token` is, if the API server
    /// says the token is valid and made for this audience.
    async fn review(&self, token: &str) -> Result<String, Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![AUDIENCE.to_owned()]),
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot review the token: {e}"),
                )
            })?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                format!(
                    "the token is not valid for audience {AUDIENCE}: {}",
                    status.error.unwrap_or_else(|| "not authenticated".into())
                ),
            ));
        }
        // An API server that does not check audiences leaves them out: a
        // token made for anything else must not pass.
        if !status.audiences.iter().flatten().any(|a| a == AUDIENCE) {
            return Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                format!("the token was not made for audience {AUDIENCE}"),
            ));
        }
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        service_account_namespace(&username)
            .map(str::to_owned)
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::FORBIDDEN,
                    format!("{username:?} is not a ServiceAccount: only pods get a namespace's credentials"),
                )
            })
    }

    /// `namespace`'s current credential, as stored for the namespace
    /// object of that name now.
    async fn credential(&self, namespace: &str) -> Result<String, Refusal> {
        let unavailable = |m: String| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, m);
        let session = self
            .session
            .borrow()
            .clone()
            .ok_or_else(|| unavailable("this replica is not connected to ZooKeeper".into()))?;
        let uid = Api::<Namespace>::all(self.client.clone())
            .get_opt(namespace)
            .await
            .map_err(|e| unavailable(format!("cannot read namespace {namespace}: {e}")))?
            .and_then(|n| n.metadata.uid)
            .ok_or_else(|| unavailable(format!("namespace {namespace} is not there")))?;
        (self.current)(&session, &self.options.layout, namespace, &uid)
            .await
            .map_err(|e| unavailable(format!("cannot read the namespace's credential: {e}")))?
            .ok_or_else(|| {
                unavailable(format!(
                    "namespace {namespace} has no credential yet: the controller makes it when it first reconciles a Barrier or LockLease there"
                ))
            })
    }
}

/// The namespace of a ServiceAccount's user name
/// (`system:serviceaccount:NAMESPACE:NAME`).
fn service_account_namespace(username: &str) -> Option<&str> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some(namespace)
}

#[cfg(test)]
mod tests {
    use super::service_account_namespace;

    #[test]
    fn only_a_service_accounts_user_name_names_a_namespace() {
        assert_eq!(
            service_account_namespace("system:serviceaccount:team-a:default"),
            Some("team-a")
        );
        for other in [
            "system:serviceaccount:team-a",
            "system:serviceaccount::default",
            "system:serviceaccount:team-a:",
            "system:serviceaccount:a:b:c",
            "system:node:worker-1",
            "alice",
            "",
        ] {
            assert_eq!(service_account_namespace(other), None, "{other}");
        }
    }
}
