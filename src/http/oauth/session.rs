//! Browser sessions of the sign-in and consent pages: a random id in an `HttpOnly`,
//! `SameSite=Lax` cookie (`Secure` when the public URL is https), stored hashed in sled with a
//! per-session CSRF token that every form must echo.

use actix_web::http::header;
use actix_web::HttpRequest;
use chrono::Utc;
pub use corvid_oauth::Session;
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

pub const SESSION_COOKIE: &str = "corvid_session";
/// Double-submit CSRF cookie of the sign-in form (there is no session yet to hold a token).
pub const LOGIN_CSRF_COOKIE: &str = "corvid_login_csrf";

/// A cookie's value from the request.
pub fn cookie(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// A `Set-Cookie` value; `max_age` 0 deletes the cookie.
pub fn set_cookie(state: &AppState, name: &str, value: &str, max_age_secs: u64) -> String {
    let secure = if state.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    format!("{name}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age_secs}{secure}")
}

/// Constant-time comparison of a submitted CSRF token with the expected one.
pub fn csrf_matches(expected: &str, given: Option<&str>) -> bool {
    given.is_some_and(|g| {
        !expected.is_empty() && bool::from(expected.as_bytes().ct_eq(g.as_bytes()))
    })
}

/// The cookie holding the session's CSRF token for scripts to echo in `X-CSRFToken` (readable
/// by the page: not `HttpOnly`).
pub const CSRF_COOKIE: &str = "corvid_csrftoken";

/// Starts a session for `user_id`: the `Set-Cookie` values of the session and of its CSRF
/// token.
pub async fn sign_in(state: &AppState, user_id: u64) -> Result<[String; 2], ApiError> {
    let now = Utc::now();
    let oauth = &state.engine.oauth;
    let id = oauth.start_session(user_id, now).await?;
    let csrf = oauth
        .session(&id, now)
        .await?
        .map(|s| s.record.csrf)
        .unwrap_or_default();
    let ttl = state.config.oauth.session_ttl.as_secs();
    let csrf_cookie = set_cookie(state, CSRF_COOKIE, &csrf, ttl).replace("; HttpOnly", "");
    Ok([set_cookie(state, SESSION_COOKIE, &id, ttl), csrf_cookie])
}

/// The request's live session and its user, if any.
pub async fn current(req: &HttpRequest, state: &AppState) -> Result<Option<Session>, ApiError> {
    let Some(id) = cookie(req, SESSION_COOKIE).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    Ok(state.engine.oauth.session(&id, Utc::now()).await?)
}
