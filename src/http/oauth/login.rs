//! `/login` and `/logout`: email + password (argon2id, verified on the blocking pool), then a
//! session cookie. After signing in the browser goes back to `next`, which must be a local path
//! so the form cannot be used as an open redirect.

use std::collections::HashMap;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use corvid_oauth::OAuth;
use corvid_tenancy::StoreError;

use super::pages;
use super::session::{self, LOGIN_CSRF_COOKIE, SESSION_COOKIE};
use crate::error::ApiError;
use crate::state::AppState;

/// A local path to continue to, or the sign-in page itself.
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.starts_with("/\\")
                && !n.chars().any(|c| c.is_control() || c == '\\') =>
        {
            n.to_string()
        }
        _ => "/login".to_string(),
    }
}

pub async fn form(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    if let Some(s) = session::current(&req, &state).await? {
        return Ok(pages::page(
            StatusCode::OK,
            "Signed in",
            &pages::signed_in(&s.user.email, &s.record.csrf),
        ));
    }
    let next = safe_next(query.get("next").map(String::as_str));
    Ok(login_page(&state, &next, "", false, StatusCode::OK))
}

fn login_page(
    state: &AppState,
    next: &str,
    email: &str,
    failed: bool,
    status: StatusCode,
) -> HttpResponse {
    let csrf = OAuth::new_csrf_token();
    let mut res = pages::page(status, "Sign in", &pages::login(&csrf, next, email, failed));
    if let Ok(value) =
        header::HeaderValue::from_str(&session::set_cookie(state, LOGIN_CSRF_COOKIE, &csrf, 3600))
    {
        res.headers_mut().append(header::SET_COOKIE, value);
    }
    res
}

#[derive(serde::Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf_token: Option<String>,
    #[serde(default)]
    next: Option<String>,
}

pub async fn submit(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, ApiError> {
    let form = form.into_inner();
    let expected = session::cookie(&req, LOGIN_CSRF_COOKIE).unwrap_or_default();
    if !session::csrf_matches(&expected, form.csrf_token.as_deref()) {
        return Ok(pages::error(
            StatusCode::FORBIDDEN,
            "Sign-in expired",
            "The sign-in form was missing its security token or it did not match. Reload the page and try again.",
        ));
    }
    let next = safe_next(form.next.as_deref());
    let email = form.email.trim().to_string();
    let password = form.password;
    // Each attempt costs an argon2id verification: limited per address and per account
    // before any is done.
    let ip = crate::http::client_ip(&req).unwrap_or_default();
    let limits = &state.rate_limits;
    let checked = limits
        .login_per_ip
        .check(&ip)
        .and_then(|()| limits.login_per_account.check(&email.to_ascii_lowercase()));
    if let Err(err) = checked {
        tracing::info!(%ip, "sign-in attempts over the limit");
        return Ok(pages::throttled(&err));
    }
    let user = match state.engine.tenancy.verify_login(&email, &password).await {
        Err(StoreError::Busy { .. }) => {
            let mut page = pages::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "Busy",
                "Too many sign-ins are being checked right now. Try again in a moment.",
            );
            page.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return Ok(page);
        }
        other => other?,
    };
    let Some(user) = user else {
        tracing::info!("failed sign-in attempt");
        return Ok(login_page(
            &state,
            &next,
            &email,
            true,
            StatusCode::UNAUTHORIZED,
        ));
    };
    let [session_cookie, csrf_cookie] = session::sign_in(&state, user.id).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, next))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .append_header((header::SET_COOKIE, session_cookie))
        .append_header((header::SET_COOKIE, csrf_cookie))
        .append_header((
            header::SET_COOKIE,
            session::set_cookie(&state, LOGIN_CSRF_COOKIE, "", 0),
        ))
        .finish())
}

#[derive(serde::Deserialize)]
pub struct LogoutForm {
    #[serde(default)]
    csrf_token: Option<String>,
}

pub async fn logout(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<LogoutForm>,
) -> Result<HttpResponse, ApiError> {
    if let Some(s) = session::current(&req, &state).await? {
        if !session::csrf_matches(&s.record.csrf, form.csrf_token.as_deref()) {
            return Ok(pages::error(
                StatusCode::FORBIDDEN,
                "Sign-out refused",
                "The form's security token did not match your session.",
            ));
        }
        state.engine.oauth.end_session(&s.hash).await?;
    }
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/login"))
        .append_header((
            header::SET_COOKIE,
            session::set_cookie(&state, SESSION_COOKIE, "", 0),
        ))
        .finish())
}
