//! Endpoints: the list, and an endpoint's page in PostHog's layout: the overview strip,
//! usage (runs, error rate, p50/p95/p99 over the last day), versions with their
//! materialization status, the logs with search, and a live tail.

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use chrono::{Duration, Utc};
use corvid_endpoints::{Endpoint, EndpointVersion, Level, LogQuery, OpsQuery};

use super::{project, render, respond, viewer, Nav, Page, Params};
use crate::error::ApiError;
use crate::state::AppState;

fn when(t: Option<chrono::DateTime<Utc>>) -> String {
    t.map_or_else(
        || "never".into(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

fn materialized(v: Option<&EndpointVersion>) -> String {
    match v.and_then(|v| v.materialization.as_ref()) {
        None => "no".into(),
        Some(m) => format!("{:?}", m.status),
    }
}

struct EndpointRow {
    name: String,
    status: &'static str,
    version: u32,
    materialized: String,
    last_executed: String,
}

#[derive(Template)]
#[template(path = "endpoints.html")]
struct List {
    nav: Nav,
    endpoints: Vec<EndpointRow>,
}

pub async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> HttpResponse {
    respond(build_list(&req, &state, &path).await)
}

async fn build_list(req: &HttpRequest, state: &AppState, raw: &str) -> Page {
    let viewer = viewer(req, state, "endpoint:read").await?;
    let project = project(&viewer, raw)?;
    let all = state.engine.endpoints.list(project.id, None).await?;
    render(&List {
        nav: viewer.nav(project.id, "endpoints"),
        endpoints: all
            .iter()
            .map(|e| EndpointRow {
                name: e.name.clone(),
                status: if e.is_active { "Active" } else { "Inactive" },
                version: e.current_version,
                materialized: materialized(e.latest()),
                last_executed: when(e.last_executed_at),
            })
            .collect(),
    })
}

struct VersionRow {
    version: u32,
    latest: bool,
    status: &'static str,
    materialized: String,
    created_at: String,
    query: String,
}

struct LogRow {
    timestamp: String,
    level: &'static str,
    status: u16,
    duration: String,
    instance: String,
    message: String,
}

struct Usage {
    runs: u64,
    error_rate: String,
    p50: String,
    p95: String,
    p99: String,
    /// Per hour: bar height (tenths of the busiest hour), whether errors happened, a title.
    bars: Vec<(u64, bool, String)>,
}

#[derive(Template)]
#[template(path = "endpoint.html")]
struct Detail {
    nav: Nav,
    name: String,
    status: &'static str,
    current_version: u32,
    last_executed: String,
    created_by: String,
    url: String,
    usage: Usage,
    versions: Vec<VersionRow>,
    search: String,
    level: String,
    hours: i64,
    found: u64,
    logs: Vec<LogRow>,
}

fn ms(v: Option<u64>) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v} ms"))
}

/// The last day's runs of `endpoint`, from its execution log.
async fn usage(state: &AppState, project: u64, endpoint: &Endpoint) -> Result<Usage, ApiError> {
    let now = Utc::now();
    let query = OpsQuery {
        base: LogQuery {
            after: Some(now - Duration::hours(24)),
            before: Some(now),
            limit: 1,
            ..LogQuery::default()
        },
        endpoint: Some(endpoint.id),
        status: None,
        min_duration_ms: None,
        max_duration_ms: None,
        bucket: Some(std::time::Duration::from_secs(3600)),
    };
    let answer = state.engine.endpoints.search_logs(project, query).await?;
    let summary = answer.endpoints.first();
    let busiest = answer
        .buckets
        .iter()
        .map(|b| b.count)
        .max()
        .unwrap_or(0)
        .max(1);
    Ok(Usage {
        runs: answer.total,
        error_rate: summary.map_or_else(
            || "—".into(),
            |s| format!("{:.1} %", s.errors as f64 * 100.0 / s.count.max(1) as f64),
        ),
        p50: ms(summary.and_then(|s| s.latency.p50)),
        p95: ms(summary.and_then(|s| s.latency.p95)),
        p99: ms(summary.and_then(|s| s.latency.p99)),
        bars: answer
            .buckets
            .iter()
            .map(|b| {
                (
                    b.count * 10 / busiest,
                    b.errors > 0,
                    format!(
                        "{}: {} runs, {} errors",
                        b.start.format("%H:%M"),
                        b.count,
                        b.errors
                    ),
                )
            })
            .collect(),
    })
}

pub async fn detail(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    params: Params,
) -> HttpResponse {
    respond(build_detail(&req, &state, &path, &params).await)
}

async fn build_detail(
    req: &HttpRequest,
    state: &AppState,
    (raw_project, name): &(String, String),
    params: &Params,
) -> Page {
    let viewer = viewer(req, state, "endpoint:read").await?;
    let project = project(&viewer, raw_project)?;
    let endpoint = state.engine.endpoints.endpoint(project.id, name).await?;
    let search = params.get("search").cloned().unwrap_or_default();
    let level = params.get("level").cloned().unwrap_or_default();
    let hours: i64 = params
        .get("hours")
        .and_then(|h| h.parse().ok())
        .filter(|h| [1, 24, 168].contains(h))
        .unwrap_or(24);
    let now = Utc::now();
    let logs = state
        .engine
        .endpoints
        .search_logs(
            project.id,
            OpsQuery {
                base: LogQuery {
                    levels: Level::parse(&level).into_iter().collect(),
                    search: Some(search.clone()).filter(|s| !s.is_empty()),
                    after: Some(now - Duration::hours(hours)),
                    before: Some(now),
                    limit: 100,
                    instance_id: None,
                },
                endpoint: Some(endpoint.id),
                status: None,
                min_duration_ms: None,
                max_duration_ms: None,
                bucket: None,
            },
        )
        .await?;
    let latest = endpoint.latest().map(|v| v.version);
    let versions = endpoint
        .versions
        .iter()
        .rev()
        .map(|v| VersionRow {
            version: v.version,
            latest: Some(v.version) == latest,
            status: if v.is_active { "Active" } else { "Inactive" },
            materialized: materialized(Some(v)),
            created_at: when(Some(v.created_at)),
            query: v
                .query
                .get("query")
                .and_then(|q| q.as_str())
                .map_or_else(|| v.query.to_string(), str::to_string),
        })
        .collect();
    render(&Detail {
        nav: viewer.nav(project.id, "endpoints"),
        url: format!(
            "{}/api/projects/{}/endpoints/{}/run",
            state.public_url, project.id, endpoint.name
        ),
        status: if endpoint.is_active {
            "Active"
        } else {
            "Inactive"
        },
        current_version: endpoint.current_version,
        last_executed: when(endpoint.last_executed_at),
        created_by: endpoint.created_by.clone().unwrap_or_else(|| "—".into()),
        usage: usage(state, project.id, &endpoint).await?,
        versions,
        search,
        level,
        hours,
        found: logs.total,
        logs: logs
            .entries
            .iter()
            .map(|e| {
                let f = corvid_endpoints::log_fields(e);
                LogRow {
                    timestamp: e.timestamp.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                    level: match e.level {
                        Level::Info => "INFO",
                        Level::Error => "ERROR",
                    },
                    status: f.status,
                    duration: f.duration_ms.map(|d| d.to_string()).unwrap_or_default(),
                    instance: e.instance_id.to_string().chars().take(8).collect(),
                    message: e.message.clone(),
                }
            })
            .collect(),
        name: endpoint.name,
    })
}
