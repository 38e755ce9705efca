//! The `Barrier` resource: a double barrier for the pods of a Job.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A double barrier: participants enter, and none proceeds until
/// `participants` have entered; the leave phase tells when all have left.
// Several printcolumn(...) entries repeat keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "zkgate.io",
    version = "v1alpha1",
    kind = "Barrier",
    namespaced,
    status = "BarrierStatus",
    derive = "PartialEq",
    shortname = "zbar",
    category = "zkgate",
    doc = "A ZooKeeper double barrier: its participants start together once `participants` have entered, and learn when all have left.",
    printcolumn(
        name = "Participants",
        type_ = "integer",
        json_path = ".status.required",
        description = "How many open the barrier (spec.participants, or its Job's)"
    ),
    printcolumn(
        name = "Job",
        type_ = "string",
        json_path = ".spec.jobRef",
        priority = 1
    ),
    printcolumn(name = "Entered", type_ = "integer", json_path = ".status.entered"),
    printcolumn(name = "Left", type_ = "integer", json_path = ".status.left"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Restarts",
        type_ = "integer",
        json_path = ".status.restarts",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[derive(Default)]
#[serde(rename_all = "camelCase")]
pub struct BarrierSpec {
    /// How many participants must enter before the barrier opens (at least
    /// 1). May be omitted with `jobRef`: the count then follows the Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub participants: Option<u32>,
    /// A Job in the same namespace whose pods are the participants: without
    /// `participants`, the count is the smaller of the Job's parallelism and
    /// completions, and follows the Job until the barrier opens (after
    /// that it never changes). A pod the Job retries (`backoffLimit`)
    /// replaces its predecessor, whose registration goes when it fails; it
    /// does not add a participant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub job_ref: Option<String>,
    /// How long the barrier may wait for all participants before it fails
    /// (e.g. `90s`, `10m`, `1h30m`; not zero), counted from the Barrier's
    /// creation (apply it with its Job, or allow for the time before the
    /// Job's pods start). No limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::api::DURATION_PATTERN))]
    pub timeout: Option<String>,
    /// What happens when a participant that entered is lost (its pod failed
    /// or vanished, its session expired): `Wait` (it can be replaced),
    /// `Fail` (the barrier fails) or `RestartGang` (after the opening, a
    /// member's failure ends the round: every member's command is stopped,
    /// and they all meet again in the next round; needs `zkgate barrier
    /// run`). Fixed when the barrier is made.
    #[serde(default)]
    pub on_participant_loss: OnParticipantLoss,
    /// With `RestartGang`: how many rounds may follow the first; one more
    /// end fails the barrier (`RestartLimit`). No limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub max_restarts: Option<u32>,
    /// Other Barriers of the namespace this one starts after: it opens only
    /// once its own participants have entered **and** each of these holds
    /// (an MPI launcher after its workers are Ready; workers after their
    /// leader). A named Barrier not made yet is waited for; one that fails
    /// fails this one (`AfterFailed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub after: Vec<After>,
}

/// A Barrier another one starts after, and how far it must be.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct After {
    /// The Barrier's name (same namespace).
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub barrier: String,
    /// How far: `Entered` (all its participants entered), `Open` (it
    /// opened), `Ready` (it opened and every participant's pod is Ready:
    /// the default) or `Completed` (everyone left it).
    #[serde(default)]
    pub until: Until,
}

/// How far a Barrier named in `after` must be.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, JsonSchema,
)]
pub enum Until {
    /// All its participants have entered (it may still be held).
    Entered,
    /// It opened.
    Open,
    /// It opened, and every participant's pod has its `Ready` condition
    /// true (a readiness probe says the role is up); a participant that
    /// names no pod has no readiness to wait for. One that left before
    /// every one was Ready fails the Barrier waiting on it.
    #[default]
    Ready,
    /// Everyone who entered has left.
    Completed,
}

/// What a lost participant does to the barrier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum OnParticipantLoss {
    /// The barrier keeps waiting; another participant can take its place.
    #[default]
    Wait,
    /// The barrier fails and every waiter exits with the "failed" code.
    Fail,
    /// After the opening, a member's failure (its command exits non-zero,
    /// its session ends, it restarts) ends the round: every member's
    /// command is stopped and the gang meets again in the next round
    /// before any command runs again.
    RestartGang,
}

/// Where a barrier stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum BarrierPhase {
    /// Fewer than `participants` have entered.
    Waiting,
    /// Open: everyone may proceed; nobody has left yet.
    Open,
    /// Some participants have left.
    Leaving,
    /// Everyone who entered has left.
    Completed,
    /// Failed (see `reason`).
    Failed,
}

/// What the controller observed (written by the controller only).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BarrierStatus {
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BarrierPhase>,
    /// Why it failed (`TimedOut`, `ParticipantLost`, `AfterFailed`,
    /// `RestartLimit`, `Deleted`), or why it cannot be sized yet (`Unsized`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable account of the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How many participants open the barrier: `spec.participants`, or
    /// its Job's count (see `spec.jobRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<u32>,
    /// How many participants have entered.
    #[serde(default)]
    pub entered: u32,
    /// How many of them have left.
    #[serde(default)]
    pub left: u32,
    /// The participants seen, in the order they entered: at most the first
    /// 100 (see `unlisted`), and of those lost before the opening only the
    /// 10 most recent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub participants: Vec<ParticipantStatus>,
    /// Participants seen but left out of `participants` (the list is capped
    /// so that a large gang's status stays small).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted: u32,
    /// With `RestartGang`: the current round (0 first); `entered`, `left`
    /// and `participants` describe it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    /// With `RestartGang`: how many times the gang restarted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// With `RestartGang`: why each of the last rounds ended, oldest first
    /// (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_ends: Vec<String>,
    /// When the barrier (the current round) opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at: Option<Time>,
    /// When the last participant left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// `Ready`: true once the barrier is open (reason `Opened`); false with
    /// reason `Waiting`, `Unsized` (its Job does not exist yet) or the
    /// failure's reason. `SpecAccepted`: false (reason `InvalidSpec`) while
    /// a spec change cannot be applied (a count changed after the opening),
    /// true (`Accepted`) otherwise. `PodsTracked`: false (`PodUnknown`)
    /// while a registration that outlives its process names no pod, true
    /// (`PodsNamed`) otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The barrier's node in ZooKeeper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub znode: Option<String>,
}

/// One participant.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantStatus {
    /// Its id (the pod name by default).
    pub id: String,
    /// Its pod, when it registered one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// When it entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entered_at: Option<Time>,
    /// When it left (or was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_at: Option<Time>,
    /// Set when it disappeared before the barrier opened.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
