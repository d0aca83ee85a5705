//! The JSON shape of endpoints, their versions and materialization, as PostHog's API answers.

use serde_json::{json, Map, Value};

use super::model::{Endpoint, EndpointVersion};
use crate::model::{sync_frequency, MaterializationStatus};

/// The kind of a result column (PostHog's endpoint `columns[].type`).
fn column_kind(clickhouse: &str) -> &'static str {
    let t = clickhouse
        .trim_start_matches("Nullable(")
        .trim_end_matches(')');
    if t.starts_with("Int") || t.starts_with("UInt") {
        "integer"
    } else if t.starts_with("Float") || t.starts_with("Decimal") {
        "float"
    } else if t.starts_with("DateTime") {
        "datetime"
    } else if t.starts_with("Date") {
        "date"
    } else if t == "Bool" {
        "boolean"
    } else if t.starts_with("Array") {
        "array"
    } else if t == "String" {
        "string"
    } else {
        "unknown"
    }
}

/// `materialization` of a version: status when enabled, else whether it could be.
pub fn materialization_json(v: &EndpointVersion) -> Value {
    match &v.materialization {
        Some(m) => json!({
            "status": match m.status {
                MaterializationStatus::Running => "Running",
                MaterializationStatus::Completed => "Completed",
                MaterializationStatus::Failed => "Failed",
            },
            "can_materialize": true,
            "last_materialized_at": m.last_run_at,
            "error": m.error,
            "sync_frequency": sync_frequency(v.data_freshness_seconds),
        }),
        None => match corvid_query::materialization_plan(&v.query) {
            Ok(_) => json!({"can_materialize": true, "reason": null}),
            Err(reason) => json!({"can_materialize": false, "reason": reason}),
        },
    }
}

/// The endpoint as the API shows it (`base_url` makes `url` absolute).
pub fn endpoint_json(e: &Endpoint, base_url: &str, columns: Option<&[(String, String)]>) -> Value {
    let latest = e.latest();
    let columns: Vec<Value> = columns
        .unwrap_or_default()
        .iter()
        .map(|(name, t)| json!({"name": name, "type": column_kind(t)}))
        .collect();
    json!({
        "id": e.id,
        "name": e.name,
        "description": latest.map(|v| v.description.clone()).unwrap_or_default(),
        "query": latest.map(|v| v.query.clone()),
        "is_active": e.is_active,
        "data_freshness_seconds": latest.map(|v| v.data_freshness_seconds),
        "endpoint_path": e.path(),
        "url": format!("{base_url}{}", e.path()),
        "ui_url": format!("{base_url}/project/{}/endpoints/{}", e.project_id, e.name),
        "created_at": e.created_at,
        "updated_at": e.updated_at,
        "created_by": e.created_by.as_ref().map(|email| json!({"email": email})),
        "is_materialized": latest.is_some_and(EndpointVersion::is_materialized),
        "current_version": e.current_version,
        "current_version_id": latest.map(|v| v.id),
        "versions_count": e.versions.len(),
        "derived_from_insight": e.derived_from_insight,
        "last_executed_at": e.last_executed_at,
        "materialization": latest.map(materialization_json),
        "bucket_overrides": null,
        "columns": columns,
        "tags": [],
        "optional_breakdown_properties": [],
    })
}

/// One version as the API shows it: the endpoint's fields with the version's own.
pub fn version_json(e: &Endpoint, v: &EndpointVersion, base_url: &str) -> Value {
    let mut out = endpoint_json(e, base_url, None);
    let Value::Object(map) = &mut out else {
        return out;
    };
    let extra: Map<String, Value> = json!({
        "version": v.version,
        "version_id": v.id,
        "description": v.description,
        "query": v.query,
        "is_active": v.is_active,
        "endpoint_is_active": e.is_active,
        "data_freshness_seconds": v.data_freshness_seconds,
        "is_materialized": v.is_materialized(),
        "materialization": materialization_json(v),
        "last_executed_at": v.last_executed_at,
        "version_created_at": v.created_at,
        "version_updated_at": v.updated_at,
        "version_created_by": e.created_by.as_ref().map(|email| json!({"email": email})),
    })
    .as_object()
    .cloned()
    .unwrap_or_default();
    map.extend(extra);
    out
}
