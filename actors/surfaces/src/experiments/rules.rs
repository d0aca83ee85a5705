//! What a create or update may set: parameters, metrics and their shapes.

use serde_json::{Map, Value};

use super::{metrics, CONTROL};
use crate::surface::RecordError;
use corvid_flags::Variant;

/// Validates `parameters.feature_flag_variants` (equal split when absent) and keeps the rest.
pub(super) fn parse_parameters(
    parameters: Option<&Value>,
) -> Result<(Vec<Variant>, Map<String, Value>), RecordError> {
    let mut extra = parameters
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let invalid = |d: String| RecordError::invalid(d, "parameters");
    let variants = match extra.remove("feature_flag_variants") {
        None | Some(Value::Null) => vec![
            Variant {
                key: CONTROL.into(),
                name: Some("Control".into()),
                rollout_percentage: 50.0,
            },
            Variant {
                key: "test".into(),
                name: Some("Test".into()),
                rollout_percentage: 50.0,
            },
        ],
        Some(list) => {
            let raw = list
                .as_array()
                .ok_or_else(|| invalid("feature_flag_variants must be a list.".into()))?;
            let mut variants = Vec::with_capacity(raw.len());
            let unset = raw.iter().all(|v| v.get("rollout_percentage").is_none());
            for v in raw {
                let key = v
                    .get("key")
                    .and_then(Value::as_str)
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| invalid("Every variant needs a non-empty `key`.".into()))?;
                if !key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(invalid(format!(
                        "Variant key `{key}` may only hold letters, numbers, hyphens and underscores."
                    )));
                }
                let rollout = match v.get("rollout_percentage") {
                    _ if unset => 0.0,
                    Some(Value::Number(n)) => n.as_f64().unwrap_or(-1.0),
                    _ => -1.0,
                };
                if !(0.0..=100.0).contains(&rollout) {
                    return Err(invalid(format!(
                        "Variant `{key}` needs a rollout_percentage between 0 and 100."
                    )));
                }
                variants.push(Variant {
                    key: key.to_string(),
                    name: v.get("name").and_then(Value::as_str).map(str::to_string),
                    rollout_percentage: rollout,
                });
            }
            if unset && !variants.is_empty() {
                // An equal split, the remainder to the first variants.
                let n = variants.len();
                let base = 100 / n;
                for (i, v) in variants.iter_mut().enumerate() {
                    v.rollout_percentage = (base + usize::from(i < 100 % n)) as f64;
                }
            }
            variants
        }
    };
    if variants.len() < 2 {
        return Err(invalid("An experiment needs at least two variants.".into()));
    }
    if variants.first().map(|v| v.key.as_str()) != Some(CONTROL) {
        return Err(invalid(
            "The first variant must have the key `control`.".into(),
        ));
    }
    let mut keys: Vec<&str> = variants.iter().map(|v| v.key.as_str()).collect();
    keys.sort_unstable();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid("Variant keys must be unique.".into()));
    }
    let total: f64 = variants.iter().map(|v| v.rollout_percentage).sum();
    if (total - 100.0).abs() > 1e-9 {
        return Err(invalid(format!(
            "Variant rollout percentages must sum to 100 (they sum to {total})."
        )));
    }
    Ok((variants, extra))
}

pub(super) fn check_metrics(metrics: &[Value], attr: &'static str) -> Result<(), RecordError> {
    for m in metrics {
        metrics::parse(m, attr)?;
    }
    Ok(())
}
