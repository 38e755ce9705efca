//! What admission does to a labelled pod: the container that makes it wait
//! for its Barrier or LockLease, with everything that container needs.
//!
//! - `zkgate.io/barrier: NAME` → an init container `zkgate barrier enter
//!   NAME` (or, with the annotation `zkgate.io/barrier-form: sidecar` on an
//!   API server with native sidecars, `zkgate barrier sidecar NAME` with
//!   its startup probe; or, with `zkgate.io/barrier-form: wrap`, the
//!   first container's command (or the one `zkgate.io/wrap-container`
//!   names) run as `zkgate barrier run NAME -- COMMAND...`, the binary
//!   copied into the pod by the init container `zkgate-install`).
//! - `zkgate.io/on-participant-loss: RestartGang` (+ `zkgate.io/max-restarts:
//!   N`) on a Job's pod template: the Barrier made for the Job restarts its
//!   gang together. The wrap form, which this implies, stops the command
//!   itself; the sidecar form (Kubernetes 1.36+) has the kubelet restart
//!   the pod's containers in place ([`crate::agent::in_place`]): the
//!   sidecar gets `restartPolicyRules` restarting them all on its exit 7,
//!   every main container the same on any failure and a `preStop` hook
//!   (`zkgate barrier stopping`) that tells a killed pod from a completed
//!   one, and both share the emptyDir [`POD_VOLUME`].
//! - `zkgate.io/lock: NAME` (+ `zkgate.io/lock-mode: read|write` on a
//!   ReadWrite LockLease) → an init container `zkgate lock acquire NAME`;
//!   the fencing token is in `/var/run/zkgate/fencing-token` in every
//!   container, and the controller releases the hold when the pod ends.
//!
//! Both on one pod: the barrier first, then the lock (a pod that held the
//! lock while waiting for its gang would keep the others of the gang from
//! the lock forever).
//!
//! A pod that already carries a zkgate container (one named `zkgate-*`, or
//! one running the controller's own image) is given no container, so a pod
//! written by hand, or admitted twice, is never given a second one.
//!
//! Credentials: every container that runs zkgate gets what it needs to ask
//! the controller for its namespace's ZooKeeper credential and TLS material
//! ([`crate::handout`]): a projected ServiceAccount token of audience
//! `zkgate`, and the handout's addresses and CA. So does a pod written by
//! hand that carries the label `zkgate.io/credentials: "true"`.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerRestartRule, ContainerRestartRuleOnExitCodes,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, Lifecycle, LifecycleHandler,
    LocalObjectReference, ObjectFieldSelector, Pod, PodSpec, Probe, ProjectedVolumeSource,
    ResourceRequirements, SeccompProfile, SecurityContext, ServiceAccountTokenProjection, Volume,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::agent::exit::Exit;
use crate::api::parse_duration;
use crate::layout::DEFAULT_ROOT;
use crate::workload::template::{
    after_of, barrier_timeout, loss_policy, resource_name, TemplateError, AFTER_ANNOTATION,
    ON_LOSS_ANNOTATION,
};
use crate::workload::{BARRIER_LABEL, LOCK_LABEL};

/// The lock's side on a ReadWrite LockLease: `read` or `write`.
pub const LOCK_MODE_LABEL: &str = "zkgate.io/lock-mode";
/// `init` (the default), `sidecar` or `wrap`: how the barrier's
/// participant runs.
pub const BARRIER_FORM_ANNOTATION: &str = "zkgate.io/barrier-form";
/// The wrap form: the container whose command runs under `zkgate barrier
/// run` [default: the first].
pub const WRAP_CONTAINER_ANNOTATION: &str = "zkgate.io/wrap-container";
/// The wrap form's init container, which copies the binary into
/// [`BIN_VOLUME`].
pub const INSTALL_CONTAINER: &str = "zkgate-install";
/// The volume the wrap form's binary is copied into.
pub const BIN_VOLUME: &str = "zkgate-bin";
/// Where [`BIN_VOLUME`] is mounted.
pub const BIN_DIR: &str = "/var/run/zkgate-bin";
/// The wrap form's readiness: the volume of the file `zkgate barrier run`
/// keeps while the member is released (`--released-file`: from its
/// command's start after an opening until it has left after exiting 0).
pub const RELEASED_VOLUME: &str = "zkgate-released";
/// Where [`RELEASED_VOLUME`] is mounted.
pub const RELEASED_DIR: &str = "/var/run/zkgate-released";
/// The sidecar form in rounds: the volume the sidecar keeps its record in
/// across the pod's in-place restarts, written by the main containers'
/// `preStop` hook too.
pub const POD_VOLUME: &str = "zkgate-pod";
/// Where [`POD_VOLUME`] is mounted.
pub const POD_DIR: &str = "/var/run/zkgate-pod";
/// What the kubelet's in-place restart of all of a pod's containers is
/// asked for by (`restartPolicyRules[].action`).
const RESTART_ALL: &str = "RestartAllContainers";
/// How long the injected containers wait (e.g. `15m`) [default: no limit].
pub const TIMEOUT_ANNOTATION: &str = "zkgate.io/timeout";
/// The annotation that sets a pod's participants' ZooKeeper session
/// timeout (the controller's `--participant-session-timeout` otherwise).
pub const SESSION_TIMEOUT_ANNOTATION: &str = "zkgate.io/session-timeout";
/// The session timeouts a participant may ask for. Below, a busy node's
/// pause drops holds; above, a dead holder blocks the others for minutes.
/// (The servers clamp it further, to their min/maxSessionTimeout: by
/// default 2 and 20 ticks, 4 s to 40 s.)
pub const SESSION_TIMEOUTS: std::ops::RangeInclusive<std::time::Duration> =
    std::time::Duration::from_secs(2)..=std::time::Duration::from_secs(120);

/// Checks a participant session timeout (the annotation's, the
/// controller flag's): a duration within [`SESSION_TIMEOUTS`].
pub fn session_timeout(value: &str) -> Result<std::time::Duration, String> {
    let t = parse_duration(value).map_err(|e| e.to_string())?;
    if !SESSION_TIMEOUTS.contains(&t) {
        return Err(format!(
            "must be from {} to {}",
            humantime::format_duration(*SESSION_TIMEOUTS.start()),
            humantime::format_duration(*SESSION_TIMEOUTS.end())
        ));
    }
    Ok(t)
}
/// The injected container that waits for the Barrier.
pub const BARRIER_CONTAINER: &str = "zkgate-barrier";
/// The injected container that takes the lock.
pub const LOCK_CONTAINER: &str = "zkgate-lock";
/// The volume shared by the injected containers and the pod's own: the
/// fencing token and the sidecar's ready file.
pub const RUN_VOLUME: &str = "zkgate-run";
/// Where [`RUN_VOLUME`] is mounted.
pub const RUN_DIR: &str = "/var/run/zkgate";
/// On a pod written by hand (its own zkgate containers): `"true"` gives
/// those containers what they need to get their credentials.
pub const CREDENTIALS_LABEL: &str = "zkgate.io/credentials";
/// The projected ServiceAccount token a pod proves its namespace with.
pub const TOKEN_VOLUME: &str = "zkgate-token";
/// How long a projected token lives (the kubelet renews it well before).
const TOKEN_SECONDS: i64 = 600;
/// The binary in the image.
const BINARY: &str = "/usr/local/bin/zkgate";

/// What the injected containers are given: what the controller itself was
/// given, so a pod reaches the same ensemble the same way.
#[derive(Clone, Debug)]
pub struct Injection {
    /// The image holding the zkgate binary (the controller's own).
    pub image: String,
    /// The ZooKeeper connect string.
    pub zookeeper: String,
    /// The root of zkgate's znodes.
    pub root: String,
    /// Where the containers ask for their namespace's credentials; `None`:
    /// nowhere (they get none).
    pub handout: Option<HandoutTarget>,
    /// Whether the API server runs native sidecars (1.29 and later).
    pub native_sidecars: bool,
    /// Whether the cluster restarts a pod's containers in place on a
    /// container's exit (1.36 and later): the sidecar form in rounds.
    pub in_place_restart: bool,
    /// The participants' ZooKeeper session timeout, unless a pod's
    /// annotation says; `None`: the participant's default (10 s).
    pub session_timeout: Option<std::time::Duration>,
    /// The injected containers' resources (see [`super::resources`]).
    pub resources: ResourceRequirements,
    /// Secrets (of the pod's namespace) the kubelet pulls [`Self::image`]
    /// with: added to the pods zkgate's containers are injected into.
    pub image_pull_secrets: Vec<String>,
}

/// Where the credential handout is and how to check it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandoutTarget {
    /// Its addresses (`https://HOST:PORT`), tried in turn.
    pub urls: Vec<String>,
    /// The name its certificate carries, whatever address is dialled.
    pub server_name: Option<String>,
    /// The CA its certificate chains to (PEM).
    pub ca: String,
}

/// Why a labelled pod is refused: the admission message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// A pod template annotation the Barrier made for its run takes is
    /// not valid.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A label names no valid resource.
    #[error("label {label}={value:?} does not name a valid resource: {reason}")]
    InvalidName {
        /// The label.
        label: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `zkgate.io/lock-mode` is neither `read` nor `write`.
    #[error("label {LOCK_MODE_LABEL}={0:?} must be read or write")]
    InvalidLockMode(String),
    /// `zkgate.io/lock-mode` without `zkgate.io/lock`.
    #[error("label {LOCK_MODE_LABEL} is set but {LOCK_LABEL} is not")]
    ModeWithoutLock,
    /// `zkgate.io/barrier-form` is neither `init`, `sidecar` nor `wrap`.
    #[error("annotation {BARRIER_FORM_ANNOTATION}={0:?} must be init, sidecar or wrap")]
    InvalidForm(String),
    /// RestartGang with the init form, which cannot stop the command.
    #[error("annotation {ON_LOSS_ANNOTATION}=RestartGang needs the wrap form ({BARRIER_FORM_ANNOTATION}: wrap, the default with it) or, on Kubernetes 1.36+, the sidecar form: an init container cannot stop the command when the gang restarts")]
    RestartNeedsWrap,
    /// RestartGang with the sidecar form on a cluster that restarts no
    /// pod's containers in place.
    #[error("annotation {ON_LOSS_ANNOTATION}=RestartGang with {BARRIER_FORM_ANNOTATION}=sidecar needs the kubelet to restart a pod's containers in place (restartPolicyRules with action RestartAllContainers, Kubernetes 1.36 or later), which this cluster does not (by its API server's version, or the controller's --in-place-restart=false): use the wrap form")]
    NoInPlaceRestart,
    /// The sidecar form in rounds on a pod with no grace period.
    #[error("the sidecar form in rounds tells a pod that completed from one restarting in place by the preStop hooks the kubelet runs only with a grace period, and the pod has terminationGracePeriodSeconds: 0: give it a grace period (the default is 30 s), or use the wrap form")]
    InPlaceNeedsGrace,
    /// The sidecar form in rounds on a container that says its own restart
    /// or `preStop`, which the form needs to set.
    #[error("the sidecar form in rounds sets container {container:?}'s {field} (the kubelet restarts the pod's containers in place through it), and the container has its own: remove it, or use the wrap form")]
    InPlaceFieldTaken {
        /// The container.
        container: String,
        /// The field it sets.
        field: &'static str,
    },
    /// The wrap form, or rounds, and a lock on one pod.
    #[error("the wrap form ({BARRIER_FORM_ANNOTATION}: wrap) and rounds ({ON_LOSS_ANNOTATION}: RestartGang) cannot be combined with the label {LOCK_LABEL}: the lock's init container would hold the lock while the pod waits for its gang; take the lock in the command (zkgate lock run)")]
    WrapWithLock,
    /// The wrap form names a container the pod does not have.
    #[error("annotation {WRAP_CONTAINER_ANNOTATION}={0:?} names no container of the pod")]
    NoSuchContainer(String),
    /// The wrap form on a container with a liveness or startup probe.
    #[error("the wrap form runs container {0:?}'s command only once its gang has met (and again after each restart), so its liveness or startup probe would fail while it waits and the kubelet would kill it: remove the probe, or use a readiness probe")]
    ProbeWhileWaiting(String),
    /// The wrap form on a container without an explicit command.
    #[error("the wrap form runs container {0:?}'s command under `zkgate barrier run`, but it has no explicit `command` (an image's entrypoint cannot be read at admission): give the container its command")]
    NoCommand(String),
    /// The sidecar form on an API server without native sidecars.
    #[error("annotation {BARRIER_FORM_ANNOTATION}=sidecar needs native sidecars (Kubernetes 1.29 or later), which this cluster runs none of (by its API server's version, or the controller's --native-sidecars=false): use the init form")]
    NoNativeSidecars,
    /// `zkgate.io/timeout` is not a duration.
    #[error(
        "annotation {TIMEOUT_ANNOTATION}={value:?} is not a duration (e.g. 90s, 15m): {reason}"
    )]
    InvalidTimeout {
        /// The annotation's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `zkgate.io/session-timeout` is not a duration in range.
    #[error("annotation {SESSION_TIMEOUT_ANNOTATION}={value:?}: {reason}")]
    InvalidSessionTimeout {
        /// The annotation's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The pod has a volume of the name the injection needs.
    #[error("the pod already has a volume named {0}, which zkgate's injected containers need")]
    VolumeTaken(&'static str),
    /// `zkgate.io/credentials` is set to something other than `"true"`.
    #[error("label {CREDENTIALS_LABEL}={0:?} must be \"true\" (or left out)")]
    InvalidCredentials(String),
    /// `zkgate.io/after` on a gang that restarts.
    #[error("annotation {AFTER_ANNOTATION} cannot be combined with {ON_LOSS_ANNOTATION}: RestartGang yet")]
    AfterWithRestartGang,
    /// A form that cannot take part in rounds on a Barrier that restarts
    /// its gang.
    #[error("Barrier {0} restarts its gang (onParticipantLoss: RestartGang), and only a participant that can stop the pod's commands takes part in its rounds: give the pod the annotation {ON_LOSS_ANNOTATION}: RestartGang (the wrap form by default, the container's explicit command then running under `barrier run`; or with {BARRIER_FORM_ANNOTATION}: sidecar on Kubernetes 1.36+)")]
    NotInRounds(String),
    /// RestartGang asked of a Barrier made without it.
    #[error("annotation {ON_LOSS_ANNOTATION}=RestartGang asks for rounds, but Barrier {barrier} was made with onParticipantLoss: {policy:?}, and a Barrier's policy is fixed when it is made: make the Barrier with RestartGang (delete it and create it again), or drop the annotation")]
    NoRounds {
        /// The Barrier.
        barrier: String,
        /// Its policy.
        policy: crate::api::OnParticipantLoss,
    },
}

/// How a pod's participant takes part in its Barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// An init container `zkgate barrier enter` (the default).
    Init,
    /// A native sidecar `zkgate barrier sidecar` with a startup probe (in
    /// rounds, restarting the pod's containers in place).
    Sidecar,
    /// A container's own command under `zkgate barrier run` (the binary
    /// copied into the pod by an init container): the form a gang that
    /// restarts together needs.
    Wrap,
}

/// What a pod's labels ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// The Barrier to wait for, and in which form.
    pub barrier: Option<(String, Form)>,
    /// The LockLease to take, and the side (`read`/`write`) if given.
    pub lock: Option<(String, Option<String>)>,
    /// How long to wait, as given.
    pub timeout: Option<String>,
    /// The participants' session timeout: the pod's annotation, or the
    /// controller's default.
    pub session_timeout: Option<std::time::Duration>,
    /// The run the pod belongs to: the uid of the Job that controls it.
    pub run: Option<String>,
    /// The wrap form: the container to wrap, when not the first.
    pub wrap_container: Option<String>,
    /// Whether the pod takes part in rounds (RestartGang): the wrap form,
    /// or the sidecar form restarting the pod's containers in place.
    pub rounds: bool,
}

/// Reads what `pod`'s labels and annotations ask for, checking every value
/// (a bad one refuses the pod: better at admission than a pod that never
/// starts). What the cluster runs (native sidecars, in-place restarts) is
/// `injection`'s.
pub fn wanted(pod: &Pod, injection: &Injection) -> Result<Wanted, Refusal> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let name = |label: &'static str| -> Result<Option<String>, Refusal> {
        let Some(value) = labels.get(label) else {
            return Ok(None);
        };
        resource_name(value).map_err(|reason| Refusal::InvalidName {
            label,
            value: value.clone(),
            reason: reason.to_owned(),
        })?;
        Ok(Some(value.clone()))
    };
    let (policy, _) = loss_policy(&annotations)?;
    barrier_timeout(&annotations)?;
    let restarts = policy == crate::api::OnParticipantLoss::RestartGang;
    if !after_of(&annotations)?.is_empty() && restarts {
        return Err(Refusal::AfterWithRestartGang);
    }
    let form = match annotations.get(BARRIER_FORM_ANNOTATION).map(String::as_str) {
        None if restarts => Form::Wrap,
        Some("wrap") => Form::Wrap,
        Some("init") if restarts => return Err(Refusal::RestartNeedsWrap),
        Some("sidecar") if restarts && !injection.in_place_restart => {
            return Err(Refusal::NoInPlaceRestart)
        }
        None | Some("init") => Form::Init,
        Some("sidecar") if injection.native_sidecars => Form::Sidecar,
        Some("sidecar") => return Err(Refusal::NoNativeSidecars),
        Some(other) => return Err(Refusal::InvalidForm(other.to_owned())),
    };
    let mode = match labels.get(LOCK_MODE_LABEL).map(String::as_str) {
        None => None,
        Some(m @ ("read" | "write")) => Some(m.to_owned()),
        Some(other) => return Err(Refusal::InvalidLockMode(other.to_owned())),
    };
    let lock = name(LOCK_LABEL)?;
    if lock.is_none() && mode.is_some() {
        return Err(Refusal::ModeWithoutLock);
    }
    let timeout = annotations.get(TIMEOUT_ANNOTATION).cloned();
    if let Some(t) = &timeout {
        parse_duration(t).map_err(|reason| Refusal::InvalidTimeout {
            value: t.clone(),
            reason: reason.to_string(),
        })?;
    }
    let session_timeout = match annotations.get(SESSION_TIMEOUT_ANNOTATION) {
        Some(t) => Some(
            session_timeout(t).map_err(|reason| Refusal::InvalidSessionTimeout {
                value: t.clone(),
                reason,
            })?,
        ),
        None => injection.session_timeout,
    };
    let barrier = name(BARRIER_LABEL)?;
    // In rounds (either form) a lock taken once would be held through a
    // restart while the pod waits for its gang again.
    if barrier.is_some() && (form == Form::Wrap || restarts) && lock.is_some() {
        return Err(Refusal::WrapWithLock);
    }
    Ok(Wanted {
        barrier: barrier.map(|b| (b, form)),
        lock: lock.map(|l| (l, mode)),
        timeout,
        session_timeout,
        run: crate::workload::run::run_of_pod(pod),
        wrap_container: annotations.get(WRAP_CONTAINER_ANNOTATION).cloned(),
        rounds: restarts,
    })
}

/// Whether a participant of `form`, whose pod asks for `asked`, can take
/// part in the Barrier `barrier` made with `made` (fixed when it was
/// made): a Barrier in rounds takes only a participant that can stop the
/// pod's commands, the wrap form or the sidecar form given in-place
/// restarts by asking for rounds (`barrier enter`, and `barrier sidecar`
/// without `--pod-dir`, are refused there at run time), and a pod asking
/// for rounds would never restart on a Barrier without them.
pub fn agrees_with_barrier(
    barrier: &str,
    made: crate::api::OnParticipantLoss,
    asked: crate::api::OnParticipantLoss,
    form: Form,
) -> Result<(), Refusal> {
    use crate::api::OnParticipantLoss::RestartGang;
    let in_rounds = form == Form::Wrap || form == Form::Sidecar && asked == RestartGang;
    if made == RestartGang && !in_rounds {
        return Err(Refusal::NotInRounds(barrier.to_owned()));
    }
    if asked == RestartGang && made != RestartGang {
        return Err(Refusal::NoRounds {
            barrier: barrier.to_owned(),
            policy: made,
        });
    }
    Ok(())
}

/// The repository of an image reference, without tag or digest.
fn repository(image: &str) -> String {
    let image = image.split('@').next().unwrap_or(image);
    // A tag follows the last ':' after the last '/' (a registry port does not).
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo.to_owned(),
        _ => image.to_owned(),
    }
}

/// Whether `c` runs zkgate: it is named `zkgate-*`, runs `image`'s
/// repository (whatever its tag) or any repository named `zkgate`, or its
/// command is a `zkgate` binary (the examples' hand-written forms).
fn runs_zkgate(c: &Container, image: &str) -> bool {
    let repo = c.image.as_deref().map(repository).unwrap_or_default();
    c.name.starts_with("zkgate-")
        || repo == repository(image)
        || repo.rsplit('/').next() == Some("zkgate")
        || c.command
            .iter()
            .flatten()
            .next()
            .is_some_and(|cmd| cmd == "zkgate" || cmd.ends_with("/zkgate"))
}

/// Whether `pod` already runs zkgate (a container that [`runs_zkgate`]).
pub fn carries_zkgate(pod: &Pod, image: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| runs_zkgate(c, image))
}

/// `pod` with the containers its labels ask for and, for every container
/// that runs zkgate, what it needs to get its credentials; `None` when it
/// needs nothing (no label, or a zkgate container already there and no
/// `zkgate.io/credentials` label).
pub fn inject(pod: &Pod, injection: &Injection) -> Result<Option<Pod>, Refusal> {
    let wanted = wanted(pod, injection)?;
    let credentials = match pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CREDENTIALS_LABEL))
    {
        None => false,
        Some(v) if v == "true" => true,
        Some(other) => return Err(Refusal::InvalidCredentials(other.clone())),
    };
    let by_hand = carries_zkgate(pod, &injection.image);
    let containers = (wanted.barrier.is_some() || wanted.lock.is_some()) && !by_hand;
    if !containers && !credentials {
        return Ok(None);
    }
    let mut pod = pod.clone();
    let Some(spec) = pod.spec.as_mut() else {
        return Ok(None);
    };
    if containers {
        add_containers(spec, injection, &wanted)?;
        add_pull_secrets(spec, &injection.image_pull_secrets);
    }
    if let Some(target) = &injection.handout {
        give_handout(spec, injection, target)?;
    }
    Ok(Some(pod))
}

/// Adds the image pull secrets the injected containers' image needs, each
/// once (a pod that names one already keeps its entry).
fn add_pull_secrets(spec: &mut PodSpec, names: &[String]) {
    if names.is_empty() {
        return;
    }
    let secrets = spec.image_pull_secrets.get_or_insert_with(Vec::new);
    for name in names {
        if !secrets.iter().any(|s| s.name == *name) {
            secrets.push(LocalObjectReference { name: name.clone() });
        }
    }
}

/// Adds the containers `wanted` asks for, and the volume they share with
/// the pod's own containers.
fn add_containers(
    spec: &mut PodSpec,
    injection: &Injection,
    wanted: &Wanted,
) -> Result<(), Refusal> {
    add_empty_dir(&mut spec.volumes, RUN_VOLUME, Some("Memory"), "1Mi")?;
    match &wanted.barrier {
        Some((barrier, Form::Wrap)) => wrap(spec, injection, barrier, wanted)?,
        Some((_, Form::Sidecar)) if wanted.rounds => restart_in_place(spec, injection)?,
        _ => {}
    }
    let inits = spec.init_containers.get_or_insert_with(Vec::new);
    if let Some((barrier, form @ (Form::Init | Form::Sidecar))) = &wanted.barrier {
        let mut c = container(injection, BARRIER_CONTAINER, Some(wanted));
        if *form == Form::Sidecar {
            // In rounds, in the pod's record, which a new life of its
            // containers clears before any probe can read it: one left in
            // the run volume by the life before would let the main
            // containers start before the gang met again.
            let ready = if wanted.rounds {
                format!("{POD_DIR}/ready")
            } else {
                format!("{RUN_DIR}/ready")
            };
            let mut a = vec![
                "barrier".to_owned(),
                "sidecar".to_owned(),
                barrier.clone(),
                "--ready-file".to_owned(),
                ready.clone(),
            ];
            if wanted.rounds {
                a.extend(["--pod-dir".to_owned(), POD_DIR.to_owned()]);
                c.volume_mounts
                    .get_or_insert_with(Vec::new)
                    .push(pod_mount());
                // Its round over: every container of the pod restarts.
                c.restart_policy_rules = Some(vec![restart_all("In", Exit::Restart as i32)]);
                // Run when the kubelet ends the pod with a grace period,
                // not in an in-place restart: how the sidecar tells them
                // apart (both stop it with SIGTERM).
                c.lifecycle = Some(Lifecycle {
                    pre_stop: Some(pre_stop(BINARY, true)),
                    ..Default::default()
                });
            }
            c.args = Some(a);
            c.restart_policy = Some("Always".to_owned());
            c.startup_probe = Some(Probe {
                exec: Some(ExecAction {
                    command: Some(args(&[BINARY, "probe", "--ready-file", &ready])),
                }),
                period_seconds: Some(1),
                // The probe, not the kubelet, bounds the wait: the
                // container's own timeout (or none) decides.
                failure_threshold: Some(i32::MAX),
                ..Default::default()
            });
        } else {
            c.args = Some(args(&["barrier", "enter", barrier]));
        }
        if let Some(run) = &wanted.run {
            c.env.get_or_insert_with(Vec::new).push(run_env(run));
        }
        inits.push(c);
    }
    if let Some((lock, mode)) = &wanted.lock {
        let mut c = container(injection, LOCK_CONTAINER, Some(wanted));
        let mut a = vec!["lock", "acquire", lock.as_str()];
        if let Some(mode) = mode {
            a.push(if mode == "read" { "--read" } else { "--write" });
        }
        c.args = Some(args(&a));
        inits.push(c);
    }
    // The token (and the sidecar's ready file) where every container sees it.
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .filter(|c| !c.name.starts_with("zkgate-"))
    {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts.iter().any(|m| m.mount_path == RUN_DIR) {
            mounts.push(VolumeMount {
                name: RUN_VOLUME.to_owned(),
                mount_path: RUN_DIR.to_owned(),
                read_only: Some(true),
                ..Default::default()
            });
        }
    }
    Ok(())
}

/// Adds the emptyDir volume `name` to a pod's `volumes`, refusing a pod
/// that has one of that name already.
fn add_empty_dir(
    volumes: &mut Option<Vec<Volume>>,
    name: &'static str,
    medium: Option<&str>,
    size: &str,
) -> Result<(), Refusal> {
    let volumes = volumes.get_or_insert_with(Vec::new);
    if volumes.iter().any(|v| v.name == name) {
        return Err(Refusal::VolumeTaken(name));
    }
    volumes.push(Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(str::to_owned),
            size_limit: Some(Quantity(size.to_owned())),
        }),
        ..Default::default()
    });
    Ok(())
}

/// `ZKGATE_RUN`: the run a participant belongs to.
fn run_env(run: &str) -> EnvVar {
    EnvVar {
        name: "ZKGATE_RUN".to_owned(),
        value: Some(run.to_owned()),
        value_from: None,
    }
}

/// The wrap form: an init container copies the binary into [`BIN_VOLUME`],
/// and the wrapped container's command runs as `zkgate barrier run NAME --
/// COMMAND ARGS...`, with the environment a participant reads.
fn wrap(
    spec: &mut PodSpec,
    injection: &Injection,
    barrier: &str,
    wanted: &Wanted,
) -> Result<(), Refusal> {
    let index = match &wanted.wrap_container {
        Some(name) => spec
            .containers
            .iter()
            .position(|c| c.name == *name)
            .ok_or_else(|| Refusal::NoSuchContainer(name.clone()))?,
        None => 0,
    };
    let Some(target) = spec.containers.get_mut(index) else {
        return Ok(());
    };
    let Some(command) = target.command.clone().filter(|c| !c.is_empty()) else {
        return Err(Refusal::NoCommand(target.name.clone()));
    };
    if target.liveness_probe.is_some() || target.startup_probe.is_some() {
        return Err(Refusal::ProbeWhileWaiting(target.name.clone()));
    }
    install_binary(spec, injection)?;
    let Some(target) = spec.containers.get_mut(index) else {
        return Ok(());
    };
    let binary = format!("{BIN_DIR}/zkgate");
    let mut wrapped = vec![
        binary,
        "barrier".to_owned(),
        "run".to_owned(),
        barrier.to_owned(),
        "--".to_owned(),
    ];
    wrapped.extend(command);
    wrapped.extend(target.args.take().unwrap_or_default());
    target.command = Some(wrapped);
    // What the injected containers are given, for this one's zkgate.
    let participant = container(injection, BARRIER_CONTAINER, Some(wanted));
    let env = target.env.get_or_insert_with(Vec::new);
    env.retain(|e| !e.name.starts_with("ZKGATE_"));
    env.extend(participant.env.unwrap_or_default());
    // Explicit even at its default: an `envFrom` of the pod's own must not
    // point zkgate elsewhere (explicit `env` wins over `envFrom`).
    if !env.iter().any(|e| e.name == "ZKGATE_ROOT") {
        env.push(EnvVar {
            name: "ZKGATE_ROOT".to_owned(),
            value: Some(injection.root.clone()),
            value_from: None,
        });
    }
    if let Some(run) = &wanted.run {
        env.push(run_env(run));
    }
    mount_binary(target);
    // Ready only while the command runs after an opening, so that a queue
    // waiting for the pods to be Ready (Kueue's waitForPodsReady) sees a
    // gang that cannot meet; a readiness probe of the container's own can
    // pass only once its command runs, which is after the opening too.
    if target.readiness_probe.is_some() {
        return Ok(());
    }
    let file = format!("{RELEASED_DIR}/released");
    target.env.get_or_insert_with(Vec::new).push(EnvVar {
        name: "ZKGATE_RELEASED_FILE".to_owned(),
        value: Some(file.clone()),
        value_from: None,
    });
    target.readiness_probe = Some(Probe {
        exec: Some(ExecAction {
            command: Some(args(&[
                &format!("{BIN_DIR}/zkgate"),
                "probe",
                "--ready-file",
                &file,
            ])),
        }),
        // A throttled container's slow exec is not a gang that stopped:
        // three misses, each given 5 s.
        period_seconds: Some(5),
        timeout_seconds: Some(5),
        failure_threshold: Some(3),
        ..Default::default()
    });
    target
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: RELEASED_VOLUME.to_owned(),
            mount_path: RELEASED_DIR.to_owned(),
            ..Default::default()
        });
    add_empty_dir(&mut spec.volumes, RELEASED_VOLUME, Some("Memory"), "1Mi")
}

/// The sidecar form in rounds: every main container restarts the pod's
/// containers in place when it fails, and tells the sidecar through its
/// `preStop` hook that the pod is being killed (see
/// [`crate::agent::in_place`]); the binary the hook runs is copied into
/// the pod as for the wrap form.
fn restart_in_place(spec: &mut PodSpec, injection: &Injection) -> Result<(), Refusal> {
    if spec.termination_grace_period_seconds == Some(0) {
        return Err(Refusal::InPlaceNeedsGrace);
    }
    for c in &spec.containers {
        let taken = |field| {
            Err(Refusal::InPlaceFieldTaken {
                container: c.name.clone(),
                field,
            })
        };
        if c.restart_policy.is_some() {
            return taken("restartPolicy");
        }
        if c.restart_policy_rules.is_some() {
            return taken("restartPolicyRules");
        }
        if c.lifecycle.as_ref().is_some_and(|l| l.pre_stop.is_some()) {
            return taken("lifecycle.preStop");
        }
    }
    add_empty_dir(&mut spec.volumes, POD_VOLUME, Some("Memory"), "1Mi")?;
    install_binary(spec, injection)?;
    // It runs once per life of the pod's containers, before the sidecar,
    // and tells it so.
    if let Some(install) = spec
        .init_containers
        .iter_mut()
        .flatten()
        .find(|c| c.name == INSTALL_CONTAINER)
    {
        install.args = Some(args(&["install", BIN_DIR, "--pod-dir", POD_DIR]));
        install
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(pod_mount());
    }
    for c in &mut spec.containers {
        // `Never` for itself: a failure restarts all of them, not it alone.
        c.restart_policy = Some("Never".to_owned());
        c.restart_policy_rules = Some(vec![restart_all("NotIn", 0)]);
        c.lifecycle.get_or_insert_with(Default::default).pre_stop =
            Some(pre_stop(&format!("{BIN_DIR}/zkgate"), false));
        mount_binary(c);
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(pod_mount());
    }
    Ok(())
}

/// [`POD_VOLUME`] mounted read-write (the sidecar, the install container
/// and the main containers' hook all write it).
fn pod_mount() -> VolumeMount {
    VolumeMount {
        name: POD_VOLUME.to_owned(),
        mount_path: POD_DIR.to_owned(),
        ..Default::default()
    }
}

/// The `preStop` hook `zkgate barrier stopping` of a main container, or
/// (`sidecar`) of the sidecar in rounds itself.
fn pre_stop(binary: &str, sidecar: bool) -> LifecycleHandler {
    let mut command = args(&[binary, "barrier", "stopping", "--pod-dir", POD_DIR]);
    if sidecar {
        command.push("--sidecar".to_owned());
    }
    LifecycleHandler {
        exec: Some(ExecAction {
            command: Some(command),
        }),
        ..Default::default()
    }
}

/// A rule restarting all of the pod's containers in place on the exit
/// codes `operator` (`In`/`NotIn`) `code`.
fn restart_all(operator: &str, code: i32) -> ContainerRestartRule {
    ContainerRestartRule {
        action: RESTART_ALL.to_owned(),
        exit_codes: Some(ContainerRestartRuleOnExitCodes {
            operator: operator.to_owned(),
            values: Some(vec![code]),
        }),
    }
}

/// Mounts [`BIN_VOLUME`] (read only) in `c`.
fn mount_binary(c: &mut Container) {
    c.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: BIN_VOLUME.to_owned(),
            mount_path: BIN_DIR.to_owned(),
            read_only: Some(true),
            ..Default::default()
        });
}

/// The volume [`BIN_VOLUME`] and, first of the init containers, the one
/// that copies the binary into it.
fn install_binary(spec: &mut PodSpec, injection: &Injection) -> Result<(), Refusal> {
    // On disk (the binary is a few MB; memory would count against the pod).
    add_empty_dir(&mut spec.volumes, BIN_VOLUME, None, "128Mi")?;
    let mut install = container(injection, INSTALL_CONTAINER, None);
    install.env = None;
    install.args = Some(args(&["install", BIN_DIR]));
    install.volume_mounts = Some(vec![VolumeMount {
        name: BIN_VOLUME.to_owned(),
        mount_path: BIN_DIR.to_owned(),
        ..Default::default()
    }]);
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .insert(0, install);
    Ok(())
}

/// Gives every container that runs zkgate the projected token (audience
/// `zkgate`) and where to ask for its credentials. The token is the pod's
/// ServiceAccount's (`default` when the pod names none: an API server
/// without the ServiceAccount admission plugin leaves it unset). A pod
/// that has the token volume already (admitted before) is left as it is.
fn give_handout(
    spec: &mut PodSpec,
    injection: &Injection,
    target: &HandoutTarget,
) -> Result<(), Refusal> {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if volumes.iter().any(|v| v.name == TOKEN_VOLUME) {
        return Ok(());
    }
    volumes.push(Volume {
        name: TOKEN_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(crate::handout::AUDIENCE.to_owned()),
                    expiration_seconds: Some(TOKEN_SECONDS),
                    path: "token".to_owned(),
                }),
                ..Default::default()
            }]),
            // Readable by the injected container's user (65532): the
            // kubelet writes the file root-owned, and an fsGroup would
            // chown every volume of the pod.
            default_mode: Some(0o444),
        }),
        ..Default::default()
    });
    if spec.service_account_name.is_none() {
        spec.service_account_name = Some("default".to_owned());
    }
    let dir = crate::handout::TOKEN_FILE
        .rsplit_once('/')
        .map_or(crate::handout::TOKEN_FILE, |(d, _)| d);
    let value = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    };
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
        .filter(|c| runs_zkgate(c, &injection.image) && c.name != INSTALL_CONTAINER)
    {
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| !e.name.starts_with("ZKGATE_CREDENTIALS_"));
        env.push(value("ZKGATE_CREDENTIALS_URL", target.urls.join(",")));
        if let Some(name) = &target.server_name {
            env.push(value("ZKGATE_CREDENTIALS_SERVER_NAME", name.clone()));
        }
        env.push(value("ZKGATE_CREDENTIALS_CA", target.ca.clone()));
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: TOKEN_VOLUME.to_owned(),
                mount_path: dir.to_owned(),
                read_only: Some(true),
                ..Default::default()
            });
    }
    Ok(())
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// One injected container, with the environment every participant command
/// reads, small requests and the restricted security context.
fn container(injection: &Injection, name: &str, wanted: Option<&Wanted>) -> Container {
    let value = |name: &str, value: &str| EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    };
    let field = |name: &str, path: &str| EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                api_version: None,
            }),
            ..Default::default()
        }),
    };
    let mut env = vec![
        value("ZKGATE_ZOOKEEPER", &injection.zookeeper),
        field("ZKGATE_ID", "metadata.name"),
        field("ZKGATE_POD_NAME", "metadata.name"),
        field("ZKGATE_NAMESPACE", "metadata.namespace"),
        field("ZKGATE_POD_UID", "metadata.uid"),
        // Admission needs no ZooKeeper: a pod admitted while it is down
        // waits for it (within its timeout) rather than fail at once.
        value("ZKGATE_CONNECT_TIMEOUT", "0"),
    ];
    if injection.root != DEFAULT_ROOT {
        env.push(value("ZKGATE_ROOT", &injection.root));
    }
    if let Some(t) = wanted.and_then(|w| w.timeout.as_deref()) {
        env.push(value("ZKGATE_TIMEOUT", t));
    }
    if let Some(t) = wanted.and_then(|w| w.session_timeout) {
        env.push(value(
            "ZKGATE_SESSION_TIMEOUT",
            &format!("{}ms", t.as_millis()),
        ));
    }
    let mounts = vec![VolumeMount {
        name: RUN_VOLUME.to_owned(),
        mount_path: RUN_DIR.to_owned(),
        ..Default::default()
    }];
    Container {
        name: name.to_owned(),
        image: Some(injection.image.clone()),
        env: Some(env),
        volume_mounts: Some(mounts),
        resources: (injection.resources != ResourceRequirements::default())
            .then(|| injection.resources.clone()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injection() -> Injection {
        Injection {
            image: "ghcr.io/zkgate/zkgate:0.2.0".into(),
            zookeeper: "zk:2181".into(),
            root: DEFAULT_ROOT.into(),
            handout: Some(HandoutTarget {
                urls: vec![
                    "https://10.88.0.5:9443".into(),
                    "https://zkgate.zkgate-system.svc:443".into(),
                ],
                server_name: Some("zkgate.zkgate-system.svc".into()),
                ca: "-----BEGIN CERTIFICATE-----".into(),
            }),
            native_sidecars: true,
            in_place_restart: true,
            session_timeout: None,
            resources: crate::webhook::resources::default(),
            image_pull_secrets: Vec::new(),
        }
    }

    fn pod(labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "generateName": "train-", "labels": labels, "annotations": annotations },
            "spec": { "containers": [{ "name": "worker", "image": "busybox" }] }
        }))
        .unwrap()
    }

    fn env(c: &Container, name: &str) -> Option<EnvVar> {
        c.env.iter().flatten().find(|e| e.name == name).cloned()
    }

    #[test]
    fn a_barrier_label_gets_an_init_container_with_everything_it_needs() {
        let p = pod(
            serde_json::json!({ "zkgate.io/barrier": "train" }),
            serde_json::json!({}),
        );
        let out = inject(&p, &injection()).unwrap().expect("mutated");
        let spec = out.spec.unwrap();
        let inits = spec.init_containers.unwrap();
        assert_eq!(inits.len(), 1);
        let c = &inits[0];
        assert_eq!(c.name, BARRIER_CONTAINER);
        assert_eq!(c.args.as_deref().unwrap(), ["barrier", "enter", "train"]);
        assert_eq!(c.restart_policy, None);
        for (name, path) in [
            ("ZKGATE_POD_NAME", "metadata.name"),
            ("ZKGATE_POD_UID", "metadata.uid"),
            ("ZKGATE_NAMESPACE", "metadata.namespace"),
        ] {
            let from = env(c, name).and_then(|e| e.value_from?.field_ref);
            assert_eq!(from.map(|f| f.field_path).as_deref(), Some(path), "{name}");
        }
        assert!(
            env(c, "ZKGATE_AUTH").is_none(),
            "no credential in the pod spec"
        );
        // Admitted while ZooKeeper is down, it waits for it.
        assert_eq!(
            env(c, "ZKGATE_CONNECT_TIMEOUT")
                .and_then(|e| e.value)
                .as_deref(),
            Some("0")
        );
        assert_eq!(
            env(c, "ZKGATE_CREDENTIALS_URL")
                .and_then(|e| e.value)
                .as_deref(),
            Some("https://10.88.0.5:9443,https://zkgate.zkgate-system.svc:443")
        );
        assert_eq!(
            env(c, "ZKGATE_CREDENTIALS_SERVER_NAME")
                .and_then(|e| e.value)
                .as_deref(),
            Some("zkgate.zkgate-system.svc")
        );
        assert!(c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == TOKEN_VOLUME && m.mount_path == "/var/run/secrets/zkgate"));
        let token = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == TOKEN_VOLUME)
            .and_then(|v| v.projected.clone())
            .expect("the token volume");
        let projection = token.sources.unwrap()[0]
            .service_account_token
            .clone()
            .unwrap();
        assert_eq!(projection.audience.as_deref(), Some("zkgate"));
        assert_eq!(spec.service_account_name.as_deref(), Some("default"));
        assert!(
            env(&spec.containers[0], "ZKGATE_CREDENTIALS_URL").is_none(),
            "the workload's own container gets no way to the credentials"
        );
        assert_eq!(
            env(c, "ZKGATE_ZOOKEEPER").and_then(|e| e.value),
            Some("zk:2181".into())
        );
        assert!(
            env(c, "ZKGATE_ROOT").is_none(),
            "the default root is not repeated"
        );
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path,
            RUN_DIR
        );
    }

    #[test]
    fn the_sidecar_form_and_a_lock_both_come_in_order() {
        let p = pod(
            serde_json::json!({ "zkgate.io/barrier": "train", "zkgate.io/lock": "db", "zkgate.io/lock-mode": "read" }),
            serde_json::json!({ "zkgate.io/barrier-form": "sidecar", "zkgate.io/timeout": "15m" }),
        );
        let out = inject(&p, &injection()).unwrap().unwrap();
        let inits = out.spec.unwrap().init_containers.unwrap();
        let names: Vec<_> = inits.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [BARRIER_CONTAINER, LOCK_CONTAINER],
            "the barrier first"
        );
        assert_eq!(inits[0].restart_policy.as_deref(), Some("Always"));
        assert!(inits[0].startup_probe.is_some());
        assert_eq!(
            inits[1].args.as_deref().unwrap(),
            ["lock", "acquire", "db", "--read"]
        );
        assert_eq!(
            env(&inits[1], "ZKGATE_TIMEOUT").and_then(|e| e.value),
            Some("15m".into())
        );
    }

    #[test]
    fn a_pods_session_timeout_is_its_annotations_or_the_controllers_and_bounded() {
        let session = |out: &Pod, container: usize| {
            let spec = out.spec.as_ref().unwrap();
            let c = &spec.init_containers.as_ref().unwrap()[container];
            env(c, "ZKGATE_SESSION_TIMEOUT").and_then(|e| e.value)
        };
        let labels = serde_json::json!({ "zkgate.io/barrier": "train", "zkgate.io/lock": "db" });
        let plain = pod(labels.clone(), serde_json::json!({}));
        let out = inject(&plain, &injection()).unwrap().unwrap();
        assert_eq!(session(&out, 0), None, "the participants' own default");
        let by_default = Injection {
            session_timeout: Some(std::time::Duration::from_secs(20)),
            ..injection()
        };
        let out = inject(&plain, &by_default).unwrap().unwrap();
        assert_eq!(session(&out, 0).as_deref(), Some("20000ms"));
        assert_eq!(
            session(&out, 1).as_deref(),
            Some("20000ms"),
            "the lock's too"
        );
        let asked = pod(
            labels.clone(),
            serde_json::json!({ "zkgate.io/session-timeout": "30s" }),
        );
        let out = inject(&asked, &by_default).unwrap().unwrap();
        assert_eq!(
            session(&out, 0).as_deref(),
            Some("30000ms"),
            "the pod's own"
        );
        for bad in ["1s", "5m", "soon", "0s"] {
            let p = pod(
                labels.clone(),
                serde_json::json!({ "zkgate.io/session-timeout": bad }),
            );
            let refused = inject(&p, &injection()).unwrap_err();
            assert!(
                matches!(refused, Refusal::InvalidSessionTimeout { .. }),
                "{bad}: {refused:?}"
            );
            assert!(refused.to_string().contains(SESSION_TIMEOUT_ANNOTATION));
        }
        assert!(session_timeout("2s").is_ok() && session_timeout("120s").is_ok());
    }

    #[test]
    fn unlabelled_and_already_injected_pods_are_left_alone() {
        let i = injection();
        let plain = pod(serde_json::json!({ "app": "x" }), serde_json::json!({}));
        assert_eq!(inject(&plain, &i).unwrap(), None);
        let labelled = pod(
            serde_json::json!({ "zkgate.io/barrier": "train" }),
            serde_json::json!({}),
        );
        let once = inject(&labelled, &i).unwrap().unwrap();
        assert_eq!(inject(&once, &i).unwrap(), None, "idempotent");
        // Pods written by hand: the image at another tag, or from another
        // registry, or the binary copied into the workload's container.
        let mut elsewhere = labelled.clone();
        elsewhere.spec.as_mut().unwrap().init_containers = Some(vec![Container {
            name: "barrier".into(),
            image: Some("localhost:5000/zkgate:dev".into()),
            ..Default::default()
        }]);
        assert_eq!(inject(&elsewhere, &i).unwrap(), None);
        let mut wrapped = labelled.clone();
        wrapped.spec.as_mut().unwrap().containers[0].command =
            Some(vec!["/zkgate/zkgate".into(), "lock".into(), "run".into()]);
        assert_eq!(inject(&wrapped, &i).unwrap(), None);
        let mut by_hand = labelled.clone();
        by_hand.spec.as_mut().unwrap().init_containers = Some(vec![Container {
            name: "barrier".into(),
            image: Some("ghcr.io/zkgate/zkgate:0.0.9".into()),
            ..Default::default()
        }]);
        assert_eq!(inject(&by_hand, &i).unwrap(), None);
    }

    #[test]
    fn a_pod_written_by_hand_gets_its_credentials_by_label_and_only_its_zkgate_containers() {
        let i = injection();
        let mut p = pod(
            serde_json::json!({ "zkgate.io/credentials": "true" }),
            serde_json::json!({}),
        );
        p.spec.as_mut().unwrap().service_account_name = Some("gang".into());
        p.spec.as_mut().unwrap().init_containers = Some(vec![Container {
            name: "barrier".into(),
            image: Some("localhost:5000/zkgate:dev".into()),
            ..Default::default()
        }]);
        let out = inject(&p, &i).unwrap().expect("mutated");
        let spec = out.spec.unwrap();
        let inits = spec.init_containers.unwrap();
        assert_eq!(inits.len(), 1, "no container added");
        assert!(env(&inits[0], "ZKGATE_CREDENTIALS_URL").is_some());
        assert!(env(&spec.containers[0], "ZKGATE_CREDENTIALS_URL").is_none());
        assert_eq!(spec.service_account_name.as_deref(), Some("gang"), "kept");
        assert_eq!(
            inject(
                &pod(
                    serde_json::json!({ "zkgate.io/credentials": "yes" }),
                    serde_json::json!({})
                ),
                &i
            )
            .unwrap_err(),
            Refusal::InvalidCredentials("yes".into())
        );
    }

    #[test]
    fn bad_labels_are_refused_with_the_reason() {
        let i = injection();
        let refused = |labels, annotations| inject(&pod(labels, annotations), &i).unwrap_err();
        assert!(matches!(
            refused(
                serde_json::json!({ "zkgate.io/barrier": "a..b" }),
                serde_json::json!({})
            ),
            Refusal::InvalidName {
                label: BARRIER_LABEL,
                ..
            }
        ));
        assert_eq!(
            refused(
                serde_json::json!({ "zkgate.io/lock": "db", "zkgate.io/lock-mode": "shared" }),
                serde_json::json!({})
            ),
            Refusal::InvalidLockMode("shared".into())
        );
        assert_eq!(
            refused(
                serde_json::json!({ "zkgate.io/lock-mode": "read" }),
                serde_json::json!({})
            ),
            Refusal::ModeWithoutLock
        );
        assert!(matches!(
            refused(
                serde_json::json!({ "zkgate.io/barrier": "t" }),
                serde_json::json!({ "zkgate.io/timeout": "soon" })
            ),
            Refusal::InvalidTimeout { .. }
        ));
        let old = Injection {
            native_sidecars: false,
            in_place_restart: false,
            ..i.clone()
        };
        assert_eq!(
            inject(
                &pod(
                    serde_json::json!({ "zkgate.io/barrier": "t" }),
                    serde_json::json!({ "zkgate.io/barrier-form": "sidecar" })
                ),
                &old
            )
            .unwrap_err(),
            Refusal::NoNativeSidecars
        );
        let message = Refusal::InvalidLockMode("shared".into()).to_string();
        assert!(message.contains("zkgate.io/lock-mode") && message.contains("read or write"));
    }

    fn commanded(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "generateName": "train-",
                "labels": { "zkgate.io/barrier": "train" },
                "annotations": annotations,
            },
            "spec": { "containers": [
                { "name": "worker", "image": "busybox", "command": ["sh", "-c"], "args": ["train.sh"],
                  "env": [{ "name": "EPOCHS", "value": "3" }] },
                { "name": "logs", "image": "busybox", "command": ["tail"] },
            ] }
        }))
        .unwrap()
    }

    #[test]
    fn restart_gang_wraps_the_first_containers_command_with_the_binary_copied_in() {
        let i = injection();
        let pod = commanded(serde_json::json!({ "zkgate.io/on-participant-loss": "RestartGang" }));
        let out = inject(&pod, &i).unwrap().unwrap();
        // Admitted again (a retry): left as it is, nothing wrapped twice.
        assert_eq!(inject(&out, &i).unwrap(), None);
        let spec = out.spec.unwrap();
        let inits = spec.init_containers.unwrap();
        assert_eq!(inits.len(), 1, "only the install container: {inits:?}");
        assert_eq!(inits[0].name, INSTALL_CONTAINER);
        assert_eq!(
            inits[0].args.as_deref(),
            Some(&args(&["install", BIN_DIR])[..])
        );
        let worker = &spec.containers[0];
        assert_eq!(
            worker.command.as_deref(),
            Some(
                &args(&[
                    "/var/run/zkgate-bin/zkgate",
                    "barrier",
                    "run",
                    "train",
                    "--",
                    "sh",
                    "-c",
                    "train.sh"
                ])[..]
            )
        );
        assert_eq!(worker.args, None);
        assert_eq!(
            env(worker, "EPOCHS").and_then(|e| e.value).as_deref(),
            Some("3")
        );
        assert!(env(worker, "ZKGATE_ZOOKEEPER").is_some());
        assert!(env(worker, "ZKGATE_POD_UID").is_some());
        assert!(
            env(worker, "ZKGATE_ROOT").is_some(),
            "set even at its default"
        );
        assert!(
            env(worker, "ZKGATE_CREDENTIALS_URL").is_some(),
            "the wrapped container gets its credentials"
        );
        assert!(worker
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == BIN_VOLUME && m.read_only == Some(true)));
        assert!(env(&inits[0], "ZKGATE_CREDENTIALS_URL").is_none());
        // The second container is left as it was.
        assert_eq!(
            spec.containers[1].command.as_deref(),
            Some(&args(&["tail"])[..])
        );
    }

    /// Issue 42: a wrapped container is Ready only while its command runs
    /// after an opening (a queue's `waitForPodsReady` must see a gang that
    /// waits); a readiness probe of the container's own is kept, since
    /// its command starts only once released.
    #[test]
    fn the_wrapped_container_is_ready_only_once_released() {
        let i = injection();
        let out = inject(
            &commanded(serde_json::json!({ "zkgate.io/barrier-form": "wrap" })),
            &i,
        )
        .unwrap()
        .unwrap();
        let spec = out.spec.unwrap();
        let worker = &spec.containers[0];
        let file = format!("{RELEASED_DIR}/released");
        assert_eq!(
            env(worker, "ZKGATE_RELEASED_FILE")
                .and_then(|e| e.value)
                .as_deref(),
            Some(file.as_str())
        );
        let probe = worker.readiness_probe.as_ref().expect("a readiness probe");
        assert_eq!(
            probe.exec.as_ref().and_then(|e| e.command.as_deref()),
            Some(&args(&["/var/run/zkgate-bin/zkgate", "probe", "--ready-file", &file])[..])
        );
        let mount = worker
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == RELEASED_VOLUME)
            .expect("the released file's volume");
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (RELEASED_DIR, None)
        );
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == RELEASED_VOLUME)
            .expect("its emptyDir");
        assert!(volume.empty_dir.is_some());
        // The other container is not the participant: no probe added.
        assert!(spec.containers[1].readiness_probe.is_none());

        // A readiness probe of the container's own stays as it was.
        let mut probed = commanded(serde_json::json!({ "zkgate.io/barrier-form": "wrap" }));
        let own: Probe = serde_json::from_value(
            serde_json::json!({ "httpGet": { "path": "/ready", "port": 8080 } }),
        )
        .unwrap();
        probed.spec.as_mut().unwrap().containers[0].readiness_probe = Some(own.clone());
        let out = inject(&probed, &i).unwrap().unwrap();
        let worker = &out.spec.unwrap().containers[0];
        assert_eq!(worker.readiness_probe.as_ref(), Some(&own));
        assert!(env(worker, "ZKGATE_RELEASED_FILE").is_none());
    }

    #[test]
    fn the_sidecar_form_in_rounds_restarts_the_pods_containers_in_place() {
        let i = injection();
        let pod = commanded(serde_json::json!({
            "zkgate.io/on-participant-loss": "RestartGang",
            "zkgate.io/barrier-form": "sidecar",
        }));
        assert!(wanted(&pod, &i).unwrap().rounds);
        let out = inject(&pod, &i).unwrap().unwrap();
        // Admitted again (a retry): left as it is, nothing added twice.
        assert_eq!(inject(&out, &i).unwrap(), None);
        let spec = out.spec.unwrap();
        let inits = spec.init_containers.clone().unwrap();
        let names: Vec<_> = inits.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [INSTALL_CONTAINER, BARRIER_CONTAINER]);
        assert_eq!(
            inits[0].args.as_deref(),
            Some(&args(&["install", BIN_DIR, "--pod-dir", POD_DIR])[..]),
            "the install container marks each new life of the pod's containers"
        );
        let sidecar = &inits[1];
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            sidecar.args.as_deref(),
            Some(
                &args(&[
                    "barrier",
                    "sidecar",
                    "train",
                    "--ready-file",
                    "/var/run/zkgate-pod/ready",
                    "--pod-dir",
                    POD_DIR
                ])[..]
            )
        );
        let rules = sidecar.restart_policy_rules.clone().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].action, "RestartAllContainers");
        let codes = rules[0].exit_codes.clone().unwrap();
        assert_eq!(
            (codes.operator.as_str(), codes.values.as_deref()),
            ("In", Some(&[7][..]))
        );
        let mounted = |c: &Container, volume: &str, path: &str, read_only: Option<bool>| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == volume && m.mount_path == path && m.read_only == read_only)
        };
        assert!(mounted(sidecar, POD_VOLUME, POD_DIR, None));
        let hook = sidecar
            .lifecycle
            .clone()
            .unwrap()
            .pre_stop
            .unwrap()
            .exec
            .unwrap();
        assert_eq!(
            hook.command.as_deref(),
            Some(
                &args(&[
                    BINARY,
                    "barrier",
                    "stopping",
                    "--pod-dir",
                    POD_DIR,
                    "--sidecar"
                ])[..]
            ),
            "the sidecar's own hook tells a pod ending from an in-place restart"
        );
        assert!(mounted(&inits[0], POD_VOLUME, POD_DIR, None));
        for c in &spec.containers {
            assert_eq!(c.restart_policy.as_deref(), Some("Never"), "{}", c.name);
            let rules = c.restart_policy_rules.clone().unwrap();
            let codes = rules[0].exit_codes.clone().unwrap();
            assert_eq!(
                (
                    rules[0].action.as_str(),
                    codes.operator.as_str(),
                    codes.values.as_deref()
                ),
                ("RestartAllContainers", "NotIn", Some(&[0][..])),
                "{}: any failure restarts them all",
                c.name
            );
            let hook = c.lifecycle.clone().unwrap().pre_stop.unwrap().exec.unwrap();
            assert_eq!(
                hook.command.as_deref(),
                Some(
                    &args(&[
                        "/var/run/zkgate-bin/zkgate",
                        "barrier",
                        "stopping",
                        "--pod-dir",
                        POD_DIR
                    ])[..]
                )
            );
            assert!(mounted(c, BIN_VOLUME, BIN_DIR, Some(true)), "{}", c.name);
            assert!(mounted(c, POD_VOLUME, POD_DIR, None), "{}", c.name);
        }
        // The commands are the pod's own: the sidecar does not wrap them.
        assert_eq!(
            spec.containers[0].command.as_deref(),
            Some(&args(&["sh", "-c"])[..])
        );
        assert_eq!(
            spec.containers[0].args.as_deref(),
            Some(&args(&["train.sh"])[..])
        );
        let pod_volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == POD_VOLUME)
            .and_then(|v| v.empty_dir.clone())
            .expect("the pod's record volume");
        assert_eq!(pod_volume.medium.as_deref(), Some("Memory"));
        // Without rounds the sidecar form touches no container of the pod's.
        let plain = commanded(serde_json::json!({ "zkgate.io/barrier-form": "sidecar" }));
        let spec = inject(&plain, &i).unwrap().unwrap().spec.unwrap();
        assert!(spec.containers.iter().all(|c| c.restart_policy.is_none()
            && c.restart_policy_rules.is_none()
            && c.lifecycle.is_none()));
        assert!(!spec.volumes.iter().flatten().any(|v| v.name == POD_VOLUME));
    }

    #[test]
    fn the_sidecar_form_in_rounds_refuses_what_it_cannot_restart_with_the_reason() {
        let sidecar_in_rounds = serde_json::json!({
            "zkgate.io/on-participant-loss": "RestartGang",
            "zkgate.io/barrier-form": "sidecar",
        });
        let old = Injection {
            in_place_restart: false,
            ..injection()
        };
        let refusal = inject(&commanded(sidecar_in_rounds.clone()), &old).unwrap_err();
        assert_eq!(refusal, Refusal::NoInPlaceRestart);
        assert!(refusal.to_string().contains("1.36"), "{refusal}");
        for (field, container) in [
            (
                "restartPolicy",
                serde_json::json!({ "restartPolicy": "Always" }),
            ),
            (
                "restartPolicyRules",
                serde_json::json!({ "restartPolicyRules": [] }),
            ),
            (
                "lifecycle.preStop",
                serde_json::json!({ "lifecycle": { "preStop": { "exec": { "command": ["sleep", "5"] } } } }),
            ),
        ] {
            let mut pod = serde_json::to_value(commanded(sidecar_in_rounds.clone())).unwrap();
            for (k, v) in container.as_object().unwrap() {
                pod["spec"]["containers"][1][k] = v.clone();
            }
            let pod: Pod = serde_json::from_value(pod).unwrap();
            assert_eq!(
                inject(&pod, &injection()).unwrap_err(),
                Refusal::InPlaceFieldTaken {
                    container: "logs".into(),
                    field
                }
            );
        }
        let mut graceless = serde_json::to_value(commanded(sidecar_in_rounds.clone())).unwrap();
        graceless["spec"]["terminationGracePeriodSeconds"] = serde_json::json!(0);
        let graceless: Pod = serde_json::from_value(graceless).unwrap();
        assert_eq!(
            inject(&graceless, &injection()).unwrap_err(),
            Refusal::InPlaceNeedsGrace
        );
        // A lock taken by an init container would be held through the
        // restart while the pod waits for its gang again.
        let mut locked = commanded(sidecar_in_rounds);
        locked
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LOCK_LABEL.into(), "db".into());
        assert_eq!(
            inject(&locked, &injection()).unwrap_err(),
            Refusal::WrapWithLock
        );
    }

    #[test]
    fn a_barrier_in_rounds_takes_the_forms_that_can_stop_the_commands() {
        use crate::api::OnParticipantLoss::{RestartGang, Wait};
        let agrees = |made, asked, form| agrees_with_barrier("train", made, asked, form);
        assert_eq!(agrees(RestartGang, RestartGang, Form::Wrap), Ok(()));
        assert_eq!(agrees(RestartGang, Wait, Form::Wrap), Ok(()));
        assert_eq!(agrees(RestartGang, RestartGang, Form::Sidecar), Ok(()));
        for (asked, form) in [(Wait, Form::Sidecar), (Wait, Form::Init)] {
            assert_eq!(
                agrees(RestartGang, asked, form),
                Err(Refusal::NotInRounds("train".into())),
                "{form:?} asking {asked:?}"
            );
        }
        assert_eq!(agrees(Wait, Wait, Form::Sidecar), Ok(()));
        assert!(matches!(
            agrees(Wait, RestartGang, Form::Sidecar),
            Err(Refusal::NoRounds { .. })
        ));
    }

    #[test]
    fn the_wrap_form_refuses_what_it_cannot_wrap_with_the_reason() {
        let i = injection();
        let refused = |annotations| inject(&commanded(annotations), &i).unwrap_err();
        assert_eq!(
            refused(
                serde_json::json!({ "zkgate.io/on-participant-loss": "RestartGang", "zkgate.io/barrier-form": "init" })
            ),
            Refusal::RestartNeedsWrap
        );
        assert_eq!(
            refused(serde_json::json!({ "zkgate.io/on-participant-loss": "Restart" })),
            Refusal::Template(TemplateError::InvalidLossPolicy("Restart".into()))
        );
        assert_eq!(
            refused(
                serde_json::json!({ "zkgate.io/on-participant-loss": "RestartGang", "zkgate.io/max-restarts": "-1" })
            ),
            Refusal::Template(TemplateError::InvalidMaxRestarts("-1".into()))
        );
        assert_eq!(
            refused(
                serde_json::json!({ "zkgate.io/barrier-form": "wrap", "zkgate.io/wrap-container": "nope" })
            ),
            Refusal::NoSuchContainer("nope".into())
        );
        assert_eq!(
            refused(serde_json::json!({ "zkgate.io/max-restarts": "2" })),
            Refusal::Template(TemplateError::RestartsWithoutRestartGang)
        );
        let mut probed =
            commanded(serde_json::json!({ "zkgate.io/on-participant-loss": "RestartGang" }));
        if let Some(spec) = probed.spec.as_mut() {
            spec.containers[0].liveness_probe = Some(Probe::default());
        }
        assert_eq!(
            inject(&probed, &i).unwrap_err(),
            Refusal::ProbeWhileWaiting("worker".into())
        );
        // A container without a command: the image's entrypoint is unknown.
        let bare = pod(
            serde_json::json!({ "zkgate.io/barrier": "train" }),
            serde_json::json!({ "zkgate.io/barrier-form": "wrap" }),
        );
        let refusal = inject(&bare, &i).unwrap_err();
        assert_eq!(refusal, Refusal::NoCommand("worker".into()));
        assert!(refusal.to_string().contains("no explicit `command`"));
        // With a lock too: the lock's init container would hold it while
        // the pod waits for its gang.
        let mut locked = commanded(serde_json::json!({ "zkgate.io/barrier-form": "wrap" }));
        locked
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("zkgate.io/lock".into(), "db".into());
        assert_eq!(inject(&locked, &i).unwrap_err(), Refusal::WrapWithLock);
        // The named container is the one wrapped.
        let out = inject(
            &commanded(serde_json::json!({ "zkgate.io/barrier-form": "wrap", "zkgate.io/wrap-container": "logs" })),
            &i,
        )
        .unwrap()
        .unwrap();
        let spec = out.spec.unwrap();
        assert_eq!(
            spec.containers[0].command.as_deref(),
            Some(&args(&["sh", "-c"])[..])
        );
        assert_eq!(
            spec.containers[1].command.as_ref().map(|c| c[0].as_str()),
            Some("/var/run/zkgate-bin/zkgate")
        );
    }
}
