//! The mutating admission webhook (`zkgate controller --webhook-addr`): a
//! pod labelled `zkgate.io/barrier` or `zkgate.io/lock` comes out of
//! admission with the container that makes it wait ([`inject`]).
//!
//! Admission writes nothing: it is a function of the request and of what
//! the API server says (the LockLease or Barrier the label names, or the
//! Job that will have one), so a review forged by anyone who can reach the
//! port (it carries no proof of coming from the API server) makes nothing
//! happen. What a labelled pod needs besides its patch is made by the
//! leading controller from what it watches: a labelled Job's Barrier (from
//! the Jobs, the controller's Job cache). Every replica serves admission
//! (it needs no leadership), and beside it the credential handout
//! ([`handout`]): how injected containers get their namespace's ZooKeeper
//! credential and TLS material without any Secret. The chart registers it
//! with an `objectSelector`, so only labelled pods ever reach it and an
//! unlabelled pod is never held up by a webhook that is down, and
//! `failurePolicy: Fail`, so a gang member never starts without its barrier.

pub mod barriers;
pub mod certs;
pub mod drain;
pub mod endpoints;
pub mod handout;
pub mod inject;
pub mod resources;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use kube::runtime::{watcher, WatchStreamExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::certs::{SelfManaged, Serving};
use self::handout::{HandoutOptions, Handouts};
use self::inject::{inject, HandoutTarget, Injection};
use crate::api::{Barrier, LockLease};
use crate::serve::backoff::Backoff;
use crate::serve::health::Health;
use crate::serve::metrics::Metrics;
use crate::workload::BARRIER_LABEL;
use crate::zk::Session;

/// How the webhook gets its serving certificate.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// Made and rotated by the controller ([`certs`]).
    SelfManaged {
        /// The Secret's namespace (the controller's).
        namespace: Option<String>,
        /// The Secret's name.
        secret: String,
        /// The MutatingWebhookConfiguration whose `caBundle` is kept.
        configuration: Option<String>,
        /// The names the API server reaches the webhook by.
        names: Vec<String>,
    },
    /// `tls.crt` and `tls.key` in a directory (a Secret cert-manager keeps,
    /// mounted), read again when they change.
    Dir(PathBuf),
}

/// How the webhook runs.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// Where it listens (HTTPS).
    pub addr: SocketAddr,
    /// Its certificate.
    pub certs: CertSource,
    /// What the injected containers are given (where they ask for their
    /// credentials is filled in as the webhook starts).
    pub injection: Injection,
    /// What the credential handout gives out.
    pub handout: HandoutOptions,
    /// The webhook's Service (namespace, name): its pods' addresses (and
    /// last the Service's own) are where injected containers ask for their
    /// credentials, checked against the name `NAME.NAMESPACE.svc`.
    pub service: Option<(String, String)>,
    /// Where injected containers ask for their credentials instead (a URL
    /// the pods reach; checked against the first of the webhook's names).
    pub handout_url: Option<String>,
    /// This replica's pod address: asked first, so pods admitted before
    /// the Service's endpoints list any replica can still ask this one.
    pub pod_ip: Option<String>,
    /// The one namespace the controller reconciles, if it is limited to
    /// one: pods elsewhere are left as they are (nothing would reconcile
    /// their Barrier, so they would wait forever).
    pub scope: Option<String>,
    /// Whether the server runs native sidecars, if said
    /// (`--native-sidecars`); otherwise read from its version.
    pub native_sidecars: Option<bool>,
    /// Whether the cluster restarts a pod's containers in place, if said
    /// (`--in-place-restart`); otherwise read from its version.
    pub in_place_restart: Option<bool>,
}

struct Webhook {
    client: kube::Client,
    /// Behind a lock: the handout's addresses and CA follow the controller
    /// pods and the certificate's renewals.
    injection: std::sync::RwLock<Injection>,
    scope: Option<String>,
    metrics: Arc<Metrics>,
}

impl Webhook {
    fn injection(&self) -> Injection {
        self.injection
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_handout(&self, change: impl FnOnce(&mut HandoutTarget)) {
        let mut injection = self.injection.write().unwrap_or_else(|e| e.into_inner());
        if let Some(target) = injection.handout.as_mut() {
            change(target);
        }
    }
}

/// Serves the webhook until `shutdown`; the certificate is made (or read)
/// first, and kept up to date while serving.
pub async fn run(
    options: WebhookOptions,
    client: kube::Client,
    health: Arc<Health>,
    session: tokio::sync::watch::Receiver<Option<Arc<Session>>>,
    current: handout::CurrentCredential,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = health.metrics.clone();
    let mut injection = options.injection.clone();
    let minor = served_minor(&client).await;
    // An API server without native sidecars drops `restartPolicy: Always`:
    // the sidecar becomes an init container that never ends.
    injection.native_sidecars = server_feature(
        options.native_sidecars,
        minor.is_some_and(|m| m >= NATIVE_SIDECARS_SINCE),
        "--native-sidecars=true, but this API server's version runs none: pods in a sidecar form will wait in Init for ever",
    );
    // One without the gate drops `restartPolicyRules`: the gang's
    // commands would run on through a restart.
    injection.in_place_restart = server_feature(
        options.in_place_restart,
        minor.is_some_and(|m| m >= IN_PLACE_RESTART_SINCE),
        "--in-place-restart=true, but this API server's version restarts no pod in place by default: the sidecar form in rounds needs the RestartAllContainersOnContainerExits gate on the API server and on every kubelet",
    );
    let (first, mut next) = certificates(options.certs.clone(), client.clone(), shutdown.clone())
        .await
        .context("cannot get the webhook's serving certificate")?;
    injection.handout = handout_target(&options, &client, &first).await;
    let tls = RustlsConfig::from_config(server_config(&first)?);
    metrics.set_certificate_expiry(not_after(&first.cert).unwrap_or(0));
    let hook = Arc::new(Webhook {
        client: client.clone(),
        injection: std::sync::RwLock::new(injection),
        scope: options.scope.clone(),
        metrics,
    });
    tokio::spawn({
        let tls = tls.clone();
        let hook = hook.clone();
        async move {
            while let Some(serving) = next.recv().await {
                match server_config(&serving) {
                    Ok(config) => {
                        tls.reload_from_config(config);
                        hook.metrics
                            .set_certificate_expiry(not_after(&serving.cert).unwrap_or(0));
                        // Pods admitted from now on check the renewed one.
                        if !serving.ca.is_empty() {
                            hook.set_handout(|t| t.ca = serving.ca.clone());
                        }
                        info!("the webhook serves its renewed certificate");
                    }
                    Err(e) => warn!(error = %e, "cannot use the renewed webhook certificate"),
                }
            }
        }
    });
    let handing_out = hook.injection().handout.is_some();
    if let (Some(service), None, true) = (&options.service, &options.handout_url, handing_out) {
        tokio::spawn(follow_endpoints(
            hook.clone(),
            service.clone(),
            own_url(&options),
            shutdown.clone(),
        ));
    }
    let handouts = Arc::new(Handouts {
        options: options.handout.clone(),
        session,
        client: client.clone(),
        metrics: hook.metrics.clone(),
        current,
    });
    let leaving = drain::Leaving::default();
    let app = Router::new()
        .route("/mutate", post(mutate))
        .route(barriers::PATH, post(barriers::validate))
        .with_state(hook)
        .merge(
            Router::new()
                .route(crate::handout::PATH, post(handout::serve))
                .with_state(handouts),
        )
        .layer(axum::middleware::map_response({
            let leaving = leaving.clone();
            move |response| {
                let leaving = leaving.clone();
                async move { leaving.close_connections(response) }
            }
        }));
    let handle = axum_server::Handle::new();
    let listing = match (&options.service, &options.pod_ip) {
        (Some(service), Some(pod_ip)) if !pod_ip.is_empty() => Some(drain::Listing {
            service: service.clone(),
            pod_ip: pod_ip.clone(),
        }),
        _ => None,
    };
    tokio::spawn({
        let (handle, client, health) = (handle.clone(), client.clone(), health.clone());
        let leaving = leaving.clone();
        async move {
            shutdown.cancelled().await;
            drain::leave(&client, &health, &leaving, listing.as_ref()).await;
            handle.graceful_shutdown(Some(Duration::from_secs(5)));
        }
    });
    tokio::spawn({
        let (handle, leaving) = (handle.clone(), leaving.clone());
        async move {
            if handle.listening().await.is_some() {
                drain::ready_unless_leaving(&health, &leaving);
            }
        }
    });
    info!(addr = %options.addr, "serving the admission webhook and the credential handout");
    axum_server::bind_rustls(options.addr, tls)
        .handle(handle)
        .serve(app.into_make_service())
        .await
        .with_context(|| format!("cannot serve the webhook on {}", options.addr))
}

/// The label by which the chart's `namespaceSelector` leaves a namespace
/// out of admission (beside kube-system, by its `kubernetes.io/metadata.name`):
/// its pods are never sent to the webhook.
pub const EXCLUDED_LABEL: &str = "zkgate.io/webhook";
/// [`EXCLUDED_LABEL`]'s value that excludes.
pub const EXCLUDED_VALUE: &str = "disabled";

/// The minor version from which native sidecars (init containers with
/// `restartPolicy: Always`) are on by default.
const NATIVE_SIDECARS_SINCE: u32 = 29;
/// The minor version from which the kubelet restarts a pod's containers
/// in place on a container's exit (`RestartAllContainersOnContainerExits`,
/// beta and on by default in 1.36).
const IN_PLACE_RESTART_SINCE: u32 = 36;

/// Whether to use a feature of the API server's: what the flag said, else
/// whether the server's version has it; saying yes to a server without it
/// is allowed (a gate may be on by hand) but warned about.
fn server_feature(said: Option<bool>, served: bool, unserved_warning: &str) -> bool {
    if said == Some(true) && !served {
        warn!("{unserved_warning}");
    }
    said.unwrap_or(served)
}

/// The API server's minor version of Kubernetes 1 (a later major counts
/// as every minor); `None` when it cannot be read (the forms that depend
/// on it are then refused).
async fn served_minor(client: &kube::Client) -> Option<u32> {
    match client.apiserver_version().await {
        Ok(v) if v.major.parse::<u32>().is_ok_and(|m| m > 1) => Some(u32::MAX),
        Ok(v) => Some(
            v.minor
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .unwrap_or(0),
        ),
        Err(e) => {
            warn!(error = %e, "cannot read the API server's version: the sidecar forms are refused");
            None
        }
    }
}

/// Where injected containers ask for their credentials: `--handout-url`,
/// or the webhook Service's pods (filled in by [`follow_endpoints`]) and
/// then the Service itself; `None` when there is nothing to hand out (no
/// controller credential, no TLS), or when the webhook knows neither (a
/// warning: pods then get no credentials).
async fn handout_target(
    options: &WebhookOptions,
    client: &kube::Client,
    serving: &Serving,
) -> Option<HandoutTarget> {
    if !options.handout.credentials && options.handout.tls_ca.is_none() {
        // Open ACLs, no TLS: there is nothing to hand out, and pods need
        // not ask.
        return None;
    }
    let server_name = |names: &[String]| names.first().cloned();
    let names = match &options.certs {
        CertSource::SelfManaged { names, .. } => names.clone(),
        CertSource::Dir(_) => Vec::new(),
    };
    if serving.ca.is_empty() {
        warn!("the webhook's certificate comes without its CA (ca.crt): injected containers cannot check the credential handout, and get no credentials");
        return None;
    }
    if let Some(url) = &options.handout_url {
        return Some(HandoutTarget {
            urls: vec![url.clone()],
            server_name: server_name(&names),
            ca: serving.ca.clone(),
        });
    }
    let Some((namespace, name)) = &options.service else {
        warn!("neither --webhook-service nor --handout-url: injected containers do not know where to ask for their credentials");
        return None;
    };
    let own = own_url(options);
    let urls = handout_urls(client, namespace, name, own.as_deref())
        .await
        .unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the webhook Service and its endpoints yet: pods admitted meanwhile ask this replica and the Service");
            own.into_iter().chain([service_url(namespace, name, 443)]).collect()
        });
    Some(HandoutTarget {
        urls,
        server_name: Some(format!("{name}.{namespace}.svc")),
        ca: serving.ca.clone(),
    })
}

/// This replica's own handout URL, when its pod address is known.
fn own_url(options: &WebhookOptions) -> Option<String> {
    let ip = options.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    Some(endpoint_url(ip, i32::from(options.addr.port())))
}

/// The addresses of the handout behind the Service `name`: `own` (this
/// replica's) and each endpoint's (pods reach those wherever Service
/// addresses are not routed for them), then the Service's DNS name.
async fn handout_urls(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    own: Option<&str>,
) -> Result<Vec<String>, kube::Error> {
    let service = Api::<Service>::namespaced(client.clone(), namespace)
        .get(name)
        .await?;
    let port = service
        .spec
        .and_then(|s| s.ports)
        .and_then(|p| p.first().map(|p| p.port))
        .unwrap_or(443);
    // Not-ready ones too: a replica is not Ready until its webhook
    // serves, and then it also hands out.
    let mut urls: Vec<String> = endpoints::of_service(client, namespace, name)
        .await?
        .into_iter()
        .filter_map(|e| Some(endpoint_url(&e.ip, e.port?)))
        .collect();
    urls.extend(own.map(str::to_owned));
    urls.sort();
    urls.dedup();
    urls.push(service_url(namespace, name, port));
    Ok(urls)
}

/// The handout's URL at the Service's DNS name.
fn service_url(namespace: &str, name: &str, port: i32) -> String {
    format!("https://{name}.{namespace}.svc:{port}")
}

/// The handout's URL at an endpoint's address (IPv6 in brackets).
fn endpoint_url(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("https://[{ip}]:{port}")
    } else {
        format!("https://{ip}:{port}")
    }
}

/// Keeps the handout's addresses in step with the Service's endpoints
/// (controller pods come and go), looking every 10 seconds.
async fn follow_endpoints(
    hook: Arc<Webhook>,
    (namespace, name): (String, String),
    own: Option<String>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
        match handout_urls(&hook.client, &namespace, &name, own.as_deref()).await {
            Ok(urls) if !urls.is_empty() => hook.set_handout(|t| t.urls = urls),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot read the webhook Service's endpoints"),
        }
    }
}

/// The first certificate, and later ones as they are renewed.
async fn certificates(
    source: CertSource,
    client: kube::Client,
    shutdown: CancellationToken,
) -> anyhow::Result<(Serving, tokio::sync::mpsc::Receiver<Serving>)> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    match source {
        CertSource::Dir(dir) => {
            let read = |dir: &PathBuf| -> anyhow::Result<Serving> {
                let file = |name: &str| {
                    std::fs::read_to_string(dir.join(name))
                        .with_context(|| format!("cannot read {}", dir.join(name).display()))
                };
                Ok(Serving {
                    // cert-manager puts the issuing CA beside the leaf; the
                    // handout's clients check the webhook against it
                    // (without it the handout is not offered: see
                    // handout_target).
                    ca: file(certs::CA_CERT).unwrap_or_else(|e| {
                        warn!(
                            error = format!("{e:#}"),
                            "no CA beside the webhook certificate"
                        );
                        String::new()
                    }),
                    cert: file(certs::TLS_CERT)?,
                    key: file(certs::TLS_KEY)?,
                })
            };
            let first = read(&dir)?;
            let mut last = first.clone();
            tokio::spawn(async move {
                // cert-manager rewrites the mounted Secret; the kubelet
                // updates the files within a minute or so.
                while !shutdown.is_cancelled() {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                    }
                    match read(&dir) {
                        Ok(now) if now != last => {
                            last = now.clone();
                            if tx.send(now).await.is_err() {
                                break;
                            }
                        }
                        Ok(_) => {}
                        Err(e) => warn!(error = %e, "cannot read the webhook certificate"),
                    }
                }
            });
            Ok((first, rx))
        }
        CertSource::SelfManaged {
            namespace,
            secret,
            configuration,
            names,
        } => {
            let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
            let certs = SelfManaged {
                secret: Api::namespaced(client.clone(), &namespace),
                secret_name: secret.clone(),
                configuration,
                names,
            };
            let first = certs.ensure().await?;
            certs.publish_ca(&client, &first.ca).await?;
            tokio::spawn(keep_certificates(
                certs,
                client,
                first.clone(),
                tx,
                shutdown,
            ));
            Ok((first, rx))
        }
    }
}

/// How soon the certificate keeper looks again after a failed look (the
/// API server down, say): from half a second, doubling, up to the periodic
/// look's minute. Without it a watch that ends at once on every poll made
/// a failed look (and a warning) after another as fast as they could go.
const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));

/// Renews the certificate when due and keeps the `caBundle` published:
/// looked at whenever the Secret changes (a rotation asked for by
/// annotation is done at once) and every minute (expiry; a `caBundle` reset
/// by a chart upgrade). After a failed look the next one waits for
/// [`RETRY`]'s backoff, whatever the watch says, and the watch's own
/// restarts are paced by its backoff: an API server that is down costs a
/// few requests and warnings a minute, not a stream of them.
async fn keep_certificates(
    certs: SelfManaged,
    client: kube::Client,
    mut last: Serving,
    tx: tokio::sync::mpsc::Sender<Serving>,
    shutdown: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", certs.secret_name));
    let mut changes = watcher(certs.secret.clone(), config)
        .default_backoff()
        .boxed();
    // Failed looks in a row.
    let mut failures: u32 = 0;
    loop {
        let wait = match failures {
            0 => Duration::from_secs(60),
            n => RETRY.wait(n - 1),
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changes.next(), if failures == 0 => {}
            _ = tokio::time::sleep(wait) => {}
        }
        let serving = match certs.ensure().await {
            Ok(serving) => serving,
            Err(e) => {
                failures = failures.saturating_add(1);
                warn!(error = %e, failures, "cannot renew the webhook certificate; retrying with a backoff");
                continue;
            }
        };
        match certs.publish_ca(&client, &serving.ca).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures = failures.saturating_add(1);
                warn!(error = %e, failures, "cannot publish the webhook CA; retrying with a backoff");
            }
        }
        if serving != last {
            last = serving.clone();
            if tx.send(serving).await.is_err() {
                return;
            }
        }
    }
}

/// When the first certificate of `pem` (the leaf) expires, Unix seconds.
fn not_after(pem: &str) -> Option<i64> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// A rustls server configuration serving `serving`'s leaf.
fn server_config(serving: &Serving) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(serving.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("the webhook certificate is not PEM")?;
    let key = PrivateKeyDer::from_pem_slice(serving.key.as_bytes())
        .context("the webhook key is not PEM")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("no TLS version")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the webhook certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn mutate(
    State(hook): State<Arc<Webhook>>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(e) => return Json(AdmissionResponse::invalid(e.to_string()).into_review()),
    };
    let started = std::time::Instant::now();
    let response = hook.admit(&request).await;
    hook.metrics.admission_took(started.elapsed());
    Json(response.into_review())
}

/// Whether `name` is a namespace's name (an RFC 1123 label).
fn is_namespace_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// How a refusal for want of an API read begins: counted as a failed
/// admission, not a refused pod.
const UNREADABLE: &str = "zkgate could not check the ";

/// On a dry-run pod, `"true"`: `kubectl zkgate doctor`'s probe, which names
/// no Barrier that exists; admitted without its resources checked.
pub const DOCTOR_PROBE_ANNOTATION: &str = "zkgate.io/doctor-probe";

impl Webhook {
    async fn admit(&self, request: &AdmissionRequest<Pod>) -> AdmissionResponse {
        let response = AdmissionResponse::from(request);
        let Some(pod) = &request.object else {
            return response;
        };
        let namespace = request
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone())
            .unwrap_or_default();
        let who = pod
            .metadata
            .name
            .clone()
            .or_else(|| pod.metadata.generate_name.clone())
            .unwrap_or_default();
        // The API server sends real namespaces only; a review POSTed
        // straight at the port need not. Refused before any read: a read
        // naming no namespace fails, and counting that as a failed
        // admission would let anyone keep ZkgateAdmissionsFailing firing.
        if !is_namespace_name(&namespace) {
            self.metrics.admitted("refused");
            return response.deny(format!("{namespace:?} is not a namespace's name"));
        }
        // The chart's namespaceSelector already keeps kube-system out; this
        // holds on API servers without the namespace name label too.
        if namespace == "kube-system" {
            return response;
        }
        if self.scope.as_ref().is_some_and(|scope| *scope != namespace) {
            self.metrics.admitted("unchanged");
            return response;
        }
        let mutated = match inject(pod, &self.injection()) {
            Err(refusal) => {
                info!(%namespace, pod = %who, reason = %refusal, "refused a labelled pod");
                self.metrics.admitted("refused");
                return response.deny(refusal.to_string());
            }
            Ok(mutated) => mutated,
        };
        // Every labelled pod, whether anything is injected or not (a pod
        // that carries zkgate of its own gets nothing added, and would
        // otherwise wait for what nobody makes). But `kubectl zkgate
        // doctor`'s probe: a dry run (stored nowhere, so nothing waits),
        // made to see the webhook called and answer, names nothing.
        let probe = request.dry_run
            && pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DOCTOR_PROBE_ANNOTATION))
                .is_some_and(|v| v == "true");
        if probe {
            info!(%namespace, "kubectl zkgate doctor's dry-run probe pod: its resources are not checked");
        } else if let Err(refusal) = self
            .check_resources(pod, &namespace, &self.injection())
            .await
        {
            // An API read that failed is ours, not the pod's.
            let outcome = if refusal.starts_with(UNREADABLE) {
                "failed"
            } else {
                "refused"
            };
            info!(%namespace, pod = %who, reason = %refusal, "refused a labelled pod");
            self.metrics.admitted(outcome);
            return response.deny(refusal);
        }
        let mutated = match mutated {
            None => {
                self.metrics.admitted("unchanged");
                return response;
            }
            // Admitted before (another of the chart's webhooks matched it):
            // nothing more to add.
            Some(mutated) if mutated == *pod => {
                self.metrics.admitted("unchanged");
                return response;
            }
            Some(mutated) => mutated,
        };
        let (before, after) = match (serde_json::to_value(pod), serde_json::to_value(&mutated)) {
            (Ok(b), Ok(a)) => (b, a),
            _ => {
                self.metrics.admitted("failed");
                return response.deny("zkgate could not encode the pod");
            }
        };
        match response
            .clone()
            .with_patch(json_patch::diff(&before, &after))
        {
            Ok(r) => {
                info!(%namespace, pod = %who, "injected zkgate into a labelled pod");
                self.metrics.admitted("injected");
                r
            }
            Err(e) => {
                self.metrics.admitted("failed");
                response.deny(format!("zkgate could not encode the patch: {e}"))
            }
        }
    }

    /// Whether what the pod's labels name exists (reads only): a LockLease
    /// of that name, and a Barrier of that name or a Job of the pod's that
    /// will have one (the controller makes a labelled Job's Barrier). A pod
    /// that would wait for something nobody makes is refused with the
    /// reason, rather than left waiting without one. When zkgate gives the
    /// pod its participant (it carries none of its own), its form must
    /// agree with the Barrier's rounds ([`inject::agrees_with_barrier`]).
    async fn check_resources(
        &self,
        pod: &Pod,
        namespace: &str,
        injection: &Injection,
    ) -> Result<(), String> {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let unreadable =
            |what: &str, e: kube::Error| format!("{UNREADABLE}{what} the pod's label names: {e}");
        if let Some(lock) = labels.get(crate::workload::LOCK_LABEL) {
            let api: Api<LockLease> = Api::namespaced(self.client.clone(), namespace);
            let Some(lease) = api
                .get_opt(lock)
                .await
                .map_err(|e| unreadable("LockLease", e))?
            else {
                return Err(format!(
                    "the pod's label {}={lock} names a LockLease that does not exist in namespace {namespace}: create the LockLease first",
                    crate::workload::LOCK_LABEL
                ));
            };
            // A side is for a ReadWrite lock: a reader of an Exclusive one
            // would hold beside another (the participant refuses it too).
            if let Some(side) = labels.get(inject::LOCK_MODE_LABEL) {
                if lease.spec.mode != crate::api::LockMode::ReadWrite {
                    return Err(format!(
                        "the pod's label {}={side} asks for a side of the LockLease {lock}, which is {:?}: sides are for ReadWrite LockLeases (remove the label, or make the LockLease ReadWrite)",
                        inject::LOCK_MODE_LABEL,
                        lease.spec.mode
                    ));
                }
            }
        }
        if let Some(barrier) = labels.get(BARRIER_LABEL) {
            let api: Api<Barrier> = Api::namespaced(self.client.clone(), namespace);
            // Roles in order: the Barriers it starts after must not start
            // after it (checked by `inject` before: a bad value is refused).
            let annotations = pod.metadata.annotations.clone().unwrap_or_default();
            let after = crate::workload::template::after_of(&annotations).unwrap_or_default();
            if !after.is_empty() {
                let first = after.into_iter().map(|a| a.barrier).collect();
                let chain = crate::workload::after::cycle_from(
                    &api,
                    barrier,
                    first,
                    &mut Default::default(),
                )
                .await
                .map_err(|e| unreadable("Barriers", e))?;
                if let Some(why) = chain.refusal() {
                    return Err(format!(
                        "the pod's annotation {}, with the Barriers there now, {why}",
                        crate::workload::template::AFTER_ANNOTATION
                    ));
                }
            }
            let jobs: Api<Job> = Api::namespaced(self.client.clone(), namespace);
            let ours = crate::workload::run::run_of_pod(pod);
            // What JobSet's pods must say for zkgate to keep them one gang.
            if let Some(why) = crate::workload::run::jobset_pod_refusal(&labels) {
                return Err(why);
            }
            // A pod that says it is of a JobSet's run (by the labels JobSet
            // gives its pods, which whoever makes a pod can write) must be
            // of a Job that says so too.
            let jobset_job = match (&ours, crate::workload::run::job_of(pod)) {
                (Some(run), Some(job))
                    if labels.contains_key(crate::workload::run::JOBSET_UID_LABEL) =>
                {
                    let found = jobs
                        .get_opt(&job.name)
                        .await
                        .map_err(|e| unreadable("Job", e))?
                        .filter(|j| j.metadata.uid.as_deref() == Some(job.uid.as_str()));
                    let theirs = found.as_ref().and_then(crate::workload::run::run_of_job);
                    let Some(theirs) = theirs.filter(|r| r.id == *run && r.of_jobset()) else {
                        return Err(format!(
                            "the pod's labels {} and {} say it is of JobSet run {run}, but its Job {} (uid {}) is not of that run",
                            crate::workload::run::JOBSET_UID_LABEL,
                            crate::workload::run::JOBSET_RESTART_LABEL,
                            job.name,
                            job.uid
                        ));
                    };
                    Some(theirs)
                }
                _ => None,
            };
            if let Some(found) = api
                .get_opt(barrier)
                .await
                .map_err(|e| unreadable("Barrier", e))?
            {
                // Another run's: an earlier one's is replaced (the pod's
                // participant waits for its own); a live one's stays, and
                // two live runs never share a gang.
                let holder = crate::workload::run::holder_of(&found);
                let agrees = || -> Result<(), String> {
                    // A pod carrying zkgate of its own says its own form;
                    // a Barrier being deleted is not the one it will meet.
                    if inject::carries_zkgate(pod, &injection.image)
                        || found.metadata.deletion_timestamp.is_some()
                    {
                        return Ok(());
                    }
                    // Checked by `inject` before: a pod it refused is not here.
                    let Ok(wanted) = inject::wanted(pod, injection) else {
                        return Ok(());
                    };
                    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
                    let (Some((_, form)), Ok((asked, _))) = (
                        wanted.barrier,
                        crate::workload::template::loss_policy(&annotations),
                    ) else {
                        return Ok(());
                    };
                    inject::agrees_with_barrier(
                        barrier,
                        found.spec.on_participant_loss,
                        asked,
                        form,
                    )
                    .map_err(|refusal| refusal.to_string())?;
                    // The order it asks for must be the Barrier's (fixed
                    // when it was made), or it would start at once.
                    let after =
                        crate::workload::template::after_of(&annotations).unwrap_or_default();
                    if !after.is_empty() && after != found.spec.after {
                        let names = |a: &[crate::api::After]| {
                            a.iter()
                                .map(|a| format!("{} ({:?})", a.barrier, a.until))
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        return Err(format!(
                            "the pod's annotation {} asks Barrier {barrier} to start after {}, but it was made to start after [{}]: make the Barrier with that after (delete it and create it again), or drop the annotation",
                            crate::workload::template::AFTER_ANNOTATION,
                            names(&after),
                            names(&found.spec.after)
                        ));
                    }
                    Ok(())
                };
                let Some((holder, run)) = holder else {
                    return agrees();
                };
                // A Barrier zkgate made for a run takes that run's pods
                // only: a pod of no Job would add itself to their gang.
                let Some(ours) = ours else {
                    return Err(format!(
                        "the pod's label {BARRIER_LABEL}={barrier} names the Barrier zkgate made for {} {} (run {run}), and the pod is of no Job: only that run's pods take part in it. Give the pod a {BARRIER_LABEL} label of its own, with a Barrier made for it",
                        holder.kind, holder.name
                    ));
                };
                if run == ours {
                    return agrees();
                }
                let live =
                    crate::workload::lookup::run_is_live(&self.client, namespace, holder, &run)
                        .await
                        .map_err(|e| unreadable(&holder.kind, e))?;
                if live {
                    return Err(format!(
                        "the pod's label {BARRIER_LABEL}={barrier} names the Barrier of {} {} (run {run}), which still runs: two running Jobs never share a Barrier. Give this Job's pod template a {BARRIER_LABEL} label of its own, or run it after {} is over (the Job controller retries the pod)",
                        holder.kind, holder.name, holder.name
                    ));
                }
                return Ok(());
            }
            let job = crate::workload::run::job_of(pod);
            let missing = format!(
                "the pod's label {BARRIER_LABEL}={barrier} names a Barrier that does not exist in namespace {namespace}"
            );
            let Some(owner) = job else {
                // A bare pod, or one of another owner (a training
                // operator's): only the Barrier knows the gang's size.
                let controller = pod
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.controller == Some(true))
                    .map(|o| format!(" (its controller is {} {})", o.kind, o.name))
                    .unwrap_or_default();
                return Err(format!(
                    "{missing}, and the pod belongs to no Job{controller}. zkgate makes the Barrier of a Job or JobSet whose pod template carries the label; for other pods, create the Barrier, with its participants, first"
                ));
            };
            let found = jobs
                .get_opt(&owner.name)
                .await
                .map_err(|e| unreadable("Job", e))?;
            let labelled = found.as_ref().is_some_and(|j| {
                j.metadata.uid.as_deref() == Some(owner.uid.as_str())
                    && crate::workload::run::barrier_label(j) == Some(barrier.as_str())
            });
            // A JobSet's Barrier is made only if the JobSet can be sized:
            // say why not here, where the user sees it (the Job's events),
            // rather than leave the pod waiting for a Barrier nobody makes.
            if let (true, Some(run)) = (labelled, &jobset_job) {
                match crate::workload::lookup::jobset_size(
                    &self.client,
                    namespace,
                    &run.owner,
                    barrier,
                )
                .await
                {
                    Ok(Ok(_)) => {}
                    Ok(Err(why)) => {
                        return Err(format!(
                            "{missing}, and zkgate cannot make it for JobSet {}: {why}",
                            run.owner.name
                        ))
                    }
                    Err(e) => return Err(unreadable("JobSet", e)),
                }
            }
            if !labelled {
                return Err(format!(
                    "{missing}, and its Job {} (uid {}) {}: create the Barrier first",
                    owner.name,
                    owner.uid,
                    if found.is_none() {
                        "does not exist"
                    } else {
                        "is not that one or its pod template does not carry the label"
                    }
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{endpoint_url, is_namespace_name};

    #[test]
    fn only_a_namespaces_name_is_taken_for_one() {
        for good in ["default", "team-a", "a", "x1-2"] {
            assert!(is_namespace_name(good), "{good}");
        }
        for bad in ["", "a b", "A", "-a", "a-", "a/b", "a.b", &"a".repeat(64)] {
            assert!(!is_namespace_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_ipv6_endpoint_is_bracketed() {
        assert_eq!(endpoint_url("10.88.0.5", 9443), "https://10.88.0.5:9443");
        assert_eq!(endpoint_url("fd00::5", 9443), "https://[fd00::5]:9443");
        for url in [
            endpoint_url("fd00::5", 9443),
            endpoint_url("10.88.0.5", 9443),
        ] {
            url.parse::<axum::http::Uri>().expect("a valid URL");
        }
    }
}
