//! Log search for ops over the project's execution logs: `GET …/logs/search/` (the newest
//! matching lines, a volume histogram, duration percentiles per bucket and per endpoint) and
//! `GET …/logs/tail/`, a live tail over Server-Sent Events that resumes after `Last-Event-ID`.
//! Both take `endpoint` (a name), `level`, `search`, `status` (`504`, `>=500`, `5xx`),
//! `min_duration_ms`, `max_duration_ms`, `after`, `before`, `bucket` and `limit`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use corvid_endpoints::{LogEntry, OpsAnswer, OpsQuery, Percentiles};
use futures_util::stream;
use serde_json::{json, Value};
use uuid::Uuid;

use super::project_route;
use crate::auth::scope::EndpointRead;
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

/// Live tails one node serves at once; past it, 503.
const MAX_TAILS: usize = 64;
/// How often a tail looks for new lines.
const TAIL_POLL: Duration = Duration::from_millis(500);
/// A comment line keeps idle connections (and the proxies between) open.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// Lines one poll of a tail sends at most.
const TAIL_BATCH: usize = 500;

static TAILS: AtomicUsize = AtomicUsize::new(0);

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/logs/search", || web::get().to(search));
    project_route(cfg, "/logs/tail", || web::get().to(tail));
}

/// The query parameters as pairs, and the search they ask for with its endpoint resolved.
async fn ops_query(
    state: &AppState,
    project: u64,
    req: &HttpRequest,
) -> Result<(OpsQuery, HashMap<Uuid, String>), ApiError> {
    let pairs: Vec<(String, String)> =
        web::Query::<Vec<(String, String)>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default();
    let mut query = OpsQuery::from_params(&pairs)?;
    let endpoints = &state.engine.endpoints;
    if let Some((_, name)) = pairs.iter().find(|(k, v)| k == "endpoint" && !v.is_empty()) {
        query.endpoint = Some(endpoints.endpoint(project, name).await?.id);
    }
    let names = endpoints
        .list(project, None)
        .await?
        .into_iter()
        .map(|e| (e.id, e.name))
        .collect();
    Ok((query, names))
}

fn line_json(e: &LogEntry, names: &HashMap<Uuid, String>) -> Value {
    let fields = corvid_endpoints::log_fields(e);
    json!({
        "timestamp": e.timestamp,
        "level": e.level,
        "endpoint_id": e.endpoint_id,
        "endpoint": names.get(&e.endpoint_id),
        "instance_id": e.instance_id,
        "status": fields.status,
        "duration_ms": fields.duration_ms,
        "message": e.message,
    })
}

fn latency_json(p: &Percentiles) -> Value {
    json!({"p50": p.p50, "p95": p.p95, "p99": p.p99})
}

fn answer_json(a: &OpsAnswer, names: &HashMap<Uuid, String>, took_ms: u128) -> Value {
    json!({
        "after": a.after,
        "before": a.before,
        "bucket_seconds": a.bucket.as_secs(),
        "total": a.total,
        "truncated": a.truncated,
        "took_ms": took_ms,
        "histogram": a.buckets.iter().map(|b| json!({
            "start": b.start,
            "count": b.count,
            "errors": b.errors,
            "duration_ms": latency_json(&b.latency),
        })).collect::<Vec<_>>(),
        "endpoints": a.endpoints.iter().map(|s| json!({
            "endpoint_id": s.endpoint_id,
            "endpoint": names.get(&s.endpoint_id),
            "count": s.count,
            "errors": s.errors,
            "error_rate": if s.count == 0 { 0.0 } else { s.errors as f64 / s.count as f64 },
            "duration_ms": latency_json(&s.latency),
        })).collect::<Vec<_>>(),
        "results": a.entries.iter().map(|e| line_json(e, names)).collect::<Vec<_>>(),
    })
}

async fn search(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let started = std::time::Instant::now();
    let project = access.project.id;
    let (query, names) = ops_query(&state, project, &req).await?;
    let answer = state.engine.endpoints.search_logs(project, query).await?;
    Ok(HttpResponse::Ok().json(answer_json(&answer, &names, started.elapsed().as_millis())))
}

/// A tail's place: the last line sent (its time in µs), from `Last-Event-ID`.
fn resume_point(req: &HttpRequest) -> Option<DateTime<Utc>> {
    let id = super::header_string(req, header::HeaderName::from_static("last-event-id"))?;
    let micros: i64 = id.split(':').next()?.parse().ok()?;
    DateTime::from_timestamp_micros(micros)
}

/// One tail's open slot; given back when the stream ends.
struct TailSlot;

impl TailSlot {
    fn take() -> Option<TailSlot> {
        let taken = TAILS.fetch_add(1, Ordering::SeqCst);
        if taken >= MAX_TAILS {
            TAILS.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(TailSlot)
    }
}

impl Drop for TailSlot {
    fn drop(&mut self) {
        TAILS.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Tail {
    state: web::Data<AppState>,
    project: u64,
    query: OpsQuery,
    names: HashMap<Uuid, String>,
    cursor: DateTime<Utc>,
    quiet_since: std::time::Instant,
    first: bool,
    /// An error event was sent: the stream ends.
    done: bool,
    _slot: TailSlot,
}

/// The next chunk of the event stream: new lines as events (`id: <µs>:<instance>`), else a
/// heartbeat comment now and then. A store error ends the stream with an `error` event.
async fn next_chunk(mut tail: Tail) -> Option<(Result<web::Bytes, actix_web::Error>, Tail)> {
    if tail.done {
        return None;
    }
    if tail.first {
        tail.first = false;
        return Some((Ok(web::Bytes::from_static(b"retry: 1000\n\n")), tail));
    }
    loop {
        tokio::time::sleep(TAIL_POLL).await;
        let found = tail
            .state
            .engine
            .endpoints
            .tail_logs(tail.project, tail.query.clone(), tail.cursor)
            .await;
        let lines = match found {
            Ok(lines) => lines,
            Err(err) => {
                tracing::warn!(error = %err, "a log tail could not read the log");
                let event = "event: error\ndata: {\"detail\":\"the log could not be read\"}\n\n";
                tail.done = true;
                return Some((Ok(web::Bytes::from(event)), tail));
            }
        };
        if let Some(last) = lines.last() {
            tail.cursor = last.timestamp;
            tail.quiet_since = std::time::Instant::now();
            let mut out = String::new();
            for e in &lines {
                let id = format!("{}:{}", e.timestamp.timestamp_micros(), e.instance_id);
                let data = line_json(e, &tail.names);
                out.push_str(&format!("id: {id}\nevent: log\ndata: {data}\n\n"));
            }
            return Some((Ok(web::Bytes::from(out)), tail));
        }
        if tail.quiet_since.elapsed() >= HEARTBEAT {
            tail.quiet_since = std::time::Instant::now();
            return Some((Ok(web::Bytes::from_static(b": keep-alive\n\n")), tail));
        }
    }
}

async fn tail(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let (mut query, names) = ops_query(&state, project, &req).await?;
    query.base.limit = query.base.limit.clamp(1, TAIL_BATCH);
    let Some(slot) = TailSlot::take() else {
        return Err(ApiError::Unavailable {
            detail: "Too many live tails are open on this server; retry shortly.",
            retry_after_secs: 5,
        });
    };
    // Without Last-Event-ID a tail starts from now (or the query's `after`).
    let cursor = resume_point(&req)
        .or(query.base.after)
        .unwrap_or_else(Utc::now);
    let tail = Tail {
        state,
        project,
        query,
        names,
        cursor,
        quiet_since: std::time::Instant::now(),
        first: true,
        done: false,
        _slot: slot,
    };
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(stream::unfold(tail, next_chunk)))
}
