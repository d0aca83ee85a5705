//! The overview: this node's ingest (queue, WAL, flush lag, shards) and its background jobs.

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
    let mut nav = viewer.nav(viewer.first_project(), "overview");
    nav.section = "overview";
    render(&Overview {
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
