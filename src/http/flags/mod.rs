//! Feature flags: definitions (`/api/projects/{id}/feature_flags/`), evaluation (`/flags`,
//! `/decide`: [`evaluate`]) and definitions for SDK local evaluation ([`local_eval`]).

mod evaluate;
mod local_eval;
mod shapes;
mod v2;

use actix_web::http::Method;
use actix_web::middleware::from_fn;
use actix_web::{web, HttpResponse};
use corvid_flags::FlagChanges;
use corvid_flags::FlagRecord;
use serde_json::{json, Value};

use super::{cors, project_route};
use crate::auth::scope::{FeatureFlagRead, FeatureFlagWrite};
use crate::auth::{actor, ProjectAccess};
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/feature_flags", || web::get().to(list));
    project_route(cfg, "/feature_flags", || web::post().to(create));
    project_route(cfg, "/feature_flags/{flag_id}", || web::get().to(get));
    project_route(cfg, "/feature_flags/{flag_id}", || web::patch().to(update));
    project_route(cfg, "/feature_flags/{flag_id}", || web::delete().to(delete));
    project_route(cfg, "/feature_flags/{flag_id}/revert", || {
        web::post().to(revert)
    });
}

/// The public evaluation and definitions routes (static paths; registered first, see
/// [`super::configure`]).
pub fn configure_public(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/flags")
            .wrap(from_fn(cors::public))
            .route(web::post().to(evaluate::flags))
            .route(web::get().to(evaluate::flags_get))
            .route(web::head().to(evaluate::flags_head))
            .route(web::method(Method::OPTIONS).to(cors::preflight))
            .default_service(web::to(evaluate::not_allowed)),
    )
    .service(
        web::resource("/decide")
            .wrap(from_fn(cors::public))
            .route(web::post().to(evaluate::decide))
            .route(web::get().to(evaluate::flags_get))
            .route(web::head().to(evaluate::flags_head))
            .route(web::method(Method::OPTIONS).to(cors::preflight))
            .default_service(web::to(evaluate::not_allowed)),
    )
    .route("/flags/definitions", web::get().to(local_eval::definitions))
    .route(
        "/api/feature_flag/local_evaluation",
        web::get().to(local_eval::definitions),
    );
}

fn flag_json(r: &FlagRecord) -> Value {
    let d = &r.definition;
    json!({
        "id": d.id,
        "key": d.key,
        "name": d.name,
        "filters": d.filters,
        "active": d.active,
        "deleted": d.deleted,
        "ensure_experience_continuity": d.ensure_experience_continuity,
        "version": d.version,
        "evaluation_runtime": d.evaluation_runtime.as_deref().unwrap_or("all"),
        "evaluation_contexts": d.evaluation_contexts,
        "bucketing_identifier": d.bucketing_identifier,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
    })
}

fn flag_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found("Feature flag"))
}

async fn list(
    access: ProjectAccess<FeatureFlagRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let flags = state.engine.flags.list_flags(access.project.id).await?;
    let results: Vec<Value> = flags.iter().map(flag_json).collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn create(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<FlagChanges>,
) -> Result<HttpResponse, ApiError> {
    let record = state
        .engine
        .flags
        .create_flag(access.project.id, &actor(&access.credential), body)
        .await?;
    Ok(HttpResponse::Created().json(flag_json(&record)))
}

async fn get(
    access: ProjectAccess<FeatureFlagRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let record = state
        .engine
        .flags
        .flag(access.project.id, flag_id(&path.1)?)
        .await?;
    Ok(HttpResponse::Ok().json(flag_json(&record)))
}

async fn update(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<FlagChanges>,
) -> Result<HttpResponse, ApiError> {
    let record = state
        .engine
        .flags
        .update_flag(
            access.project.id,
            flag_id(&path.1)?,
            &actor(&access.credential),
            body,
        )
        .await?;
    Ok(HttpResponse::Ok().json(flag_json(&record)))
}

async fn delete(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    state
        .engine
        .flags
        .delete_flag(
            access.project.id,
            flag_id(&path.1)?,
            &actor(&access.credential),
        )
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// `POST …/feature_flags/{id}/revert/` with an optional `{"activity_log_id": uuid}` (absent:
/// the newest revertible change): the flag goes back to the version before that change, as
/// its next version. Answers the fields that changed back and the flag.
async fn revert(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct RevertBody {
        activity_log_id: Option<uuid::Uuid>,
    }
    let body: RevertBody = if body.iter().all(u8::is_ascii_whitespace) {
        RevertBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::validation(format!("Invalid body: {e}"), None))?
    };
    let reverted = state
        .engine
        .flags
        .revert_flag(
            access.project.id,
            flag_id(&path.1)?,
            &actor(&access.credential),
            body.activity_log_id,
        )
        .await?;
    Ok(HttpResponse::Ok().json(json!({
        "reverted_activity_log_id": reverted.reverted,
        "restored_version": reverted.restored_version,
        "applied_fields": reverted.applied_fields,
        "skipped_fields": [],
        "feature_flag": flag_json(&reverted.flag),
    })))
}
