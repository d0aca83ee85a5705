//! What `/metrics` serves: the HTTP layer's Prometheus registry, followed by the engine's
//! per-component series, read from [`EngineStats`] at scrape time (the engine keeps plain
//! counters and registers nothing itself).

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use corvid_engine::EngineStats;
use corvid_engine::JobReport;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

/// Prometheus metrics of the HTTP layer.
pub struct Metrics {
    pub registry: Registry,
    pub(crate) http_requests: IntCounterVec,
    pub(crate) http_latency: HistogramVec,
    /// Samples of events accepted so far, for the ingest rate over the last minute.
    ingest: Mutex<VecDeque<(Instant, u64)>>,
}

/// How far back the ingest rate looks.
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Most samples kept for it (each console overview adds one).
const RATE_SAMPLES: usize = 256;

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new_custom(Some("corvid".into()), None).unwrap_or_default();
        let requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route and status"),
            &["method", "route", "status"],
        )
        .expect("static metric definition is valid");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "HTTP request latency by route",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ]),
            &["method", "route"],
        )
        .expect("static metric definition is valid");
        // Registering fresh, uniquely named collectors in a fresh registry cannot collide.
        let _ = registry.register(Box::new(requests.clone()));
        let _ = registry.register(Box::new(latency.clone()));
        Metrics {
            registry,
            http_requests: requests,
            http_latency: latency,
            ingest: Mutex::new(VecDeque::new()),
        }
    }

    /// Answers given with `status` since the process started, over every route.
    pub fn answers_with_status(&self, status: u16) -> u64 {
        let status = status.to_string();
        self.registry
            .gather()
            .iter()
            .filter(|f| f.get_name().ends_with("http_requests_total"))
            .flat_map(|f| f.get_metric())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.get_name() == "status" && l.get_value() == status)
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// Events accepted per second over up to the last minute, from `accepted` (events
    /// accepted since start, now) and the samples earlier calls left; `None` on the first.
    pub fn ingest_rate(&self, accepted: u64) -> Option<f64> {
        let now = Instant::now();
        let mut samples = self.ingest.lock().unwrap_or_else(|p| p.into_inner());
        while samples.len() > 1
            && samples
                .get(1)
                .is_some_and(|(at, _)| now.duration_since(*at) >= RATE_WINDOW)
        {
            samples.pop_front();
        }
        let rate = samples.front().and_then(|(at, before)| {
            let secs = now.duration_since(*at).as_secs_f64();
            (secs >= 1.0).then(|| accepted.saturating_sub(*before) as f64 / secs)
        });
        if samples.len() >= RATE_SAMPLES {
            samples.pop_back();
        }
        samples.push_back((now, accepted));
        rate
    }

    /// Prometheus text exposition of every registered metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// What the service's own bounds hold now (`docs/SECURITY.md`), in Prometheus' text format.
pub struct Bounds {
    /// Resolved OAuth clients, logos and remembered failures, and their bytes.
    pub oauth_clients: (usize, u64),
    /// Payload decodes that may start off the event loop now.
    pub decode_permits: usize,
    /// Credentials with queries running now.
    pub query_credentials: usize,
    /// What memory holds of the persons.
    pub persons: corvid_persons::MemoryStats,
}

pub fn render_bounds(b: &Bounds) -> String {
    let mut out = String::new();
    for (name, kind, help, value) in [
        (
            "oauth_client_cache_entries",
            "gauge",
            "Resolved OAuth clients, logos and remembered failures kept in memory.",
            b.oauth_clients.0 as f64,
        ),
        (
            "oauth_client_cache_bytes",
            "gauge",
            "What the OAuth client cache weighs (bounded by oauth.cimd_cache_bytes).",
            b.oauth_clients.1 as f64,
        ),
        (
            "decode_permits_available",
            "gauge",
            "Off-loop payload decodes that may start now (limits.max_concurrent_decodes).",
            b.decode_permits as f64,
        ),
        (
            "query_credentials_running",
            "gauge",
            "Credentials with at least one query running.",
            b.query_credentials as f64,
        ),
        (
            "persons_memory_bytes",
            "gauge",
            "Bytes of persons kept in memory (bounded by memory.persons_bytes).",
            b.persons.bytes as f64,
        ),
        (
            "persons_memory_held",
            "gauge",
            "Distinct ids whose person is in memory.",
            b.persons.held as f64,
        ),
        (
            "persons_memory_on_disk",
            "gauge",
            "Distinct ids whose person is on disk only, past memory.persons_bytes.",
            b.persons.on_disk as f64,
        ),
        (
            "persons_memory_complete",
            "gauge",
            "1 once every stored person is loaded: memory then knows which ids have none.",
            f64::from(u8::from(b.persons.complete)),
        ),
        (
            "persons_disk_reads_total",
            "counter",
            "Persons /flags read from disk (not held in memory).",
            b.persons.disk_reads as f64,
        ),
        (
            "persons_disk_read_batches_total",
            "counter",
            "Trips to the blocking pool those reads took (requests of one event-loop turn share one).",
            b.persons.disk_read_batches as f64,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP corvid_{name} {help}\n# TYPE corvid_{name} {kind}\ncorvid_{name} {value}"
        );
    }
    out
}

/// What each of the engine's periodic jobs did on this node, in Prometheus' text format.
pub fn render_jobs(reports: &[JobReport]) -> String {
    let mut out = String::new();
    type Sample = fn(&JobReport) -> Option<f64>;
    let families: [(&str, &str, &str, Sample); 5] = [
        (
            "job_runs_total",
            "counter",
            "Runs of a periodic job on this node.",
            |r| Some(r.runs as f64),
        ),
        (
            "job_failures_total",
            "counter",
            "Runs of a periodic job that failed or panicked.",
            |r| Some(r.failures as f64),
        ),
        (
            "job_left_to_another_node_total",
            "counter",
            "Periods this node left a one-node job to the node holding its lease.",
            |r| Some(r.left_to_another_node as f64),
        ),
        (
            "job_last_run_timestamp_seconds",
            "gauge",
            "When a periodic job last ran on this node (Unix time).",
            |r| r.last_run_at.map(|t| t.timestamp_millis() as f64 / 1000.0),
        ),
        (
            "job_last_duration_seconds",
            "gauge",
            "How long a periodic job's last run on this node took.",
            |r| r.last_duration.map(|d| d.as_secs_f64()),
        ),
    ];
    for (name, kind, help, sample) in families {
        let _ = writeln!(
            out,
            "# HELP corvid_{name} {help}\n# TYPE corvid_{name} {kind}"
        );
        for report in reports {
            if let Some(value) = sample(report) {
                let _ = writeln!(out, "corvid_{name}{{job=\"{}\"}} {value}", report.name);
            }
        }
    }
    out
}

/// The engine's series in Prometheus' text format (names prefixed `corvid_`).
pub fn render_engine(stats: &EngineStats) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(
            out,
            "# HELP corvid_{name} {help}\n# TYPE corvid_{name} {kind}"
        );
        for (labels, value) in samples {
            let _ = writeln!(out, "corvid_{name}{labels} {value}");
        }
    };
    let plain = |v: f64| vec![(String::new(), v)];
    family(
        "ingest_pending_events",
        "gauge",
        "Events accepted but not yet written to a segment (the ingest queue).",
        &plain(stats.pending_events as f64),
    );
    let lag: Vec<(String, f64)> = stats
        .shards
        .iter()
        .map(|s| {
            let behind = stats.wal_last_seq.saturating_sub(s.processed_seq);
            (format!("{{shard=\"{}\"}}", s.shard), behind as f64)
        })
        .collect();
    family(
        "ingest_shard_lag_records",
        "gauge",
        "WAL records a shard has not processed yet.",
        &lag,
    );
    let buffered: Vec<(String, f64)> = stats
        .shards
        .iter()
        .map(|s| (format!("{{shard=\"{}\"}}", s.shard), s.buffered_rows as f64))
        .collect();
    family(
        "ingest_shard_buffered_events",
        "gauge",
        "Events a shard holds in memory until its next segment flush.",
        &buffered,
    );
    let h = &stats.wal_fsync;
    let mut buckets: Vec<(String, f64)> = h
        .buckets
        .iter()
        .map(|(le, n)| (format!("_bucket{{le=\"{le}\"}}"), *n as f64))
        .collect();
    buckets.push(("_bucket{le=\"+Inf\"}".into(), h.count as f64));
    buckets.push(("_sum".into(), h.sum_seconds));
    buckets.push(("_count".into(), h.count as f64));
    family(
        "wal_fsync_duration_seconds",
        "histogram",
        "Time of each write-ahead-log group sync.",
        &buckets,
    );
    let flags: Vec<(String, f64)> = stats
        .flag_snapshots
        .iter()
        .map(|(project, version)| (format!("{{project=\"{project}\"}}"), *version as f64))
        .collect();
    family(
        "flag_snapshot_version",
        "gauge",
        "Version of a project's in-memory flag snapshot (up by one per rebuild).",
        &flags,
    );
    let m = stats.endpoints.materializer;
    family(
        "materializer_up",
        "gauge",
        "1 while the materializer actor runs.",
        &plain(f64::from(u8::from(m.is_some()))),
    );
    if let Some(m) = m {
        family(
            "materializer_lag_seconds",
            "gauge",
            "How long the most overdue materialized version has waited, at the last scan.",
            &plain(m.lag_seconds),
        );
        family(
            "materializer_due_versions",
            "gauge",
            "Versions due for materialization at the last scan.",
            &plain(m.due as f64),
        );
        family(
            "materializer_running_jobs",
            "gauge",
            "Materializations running now.",
            &plain(m.running as f64),
        );
        family(
            "materializer_jobs_total",
            "counter",
            "Finished materializations by outcome.",
            &[
                ("{outcome=\"completed\"}".into(), m.completed as f64),
                ("{outcome=\"failed\"}".into(), m.failed as f64),
            ],
        );
    }
    let log = stats.endpoints.log;
    family(
        "execution_log_writer_up",
        "gauge",
        "1 while the execution-log actor and its writer thread run.",
        &plain(f64::from(u8::from(log.is_some_and(|l| l.writer_alive)))),
    );
    if let Some(l) = log {
        family(
            "execution_log_queue_entries",
            "gauge",
            "Execution-log entries recorded but not yet written.",
            &plain(l.queued as f64),
        );
        family(
            "execution_log_entries_written_total",
            "counter",
            "Execution-log entries written.",
            &plain(l.written as f64),
        );
        family(
            "execution_log_write_failures_total",
            "counter",
            "Execution-log batches that could not be written.",
            &plain(l.write_failures as f64),
        );
        family(
            "execution_log_dropped_entries_total",
            "counter",
            "Execution-log entries dropped: the write path was full, or their batch failed.",
            &plain(l.dropped as f64),
        );
    }
    out
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_summed_over_routes_by_status() {
        let m = Metrics::new();
        m.http_requests
            .with_label_values(&["POST", "/batch/", "503"])
            .inc_by(2);
        m.http_requests
            .with_label_values(&["POST", "/i/v0/e/", "503"])
            .inc();
        m.http_requests
            .with_label_values(&["POST", "/batch/", "200"])
            .inc_by(7);
        assert_eq!(m.answers_with_status(503), 3);
        assert_eq!(m.answers_with_status(200), 7);
        assert_eq!(m.answers_with_status(429), 0);
    }

    #[test]
    fn the_ingest_rate_needs_a_second_sample_a_second_later() {
        let m = Metrics::new();
        assert_eq!(m.ingest_rate(100), None);
        assert_eq!(m.ingest_rate(150), None, "less than a second apart");
        // An earlier sample, as a call a few seconds ago would have left.
        {
            let mut samples = m.ingest.lock().expect("lock");
            samples.clear();
            samples.push_back((Instant::now() - Duration::from_secs(4), 0));
        }
        let rate = m.ingest_rate(400).expect("rate");
        assert!((rate - 100.0).abs() < 5.0, "{rate}");
    }
}
