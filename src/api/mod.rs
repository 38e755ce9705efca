//! The custom resources, group `zkgate.io`, version `v1alpha1`:
//! [`Barrier`] and [`LockLease`], and their CRDs.

mod barrier;
mod locklease;

pub use barrier::{
    After, Barrier, BarrierPhase, BarrierSpec, BarrierStatus, OnParticipantLoss, ParticipantStatus,
    Until,
};
pub use locklease::{
    HoldMode, HolderStatus, LockLease, LockLeaseSpec, LockLeaseStatus, LockMode, LockNodeData,
    LockPhase, WaiterStatus,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// A namespaced kind of a known type (Pods, Jobs, Barriers, LockLeases):
/// what an `Api` of one namespace, or of all, needs of it.
pub trait Namespaced:
    kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Namespaced for K where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
{
}
use kube::CustomResourceExt;

/// The API group.
pub const GROUP: &str = "zkgate.io";

/// A duration as users write it (`90s`, `10m`, `1h30m`), validated by the
/// API server with this pattern so a typo is refused at `kubectl apply`:
/// numbers of at most 9 digits (so the sum cannot overflow), and at least
/// one part that is not zero, written without a leading zero (a zero
/// timeout or lease means nothing; there is no lookahead in the API
/// server's regular expressions to say it otherwise).
pub const DURATION_PATTERN: &str =
    r"^([0-9]{1,9}(ms|s|m|h|d))*[1-9][0-9]{0,8}(ms|s|m|h|d)([0-9]{1,9}(ms|s|m|h|d))*$";

/// Parses a duration that matched [`DURATION_PATTERN`].
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration such as 90s or 10m: {e}"))
}

/// Every CRD zkgate serves, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Barrier::crd(), LockLease::crd()]
}

/// A CRD as YAML, as `crds/` holds it.
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    // A CRD is plain data: serializing it cannot fail.
    serde_yaml_ng::to_string(crd).unwrap_or_default()
}

/// The file name of a CRD under `crds/`: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_duration_pattern_and_the_parser_agree() {
        let pattern = regex_lite::Regex::new(DURATION_PATTERN).unwrap();
        for ok in ["90s", "10m", "1h30m", "500ms", "2d", "0h90s", "999999999d"] {
            assert!(pattern.is_match(ok), "{ok}");
            assert!(parse_duration(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "10",
            "ten minutes",
            "10 m",
            "-5s",
            "1.5h",
            "0s",
            "0h0m",
            "1000000000s",
            "99999999999999999999d",
        ] {
            assert!(!pattern.is_match(bad), "{bad}");
        }
    }
}
