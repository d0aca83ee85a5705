//! `/api/users/@me/`: who the credential belongs to.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::auth::scope::UserRead;
use crate::auth::Authed;
use crate::error::ApiError;
use crate::http::projects::ProjectView;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/users/@me", web::get().to(me));
}

async fn me(auth: Authed<UserRead>, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let user = auth.credential.user.clone();
    let org_id = user.organization_id;
    let tenancy = &state.engine.tenancy;
    let organization = tenancy.organization(org_id).await?;
    let projects = tenancy.projects_of_organization(org_id).await?;
    let organization = organization.ok_or_else(|| ApiError::not_found("Organization"))?;
    let team = projects
        .iter()
        .filter(|p| auth.credential.allows_project(p))
        .min_by_key(|p| p.id)
        .map(ProjectView::from);
    Ok(HttpResponse::Ok().json(json!({
        "id": user.id,
        "uuid": user.uuid,
        "email": user.email,
        "first_name": user.first_name,
        "is_staff": user.is_staff,
        "date_joined": user.created_at,
        "organization": {"id": organization.id, "name": organization.name},
        "organizations": [{"id": organization.id, "name": organization.name}],
        "team": team,
    })))
}
