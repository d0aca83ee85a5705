//! `/oauth/token` (RFC 6749 §4.1.3, §6), `/oauth/revoke` (RFC 7009) and `/oauth/introspect`
//! (RFC 7662). Bodies are form-encoded (JSON with scalar values is accepted too, as PostHog
//! does); every answer is `Cache-Control: no-store`.

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_actors::kernel::secrets::{sha256_hex, PERSONAL_API_KEY_PREFIX};
use corvid_actors::oauth::store::TokenKind;
use corvid_actors::oauth::{epoch, CodeExchange, Issued, TokenError, ACCESS_TOKEN_PREFIX};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::AppState;

fn no_store(status: StatusCode) -> actix_web::HttpResponseBuilder {
    let mut b = HttpResponse::build(status);
    b.insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((header::PRAGMA, "no-cache"));
    b
}

fn oauth_error(status: StatusCode, code: &str, description: &str) -> HttpResponse {
    no_store(status).json(json!({"error": code, "error_description": description}))
}

/// Form or JSON parameters; repeated or non-scalar ones are `invalid_request` (the `Err` is
/// its description).
fn params(req: &HttpRequest, body: &[u8]) -> Result<HashMap<String, String>, String> {
    let is_json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let pairs: Vec<(String, String)> = if is_json {
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else {
            return Err("The body must be a JSON object.".into());
        };
        let mut pairs = Vec::new();
        for (k, v) in map {
            let v = match v {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return Err(format!("The parameter `{k}` must be a scalar.")),
            };
            pairs.push((k, v));
        }
        pairs
    } else {
        serde_urlencoded::from_bytes(body)
            .map_err(|_| "The body must be form-encoded.".to_string())?
    };
    let mut out = HashMap::new();
    for (k, v) in pairs {
        if out.insert(k.clone(), v).is_some() {
            return Err(format!("The parameter `{k}` was given more than once."));
        }
    }
    Ok(out)
}

/// [`params`], or the `invalid_request` answer.
macro_rules! params_or_400 {
    ($req:expr, $body:expr) => {
        match params(&$req, &$body) {
            Ok(p) => p,
            Err(detail) => {
                return Ok(oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    &detail,
                ))
            }
        }
    };
}

fn token_error(err: TokenError) -> HttpResponse {
    match err {
        TokenError::Store(e) => {
            tracing::error!(error = %e, "token endpoint storage failure");
            no_store(StatusCode::SERVICE_UNAVAILABLE)
                .insert_header((header::RETRY_AFTER, "1"))
                .json(json!({"error": "temporarily_unavailable", "error_description": "Please retry."}))
        }
        other => oauth_error(StatusCode::BAD_REQUEST, other.code(), &other.to_string()),
    }
}

fn issued(i: Issued) -> HttpResponse {
    no_store(StatusCode::OK).json(json!({
        "access_token": i.access_token,
        "token_type": "Bearer",
        "expires_in": i.expires_in,
        "refresh_token": i.refresh_token,
        "scope": i.scopes.join(" "),
    }))
}

pub async fn token(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let p = params_or_400!(req, body);
    let get = |k: &str| p.get(k).filter(|v| !v.is_empty()).cloned();
    if let Some(r) = get("resource") {
        if !state.is_our_resource(&r) {
            return Ok(oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_target",
                "resource is not served by this server",
            ));
        }
    }
    let oauth = Arc::clone(&state.oauth);
    let result = match p.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            let exchange = CodeExchange {
                code: get("code").unwrap_or_default(),
                client_id: get("client_id"),
                redirect_uri: get("redirect_uri"),
                code_verifier: get("code_verifier"),
                resource: get("resource"),
            };
            web::block(move || oauth.exchange_code(exchange)).await?
        }
        Some("refresh_token") => {
            let (token, client, scope, resource) = (
                get("refresh_token").unwrap_or_default(),
                get("client_id"),
                get("scope"),
                get("resource"),
            );
            web::block(move || {
                oauth.refresh(
                    &token,
                    client.as_deref(),
                    scope.as_deref(),
                    resource.as_deref(),
                )
            })
            .await?
        }
        None => Err(TokenError::InvalidRequest("grant_type is required".into())),
        Some(_) => Err(TokenError::UnsupportedGrantType),
    };
    Ok(match result {
        Ok(i) => issued(i),
        Err(err) => token_error(err),
    })
}

/// RFC 7009: always 200 for a well-formed request, whether or not the token was known.
pub async fn revoke(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let p = params_or_400!(req, body);
    let Some(token) = p.get("token").filter(|t| !t.is_empty()).cloned() else {
        return Ok(oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "token is required",
        ));
    };
    let client_id = p.get("client_id").cloned();
    let oauth = Arc::clone(&state.oauth);
    let (_, hash) = web::block(move || oauth.revoke(&token, client_id.as_deref()))
        .await?
        .map_err(ApiError::Store)?;
    state.cache.forget_credential(&hash);
    Ok(no_store(StatusCode::OK).finish())
}

/// RFC 7662. The caller authenticates with a bearer credential: an OAuth access token sees
/// tokens of its own client (itself included); a staff user's personal API key sees any.
pub async fn introspect(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let p = params_or_400!(req, body);
    let caller = bearer(&req);
    let oauth = Arc::clone(&state.oauth);
    let meta = Arc::clone(&state.meta);
    let token = p.get("token").cloned().unwrap_or_default();
    let answer = web::block(move || -> Result<Option<Value>, corvid_actors::meta::StoreError> {
        let now = Utc::now();
        // Who may look: Err(()) = unauthenticated caller.
        let sees: Result<Option<String>, ()> = match caller.as_deref() {
            Some(c) if c.starts_with(ACCESS_TOKEN_PREFIX) => match oauth.lookup(c)? {
                Some(s) if s.token.kind == TokenKind::Access && s.is_active(now) => Ok(Some(s.token.client_id)),
                _ => Err(()),
            },
            Some(c) if c.starts_with(PERSONAL_API_KEY_PREFIX) => {
                match meta.credential_for_key_hash(&sha256_hex(c))? {
                    Some(cred) if cred.user.is_staff => Ok(None),
                    _ => Err(()),
                }
            }
            _ => Err(()),
        };
        let Ok(only_client) = sees else {
            return Ok(None);
        };
        let Some(state) = oauth.lookup(&token)? else {
            return Ok(Some(json!({"active": false})));
        };
        let visible = only_client.is_none_or(|c| c == state.token.client_id);
        if !visible || !state.is_active(now) {
            return Ok(Some(json!({"active": false})));
        }
        let user = meta.user(state.token.user_id)?;
        let t = state.token;
        Ok(Some(json!({
            "active": true,
            "token_type": match t.kind { TokenKind::Access => "access_token", TokenKind::Refresh => "refresh_token" },
            "scope": t.scopes.join(" "),
            "client_id": t.client_id,
            "exp": epoch(t.expires_at),
            "iat": epoch(t.issued_at),
            "sub": user.as_ref().map(|u| u.uuid.to_string()),
            "username": user.as_ref().map(|u| u.email.clone()),
            "aud": t.resource,
        })))
    })
    .await?
    .map_err(ApiError::Store)?;
    Ok(match answer {
        Some(body) => no_store(StatusCode::OK).json(body),
        None => no_store(StatusCode::UNAUTHORIZED)
            .insert_header((header::WWW_AUTHENTICATE, format!("Bearer resource_metadata=\"{}\"", state.resource_metadata_url)))
            .json(json!({"error": "invalid_client", "error_description": "Introspection needs a bearer access token or a staff personal API key."})),
    })
}

fn bearer(req: &HttpRequest) -> Option<String> {
    let v = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}
