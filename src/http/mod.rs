//! The HTTP API, one module per surface. Each module registers its routes in `configure`, so
//! this file reads as the table of contents of the API.
//!
//! Routes are declared without a trailing slash; `NormalizePath` trims it from requests, so
//! PostHog-style `/api/projects/` and `/api/projects` both work.

mod activity;
mod batch_exports;
mod capture;
pub mod client_ip;
mod cohorts;
mod cors;
pub mod decoding;
mod early_access;
mod endpoints;
mod experiments;
mod exports;
mod flags;
mod health;
mod insight_variables;
mod logs;
mod oauth;
mod organizations;
mod person_deletion;
mod personal_api_keys;
mod persons;
mod projects;
mod query;
pub mod recover;
mod remote_config;
mod retention;
pub mod starting;
mod surveys;
mod team;
mod users;
mod webhooks;

pub(crate) use oauth::session;

use actix_web::{web, HttpResponse};

use crate::error::ApiError;
use serde_json::{json, Value};

/// Routes are tried in registration order, so the hottest dynamic paths (endpoint runs) come
/// first; static paths (capture, flags) cost a string compare wherever they are.
pub fn configure(cfg: &mut web::ServiceConfig) {
    // The router tries routes in this order. The public hot paths (capture, `/flags`) have
    // static paths, compared as plain strings, so they go first and never wait for the
    // dynamic (regex-matched) API routes to fail; endpoint runs come next.
    capture::configure(cfg);
    flags::configure_public(cfg);
    remote_config::configure(cfg);
    endpoints::configure(cfg);
    health::configure(cfg);
    projects::configure(cfg);
    personal_api_keys::configure(cfg);
    users::configure(cfg);
    persons::configure(cfg);
    person_deletion::configure(cfg);
    retention::configure(cfg);
    exports::configure(cfg);
    batch_exports::configure(cfg);
    activity::configure(cfg);
    webhooks::configure(cfg);
    logs::configure(cfg);
    flags::configure(cfg);
    cohorts::configure(cfg);
    organizations::configure(cfg);
    team::configure(cfg);
    query::configure(cfg);
    insight_variables::configure(cfg);
    early_access::configure(cfg);
    surveys::configure(cfg);
    experiments::configure(cfg);
    oauth::configure(cfg);
}

/// Registers a project-scoped route under both of PostHog's prefixes,
/// `/api/projects/{project_id}` and `/api/environments/{project_id}`.
pub fn project_route(
    cfg: &mut web::ServiceConfig,
    suffix: &str,
    route: impl Fn() -> actix_web::Route,
) {
    for prefix in [
        "/api/projects/{project_id}",
        "/api/environments/{project_id}",
    ] {
        cfg.route(&format!("{prefix}{suffix}"), route());
    }
}

/// The client address (see [`client_ip::resolve`]): the peer's, or what a trusted proxy says
/// it forwarded for.
pub fn client_addr(req: &actix_web::HttpRequest) -> Option<std::net::IpAddr> {
    let trusted = req
        .app_data::<web::Data<crate::state::AppState>>()
        .map(|state| state.config.server.trusted_proxies.as_slice())
        .unwrap_or_default();
    client_ip::resolve(req.peer_addr().map(|a| a.ip()), req.headers(), trusted)
}

/// [`client_addr`] as text.
pub fn client_ip(req: &actix_web::HttpRequest) -> Option<String> {
    client_addr(req).map(|ip| ip.to_string())
}

/// A request header as text, when present and ASCII.
pub fn header_string(
    req: &actix_web::HttpRequest,
    name: actix_web::http::header::HeaderName,
) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A UUID path segment; anything else is a 404 naming `what`.
pub fn uuid_path(raw: &str, what: &'static str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(raw).map_err(|_| ApiError::not_found(what))
}

/// An integer id path segment; anything else is a 404 naming `what`.
pub fn id_path(raw: &str, what: &'static str) -> Result<u64, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found(what))
}

/// The user summary shown as `created_by`.
pub fn user_summary(user: &corvid_tenancy::User) -> serde_json::Value {
    serde_json::json!({
        "id": user.id,
        "uuid": user.uuid,
        "email": user.email,
        "first_name": user.first_name,
    })
}

/// Unknown routes get the same JSON error shape as everything else.
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::not_found("Endpoint"))
}

/// PostHog's limit/offset page: `{count, next, previous, results}`.
/// This route's URL with the request's query, its `cursor` parameters replaced: the link to
/// another page.
pub(crate) fn page_link(
    req: &actix_web::HttpRequest,
    state: &crate::state::AppState,
    params: &web::Query<std::collections::HashMap<String, String>>,
    cursor: Vec<(String, String)>,
) -> String {
    let mut pairs: Vec<(String, String)> = params
        .iter()
        .filter(|(k, _)| !cursor.iter().any(|(c, _)| c == *k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    pairs.sort();
    pairs.extend(cursor);
    let query = serde_urlencoded::to_string(&pairs).unwrap_or_default();
    format!("{}{}?{query}", state.public_url, req.path())
}

pub(crate) fn paged(
    req: &actix_web::HttpRequest,
    state: &crate::state::AppState,
    params: &web::Query<std::collections::HashMap<String, String>>,
    rows: Vec<Value>,
) -> Result<HttpResponse, ApiError> {
    let number = |name: &'static str, default: usize| -> Result<usize, ApiError> {
        params.get(name).map_or(Ok(default), |t| {
            t.parse::<usize>().map_err(|_| {
                ApiError::validation(format!("{name} must be a non-negative integer"), Some(name))
            })
        })
    };
    let limit = number("limit", 100)?.clamp(1, 1000);
    let offset = number("offset", 0)?;
    let count = rows.len();
    let link = |offset: usize| {
        page_link(
            req,
            state,
            params,
            vec![
                ("limit".into(), limit.to_string()),
                ("offset".into(), offset.to_string()),
            ],
        )
    };
    let next = (offset.saturating_add(limit) < count).then(|| link(offset + limit));
    let previous = (offset > 0).then(|| link(offset.saturating_sub(limit)));
    let results: Vec<Value> = rows.into_iter().skip(offset).take(limit).collect();
    Ok(HttpResponse::Ok().json(json!({
        "count": count,
        "next": next,
        "previous": previous,
        "results": results,
    })))
}
