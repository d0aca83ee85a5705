//! Experiments (`/api/projects/{id}/experiments/`: CRUD without hard delete, lifecycle actions,
//! results) and holdouts (`/api/projects/{id}/experiment_holdouts/`).

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_surfaces::experiments::{Action, ExperimentChanges, HoldoutChanges, ListFilter, Status};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{id_path, project_route, user_summary};
use crate::auth::scope::{ExperimentRead, ExperimentWrite};
use crate::auth::{actor, ProjectAccess};
use crate::body::{parse_json, read_body, ValidJson};
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/experiments", || web::get().to(list));
    project_route(cfg, "/experiments", || web::post().to(create));
    project_route(cfg, "/experiments/{id}", || web::get().to(get));
    project_route(cfg, "/experiments/{id}", || web::patch().to(update));
    project_route(cfg, "/experiments/{id}", || web::put().to(update));
    project_route(cfg, "/experiments/{id}", || {
        web::delete().to(no_hard_delete)
    });
    project_route(cfg, "/experiments/{id}/results", || web::get().to(results));
    for action in [
        "launch",
        "pause",
        "resume",
        "end",
        "ship_variant",
        "archive",
        "unarchive",
    ] {
        project_route(cfg, &format!("/experiments/{{id}}/{action}"), move || {
            web::post().to(move |req, access, state, path, payload| {
                act(req, access, state, path, payload, action)
            })
        });
    }
    project_route(cfg, "/experiment_holdouts", || web::get().to(list_holdouts));
    project_route(cfg, "/experiment_holdouts", || {
        web::post().to(create_holdout)
    });
    project_route(cfg, "/experiment_holdouts/{id}", || {
        web::get().to(get_holdout)
    });
    project_route(cfg, "/experiment_holdouts/{id}", || {
        web::patch().to(update_holdout)
    });
    project_route(cfg, "/experiment_holdouts/{id}", || {
        web::put().to(update_holdout)
    });
    project_route(cfg, "/experiment_holdouts/{id}", || {
        web::delete().to(delete_holdout)
    });
}

fn page(results: Vec<Value>) -> HttpResponse {
    HttpResponse::Ok().json(
        json!({"count": results.len(), "next": null, "previous": null,
                                   "results": results}),
    )
}

/// `?status=&archived=&feature_flag_id=&search=` (`order` is accepted; newest first).
fn list_filter(req: &HttpRequest) -> Result<ListFilter, ApiError> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    let mut filter = ListFilter::default();
    for (k, v) in pairs {
        match k.as_str() {
            "status" => {
                filter.status =
                    Status::parse_filter(&v).map_err(|e| ApiError::validation(e, Some("status")))?
            }
            "archived" => {
                filter.archived = match v.as_str() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => {
                        return Err(ApiError::validation(
                            "archived must be true or false.",
                            Some("archived"),
                        ))
                    }
                }
            }
            "feature_flag_id" => {
                filter.feature_flag_id = Some(v.parse().map_err(|_| {
                    ApiError::validation(
                        "feature_flag_id must be an integer.",
                        Some("feature_flag_id"),
                    )
                })?)
            }
            "search" if !v.is_empty() => filter.search = Some(v),
            _ => {}
        }
    }
    Ok(filter)
}

async fn list(
    req: HttpRequest,
    access: ProjectAccess<ExperimentRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let filter = list_filter(&req)?;
    let list = state
        .engine
        .experiments
        .list(access.project.id, filter)
        .await?;
    Ok(page(list.iter().map(|e| e.to_json()).collect()))
}

async fn create(
    access: ProjectAccess<ExperimentWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<ExperimentChanges>,
) -> Result<HttpResponse, ApiError> {
    let creator = Some(user_summary(&access.credential.user));
    let view = state
        .engine
        .experiments
        .create(access.project.id, &actor(&access.credential), body, creator)
        .await?;
    Ok(HttpResponse::Created().json(view.to_json()))
}

async fn get(
    access: ProjectAccess<ExperimentRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = id_path(&path.1, "Experiment")?;
    let view = state.engine.experiments.get(access.project.id, id).await?;
    Ok(HttpResponse::Ok().json(view.to_json()))
}

async fn update(
    access: ProjectAccess<ExperimentWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<ExperimentChanges>,
) -> Result<HttpResponse, ApiError> {
    let id = id_path(&path.1, "Experiment")?;
    let view = state
        .engine
        .experiments
        .update(access.project.id, &actor(&access.credential), id, body)
        .await?;
    Ok(HttpResponse::Ok().json(view.to_json()))
}

async fn no_hard_delete(_access: ProjectAccess<ExperimentWrite>) -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed {
        detail: "Experiments cannot be hard deleted: archive the experiment, or PATCH it with \"deleted\": true.",
    })
}

/// The optional body of an action.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    conclusion: Option<String>,
    conclusion_comment: Option<String>,
    variant_key: Option<String>,
    release_to_everyone: Option<bool>,
}

async fn act(
    req: HttpRequest,
    access: ProjectAccess<ExperimentWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    action: &'static str,
) -> Result<HttpResponse, ApiError> {
    let id = id_path(&path.1, "Experiment")?;
    let raw = read_body(
        &req,
        payload.into_inner(),
        state.config.limits.max_body_bytes,
    )
    .await?;
    let body: ActionBody = if raw.iter().all(u8::is_ascii_whitespace) {
        ActionBody::default()
    } else {
        parse_json(&raw)?
    };
    let action = match action {
        "launch" => Action::Launch,
        "pause" => Action::Pause,
        "resume" => Action::Resume,
        "end" => Action::End {
            conclusion: body.conclusion,
            comment: body.conclusion_comment,
        },
        "ship_variant" => Action::ShipVariant {
            variant: body.variant_key.ok_or_else(|| {
                ApiError::validation("variant_key is required.", Some("variant_key"))
            })?,
            release_to_everyone: body.release_to_everyone.unwrap_or(false),
            conclusion: body.conclusion,
            comment: body.conclusion_comment,
        },
        "archive" => Action::Archive,
        _ => Action::Unarchive,
    };
    let view = state
        .engine
        .experiments
        .act(
            access.project.id,
            &actor(&access.credential),
            id,
            action,
            Utc::now(),
        )
        .await?;
    Ok(HttpResponse::Ok().json(view.to_json()))
}

/// `GET …/experiments/{id}/results/`: exposures per variant and each metric compared with
/// control (Bayesian; see `docs/ARCHITECTURE.md`).
async fn results(
    access: ProjectAccess<ExperimentRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = id_path(&path.1, "Experiment")?;
    let results = state
        .engine
        .experiments
        .results(access.project.id, id, Utc::now())
        .await?;
    Ok(HttpResponse::Ok().json(results))
}

async fn list_holdouts(
    access: ProjectAccess<ExperimentRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let list = state.engine.experiments.holdouts(access.project.id).await?;
    Ok(page(list.iter().map(|h| h.to_json()).collect()))
}

async fn create_holdout(
    access: ProjectAccess<ExperimentWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<HoldoutChanges>,
) -> Result<HttpResponse, ApiError> {
    let holdout = state
        .engine
        .experiments
        .create_holdout(access.project.id, &actor(&access.credential), body)
        .await?;
    Ok(HttpResponse::Created().json(holdout.to_json()))
}

async fn get_holdout(
    access: ProjectAccess<ExperimentRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = id_path(&path.1, "Holdout")?;
    let holdout = state
        .engine
        .experiments
        .holdout(access.project.id, id)
        .await?;
    Ok(HttpResponse::Ok().json(holdout.to_json()))
}

async fn update_holdout(
    access: ProjectAccess<ExperimentWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<HoldoutChanges>,
) -> Result<HttpResponse, ApiError> {
    let id = id_path(&path.1, "Holdout")?;
    let holdout = state
        .engine
        .experiments
        .update_holdout(access.project.id, &actor(&access.credential), id, body)
        .await?;
    Ok(HttpResponse::Ok().json(holdout.to_json()))
}

async fn delete_holdout(
    access: ProjectAccess<ExperimentWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = id_path(&path.1, "Holdout")?;
    state
        .engine
        .experiments
        .delete_holdout(access.project.id, &actor(&access.credential), id)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}
