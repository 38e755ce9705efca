//! `zkgate status` (`-A`: every namespace's) and `zkgate why`: who waits
//! for whom, read from the API server alone (no ZooKeeper access needed);
//! `zkgate version` and `zkgate doctor` (see [`doctor`]): what runs, and
//! what is wrong with it. Installed as `kubectl-zkgate` (the same binary),
//! they are `kubectl zkgate status|why|version|doctor`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::ResourceExt;

use crate::api::{Barrier, BarrierPhase, LockLease};
use crate::webhook::inject::BARRIER_CONTAINER;
use crate::workload::run::holder_of;
use crate::workload::run::job_of;
use crate::workload::run::{run_of_pod, JOBSET_NAME_LABEL};
use crate::workload::{BARRIER_LABEL, LOCK_LABEL};
use doctor::CrdState;

mod doctor;

pub use doctor::{report as doctor_report, Finding, Verdict};

/// Why the plugin could not answer.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No kubeconfig or in-cluster configuration.
    #[error("cannot reach the Kubernetes API: {0}")]
    Connect(#[source] kube::Error),
    /// The object asked about does not exist.
    #[error("{kind} {name} not found in namespace {namespace}")]
    NotFound {
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// The namespace looked in.
        namespace: String,
    },
    /// The API server refused or failed.
    #[error("the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Which kind `zkgate status` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Barriers.
    #[value(alias = "barriers", alias = "zbar")]
    Barrier,
    /// LockLeases.
    #[value(alias = "lockleases", alias = "lock", alias = "zlock")]
    Locklease,
}

/// A client and the namespace to look in (the kubeconfig's by default).
pub struct Plugin {
    client: kube::Client,
    namespace: String,
}

impl Plugin {
    /// Connects with the kubeconfig (or in-cluster configuration).
    pub async fn connect(namespace: Option<String>) -> Result<Plugin, PluginError> {
        let client = kube::Client::try_default()
            .await
            .map_err(PluginError::Connect)?;
        let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
        Ok(Plugin { client, namespace })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: crate::api::Namespaced,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// `status [KIND [NAME]]`: one object in detail, or every Barrier and
    /// LockLease of the namespace in a line each.
    pub async fn status(
        &self,
        kind: Option<Kind>,
        name: Option<&str>,
    ) -> Result<String, PluginError> {
        let now = Timestamp::now();
        match (kind, name) {
            (Some(Kind::Barrier), Some(name)) => {
                let barrier = self.get::<Barrier>(name).await?;
                let pods = self.pods_of(&barrier).await?;
                Ok(barrier_report(&barrier, &pods, now))
            }
            (Some(Kind::Locklease), Some(name)) => {
                let lock = self.get::<LockLease>(name).await?;
                Ok(lock_report(&lock, now))
            }
            (kind, None) => {
                let mut out = String::new();
                if kind != Some(Kind::Locklease) {
                    for b in self.api::<Barrier>().list(&ListParams::default()).await? {
                        let _ = writeln!(out, "{}", barrier_line(&b));
                    }
                }
                if kind != Some(Kind::Barrier) {
                    for l in self.api::<LockLease>().list(&ListParams::default()).await? {
                        let _ = writeln!(out, "{}", lock_line(&l));
                    }
                }
                if out.is_empty() {
                    out = format!(
                        "no Barriers or LockLeases in namespace {}\n",
                        self.namespace
                    );
                }
                Ok(out)
            }
            (None, Some(name)) => {
                // A name alone: whichever kind has it.
                if self.api::<Barrier>().get_opt(name).await?.is_some() {
                    Box::pin(self.status(Some(Kind::Barrier), Some(name))).await
                } else {
                    Box::pin(self.status(Some(Kind::Locklease), Some(name))).await
                }
            }
        }
    }

    /// `status -A [KIND]`: every Barrier and LockLease of every namespace
    /// the caller may list, a line each after its namespace, by namespace.
    pub async fn status_everywhere(&self, kind: Option<Kind>) -> Result<String, PluginError> {
        let mut lines: Vec<(String, u8, String)> = Vec::new();
        if kind != Some(Kind::Locklease) {
            for b in Api::<Barrier>::all(self.client.clone())
                .list(&ListParams::default())
                .await?
            {
                lines.push((b.namespace().unwrap_or_default(), 0, barrier_line(&b)));
            }
        }
        if kind != Some(Kind::Barrier) {
            for l in Api::<LockLease>::all(self.client.clone())
                .list(&ListParams::default())
                .await?
            {
                lines.push((l.namespace().unwrap_or_default(), 1, lock_line(&l)));
            }
        }
        if lines.is_empty() {
            return Ok("no Barriers or LockLeases in any namespace\n".to_owned());
        }
        // Each namespace's together, Barriers first (a stable sort keeps
        // the API server's order by name within).
        lines.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let width = lines.iter().map(|l| l.0.len()).max().unwrap_or(0);
        Ok(lines
            .iter()
            .map(|(namespace, _, line)| format!("{namespace:width$}  {line}\n"))
            .collect())
    }

    /// `version`: this plugin's, the API server's, the CRDs' (whether they
    /// are as this plugin's release makes them), and every zkgate
    /// controller's the caller may list (its Deployment, by the chart's
    /// `app.kubernetes.io/name` label: image, version, pods ready).
    pub async fn version(&self) -> Result<String, PluginError> {
        use k8s_openapi::api::apps::v1::Deployment;
        let mut out = format!("plugin       zkgate {}\n", env!("CARGO_PKG_VERSION"));
        let server = match self.client.apiserver_version().await {
            Ok(info) => info.git_version,
            Err(e) => format!("unknown ({e})"),
        };
        let _ = writeln!(out, "API server   {server}");
        let ours = crate::api::crd_fingerprints();
        for (name, state) in self.crd_states().await {
            let state = match state {
                CrdState::Found {
                    served,
                    fingerprint,
                } if ours.get(&name) == Some(&fingerprint) => {
                    format!("serves {served}, as this release makes them")
                }
                CrdState::Found { served, .. } => format!("serves {served}, not as this release makes them: another release's (upgrade them with the chart, or apply its crds/)"),
                CrdState::Missing => "not installed".to_owned(),
                CrdState::Unreadable(e) => format!("cannot be read ({e})"),
            };
            let _ = writeln!(out, "CRD          {name}: {state}");
        }
        let deployments: Api<Deployment> = Api::all(self.client.clone());
        let listed = deployments
            .list(&ListParams::default().labels("app.kubernetes.io/name=zkgate"))
            .await;
        match listed {
            Ok(list) if list.items.is_empty() => {
                let _ = writeln!(
                    out,
                    "controller   none found (no Deployment labelled app.kubernetes.io/name=zkgate)"
                );
            }
            Ok(list) => {
                for d in list {
                    let images: Vec<String> = d
                        .spec
                        .as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .map(|s| {
                            s.containers
                                .iter()
                                .filter_map(|c| c.image.clone())
                                .collect()
                        })
                        .unwrap_or_default();
                    let ControllerDeployment {
                        version,
                        wanted,
                        ready,
                    } = ControllerDeployment::of(&d);
                    let _ = writeln!(
                        out,
                        "controller   {}/{}: {version}, image {}, {ready} of {wanted} ready",
                        d.namespace().unwrap_or_default(),
                        d.name_any(),
                        images.join(", ")
                    );
                }
            }
            Err(e) => {
                let _ = writeln!(
                    out,
                    "controller   cannot list Deployments in every namespace ({e})"
                );
            }
        }
        Ok(out)
    }

    /// Each of this release's CRDs as the cluster has it: the versions it
    /// serves and its schemas' fingerprint.
    async fn crd_states(&self) -> Vec<(String, CrdState)> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut states = Vec::new();
        for name in crate::api::crd_fingerprints().into_keys() {
            let state = match crds.get_opt(&name).await {
                Ok(Some(installed)) => CrdState::Found {
                    served: installed
                        .spec
                        .versions
                        .iter()
                        .filter(|v| v.served)
                        .map(|v| v.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    fingerprint: crate::api::schema_fingerprint(&installed),
                },
                Ok(None) => CrdState::Missing,
                Err(e) => CrdState::Unreadable(e),
            };
            states.push((name, state));
        }
        states
    }

    /// `why POD`: what the pod waits for, in one paragraph.
    pub async fn why(&self, pod: &str) -> Result<String, PluginError> {
        let found = self.get::<Pod>(pod).await?;
        let now = Timestamp::now();
        let labels = found.labels();
        let mut out = Vec::new();
        if let Some(name) = labels.get(BARRIER_LABEL) {
            let barrier = self.get::<Barrier>(name).await?;
            let pods = self.pods_of(&barrier).await?;
            out.push(why_barrier(&found, &barrier, &pods));
        }
        if let Some(name) = labels.get(LOCK_LABEL) {
            let lock = self.get::<LockLease>(name).await?;
            out.push(why_lock(&found, &lock, now));
        }
        if out.is_empty() {
            out.push(format!(
                "Pod {pod} carries neither {BARRIER_LABEL} nor {LOCK_LABEL}: it waits for nothing zkgate knows of."
            ));
        }
        Ok(out.join("\n") + "\n")
    }

    /// `name` of kind `K`, or [`PluginError::NotFound`].
    async fn get<K>(&self, name: &str) -> Result<K, PluginError>
    where
        K: crate::api::Namespaced,
    {
        self.api::<K>()
            .get_opt(name)
            .await?
            .ok_or_else(|| PluginError::NotFound {
                kind: K::kind(&()).into_owned(),
                name: name.to_owned(),
                namespace: self.namespace.clone(),
            })
    }

    async fn labelled(&self, label: &str, value: &str) -> Result<Vec<Pod>, PluginError> {
        let selector = format!("{label}={value}");
        Ok(self
            .api::<Pod>()
            .list(&ListParams::default().labels(&selector))
            .await?
            .items)
    }

    /// The pods expected at `barrier`: its Job's (by the Job controller's
    /// `job-name` label), else those labelled for it.
    async fn pods_of(&self, barrier: &Barrier) -> Result<Vec<Pod>, PluginError> {
        match &barrier.spec.job_ref {
            Some(job) => self.labelled("job-name", job).await,
            None => self.labelled(BARRIER_LABEL, &barrier.name_any()).await,
        }
    }
}

fn ago(then: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(then).as_secs().max(0) as u64;
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

fn barrier_line(b: &Barrier) -> String {
    let st = b.status.clone().unwrap_or_default();
    // A gang that restarts together: which round, and why the last ended.
    let rounds = match (st.round, st.round_ends.last()) {
        (Some(k), Some(why)) if k > 0 => {
            format!(", round {k} ({} restart(s); the last: {why})", st.restarts)
        }
        (Some(k), _) => format!(", round {k}"),
        (None, _) => String::new(),
    };
    format!(
        "barrier/{}: {}, {} of {} participants entered{}{rounds}",
        b.name_any(),
        st.phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "New".into()),
        st.entered,
        st.required
            .or(b.spec.participants)
            .map(|n| n.to_string())
            .unwrap_or_else(|| "?".into()),
        b.spec
            .job_ref
            .as_ref()
            .map(|j| format!(" (Job {j})"))
            .unwrap_or_default()
    )
}

fn lock_line(l: &LockLease) -> String {
    let st = l.status.clone().unwrap_or_default();
    let holders: Vec<_> = st.holders.iter().map(|h| h.id.as_str()).collect();
    format!(
        "locklease/{} ({:?}): {}, {} waiting",
        l.name_any(),
        l.spec.mode,
        if holders.is_empty() {
            "free".to_owned()
        } else {
            format!("held by {}", holders.join(", "))
        },
        st.waiting_count
    )
}

/// Why `pod` has not registered at its barrier yet, as far as the API
/// server can tell.
fn not_registered_because(pod: &Pod) -> String {
    if pod.metadata.deletion_timestamp.is_some() {
        return "being deleted".into();
    }
    let Some(status) = &pod.status else {
        return "no status yet".into();
    };
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    if phase == "Succeeded" || phase == "Failed" {
        return format!("finished ({phase})");
    }
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        return format!(
            "Pending, not scheduled: {}",
            c.message.clone().or(c.reason.clone()).unwrap_or_default()
        );
    }
    let init = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == BARRIER_CONTAINER || c.name == "barrier");
    match init.and_then(|c| c.state.as_ref()) {
        Some(state) if state.waiting.is_some() => {
            let w = state.waiting.as_ref().map(|w| w.reason.clone().unwrap_or_default());
            format!("{phase}, its barrier container has not started ({})", w.unwrap_or_default())
        }
        Some(state) if state.running.is_some() => format!(
            "{phase}, its barrier container runs but has not registered (can it reach ZooKeeper? see its log)"
        ),
        Some(_) => format!("{phase}, its barrier container ended"),
        None if status.init_container_statuses.is_none() => {
            format!("{phase}, its containers have not started")
        }
        None => format!("{phase}, with no barrier container (is the label on the pod template, and the webhook on?)"),
    }
}

/// Whether `pod` cannot have registered yet: its barrier container has not
/// started (or it has no containers started, or no status at all). Once
/// that container runs, only ZooKeeper knows.
fn cannot_have_registered(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return true;
    };
    match &status.init_container_statuses {
        None => status.container_statuses.is_none(),
        Some(inits) => inits
            .iter()
            .find(|c| c.name == BARRIER_CONTAINER || c.name == "barrier")
            .is_some_and(|c| c.state.as_ref().is_none_or(|s| s.waiting.is_some())),
    }
}

/// The pods expected at `barrier` that are not among its registered
/// participants, with why. When the status lists only some participants
/// (`unlisted`), a pod missing from the list may be registered: only the
/// pods that cannot have registered are named then.
fn missing(barrier: &Barrier, pods: &[Pod]) -> Vec<(String, String)> {
    let st = barrier.status.clone().unwrap_or_default();
    let registered: BTreeSet<String> = st
        .participants
        .iter()
        .filter(|p| !p.lost)
        .flat_map(|p| [Some(p.id.clone()), p.pod.clone()])
        .flatten()
        .collect();
    let capped = st.unlisted > 0;
    let mut out: Vec<_> = pods
        .iter()
        .filter(|p| !registered.contains(&p.name_any()))
        .filter(|p| !capped || cannot_have_registered(p))
        .map(|p| (p.name_any(), not_registered_because(p)))
        .collect();
    out.sort();
    out
}

/// Whether `pod` is among `barrier`'s registered participants: `None` when
/// the list is capped and the pod is not in it but may have registered.
fn registered(barrier: &Barrier, pod: &Pod) -> Option<bool> {
    let st = barrier.status.clone().unwrap_or_default();
    let name = pod.name_any();
    let listed = st
        .participants
        .iter()
        .any(|p| !p.lost && (p.pod.as_deref() == Some(&name) || p.id == name));
    if listed {
        Some(true)
    } else if st.unlisted > 0 && !cannot_have_registered(pod) {
        None
    } else {
        Some(false)
    }
}

fn barrier_report(barrier: &Barrier, pods: &[Pod], _now: Timestamp) -> String {
    let st = barrier.status.clone().unwrap_or_default();
    let mut out = barrier_line(barrier) + "\n";
    if let Some(m) = &st.message {
        let _ = writeln!(out, "  {m}");
    }
    let entered: Vec<_> = st
        .participants
        .iter()
        .filter(|p| !p.lost)
        .map(|p| p.pod.clone().unwrap_or_else(|| p.id.clone()))
        .collect();
    if !entered.is_empty() {
        let _ = writeln!(out, "  entered: {}", entered.join(", "));
    }
    if st.unlisted > 0 {
        let _ = writeln!(out, "  (and {} more not listed)", st.unlisted);
    }
    let opened = matches!(
        st.phase,
        Some(BarrierPhase::Open | BarrierPhase::Leaving | BarrierPhase::Completed)
    );
    if !opened {
        let missing = missing(barrier, pods);
        if st.unlisted > 0 {
            // The registered are not all listed: what is missing comes from
            // the counts, and only pods that cannot have registered are named.
            if let Some(required) = st.required.or(barrier.spec.participants) {
                let _ = writeln!(
                    out,
                    "  not registered: {} of {required}",
                    required.saturating_sub(st.entered)
                );
            }
            if !missing.is_empty() {
                let _ = writeln!(out, "  of which not started ({}):", missing.len());
            }
        } else if !missing.is_empty() {
            let _ = writeln!(out, "  not registered ({}):", missing.len());
        }
        if !missing.is_empty() {
            for (pod, why) in missing {
                let _ = writeln!(out, "    {pod}: {why}");
            }
        }
    }
    out
}

fn lock_report(lock: &LockLease, now: Timestamp) -> String {
    let st = lock.status.clone().unwrap_or_default();
    let mut out = lock_line(lock) + "\n";
    for h in &st.holders {
        let _ = write!(
            out,
            "  holder {} ({}, token {}",
            h.id, h.mode, h.fencing_token
        );
        if let Some(since) = &h.since {
            let _ = write!(out, ", for {}", ago(since.0, now));
        }
        if let Some(until) = &h.expires_at {
            let _ = write!(out, ", revoked in {}", ago(now, until.0));
        }
        let _ = writeln!(out, ")");
    }
    for (i, id) in st.waiting.iter().enumerate() {
        let _ = write!(out, "  {}. {id}", i + 1);
        // `waiters` is the same queue in the same order (empty in a status
        // written by a controller older than it).
        let since = st
            .waiters
            .get(i)
            .filter(|w| &w.id == id)
            .and_then(|w| w.since.as_ref());
        if let Some(since) = since {
            let _ = write!(out, " (waiting {})", ago(since.0, now));
        }
        let _ = writeln!(out);
    }
    if st.waiting_count as usize > st.waiting.len() {
        let _ = writeln!(
            out,
            "  (and {} more)",
            st.waiting_count as usize - st.waiting.len()
        );
    }
    out
}

fn why_barrier(pod: &Pod, barrier: &Barrier, pods: &[Pod]) -> String {
    let name = pod.name_any();
    let (job, ours, holder) = (job_of(pod), run_of_pod(pod), holder_of(barrier));
    // "Job train's run (uid ...)", or "JobSet gang's run 1f0c....0 (Job gang-workers-0)".
    let of = |job: &OwnerReference, run: &str| {
        if run == job.uid {
            format!("Job {}'s run (uid {run})", job.name)
        } else {
            let jobset = pod
                .labels()
                .get(JOBSET_NAME_LABEL)
                .map_or("?", String::as_str);
            format!("JobSet {jobset}'s run {run} (Job {})", job.name)
        }
    };
    match (job, ours, holder) {
        (Some(job), Some(ours), Some((owner, run))) if ours != run => format!(
            "Pod {name} is of {}, but Barrier {} belongs to another run ({} {}, run {run}): the pod waits for its own run's Barrier, which zkgate makes once that run is over.",
            of(job, &ours),
            barrier.name_any(),
            owner.kind,
            owner.name
        ),
        (Some(job), Some(ours), Some(_)) => {
            format!("Pod {name} is of {}, the run of Barrier {}. ", of(job, &ours), barrier.name_any())
                + &why_at_barrier(pod, barrier, pods)
        }
        _ => why_at_barrier(pod, barrier, pods),
    }
}

/// [`why_barrier`] once the pod is known to be of the barrier's run.
fn why_at_barrier(pod: &Pod, barrier: &Barrier, pods: &[Pod]) -> String {
    let st = barrier.status.clone().unwrap_or_default();
    let name = pod.name_any();
    let required = st.required.or(barrier.spec.participants);
    let count = required
        .map(|n| n.to_string())
        .unwrap_or_else(|| "?".into());
    match st.phase {
        Some(BarrierPhase::Open | BarrierPhase::Leaving | BarrierPhase::Completed) => format!(
            "Pod {name} waits for nothing at Barrier {}: it opened with {} participants.",
            barrier.name_any(),
            st.entered
        ),
        Some(BarrierPhase::Failed) => format!(
            "Pod {name} will not start: Barrier {} failed ({}).",
            barrier.name_any(),
            st.message.unwrap_or_default()
        ),
        _ => {
            let here = registered(barrier, pod);
            let missing = missing(barrier, pods);
            let others: Vec<_> = missing
                .iter()
                .filter(|(p, _)| p != &name)
                .map(|(p, why)| format!("{p} ({why})"))
                .collect();
            let mut s = if here == Some(true) {
                format!(
                    "Pod {name} has registered at Barrier {} and waits for the others: {} of {count} participants entered.",
                    barrier.name_any(),
                    st.entered
                )
            } else if here.is_none() {
                format!(
                    "Pod {name} may have registered at Barrier {}: its barrier container has started, and the status lists only {} of the {} participants; {} of {count} entered.",
                    barrier.name_any(),
                    st.participants.len(),
                    st.participants.len() + st.unlisted as usize,
                    st.entered
                )
            } else {
                format!(
                    "Pod {name} has not registered at Barrier {} yet ({}); {} of {count} participants entered.",
                    barrier.name_any(),
                    not_registered_because(pod),
                    st.entered
                )
            };
            if !others.is_empty() {
                let _ = write!(s, " Not registered yet: {}.", others.join(", "));
            }
            // Roles in order: the status says what the hold waits for
            // (which role, which of its pods are not Ready).
            if let Some((_, why)) = st.message.as_deref().and_then(|m| m.split_once("; held: ")) {
                let _ = write!(
                    s,
                    " The Barrier starts after other Barriers and is held: {why}."
                );
            }
            s
        }
    }
}

fn why_lock(pod: &Pod, lock: &LockLease, now: Timestamp) -> String {
    let st = lock.status.clone().unwrap_or_default();
    let name = pod.name_any();
    if let Some(h) = st
        .holders
        .iter()
        .find(|h| h.pod.as_deref() == Some(&name) || h.id == name)
    {
        return format!(
            "Pod {name} holds LockLease {} ({}, fencing token {}).",
            lock.name_any(),
            h.mode,
            h.fencing_token
        );
    }
    let holders: Vec<_> = st
        .holders
        .iter()
        .map(|h| match &h.since {
            Some(since) => format!("{} (for {})", h.id, ago(since.0, now)),
            None => h.id.clone(),
        })
        .collect();
    match st
        .waiters
        .iter()
        .position(|w| w.id == name || w.pod.as_deref() == Some(name.as_str()))
    {
        Some(i) => format!(
            "Pod {name} waits for LockLease {}: position {} of {} in the queue, behind {}.",
            lock.name_any(),
            i + 1,
            st.waiting_count,
            if holders.is_empty() {
                "nobody (it is being handed over)".to_owned()
            } else {
                holders.join(", ")
            }
        ),
        None => format!(
            "Pod {name} is not in LockLease {}'s queue ({}).",
            lock.name_any(),
            lock_line(lock)
        ),
    }
}

/// What `version` and `doctor` say of a controller Deployment: the release
/// its chart labelled it with, and its replicas wanted and ready.
struct ControllerDeployment {
    version: String,
    wanted: i32,
    ready: i32,
}

impl ControllerDeployment {
    fn of(d: &k8s_openapi::api::apps::v1::Deployment) -> Self {
        ControllerDeployment {
            version: d
                .labels()
                .get("app.kubernetes.io/version")
                .cloned()
                .unwrap_or_else(|| "unknown".into()),
            wanted: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            ready: d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BarrierSpec, BarrierStatus, ParticipantStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, PodStatus,
    };

    fn pod(name: &str, barrier_container: Option<ContainerState>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.status = Some(PodStatus {
            phase: Some("Pending".into()),
            init_container_statuses: Some(vec![ContainerStatus {
                name: BARRIER_CONTAINER.into(),
                state: barrier_container,
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    fn running() -> Option<ContainerState> {
        Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        })
    }

    fn waiting() -> Option<ContainerState> {
        Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("PodInitializing".into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// 150 participants wanted, 120 entered, 100 listed: the 20 unlisted
    /// pods whose barrier container runs may be registered.
    fn capped() -> (Barrier, Vec<Pod>) {
        let mut barrier = Barrier::new(
            "gang",
            BarrierSpec {
                participants: Some(150),
                ..Default::default()
            },
        );
        barrier.status = Some(BarrierStatus {
            phase: Some(BarrierPhase::Waiting),
            required: Some(150),
            entered: 120,
            participants: (0..100)
                .map(|i| ParticipantStatus {
                    id: format!("p{i}"),
                    pod: Some(format!("p{i}")),
                    ..Default::default()
                })
                .collect(),
            unlisted: 20,
            ..Default::default()
        });
        let pods = (0..150)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    if i < 140 { running() } else { waiting() },
                )
            })
            .collect();
        (barrier, pods)
    }

    #[test]
    fn a_gang_that_restarted_shows_its_round_and_why_the_last_ended() {
        let (mut barrier, _) = capped();
        if let Some(st) = barrier.status.as_mut() {
            st.round = Some(2);
            st.restarts = 2;
            st.round_ends = vec![
                "p3's command exited 1".into(),
                "p7 was lost in round 1".into(),
            ];
        }
        let line = barrier_line(&barrier);
        assert!(
            line.ends_with(", round 2 (2 restart(s); the last: p7 was lost in round 1)"),
            "{line}"
        );
    }

    #[test]
    fn past_the_cap_a_pod_that_may_have_registered_is_not_called_unregistered() {
        let (barrier, pods) = capped();
        let named: Vec<_> = missing(&barrier, &pods)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let expected: Vec<_> = (140..150).map(|i| format!("p{i}")).collect();
        assert_eq!(
            named, expected,
            "only the pods whose barrier container has not started"
        );
        let report = barrier_report(&barrier, &pods, Timestamp::now());
        assert!(report.contains("not registered: 30 of 150"), "{report}");
        assert!(report.contains("(and 20 more not listed)"), "{report}");
        assert!(!report.contains("p120:"), "{report}");
        let why = why_barrier(&pods[120], &barrier, &pods);
        assert!(why.contains("may have registered"), "{why}");
        let why = why_barrier(&pods[145], &barrier, &pods);
        assert!(why.contains("has not registered"), "{why}");
        let why = why_barrier(&pods[5], &barrier, &pods);
        assert!(why.contains("has registered"), "{why}");
    }

    #[test]
    fn why_names_the_jobset_run_a_pod_belongs_to() {
        let (mut barrier, mut pods) = capped();
        barrier.metadata.labels = Some(crate::workload::managed_by());
        barrier
            .labels_mut()
            .insert(crate::workload::run::RUN_LABEL.into(), "s1.1".into());
        barrier.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "jobset.x-k8s.io/v1alpha2".into(),
            kind: "JobSet".into(),
            name: "gang".into(),
            uid: "s1".into(),
            ..Default::default()
        }]);
        let pod = &mut pods[5];
        pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "gang-workers-0".into(),
            uid: "j1".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        for (k, v) in [
            (crate::workload::run::JOBSET_UID_LABEL, "s1"),
            (JOBSET_NAME_LABEL, "gang"),
            (crate::workload::run::JOBSET_RESTART_LABEL, "0"),
        ] {
            pod.labels_mut().insert(k.into(), v.into());
        }
        let why = why_barrier(&pods[5], &barrier, &pods);
        assert!(
            why.starts_with(
                "Pod p5 is of JobSet gang's run s1.0 (Job gang-workers-0), but Barrier"
            ) && why.contains("another run (JobSet gang, run s1.1)"),
            "{why}"
        );
        pods[5].labels_mut().insert(
            crate::workload::run::JOBSET_RESTART_LABEL.into(),
            "1".into(),
        );
        let why = why_barrier(&pods[5], &barrier, &pods);
        assert!(
            why.starts_with(
                "Pod p5 is of JobSet gang's run s1.1 (Job gang-workers-0), the run of Barrier"
            ),
            "{why}"
        );
    }

    #[test]
    fn a_pod_at_a_held_barrier_is_told_which_role_and_pods_it_waits_for() {
        let (mut barrier, pods) = capped();
        if let Some(st) = barrier.status.as_mut() {
            st.message = Some("120 of 150 participants entered; held: waiting for the pods of Barrier workers to be Ready: w-3 not yet".into());
        }
        let why = why_barrier(&pods[5], &barrier, &pods);
        assert!(
            why.ends_with("The Barrier starts after other Barriers and is held: waiting for the pods of Barrier workers to be Ready: w-3 not yet."),
            "{why}"
        );
    }

    #[test]
    fn under_the_cap_every_unlisted_pod_is_named() {
        let (mut barrier, pods) = capped();
        if let Some(st) = barrier.status.as_mut() {
            st.unlisted = 0;
            st.entered = 100;
        }
        let named = missing(&barrier, &pods);
        assert_eq!(named.len(), 50);
    }
}
