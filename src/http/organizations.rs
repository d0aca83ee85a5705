//! `/api/organizations/@current/` (and by id): the caller's organization, including the
//! monthly feature-flag request quota that administrators set.

use actix_web::{web, HttpResponse};
use corvid_actors::meta::Organization;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::scope::{OrganizationRead, OrganizationWrite};
use crate::auth::Authed;
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/organizations/{org}", web::get().to(get))
        .route("/api/organizations/{org}", web::patch().to(update));
}

fn org_json(o: &Organization) -> Value {
    json!({"id": o.id, "name": o.name, "created_at": o.created_at, "feature_flag_request_quota": o.feature_flag_request_quota})
}

async fn own(state: &AppState, user_org: uuid::Uuid, raw: &str) -> Result<Organization, ApiError> {
    if raw != "@current" && raw.parse::<uuid::Uuid>().ok() != Some(user_org) {
        return Err(ApiError::not_found("Organization"));
    }
    state
        .meta(move |m| m.organization(user_org))
        .await?
        .ok_or_else(|| ApiError::not_found("Organization"))
}

async fn get(
    auth: Authed<OrganizationRead>,
    state: web::Data<AppState>,
    org: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let org = own(&state, auth.credential.user.organization_id, &org).await?;
    Ok(HttpResponse::Ok().json(org_json(&org)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OrgBody {
    name: Option<String>,
    /// `null` removes the quota.
    #[serde(default, deserialize_with = "present")]
    feature_flag_request_quota: Option<Option<u64>>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Ok(Some(Option::<u64>::deserialize(d)?))
}

async fn update(
    auth: Authed<OrganizationWrite>,
    state: web::Data<AppState>,
    org: web::Path<String>,
    ValidJson(body): ValidJson<OrgBody>,
) -> Result<HttpResponse, ApiError> {
    if !auth.credential.user.is_staff {
        return Err(ApiError::PermissionDenied {
            detail: "Only administrators may change the organization.".into(),
        });
    }
    let mut org = own(&state, auth.credential.user.organization_id, &org).await?;
    if let Some(name) = body.name {
        if name.trim().is_empty() {
            return Err(ApiError::validation("name must not be empty", Some("name")));
        }
        org.name = name;
    }
    if let Some(quota) = body.feature_flag_request_quota {
        org.feature_flag_request_quota = quota;
    }
    let saved = org.clone();
    state.meta(move |m| m.update_organization(&saved)).await?;
    state
        .cache
        .put_org_quota(org.id, org.feature_flag_request_quota);
    Ok(HttpResponse::Ok().json(org_json(&org)))
}
