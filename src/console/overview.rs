//! The overview: this node's ingest (rate, queue, WAL, flush lag, shards), its overload
//! answers, the event storage per project, the cluster's live nodes, and this node's
//! background jobs.

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;

use super::{render, respond, viewer, Nav, Page};
use crate::error::ApiError;
use crate::state::AppState;

pub struct JobRow {
    pub name: &'static str,
    pub scope: &'static str,
    pub runs: u64,
    pub failures: u64,
    pub last_run: String,
    pub last_error: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct Overview {
    nav: Nav,
    ingest_rate: String,
    overloaded: u64,
    throttled: u64,
    /// project name, id, segment files, bytes (as text).
    storage: Vec<(String, u64, u64, String)>,
    /// node id, seconds since its heartbeat, whether it is this node.
    nodes: Vec<(String, i64, bool)>,
    pending_events: usize,
    wal_last_seq: u64,
    flush_lag: u64,
    fsync_mean: String,
    events_stored: u64,
    flush_failures: u64,
    /// shard, buffered rows, buffered bytes, processed seq, lag, segments, stored.
    shards: Vec<(usize, usize, usize, u64, u64, u64, u64)>,
    jobs: Vec<JobRow>,
}

pub async fn page(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    respond(build(&req, &state).await)
}

async fn build(req: &HttpRequest, state: &AppState) -> Page {
    let viewer = viewer(req, state, "project:read").await?;
    let stats = state
        .engine
        .stats()
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!(e)))?;
    let shards: Vec<_> = stats
        .shards
        .iter()
        .map(|s| {
            let lag = stats.wal_last_seq.saturating_sub(s.processed_seq);
            (
                s.shard,
                s.buffered_rows,
                s.buffered_bytes,
                s.processed_seq,
                lag,
                s.segments_written,
                s.events_stored,
            )
        })
        .collect();
    let jobs = state
        .engine
        .job_reports()
        .into_iter()
        .map(|j| JobRow {
            name: j.name,
            scope: match j.scope {
                corvid_engine::JobScope::EveryNode => "every node",
                corvid_engine::JobScope::OneNode => "one node",
            },
            runs: j.runs,
            failures: j.failures,
            last_run: j
                .last_run_at
                .map_or_else(|| "—".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string()),
            last_error: j.last_error.unwrap_or_default(),
        })
        .collect();
    let accepted =
        stats.shards.iter().map(|s| s.events_stored).sum::<u64>() + stats.pending_events as u64;
    let ingest_rate = state
        .metrics
        .ingest_rate(accepted)
        .map_or_else(|| "— (reload)".into(), |r| format!("{r:.1} events/s"));
    let mut nav = viewer.nav(viewer.first_project(), "overview");
    nav.section = "overview";
    let storage = state
        .engine
        .ingest
        .storage_by_project()
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!(e)))?
        .into_iter()
        .filter_map(|p| {
            let (_, name) = nav.projects.iter().find(|(id, _)| *id == p.project)?;
            Some((name.clone(), p.project, p.files, bytes(p.bytes)))
        })
        .collect();
    let now = chrono::Utc::now();
    let nodes = state
        .engine
        .nodes()
        .await?
        .into_iter()
        .map(|n| {
            (
                n.node_id,
                (now - n.seen_at).num_seconds().max(0),
                n.this_node,
            )
        })
        .collect();
    render(&Overview {
        nodes,
        ingest_rate,
        overloaded: state.metrics.answers_with_status(503),
        throttled: state.metrics.answers_with_status(429),
        storage,
        pending_events: stats.pending_events,
        wal_last_seq: stats.wal_last_seq,
        flush_lag: shards.iter().map(|s| s.4).max().unwrap_or(0),
        fsync_mean: if stats.wal_fsync.count == 0 {
            "—".into()
        } else {
            format!(
                "{:.2} ms",
                stats.wal_fsync.sum_seconds * 1000.0 / stats.wal_fsync.count as f64
            )
        },
        events_stored: stats.shards.iter().map(|s| s.events_stored).sum(),
        flush_failures: stats.shards.iter().map(|s| s.flush_failures).sum(),
        shards,
        jobs,
        nav,
    })
}

/// A byte count in binary units.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
