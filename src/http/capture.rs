//! Capture: `/batch`, `/i/v0/e`, `/e`, `/capture`, `/track`, `/engage` (with or without a
//! trailing slash; GET, POST and CORS preflight). Public, authenticated by the project token in
//! the payload.

use actix_web::http::header;
use actix_web::http::Method;
use actix_web::middleware::from_fn;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_events::{
    decode, normalize_all, CaptureContext, CaptureQuery, DecodeError, Limits, Payload, RouteKind,
    WalBatch,
};
use corvid_kernel::wire::WireError;
use serde_json::json;

use crate::auth::resolve_project_token;
use crate::body::read_body;
use crate::error::ApiError;
use crate::http::header_string;
use crate::state::AppState;
use crate::telemetry::RequestProject;

pub fn configure(cfg: &mut web::ServiceConfig) {
    let routes: [(&[&str], RouteKind); 3] = [
        (&["/batch", "/i/v0/e"], RouteKind::Analytics),
        (&["/e", "/capture", "/track"], RouteKind::Legacy),
        (&["/engage"], RouteKind::Engage),
    ];
    // One resource per path: a resource of several paths is matched as a regex set, then
    // its captures, for every request that reaches it; a single static path is a string
    // compare. Every `/flags` request passed these resources first.
    for (paths, kind) in routes {
        for &path in paths {
            let handler =
                move |req: HttpRequest, payload: web::Payload, state: web::Data<AppState>| {
                    capture(req, payload, state, kind)
                };
            cfg.service(
                web::resource(path)
                    .wrap(from_fn(super::cors::public))
                    .route(web::post().to(handler))
                    .route(web::get().to(handler))
                    .route(web::method(Method::OPTIONS).to(preflight)),
            );
        }
    }
}

async fn preflight() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "Ok"}))
}

async fn capture(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    route: RouteKind,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(
        &req,
        payload.into_inner(),
        state.config.limits.max_body_bytes,
    )
    .await?;
    state.engine.ingest.wait_for_room().await?;
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let query = CaptureQuery::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let beacon = query.beacon;
    let content_type = header_string(&req, header::CONTENT_TYPE);
    let content_encoding = header_string(&req, header::CONTENT_ENCODING);
    let limits = state.config.capture_limits();
    let decode_with = move |max_decompressed_bytes: usize| {
        let payload = Payload {
            route,
            body: &body,
            query: &query,
            content_type: content_type.as_deref(),
            content_encoding: content_encoding.as_deref(),
        };
        decode(
            payload,
            Limits {
                max_decompressed_bytes,
                ..limits
            },
        )
    };
    let decoded = super::decoding::within_limits(
        &state.decodes,
        limits.max_decompressed_bytes,
        decode_with,
        |err| matches!(err, DecodeError::Wire(WireError::TooLarge { .. })),
    )
    .await?;

    let project = resolve_project_token(&state, &decoded.token).await?;
    req.extensions_mut().insert(RequestProject(project.id));
    let context = CaptureContext {
        now: Utc::now(),
        sent_at: decoded.sent_at,
        ip: super::client_ip(&req),
        capture_ip: !project.anonymize_ips,
        historical_migration: decoded.historical_migration,
    };
    let events = normalize_all(decoded.events, &context)?;
    if !events.is_empty() {
        state
            .engine
            .ingest
            .submit(WalBatch {
                project_id: project.id,
                historical: decoded.historical_migration,
                events,
            })
            .await?;
    }
    Ok(if beacon {
        HttpResponse::NoContent().finish()
    } else {
        HttpResponse::Ok().json(json!({"status": "Ok"}))
    })
}
