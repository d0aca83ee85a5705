//! Admin API for the "verified application" mark (staff users only): a verified client_id
//! loses the unverified-application notice on the consent screen, nothing else.

use actix_web::{web, HttpResponse};
use chrono::Utc;
use corvid_oauth::OAuthError;
use serde::Deserialize;

use crate::auth::scope::{OrganizationRead, OrganizationWrite};
use crate::auth::Staff;
use crate::error::ApiError;
use crate::state::AppState;

#[derive(Deserialize)]
pub struct ClientIdBody {
    client_id: String,
}

pub async fn list(
    _staff: Staff<OrganizationRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let clients = state.engine.oauth.verified_clients().await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "results": clients })))
}

pub async fn verify(
    auth: Staff<OrganizationWrite>,
    state: web::Data<AppState>,
    body: web::Json<ClientIdBody>,
) -> Result<HttpResponse, ApiError> {
    let record = state
        .engine
        .oauth
        .verify_client(
            &body.client_id,
            &crate::auth::actor(&auth.credential),
            Utc::now(),
        )
        .await
        .map_err(|e| match e {
            OAuthError::InvalidRequest(detail) => ApiError::validation(detail, Some("client_id")),
            other => other.into(),
        })?;
    Ok(HttpResponse::Created().json(record))
}

pub async fn unverify(
    auth: Staff<OrganizationWrite>,
    state: web::Data<AppState>,
    body: web::Json<ClientIdBody>,
) -> Result<HttpResponse, ApiError> {
    let actor = crate::auth::actor(&auth.credential);
    if state
        .engine
        .oauth
        .unverify_client(&body.client_id, &actor)
        .await?
    {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(ApiError::not_found("Verified application"))
    }
}
