//! Save-time rules for endpoints: name, freshness, query kind, and the `{variables.x}`
//! placeholders of SQL queries against the project's variable definitions.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::error::EndpointError;
use super::model::{InsightVariable, FRESHNESS_CHOICES};
use corvid_query::QueryError;
use corvid_query::{Bindings, QueryKind, RowLimits};

/// `^[a-zA-Z][a-zA-Z0-9_-]{0,127}$`.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    first.is_ascii_alphabetic()
        && name.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

pub fn check_name(name: &str) -> Result<(), EndpointError> {
    if valid_name(name) {
        return Ok(());
    }
    Err(EndpointError::invalid(
        "name",
        format!("Invalid name '{name}'. Must start with a letter, contain only alphanumeric characters, hyphens, or underscores, and be between 1 and 128 characters long."),
    ))
}

pub fn check_freshness(seconds: u64) -> Result<(), EndpointError> {
    if FRESHNESS_CHOICES.iter().any(|(s, _)| *s == seconds) {
        return Ok(());
    }
    let values: Vec<String> = FRESHNESS_CHOICES
        .iter()
        .map(|(s, _)| s.to_string())
        .collect();
    Err(EndpointError::invalid(
        "data_freshness_seconds",
        format!(
            "Data freshness must be one of: [{}] seconds (15 minutes, 30 minutes, 1 hour, 6 hours, 12 hours, 24 hours, 7 days).",
            values.join(", ")
        ),
    ))
}

/// Decodes a stored or submitted query into the engine's kinds.
pub fn query_kind(query: &Value) -> Result<QueryKind, EndpointError> {
    let kind = query.get("kind").and_then(Value::as_str);
    match kind {
        Some("HogQLQuery" | "TrendsQuery" | "RetentionQuery") => {}
        Some(other) => {
            return Err(EndpointError::invalid(
                "query",
                format!("Unsupported query kind '{other}'. Supported kinds: HogQLQuery, RetentionQuery, TrendsQuery"),
            ))
        }
        None => return Err(EndpointError::invalid("query", "Query is empty or invalid.")),
    }
    serde_json::from_value(query.clone()).map_err(|e| {
        EndpointError::invalid(
            "query",
            format!("Invalid {}: {e}", kind.unwrap_or_default()),
        )
    })
}

/// Validates a submitted query and returns it as it will be stored: for SQL, the `variables`
/// map is synchronised with the placeholders (PostHog's `sync_hogql_query_variables`).
pub fn prepare_query(query: Value, variables: &[InsightVariable]) -> Result<Value, EndpointError> {
    let Value::Object(mut obj) = query else {
        return Err(EndpointError::invalid(
            "query",
            "Query is empty or invalid.",
        ));
    };
    let as_value = Value::Object(obj.clone());
    let kind = query_kind(&as_value)?;
    if obj.get("kind").and_then(Value::as_str) != Some("HogQLQuery") {
        // An insight whose dates (or anything else) cannot compile is refused here, not left
        // to fail every run and the materializer.
        kind.check()
            .map_err(|e| EndpointError::invalid("query", e.to_string()))?;
        return Ok(as_value);
    }
    let sql = obj
        .get("query")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let placeholders = corvid_query::variable_names(&sql).map_err(invalid_hogql)?;
    let synced = sync_variables(obj.get("variables"), &placeholders, variables)?;
    // Parse with every variable bound to NULL: the shape must be valid whatever the values.
    let bindings = Bindings {
        variables: placeholders
            .iter()
            .map(|p| (p.clone(), Value::Null))
            .collect(),
        filters: None,
        variable_markers: false,
    };
    let limits = RowLimits {
        default_rows: 1,
        max_rows: 1,
        page: None,
    };
    corvid_query::prepare_user_sql(&sql, &bindings, limits).map_err(invalid_hogql)?;
    match synced {
        Some(map) => obj.insert("variables".into(), Value::Object(map)),
        None => obj.remove("variables"),
    };
    Ok(Value::Object(obj))
}

fn invalid_hogql(e: QueryError) -> EndpointError {
    EndpointError::invalid("query", format!("Invalid HogQL query: {e}"))
}

/// The stored `variables` map (`{id: {variableId, code_name, value}}`) for `placeholders`:
/// ids must be UUIDs of this project's variables; placeholders without an entry take the
/// project variable with that code name; entries the SQL does not use are dropped.
fn sync_variables(
    given: Option<&Value>,
    placeholders: &BTreeSet<String>,
    project: &[InsightVariable],
) -> Result<Option<Map<String, Value>>, EndpointError> {
    let given = match given {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(EndpointError::invalid(
                "query",
                "query.variables must be an object keyed by variable id.",
            ))
        }
    };
    let mut bad_ids = Vec::new();
    let mut unknown_ids = Vec::new();
    let mut by_code: BTreeMap<String, Value> = BTreeMap::new();
    for (id, entry) in &given {
        let Ok(uuid) = Uuid::parse_str(id) else {
            bad_ids.push(id.clone());
            continue;
        };
        let Some(def) = project.iter().find(|v| v.id == uuid) else {
            unknown_ids.push(id.clone());
            continue;
        };
        by_code.insert(def.code_name.clone(), variable_entry(def, Some(entry)));
    }
    if !bad_ids.is_empty() {
        return Err(EndpointError::invalid(
            "query",
            format!("Variable ID(s) not valid UUIDs: {}. ", bad_ids.join(", ")),
        ));
    }
    if !unknown_ids.is_empty() {
        return Err(EndpointError::invalid(
            "query",
            format!("Variable ID(s) not found: {}. Make sure the variables exist in https://app.posthog.com/data-management/variables.", unknown_ids.join(", ")),
        ));
    }
    let mut undefined = Vec::new();
    let mut out = Map::new();
    for code in placeholders {
        let entry = match by_code.remove(code) {
            Some(entry) => entry,
            None => match project.iter().find(|v| &v.code_name == code) {
                Some(def) => variable_entry(def, None),
                None => {
                    undefined.push(code.clone());
                    continue;
                }
            },
        };
        let id = entry["variableId"].as_str().unwrap_or_default().to_string();
        out.insert(id, entry);
    }
    if !undefined.is_empty() {
        return Err(EndpointError::invalid(
            "query",
            format!("Query references undefined variable(s): {}. See https://posthog.com/docs/endpoints/variables for detail.", undefined.join(", ")),
        ));
    }
    Ok((!placeholders.is_empty()).then_some(out))
}

/// One `HogQLVariable` entry; a missing value falls back to the definition's default.
fn variable_entry(def: &InsightVariable, given: Option<&Value>) -> Value {
    let value = given
        .and_then(|g| g.get("value"))
        .filter(|v| !v.is_null())
        .cloned()
        .unwrap_or_else(|| def.default_value.clone());
    let mut entry = json!({"variableId": def.id.to_string(), "code_name": def.code_name});
    if !value.is_null() {
        entry["value"] = value;
    }
    if given.and_then(|g| g.get("isNull")).and_then(Value::as_bool) == Some(true) {
        entry["isNull"] = Value::Bool(true);
    }
    entry
}

/// The query JSON with sorted keys, for "did the query change?".
pub fn normalized(query: &Value) -> Value {
    match query {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> =
                m.iter().map(|(k, v)| (k, normalized(v))).collect();
            serde_json::to_value(sorted).unwrap_or(Value::Null)
        }
        Value::Array(a) => Value::Array(a.iter().map(normalized).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::VariableType;
    use chrono::Utc;

    fn var(code: &str, default: Value) -> InsightVariable {
        InsightVariable {
            id: Uuid::new_v4(),
            project_id: 1,
            name: code.into(),
            code_name: code.into(),
            kind: VariableType::String,
            default_value: default,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }
    }

    fn detail(e: EndpointError) -> String {
        match e {
            EndpointError::Invalid { detail, .. } => detail,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn names_follow_the_pattern() {
        assert!(valid_name("a"));
        assert!(valid_name("daily-users_2"));
        assert!(valid_name(&format!("a{}", "b".repeat(127))));
        assert!(!valid_name(&format!("a{}", "b".repeat(128))));
        assert!(!valid_name(""));
        assert!(!valid_name("1abc"));
        assert!(!valid_name("has space"));
        assert!(!valid_name("dot.name"));
    }

    #[test]
    fn freshness_must_be_a_listed_bucket() {
        assert!(check_freshness(900).is_ok());
        let msg = detail(check_freshness(60).expect_err("60 is not a bucket"));
        assert!(msg.starts_with(
            "Data freshness must be one of: [900, 1800, 3600, 21600, 43200, 86400, 604800] seconds"
        ));
    }

    #[test]
    fn placeholders_need_definitions() {
        let q = json!({"kind": "HogQLQuery", "query": "SELECT 1 FROM events WHERE event = {variables.ev} AND distinct_id = {variables.who}"});
        let err = detail(
            prepare_query(q.clone(), &[var("ev", Value::Null)]).expect_err("who is undefined"),
        );
        assert_eq!(err, "Query references undefined variable(s): who. See https://posthog.com/docs/endpoints/variables for detail.");
        let ev = var("ev", json!("$pageview"));
        let stored = prepare_query(q, &[ev.clone(), var("who", Value::Null)]).expect("valid");
        let vars = stored["variables"].as_object().expect("variables");
        assert_eq!(vars.len(), 2);
        assert_eq!(vars[&ev.id.to_string()]["value"], json!("$pageview"));
    }

    #[test]
    fn variable_ids_must_be_uuids_of_this_project() {
        let q = |vars: Value| json!({"kind": "HogQLQuery", "query": "SELECT {variables.ev}", "variables": vars});
        let err = detail(
            prepare_query(q(json!({"nope": {"code_name": "ev"}})), &[]).expect_err("bad id"),
        );
        assert_eq!(err, "Variable ID(s) not valid UUIDs: nope. ");
        let id = Uuid::new_v4();
        let err = detail(
            prepare_query(q(json!({id.to_string(): {"code_name": "ev"}})), &[])
                .expect_err("unknown id"),
        );
        assert!(err.starts_with(&format!(
            "Variable ID(s) not found: {id}. Make sure the variables exist"
        )));
    }

    #[test]
    fn unused_variables_are_dropped_and_sql_without_placeholders_has_none() {
        let ev = var("ev", json!("x"));
        let q = json!({"kind": "HogQLQuery", "query": "SELECT 1", "variables": {ev.id.to_string(): {"code_name": "ev", "value": "y"}}});
        let stored = prepare_query(q, &[ev]).expect("valid");
        assert!(stored.get("variables").is_none());
    }

    #[test]
    fn invalid_sql_is_named() {
        let err = detail(
            prepare_query(json!({"kind": "HogQLQuery", "query": "SELEC 1"}), &[])
                .expect_err("syntax"),
        );
        assert!(err.starts_with("Invalid HogQL query: "), "{err}");
        let err = detail(prepare_query(json!({"kind": "FunnelsQuery"}), &[]).expect_err("kind"));
        assert!(err.contains("FunnelsQuery"));
    }
}
