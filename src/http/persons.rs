//! Read APIs over what ingestion stored: persons, groups, events and usage.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use corvid_events::{EventFilter, StoredEvent};
use corvid_kernel::parse_timestamp;
use corvid_persons::{Group, Person};
use serde_json::{json, Value};

use super::project_route;
use crate::auth::scope::{GroupRead, PersonRead, ProjectRead, QueryRead};
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/persons", || web::get().to(persons));
    project_route(cfg, "/groups", || web::get().to(groups));
    project_route(cfg, "/groups/find", || web::get().to(find_group));
    project_route(cfg, "/groups_types", || web::get().to(group_types));
    project_route(cfg, "/events", || web::get().to(events));
    project_route(cfg, "/usage", || web::get().to(usage));
}

type Params = web::Query<HashMap<String, String>>;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

fn limit(params: &Params) -> Result<usize, ApiError> {
    match params.get("limit") {
        None => Ok(DEFAULT_LIMIT),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| n.min(MAX_LIMIT))
            .ok_or_else(|| ApiError::validation("limit must be a positive integer", Some("limit"))),
    }
}

fn page(results: Vec<Value>) -> HttpResponse {
    HttpResponse::Ok().json(json!({"results": results, "next": null, "previous": null}))
}

pub(super) fn person_json(p: &Person) -> Value {
    let name = p
        .properties
        .get("email")
        .or_else(|| p.properties.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| p.distinct_ids.first().cloned());
    json!({
        "id": p.id,
        "uuid": p.id,
        "name": name,
        "distinct_ids": p.distinct_ids,
        "properties": p.properties,
        "created_at": p.created_at,
        "is_identified": p.is_identified,
    })
}

async fn persons(
    access: ProjectAccess<PersonRead>,
    state: web::Data<AppState>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let limit = limit(&params)?;
    let distinct_id = params.get("distinct_id").cloned();
    let found = state.engine.persons.persons(project, distinct_id).await?;
    Ok(page(found.iter().take(limit).map(person_json).collect()))
}

fn group_json(g: &Group) -> Value {
    json!({
        "group_type_index": g.group_type_index,
        "group_key": g.group_key,
        "group_properties": g.properties,
        "created_at": g.created_at,
    })
}

fn group_type_index(params: &Params, required: bool) -> Result<Option<u8>, ApiError> {
    match params.get("group_type_index") {
        None if required => Err(ApiError::validation(
            "group_type_index is required",
            Some("group_type_index"),
        )),
        None => Ok(None),
        Some(text) => text
            .parse::<u8>()
            .ok()
            .filter(|i| *i < 5)
            .map(Some)
            .ok_or_else(|| {
                ApiError::validation("group_type_index must be 0 to 4", Some("group_type_index"))
            }),
    }
}

async fn groups(
    access: ProjectAccess<GroupRead>,
    state: web::Data<AppState>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let index = group_type_index(&params, false)?;
    let key = params.get("group_key").cloned();
    let limit = limit(&params)?;
    let found = state.engine.persons.groups(project, index).await?;
    Ok(page(
        found
            .iter()
            .filter(|g| key.as_ref().is_none_or(|k| &g.group_key == k))
            .take(limit)
            .map(group_json)
            .collect(),
    ))
}

async fn find_group(
    access: ProjectAccess<GroupRead>,
    state: web::Data<AppState>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let index = group_type_index(&params, true)?.unwrap_or_default();
    let key = params
        .get("group_key")
        .cloned()
        .ok_or_else(|| ApiError::validation("group_key is required", Some("group_key")))?;
    let found = state.engine.persons.group(project, index, &key).await?;
    let group = found.ok_or_else(|| ApiError::not_found("Group"))?;
    Ok(HttpResponse::Ok().json(group_json(&group)))
}

async fn group_types(
    access: ProjectAccess<GroupRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let types = state.engine.persons.group_types(project).await?;
    let body: Vec<Value> = types
        .into_iter()
        .map(|(name, index)| json!({"group_type": name, "group_type_index": index}))
        .collect();
    Ok(HttpResponse::Ok().json(body))
}

fn event_json(e: StoredEvent) -> Value {
    let properties: Value = serde_json::from_str(&e.properties).unwrap_or(Value::Null);
    let person_properties: Value =
        serde_json::from_str(&e.person_properties).unwrap_or(Value::Null);
    json!({
        "id": e.uuid,
        "uuid": e.uuid,
        "event": e.event,
        "distinct_id": e.distinct_id,
        "properties": properties,
        "timestamp": e.timestamp,
        "created_at": e.created_at,
        "person_id": e.person_id,
        "person": {
            "id": e.person_id,
            "distinct_ids": [e.distinct_id],
            "properties": person_properties,
        },
        "elements": [],
        "elements_chain": "",
    })
}

fn time_param(
    params: &Params,
    name: &'static str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    params
        .get(name)
        .map(|t| {
            parse_timestamp(t).ok_or_else(|| {
                ApiError::validation(format!("{name} must be an ISO 8601 date-time"), Some(name))
            })
        })
        .transpose()
}

/// `GET …/events/`: newest first, one page of `limit`; `next` carries a cursor (`before` =
/// the last event's time, `before_uuid` its uuid), so following it never repeats or skips an
/// event, even while new events arrive.
async fn events(
    req: actix_web::HttpRequest,
    access: ProjectAccess<QueryRead>,
    state: web::Data<AppState>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let before_uuid = params
        .get("before_uuid")
        .map(|u| {
            uuid::Uuid::parse_str(u).map_err(|_| {
                ApiError::validation("before_uuid must be a UUID", Some("before_uuid"))
            })
        })
        .transpose()?;
    let page_size = limit(&params)?;
    let filter = EventFilter {
        project_id: access.project.id,
        event: params.get("event").cloned(),
        distinct_id: params.get("distinct_id").cloned(),
        after: time_param(&params, "after")?,
        before: time_param(&params, "before")?,
        before_uuid,
        // One more than a page tells whether another page exists.
        limit: page_size + 1,
    };
    let ingest = state.engine.ingest.clone();
    let mut found = web::block(move || ingest.query_events(&filter))
        .await?
        .map_err(|e| ApiError::Internal(e.into()))?;
    let next = if found.len() > page_size {
        found.truncate(page_size);
        found.last().map(|last| {
            let before = last
                .timestamp
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            super::page_link(
                &req,
                &state,
                &params,
                vec![
                    ("before".into(), before),
                    ("before_uuid".into(), last.uuid.to_string()),
                ],
            )
        })
    } else {
        None
    };
    let results: Vec<Value> = found.into_iter().map(event_json).collect();
    Ok(HttpResponse::Ok().json(json!({"results": results, "next": next, "previous": null})))
}

async fn usage(
    access: ProjectAccess<ProjectRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let rows = state.engine.persons.usage(project).await?;
    Ok(HttpResponse::Ok().json(json!({"results": rows})))
}
