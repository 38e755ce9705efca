//! The annotations of a workload's pod template that the Barrier made for
//! its run takes (`spec.onParticipantLoss`, `maxRestarts`, `after`,
//! `timeout`): their names, and the one reading of each value, which
//! admission checks (refusing a pod that asks for what cannot be) and the
//! controller follows.

/// Why a pod template's annotation cannot be followed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// `zkgate.io/on-participant-loss` is not a policy.
    #[error("annotation {ON_LOSS_ANNOTATION}={0:?} must be Wait, Fail or RestartGang")]
    InvalidLossPolicy(String),
    /// `zkgate.io/max-restarts` is not a count.
    #[error("annotation {MAX_RESTARTS_ANNOTATION}={0:?} must be a whole number from 0 to 100")]
    InvalidMaxRestarts(String),
    /// `zkgate.io/max-restarts` without RestartGang.
    #[error("annotation {MAX_RESTARTS_ANNOTATION} is only for {ON_LOSS_ANNOTATION}: RestartGang")]
    RestartsWithoutRestartGang,
    /// `zkgate.io/barrier-timeout` is not a Barrier's timeout.
    #[error("annotation {BARRIER_TIMEOUT_ANNOTATION}: {0}")]
    InvalidBarrierTimeout(String),
    /// `zkgate.io/after` does not name Barriers.
    #[error("annotation {AFTER_ANNOTATION}={value:?} must name at most 16 Barriers, separated by commas: {reason}")]
    InvalidAfter {
        /// The annotation's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `zkgate.io/after-until` is not a stage.
    #[error("annotation {AFTER_UNTIL_ANNOTATION}={0:?} must be Entered, Open, Ready or Completed")]
    InvalidAfterUntil(String),
    /// `zkgate.io/after-until` without `zkgate.io/after`.
    #[error("annotation {AFTER_UNTIL_ANNOTATION} is only for {AFTER_ANNOTATION}")]
    UntilWithoutAfter,
}

/// `Wait`, `Fail` or `RestartGang`: the `onParticipantLoss` of the Barrier
/// made for the pod's Job (RestartGang implies the wrap form).
pub const ON_LOSS_ANNOTATION: &str = "zkgate.io/on-participant-loss";

/// With RestartGang: the Barrier's `maxRestarts`.
pub const MAX_RESTARTS_ANNOTATION: &str = "zkgate.io/max-restarts";

/// `NAME[,NAME...]`: the Barriers the Barrier made for the pod's Job starts
/// after (its `spec.after`).
pub const AFTER_ANNOTATION: &str = "zkgate.io/after";

/// With [`AFTER_ANNOTATION`]: how far they must be (`Entered`, `Open`,
/// `Ready` or `Completed`) [default: Ready].
pub const AFTER_UNTIL_ANNOTATION: &str = "zkgate.io/after-until";

/// The `spec.timeout` of the Barrier made for the pod's Job (e.g. `30m`)
/// [default: the controller's `--run-barrier-timeout`, else no limit].
pub const BARRIER_TIMEOUT_ANNOTATION: &str = "zkgate.io/barrier-timeout";

/// The pod template annotations the Barrier made for a Job takes (the
/// Job cache keeps these of a template's, and nothing else).
pub const BARRIER_ANNOTATIONS: [&str; 5] = [
    ON_LOSS_ANNOTATION,
    MAX_RESTARTS_ANNOTATION,
    AFTER_ANNOTATION,
    AFTER_UNTIL_ANNOTATION,
    BARRIER_TIMEOUT_ANNOTATION,
];

/// The `onParticipantLoss` (and `maxRestarts`) a pod's annotations ask of
/// the Barrier made for its Job: admission refuses a pod asking for
/// one that cannot be, and the controller makes the Barrier with it.
pub fn loss_policy(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<(crate::api::OnParticipantLoss, Option<u32>), TemplateError> {
    use crate::api::OnParticipantLoss;
    let policy = match annotations.get(ON_LOSS_ANNOTATION).map(String::as_str) {
        None | Some("Wait") => OnParticipantLoss::Wait,
        Some("Fail") => OnParticipantLoss::Fail,
        Some("RestartGang") => OnParticipantLoss::RestartGang,
        Some(other) => return Err(TemplateError::InvalidLossPolicy(other.to_owned())),
    };
    let max = match annotations.get(MAX_RESTARTS_ANNOTATION) {
        None => None,
        Some(n) => match n.parse::<u32>() {
            Ok(n) if n <= 100 => Some(n),
            _ => return Err(TemplateError::InvalidMaxRestarts(n.clone())),
        },
    };
    if max.is_some() && policy != OnParticipantLoss::RestartGang {
        return Err(TemplateError::RestartsWithoutRestartGang);
    }
    Ok((policy, max))
}

/// The `spec.timeout` a pod's annotations ask of the Barrier made for its
/// Job (`None`: the controller's default): admission refuses a pod asking for
/// one that cannot be, and the controller makes the Barrier with it.
pub fn barrier_timeout(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Option<String>, TemplateError> {
    annotations
        .get(BARRIER_TIMEOUT_ANNOTATION)
        .map(|t| crate::api::spec_duration(t).map_err(TemplateError::InvalidBarrierTimeout))
        .transpose()
}

/// The `spec.after` a pod's annotations ask of the Barrier made for its
/// Job: admission refuses a pod asking for one
/// that cannot be, and the controller makes the Barrier with it.
pub fn after_of(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<crate::api::After>, TemplateError> {
    use crate::api::Until;
    let until = match annotations.get(AFTER_UNTIL_ANNOTATION).map(String::as_str) {
        None | Some("Ready") => Until::Ready,
        Some("Entered") => Until::Entered,
        Some("Open") => Until::Open,
        Some("Completed") => Until::Completed,
        Some(other) => return Err(TemplateError::InvalidAfterUntil(other.to_owned())),
    };
    let Some(value) = annotations.get(AFTER_ANNOTATION) else {
        if annotations.contains_key(AFTER_UNTIL_ANNOTATION) {
            return Err(TemplateError::UntilWithoutAfter);
        }
        return Ok(Vec::new());
    };
    let invalid = |reason: &str| TemplateError::InvalidAfter {
        value: value.clone(),
        reason: reason.to_owned(),
    };
    let names: Vec<&str> = value.split(',').map(str::trim).collect();
    if names.len() > 16 {
        return Err(invalid("more than 16"));
    }
    let mut after = Vec::new();
    for name in names {
        resource_name(name).map_err(|reason| invalid(&format!("{name:?}: {reason}")))?;
        if after.iter().any(|a: &crate::api::After| a.barrier == name) {
            return Err(invalid(&format!("{name} is named twice")));
        }
        after.push(crate::api::After {
            barrier: name.to_owned(),
            until,
        });
    }
    Ok(after)
}

/// Checks that `name` can name a Barrier or LockLease: a DNS-1123
/// subdomain (what the API server requires of every object's name).
pub fn resource_name(name: &str) -> Result<(), &'static str> {
    static SUBDOMAIN: std::sync::LazyLock<regex_lite::Regex> = std::sync::LazyLock::new(|| {
        regex_lite::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
            .expect("a valid pattern")
    });
    if name.len() > 253 || !SUBDOMAIN.is_match(name) {
        return Err("a name is lower case letters, digits, '-' and '.', starts and ends with a letter or digit, and has no empty part between dots");
    }
    Ok(())
}
