//! Surveys: the admin API (`/api/projects/{id}/surveys/`, statistics under `…/{id}/stats/`)
//! and the public list the browser SDK reads (`/api/surveys/?token=`).

use actix_web::http::Method;
use actix_web::middleware::from_fn;
use actix_web::{web, HttpRequest, HttpResponse};
use corvid_kernel::parse_timestamp;
use corvid_surfaces::surveys::{Period, SurveyChanges};
use serde_json::{json, Value};

use super::{cors, project_route, user_summary, uuid_path};
use crate::auth::scope::{SurveyRead, SurveyWrite};
use crate::auth::{actor, public_project, ProjectAccess};
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/api/surveys")
            .wrap(from_fn(cors::public))
            .route(web::get().to(public))
            .route(web::method(Method::OPTIONS).to(cors::preflight)),
    );
    project_route(cfg, "/surveys", || web::get().to(list));
    project_route(cfg, "/surveys", || web::post().to(create));
    project_route(cfg, "/surveys/{id}", || web::get().to(get));
    project_route(cfg, "/surveys/{id}", || web::patch().to(update));
    project_route(cfg, "/surveys/{id}", || web::put().to(update));
    project_route(cfg, "/surveys/{id}", || web::delete().to(archive));
    project_route(cfg, "/surveys/{id}/stats", || web::get().to(stats));
}

fn query_pairs(req: &HttpRequest) -> Vec<(String, String)> {
    serde_urlencoded::from_str(req.query_string()).unwrap_or_default()
}

fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

async fn list(
    req: HttpRequest,
    access: ProjectAccess<SurveyRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let pairs = query_pairs(&req);
    let archived = match param(&pairs, "archived") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(_) => {
            return Err(ApiError::validation(
                "archived must be true or false.",
                Some("archived"),
            ))
        }
    };
    let surveys = state
        .engine
        .surveys
        .list(access.project.id, archived)
        .await?;
    let results: Vec<Value> = surveys.iter().map(|s| s.admin_json()).collect();
    Ok(HttpResponse::Ok().json(
        json!({"count": results.len(), "next": null, "previous": null,
                                      "results": results}),
    ))
}

async fn create(
    access: ProjectAccess<SurveyWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<SurveyChanges>,
) -> Result<HttpResponse, ApiError> {
    let creator = Some(user_summary(&access.credential.user));
    let view = state
        .engine
        .surveys
        .create(access.project.id, &actor(&access.credential), body, creator)
        .await?;
    Ok(HttpResponse::Created().json(view.admin_json()))
}

async fn get(
    access: ProjectAccess<SurveyRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Survey")?;
    let view = state.engine.surveys.get(access.project.id, id).await?;
    Ok(HttpResponse::Ok().json(view.admin_json()))
}

async fn update(
    access: ProjectAccess<SurveyWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<SurveyChanges>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Survey")?;
    let view = state
        .engine
        .surveys
        .update(access.project.id, &actor(&access.credential), id, body)
        .await?;
    Ok(HttpResponse::Ok().json(view.admin_json()))
}

/// `DELETE`: surveys are archived, not erased (their responses keep meaning).
async fn archive(
    access: ProjectAccess<SurveyWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Survey")?;
    state
        .engine
        .surveys
        .archive(access.project.id, &actor(&access.credential), id)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

fn time_param(
    pairs: &[(String, String)],
    name: &'static str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    param(pairs, name)
        .filter(|v| !v.is_empty())
        .map(|v| {
            parse_timestamp(v).ok_or_else(|| {
                ApiError::validation(
                    format!("{name} must be an ISO 8601 date or date-time."),
                    Some(name),
                )
            })
        })
        .transpose()
}

/// `GET …/surveys/{id}/stats/?date_from&date_to`: shown / dismissed / sent counts, unique
/// people and rates, from the captured survey events.
async fn stats(
    req: HttpRequest,
    access: ProjectAccess<SurveyRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Survey")?;
    let pairs = query_pairs(&req);
    let period = Period {
        from: time_param(&pairs, "date_from")?,
        to: time_param(&pairs, "date_to")?,
    };
    let (survey, stats) = state
        .engine
        .surveys
        .stats(access.project.id, id, period)
        .await?;
    Ok(HttpResponse::Ok().json(json!({
        "survey_id": survey.id,
        "start_date": survey.start_date,
        "end_date": survey.end_date,
        "stats": {
            "survey shown": stats.shown,
            "survey dismissed": stats.dismissed,
            "survey sent": stats.sent,
        },
        "rates": stats.rates(),
    })))
}

/// `GET /api/surveys/?token=…`: the project's non-archived surveys, as posthog-js reads them.
async fn public(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let project = public_project(&state, &req).await?;
    let surveys = state.engine.surveys.public(project.id).await?;
    Ok(HttpResponse::Ok().json(json!({"surveys": surveys, "survey_config": null})))
}
