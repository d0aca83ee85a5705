//! `/api/organizations/@current/` (and by id): the caller's organization, including the
//! monthly feature-flag request quota that administrators set.

use actix_web::{web, HttpResponse};
use corvid_tenancy::{Organization, OrganizationUpdate};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::scope::{OrganizationRead, OrganizationWrite};
use crate::auth::{Authed, Staff};
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
        .engine
        .tenancy
        .organization(user_org)
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
    auth: Staff<OrganizationWrite>,
    state: web::Data<AppState>,
    org: web::Path<String>,
    ValidJson(body): ValidJson<OrgBody>,
) -> Result<HttpResponse, ApiError> {
    let org = own(&state, auth.credential.user.organization_id, &org).await?;
    let update = OrganizationUpdate {
        name: body.name,
        feature_flag_request_quota: body.feature_flag_request_quota,
    };
    let org = state
        .engine
        .tenancy
        .update_organization(org.id, update)
        .await?;
    Ok(HttpResponse::Ok().json(org_json(&org)))
}
