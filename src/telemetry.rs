//! Logging and the canonical per-request log line (which also feeds the HTTP metrics).

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage};
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};
use crate::state::AppState;

/// The project a request acted on, put in the request extensions by the auth extractors so the
/// canonical log line can name it.
#[derive(Debug, Clone, Copy)]
pub struct RequestProject(pub u64);

/// Installs the global tracing subscriber. A second call (tests) keeps the first one.
pub fn init_tracing(log: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Logs go to stderr so stdout carries only command output (e.g. `bootstrap --json`).
    let stderr_is_terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(stderr_is_terminal);
    let _ = match log.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Middleware: records metrics and writes one canonical log line per request.
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let method = req.method().to_string();
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let answered = next.call(req).await;
    let elapsed = started.elapsed();
    // An error answer (a panicking handler's) is rendered by actix after this middleware.
    let (route, status, project) = match &answered {
        Ok(res) => (
            res.request()
                .match_pattern()
                .unwrap_or_else(|| "unmatched".to_string()),
            res.status().as_u16(),
            res.request()
                .extensions()
                .get::<RequestProject>()
                .map(|p| p.0),
        ),
        Err(err) => (
            "unmatched".to_string(),
            err.as_response_error().status_code().as_u16(),
            None,
        ),
    };
    if let Some(state) = state {
        state
            .metrics
            .http_requests
            .with_label_values(&[&method, &route, &status.to_string()])
            .inc();
        state
            .metrics
            .http_latency
            .with_label_values(&[&method, &route])
            .observe(elapsed.as_secs_f64());
    }
    tracing::info!(
        target: "corvid::request",
        method,
        route,
        status,
        project,
        duration_us = elapsed.as_micros() as u64,
        "request"
    );
    answered
}
