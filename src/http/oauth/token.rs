//! `/oauth/token` (RFC 6749 §4.1.3, §6), `/oauth/revoke` (RFC 7009) and `/oauth/introspect`
//! (RFC 7662). Bodies are form-encoded (JSON with scalar values is accepted too, as PostHog
//! does); every answer is `Cache-Control: no-store`.

use std::collections::HashMap;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_oauth::{Introspection, Issued, OAuthError, TokenKind, TokenRequest};
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

fn token_error(err: OAuthError) -> HttpResponse {
    match err {
        OAuthError::Store(e) => {
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
    let ip = crate::http::client_ip(&req).unwrap_or_default();
    if let Err(ApiError::RateLimited { retry_after_secs }) =
        state.rate_limits.token_per_ip.check(&ip)
    {
        return Ok(no_store(StatusCode::TOO_MANY_REQUESTS)
            .insert_header((header::RETRY_AFTER, retry_after_secs.to_string()))
            .json(json!({
                "error": "temporarily_unavailable",
                "error_description": format!("Too many token requests from your address; retry in {retry_after_secs} seconds."),
            })));
    }
    let p = params_or_400!(req, body);
    let answer = match TokenRequest::from_params(&p) {
        Ok(request) => state.engine.oauth.token(request, Utc::now()).await,
        Err(e) => Err(e),
    };
    Ok(match answer {
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
    let client_id = p.get("client_id").map(String::as_str);
    state
        .engine
        .oauth
        .revoke(&token, client_id, Utc::now())
        .await?;
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
    let token = p.get("token").map(String::as_str).unwrap_or_default();
    let answer = state
        .engine
        .oauth
        .introspect(caller.as_deref(), token, Utc::now())
        .await?
        .map(|found| match found {
            Introspection::Inactive => json!({"active": false}),
            Introspection::Active {
                kind,
                scopes,
                client_id,
                expires_at,
                issued_at,
                subject,
                audience,
            } => json!({
                "active": true,
                "token_type": match kind { TokenKind::Access => "access_token", TokenKind::Refresh => "refresh_token" },
                "scope": scopes.join(" "),
                "client_id": client_id,
                "exp": expires_at.timestamp(),
                "iat": issued_at.timestamp(),
                "sub": subject.as_ref().map(|(uuid, _)| uuid.to_string()),
                "username": subject.map(|(_, email)| email),
                "aud": audience,
            }),
        });
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
