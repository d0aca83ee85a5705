//! `/api/projects/{id}/cohorts/`: property cohorts (AND/OR groups, nested cohorts) and static
//! cohorts (distinct ids given as JSON, or as CSV with `Content-Type: text/csv`).

use std::collections::HashMap;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_actors::flags::model::{CohortDefinition, CohortFilters};
use corvid_actors::flags::store::CohortRecord;
use corvid_actors::flags::validate::validate_cohort;
use serde::Deserialize;
use serde_json::{json, Value};

use super::project_route;
use crate::auth::scope::{CohortRead, CohortWrite};
use crate::auth::ProjectAccess;
use crate::body::{parse_json, read_body};
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/cohorts", || web::get().to(list));
    project_route(cfg, "/cohorts", || web::post().to(create));
    project_route(cfg, "/cohorts/{cohort_id}", || web::get().to(get));
    project_route(cfg, "/cohorts/{cohort_id}", || web::patch().to(update));
    project_route(cfg, "/cohorts/{cohort_id}", || web::delete().to(delete));
}

fn cohort_json(c: &CohortRecord) -> Value {
    json!({
        "id": c.definition.id,
        "name": c.definition.name,
        "is_static": c.definition.is_static,
        "filters": c.definition.filters,
        "count": c.definition.is_static.then_some(c.static_distinct_ids.len()),
        "deleted": c.deleted,
        "created_at": c.created_at,
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CohortBody {
    name: Option<String>,
    description: Option<String>,
    filters: Option<CohortFilters>,
    is_static: Option<bool>,
    distinct_ids: Option<Vec<String>>,
}

/// JSON, or CSV (first column; a `distinct_id` header row is skipped) for static cohorts.
async fn body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<CohortBody, ApiError> {
    let bytes = read_body(
        req,
        payload.into_inner(),
        state.config.limits.max_body_bytes,
    )
    .await?;
    let is_csv = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/csv"));
    if !is_csv {
        return parse_json(&bytes);
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| ApiError::validation("CSV must be UTF-8.", None))?;
    let ids: Vec<String> = text
        .lines()
        .filter_map(|l| l.split(',').next())
        .map(|c| c.trim().trim_matches('"').to_string())
        .filter(|c| !c.is_empty())
        .enumerate()
        .filter(|(i, c)| !(*i == 0 && c.eq_ignore_ascii_case("distinct_id")))
        .map(|(_, c)| c)
        .collect();
    let query = web::Query::<HashMap<String, String>>::from_query(req.query_string()).ok();
    Ok(CohortBody {
        name: query.and_then(|q| q.get("name").cloned()),
        is_static: Some(true),
        distinct_ids: Some(ids),
        ..CohortBody::default()
    })
}

async fn list(
    access: ProjectAccess<CohortRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let cohorts = state.flags_op(move |f| f.cohorts(project)).await?;
    let results: Vec<Value> = cohorts
        .iter()
        .filter(|c| !c.deleted)
        .map(cohort_json)
        .collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

fn apply(body: CohortBody, mut record: CohortRecord) -> Result<CohortRecord, ApiError> {
    let _ = body.description;
    if let Some(name) = body.name {
        record.definition.name = name;
    }
    if let Some(is_static) = body.is_static {
        record.definition.is_static = is_static;
    }
    if let Some(filters) = body.filters {
        record.definition.filters = Some(filters);
    }
    if let Some(ids) = body.distinct_ids {
        record.static_distinct_ids = ids;
    }
    if record.definition.is_static && record.definition.filters.is_some() {
        return Err(ApiError::validation(
            "A static cohort has members, not filters.",
            Some("filters"),
        ));
    }
    if !record.definition.is_static && record.definition.filters.is_none() {
        return Err(ApiError::validation(
            "A cohort needs filters or is_static with distinct_ids.",
            Some("filters"),
        ));
    }
    Ok(record)
}

async fn create(
    req: HttpRequest,
    payload: web::Payload,
    access: ProjectAccess<CohortWrite>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = body(&req, payload, &state).await?;
    let blank = CohortRecord {
        definition: CohortDefinition {
            id: 0,
            name: String::new(),
            is_static: false,
            filters: None,
        },
        project_id: access.project.id,
        static_distinct_ids: Vec::new(),
        deleted: false,
        created_at: Utc::now(),
    };
    let record = apply(body, blank)?;
    let project = access.project.id;
    let saved = state
        .flags_op(move |f| {
            validate_cohort(&record.definition, &f.cohorts(project)?)?;
            f.save_cohort(project, record)
        })
        .await?;
    Ok(HttpResponse::Created().json(cohort_json(&saved)))
}

async fn existing(state: &AppState, project: u64, raw: &str) -> Result<CohortRecord, ApiError> {
    let id: i64 = raw.parse().map_err(|_| ApiError::not_found("Cohort"))?;
    let found = state.flags_op(move |f| f.cohort(project, id)).await?;
    found
        .filter(|c| !c.deleted)
        .ok_or_else(|| ApiError::not_found("Cohort"))
}

async fn get(
    access: ProjectAccess<CohortRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(cohort_json(
        &existing(&state, access.project.id, &path.1).await?,
    )))
}

async fn update(
    req: HttpRequest,
    payload: web::Payload,
    access: ProjectAccess<CohortWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let old = existing(&state, project, &path.1).await?;
    let record = apply(body(&req, payload, &state).await?, old)?;
    let saved = state
        .flags_op(move |f| {
            validate_cohort(&record.definition, &f.cohorts(project)?)?;
            f.save_cohort(project, record)
        })
        .await?;
    Ok(HttpResponse::Ok().json(cohort_json(&saved)))
}

async fn delete(
    access: ProjectAccess<CohortWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let mut record = existing(&state, project, &path.1).await?;
    record.deleted = true;
    state
        .flags_op(move |f| f.save_cohort(project, record))
        .await?;
    Ok(HttpResponse::NoContent().finish())
}
