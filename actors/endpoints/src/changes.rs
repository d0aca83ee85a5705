//! The rules of creating and updating endpoints (PostHog Gen-2 semantics): the request a
//! create or update carries, new versions, activation, materialization settings.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::error::EndpointError;
use super::model::{
    freshness_of_sync_frequency, Endpoint, EndpointVersion, InsightVariable, Materialization,
    DEFAULT_FRESHNESS_SECONDS,
};
use super::validate::{check_freshness, check_name, normalized, prepare_query};

/// `EndpointRequest`: the body of create and update.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointRequest {
    pub name: Option<String>,
    pub query: Option<Value>,
    pub description: Option<String>,
    pub data_freshness_seconds: Option<u64>,
    pub is_active: Option<bool>,
    pub is_materialized: Option<bool>,
    pub sync_frequency: Option<String>,
    pub derived_from_insight: Option<String>,
    pub version: Option<u32>,
    pub deleted: Option<bool>,
    /// Accepted for compatibility; Corvid has no tags yet.
    #[serde(default, rename = "tags")]
    _tags: Option<Value>,
    /// Accepted for compatibility; the endpoint's name is what is shown.
    #[serde(default, rename = "display_name")]
    _display_name: Option<String>,
}

impl EndpointRequest {
    /// Decodes a create or update body, naming the unknown or mistyped field as PostHog does.
    pub fn from_json(body: Value) -> Result<EndpointRequest, EndpointError> {
        parse_request(body)
    }
}

/// Decodes a request body, naming the unknown or mistyped field.
fn parse_request(body: Value) -> Result<EndpointRequest, EndpointError> {
    serde_json::from_value(body).map_err(|e| {
        let text = e.to_string();
        let field = text
            .split('`')
            .nth(1)
            .filter(|_| text.starts_with("unknown field"))
            .map(str::to_string);
        match field {
            Some(f) => EndpointError::invalid(&f, "Extra inputs are not permitted"),
            None => EndpointError::Invalid {
                attr: None,
                detail: format!("Invalid request: {text}"),
            },
        }
    })
}

fn freshness(req: &EndpointRequest) -> Result<Option<u64>, EndpointError> {
    if let Some(s) = req.data_freshness_seconds {
        check_freshness(s)?;
        return Ok(Some(s));
    }
    match &req.sync_frequency {
        None => Ok(None),
        Some(label) => freshness_of_sync_frequency(label).map(Some).ok_or_else(|| {
            EndpointError::invalid(
                "sync_frequency",
                format!("Unknown sync_frequency '{label}'. Use one of: 15min, 30min, 1hour, 6hour, 12hour, 24hour, 7day."),
            )
        }),
    }
}

/// A new endpoint from a create request. SQL queries that can be materialized are, by
/// default (PostHog: materialization on for new endpoints).
pub fn create(
    project_id: u64,
    req: EndpointRequest,
    variables: &[InsightVariable],
    created_by: Option<String>,
) -> Result<Endpoint, EndpointError> {
    let name = req
        .name
        .clone()
        .ok_or_else(|| EndpointError::invalid("name", "This field is required."))?;
    check_name(&name)?;
    let query = req
        .query
        .clone()
        .ok_or_else(|| EndpointError::invalid("query", "This field is required."))?;
    let query = prepare_query(query, variables)?;
    let data_freshness_seconds = freshness(&req)?.unwrap_or(DEFAULT_FRESHNESS_SECONDS);
    let now = Utc::now();
    let is_active = req.is_active.unwrap_or(true);
    let materialization = match req.is_materialized {
        Some(true) => {
            if !is_active {
                return Err(EndpointError::invalid(
                    "is_materialized",
                    "Cannot enable materialization on inactive endpoint.",
                ));
            }
            check_materializable(&query)?;
            Some(Materialization::pending())
        }
        Some(false) => None,
        None => (is_active
            && query.get("kind").and_then(Value::as_str) == Some("HogQLQuery")
            && corvid_query::materialization_plan(&query).is_ok())
        .then(Materialization::pending),
    };
    Ok(Endpoint {
        id: Uuid::now_v7(),
        project_id,
        name,
        is_active,
        current_version: 1,
        derived_from_insight: req.derived_from_insight,
        created_at: now,
        updated_at: now,
        created_by,
        last_executed_at: None,
        versions: vec![EndpointVersion {
            id: Uuid::now_v7(),
            version: 1,
            query,
            description: req.description.unwrap_or_default(),
            data_freshness_seconds,
            is_active: true,
            created_at: now,
            updated_at: now,
            last_executed_at: None,
            materialization,
        }],
    })
}

fn check_materializable(query: &Value) -> Result<(), EndpointError> {
    corvid_query::materialization_plan(query)
        .map(|_| ())
        .map_err(|reason| {
            EndpointError::invalid(
                "is_materialized",
                format!("Cannot materialize endpoint. Reason: {reason}"),
            )
        })
}

/// `is_active`: with a target version only that version's flag changes; an inactive endpoint
/// loses its materializations and cannot gain one or a sync frequency.
fn set_activity(
    e: &mut Endpoint,
    req: &EndpointRequest,
    target: Option<u32>,
    now: DateTime<Utc>,
) -> Result<(), EndpointError> {
    match (req.is_active, target) {
        (Some(active), Some(n)) => {
            if let Some(v) = e.version_mut(n) {
                v.is_active = active;
                v.updated_at = now;
            }
        }
        (Some(active), None) => {
            e.is_active = active;
            if !active {
                for v in &mut e.versions {
                    v.materialization = None;
                }
            }
        }
        (None, _) => {}
    }
    if !e.is_active {
        if req.is_materialized == Some(true) {
            return Err(EndpointError::invalid(
                "is_materialized",
                "Cannot enable materialization on inactive endpoint.",
            ));
        }
        if req.sync_frequency.is_some() {
            return Err(EndpointError::invalid(
                "sync_frequency",
                "Cannot set sync_frequency on inactive endpoint.",
            ));
        }
    }
    Ok(())
}

/// A query that differs from the newest version's (normalised) makes a new version, carrying
/// description, freshness and materialization over from the newest one. `true`: the new
/// version is to be materialized now.
fn add_version_if_changed(e: &mut Endpoint, query: Value, now: DateTime<Utc>) -> bool {
    let mut kick = false;
    let latest = e.latest().cloned();
    let changed = latest
        .as_ref()
        .is_none_or(|l| normalized(&l.query) != normalized(&query));
    if changed {
        let previous_materialized = latest.as_ref().is_some_and(|l| l.is_materialized());
        for v in &mut e.versions {
            v.materialization = None;
        }
        let number = e.current_version + 1;
        let materialization =
            if previous_materialized && corvid_query::materialization_plan(&query).is_ok() {
                kick = true;
                Some(Materialization::pending())
            } else {
                None
            };
        e.versions.push(EndpointVersion {
            id: Uuid::now_v7(),
            version: number,
            query,
            description: latest
                .as_ref()
                .map(|l| l.description.clone())
                .unwrap_or_default(),
            data_freshness_seconds: latest
                .as_ref()
                .map(|l| l.data_freshness_seconds)
                .unwrap_or(DEFAULT_FRESHNESS_SECONDS),
            is_active: true,
            created_at: now,
            updated_at: now,
            last_executed_at: None,
            materialization,
        });
        e.current_version = number;
    }
    kick
}

/// What an update did, for the response.
#[derive(Debug)]
pub struct Updated {
    /// The version the request targeted with `?version=` / `version`.
    pub version: Option<u32>,
    /// Materialization should be (re)computed now.
    pub kick_materializer: bool,
}

/// Applies an update request to `e`.
pub fn update(
    e: &mut Endpoint,
    req: EndpointRequest,
    target_version: Option<u32>,
    variables: &[InsightVariable],
) -> Result<Updated, EndpointError> {
    if let Some(name) = &req.name {
        if name != &e.name {
            check_name(name)?;
            return Err(EndpointError::invalid(
                "name",
                "An endpoint's name cannot be changed; create a new endpoint instead.",
            ));
        }
    }
    let target = target_version.or(req.version);
    if let Some(n) = target {
        if e.version(n).is_none() {
            return Err(EndpointError::plain(404, format!("Version {n} not found")));
        }
    }
    let now = Utc::now();
    let freshness = freshness(&req)?;
    set_activity(e, &req, target, now)?;
    let mut kick = match req.query {
        Some(query) => add_version_if_changed(e, prepare_query(query, variables)?, now),
        None => false,
    };

    let n = target.unwrap_or(e.current_version);
    let Some(v) = e.version_mut(n) else {
        return Err(EndpointError::plain(404, format!("Version {n} not found")));
    };
    if let Some(d) = req.description {
        v.description = d;
    }
    if let Some(s) = freshness {
        if s != v.data_freshness_seconds && v.is_materialized() {
            kick = true;
        }
        v.data_freshness_seconds = s;
    }
    match req.is_materialized {
        Some(true) => {
            check_materializable(&v.query)?;
            if v.materialization.is_none() {
                v.materialization = Some(Materialization::pending());
                kick = true;
            }
        }
        Some(false) => v.materialization = None,
        None => {}
    }
    v.updated_at = now;
    if let Some(d) = req.derived_from_insight {
        e.derived_from_insight = Some(d);
    }
    e.updated_at = now;
    Ok(Updated {
        version: target,
        kick_materializer: kick,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(body: Value) -> EndpointRequest {
        parse_request(body).expect("valid request")
    }

    #[test]
    fn create_requires_name_and_query_and_materializes_sql_by_default() {
        let err = create(
            1,
            req(json!({"query": {"kind": "HogQLQuery", "query": "SELECT 1"}})),
            &[],
            None,
        )
        .expect_err("no name");
        assert!(
            matches!(err, EndpointError::Invalid { attr: Some(ref a), ref detail } if a == "name" && detail == "This field is required.")
        );
        let err = create(1, req(json!({"name": "x"})), &[], None).expect_err("no query");
        assert!(matches!(err, EndpointError::Invalid { attr: Some(ref a), .. } if a == "query"));
        let e = create(1, req(json!({"name": "x", "query": {"kind": "HogQLQuery", "query": "SELECT count() FROM events"}})), &[], None).expect("created");
        assert!(e.versions[0].is_materialized());
        assert_eq!(e.versions[0].data_freshness_seconds, 86400);
        let trends = json!({"kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview"}]});
        let e = create(1, req(json!({"name": "t", "query": trends})), &[], None).expect("created");
        assert!(
            !e.versions[0].is_materialized(),
            "insights are materialized on request only"
        );
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = parse_request(json!({"name": "x", "colour": "red"})).expect_err("unknown");
        assert!(matches!(err, EndpointError::Invalid { attr: Some(ref a), .. } if a == "colour"));
    }

    #[test]
    fn a_new_version_only_when_the_query_changes() {
        let q = json!({"kind": "HogQLQuery", "query": "SELECT 1"});
        let mut e = create(
            1,
            req(
                json!({"name": "x", "query": q, "description": "d", "data_freshness_seconds": 900}),
            ),
            &[],
            None,
        )
        .expect("created");
        update(
            &mut e,
            req(json!({"query": {"query": "SELECT 1", "kind": "HogQLQuery"}})),
            None,
            &[],
        )
        .expect("same");
        assert_eq!(e.current_version, 1, "key order does not matter");
        update(
            &mut e,
            req(json!({"query": {"kind": "HogQLQuery", "query": "SELECT 2"}})),
            None,
            &[],
        )
        .expect("changed");
        assert_eq!(e.current_version, 2);
        assert_eq!(e.versions[1].description, "d");
        assert_eq!(e.versions[1].data_freshness_seconds, 900);
        assert!(
            e.versions[1].is_materialized(),
            "materialization carries over"
        );
        assert!(
            !e.versions[0].is_materialized(),
            "the old version's is switched off"
        );
    }

    #[test]
    fn inactive_endpoints_cannot_materialize() {
        let q = json!({"kind": "HogQLQuery", "query": "SELECT 1"});
        let mut e = create(1, req(json!({"name": "x", "query": q})), &[], None).expect("created");
        update(&mut e, req(json!({"is_active": false})), None, &[]).expect("deactivated");
        assert!(!e.versions[0].is_materialized());
        let err =
            update(&mut e, req(json!({"is_materialized": true})), None, &[]).expect_err("inactive");
        assert_eq!(
            err.to_string(),
            "Cannot enable materialization on inactive endpoint."
        );
    }

    #[test]
    fn ineligible_queries_say_why() {
        let q = json!({"kind": "HogQLQuery", "query": "SELECT count() FROM events WHERE event LIKE {variables.ev}"});
        let var = InsightVariable {
            id: Uuid::new_v4(),
            project_id: 1,
            name: "ev".into(),
            code_name: "ev".into(),
            kind: crate::model::VariableType::String,
            default_value: Value::Null,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        };
        let e = create(
            1,
            req(json!({"name": "x", "query": q.clone()})),
            std::slice::from_ref(&var),
            None,
        )
        .expect("created");
        assert!(
            !e.versions[0].is_materialized(),
            "not eligible: stays inline"
        );
        let err = create(
            1,
            req(json!({"name": "x", "query": q, "is_materialized": true})),
            &[var],
            None,
        )
        .expect_err("ineligible");
        assert_eq!(err.to_string(), "Cannot materialize endpoint. Reason: Unsupported operator LIKE, supported: =, >=, >, <, <=");
    }
}
