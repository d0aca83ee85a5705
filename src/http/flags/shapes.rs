//! The shapes of a flags answer: `v=2` (written as bytes by [`super::v2`]), the legacy
//! `/flags` map and the `/decide` list and map.

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use chrono::Utc;
use corvid_flags::FlagsOutcome;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// The `v=2` response (the hot path: written straight into bytes, see [`super::v2`]). The
/// content type is a static value: a typed `ContentType` is formatted and checked as text on
/// every answer.
pub fn v2_response(outcome: &FlagsOutcome, config: Option<&str>) -> HttpResponse {
    let mut response = HttpResponse::with_body(StatusCode::OK, super::v2::write(outcome, config))
        .map_into_boxed_body();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

pub fn legacy_body(outcome: &FlagsOutcome) -> Value {
    let mut values = Map::new();
    let mut payloads = Map::new();
    for (index, e) in outcome.returned() {
        let key = outcome.flag(index).key.clone();
        let value = match (&e.variant, e.enabled) {
            (Some(v), true) => Value::String(v.clone()),
            (_, enabled) => Value::Bool(enabled),
        };
        if let Some(p) = &e.payload {
            payloads.insert(key.clone(), p.clone());
        }
        values.insert(key, value);
    }
    json!({
        "featureFlags": values,
        "featureFlagPayloads": payloads,
        "errorsWhileComputingFlags": outcome.errors,
        "requestId": uuid::Uuid::new_v4(),
        "evaluatedAt": Utc::now().timestamp_millis(),
    })
}

pub fn decide_list_body(outcome: &FlagsOutcome) -> Value {
    let enabled: Vec<&str> = outcome
        .returned()
        .filter(|(_, e)| e.enabled)
        .map(|(i, _)| outcome.flag(i).key.as_str())
        .collect();
    json!({"featureFlags": enabled, "errorsWhileComputingFlags": outcome.errors})
}

pub fn decide_map_body(outcome: &FlagsOutcome) -> Value {
    let mut legacy = legacy_body(outcome);
    if let Some(Value::Object(flags)) = legacy.get_mut("featureFlags") {
        flags.retain(|_, v| *v != Value::Bool(false));
    }
    legacy
}

/// Adds config members (a JSON object's members without braces, as remote config renders
/// them) to a legacy or `/decide` body.
pub fn add_config(body: &mut Value, members: &str) -> Result<(), ApiError> {
    let fields: Map<String, Value> = serde_json::from_str(&format!("{{{members}}}"))
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("config members are not JSON: {e}")))?;
    if let Some(obj) = body.as_object_mut() {
        obj.extend(fields);
    }
    Ok(())
}
