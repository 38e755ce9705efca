//! The resources of the containers the webhook injects (`--participant-resources`,
//! the chart's `webhook.participantResources`).
//!
//! They go into every labelled pod of every tenant, so they must pass what
//! namespaces ask of containers: a ResourceQuota on `limits.cpu` or
//! `limits.memory` refuses a pod any of whose containers lacks that limit
//! (and a LimitRange gives a container without one its default, or its
//! `max`, which then counts against the quota). So by default both limits
//! are set. A participant holds one ZooKeeper
//! session and waits: about 10 MiB resident and next to no CPU, with a
//! short burst at the start (the connection, TLS).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_quantity::ParsedQuantity;
use serde::Deserialize;

/// The resources a participant may be given.
const NAMES: [&str; 2] = ["cpu", "memory"];

/// The lowest memory limit accepted: below it a participant risks the OOM
/// killer (it is stopped, and its pod with it, for want of memory).
pub const MEMORY_FLOOR: &str = "32Mi";

/// What injected containers get unless the controller is told otherwise:
/// small requests (a participant waits), a CPU limit well above its start's
/// burst (a lower one would throttle the gang's start), and a memory limit
/// several times its use.
pub fn default() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(quantities(&[("cpu", "10m"), ("memory", "16Mi")])),
        limits: Some(quantities(&[("cpu", "500m"), ("memory", "64Mi")])),
        ..Default::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), Quantity((*value).to_owned())))
        .collect()
}

/// The flag's form: a container's `resources`, of cpu and memory only.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Given {
    #[serde(default)]
    requests: BTreeMap<String, Value>,
    #[serde(default)]
    limits: BTreeMap<String, Value>,
}

/// A quantity as YAML may give it (the chart's values rendered as JSON):
/// a string, or a bare number (`cpu: 1`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Value {
    Text(String),
    Number(serde_json::Number),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Text(text) => text.clone(),
            Value::Number(number) => number.to_string(),
        }
    }
}

/// Parses and checks `--participant-resources`: a JSON object like a
/// container's `resources` (`{"requests": {"cpu": "10m", "memory": "16Mi"},
/// "limits": {"cpu": "500m", "memory": "64Mi"}}`), of `cpu` and `memory`
/// only, each a positive quantity, no request above its limit, and a
/// memory limit of at least [`MEMORY_FLOOR`]. What it leaves out the
/// containers do not get (`{}`: none at all).
pub fn parse(text: &str) -> Result<ResourceRequirements, String> {
    let not_resources = |e: &dyn std::fmt::Display| {
        format!("not a JSON object of requests and limits (as a container's resources): {e}")
    };
    // An object, not a list of its fields (serde takes both as a struct).
    let given: Given = match serde_json::from_str(text).map_err(|e| not_resources(&e))? {
        object @ serde_json::Value::Object(_) => {
            serde_json::from_value(object).map_err(|e| not_resources(&e))?
        }
        other => return Err(not_resources(&format!("found {other}"))),
    };
    let mut parsed = BTreeMap::new();
    for (kind, values) in [("requests", &given.requests), ("limits", &given.limits)] {
        for (name, value) in values {
            let value = value.text();
            if !NAMES.contains(&name.as_str()) {
                return Err(format!(
                    "{kind}.{name}: only cpu and memory can be set for the injected containers"
                ));
            }
            let quantity = Some(value.as_str())
                .filter(|v| quantity_syntax().is_match(v))
                .ok_or_else(|| "not Kubernetes' quantity syntax".to_owned())
                .and_then(|v| ParsedQuantity::try_from(v).map_err(|e| e.to_string()))
                .map_err(|e| format!("{kind}.{name}: {value:?} is not a quantity: {e}"))?;
            if quantity <= zero() {
                return Err(format!("{kind}.{name}: {value} is not above zero"));
            }
            parsed.insert((kind, name.as_str()), quantity);
        }
    }
    for name in NAMES {
        if let (Some(request), Some(limit)) = (
            parsed.get(&("requests", name)),
            parsed.get(&("limits", name)),
        ) {
            if request > limit {
                return Err(format!(
                    "requests.{name} ({request}) is above limits.{name} ({limit})"
                ));
            }
        }
    }
    if let Some(limit) = parsed.get(&("limits", "memory")) {
        let floor = ParsedQuantity::try_from(MEMORY_FLOOR).map_err(|e| e.to_string())?;
        if *limit < floor {
            return Err(format!(
                "limits.memory ({limit}) is below {MEMORY_FLOOR}: a participant would risk the OOM killer"
            ));
        }
    }
    let map = |values: &BTreeMap<String, Value>| {
        (!values.is_empty()).then(|| {
            values
                .iter()
                .map(|(name, value)| (name.clone(), Quantity(value.text())))
                .collect()
        })
    };
    Ok(ResourceRequirements {
        requests: map(&given.requests),
        limits: map(&given.limits),
        ..Default::default()
    })
}

/// Kubernetes' own grammar of a quantity (apimachinery's), so that nothing
/// the API server would refuse in a pod gets past the flag.
pub const QUANTITY: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

fn quantity_syntax() -> &'static regex_lite::Regex {
    static SYNTAX: std::sync::LazyLock<regex_lite::Regex> =
        std::sync::LazyLock::new(|| regex_lite::Regex::new(QUANTITY).expect("a valid pattern"));
    &SYNTAX
}

fn zero() -> ParsedQuantity {
    ParsedQuantity::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_sets_both_limits_and_passes_its_own_checks() {
        let resources = default();
        let limits = resources.limits.clone().unwrap();
        assert!(limits.contains_key("cpu") && limits.contains_key("memory"));
        let text = serde_json::to_string(&resources).unwrap();
        assert_eq!(parse(&text).unwrap(), resources);
    }

    #[test]
    fn what_is_given_is_what_the_containers_get() {
        let r =
            parse(r#"{"requests": {"cpu": "0.05", "memory": "20M"}, "limits": {"memory": "1Gi"}}"#)
                .unwrap();
        assert_eq!(r.requests.unwrap()["cpu"], Quantity("0.05".into()));
        assert_eq!(
            r.limits.clone().unwrap().len(),
            1,
            "no CPU limit given, none set"
        );
        assert_eq!(parse("{}").unwrap(), ResourceRequirements::default());
        let bare = parse(r#"{"limits": {"cpu": 1, "memory": "64Mi"}}"#).unwrap();
        assert_eq!(
            bare.limits.unwrap()["cpu"],
            Quantity("1".into()),
            "a bare number, as YAML gives it"
        );
    }

    #[test]
    fn bad_resources_are_refused_with_the_reason() {
        for (text, says) in [
            ("[]", "not a JSON object"),
            (r#"{"request": {}}"#, "not a JSON object"),
            (r#"{"claims": []}"#, "not a JSON object"),
            (
                r#"{"limits": {"nvidia.com/gpu": "1"}}"#,
                "only cpu and memory",
            ),
            (r#"{"limits": {"cpu": "lots"}}"#, "not a quantity"),
            (r#"{"limits": {"cpu": "1.5.3"}}"#, "not a quantity"),
            (r#"{"limits": {"memory": "64MB"}}"#, "not a quantity"),
            (r#"{"limits": {"cpu": ""}}"#, "not a quantity"),
            (r#"{"limits": {"cpu": true}}"#, "not a JSON object"),
            (r#"{"limits": {"cpu": 1e400}}"#, "not a JSON object"),
            (r#"{"limits": {"cpu": "0"}}"#, "not above zero"),
            (r#"{"requests": {"cpu": "-1"}}"#, "not above zero"),
            (
                r#"{"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}"#,
                "above limits.cpu",
            ),
            (r#"{"limits": {"memory": "16Mi"}}"#, "below 32Mi"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
