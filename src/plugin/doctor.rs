//! `kubectl zkgate doctor`: what an operator checks first, each with a
//! verdict and, where something is wrong, the fix.
//!
//! - the API server and the CRDs (as this release makes them);
//! - each controller Deployment: its replicas ready, and, asked through
//!   the API server's pod proxy (`/doctor` on its metrics port, see
//!   [`crate::controller::diagnosis`]), its ZooKeeper: connected, each
//!   server's version and role, ACLs on or off, the session timeouts
//!   granted against those asked for;
//! - the webhook: each `caBundle`'s certificates and their expiry, then a
//!   labelled pod created as a server-side dry run in the namespace, so
//!   the API server really calls the webhook (nothing is stored): reachable
//!   and trusted, or which of the two is not;
//! - the participants' image on the nodes (from each node's image list).
//!
//! Verdicts: `ok`, `warn` (works, but check), `FAIL` (broken), `?` (cannot
//! tell: not allowed to look, or an older controller).

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;

use super::{ControllerDeployment, Plugin, PluginError};
use crate::controller::diagnosis::Diagnosis;
use crate::webhook::inject::BARRIER_CONTAINER;
use crate::webhook::DOCTOR_PROBE_ANNOTATION;
use crate::workload::BARRIER_LABEL;

/// The chart's label on everything of an install.
const INSTALL_LABEL: &str = "app.kubernetes.io/name=zkgate";
/// How long a controller gets to answer `/doctor` (it may be making a
/// diagnosis: a probe session and a `srvr` per server).
const ASK_CONTROLLER: Duration = Duration::from_secs(20);
/// A certificate expiring within this is worth a warning.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);
/// The oldest ZooKeeper zkgate works with (TTL and container nodes).
const OLDEST_ZOOKEEPER: (u32, u32) = (3, 6);

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// As it should be.
    Ok,
    /// Works, but worth a look.
    Warn,
    /// Broken.
    Fail,
    /// Cannot tell.
    Unknown,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
            Verdict::Unknown => "?",
        }
    }
}

/// One check's finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Its verdict.
    pub verdict: Verdict,
    /// What was checked.
    pub check: &'static str,
    /// What was found.
    pub said: String,
    /// What to do, when something is wrong.
    pub fix: Option<String>,
}

impl Finding {
    fn new(verdict: Verdict, check: &'static str, said: impl Into<String>) -> Finding {
        Finding {
            verdict,
            check,
            said: said.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(fix.into());
        self
    }
}

/// The findings, as printed.
pub fn report(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let _ = writeln!(out, "{:<5} {:<16} {}", f.verdict.word(), f.check, f.said);
        if let Some(fix) = &f.fix {
            let _ = writeln!(out, "{:<22} fix: {fix}", "");
        }
    }
    out
}

impl Plugin {
    /// Every check, in the order an operator would make them. The dry-run
    /// pod is made in the plugin's namespace.
    pub async fn doctor(&self) -> Result<Vec<Finding>, PluginError> {
        let mut findings = Vec::new();
        match self.client.apiserver_version().await {
            Ok(info) => findings.push(Finding::new(Verdict::Ok, "API server", info.git_version)),
            // Nothing else can be asked.
            Err(e) => return Err(PluginError::Kube(e)),
        }
        let crds = self.crd_states().await;
        // The controllers are asked first (they say which CRDs they make),
        // and reported after the CRDs.
        let mut controllers = Vec::new();
        let (image, makers) = self.controllers(&mut controllers).await;
        findings.extend(
            crds.into_iter()
                .map(|(name, state)| crd_finding(&name, state, &makers)),
        );
        findings.extend(controllers);
        self.webhook_bundles(&mut findings).await;
        findings.push(self.admission().await);
        if let Some(image) = image {
            findings.push(self.image_on_nodes(&image).await);
        }
        Ok(findings)
    }

    /// Each controller Deployment: ready, and what it says of ZooKeeper.
    /// Returns the participants' image of the first, and what each replica
    /// asked says of the CRDs it makes.
    async fn controllers(&self, findings: &mut Vec<Finding>) -> (Option<String>, Vec<CrdMaker>) {
        let mut makers = Vec::new();
        let deployments: Api<Deployment> = Api::all(self.client.clone());
        let list = match deployments
            .list(&ListParams::default().labels(INSTALL_LABEL))
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                findings.push(Finding::new(
                    Verdict::Unknown,
                    "controller",
                    format!("cannot list Deployments in every namespace ({e})"),
                ));
                return (None, makers);
            }
        };
        if list.is_empty() {
            findings.push(
                Finding::new(
                    Verdict::Fail,
                    "controller",
                    format!("none found (no Deployment labelled {INSTALL_LABEL})"),
                )
                .fix("install the chart (docs: Installing the chart)"),
            );
            return (None, makers);
        }
        let mut image = None;
        for d in &list {
            let at = format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any());
            let ControllerDeployment {
                version,
                wanted,
                ready,
            } = ControllerDeployment::of(d);
            let container = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|s| s.containers.first());
            let participants = container.and_then(|c| {
                c.env
                    .iter()
                    .flatten()
                    .find(|e| e.name == "ZKGATE_IMAGE")
                    .and_then(|e| e.value.clone())
                    .or_else(|| c.image.clone())
            });
            if image.is_none() {
                image = participants;
            }
            findings.push(if ready == 0 && wanted > 0 {
                Finding::new(
                    Verdict::Fail,
                    "controller",
                    format!("{at}: {version}, none of {wanted} replicas ready"),
                )
                .fix(format!("kubectl -n {} describe deployment {} and its pods' logs: a replica is ready once its webhook serves and it has reached ZooKeeper", d.namespace().unwrap_or_default(), d.name_any()))
            } else {
                Finding::new(
                    Verdict::Ok,
                    "controller",
                    format!("{at}: {version}, {ready} of {wanted} replicas ready"),
                )
            });
            match self.ask(d).await {
                Ok((pod, diagnosis)) => {
                    zookeeper_findings(&at, &pod, &diagnosis, findings);
                    if !diagnosis.crds.is_empty() {
                        makers.push(CrdMaker {
                            at: at.clone(),
                            version: diagnosis.version.clone(),
                            crds: diagnosis.crds,
                        });
                    }
                }
                Err(why) => findings.push(Finding::new(
                    Verdict::Unknown,
                    "ZooKeeper",
                    format!("{at}: cannot ask a replica ({why})"),
                )),
            }
        }
        (image, makers)
    }

    /// `/doctor` of a running replica of `d`, through the pod proxy.
    async fn ask(&self, d: &Deployment) -> Result<(String, Diagnosis), String> {
        let namespace = d.namespace().unwrap_or_default();
        let selector = d
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .ok_or("its selector has no matchLabels")?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let pods = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| format!("cannot list its pods: {e}"))?;
        // The Deployment's own (its ReplicaSets are named after it): the
        // chart's quick-start ZooKeeper carries the same selector labels.
        let owned = |p: &&Pod| {
            p.owner_references().iter().any(|o| {
                o.kind == "ReplicaSet"
                    && o.name
                        .strip_prefix(d.name_any().as_str())
                        .is_some_and(|rest| rest.starts_with('-'))
            })
        };
        let ready = |p: &&Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        let mut running = pods
            .items
            .iter()
            .filter(owned)
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.metadata.deletion_timestamp.is_none()
            })
            .collect::<Vec<_>>();
        // A ready replica's word first: one restarting has not reached
        // ZooKeeper yet, whatever the others have.
        running.sort_by_key(|p| !ready(p));
        let pod = running.first().ok_or("no replica is running")?;
        let port = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.ports.as_ref())
            .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some("metrics")))
            .map(|p| p.container_port)
            .unwrap_or(8080);
        let uri = format!(
            "/api/v1/namespaces/{namespace}/pods/{}:{port}/proxy/doctor",
            pod.name_any()
        );
        let request = axum::http::Request::get(&uri)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(ASK_CONTROLLER, self.client.request_text(request))
            .await
            .map_err(|_| format!("pod {} did not answer in time", pod.name_any()))?
            .map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 404 => format!(
                    "pod {} has no /doctor: a controller of a release without it",
                    pod.name_any()
                ),
                _ => format!("pod {}: {e}", pod.name_any()),
            })?;
        let diagnosis = serde_json::from_str(&answer).map_err(|e| {
            format!(
                "pod {} answered what is not a diagnosis: {e}",
                pod.name_any()
            )
        })?;
        Ok((pod.name_any(), diagnosis))
    }

    /// Each zkgate webhook configuration's `caBundle`s (the pods'
    /// mutating one, the Barriers' validating one): there, and their
    /// certificates not expired or about to.
    async fn webhook_bundles(&self, findings: &mut Vec<Finding>) {
        let mut bundles = self
            .bundles_of::<MutatingWebhookConfiguration>(findings, |c| {
                c.webhooks
                    .iter()
                    .flatten()
                    .map(|w| (w.name.clone(), w.client_config.ca_bundle.clone()))
                    .collect()
            })
            .await;
        bundles.extend(
            self.bundles_of::<ValidatingWebhookConfiguration>(findings, |c| {
                c.webhooks
                    .iter()
                    .flatten()
                    .map(|w| (w.name.clone(), w.client_config.ca_bundle.clone()))
                    .collect()
            })
            .await,
        );
        let now = Timestamp::now();
        for (at, bundle) in bundles {
            findings.push(match bundle {
                Some(bundle) => bundle_finding(&at, &bundle.0, now),
                None => Finding::new(Verdict::Fail, "caBundle", format!("{at}: none"))
                    .fix("the controller fills it once a replica runs (or cert-manager's CA injector, with webhook.certManager): check the controller's logs"),
            });
        }
    }

    /// Each webhook's `caBundle` (`webhooks` reads them) of this install's
    /// webhook configurations of kind `K`, named `CONFIGURATION webhook
    /// NAME`; a listing that fails is a finding of its own.
    async fn bundles_of<K>(
        &self,
        findings: &mut Vec<Finding>,
        webhooks: impl Fn(&K) -> Vec<(String, Option<ByteString>)>,
    ) -> Vec<(String, Option<ByteString>)>
    where
        K: kube::Resource<Scope = kube::core::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::all(self.client.clone());
        match api.list(&ListParams::default().labels(INSTALL_LABEL)).await {
            Ok(list) => list
                .items
                .iter()
                .flat_map(|c| {
                    webhooks(c)
                        .into_iter()
                        .map(|(w, bundle)| (format!("{} webhook {w}", c.name_any()), bundle))
                })
                .collect(),
            Err(e) => {
                findings.push(Finding::new(
                    Verdict::Unknown,
                    "caBundle",
                    format!("cannot list {}s ({e})", K::kind(&Default::default())),
                ));
                Vec::new()
            }
        }
    }

    /// A labelled pod created as a dry run: the API server calls the
    /// webhook (its `sideEffects: None` allows it) and stores nothing.
    async fn admission(&self) -> Finding {
        let pod: Pod = match serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "zkgate-doctor-",
                "labels": { BARRIER_LABEL: "zkgate-doctor" },
                "annotations": { DOCTOR_PROBE_ANNOTATION: "true" },
            },
            "spec": {
                "restartPolicy": "Never",
                // Not zkgate's image: a pod that runs zkgate of its own
                // gets nothing injected. It never runs.
                "containers": [{
                    "name": "probe",
                    "image": "zkgate-doctor-probe:none",
                    "command": ["true"],
                }],
            },
        })) {
            Ok(pod) => pod,
            Err(e) => {
                return Finding::new(Verdict::Unknown, "webhook", format!("no probe pod: {e}"))
            }
        };
        let pods: Api<Pod> = self.api();
        let params = PostParams {
            dry_run: true,
            ..Default::default()
        };
        admission_finding(&self.namespace, pods.create(&params, &pod).await)
    }

    /// Whether the nodes list `image` among theirs.
    async fn image_on_nodes(&self, image: &str) -> Finding {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let nodes = match nodes.list(&ListParams::default()).await {
            Ok(nodes) => nodes.items,
            Err(e) => {
                return Finding::new(
                    Verdict::Unknown,
                    "image",
                    format!("{image}: cannot list nodes ({e})"),
                )
            }
        };
        let wanted = full_image_name(image);
        let on = nodes
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.images.as_ref())
                    .is_some_and(|images| {
                        images
                            .iter()
                            .flat_map(|i| i.names.iter().flatten())
                            .any(|name| full_image_name(name) == wanted)
                    })
            })
            .count();
        if on == 0 {
            Finding::new(
                Verdict::Warn,
                "image",
                format!("{image} is on none of the {} nodes' image lists (a node lists at most 50)", nodes.len()),
            )
            .fix("each node pulls it at its first labelled pod: make sure nodes can (a registry they reach; webhook.participantImagePullSecrets for a private one)")
        } else {
            Finding::new(
                Verdict::Ok,
                "image",
                format!("{image} is on {on} of {} nodes", nodes.len()),
            )
        }
    }
}

/// The state of one of zkgate's CRDs in the cluster.
pub(super) enum CrdState {
    /// Installed: the versions served, and its schemas'
    /// [`crate::api::schema_fingerprint`].
    Found { served: String, fingerprint: String },
    /// Not installed.
    Missing,
    /// Could not be read.
    Unreadable(kube::Error),
}

/// A controller that said which CRDs its release makes.
pub(super) struct CrdMaker {
    /// Its Deployment, `namespace/name`.
    at: String,
    /// Its release.
    version: String,
    /// Each CRD's name and fingerprint.
    crds: std::collections::BTreeMap<String, String>,
}

/// The verdict on the CRD `name` as installed: against what the
/// controllers make where they said (the CRDs must be the controller's
/// release's, whatever the plugin's), else against this plugin's release.
fn crd_finding(name: &str, state: CrdState, makers: &[CrdMaker]) -> Finding {
    let (served, fingerprint) = match state {
        CrdState::Found {
            served,
            fingerprint,
        } => (served, fingerprint),
        CrdState::Missing => {
            return Finding::new(Verdict::Fail, "CRD", format!("{name}: not installed"))
                .fix("install the chart, or kubectl apply the release's crds/")
        }
        CrdState::Unreadable(e) => {
            return Finding::new(
                Verdict::Unknown,
                "CRD",
                format!("{name}: cannot be read ({e})"),
            )
        }
    };
    if makers.is_empty() {
        // No controller said (none answered, or one of a release before
        // it said nothing of its CRDs).
        return if crate::api::crd_fingerprints().get(name) == Some(&fingerprint) {
            Finding::new(
                Verdict::Ok,
                "CRD",
                format!("{name}: serves {served}, as this plugin's release makes it"),
            )
        } else {
            Finding::new(
                Verdict::Warn,
                "CRD",
                format!(
                    "{name}: serves {served}, not as this plugin's release ({}) makes it",
                    env!("CARGO_PKG_VERSION")
                ),
            )
            .fix("upgrade the CRDs with the chart (helm upgrade) or apply the release's crds/; if the controller is another release, use its kubectl-zkgate")
        };
    }
    let named = |m: &CrdMaker| format!("{} ({})", m.at, m.version);
    let differing: Vec<String> = makers
        .iter()
        .filter(|m| m.crds.get(name) != Some(&fingerprint))
        .map(named)
        .collect();
    if differing.is_empty() {
        let all: Vec<String> = makers.iter().map(named).collect();
        Finding::new(
            Verdict::Ok,
            "CRD",
            format!(
                "{name}: serves {served}, as the controller makes it: {}",
                all.join(", ")
            ),
        )
    } else {
        Finding::new(
            Verdict::Warn,
            "CRD",
            format!(
                "{name}: serves {served}, not as the controller makes it: {}",
                differing.join(", ")
            ),
        )
        .fix("upgrade the CRDs to the controller's release: helm upgrade with its chart (CRDs included), or kubectl apply --server-side -f its zkgate-VERSION.yaml (docs: Upgrading)")
    }
}

/// What the controller's diagnosis says of ZooKeeper, the ACLs and the
/// session timeouts.
fn zookeeper_findings(at: &str, pod: &str, d: &Diagnosis, findings: &mut Vec<Finding>) {
    let servers = format!(
        "{}{}",
        d.servers.join(","),
        d.chroot.as_deref().unwrap_or_default()
    );
    let said = d
        .server_stats
        .iter()
        .map(|s| match (&s.version, &s.mode, &s.error) {
            (Some(v), Some(m), _) => format!("{} {v} {m}", s.server),
            (None, Some(m), _) => format!("{} {m}", s.server),
            (_, _, Some(e)) => format!("{} ({e})", s.server),
            _ => s.server.clone(),
        })
        .collect::<Vec<_>>()
        .join("; ");
    if !d.connected {
        let why = d.failing.clone().unwrap_or_else(|| {
            if d.reached {
                "its session is disconnected".into()
            } else {
                "it has not reached ZooKeeper since it started".into()
            }
        });
        findings.push(
            Finding::new(
                Verdict::Fail,
                "ZooKeeper",
                format!("{at} (pod {pod}) is not connected to {servers}: {why}; the servers: {said}"),
            )
            .fix("check zookeeper.connect, that the servers run and have a quorum, and that nothing (a NetworkPolicy, a firewall) stops the controller's pods from reaching them (docs: When ZooKeeper is down)"),
        );
    } else {
        findings.push(Finding::new(
            Verdict::Ok,
            "ZooKeeper",
            format!("{at} (pod {pod}) is connected to {servers}; the servers: {said}"),
        ));
    }
    for s in &d.server_stats {
        if let Some(version) = &s.version {
            let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            let release = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            if release < OLDEST_ZOOKEEPER {
                findings.push(
                    Finding::new(
                        Verdict::Fail,
                        "ZooKeeper",
                        format!("{} runs {version}: zkgate needs 3.6 or newer", s.server),
                    )
                    .fix("upgrade the ensemble (TTL and container nodes came in 3.6)"),
                );
            } else if crate::zk::probe::leaks_paths_to_watchers(version) {
                findings.push(
                    Finding::new(
                        Verdict::Warn,
                        "ZooKeeper",
                        format!("{} runs {version}: a persistent watch is told the paths of nodes its client may not read (CVE-2024-23944), so a participant of any namespace can learn every namespace's node names (its pods' names)", s.server),
                    )
                    .fix("upgrade the ensemble to 3.8.4, 3.9.2 or later"),
                );
            }
        }
        if s.mode.as_deref() == Some("not serving") {
            findings.push(
                Finding::new(
                    Verdict::Warn,
                    "ZooKeeper",
                    format!("{} serves no clients: it has no quorum", s.server),
                )
                .fix("see that a majority of the servers run and reach each other"),
            );
        }
    }
    match (&d.root_acl, d.credential) {
        (Some(acl), true) if !acl.iter().any(|a| a.starts_with("world:anyone")) => {
            findings.push(Finding::new(
                Verdict::Ok,
                "ACLs",
                format!("on: {} is {}", d.root, acl.join(", ")),
            ))
        }
        (Some(acl), _) => findings.push(
            Finding::new(
                Verdict::Warn,
                "ACLs",
                format!("off: {} is {}, and any pod that reaches ZooKeeper may change any namespace's barriers and locks", d.root, acl.join(", ")),
            )
            .fix("give the controller a credential (zookeeper.auth.existingSecret): it then gives each namespace its own (docs: Security)"),
        ),
        (None, _) => findings.push(Finding::new(
            Verdict::Unknown,
            "ACLs",
            format!(
                "the root's ACL is not known: {}",
                d.root_acl_error.as_deref().unwrap_or("no answer")
            ),
        )),
    }
    for t in &d.session_timeouts {
        let requested = humantime::format_duration(Duration::from_millis(t.requested_ms));
        findings.push(match (t.granted_ms, &t.error) {
            (Some(granted), _) if granted == t.requested_ms => Finding::new(
                Verdict::Ok,
                "session timeout",
                format!("{} ask {requested} and are granted it", t.of),
            ),
            (Some(granted), _) => Finding::new(
                Verdict::Warn,
                "session timeout",
                format!(
                    "{} ask {requested} and the servers grant {}: outside their minSessionTimeout..maxSessionTimeout (by default 2 and 20 tickTimes)",
                    t.of,
                    humantime::format_duration(Duration::from_millis(granted))
                ),
            )
            .fix(if t.of == "participants" {
                "set webhook.participantSessionTimeout within the servers' bounds, or widen them"
            } else {
                "set zookeeper.sessionTimeout within the servers' bounds, or widen them"
            }),
            (None, e) => Finding::new(
                Verdict::Unknown,
                "session timeout",
                format!(
                    "{} ask {requested}; what the servers grant is not known ({})",
                    t.of,
                    e.as_deref().unwrap_or("no answer")
                ),
            ),
        });
    }
}

/// A `caBundle`'s certificates against `now`.
fn bundle_finding(at: &str, bundle: &[u8], now: Timestamp) -> Finding {
    let mut expiries = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(bundle) {
        let parsed = pem.map_err(|e| e.to_string()).and_then(|pem| {
            pem.parse_x509()
                .map(|c| c.validity().not_after.timestamp())
                .map_err(|e| e.to_string())
        });
        match parsed {
            Ok(not_after) => expiries.push(not_after),
            Err(e) => {
                return Finding::new(
                    Verdict::Fail,
                    "caBundle",
                    format!("{at}: not PEM certificates ({e})"),
                )
                .fix("something wrote it over (a GitOps tool?): the controller puts its CA back within a minute; keep caBundle out of the tool's diff (docs: Failure modes)")
            }
        }
    }
    let Some(last) = expiries.iter().max().copied() else {
        return Finding::new(Verdict::Fail, "caBundle", format!("{at}: no certificate"))
            .fix("the controller fills it within a minute (or cert-manager's CA injector): check the controller's logs");
    };
    // A bundle may hold an old CA beside the new one (a rollover): it
    // works while the newest is valid.
    let left = last - now.as_second();
    let until = Timestamp::from_second(last)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| last.to_string());
    if left <= 0 {
        Finding::new(Verdict::Fail, "caBundle", format!("{at}: expired at {until}"))
            .fix("empty the webhook certificate Secret (kubectl -n NAMESPACE patch secret zkgate-webhook-tls --type=json -p '[{\"op\":\"remove\",\"path\":\"/data\"}]'; not a delete: the controller may not create it) so the controller makes a new CA, or renew cert-manager's (docs: Failure modes)")
    } else if left < EXPIRY_WARNING.as_secs() as i64 {
        Finding::new(Verdict::Warn, "caBundle", format!("{at}: expires at {until}"))
            .fix("renew it before then (zkgate's own CA lives ten years: a short one is another issuer's)")
    } else {
        Finding::new(
            Verdict::Ok,
            "caBundle",
            format!("{at}: valid until {until}"),
        )
    }
}

/// What the dry-run create of a labelled pod in `namespace` tells of the
/// webhook.
pub(crate) fn admission_finding(namespace: &str, created: Result<Pod, kube::Error>) -> Finding {
    let message = match created {
        Ok(pod) => {
            let spec = pod.spec.unwrap_or_default();
            let injected = spec
                .init_containers
                .iter()
                .flatten()
                .chain(spec.containers.iter())
                .any(|c| c.name.starts_with("zkgate-") || c.name == BARRIER_CONTAINER);
            return if injected {
                Finding::new(
                    Verdict::Ok,
                    "webhook",
                    format!("the API server called it for a labelled pod in {namespace} (a dry run) and it gave the pod zkgate's containers"),
                )
            } else {
                Finding::new(
                    Verdict::Warn,
                    "webhook",
                    format!("a labelled pod in {namespace} was admitted without zkgate's containers: no zkgate webhook covers this namespace"),
                )
                .fix("the chart's webhook leaves out kube-system, namespaces labelled zkgate.io/webhook=disabled, and all but controller.watchNamespace when set; or webhook.enabled is false; or, with webhook.failurePolicy Ignore, a webhook that failed (see its caBundle above) was passed over")
            };
        }
        Err(kube::Error::Api(status)) => status.message.clone(),
        Err(e) => {
            return Finding::new(
                Verdict::Unknown,
                "webhook",
                format!("the dry run did not reach the API server ({e})"),
            )
        }
    };
    let Some(webhook) = message
        .split("failed calling webhook \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
    else {
        let denied_by = message
            .split("admission webhook \"")
            .nth(1)
            .and_then(|rest| rest.split_once("\" denied the request"))
            .map(|(name, _)| name.to_owned());
        return if let Some(name) = denied_by.as_ref().filter(|n| n.ends_with(".zkgate.io")) {
            Finding::new(
                Verdict::Warn,
                "webhook",
                format!("the API server called {name} for a labelled pod in {namespace} (a dry run), and it refused the probe (a controller of a release without the probe?): {message}"),
            )
        } else if let Some(name) = denied_by {
            Finding::new(
                Verdict::Unknown,
                "webhook",
                format!("another admission webhook, {name}, refused the probe pod in {namespace} before zkgate's could be seen: {message}"),
            )
            .fix("run it with -n NAMESPACE where that policy admits such a pod, or look at that webhook's rules")
        } else if message.contains("forbidden") || message.contains("Forbidden") {
            Finding::new(
                Verdict::Unknown,
                "webhook",
                format!("cannot make a dry-run pod in {namespace}: {message}"),
            )
            .fix("run it as someone who may create pods there, or with -n NAMESPACE")
        } else {
            Finding::new(
                Verdict::Warn,
                "webhook",
                format!("the dry-run labelled pod in {namespace} was refused: {message}"),
            )
        };
    };
    let lower = message.to_lowercase();
    if ["x509", "certificate", "tls:"]
        .iter()
        .any(|m| lower.contains(m))
    {
        Finding::new(
            Verdict::Fail,
            "webhook",
            format!("the API server does not trust webhook {webhook}'s certificate: its caBundle is not the CA that signed it ({message})"),
        )
        .fix("the controller puts its CA into caBundle within a minute; if something writes it back (a GitOps tool applying the chart's empty caBundle), keep caBundle out of its diff (docs: Failure modes); with cert-manager, check its CA injector")
    } else {
        Finding::new(
            Verdict::Fail,
            "webhook",
            format!("the API server cannot reach webhook {webhook}: {message}"),
        )
        .fix("check that a controller replica is ready (its Service's endpoints), and that nothing (a NetworkPolicy, a firewall) stops the API server from reaching the pods' webhook port (docs: Network requirements)")
    }
}

/// `image` as a node lists it: `busybox:1.36` is
/// `docker.io/library/busybox:1.36`.
fn full_image_name(image: &str) -> String {
    let (first, rest) = image.split_once('/').unwrap_or(("", image));
    if !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost") {
        return image.to_owned();
    }
    match first {
        "" => format!("docker.io/library/{rest}"),
        _ => format!("docker.io/{image}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(message: &str) -> Result<Pod, kube::Error> {
        Err(kube::Error::Api(Box::new(
            kube::core::Status::failure(message, "InternalError").with_code(500),
        )))
    }

    #[test]
    fn the_crds_are_judged_against_the_controllers_release_where_it_says() {
        let name = "barriers.zkgate.io";
        let ours = crate::api::crd_fingerprints()[name].clone();
        let found = |fingerprint: &str| CrdState::Found {
            served: "v1alpha1".into(),
            fingerprint: fingerprint.into(),
        };
        let maker = |at: &str, version: &str, fingerprint: &str| CrdMaker {
            at: at.into(),
            version: version.into(),
            crds: [(name.to_owned(), fingerprint.to_owned())].into(),
        };
        // The cluster's CRD is another release's, as is the controller's:
        // fine, whatever the plugin is.
        let older = maker("zkgate-system/zkgate", "0.1.0", "0ld");
        let f = crd_finding(name, found("0ld"), std::slice::from_ref(&older));
        assert_eq!(f.verdict, Verdict::Ok, "{f:?}");
        assert!(f
            .said
            .contains("as the controller makes it: zkgate-system/zkgate (0.1.0)"));
        // This plugin's release's CRD beside that controller: named.
        let f = crd_finding(name, found(&ours), &[older]);
        assert_eq!(f.verdict, Verdict::Warn, "{f:?}");
        assert!(f
            .said
            .contains("not as the controller makes it: zkgate-system/zkgate (0.1.0)"));
        assert!(f.fix.is_some());
        // Two installs of different releases on one cluster: the one whose
        // CRDs differ is named.
        let f = crd_finding(
            name,
            found(&ours),
            &[
                maker("a/zkgate", env!("CARGO_PKG_VERSION"), &ours),
                maker("b/zkgate", "0.1.0", "0ld"),
            ],
        );
        assert_eq!(f.verdict, Verdict::Warn);
        assert!(f.said.contains("b/zkgate (0.1.0)") && !f.said.contains("a/zkgate"));
        // No controller said: this plugin's release is the reference.
        assert_eq!(crd_finding(name, found(&ours), &[]).verdict, Verdict::Ok);
        assert_eq!(crd_finding(name, found("0ld"), &[]).verdict, Verdict::Warn);
        assert_eq!(
            crd_finding(name, CrdState::Missing, &[]).verdict,
            Verdict::Fail
        );
    }

    /// A change to a schema changes the fingerprint (a description too: the
    /// verdict on a mismatch is a warning, not a failure, for that reason).
    #[test]
    fn a_crds_fingerprint_follows_its_schemas() {
        let crd = crate::api::crds().remove(0);
        let mut changed = crd.clone();
        changed.spec.versions[0]
            .schema
            .as_mut()
            .unwrap()
            .open_api_v3_schema
            .as_mut()
            .unwrap()
            .description = Some("another".into());
        assert_ne!(
            crate::api::schema_fingerprint(&crd),
            crate::api::schema_fingerprint(&changed)
        );
        let mut renamed = crd.clone();
        renamed.metadata.labels = Some([("other".to_owned(), "label".to_owned())].into());
        assert_eq!(
            crate::api::schema_fingerprint(&crd),
            crate::api::schema_fingerprint(&renamed),
            "only the versions and their schemas count"
        );
    }

    /// What a replica's diagnosis says of ZooKeeper, the ACLs and the
    /// session timeouts, each verdict with its fix.
    #[test]
    fn the_diagnosis_names_open_acls_clamped_timeouts_and_an_old_or_quorumless_server() {
        use crate::controller::diagnosis::{ServerReport, TimeoutReport};
        let healthy = Diagnosis {
            version: "0.2.0".into(),
            servers: vec!["zk-0:2181".into(), "zk-1:2181".into()],
            root: "/zkgate".into(),
            connected: true,
            reached: true,
            server_stats: vec![
                ServerReport {
                    server: "zk-0:2181".into(),
                    version: Some("3.9.3".into()),
                    mode: Some("leader".into()),
                    error: None,
                },
                ServerReport {
                    server: "zk-1:2181".into(),
                    version: Some("3.9.3".into()),
                    mode: Some("follower".into()),
                    error: None,
                },
            ],
            credential: true,
            root_acl: Some(vec!["digest ALL".into()]),
            session_timeouts: vec![TimeoutReport {
                of: "participants".into(),
                requested_ms: 10_000,
                granted_ms: Some(10_000),
                error: None,
            }],
            ..Default::default()
        };
        let verdicts = |d: &Diagnosis| {
            let mut findings = Vec::new();
            zookeeper_findings("zkgate-system/zkgate", "zkgate-0", d, &mut findings);
            findings
        };
        let found = verdicts(&healthy);
        assert!(found.iter().all(|f| f.verdict == Verdict::Ok), "{found:?}");

        let mut open = healthy.clone();
        open.credential = false;
        open.root_acl = Some(vec!["world:anyone ALL".into()]);
        open.session_timeouts[0].granted_ms = Some(4_000);
        open.server_stats[0].version = Some("3.5.10".into());
        open.server_stats[1].mode = Some("not serving".into());
        let found = verdicts(&open);
        let of = |check: &str| {
            found
                .iter()
                .filter(|f| f.check == check)
                .map(|f| (f.verdict, f.said.as_str(), f.fix.as_deref().unwrap_or("")))
                .collect::<Vec<_>>()
        };
        let acls = of("ACLs");
        assert_eq!(acls.len(), 1);
        assert_eq!(acls[0].0, Verdict::Warn);
        assert!(
            acls[0].1.starts_with("off:") && acls[0].2.contains("zookeeper.auth.existingSecret")
        );
        let timeouts = of("session timeout");
        assert_eq!(timeouts[0].0, Verdict::Warn);
        assert!(
            timeouts[0].1.contains("ask 10s and the servers grant 4s")
                && timeouts[0].2.contains("webhook.participantSessionTimeout"),
            "{timeouts:?}"
        );
        let zookeeper = of("ZooKeeper");
        assert!(
            zookeeper
                .iter()
                .any(|(v, said, _)| *v == Verdict::Fail && said.contains("runs 3.5.10")),
            "{zookeeper:?}"
        );
        assert!(
            zookeeper
                .iter()
                .any(|(v, said, _)| *v == Verdict::Warn && said.contains("no quorum")),
            "{zookeeper:?}"
        );

        // A release before the persistent-watch fix: a warning, its fix.
        let mut leaking = healthy.clone();
        leaking.server_stats[1].version = Some("3.8.3".into());
        let found = verdicts(&leaking);
        assert!(
            found.iter().any(|f| f.verdict == Verdict::Warn
                && f.said.starts_with("zk-1:2181 runs 3.8.3")
                && f.said.contains("CVE-2024-23944")
                && f.fix.as_deref().is_some_and(|fix| fix.contains("3.8.4"))),
            "{found:?}"
        );

        let mut cut_off = healthy.clone();
        cut_off.connected = false;
        cut_off.failing = Some("cannot reach zk-0:2181".into());
        cut_off.root_acl = None;
        cut_off.root_acl_error = Some("no connected session".into());
        let found = verdicts(&cut_off);
        assert!(found.iter().any(|f| f.verdict == Verdict::Fail
            && f.check == "ZooKeeper"
            && f.said.contains("is not connected")
            && f.said.contains("cannot reach zk-0:2181")));
        assert!(found
            .iter()
            .any(|f| f.verdict == Verdict::Unknown && f.check == "ACLs"));
    }

    #[test]
    fn the_dry_run_names_an_untrusted_certificate_and_an_unreachable_webhook() {
        let untrusted = admission_finding(
            "default",
            refused("Internal error occurred: failed calling webhook \"pods.zkgate.io\": failed to call webhook: Post \"https://zkgate-webhook.zkgate-system.svc:443/mutate?timeout=10s\": tls: failed to verify certificate: x509: certificate signed by unknown authority"),
        );
        assert_eq!(untrusted.verdict, Verdict::Fail);
        assert!(untrusted
            .said
            .contains("does not trust webhook pods.zkgate.io"));
        let unreachable = admission_finding(
            "default",
            refused("Internal error occurred: failed calling webhook \"pods.zkgate.io\": failed to call webhook: Post \"https://zkgate-webhook.zkgate-system.svc:443/mutate?timeout=10s\": dial tcp 10.96.0.12:443: connect: connection refused"),
        );
        assert_eq!(unreachable.verdict, Verdict::Fail);
        assert!(unreachable
            .said
            .contains("cannot reach webhook pods.zkgate.io"));
        let denied = admission_finding(
            "default",
            refused("admission webhook \"barrier.pods.zkgate.io\" denied the request: no Barrier"),
        );
        assert_eq!(
            denied.verdict,
            Verdict::Warn,
            "the probe is admitted by this release"
        );
        let policy = admission_finding(
            "default",
            refused("admission webhook \"validate.kyverno.svc-fail\" denied the request: no"),
        );
        assert_eq!(policy.verdict, Verdict::Unknown, "{policy:?}");
        assert!(policy.said.contains("validate.kyverno.svc-fail"));
    }

    fn certificate(not_after_days: i64) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(400);
        params.not_after = now + time::Duration::days(not_after_days);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_bundle_works_while_its_newest_certificate_is_valid() {
        let now = Timestamp::now();
        let (old, new) = (certificate(-1), certificate(3650));
        let both = format!("{old}{new}");
        assert_eq!(
            bundle_finding("w", both.as_bytes(), now).verdict,
            Verdict::Ok
        );
        assert_eq!(
            bundle_finding("w", old.as_bytes(), now).verdict,
            Verdict::Fail
        );
        let soon = certificate(10);
        assert_eq!(
            bundle_finding("w", soon.as_bytes(), now).verdict,
            Verdict::Warn
        );
    }

    #[test]
    fn image_names_are_compared_as_nodes_list_them() {
        assert_eq!(
            full_image_name("busybox:1.36"),
            "docker.io/library/busybox:1.36"
        );
        assert_eq!(
            full_image_name("zkgate/zkgate:1"),
            "docker.io/zkgate/zkgate:1"
        );
        assert_eq!(
            full_image_name("ghcr.io/zkgate/zkgate:0.2.0"),
            "ghcr.io/zkgate/zkgate:0.2.0"
        );
        assert_eq!(full_image_name("localhost/z:1"), "localhost/z:1");
    }

    #[test]
    fn a_bundle_that_is_not_pem_fails_and_an_empty_one_too() {
        let now = Timestamp::now();
        assert_eq!(bundle_finding("w", b"garbage", now).verdict, Verdict::Fail);
        assert_eq!(bundle_finding("w", b"", now).verdict, Verdict::Fail);
    }
}
