//! Settings pages: a project's webhooks with each one's delivery attempts, and the viewer's
//! personal API keys with the instance's verified OAuth applications.

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;

use super::{project, render, respond, viewer, Nav, Page, Params};
use crate::state::AppState;

struct HookRow {
    id: String,
    url: String,
    events: String,
    enabled: bool,
    reason: String,
    failures: u32,
    last_success: String,
}

#[derive(Template)]
#[template(path = "webhooks.html")]
struct Webhooks {
    nav: Nav,
    hooks: Vec<HookRow>,
    selected: String,
    /// attempted, event, attempt, status, ms, state, error.
    attempts: Vec<(String, String, u32, String, u64, String, String)>,
}

fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(|| "—".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

pub async fn webhooks(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    params: Params,
) -> HttpResponse {
    respond(build_webhooks(&req, &state, &path, &params).await)
}

async fn build_webhooks(req: &HttpRequest, state: &AppState, raw: &str, params: &Params) -> Page {
    let viewer = viewer(req, state, "webhook:read").await?;
    let project = project(&viewer, raw)?;
    let hooks = state
        .engine
        .webhooks
        .list(project.id)
        .await
        .map_err(crate::error::ApiError::from)?;
    let selected = params.get("webhook").cloned().unwrap_or_default();
    let attempts = match uuid::Uuid::parse_str(&selected) {
        Ok(id) => state
            .engine
            .webhooks
            .attempts(project.id, id, 0, 200)
            .await
            .map_err(crate::error::ApiError::from)?
            .rows
            .iter()
            .map(|r| {
                (
                    when(Some(r.attempt.attempted_at)),
                    r.delivery.event_type.clone(),
                    r.attempt.number,
                    r.attempt
                        .status_code
                        .map_or_else(|| "no answer".into(), |s| s.to_string()),
                    r.attempt.duration_ms,
                    format!("{:?}", r.delivery.state).to_lowercase(),
                    r.attempt.error.clone().unwrap_or_default(),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    render(&Webhooks {
        nav: viewer.nav(project.id, "webhooks"),
        hooks: hooks
            .iter()
            .map(|h| HookRow {
                id: h.id.to_string(),
                url: h.url.clone(),
                events: h.events.join(", "),
                enabled: h.enabled,
                reason: h.disabled_reason.clone().unwrap_or_default(),
                failures: h.consecutive_failures,
                last_success: when(h.last_success_at),
            })
            .collect(),
        selected,
        attempts,
    })
}

#[derive(Template)]
#[template(path = "keys.html")]
struct Keys {
    nav: Nav,
    /// label, masked key, scopes, created, last used.
    keys: Vec<(String, String, String, String, String)>,
    staff: bool,
    clients: Vec<(String, String)>,
}

pub async fn keys(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    respond(build_keys(&req, &state).await)
}

async fn build_keys(req: &HttpRequest, state: &AppState) -> Page {
    let viewer = viewer(req, state, "personal_api_key:read").await?;
    let user = &viewer.credential.user;
    let keys = state
        .engine
        .tenancy
        .personal_api_keys_of_user(user.id)
        .await?
        .iter()
        .map(|k| {
            (
                k.label.clone(),
                k.mask_value.clone(),
                k.scopes.join(" "),
                when(Some(k.created_at)),
                when(k.last_used_at),
            )
        })
        .collect();
    let clients = if user.is_staff {
        state
            .engine
            .oauth
            .verified_clients()
            .await?
            .iter()
            .map(|c| (c.client_id.clone(), when(Some(c.verified_at))))
            .collect()
    } else {
        Vec::new()
    };
    render(&Keys {
        nav: viewer.nav(viewer.first_project(), "keys"),
        keys,
        staff: user.is_staff,
        clients,
    })
}
