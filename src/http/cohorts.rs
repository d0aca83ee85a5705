//! `/api/projects/{id}/cohorts/`: property cohorts (AND/OR groups, nested cohorts) and static
//! cohorts (distinct ids given as JSON, or as CSV with `Content-Type: text/csv`).

use std::collections::HashMap;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use corvid_flags::CohortChanges;
use corvid_flags::CohortRecord;
use serde_json::{json, Value};

use super::project_route;
use crate::auth::scope::{CohortRead, CohortWrite};
use crate::auth::{actor, ProjectAccess};
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

fn cohort_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found("Cohort"))
}

/// JSON, or static members as CSV (`Content-Type: text/csv`, name in `?name=`).
async fn changes(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<CohortChanges, ApiError> {
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
    let query = web::Query::<HashMap<String, String>>::from_query(req.query_string()).ok();
    Ok(CohortChanges::from_csv(
        &bytes,
        query.and_then(|q| q.get("name").cloned()),
    )?)
}

async fn list(
    access: ProjectAccess<CohortRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let cohorts = state.engine.flags.list_cohorts(access.project.id).await?;
    let results: Vec<Value> = cohorts.iter().map(cohort_json).collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn create(
    req: HttpRequest,
    payload: web::Payload,
    access: ProjectAccess<CohortWrite>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let changes = changes(&req, payload, &state).await?;
    let saved = state
        .engine
        .flags
        .create_cohort(access.project.id, &actor(&access.credential), changes)
        .await?;
    Ok(HttpResponse::Created().json(cohort_json(&saved)))
}

async fn get(
    access: ProjectAccess<CohortRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let cohort = state
        .engine
        .flags
        .cohort(access.project.id, cohort_id(&path.1)?)
        .await?;
    Ok(HttpResponse::Ok().json(cohort_json(&cohort)))
}

async fn update(
    req: HttpRequest,
    payload: web::Payload,
    access: ProjectAccess<CohortWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = cohort_id(&path.1)?;
    let changes = changes(&req, payload, &state).await?;
    let saved = state
        .engine
        .flags
        .update_cohort(access.project.id, id, &actor(&access.credential), changes)
        .await?;
    Ok(HttpResponse::Ok().json(cohort_json(&saved)))
}

async fn delete(
    access: ProjectAccess<CohortWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    state
        .engine
        .flags
        .delete_cohort(
            access.project.id,
            cohort_id(&path.1)?,
            &actor(&access.credential),
        )
        .await?;
    Ok(HttpResponse::NoContent().finish())
}
