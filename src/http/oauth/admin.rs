//! Admin API for the "verified application" mark (staff users only): a verified client_id
//! loses the unverified-application notice on the consent screen, nothing else.

use std::sync::Arc;

use actix_web::{web, HttpResponse};
use chrono::Utc;
use corvid_actors::oauth::client_id;
use corvid_actors::oauth::store::VerifiedClient;
use serde::Deserialize;

use crate::auth::scope::{OrganizationRead, OrganizationWrite};
use crate::auth::Authed;
use crate::error::ApiError;
use crate::state::AppState;

fn require_staff(is_staff: bool) -> Result<(), ApiError> {
    if is_staff {
        Ok(())
    } else {
        Err(ApiError::PermissionDenied {
            detail: "Only instance staff can manage verified OAuth applications.".into(),
        })
    }
}

#[derive(Deserialize)]
pub struct ClientIdBody {
    client_id: String,
}

pub async fn list(
    auth: Authed<OrganizationRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_staff(auth.credential.user.is_staff)?;
    let oauth = Arc::clone(&state.oauth);
    let clients = web::block(move || oauth.store.verified_clients()).await??;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "results": clients })))
}

pub async fn verify(
    auth: Authed<OrganizationWrite>,
    state: web::Data<AppState>,
    body: web::Json<ClientIdBody>,
) -> Result<HttpResponse, ApiError> {
    require_staff(auth.credential.user.is_staff)?;
    client_id::validate(&body.client_id).map_err(|e| ApiError::validation(e, Some("client_id")))?;
    let record = VerifiedClient {
        client_id: body.client_id.clone(),
        verified_by: auth.credential.user.id,
        verified_at: Utc::now(),
    };
    let oauth = Arc::clone(&state.oauth);
    let stored = record.clone();
    web::block(move || oauth.store.set_verified(&stored)).await??;
    Ok(HttpResponse::Created().json(record))
}

pub async fn unverify(
    auth: Authed<OrganizationWrite>,
    state: web::Data<AppState>,
    body: web::Json<ClientIdBody>,
) -> Result<HttpResponse, ApiError> {
    require_staff(auth.credential.user.is_staff)?;
    let oauth = Arc::clone(&state.oauth);
    let id = body.client_id.clone();
    if web::block(move || oauth.store.unset_verified(&id)).await?? {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(ApiError::not_found("Verified application"))
    }
}
