//! Liveness, readiness and Prometheus metrics.

use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use serde_json::json;

use crate::auth::scope::ProjectRead;
use crate::auth::Staff;
use crate::error::ApiError;
use crate::metrics::{render_bounds, render_engine, render_jobs, Bounds};
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/_health", web::get().to(health))
        .route("/_readiness", web::get().to(readiness))
        .route("/metrics", web::get().to(metrics))
        .route("/_internal/ingest", web::get().to(ingest_stats));
}

/// The ingest shards' statistics (instance administrators only).
async fn ingest_stats(
    _staff: Staff<ProjectRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let shards = state.engine.ingest.stats().await?;
    Ok(HttpResponse::Ok().json(json!({
        "pending_events": state.engine.ingest.pending_events(),
        "shards": shards,
    })))
}

/// Liveness: the process answers HTTP.
async fn health() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Readiness: 503 from the moment shutdown begins, so load balancers drain us first, and
/// while a cluster node cannot reach PostgreSQL or the bucket.
async fn readiness(state: web::Data<AppState>) -> HttpResponse {
    if !state.lifecycle.is_ready() {
        return HttpResponse::ServiceUnavailable().json(json!({"status": "shutting_down"}));
    }
    match state.engine.ready().await {
        Ok(()) => HttpResponse::Ok().json(json!({"status": "ready"})),
        Err(down) => HttpResponse::ServiceUnavailable().json(json!({
            "status": "unavailable",
            "down": [down.component()],
            "detail": down.to_string(),
        })),
    }
}

/// The HTTP layer's series, then the engine's (left out, with a warning, if the ingest
/// shards cannot answer). With `metrics.require_key`, only for an instance administrator's
/// personal API key.
async fn metrics(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.config.metrics.require_key {
        Staff::<ProjectRead>::extract(&req).await?;
    }
    let mut body = state.metrics.render();
    match state.engine.stats().await {
        Ok(stats) => body.push_str(&render_engine(&stats)),
        Err(err) => tracing::warn!(error = %err, "engine statistics unavailable for /metrics"),
    }
    body.push_str(&render_jobs(&state.engine.job_reports()));
    body.push_str(&render_bounds(&Bounds {
        oauth_clients: state.engine.oauth.client_cache_usage(),
        decode_permits: state.decodes.available(),
        query_credentials: state.engine.query.credentials_running(),
        persons: state.engine.persons.memory(),
    }));
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(body))
}
