//! `/oauth/authorize`: the authorization request (GET, shows consent) and the decision (POST).
//!
//! Order of checks (RFC 6749 §4.1.2.1, RFC 9700 §4.11.2): the client and its redirect URI are
//! settled first, and a problem with either is shown on a page, never redirected; then the
//! user signs in; only then do other errors redirect back to the (validated) redirect URI with
//! `error` and `state`. The POST re-checks everything, so a forged or edited form cannot send a
//! code anywhere the client did not register.

use std::collections::HashMap;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_oauth::{
    display_host, is_loopback_uri, Approval, AuthorizationProblem, AuthorizationRequest,
    ClientProblem,
};

use super::pages::{self, Consent};
use super::session::{self, Session};
use crate::error::ApiError;
use crate::state::AppState;

/// Request parameters; a repeated parameter is an error (RFC 6749 §3.1).
fn params(raw: &[u8]) -> Result<HashMap<String, String>, String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(raw)
        .map_err(|_| "The request parameters are malformed.".to_string())?;
    let mut out = HashMap::new();
    for (k, v) in pairs {
        if out.insert(k.clone(), v).is_some() {
            return Err(format!("The parameter `{k}` was given more than once."));
        }
    }
    Ok(out)
}

fn bad_request(title: &str, detail: &str) -> HttpResponse {
    pages::error(StatusCode::BAD_REQUEST, title, detail)
}

/// A client that could not be used: a 400 page, or a 503 page with `Retry-After` when the
/// server was only too busy to fetch it.
fn client_problem(problem: ClientProblem) -> HttpResponse {
    if !problem.retry_later {
        return bad_request(problem.title, &problem.detail);
    }
    let mut page = pages::error(
        StatusCode::SERVICE_UNAVAILABLE,
        problem.title,
        &problem.detail,
    );
    page.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    page
}

/// The per-address limit of authorization requests: a 429 page with `Retry-After`.
fn over_limit(req: &HttpRequest, state: &AppState) -> Option<HttpResponse> {
    let ip = crate::http::client_ip(req).unwrap_or_default();
    match state.rate_limits.authorize_per_ip.check(&ip) {
        Ok(()) => None,
        Err(err) => Some(pages::throttled(&err)),
    }
}

/// `redirect_uri` with `extra` appended to its query, as a 303.
fn redirect_to(redirect_uri: &str, extra: &[(&str, &str)]) -> HttpResponse {
    let location = match url::Url::parse(redirect_uri) {
        Ok(mut url) => {
            {
                let mut q = url.query_pairs_mut();
                for (k, v) in extra {
                    q.append_pair(k, v);
                }
            }
            url.to_string()
        }
        Err(_) => return bad_request("Invalid redirect", "The redirect_uri is not a URL."),
    };
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .finish()
}

fn error_redirect(
    state: &AppState,
    redirect_uri: &str,
    p: &HashMap<String, String>,
    problem: AuthorizationProblem,
) -> HttpResponse {
    let mut extra = vec![
        ("error", problem.error),
        ("error_description", problem.description),
    ];
    if let Some(s) = p.get("state") {
        extra.push(("state", s));
    }
    extra.push(("iss", &state.public_url));
    redirect_to(redirect_uri, &extra)
}

/// GET: validate, make sure someone is signed in, and show the consent screen.
pub async fn show(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if let Some(throttled) = over_limit(&req, &state) {
        return Ok(throttled);
    }
    let p = match params(req.query_string().as_bytes()) {
        Ok(p) => p,
        Err(detail) => return Ok(bad_request("Invalid request", &detail)),
    };
    let (client, redirect_uri) = match state
        .engine
        .oauth
        .authorization_client(&AuthorizationRequest::from_params(&p), Utc::now())
        .await
    {
        Ok(found) => found,
        Err(problem) => return Ok(client_problem(problem)),
    };
    let Some(session) = session::current(&req, &state).await? else {
        let here = format!("/oauth/authorize?{}", req.query_string());
        let next: String = url::form_urlencoded::byte_serialize(here.as_bytes()).collect();
        return Ok(HttpResponse::SeeOther()
            .insert_header((header::LOCATION, format!("/login?next={next}")))
            .finish());
    };
    let asked = match state
        .engine
        .oauth
        .check_authorization(&AuthorizationRequest::from_params(&p), &client)
    {
        Ok(a) => a,
        Err(e) => return Ok(error_redirect(&state, &redirect_uri, &p, e)),
    };
    let verified = state
        .engine
        .oauth
        .is_verified(&client.metadata.client_id)
        .await?;
    let mut fields: Vec<(&'static str, String)> = vec![
        ("response_type", "code".into()),
        ("client_id", client.metadata.client_id.clone()),
        ("redirect_uri", redirect_uri.clone()),
        ("scope", asked.scopes.join(" ")),
        ("code_challenge", asked.code_challenge.clone()),
        ("code_challenge_method", "S256".into()),
        ("csrf_token", session.record.csrf.clone()),
    ];
    if let Some(s) = p.get("state") {
        fields.push(("state", s.clone()));
    }
    if let Some(r) = &asked.resource {
        fields.push(("resource", r.clone()));
    }
    let redirect_host = display_host(&redirect_uri);
    let body = pages::consent(&Consent {
        client_name: &client.metadata.client_name,
        client_host: &client.host,
        client_id: &client.metadata.client_id,
        logo_url: client.logo_key.as_ref().map(|k| format!("/oauth/logo/{k}")),
        verified,
        redirect_host: &redirect_host,
        redirect_is_loopback: is_loopback_uri(&redirect_uri),
        user_email: &session.user.email,
        scopes: asked.scopes,
        fields,
    });
    let title = format!("Authorize {}", client.metadata.client_name);
    Ok(pages::page(StatusCode::OK, &title, &body))
}

/// POST: the user's decision. Everything is checked again before a code is issued.
pub async fn decide(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    if let Some(throttled) = over_limit(&req, &state) {
        return Ok(throttled);
    }
    let p = match params(&body) {
        Ok(p) => p,
        Err(detail) => return Ok(bad_request("Invalid request", &detail)),
    };
    let Some(Session { record, user, .. }) = session::current(&req, &state).await? else {
        return Ok(pages::error(
            StatusCode::UNAUTHORIZED,
            "Not signed in",
            "Your session has expired. Start again from the application.",
        ));
    };
    if !session::csrf_matches(&record.csrf, p.get("csrf_token").map(String::as_str)) {
        tracing::warn!(
            user_id = user.id,
            "consent POST without a matching CSRF token"
        );
        return Ok(pages::error(
            StatusCode::FORBIDDEN,
            "Request refused",
            "The consent form's security token did not match your session.",
        ));
    }
    let (client, redirect_uri) = match state
        .engine
        .oauth
        .authorization_client(&AuthorizationRequest::from_params(&p), Utc::now())
        .await
    {
        Ok(found) => found,
        Err(problem) => return Ok(client_problem(problem)),
    };
    let asked = match state
        .engine
        .oauth
        .check_authorization(&AuthorizationRequest::from_params(&p), &client)
    {
        Ok(a) => a,
        Err(e) => return Ok(error_redirect(&state, &redirect_uri, &p, e)),
    };
    if p.get("decision").map(String::as_str) != Some("approve") {
        return Ok(error_redirect(
            &state,
            &redirect_uri,
            &p,
            AuthorizationProblem {
                error: "access_denied",
                description: "the user denied the request",
            },
        ));
    }
    let approval = Approval {
        user_id: user.id,
        client_id: client.metadata.client_id.clone(),
        redirect_uri: redirect_uri.clone(),
        scopes: asked.scopes,
        code_challenge: asked.code_challenge,
        resource: asked.resource,
    };
    let code = state.engine.oauth.create_code(approval, Utc::now()).await?;
    tracing::info!(user_id = user.id, client_id = %client.metadata.client_id, "authorization code issued");
    let mut extra = vec![("code", code.as_str())];
    if let Some(s) = p.get("state") {
        extra.push(("state", s));
    }
    extra.push(("iss", &state.public_url));
    Ok(redirect_to(&redirect_uri, &extra))
}

/// `GET /oauth/logo/{key}`: a client's logo from our cache (never hot-linked).
pub async fn logo(state: web::Data<AppState>, key: web::Path<String>) -> HttpResponse {
    match state.engine.oauth.logo(&key) {
        Some(logo) => HttpResponse::Ok()
            .content_type(logo.content_type)
            .insert_header((header::CACHE_CONTROL, "private, max-age=300"))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .insert_header((
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; sandbox",
            ))
            .body(logo.bytes.to_vec()),
        None => HttpResponse::NotFound().finish(),
    }
}
