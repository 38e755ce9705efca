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

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
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
            let quantity = Exact::parse(&value).ok_or_else(|| {
                format!("{kind}.{name}: {value:?} is not a quantity (Kubernetes' syntax)")
            })?;
            if quantity.negative || quantity.digits == 0 {
                return Err(format!("{kind}.{name}: {value} is not above zero"));
            }
            parsed.insert((kind, name.as_str()), (quantity, value));
        }
    }
    for name in NAMES {
        if let (Some((request, shown_request)), Some((limit, shown_limit))) = (
            parsed.get(&("requests", name)),
            parsed.get(&("limits", name)),
        ) {
            if request.compare(limit)? == Ordering::Greater {
                return Err(format!(
                    "requests.{name} ({shown_request}) is above limits.{name} ({shown_limit})"
                ));
            }
        }
    }
    if let Some((limit, shown)) = parsed.get(&("limits", "memory")) {
        let floor = Exact::parse(MEMORY_FLOOR).ok_or("MEMORY_FLOOR is a quantity")?;
        if limit.compare(&floor)? == Ordering::Less {
            return Err(format!(
                "limits.memory ({shown}) is below {MEMORY_FLOOR}: a participant would risk the OOM killer"
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

/// A quantity's exact value, `digits × 10^exp10 × 2^exp2`, read by
/// Kubernetes' grammar (apimachinery's `resource.Quantity`): a signed
/// decimal number, then a binary suffix (Ki to Ei), a decimal one (n, u,
/// m, k, M, G, T, P, E) or an integer exponent (`e3`, `E-2`).
///
/// Not `kube_quantity`: it reads numbers as floats and converts between
/// units with `f32` factors, so it called a request just above its limit
/// equal or below (a pod the API server then refuses), a limit of exactly
/// 32Mi below 32Mi, and overflowed (a panic) on far-apart scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Exact {
    negative: bool,
    digits: u128,
    exp10: i64,
    exp2: u32,
}

impl Exact {
    fn parse(text: &str) -> Option<Exact> {
        let (negative, rest) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let mut digits: u128 = 0;
        for c in whole.chars().chain(fraction.chars()) {
            // A '.' left in the fraction: a second point.
            let d = c.to_digit(10)?;
            digits = digits.checked_mul(10)?.checked_add(u128::from(d))?;
        }
        let mut exp10 = -(fraction.len() as i64);
        let mut exp2 = 0;
        match suffix {
            "" => {}
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            "Ki" => exp2 = 10,
            "Mi" => exp2 = 20,
            "Gi" => exp2 = 30,
            "Ti" => exp2 = 40,
            "Pi" => exp2 = 50,
            "Ei" => exp2 = 60,
            exponent => {
                let exponent = exponent.strip_prefix(['e', 'E'])?;
                let unsigned = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                exp10 += exponent.parse::<i32>().ok()? as i64;
            }
        }
        Some(Exact {
            negative,
            digits,
            exp10,
            exp2,
        })
    }

    /// Compares two non-negative quantities exactly; an error if they are
    /// too far apart to be put on one scale (beyond 128 bits).
    fn compare(&self, other: &Exact) -> Result<Ordering, String> {
        let scale = self.exp10.min(other.exp10);
        let on_scale = |q: &Exact| -> Option<u128> {
            let tens = u32::try_from(q.exp10 - scale).ok()?;
            q.digits
                .checked_mul(10u128.checked_pow(tens)?)?
                .checked_mul(2u128.checked_pow(q.exp2)?)
        };
        match (on_scale(self), on_scale(other)) {
            (Some(a), Some(b)) => Ok(a.cmp(&b)),
            _ => Err("quantities too large to compare".to_owned()),
        }
    }
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

    #[test]
    fn requests_and_limits_are_compared_exactly() {
        // Each request is above its limit, if only just (a float or a
        // conversion between units would call them equal or below).
        for text in [
            r#"{"requests":{"memory":"1073741850"},"limits":{"memory":"1Gi"}}"#,
            r#"{"requests":{"memory":"67108868"},"limits":{"memory":"64Mi"}}"#,
            r#"{"requests":{"memory":"1Gi"},"limits":{"memory":"1.0737418G"}}"#,
            r#"{"requests":{"cpu":"0.5000000000000001"},"limits":{"cpu":"500m"}}"#,
            r#"{"requests":{"memory":"64.00000000000001Mi"},"limits":{"memory":"64Mi"}}"#,
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains("is above limits"), "{text}: {err}");
        }
        for text in [
            // Exactly the floor.
            r#"{"limits":{"memory":"33554432"}}"#,
            // Equal, in other units.
            r#"{"requests":{"memory":"64Mi"},"limits":{"memory":"67.108864M"}}"#,
            r#"{"requests":{"cpu":"0.001"},"limits":{"cpu":"1m"}}"#,
            // Far apart: compared without overflowing.
            r#"{"requests":{"cpu":"1m"},"limits":{"cpu":"1e28"}}"#,
        ] {
            parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        // Too large to compare: refused, not a panic.
        let text = r#"{"requests":{"cpu":"1n"},"limits":{"cpu":"1e400"}}"#;
        assert!(parse(text).is_err(), "{text}");
        let text = r#"{"limits":{"cpu":"1e1.5"}}"#;
        assert!(
            parse(text).expect_err(text).contains("not a quantity"),
            "{text}"
        );
    }
}
