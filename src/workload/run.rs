//! What a workload's run is: the pods that meet at one Barrier, what owns
//! that Barrier, and how a pod, a Job or a JobSet's child Job says which
//! run it belongs to (a Job; one restart of a JobSet: all its child Jobs).
//! Admission and the controller both read runs here, and nothing here
//! knows either of them.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use super::BARRIER_LABEL;
use crate::api::Barrier;

/// How many participants a Job's pods make: the smaller of its parallelism
/// (1 when unset) and its completions (unbounded when unset); `None` when
/// that is zero (a Job that runs no pod at once opens no barrier).
pub fn count(spec: &JobSpec) -> Option<u32> {
    let parallelism = spec.parallelism.unwrap_or(1);
    let n = spec.completions.map_or(parallelism, |c| c.min(parallelism));
    u32::try_from(n).ok().filter(|n| *n > 0)
}

/// The Barrier a pod template asks for: its [`BARRIER_LABEL`].
pub fn template_label(template: &PodTemplateSpec) -> Option<&str> {
    template
        .metadata
        .as_ref()?
        .labels
        .as_ref()?
        .get(BARRIER_LABEL)
        .map(String::as_str)
}

/// The Barrier a Job's pods take part in: its pod template's
/// [`BARRIER_LABEL`].
pub fn barrier_label(job: &Job) -> Option<&str> {
    template_label(&job.spec.as_ref()?.template)
}

/// The Job that controls `pod` (its run), if any.
pub fn job_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Job" && o.api_version == "batch/v1" && o.controller == Some(true))
}

/// The API group of JobSet (kubernetes-sigs/jobset): a JobSet's child Jobs
/// make one run, and its Barrier is sized over its replicated Jobs.
pub const JOBSET_GROUP: &str = "jobset.x-k8s.io";

/// The label JobSet's controller gives its child Jobs and their pods: the
/// JobSet's uid.
pub const JOBSET_UID_LABEL: &str = "jobset.sigs.k8s.io/jobset-uid";

/// The label JobSet's controller gives its child Jobs and their pods: the
/// JobSet's name.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";

/// The label JobSet's controller gives its child Jobs and their pods: which
/// of the JobSet's restarts they belong to (a restart makes every child Job
/// again, and that is a run of its own).
pub const JOBSET_RESTART_LABEL: &str = "jobset.sigs.k8s.io/restart-attempt";

/// The label of a Barrier the controller made for a JobSet's run: the run
/// (`UID.RESTART`; a Job's run is its owner's uid and needs none).
pub const RUN_LABEL: &str = "zkgate.io/run";

/// The run a labelled Job's pods belong to.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// What the participants are told (`ZKGATE_RUN`) and the barrier node
    /// records: the Job's uid, or `UID.RESTART` of the JobSet that controls
    /// it.
    pub id: String,
    /// What owns the run's Barrier (deleted with it): the Job, or its
    /// JobSet.
    pub owner: OwnerReference,
}

impl Run {
    /// Whether this run is a JobSet's.
    pub fn of_jobset(&self) -> bool {
        is_jobset(&self.owner)
    }
}

/// Whether `owner` is a JobSet.
pub fn is_jobset(owner: &OwnerReference) -> bool {
    owner.kind == "JobSet"
        && owner
            .api_version
            .split_once('/')
            .is_some_and(|(group, _)| group == JOBSET_GROUP)
}

/// The run of `job`'s pods: its JobSet's current restart when a JobSet
/// controls it, else the Job itself. `None` for a Job not stored yet.
pub fn run_of_job(job: &Job) -> Option<Run> {
    let uid = job.uid()?;
    let jobset = job
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && is_jobset(o));
    Some(match jobset {
        Some(jobset) => {
            // A number, or no run: the run is a label's value too.
            let restart: u32 = match job.labels().get(JOBSET_RESTART_LABEL) {
                None => 0,
                Some(r) => r.parse().ok()?,
            };
            Run {
                id: format!("{}.{restart}", jobset.uid),
                owner: OwnerReference {
                    controller: Some(false),
                    block_owner_deletion: Some(false),
                    ..jobset.clone()
                },
            }
        }
        None => Run {
            id: uid.clone(),
            owner: OwnerReference {
                api_version: "batch/v1".to_owned(),
                kind: "Job".to_owned(),
                name: job.name_any(),
                uid,
                controller: Some(false),
                block_owner_deletion: Some(false),
            },
        },
    })
}

/// The run `pod` says it belongs to: its JobSet's restart when it carries
/// JobSet's labels, else its Job's uid (`None`: no Job controls it). What
/// the pod says is checked against its Job at admission.
pub fn run_of_pod(pod: &Pod) -> Option<String> {
    let job = job_of(pod)?;
    let labels = pod.labels();
    Some(match labels.get(JOBSET_UID_LABEL) {
        Some(jobset) => format!(
            "{jobset}.{}",
            labels.get(JOBSET_RESTART_LABEL).map_or("0", String::as_str)
        ),
        None => job.uid.clone(),
    })
}

/// The label JobSet's controller gives its child Jobs and their pods when
/// its (alpha) `RestartJob` failure policy action made that one child Job
/// again.
pub const JOBSET_JOB_RESTART_LABEL: &str = "jobset.sigs.k8s.io/job-restart-attempt";

/// Why a pod carrying JobSet's labels cannot take part in its JobSet's
/// gang, if it cannot: a JobSet before v0.9.0 does not say its uid, and a
/// child Job made again by the `RestartJob` action is of the same run as the
/// gang that opened without it (it would pass that opening alone).
pub fn jobset_pod_refusal(labels: &std::collections::BTreeMap<String, String>) -> Option<String> {
    if labels.contains_key(JOBSET_NAME_LABEL) && !labels.contains_key(JOBSET_UID_LABEL) {
        return Some(format!(
            "the pod is of a JobSet that does not label it {JOBSET_UID_LABEL} (JobSet before v0.9.0): zkgate keeps a JobSet's gang by that uid; upgrade JobSet"
        ));
    }
    if labels
        .get(JOBSET_JOB_RESTART_LABEL)
        .is_some_and(|n| n != "0")
    {
        return Some(format!(
            "the pod's Job was made again by JobSet's RestartJob failure policy action ({JOBSET_JOB_RESTART_LABEL}): its pods would pass the gang's opening alone, so zkgate does not gate it; use RestartJobSet, which restarts the whole gang"
        ));
    }
    None
}

/// The run a Barrier belongs to and what owns it: for one the controller
/// made (labelled [`super::managed_by`]), its `batch/v1` Job
/// owner (the Job it was made for), or its JobSet owner and the restart
/// [`RUN_LABEL`] names. A Barrier made by hand belongs to no run, and every
/// participant enters it.
pub fn holder_of(barrier: &Barrier) -> Option<(&OwnerReference, String)> {
    // Only what the controller made: a Barrier made by hand stays its
    // maker's even when a Job owns it (for the garbage collector).
    if !super::made_by_zkgate(&barrier.metadata) {
        return None;
    }
    let owners = barrier.metadata.owner_references.iter().flatten();
    for owner in owners {
        if owner.kind == "Job" && owner.api_version == "batch/v1" {
            return Some((owner, owner.uid.clone()));
        }
        if is_jobset(owner) {
            let run = barrier.labels().get(RUN_LABEL)?;
            let ours = run
                .strip_prefix(owner.uid.as_str())
                .is_some_and(|rest| rest.starts_with('.'));
            return ours.then(|| (owner, run.clone()));
        }
    }
    None
}

/// The run a Barrier belongs to (see [`holder_of`]).
pub fn run_of(barrier: &Barrier) -> Option<String> {
    holder_of(barrier).map(|(_, run)| run)
}

/// Whether `job` still runs: not finished (`Complete` or `Failed`), not
/// being deleted, and not suspended. A live Job's Barrier is never taken
/// from it.
pub fn live(job: &Job) -> bool {
    job.metadata.deletion_timestamp.is_none() && !finished(job) && !suspended(job)
}

/// Whether `job` is suspended (`spec.suspend`, Kubernetes 1.21+: a queue
/// such as Kueue that has not admitted it yet, or has preempted it). Its
/// pods are deleted; at its resume they are made again.
pub fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

/// Whether `job` finished: `Complete` or `Failed`.
pub fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
}
