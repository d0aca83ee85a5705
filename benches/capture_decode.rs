//! Decode + normalize throughput of capture payloads, per core (criterion).
//!
//! The payload mirrors the HTTP load test: `/batch/` bodies of 100 events of ~500 bytes each,
//! gzipped, as posthog-node sends them. Reported as events/s on one core.

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
            b.iter(|| {
                let decoded = decode(
                    Payload {
                        route: RouteKind::Analytics,
                        body: black_box(&body),
                        query: &query,
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
                black_box(normalize_all(decoded.events, &ctx).expect("normalizes"))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
