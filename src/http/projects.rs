//! `/api/projects/` and `/api/environments/{id}/` (PostHog's names for the same thing).

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use corvid_tenancy::{NewProject, Project, ProjectSettings, ProjectUpdate};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::scope::{ProjectRead, ProjectWrite};
use crate::auth::{Authed, ProjectAccess};
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/projects", web::get().to(list))
        .route("/api/projects", web::post().to(create))
        .route("/api/projects/{project_id}", web::get().to(get))
        .route("/api/environments/{project_id}", web::get().to(get))
        .route("/api/projects/{project_id}", web::patch().to(update))
        .route("/api/environments/{project_id}", web::patch().to(update))
        .route(
            "/api/projects/{project_id}/reset_token",
            web::patch().to(reset_token),
        )
        .route(
            "/api/environments/{project_id}/reset_token",
            web::patch().to(reset_token),
        );
}

/// A project as the API shows it (PostHog's field names).
#[derive(Serialize)]
pub struct ProjectView {
    id: u64,
    uuid: Uuid,
    organization: Uuid,
    name: String,
    api_token: String,
    timezone: String,
    anonymize_ips: bool,
    created_at: DateTime<Utc>,
    /// Days of events kept (`null`: the instance's default, `lifecycle.event_retention_days`).
    event_retention_days: Option<u32>,
    #[serde(flatten)]
    settings: ProjectSettings,
}

impl From<&Project> for ProjectView {
    fn from(p: &Project) -> Self {
        ProjectView {
            id: p.id,
            uuid: p.uuid,
            organization: p.organization_id,
            name: p.name.clone(),
            api_token: p.api_token.clone(),
            timezone: p.timezone.clone(),
            anonymize_ips: p.anonymize_ips,
            created_at: p.created_at,
            event_retention_days: p.event_retention_days,
            settings: p.settings.clone(),
        }
    }
}

#[derive(Serialize)]
struct Page<T> {
    count: usize,
    next: Option<String>,
    previous: Option<String>,
    results: Vec<T>,
}

async fn list(
    auth: Authed<ProjectRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let org = auth.credential.user.organization_id;
    let projects = state.engine.tenancy.projects_of_organization(org).await?;
    let results: Vec<ProjectView> = projects
        .iter()
        .filter(|p| auth.credential.allows_project(p))
        .map(ProjectView::from)
        .collect();
    Ok(HttpResponse::Ok().json(Page {
        count: results.len(),
        next: None,
        previous: None,
        results,
    }))
}

async fn get(access: ProjectAccess<ProjectRead>) -> HttpResponse {
    HttpResponse::Ok().json(ProjectView::from(access.project.as_ref()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateProject {
    name: String,
    #[serde(default = "utc")]
    timezone: String,
    #[serde(default)]
    anonymize_ips: bool,
}

fn utc() -> String {
    "UTC".into()
}

async fn create(
    auth: Authed<ProjectWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<CreateProject>,
) -> Result<HttpResponse, ApiError> {
    if auth.credential.scoped_teams.is_some() {
        return Err(ApiError::PermissionDenied {
            detail: "An API key limited to specific projects cannot create projects.".into(),
        });
    }
    let new = NewProject {
        organization_id: auth.credential.user.organization_id,
        name: body.name,
        timezone: body.timezone,
        anonymize_ips: body.anonymize_ips,
    };
    let project = state.engine.tenancy.create_project(new).await?;
    Ok(HttpResponse::Created().json(ProjectView::from(&project)))
}

/// `PATCH /api/projects/{id}/reset_token/`: a new project token; the old one is refused at
/// once (capture, `/flags`, remote config). Answers the project with its new `api_token`.
async fn reset_token(
    access: ProjectAccess<ProjectWrite>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let project = state
        .engine
        .tenancy
        .rotate_project_token(access.project.id, &crate::auth::actor(&access.credential))
        .await?;
    tracing::info!(project = project.id, "project token rotated");
    Ok(HttpResponse::Ok().json(ProjectView::from(&project)))
}

/// `PATCH /api/projects/{id}/`: name, timezone, IP anonymization and the SDK settings that
/// remote config serves.
async fn update(
    access: ProjectAccess<ProjectWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<ProjectUpdate>,
) -> Result<HttpResponse, ApiError> {
    let id = access.project.id;
    let actor = crate::auth::actor(&access.credential);
    let project = state
        .engine
        .tenancy
        .update_project(id, &actor, body)
        .await?;
    Ok(HttpResponse::Ok().json(ProjectView::from(&project)))
}
