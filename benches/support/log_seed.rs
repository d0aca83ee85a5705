//! Fills a stopped node's execution log with realistic run lines, for the log-search benchmark
//! (`benches/load/log_search.sh`), and writes the same lines as CSV for DuckDB.
//!
//! Lines are spread evenly over the last `days` days, oldest first, across the given endpoints
//! (the first busiest), the way the run path writes them: successes with their path, cache,
//! duration, rows and version; about 1.5 % failures with their error, duration and status.
//! Durations are long-tailed (most runs a few ms, some seconds). Appends go through the store's
//! own writer, a few hundred lines per endpoint at a time, as the writer thread hands them over.
//!
//! Usage: corvid-log-seed <node data dir>/meta <project id> <endpoint uuid,…> <entries> <days> <csv out>

use std::io::Write;

use chrono::{Duration, Utc};
use corvid_endpoints::{ExecutionLogRecords, Level, LogEntry, SledExecutionLog};
use uuid::Uuid;

/// A small deterministic generator (xorshift64*), so every run seeds the same lines.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A run's duration: log-normal around a few ms when cached and tens when inline, and one run
/// in a hundred in a tail of 1 to 30 seconds.
fn duration_ms(rng: &mut Rng, cached: bool) -> u64 {
    if rng.unit() < 0.01 {
        return 1000 + (rng.unit() * 29_000.0) as u64;
    }
    let base = if cached { 3.0 } else { 40.0 };
    // About normal: the sum of four uniforms, centred.
    let z = (0..4).map(|_| rng.unit()).sum::<f64>() - 2.0;
    (base * (1.2 * z).exp()).round() as u64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, db, project, endpoints, entries, days, csv] = args.as_slice() else {
        eprintln!(
            "usage: corvid-log-seed <meta dir> <project> <endpoint,…> <entries> <days> <csv>"
        );
        std::process::exit(2);
    };
    let project: u64 = project.parse()?;
    let endpoints: Vec<Uuid> = endpoints
        .split(',')
        .map(Uuid::parse_str)
        .collect::<Result<_, _>>()?;
    let entries: u64 = entries.parse()?;
    let days: i64 = days.parse()?;
    let db = sled::Config::new().path(db).open()?;
    let store = SledExecutionLog::open(&db)?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(csv)?);
    writeln!(out, "ts_us,endpoint,level,status,duration_ms,message")?;
    let end = Utc::now() - Duration::minutes(1);
    let start = end - Duration::days(days);
    let step_us = (end - start).num_microseconds().unwrap_or(1) as f64 / entries as f64;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let per_append = 512 * endpoints.len();
    let mut batch = Vec::with_capacity(per_append);
    for i in 0..entries {
        // Endpoint k gets a share falling with k: the first is the busiest.
        let pick = rng.unit().powi(2);
        let endpoint =
            endpoints[((pick * endpoints.len() as f64) as usize).min(endpoints.len() - 1)];
        let timestamp = start + Duration::microseconds((i as f64 * step_us) as i64);
        let materialized = rng.unit() < 0.7;
        let path = if materialized {
            "materialized"
        } else {
            "inline"
        };
        let cached = rng.unit() < 0.6;
        let duration = duration_ms(&mut rng, cached);
        let version = 1 + rng.next() % 4;
        let (level, status, message) = if rng.unit() < 0.015 {
            let (error, status) = match rng.next() % 10 {
                0..=5 => ("Timeout", 504),
                6..=8 => ("QueryFailed", 500),
                _ => ("MemoryLimit", 503),
            };
            (
                Level::Error,
                status,
                format!("Endpoint execution failed · path={path} version={version} error={error} duration_ms={duration} status={status}"),
            )
        } else {
            (
                Level::Info,
                200,
                format!(
                    "Endpoint executed · path={path} cache={} duration_ms={duration} rows={} version={version}",
                    if cached { "hit" } else { "miss" },
                    rng.next() % 500
                ),
            )
        };
        writeln!(
            out,
            "{},{endpoint},{},{status},{duration},\"{message}\"",
            timestamp.timestamp_micros(),
            if level == Level::Error {
                "ERROR"
            } else {
                "INFO"
            },
        )?;
        batch.push(LogEntry {
            project_id: project,
            endpoint_id: endpoint,
            instance_id: Uuid::from_u64_pair(rng.next(), rng.next()),
            timestamp,
            level,
            message,
        });
        if batch.len() == per_append {
            store.append(std::mem::take(&mut batch))?;
        }
        if i % 1_000_000 == 999_999 {
            eprintln!("{} lines", i + 1);
        }
    }
    store.append(batch)?;
    out.flush()?;
    db.flush()?;
    Ok(())
}
