//! A project's webhooks (`…/webhooks/`): create, list, read, PATCH and DELETE, each webhook's
//! delivery attempts (`…/{id}/deliveries/`) and redelivery
//! (`…/{id}/deliveries/{delivery_id}/redeliver/`). A webhook's secret is in the answer that
//! makes it (or sets a new one), never after.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use corvid_webhooks::{AttemptRow, Delivery, WebhookError, WebhookInput, Webhooks};
use serde_json::{json, Value};

use super::{project_route, uuid_path};
use crate::auth::scope::{WebhookRead, WebhookWrite};
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

const BASE: &str = "/webhooks";

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, BASE, || web::get().to(list));
    project_route(cfg, BASE, || web::post().to(create));
    let one = format!("{BASE}/{{webhook_id}}");
    project_route(cfg, &one, || web::get().to(read));
    project_route(cfg, &one, || web::patch().to(update));
    project_route(cfg, &one, || web::delete().to(delete));
    project_route(cfg, &format!("{one}/deliveries"), || {
        web::get().to(deliveries)
    });
    project_route(
        cfg,
        &format!("{one}/deliveries/{{delivery_id}}/redeliver"),
        || web::post().to(redeliver),
    );
}

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> ApiError {
        match e {
            WebhookError::Invalid { attr, detail } => ApiError::validation(detail, Some(attr)),
            WebhookError::NotFound { what } => ApiError::not_found(what),
            WebhookError::Store(e) => ApiError::Store(e),
        }
    }
}

fn webhooks(state: &AppState) -> &Webhooks {
    &state.engine.webhooks
}

type Path = web::Path<(String, String)>;

/// The body as a webhook's fields (others are ignored, as PostHog's serializers do).
fn input(body: Value) -> Result<WebhookInput, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::validation(e.to_string(), None))
}

/// The webhook with its secret, for the answers that set it.
fn with_secret(hook: &corvid_webhooks::Webhook) -> Value {
    let mut shown = hook.api_json();
    shown["secret"] = json!(hook.secret);
    shown
}

fn delivery_json(d: &Delivery) -> Value {
    json!({
        "id": d.id,
        "webhook_id": d.webhook_id,
        "activity_log_id": d.entry_id,
        "event_type": d.event_type,
        "created_at": d.created_at,
        "state": d.state,
        "next_attempt_at": d.next_attempt_at,
        "attempts": d.attempts.len(),
    })
}

fn attempt_json(row: &AttemptRow) -> Value {
    let (a, d) = (&row.attempt, &row.delivery);
    json!({
        "id": a.id,
        "delivery_id": d.id,
        "activity_log_id": d.entry_id,
        "event_type": d.event_type,
        "attempt": a.number,
        "attempted_at": a.attempted_at,
        "status_code": a.status_code,
        "success": a.success,
        "error": a.error,
        "duration_ms": a.duration_ms,
        "redelivery": a.redelivery,
        "state": d.state,
        "next_attempt_at": d.next_attempt_at,
    })
}

async fn list(
    req: HttpRequest,
    access: ProjectAccess<WebhookRead>,
    state: web::Data<AppState>,
    params: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let hooks = webhooks(&state).list(access.project.id).await?;
    super::paged(
        &req,
        &state,
        &params,
        hooks.iter().map(|h| h.api_json()).collect(),
    )
}

async fn create(
    access: ProjectAccess<WebhookWrite>,
    state: web::Data<AppState>,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let actor = crate::auth::actor(&access.credential);
    let created = webhooks(&state)
        .create(access.project.id, &actor, input(body.0)?)
        .await?;
    Ok(HttpResponse::Created().json(with_secret(&created.webhook)))
}

async fn read(
    access: ProjectAccess<WebhookRead>,
    state: web::Data<AppState>,
    path: Path,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Webhook")?;
    let hook = webhooks(&state).get(access.project.id, id).await?;
    Ok(HttpResponse::Ok().json(hook.api_json()))
}

async fn update(
    access: ProjectAccess<WebhookWrite>,
    state: web::Data<AppState>,
    path: Path,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Webhook")?;
    let actor = crate::auth::actor(&access.credential);
    let fields = input(body.0)?;
    let secret_set = fields.secret.is_some();
    let hook = webhooks(&state)
        .update(access.project.id, &actor, id, fields)
        .await?;
    Ok(HttpResponse::Ok().json(if secret_set {
        with_secret(&hook)
    } else {
        hook.api_json()
    }))
}

async fn delete(
    access: ProjectAccess<WebhookWrite>,
    state: web::Data<AppState>,
    path: Path,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Webhook")?;
    let actor = crate::auth::actor(&access.credential);
    webhooks(&state)
        .delete(access.project.id, &actor, id)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Every attempt to deliver to the webhook, newest first, each with its status code.
async fn deliveries(
    req: HttpRequest,
    access: ProjectAccess<WebhookRead>,
    state: web::Data<AppState>,
    path: Path,
    params: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Webhook")?;
    let page = webhooks(&state)
        .attempts(access.project.id, id, 0, usize::MAX)
        .await?;
    super::paged(
        &req,
        &state,
        &params,
        page.rows.iter().map(attempt_json).collect(),
    )
}

/// Queues a delivery (by its id or an attempt's) to be sent again now: 202 with the delivery.
async fn redeliver(
    access: ProjectAccess<WebhookWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Webhook")?;
    let delivery = uuid_path(&path.2, "Delivery")?;
    let queued = webhooks(&state)
        .redeliver(access.project.id, id, delivery)
        .await?;
    Ok(HttpResponse::Accepted().json(delivery_json(&queued)))
}
