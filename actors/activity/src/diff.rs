//! Field diffs between an item's JSON before and after a change, leaving out bookkeeping
//! fields and masking secrets, so no entry (and no webhook carrying one) holds a secret.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One field's change (PostHog's `Change`). `type` is the scope; `action` is `changed`,
/// `created` or `deleted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    #[serde(rename = "type")]
    pub kind: String,
    pub action: String,
    pub field: Option<String>,
    pub before: Value,
    pub after: Value,
}

/// What a masked value reads as (PostHog's text).
pub const MASKED: &str = "masked";

/// Fields no scope records: they change with every write or never change at all.
const BOOKKEEPING: &[&str] = &[
    "id",
    "project_id",
    "team_id",
    "created_at",
    "updated_at",
    "last_modified_at",
    "last_used_at",
    "version",
    "created_by",
];

/// Fields a scope leaves out besides the bookkeeping (PostHog's per-scope exclusions).
fn excluded(scope: &str) -> &'static [&'static str] {
    match scope {
        "FeatureFlag" => &[
            "is_simple_flag",
            "experiment",
            "featureflagoverride",
            "usage_dashboard",
            "analytics_dashboards",
        ],
        "Endpoint" => &["last_executed_at"],
        _ => &[],
    }
}

/// Whether a field holds a secret wherever it appears: its value is never recorded.
fn is_secret(field: &str, scope: &str) -> bool {
    let f = field.to_ascii_lowercase();
    f.contains("secret")
        || f.contains("password")
        || f.starts_with("secure_value")
        || f == "private_key"
        || f == "api_token"
        || (scope == "PersonalAPIKey" && f == "value")
}

/// `value` with every secret field (at any depth) replaced by [`MASKED`].
pub fn mask(scope: &str, value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_secret(k, scope) && !v.is_null() {
                        Value::String(MASKED.into())
                    } else {
                        mask(scope, v)
                    };
                    (k.clone(), v)
                })
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| mask(scope, v)).collect()),
        other => other.clone(),
    }
}

/// One `changed` entry per top-level field whose value differs, in key order; a field only
/// one side has counts as changed from or to `null`. Secrets are masked on both sides (a
/// secret that changed still shows that it changed).
pub fn changes_between(scope: &str, before: &Value, after: &Value) -> Vec<Change> {
    let empty = Map::new();
    let b = before.as_object().unwrap_or(&empty);
    let a = after.as_object().unwrap_or(&empty);
    let mut fields: Vec<&String> = a
        .keys()
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .collect();
    fields.dedup();
    fields
        .into_iter()
        .filter(|f| !BOOKKEEPING.contains(&f.as_str()) && !excluded(scope).contains(&f.as_str()))
        .filter_map(|field| {
            let old = b.get(field).unwrap_or(&Value::Null);
            let new = a.get(field).unwrap_or(&Value::Null);
            if old == new {
                return None;
            }
            let (before, after) = if is_secret(field, scope) {
                (masked_or_null(old), masked_or_null(new))
            } else {
                (mask(scope, old), mask(scope, new))
            };
            Some(Change {
                kind: scope.to_string(),
                action: "changed".into(),
                field: Some(field.clone()),
                before,
                after,
            })
        })
        .collect()
}

fn masked_or_null(v: &Value) -> Value {
    if v.is_null() {
        Value::Null
    } else {
        Value::String(MASKED.into())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secrets_are_masked_at_any_depth_and_a_changed_secret_shows_as_changed() {
        let before =
            json!({"url": "https://a", "secret": "one", "config": {"aws_secret_access_key": "k1"}});
        let after =
            json!({"url": "https://a", "secret": "two", "config": {"aws_secret_access_key": "k2"}});
        let changes = changes_between("Webhook", &before, &after);
        let text = serde_json::to_string(&changes).expect("json");
        for secret in ["one", "two", "k1", "k2"] {
            assert!(!text.contains(&format!("\"{secret}\"")), "{text}");
        }
        let fields: Vec<_> = changes.iter().filter_map(|c| c.field.as_deref()).collect();
        assert_eq!(fields, vec!["config", "secret"]);
    }

    #[test]
    fn excluded_and_bookkeeping_fields_are_not_recorded() {
        let before = json!({"version": 1, "updated_at": "a", "experiment": 1, "name": "x"});
        let after =
            json!({"version": 2, "updated_at": "b", "experiment": 2, "name": "y", "new": true});
        let changes = changes_between("FeatureFlag", &before, &after);
        let fields: Vec<_> = changes.iter().filter_map(|c| c.field.as_deref()).collect();
        assert_eq!(fields, vec!["name", "new"]);
        assert_eq!(changes[1].before, Value::Null);
    }
}
