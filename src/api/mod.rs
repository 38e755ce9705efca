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

/// The finalizer by which the controller removes a resource's znodes
/// before the resource goes.
pub const FINALIZER: &str = "zkgate.io/znodes";

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

/// Checks a duration for a resource's spec (`spec.timeout`, a lease): it
/// matches [`DURATION_PATTERN`], as the API server will check, and parses.
pub fn spec_duration(text: &str) -> Result<String, String> {
    // The pattern is a constant; it compiles.
    let pattern = regex_lite::Regex::new(DURATION_PATTERN).map_err(|e| e.to_string())?;
    if !pattern.is_match(text) {
        return Err(format!(
            "{text:?} is not a duration such as 90s, 10m or 1h30m (not zero; units ms, s, m, h, d)"
        ));
    }
    parse_duration(text)?;
    Ok(text.to_owned())
}

/// A fingerprint of `crd`'s versions and their schemas (SHA-1, hex): equal
/// for two CRDs that validate alike whatever order their fields come in
/// (the API server's or the generator's), so a controller can say which
/// CRDs it was built with and `kubectl zkgate doctor` compare the cluster's
/// with them. An identity, not a secret.
pub fn schema_fingerprint(crd: &CustomResourceDefinition) -> String {
    use sha1::Digest as _;
    /// `value` as JSON with every object's keys sorted.
    fn canonical(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(fields) => {
                let mut keys: Vec<&String> = fields.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::from(key.as_str()).to_string());
                    out.push(':');
                    canonical(&fields[key], out);
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut text = String::new();
    for version in &crd.spec.versions {
        text.push_str(&version.name);
        text.push('\n');
        // A schema always serializes.
        let schema = serde_json::to_value(&version.schema).unwrap_or_default();
        canonical(&schema, &mut text);
        text.push('\n');
    }
    sha1::Sha1::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// [`schema_fingerprint`] of each of [`crds`], by the CRD's name.
pub fn crd_fingerprints() -> std::collections::BTreeMap<String, String> {
    crds()
        .iter()
        .map(|crd| {
            (
                crd.metadata.name.clone().unwrap_or_default(),
                schema_fingerprint(crd),
            )
        })
        .collect()
}

/// Every CRD zkgate serves, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Barrier::crd(), LockLease::crd()]
        .into_iter()
        .map(bound_unsigned)
        .collect()
}

/// `crd` with a `maximum` on every `uint32` field that has none. The API
/// server checks no integer's `format`: it would store a count of five
/// billion, which the controller's watch cannot read, and since the watch
/// reads every object of a kind as one list, one tenant's object would stop
/// the controller for every namespace.
fn bound_unsigned(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(fields) => {
                if fields.get("format").and_then(|f| f.as_str()) == Some("uint32") {
                    fields
                        .entry("maximum")
                        .or_insert_with(|| serde_json::json!(f64::from(u32::MAX)));
                }
                fields.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut value);
    // The same CRD with one more number: it reads back.
    serde_json::from_value(value).unwrap_or(crd)
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
    fn every_unsigned_field_is_bounded_by_what_the_controller_reads() {
        let mut unbounded = Vec::new();
        for crd in crds() {
            let value = serde_json::to_value(&crd).unwrap();
            let mut stack = vec![("".to_owned(), &value)];
            while let Some((path, value)) = stack.pop() {
                match value {
                    serde_json::Value::Object(fields) => {
                        if fields.get("format").and_then(|f| f.as_str()) == Some("uint32") {
                            let max = fields.get("maximum").and_then(|m| m.as_f64());
                            if max.is_none_or(|m| m > f64::from(u32::MAX)) {
                                unbounded.push(path.clone());
                            }
                        }
                        for (k, v) in fields {
                            stack.push((format!("{path}.{k}"), v));
                        }
                    }
                    serde_json::Value::Array(items) => {
                        stack.extend(items.iter().map(|v| (format!("{path}[]"), v)))
                    }
                    _ => {}
                }
            }
        }
        assert!(unbounded.is_empty(), "unbounded: {unbounded:?}");
    }

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
