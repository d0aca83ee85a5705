//! Decode + normalize throughput of capture payloads, per core (criterion).
//!
//! The payload mirrors the HTTP load test: `/batch/` bodies of 100 events of ~500 bytes each,
//! gzipped, as posthog-node sends them. Reported as events/s on one core.
//!
//! With `CAPTURE_BODIES=DIR` it also decodes the varied `/batch/` bodies of the HTTP benchmark
//! of record (`benches/load/make_batch_bodies.py TOKEN DIR` writes `batches.bin` and
//! `batches.idx`), cycling through them.

use std::hint::black_box;
use std::io::Write;

use chrono::Utc;
use corvid_events::{
    decode, normalize_all, CaptureContext as Context, CaptureQuery, Limits, Payload, RouteKind,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;

mod support;

const EVENTS: usize = 100;

/// One `/batch/` body of 100 events of ~500 bytes of JSON each.
pub fn batch_body() -> String {
    let events: Vec<_> = (0..EVENTS)
        .map(|i| {
            json!({
                "event": if i % 3 == 0 { "$pageview" } else { "button_clicked" },
                "distinct_id": format!("user-{}", i % 37),
                "timestamp": "2026-11-20T12:00:00.000Z",
                "properties": support::event_properties(i),
            })
        })
        .collect();
    json!({"api_key": "phc_benchmark_token", "sent_at": "2026-11-20T12:00:01.000Z", "batch": events}).to_string()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

/// The varied gzip bodies in `dir` (see the module's doc): bodies back to back in
/// `batches.bin`, their sizes in `batches.idx` (one a line).
fn varied_bodies(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let all = std::fs::read(dir.join("batches.bin")).expect("batches.bin");
    let idx = std::fs::read_to_string(dir.join("batches.idx")).expect("batches.idx");
    let mut at = 0;
    idx.lines()
        .map(|size| {
            let len: usize = size.trim().parse().expect("a size");
            at += len;
            all[at - len..at].to_vec()
        })
        .collect()
}

/// Decodes and normalizes one body as capture does.
fn decode_normalize(body: &[u8], encoding: Option<&str>, query: &CaptureQuery) -> usize {
    let decoded = decode(
        Payload {
            route: RouteKind::Analytics,
            body: black_box(body),
            query,
            content_type: Some("application/json"),
            content_encoding: encoding,
        },
        Limits::default(),
    )
    .expect("decodes");
    let ctx = Context {
        now: Utc::now(),
        sent_at: decoded.sent_at,
        ip: Some("203.0.113.1".into()),
        capture_ip: true,
        historical_migration: false,
    };
    black_box(normalize_all(decoded.events, &ctx).expect("normalizes")).len()
}

fn bench(c: &mut Criterion) {
    let plain = batch_body();
    let gz = gzip(plain.as_bytes());
    let query = CaptureQuery::default();
    let mut group = c.benchmark_group("capture");
    group.throughput(Throughput::Elements(EVENTS as u64));
    for (name, body, encoding) in [
        ("json", plain.as_bytes().to_vec(), None),
        ("gzip", gz, Some("gzip")),
    ] {
        group.bench_function(format!("decode_normalize_batch100_{name}"), |b| {
            b.iter(|| decode_normalize(&body, encoding, &query))
        });
    }
    if let Some(dir) = std::env::var_os("CAPTURE_BODIES") {
        let bodies = varied_bodies(std::path::Path::new(&dir));
        let mut next = bodies.iter().cycle();
        group.bench_function("decode_normalize_varied_gzip", |b| {
            b.iter(|| decode_normalize(next.next().expect("cycles"), Some("gzip"), &query))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
