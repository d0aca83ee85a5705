//! `/api/personal_api_keys/`: list, create (the secret is shown only here), get, delete.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use corvid_tenancy::{NewPersonalApiKey, PersonalApiKey};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::scope::{PersonalApiKeyRead, PersonalApiKeyWrite};
use crate::auth::Authed;
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/personal_api_keys", web::get().to(list))
        .route("/api/personal_api_keys", web::post().to(create))
        .route("/api/personal_api_keys/{key_id}", web::get().to(get))
        .route("/api/personal_api_keys/{key_id}", web::delete().to(delete));
}

#[derive(Serialize)]
struct KeyView {
    id: String,
    label: String,
    /// The secret: present only in the answer to the create call.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    mask_value: String,
    scopes: Vec<String>,
    scoped_teams: Option<Vec<u64>>,
    scoped_organizations: Option<Vec<Uuid>>,
    user_id: u64,
    created_at: DateTime<Utc>,
    last_used_at: Option<DateTime<Utc>>,
}

impl KeyView {
    fn new(key: PersonalApiKey, value: Option<String>) -> KeyView {
        KeyView {
            id: key.id,
            label: key.label,
            value,
            mask_value: key.mask_value,
            scopes: key.scopes,
            scoped_teams: key.scoped_teams,
            scoped_organizations: key.scoped_organizations,
            user_id: key.user_id,
            created_at: key.created_at,
            last_used_at: key.last_used_at,
        }
    }
}

async fn list(
    auth: Authed<PersonalApiKeyRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let user_id = auth.credential.user.id;
    let keys = state
        .engine
        .tenancy
        .personal_api_keys_of_user(user_id)
        .await?;
    let views: Vec<KeyView> = keys.into_iter().map(|k| KeyView::new(k, None)).collect();
    Ok(HttpResponse::Ok().json(views))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    label: String,
    scopes: Vec<String>,
    #[serde(default)]
    scoped_teams: Option<Vec<u64>>,
    #[serde(default)]
    scoped_organizations: Option<Vec<Uuid>>,
}

async fn create(
    auth: Authed<PersonalApiKeyWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<CreateKey>,
) -> Result<HttpResponse, ApiError> {
    state
        .rate_limits
        .key_minting_per_key
        .check(&auth.credential.limit_key())?;
    let new = NewPersonalApiKey {
        user_id: auth.credential.user.id,
        label: body.label,
        scopes: body.scopes,
        scoped_teams: body.scoped_teams.filter(|t| !t.is_empty()),
        scoped_organizations: body.scoped_organizations.filter(|o| !o.is_empty()),
    };
    let (key, secret) = state
        .engine
        .tenancy
        .create_personal_api_key(&auth.credential, new)
        .await?;
    Ok(HttpResponse::Created().json(KeyView::new(key, Some(secret))))
}

/// The caller's own key by id; another user's key is reported as missing.
async fn own_key(
    state: &AppState,
    user_id: u64,
    key_id: String,
) -> Result<PersonalApiKey, ApiError> {
    state
        .engine
        .tenancy
        .personal_api_key(user_id, &key_id)
        .await?
        .ok_or_else(|| ApiError::not_found("Personal API key"))
}

async fn get(
    auth: Authed<PersonalApiKeyRead>,
    state: web::Data<AppState>,
    key_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let key = own_key(&state, auth.credential.user.id, key_id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(KeyView::new(key, None)))
}

async fn delete(
    auth: Authed<PersonalApiKeyWrite>,
    state: web::Data<AppState>,
    key_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let deleted = state
        .engine
        .tenancy
        .delete_personal_api_key(
            auth.credential.user.id,
            &key_id,
            &crate::auth::actor(&auth.credential),
        )
        .await?;
    if !deleted {
        return Err(ApiError::not_found("Personal API key"));
    }
    Ok(HttpResponse::NoContent().finish())
}
