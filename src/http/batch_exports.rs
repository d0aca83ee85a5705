//! PostHog's scheduled batch exports (`…/batch_exports/`): the exports (create, list, read,
//! PATCH, DELETE), pause and unpause, backfills (and the deprecated `backfill/` alias), runs,
//! a run's retry and cancel. Secret keys are never in an answer.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use corvid_lifecycle::{Backfill, BatchExportError, BatchExportRun, ExportView};
use serde_json::{json, Value};
use uuid::Uuid;

use super::project_route;
use crate::auth::scope::{BatchExportRead, BatchExportWrite};
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

const BASE: &str = "/batch_exports";

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, BASE, || web::get().to(list));
    project_route(cfg, BASE, || web::post().to(create));
    let one = format!("{BASE}/{{id}}");
    project_route(cfg, &one, || web::get().to(read));
    project_route(cfg, &one, || web::patch().to(update));
    project_route(cfg, &one, || web::delete().to(delete));
    project_route(cfg, &format!("{one}/pause"), || web::post().to(pause));
    project_route(cfg, &format!("{one}/unpause"), || web::post().to(unpause));
    project_route(cfg, &format!("{one}/backfills"), || {
        web::post().to(backfill)
    });
    project_route(cfg, &format!("{one}/backfill"), || web::post().to(backfill));
    project_route(cfg, &format!("{one}/backfills"), || {
        web::get().to(backfills)
    });
    project_route(cfg, &format!("{one}/backfills/{{backfill}}"), || {
        web::get().to(backfill_read)
    });
    project_route(cfg, &format!("{one}/backfills/{{backfill}}/cancel"), || {
        web::post().to(backfill_cancel)
    });
    project_route(cfg, &format!("{one}/runs"), || web::get().to(runs));
    project_route(cfg, &format!("{one}/runs/{{run}}"), || web::get().to(run));
    project_route(cfg, &format!("{one}/runs/{{run}}/retry"), || {
        web::post().to(retry)
    });
    project_route(cfg, &format!("{one}/runs/{{run}}/cancel"), || {
        web::post().to(cancel)
    });
}

impl From<BatchExportError> for ApiError {
    fn from(e: BatchExportError) -> ApiError {
        match e {
            BatchExportError::Invalid(invalid) => {
                ApiError::validation(invalid.detail, invalid.attr)
            }
            BatchExportError::NotFound(what) => ApiError::not_found(what),
            BatchExportError::Store(e) => ApiError::Store(e),
        }
    }
}

fn uuid(text: &str, what: &'static str) -> Result<Uuid, ApiError> {
    Uuid::try_parse(text).map_err(|_| ApiError::not_found(what))
}

fn export_id(path: &(String, String)) -> Result<Uuid, ApiError> {
    uuid(&path.1, "Batch export")
}

fn export_json(view: &ExportView) -> Value {
    let mut shown = view.export.to_json();
    shown["latest_runs"] = view
        .latest_runs
        .iter()
        .map(BatchExportRun::to_json)
        .collect();
    shown
}

fn backfill_json(backfill: &Backfill, runs: &[BatchExportRun]) -> Value {
    backfill.to_json(&runs.iter().collect::<Vec<_>>())
}

fn batch(state: &AppState) -> &corvid_lifecycle::BatchExports {
    &state.engine.batch_exports
}

async fn list(
    req: actix_web::HttpRequest,
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    params: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let views = batch(&state).list(access.project.id).await?;
    super::paged(
        &req,
        &state,
        &params,
        views.iter().map(export_json).collect(),
    )
}

async fn create(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let view = batch(&state).create(access.project.id, &body.0).await?;
    Ok(HttpResponse::Created().json(export_json(&view)))
}

async fn read(
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let view = batch(&state)
        .get(access.project.id, export_id(&path)?)
        .await?;
    Ok(HttpResponse::Ok().json(export_json(&view)))
}

async fn update(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let view = batch(&state)
        .update(access.project.id, export_id(&path)?, &body.0)
        .await?;
    Ok(HttpResponse::Ok().json(export_json(&view)))
}

async fn delete(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    batch(&state)
        .delete(access.project.id, export_id(&path)?)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn pause(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    batch(&state)
        .pause(access.project.id, export_id(&path)?)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"paused": true})))
}

/// `{"backfill": true}` runs the intervals missed while paused.
async fn unpause(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let backfill = crate::body::optional_json(&body)?
        .get("backfill")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    batch(&state)
        .unpause(access.project.id, export_id(&path)?, backfill)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"paused": false})))
}

async fn backfill(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let body = crate::body::optional_json(&body)?;
    let backfill = batch(&state)
        .backfill(access.project.id, export_id(&path)?, &body)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"backfill_id": backfill.id})))
}

async fn backfills(
    req: actix_web::HttpRequest,
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    params: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let all = batch(&state)
        .backfills(access.project.id, export_id(&path)?)
        .await?;
    let rows = all.iter().map(|(b, runs)| backfill_json(b, runs)).collect();
    super::paged(&req, &state, &params, rows)
}

async fn backfill_read(
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid(&path.1, "Batch export")?;
    let (backfill, runs) = batch(&state)
        .backfill_get(access.project.id, id, uuid(&path.2, "Backfill")?)
        .await?;
    Ok(HttpResponse::Ok().json(backfill_json(&backfill, &runs)))
}

async fn backfill_cancel(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid(&path.1, "Batch export")?;
    batch(&state)
        .cancel_backfill(access.project.id, id, uuid(&path.2, "Backfill")?)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"cancelled": true})))
}

fn time_param(
    params: &HashMap<String, String>,
    name: &'static str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    params
        .get(name)
        .map(|text| {
            corvid_kernel::parse_timestamp(text).ok_or_else(|| {
                ApiError::validation(format!("{name} must be an ISO 8601 date-time"), Some(name))
            })
        })
        .transpose()
}

/// Runs created in the last 7 days unless `after`/`before` say otherwise, newest first.
async fn runs(
    req: actix_web::HttpRequest,
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    params: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let after = time_param(&params, "after")?
        .or_else(|| Some(chrono::Utc::now() - chrono::Duration::days(7)));
    let before = time_param(&params, "before")?;
    let runs = batch(&state)
        .runs(access.project.id, export_id(&path)?, after, before)
        .await?;
    super::paged(
        &req,
        &state,
        &params,
        runs.iter().map(BatchExportRun::to_json).collect(),
    )
}

async fn run(
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid(&path.1, "Batch export")?;
    let run = batch(&state)
        .run(access.project.id, id, uuid(&path.2, "Batch export run")?)
        .await?;
    Ok(HttpResponse::Ok().json(run.to_json()))
}

async fn retry(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid(&path.1, "Batch export")?;
    let backfill = batch(&state)
        .retry(access.project.id, id, uuid(&path.2, "Batch export run")?)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"backfill_id": backfill.id})))
}

async fn cancel(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid(&path.1, "Batch export")?;
    batch(&state)
        .cancel_run(access.project.id, id, uuid(&path.2, "Batch export run")?)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"cancelled": true})))
}
