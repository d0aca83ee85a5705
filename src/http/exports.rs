//! PostHog's file-download exports: `POST …/file_download_batch_exports` (202 `{id}`), a run's
//! status, and its files (`download[/{part}]` redirects to the file, as PostHog redirects to a
//! pre-signed URL).

use actix_web::{web, HttpResponse};
use corvid_lifecycle::{ExportError, ExportRequest, ExportRun, RunStatus};
use serde_json::{json, Value};
use uuid::Uuid;

use super::project_route;
use crate::auth::scope::{BatchExportRead, BatchExportWrite};
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

const BASE: &str = "/file_download_batch_exports";

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, BASE, || web::post().to(create));
    project_route(cfg, &format!("{BASE}/{{run_id}}"), || web::get().to(status));
    project_route(cfg, &format!("{BASE}/{{run_id}}/download"), || {
        web::get().to(download_first)
    });
    project_route(cfg, &format!("{BASE}/{{run_id}}/download/{{part}}"), || {
        web::get().to(download)
    });
    project_route(cfg, &format!("{BASE}/{{run_id}}/files/{{name}}"), || {
        web::get().to(file)
    });
}

impl From<ExportError> for ApiError {
    fn from(e: ExportError) -> ApiError {
        match e {
            ExportError::Invalid(detail) | ExportError::NotDownloadable(detail) => {
                ApiError::validation(detail, None)
            }
            ExportError::NotFound => ApiError::not_found("Batch export run"),
            ExportError::Busy => ApiError::RateLimited {
                retry_after_secs: 60,
            },
            ExportError::Store(e) => ApiError::Store(e),
        }
    }
}

fn run_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::try_parse(text).map_err(|_| ApiError::not_found("Batch export run"))
}

async fn create(
    access: ProjectAccess<BatchExportWrite>,
    state: web::Data<AppState>,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let request =
        ExportRequest::from_json(&body.0).map_err(|detail| ApiError::validation(detail, None))?;
    let run = state
        .engine
        .exports
        .start(
            access.project.id,
            request,
            Some(access.credential.user.email.clone()),
        )
        .await?;
    Ok(HttpResponse::Accepted().json(json!({"id": run.id})))
}

fn status_json(run: &ExportRun) -> Value {
    match run.status {
        RunStatus::Running => json!({"status": "Running"}),
        RunStatus::Completed => json!({
            "status": "Completed",
            "files": run.files,
            "records_completed": run.records_completed,
            "bytes_exported": run.bytes_exported,
        }),
        RunStatus::Failed => json!({"status": "Failed", "error": run.error}),
    }
}

async fn status(
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = run_id(&path.1)?;
    let run = state
        .engine
        .exports
        .run(access.project.id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("Batch export run"))?;
    Ok(HttpResponse::Ok().json(status_json(&run)))
}

/// 302 to the file `part` names.
async fn redirect(
    req: &actix_web::HttpRequest,
    state: &AppState,
    project: u64,
    id: Uuid,
    part: &str,
) -> Result<HttpResponse, ApiError> {
    let name = state.engine.exports.file_name(project, id, part).await?;
    let prefix = req.path().split(BASE).next().unwrap_or_default();
    let location = format!(
        "{}{prefix}{BASE}/{id}/files/{}",
        state.public_url,
        url::form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>()
    );
    Ok(HttpResponse::Found()
        .insert_header(("Location", location))
        .finish())
}

async fn download_first(
    req: actix_web::HttpRequest,
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    redirect(&req, &state, access.project.id, run_id(&path.1)?, "0").await
}

async fn download(
    req: actix_web::HttpRequest,
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    redirect(&req, &state, access.project.id, run_id(&path.1)?, &path.2).await
}

/// A finished run's file, streamed as it is read (from this node's disk, or from the
/// cluster's bucket).
async fn file(
    access: ProjectAccess<BatchExportRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    use futures_util::TryStreamExt;
    let id = run_id(&path.1)?;
    let found = state
        .engine
        .exports
        .download(access.project.id, id, &path.2)
        .await?;
    let body = found
        .body
        .map_err(actix_web::error::ErrorInternalServerError);
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"{}\"", found.name.replace('"', "")),
        ))
        .no_chunking(found.len)
        .streaming(body))
}
