//! Segment writing throughput on one core (criterion): what an ingest flusher does per flush.
//!
//! 65,536 rows shaped like the capture load test's events (two event names, ~450 bytes of
//! properties, a session id), sorted, converted to Arrow with three materialized property
//! columns and written as zstd Parquet. The file goes to `/dev/shm` when it exists, so the
//! figure is encoding work, not the disk. Reported as rows/s.

use std::hint::black_box;

use chrono::{Duration, TimeZone, Utc};
use corvid_events::write_segment;
use corvid_events::StoredEvent;
use corvid_kernel::RealDisk;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use uuid::Uuid;

mod support;

const ROWS: usize = 64 * 1024;

fn rows() -> Vec<StoredEvent> {
    let start = Utc
        .with_ymd_and_hms(2026, 11, 20, 12, 0, 0)
        .single()
        .expect("valid time");
    (0..ROWS)
        .map(|i| {
            let at = start + Duration::milliseconds(i as i64);
            StoredEvent {
                uuid: Uuid::now_v7(),
                event: if i % 3 == 0 {
                    "$pageview"
                } else {
                    "button_clicked"
                }
                .to_string(),
                distinct_id: format!("user-{}", i % 37),
                person_id: Uuid::new_v5(
                    &Uuid::NAMESPACE_OID,
                    format!("user-{}", i % 37).as_bytes(),
                ),
                properties: support::event_properties(i).to_string(),
                person_properties: json!({"email": format!("user-{}@example.com", i % 37)})
                    .to_string()
                    .into(),
                timestamp: at,
                created_at: at,
                project_id: 1,
                groups: [None, None, None, None, None],
                session_id: Some("0193a8a0-47c1-7b8e-9c4e-6b2f6c1d2e3f".to_string()),
                window_id: None,
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rows = rows();
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("temp dir");
    let path = dir.path().join("segment.parquet");
    let materialized = ["$browser", "$os", "$current_url"].map(String::from);
    let mut group = c.benchmark_group("segment_write");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(20);
    group.bench_function("64k_rows_3_materialized", |b| {
        b.iter(|| {
            let mut refs: Vec<&StoredEvent> = rows.iter().rev().collect();
            write_segment(&RealDisk, &path, black_box(&mut refs), &materialized).expect("write");
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
