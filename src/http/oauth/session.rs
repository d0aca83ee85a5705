//! Browser sessions of the sign-in and consent pages: a random id in an `HttpOnly`,
//! `SameSite=Lax` cookie (`Secure` when the public URL is https), stored hashed in sled with a
//! per-session CSRF token that every form must echo.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use chrono::Utc;
use corvid_actors::kernel::secrets::{random_base62, sha256_hex};
use corvid_actors::meta::User;
use corvid_actors::oauth::store::SessionRecord;
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

pub const SESSION_COOKIE: &str = "corvid_session";
/// Double-submit CSRF cookie of the sign-in form (there is no session yet to hold a token).
pub const LOGIN_CSRF_COOKIE: &str = "corvid_login_csrf";

/// A signed-in browser.
pub struct Session {
    pub hash: String,
    pub record: SessionRecord,
    pub user: User,
}

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

/// The request's live session and its user, if any.
pub async fn current(req: &HttpRequest, state: &AppState) -> Result<Option<Session>, ApiError> {
    let Some(id) = cookie(req, SESSION_COOKIE).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let hash = sha256_hex(&id);
    let oauth = Arc::clone(&state.oauth);
    let meta = Arc::clone(&state.meta);
    let lookup = hash.clone();
    let found = web::block(move || {
        let Some(record) = oauth.store.session(&lookup)? else {
            return Ok(None);
        };
        Ok(meta.user(record.user_id)?.map(|user| (record, user)))
    })
    .await?
    .map_err(ApiError::Store)?;
    Ok(found.map(|(record, user)| Session { hash, record, user }))
}

/// Starts a session for `user_id`; returns the cookie value.
pub async fn start(state: &AppState, user_id: u64) -> Result<String, ApiError> {
    let id = random_base62(43);
    let record = SessionRecord {
        user_id,
        csrf: random_base62(32),
        expires_at: Utc::now()
            + chrono::Duration::from_std(state.config.oauth.session_ttl)
                .unwrap_or_else(|_| chrono::Duration::days(14)),
    };
    let oauth = Arc::clone(&state.oauth);
    let hash = sha256_hex(&id);
    web::block(move || oauth.store.put_session(&hash, &record))
        .await?
        .map_err(ApiError::Store)?;
    Ok(id)
}

pub async fn end(state: &AppState, hash: String) -> Result<(), ApiError> {
    let oauth = Arc::clone(&state.oauth);
    web::block(move || oauth.store.delete_session(&hash))
        .await?
        .map_err(ApiError::Store)
}
