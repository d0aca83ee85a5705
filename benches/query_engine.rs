//! Query engine over stored segments (criterion): the three queries of the query issue on a
//! generated data set of `CORVID_BENCH_EVENTS` events (default 10 million: 30 event names,
//! 500 k users, 30 days, ~400-byte JSON properties), written once as real segments with the
//! default materialized property columns and reused across runs.
//!
//! Data lives in `CORVID_BENCH_DATA` (default `target/bench-data/query-<events>`);
//! `benches/load/duckdb_query.py` runs the same queries with DuckDB over the same files.
//!
//! `cargo bench --bench query_engine`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use corvid_events::{
    write_committed, DirCatalog, PropertyColumns, SegmentCatalog, SegmentFiles, SegmentName,
    SegmentRef, StoredEvent, Tail,
};
use corvid_persons::PersonStore;
use corvid_query::{prepare_user_sql, Bindings, QueryEngine, QueryKind, QuerySettings, Sources};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use uuid::Uuid;

const DAYS: i64 = 30;
const USERS: u64 = 500_000;
const BROWSERS: [&str; 8] = [
    "Chrome",
    "Safari",
    "Firefox",
    "Edge",
    "Opera",
    "Samsung Internet",
    "Brave",
    "Vivaldi",
];
const OSES: [&str; 5] = ["Windows", "Mac OS X", "iOS", "Android", "Linux"];
const DEVICES: [&str; 3] = ["Desktop", "Mobile", "Tablet"];
const REFERRERS: [&str; 5] = [
    "$direct",
    "google.com",
    "twitter.com",
    "news.ycombinator.com",
    "bing.com",
];

/// Last day of the data set; the trend covers the 30 days ending here.
fn last_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2024, 6, 30).expect("date")
}

fn event_name(rng: &mut StdRng) -> String {
    match rng.gen_range(0..100) {
        0..=29 => "$pageview".into(),
        30..=49 => "$autocapture".into(),
        50..=54 => "$pageleave".into(),
        _ => format!("event_{}", rng.gen_range(0..27)),
    }
}

fn generate_day(rng: &mut StdRng, day: NaiveDate, count: usize) -> Vec<StoredEvent> {
    let start = Utc
        .from_utc_datetime(&day.and_hms_opt(0, 0, 0).expect("midnight"))
        .timestamp_micros();
    let mut events: Vec<StoredEvent> = (0..count)
        .map(|_| {
            let user = rng.gen_range(0..USERS);
            let distinct_id = format!("user-{user}");
            let page = rng.gen_range(0..200);
            let properties = json!({
                "$browser": BROWSERS[(user % 8) as usize],
                "$os": OSES[(user % 5) as usize],
                "$device_type": DEVICES[(user % 3) as usize],
                "$current_url": format!("https://app.example.com/projects/{page}/dashboard?tab={}", page % 7),
                "$pathname": format!("/projects/{page}/dashboard"),
                "$host": "app.example.com",
                "$referring_domain": REFERRERS[rng.gen_range(0..5)],
                "$lib": "web",
                "$lib_version": "1.190.2",
                "$screen_width": 1920,
                "$screen_height": 1080,
                "$session_id": format!("0190a1b2-{:04x}-7000-8000-{:012x}", user % 65536, user),
                "plan": if user % 10 == 0 { "enterprise" } else { "free" },
                "price": rng.gen_range(0..10_000) as f64 / 100.0,
                "utm_source": "newsletter",
            })
            .to_string();
            let ts = DateTime::<Utc>::from_timestamp_micros(start + rng.gen_range(0..86_400_000_000))
                .expect("timestamp");
            StoredEvent {
                uuid: Uuid::now_v7(),
                event: event_name(rng),
                person_id: Uuid::new_v5(&Uuid::NAMESPACE_OID, distinct_id.as_bytes()),
                distinct_id,
                properties,
                person_properties: json!({"email": format!("user{user}@example.com")})
                    .to_string()
                    .into(),
                timestamp: ts,
                created_at: ts,
                project_id: 1,
                groups: [None, None, None, None, None],
                session_id: None,
                window_id: None,
            }
        })
        .collect();
    events.sort_by_key(|e| e.timestamp);
    events
}

/// Writes the data set unless a complete one is already there.
fn ensure_data(root: &Path, total: usize, materialized: &[String]) {
    let done = root.join("_complete");
    if done.exists() {
        return;
    }
    eprintln!("generating {total} events into {}", root.display());
    let _ = std::fs::remove_dir_all(root);
    let catalog = DirCatalog::open(root.to_path_buf()).expect("events directory");
    let mut rng = StdRng::seed_from_u64(42);
    let per_day = total / DAYS as usize;
    for d in 0..DAYS {
        let day = last_day() - chrono::Duration::days(DAYS - 1 - d);
        let events = generate_day(&mut rng, day, per_day);
        // Two files per day, as two ingest shards would write.
        for (shard, half) in events.chunks(per_day.div_ceil(2)).enumerate() {
            let mut rows: Vec<&StoredEvent> = half.iter().collect();
            let segment = SegmentRef {
                project: 1,
                day,
                name: SegmentName {
                    node: 0,
                    shard,
                    first: 1,
                    last: 1,
                    version: 0,
                },
            };
            write_committed(&catalog, &segment, &mut rows, materialized).expect("segment written");
        }
    }
    std::fs::write(done, b"").expect("marker");
}

fn setup() -> (QueryEngine, tempfile::TempDir) {
    let total: usize = std::env::var("CORVID_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let root = std::env::var("CORVID_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(format!("target/bench-data/query-{total}")));
    let meta = tempfile::tempdir().expect("tempdir");
    let config = corvid::config::Config::for_test(meta.path());
    let materialized = config.ingest.materialized_properties.clone();
    ensure_data(&root, total, &materialized);
    let db = sled::Config::new()
        .path(meta.path().join("meta"))
        .open()
        .expect("sled");
    let files = corvid_persons::PersonFiles::open(&meta.path().join("persons"), 8 << 20)
        .expect("person keyspaces");
    let persons = Arc::new(PersonStore::open(&db, files).expect("persons"));
    let settings = QuerySettings {
        timeout: Duration::from_secs(300),
        ..config.query_settings()
    };
    let engine = QueryEngine::new(
        settings,
        Sources::new(
            Arc::new(DirCatalog::open(root.clone()).expect("events directory"))
                as Arc<dyn SegmentCatalog>,
            Arc::new(SegmentFiles::local(&root).expect("events directory")),
            vec![Arc::new(Tail::default())],
            persons,
            Arc::new(PropertyColumns::fixed(&db, materialized).expect("columns")),
        ),
    )
    .expect("engine");
    (engine, meta)
}

fn bench(c: &mut Criterion) {
    let (engine, _meta) = setup();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let limits = engine.settings().row_limits();
    let sql = |q: &str| {
        let q = q.to_string();
        let engine = &engine;
        let rt = &rt;
        move || {
            let prepared = prepare_user_sql(&q, &Bindings::default(), limits).expect("prepares");
            black_box(rt.block_on(engine.run(1, prepared)).expect("runs"))
        }
    };
    let mut group = c.benchmark_group("query_10m");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    let count_by_event = sql("SELECT event, count() FROM events GROUP BY event");
    group.bench_function("count_group_by_event", |b| b.iter(&count_by_event));
    let trend = || {
        let query: QueryKind = serde_json::from_value(json!({
            "kind": "TrendsQuery",
            "series": [{"kind": "EventsNode", "event": "$pageview"}],
            "interval": "day",
            "dateRange": {"date_from": "2024-06-01", "date_to": "2024-06-30"},
            "breakdownFilter": {"breakdown": "$browser", "breakdown_type": "event"},
        }))
        .expect("query");
        black_box(
            rt.block_on(engine.insight(1, chrono_tz::Tz::UTC, query, &Default::default()))
                .expect("runs"),
        )
    };
    group.bench_function("trend_30d_by_browser", |b| b.iter(trend));
    let distinct_7d = sql(
        "SELECT uniq(person_id) FROM events WHERE timestamp >= toDateTime('2024-06-24 00:00:00')",
    );
    group.bench_function("distinct_users_7d", |b| b.iter(&distinct_7d));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
