use std::marker::PhantomData;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};
use chrono::Utc;
use corvid_actors::kernel::secrets;
use corvid_actors::meta::{Credential, CredentialSource, Scope};
use corvid_actors::oauth::store::TokenKind;
use corvid_actors::oauth::ACCESS_TOKEN_PREFIX;
use futures_util::future::LocalBoxFuture;

use super::scope::RequiredScope;
use crate::error::ApiError;
use crate::state::AppState;

/// A verified bearer credential that holds scope `S`.
pub struct Authed<S: RequiredScope> {
    pub credential: Arc<Credential>,
    _scope: PhantomData<S>,
}

impl<S: RequiredScope> FromRequest for Authed<S> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let state = app_state(&req)?;
            let credential = authenticate(&req, &state).await?;
            require_scope(&state, &credential, S::SCOPE)?;
            Ok(Authed {
                credential,
                _scope: PhantomData,
            })
        })
    }
}

pub(super) fn app_state(req: &HttpRequest) -> Result<web::Data<AppState>, ApiError> {
    req.app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("AppState is not registered")))
}

fn unauthenticated(state: &AppState, detail: &'static str, code: &'static str) -> ApiError {
    ApiError::Unauthenticated {
        detail,
        code,
        resource_metadata: Arc::clone(&state.resource_metadata_url),
    }
}

/// Resolves the `Authorization: Bearer …` header to a credential (cache first, then sled).
async fn authenticate(req: &HttpRequest, state: &AppState) -> Result<Arc<Credential>, ApiError> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Err(unauthenticated(
            state,
            "Authentication credentials were not provided.",
            "not_authenticated",
        ));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(unauthenticated(
            state,
            "Authorization header must be `Bearer <token>`.",
            "authentication_failed",
        ));
    };
    let oauth = token.starts_with(ACCESS_TOKEN_PREFIX);
    if !oauth && !token.starts_with(secrets::PERSONAL_API_KEY_PREFIX) {
        return Err(unauthenticated(
            state,
            "Invalid or expired access token.",
            "authentication_failed",
        ));
    }
    let hash = secrets::sha256_hex(token);
    let cached = state.cache.credential(&hash).filter(|c| {
        let family_revoked = matches!(&c.source,
            CredentialSource::OAuthAccessToken { family_id, .. } if state.oauth.family_revoked(family_id));
        let live = !c.expired(Utc::now()) && !family_revoked;
        if !live {
            state.cache.forget_credential(&hash);
        }
        live
    });
    let credential = match cached {
        Some(credential) => credential,
        None => {
            let lookup = hash.clone();
            let found = if oauth {
                access_token_credential(state, lookup).await?
            } else {
                state
                    .meta(move |store| store.credential_for_key_hash(&lookup))
                    .await?
            };
            let Some(credential) = found else {
                return Err(unauthenticated(
                    state,
                    if oauth {
                        "Invalid or expired access token."
                    } else {
                        "Personal API key is invalid."
                    },
                    "authentication_failed",
                ));
            };
            let credential = Arc::new(credential);
            state.cache.put_credential(hash, Arc::clone(&credential));
            credential
        }
    };
    note_use(state, &credential);
    Ok(credential)
}

/// The credential of an active OAuth access token, read from sled on the blocking pool.
async fn access_token_credential(
    state: &AppState,
    hash: String,
) -> Result<Option<Credential>, ApiError> {
    let oauth = Arc::clone(&state.oauth);
    state
        .meta(move |meta| {
            let Some(found) = oauth.store.token(&hash)? else {
                return Ok(None);
            };
            if found.token.kind != TokenKind::Access || !found.is_active(Utc::now()) {
                return Ok(None);
            }
            let Some(user) = meta.user(found.token.user_id)? else {
                return Ok(None);
            };
            Ok(found.token.credential(hash, user))
        })
        .await
}

/// Updates `last_used_at` off the request path, at most once per configured resolution.
fn note_use(state: &AppState, credential: &Arc<Credential>) {
    let CredentialSource::PersonalApiKey {
        id,
        sha256_hex,
        last_used_at,
    } = &credential.source
    else {
        return;
    };
    let resolution = chrono::Duration::from_std(state.config.auth.last_used_resolution)
        .unwrap_or(chrono::Duration::hours(1));
    let stale = last_used_at.is_none_or(|at| Utc::now() - at >= resolution);
    if !stale {
        return;
    }
    // Refresh the cached copy first so concurrent requests do not all write.
    let mut updated = (**credential).clone();
    updated.source = CredentialSource::PersonalApiKey {
        id: id.clone(),
        sha256_hex: sha256_hex.clone(),
        last_used_at: Some(Utc::now()),
    };
    state
        .cache
        .put_credential(sha256_hex.clone(), Arc::new(updated));
    let store = Arc::clone(&state.meta);
    let id = id.clone();
    actix_web::rt::spawn(async move {
        match web::block(move || store.touch_personal_api_key(&id)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(error = %err, "could not record personal API key use"),
            Err(err) => tracing::warn!(error = %err, "could not record personal API key use"),
        }
    });
}

pub(super) fn require_scope(
    state: &AppState,
    credential: &Credential,
    scope: &'static str,
) -> Result<(), ApiError> {
    let wanted = Scope::parse(scope).ok_or_else(|| {
        ApiError::Internal(anyhow::anyhow!("route requires unknown scope {scope}"))
    })?;
    if credential.grants(&wanted) {
        Ok(())
    } else {
        Err(ApiError::InsufficientScope {
            detail: format!("API key missing required scope '{scope}'"),
            scope,
            resource_metadata: Arc::clone(&state.resource_metadata_url),
        })
    }
}
