//! Execution-log search over one million entries of one endpoint (real sled on disk): the
//! worst case (a search that matches nothing scans every entry), a level filter that matches
//! few, and the first page with no filter.

use std::time::Duration;

use chrono::{TimeZone, Utc};
use corvid_actors::endpoints::logs::{write_now, Level, LogEntry, LogQuery, LogReader};
use criterion::{criterion_group, criterion_main, Criterion};
use uuid::Uuid;

const ENTRIES: usize = 1_000_000;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(512 * 1024 * 1024)
        .open()
        .expect("sled");
    let endpoint = Uuid::new_v4();
    let start = Utc.timestamp_opt(1_750_000_000, 0).single().expect("time");
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..ENTRIES {
        let error = i % 1000 == 0;
        batch.push(LogEntry {
            project_id: 1,
            endpoint_id: endpoint,
            instance_id: Uuid::new_v4(),
            timestamp: start + chrono::Duration::milliseconds(i as i64),
            level: if error { Level::Error } else { Level::Info },
            message: if error {
                "Endpoint execution failed · path=inline version=3 error=query_timeout".to_string()
            } else {
                format!(
                    "Endpoint executed · path=materialized cache=miss duration_ms={} rows={} version=3",
                    i % 40,
                    i % 100
                )
            },
        });
        if batch.len() == 10_000 {
            write_now(&db, &batch).expect("write");
            batch.clear();
        }
    }
    let reader = LogReader::open(&db).expect("reader");
    let search = |q: LogQuery| reader.search(1, endpoint, &q).expect("search");
    // Warm sled's cache as a running server's would be.
    search(LogQuery {
        search: Some("no such text".into()),
        limit: 50,
        ..LogQuery::default()
    });

    let mut group = c.benchmark_group("endpoint_logs_1m");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("search_no_match_full_scan", |b| {
        b.iter(|| {
            search(LogQuery {
                search: Some("error=MemoryLimit".into()),
                limit: 50,
                ..LogQuery::default()
            })
        })
    });
    group.bench_function("level_error_page", |b| {
        b.iter(|| {
            search(LogQuery {
                levels: vec![Level::Error],
                limit: 500,
                ..LogQuery::default()
            })
        })
    });
    group.bench_function("newest_page", |b| {
        b.iter(|| {
            search(LogQuery {
                limit: 50,
                ..LogQuery::default()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
