use std::marker::PhantomData;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};
use chrono::Utc;
use corvid_oauth::ACCESS_TOKEN_PREFIX;
use corvid_tenancy::PERSONAL_API_KEY_PREFIX;
use corvid_tenancy::{Credential, Scope};
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
/// The credential of a signed-in browser session, when the request carries one. A request
/// that changes something must also carry the session's CSRF token in `X-CSRFToken` (the
/// `corvid_csrftoken` cookie holds it for the page's script to copy), so another site cannot
/// make a signed-in browser write.
async fn session_credential(
    req: &HttpRequest,
    state: &AppState,
) -> Result<Option<Arc<Credential>>, ApiError> {
    let Some(session) = crate::http::session::current(req, state).await? else {
        return Ok(None);
    };
    let safe = matches!(req.method().as_str(), "GET" | "HEAD" | "OPTIONS");
    let given = req
        .headers()
        .get("x-csrftoken")
        .and_then(|v| v.to_str().ok());
    if !safe && !crate::http::session::csrf_matches(&session.record.csrf, given) {
        return Err(ApiError::PermissionDenied {
            detail: "CSRF token missing or incorrect: send the session's token in X-CSRFToken."
                .into(),
        });
    }
    Ok(Credential::from_session(session.user, session.record.expires_at).map(Arc::new))
}

async fn authenticate(req: &HttpRequest, state: &AppState) -> Result<Arc<Credential>, ApiError> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        if let Some(credential) = session_credential(req, state).await? {
            return Ok(credential);
        }
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
    let engine = &state.engine;
    let found = if token.starts_with(ACCESS_TOKEN_PREFIX) {
        engine.oauth.authenticate(token, Utc::now()).await?
    } else if token.starts_with(PERSONAL_API_KEY_PREFIX) {
        engine.tenancy.authenticate_key(token).await?
    } else {
        None
    };
    found.ok_or_else(|| {
        unauthenticated(
            state,
            if token.starts_with(PERSONAL_API_KEY_PREFIX) {
                "Personal API key is invalid."
            } else {
                "Invalid or expired access token."
            },
            "authentication_failed",
        )
    })
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
