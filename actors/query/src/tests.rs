//! HogQL over real segments and a real tail: one test per function family, checked against
//! answers worked out by hand from the fixture below.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::hogql::Bindings;
use super::{QueryEngine, QueryError, QuerySettings, Sources};
use corvid_events::DirCatalog;
use corvid_events::PropertyColumns;
use corvid_events::SegmentFiles;
use corvid_events::StoredEvent;
use corvid_events::{CompactionConfig, Compactor};
use corvid_persons::PersonStore;

use crate::testing::{settings, Fixture};
pub(crate) use corvid_events::testing::event;

/// Six events over two days in segments, two in the tail, one in another project.
pub(crate) fn standard() -> Fixture {
    let segments = vec![
        event(
            1,
            "$pageview",
            "alice",
            "2024-01-01T10:00:00Z",
            json!({"$browser": "Chrome", "price": 10, "plan": "pro"}),
        ),
        event(
            1,
            "$pageview",
            "bob",
            "2024-01-01T11:30:00Z",
            json!({"$browser": "Firefox", "price": "20"}),
        ),
        event(
            1,
            "signup",
            "bob",
            "2024-01-01T12:00:00Z",
            json!({"$browser": "Firefox", "nested": {"a": [1, {"b": "deep"}]}}),
        ),
        event(
            1,
            "$pageview",
            "carol",
            "2024-01-02T09:00:00Z",
            json!({"$browser": "Safari", "price": 5.5}),
        ),
        event(
            1,
            "purchase",
            "alice",
            "2024-01-02T15:45:00Z",
            json!({"$browser": "Chrome", "price": 100, "ok": true}),
        ),
        event(
            1,
            "$pageview",
            "alice",
            "2024-01-02T23:59:59Z",
            json!({"$browser": "Chrome"}),
        ),
        event(
            2,
            "$pageview",
            "mallory",
            "2024-01-01T10:00:00Z",
            json!({"$browser": "Secret"}),
        ),
    ];
    let tail = vec![
        event(
            1,
            "$pageview",
            "dave",
            "2024-01-03T08:00:00Z",
            json!({"$browser": "Chrome", "price": 1}),
        ),
        event(
            1,
            "purchase",
            "dave",
            "2024-01-03T08:05:00Z",
            json!({"price": 7}),
        ),
        event(
            2,
            "purchase",
            "mallory",
            "2024-01-03T08:05:00Z",
            json!({"price": 999}),
        ),
    ];
    Fixture::new(segments, tail)
}

#[test]
fn counts_segments_and_tail_of_one_project_only() {
    let f = standard();
    assert_eq!(f.one("SELECT count() FROM events"), json!(8));
    let rows =
        f.rows("SELECT event, count() AS c FROM events GROUP BY event ORDER BY c DESC, event");
    assert_eq!(
        rows,
        vec![
            vec![json!("$pageview"), json!(5)],
            vec![json!("purchase"), json!(2)],
            vec![json!("signup"), json!(1)],
        ]
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE distinct_id = 'mallory' OR project_id = 2"),
        json!(0)
    );
}

#[test]
fn property_access_forms() {
    let f = standard();
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties.$browser = 'Chrome'"),
        json!(4)
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties['$browser'] = 'Firefox'"),
        json!(2)
    );
    assert_eq!(
        f.one("SELECT properties.nested.a FROM events WHERE event = 'signup'"),
        json!("[1,{\"b\":\"deep\"}]")
    );
    assert_eq!(
        f.one("SELECT person.properties.email FROM events WHERE event = 'signup'"),
        json!("bob@example.com")
    );
    assert_eq!(
        f.one("SELECT e.person.properties.email FROM events e WHERE e.event = 'signup'"),
        json!("bob@example.com")
    );
    assert_eq!(
        f.one(
            "SELECT properties.ok FROM events WHERE event = 'purchase' AND distinct_id = 'alice'"
        ),
        json!("true")
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties.missing IS NULL"),
        json!(8)
    );
}

#[test]
fn property_compared_with_number_is_numeric() {
    let f = standard();
    // 10, "20", 100 (and not 5.5, 1, 7; "9" > "10" as text would differ).
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties.price >= 10"),
        json!(3)
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE 6 < properties.price"),
        json!(4)
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties.price BETWEEN 5 AND 10"),
        json!(3)
    );
}

#[test]
fn aggregate_functions() {
    let f = standard();
    assert_eq!(
        f.one("SELECT countIf(event = 'purchase') FROM events"),
        json!(2)
    );
    assert_eq!(f.one("SELECT uniq(distinct_id) FROM events"), json!(4));
    assert_eq!(f.one("SELECT uniqExact(distinct_id) FROM events"), json!(4));
    assert_eq!(
        f.one("SELECT sumIf(toFloat(properties.price), event = 'purchase') FROM events"),
        json!(107.0)
    );
    assert_eq!(
        f.one("SELECT avgIf(toFloat(properties.price), event = 'purchase') FROM events"),
        json!(53.5)
    );
    assert_eq!(
        f.one("SELECT quantile(0.5)(toFloat(properties.price)) FROM events"),
        json!(8.5)
    );
    assert_eq!(f.one("SELECT count(DISTINCT event) FROM events"), json!(3));
}

/// Segments are sorted by event with small pages, so a filter on `event` skips the other
/// events' pages of every column: the counts must still be exact, also combined with a
/// timestamp range and over a property column.
#[test]
fn event_filters_over_many_pages_count_every_row() {
    let names = [
        "$autocapture",
        "$pageleave",
        "$pageview",
        "signup",
        "zz_rare",
    ];
    let mut expected = std::collections::BTreeMap::new();
    let events: Vec<StoredEvent> = (0..40_000)
        .map(|i| {
            let name = names[[0, 2, 2, 1, 0, 2, 3, 2, 0, 2][i % 10]];
            let name = if i % 997 == 0 { names[4] } else { name };
            let hour = (i * 7) % 24;
            let browser = if i % 3 == 0 { "Chrome" } else { "Safari" };
            *expected.entry((name, hour < 12, browser)).or_insert(0i64) += 1;
            event(
                1,
                name,
                &format!("u{}", i % 300),
                &format!("2024-03-01T{hour:02}:{:02}:00Z", i % 60),
                json!({"$browser": browser}),
            )
        })
        .collect();
    let f = Fixture::new(events, Vec::new());
    for name in names {
        let all: i64 = expected
            .iter()
            .filter(|((n, _, _), _)| *n == name)
            .map(|(_, c)| c)
            .sum();
        let sql = format!("SELECT count() FROM events WHERE event = '{name}'");
        assert_eq!(f.one(&sql), json!(all), "{sql}");
        let morning_chrome = expected.get(&(name, true, "Chrome")).copied().unwrap_or(0);
        let sql = format!(
            "SELECT count() FROM events WHERE event = '{name}' AND properties.$browser = 'Chrome' \
             AND timestamp < toDateTime('2024-03-01 12:00:00')"
        );
        assert_eq!(f.one(&sql), json!(morning_chrome), "{sql}");
    }
    // Grouped by event, the sorted segments arrive in runs that are counted a run at a time
    // (`run_count`): every group's count must still be exact, with and without a filter.
    let grouped = |chrome_only: bool| -> Vec<Vec<serde_json::Value>> {
        names
            .iter()
            .map(|name| {
                let n: i64 = expected
                    .iter()
                    .filter(|((n, _, b), _)| n == name && (!chrome_only || *b == "Chrome"))
                    .map(|(_, c)| c)
                    .sum();
                vec![json!(name), json!(n)]
            })
            .collect()
    };
    assert_eq!(
        f.rows("SELECT event, count() FROM events GROUP BY event ORDER BY event"),
        grouped(false)
    );
    assert_eq!(
        f.rows(
            "SELECT event, count() FROM events WHERE properties.$browser = 'Chrome' \
             GROUP BY event ORDER BY event"
        ),
        grouped(true)
    );
}

/// `uniq` counts hashes rather than values: over several segments, the tail and many groups it
/// must still agree with the exact count, skip nulls and honour `uniqIf`'s condition.
#[test]
fn uniq_agrees_with_exact_counts_across_segments_groups_and_nulls() {
    let names = ["a", "b", "c", "d", "e", "f", "g"];
    let make = |i: usize, day: usize| {
        let props = if i % 5 == 0 {
            json!({})
        } else {
            json!({"plan": format!("p{}", i % 37)})
        };
        event(
            1,
            names[i % names.len()],
            &format!("user-{}", (i * 7919) % 1_013),
            &format!("2024-05-{:02}T{:02}:00:00Z", day + 1, i % 24),
            props,
        )
    };
    let segments: Vec<StoredEvent> = (0..6_000).map(|i| make(i, i % 4)).collect();
    let tail: Vec<StoredEvent> = (6_000..6_500).map(|i| make(i, 5)).collect();
    let f = Fixture::new(segments, tail);
    let grouped = f.rows(
        "SELECT event, uniq(distinct_id), uniqExact(distinct_id), uniq(properties.plan), \
         count(DISTINCT properties.plan), uniqIf(distinct_id, toDayOfMonth(timestamp) < 3), \
         uniqExactIf(distinct_id, toDayOfMonth(timestamp) < 3) FROM events GROUP BY event ORDER BY event",
    );
    assert_eq!(grouped.len(), names.len());
    for row in &grouped {
        assert_eq!(row[1], row[2], "uniq vs exact distinct ids: {row:?}");
        assert_eq!(
            row[3], row[4],
            "uniq skips missing plans like count(DISTINCT): {row:?}"
        );
        assert_eq!(row[5], row[6], "uniqIf vs uniqExactIf: {row:?}");
        assert!(
            row[5].as_i64() < row[1].as_i64(),
            "the condition filters: {row:?}"
        );
    }
    assert_eq!(
        f.one("SELECT uniq(distinct_id) FROM events"),
        f.one("SELECT count(DISTINCT distinct_id) FROM events")
    );
    assert_eq!(
        f.one("SELECT uniq(properties.nothing) FROM events"),
        json!(0)
    );
}

#[test]
fn date_functions() {
    let f = standard();
    let q = |expr: &str| {
        f.one(&format!(
            "SELECT {expr} FROM events WHERE event = 'purchase' AND distinct_id = 'alice'"
        ))
    };
    assert_eq!(q("toDate(timestamp)"), json!("2024-01-02"));
    assert_eq!(q("toStartOfHour(timestamp)"), json!("2024-01-02T15:00:00Z"));
    assert_eq!(q("toStartOfDay(timestamp)"), json!("2024-01-02T00:00:00Z"));
    // 2024-01-02 is a Tuesday: weeks start on Sunday by default, Monday with mode 1.
    assert_eq!(q("toStartOfWeek(timestamp)"), json!("2023-12-31"));
    assert_eq!(q("toStartOfWeek(timestamp, 1)"), json!("2024-01-01"));
    assert_eq!(q("toStartOfMonth(timestamp)"), json!("2024-01-01"));
    assert_eq!(q("toYYYYMM(timestamp)"), json!(202401));
    assert_eq!(
        q("dateDiff('day', toDateTime('2023-12-30 23:00:00'), timestamp)"),
        json!(3)
    );
    assert_eq!(
        q("dateDiff('hour', toDateTime('2024-01-02 14:59:00'), timestamp)"),
        json!(1)
    );
    assert_eq!(
        q("dateDiff('month', toDateTime('2023-11-30 00:00:00'), timestamp)"),
        json!(2)
    );
    assert_eq!(
        q("dateAdd('day', 2, toDate(timestamp))"),
        json!("2024-01-04")
    );
    assert_eq!(
        q("dateSub('hour', 1, timestamp)"),
        json!("2024-01-02T14:45:00Z")
    );
    assert_eq!(
        q("toDateTime('2024-01-02 15:45:00') = timestamp"),
        json!(true)
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE timestamp > toDateTime('2024-01-02 12:00:00') - INTERVAL 1 DAY"),
        json!(5)
    );
    assert_eq!(f.one("SELECT today() = toDate(now())"), json!(true));
    assert_eq!(
        f.one("SELECT count() FROM events WHERE timestamp > now() - INTERVAL 7 DAY"),
        json!(0)
    );
}

#[test]
fn conditional_and_string_functions() {
    let f = standard();
    let rows = f.rows(
        "SELECT distinct_id, if(distinct_id = 'alice', 'a', 'other'), multiIf(distinct_id = 'bob', 1, distinct_id = 'carol', 2, 3) \
         FROM events WHERE event = '$pageview' ORDER BY timestamp LIMIT 3",
    );
    assert_eq!(
        rows,
        vec![
            vec![json!("alice"), json!("a"), json!(3)],
            vec![json!("bob"), json!("other"), json!(1)],
            vec![json!("carol"), json!("other"), json!(2)],
        ]
    );
    assert_eq!(f.one("SELECT coalesce(NULL, 'x')"), json!("x"));
    assert_eq!(
        f.one("SELECT ifNull(properties.nope, 'fallback') FROM events LIMIT 1"),
        json!("fallback")
    );
    assert_eq!(f.one("SELECT lower('AbC') || upper('d')"), json!("abcD"));
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties.$browser LIKE 'Chr%'"),
        json!(4)
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties.$browser ILIKE 'chr%'"),
        json!(4)
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE like(event, '%view')"),
        json!(5)
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE ilike(event, '%VIEW')"),
        json!(5)
    );
}

#[test]
fn json_extract_functions() {
    let f = standard();
    let q = |expr: &str| f.one(&format!("SELECT {expr} FROM events WHERE event = 'signup'"));
    assert_eq!(
        q("JSONExtractString(properties, '$browser')"),
        json!("Firefox")
    );
    assert_eq!(
        q("JSONExtractString(properties, 'nested', 'a', 2, 'b')"),
        json!("deep")
    );
    assert_eq!(q("JSONExtractInt(properties, 'nested', 'a', 1)"), json!(1));
    assert_eq!(
        q("JSONExtractFloat(properties, 'nested', 'a', 1)"),
        json!(1.0)
    );
    assert_eq!(q("JSONExtractString(properties, 'missing')"), json!(""));
    assert_eq!(q("JSONExtractInt(properties, 'missing')"), json!(0));
}

#[test]
fn persons_and_distinct_ids_tables() {
    let f = standard();
    assert_eq!(f.one("SELECT properties.plan FROM persons"), json!("pro"));
    assert_eq!(f.one("SELECT count() FROM person_distinct_ids"), json!(2));
    assert_eq!(
        f.one(
            "SELECT count() FROM events e JOIN person_distinct_ids pdi ON e.distinct_id = pdi.distinct_id \
             JOIN persons p ON p.id = pdi.person_id WHERE p.properties.email = 'alice@example.com'"
        ),
        json!(3)
    );
}

#[test]
fn ctes_subqueries_and_unions() {
    let f = standard();
    assert_eq!(
        f.one("WITH buyers AS (SELECT DISTINCT distinct_id FROM events WHERE event = 'purchase') SELECT count() FROM buyers"),
        json!(2)
    );
    assert_eq!(
        f.one("SELECT count() FROM (SELECT event FROM events UNION ALL SELECT event FROM events)"),
        json!(16)
    );
}

#[test]
fn variables_are_bound_as_literals() {
    let f = standard();
    let mut b = Bindings::default();
    b.variables
        .insert("name".into(), json!("purchase' OR '1'='1"));
    let out = f
        .run_with(
            "SELECT count() FROM events WHERE event = {variables.name}",
            &b,
        )
        .expect("runs");
    assert_eq!(out.rows, vec![vec![json!(0)]]);
    b.variables.insert("name".into(), json!("purchase"));
    b.variables.insert("min".into(), json!(50));
    b.variables.insert("ids".into(), json!(["alice", "dave"]));
    let out = f
        .run_with(
            "SELECT count() FROM events WHERE event = {variables.name} AND properties.price > {variables.min} AND distinct_id IN {variables.ids}",
            &b,
        )
        .expect("runs");
    assert_eq!(out.rows, vec![vec![json!(1)]]);
    let missing = f
        .run("SELECT {variables.nope}")
        .expect_err("missing variable");
    assert_eq!(missing.to_string(), "Variable nope is missing from query");
}

#[test]
fn row_limits_and_has_more() {
    let f = Fixture::with_settings(
        (0..30)
            .map(|i| event(1, "e", &format!("u{i}"), "2024-01-01T00:00:00Z", json!({})))
            .collect(),
        vec![],
        QuerySettings {
            default_rows: 10,
            max_rows: 20,
            ..settings()
        },
    );
    let out = f.run("SELECT distinct_id FROM events").expect("runs");
    assert_eq!((out.rows.len(), out.has_more), (10, true));
    let out = f
        .run("SELECT distinct_id FROM events LIMIT 25")
        .expect("runs");
    assert_eq!((out.rows.len(), out.has_more), (20, true));
    let out = f
        .run("SELECT distinct_id FROM events LIMIT 5")
        .expect("runs");
    assert_eq!((out.rows.len(), out.has_more), (5, true));
    let out = f
        .run("SELECT distinct_id FROM events LIMIT 40 OFFSET 25")
        .expect("runs");
    assert_eq!((out.rows.len(), out.has_more), (5, false));
}

#[test]
fn rejects_what_is_not_a_select() {
    let f = standard();
    for sql in [
        "DROP TABLE events",
        "INSERT INTO events VALUES (1)",
        "CREATE EXTERNAL TABLE x STORED AS PARQUET LOCATION '/etc'",
        "COPY events TO '/tmp/x.parquet'",
        "SELECT 1; SELECT 2",
        "DELETE FROM events",
    ] {
        let err = f.run(sql).expect_err(sql);
        assert!(
            matches!(err, QueryError::Invalid(_) | QueryError::Syntax { .. }),
            "{sql}: {err:?}"
        );
    }
    for sql in [
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM 'events/project=2/day=2024-01-01/s0-1-1.parquet'",
        "SELECT * FROM read_parquet('x.parquet')",
        "SELECT * FROM information_schema.tables",
    ] {
        assert!(f.run(sql).is_err(), "{sql} must fail");
    }
}

#[test]
fn unsupported_function_is_named() {
    let f = standard();
    match f.run("SELECT frobnicate(event) FROM events") {
        Err(QueryError::UnsupportedFunction(name)) => assert_eq!(name, "frobnicate"),
        other => panic!("{other:?}"),
    }
    match f.run("SELECT arrayJoin(['a', 'b'])") {
        Err(QueryError::UnsupportedFunction(name)) => assert!(name.starts_with("arrayJoin")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn syntax_errors_carry_a_position() {
    let f = standard();
    match f.run("SELECT event FROM events WHERE") {
        Err(QueryError::Syntax { line, column, .. }) => assert!(line == 1 && column > 0),
        other => panic!("{other:?}"),
    }
}

#[test]
fn memory_limit_is_a_clear_error() {
    let f = Fixture::with_settings(
        (0..2000)
            .map(|i| {
                event(
                    1,
                    "e",
                    &format!("user-{i}"),
                    "2024-01-01T00:00:00Z",
                    json!({"k": "x".repeat(200)}),
                )
            })
            .collect(),
        vec![],
        QuerySettings {
            memory_limit_bytes: 64 << 10,
            ..settings()
        },
    );
    let err = f
        .run("SELECT distinct_id, properties, count() FROM events GROUP BY distinct_id, properties ORDER BY properties")
        .expect_err("over the limit");
    assert!(matches!(err, QueryError::MemoryLimit { .. }), "{err:?}");
}

/// `[query.datafusion]` options reach every query's session; a bad one stops the engine
/// from being built (so the server refuses to start) instead of failing each query.
#[test]
fn datafusion_options_apply_and_bad_ones_are_refused() {
    let events: Vec<StoredEvent> = (0..100)
        .map(|i| event(1, "e", &format!("u{i}"), "2024-01-01T00:00:00Z", json!({})))
        .collect();
    let f = Fixture::with_settings(
        events,
        vec![],
        QuerySettings {
            datafusion_options: vec![("datafusion.execution.batch_size".into(), "7".into())],
            ..settings()
        },
    );
    assert_eq!(f.one("SELECT count() FROM events"), json!(100));

    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::Config::new()
        .path(dir.path().join("meta"))
        .open()
        .expect("sled");
    for bad in [
        ("datafusion.execution.no_such_option", "1"),
        ("datafusion.execution.batch_size", "many"),
    ] {
        let sources = Sources::new(
            Arc::new(DirCatalog::open(dir.path().join("events")).expect("catalog")),
            Arc::new(SegmentFiles::local(&dir.path().join("events")).expect("files")),
            vec![],
            Arc::new(
                PersonStore::open(&db, corvid_persons::PersonFiles::temporary()).expect("persons"),
            ),
            Arc::new(PropertyColumns::open(&db, vec![]).expect("columns")),
        );
        let settings = QuerySettings {
            datafusion_options: vec![(bad.0.into(), bad.1.into())],
            ..settings()
        };
        let Err(err) = QueryEngine::new(settings, sources) else {
            panic!("{bad:?} accepted");
        };
        assert!(err.to_string().contains(bad.0), "{err}");
    }
}

#[test]
fn timeout_is_reported() {
    let f = Fixture::with_settings(
        vec![],
        vec![],
        QuerySettings {
            timeout: Duration::from_millis(50),
            ..settings()
        },
    );
    let err = f
        .run("SELECT count() FROM generate_series(1, 2000000000) a")
        .expect_err("too slow");
    assert!(matches!(err, QueryError::Timeout(_)), "{err:?}");
}

#[test]
fn types_use_clickhouse_names() {
    let f = standard();
    let out = f
        .run("SELECT event, count() AS c, min(toDate(timestamp)) AS d, max(timestamp) AS timestamp FROM events GROUP BY event LIMIT 1")
        .expect("runs");
    assert_eq!(
        out.types,
        vec![
            ("event".to_string(), "String".to_string()),
            ("c".into(), "Int64".into()),
            ("d".into(), "Date".into()),
            ("timestamp".into(), "DateTime64(6, 'UTC')".into()),
        ]
    );
}

#[test]
fn materialized_property_columns_answer_like_json() {
    let f = standard();
    let sql = "SELECT properties.$browser AS b, count() AS c FROM events GROUP BY b ORDER BY b NULLS FIRST";
    let expected = vec![
        vec![Value::Null, json!(1)],
        vec![json!("Chrome"), json!(4)],
        vec![json!("Firefox"), json!(2)],
        vec![json!("Safari"), json!(1)],
    ];
    let out = f.run(sql).expect("runs");
    assert!(out.sql.contains("\"properties.$browser\""), "{}", out.sql);
    assert_eq!(out.rows, expected);
    // The columns stay internal: `SELECT *` lists the events schema only.
    let star = f.run("SELECT * FROM events LIMIT 1").expect("runs");
    let names: Vec<String> = corvid_events::segment_schema()
        .fields()
        .iter()
        .map(|c| c.name().clone())
        .collect();
    assert_eq!(star.columns, names);
    // Joins see `properties` of several tables: JSON it is, same answer.
    let joined = f
        .run("SELECT properties.$browser AS b, count() AS c FROM events LEFT JOIN person_distinct_ids p ON p.distinct_id = 'none' GROUP BY b ORDER BY b NULLS FIRST")
        .expect("runs");
    assert!(!joined.sql.contains("\"properties.$browser\""));
    assert_eq!(joined.rows, expected);
    // A segment written before `$browser` was materialized: every read goes back to JSON.
    f.add_segment(
        1,
        vec![event(
            1,
            "$pageview",
            "erin",
            "2024-01-01T08:00:00Z",
            json!({"$browser": "Chrome"}),
        )],
        &[],
    );
    let out = f.run(sql).expect("runs");
    assert!(!out.sql.contains("\"properties.$browser\""));
    assert_eq!(out.rows[1], vec![json!("Chrome"), json!(5)]);
    // Compaction backfills the column into a new version of the old segment: fast again,
    // same answer, and the superseded version goes once past its grace period.
    let compactor = Compactor::new(
        Arc::clone(&f.catalog),
        Arc::clone(&f.files),
        Arc::clone(&f.columns),
        CompactionConfig {
            auto_keys: 0,
            min_share: 1.0,
            sample_rows: 0,
            grace: Duration::ZERO,
            erasure: corvid_events::ErasureConfig {
                interval: Duration::from_secs(10),
                settle: Duration::ZERO,
                grace: Duration::ZERO,
                record_ttl: Duration::from_secs(3600),
            },
        },
        corvid_kernel::JobLease::local(Duration::from_secs(60)),
        Arc::clone(&f.persons),
        Vec::new(),
    );
    let report = compactor.run_once().expect("compacts");
    assert_eq!((report.rewritten, report.deleted), (1, 1));
    let out = f.run(sql).expect("runs");
    assert!(out.sql.contains("\"properties.$browser\""));
    assert_eq!(out.rows[1], vec![json!("Chrome"), json!(5)]);
}

#[test]
fn local_buckets_follow_dst_and_calendar() {
    let f = standard();
    let q = |ts: &str, unit: &str, tz: &str| {
        f.one(&format!(
            "SELECT corvid_bucket(toDateTime('{ts}'), '{unit}', '{tz}')"
        ))
    };
    // New York springs forward at 07:00 UTC on 2024-03-10 (01:59 EST → 03:00 EDT).
    assert_eq!(
        q("2024-03-10 06:59:00", "none", "America/New_York"),
        json!("2024-03-10T01:59:00Z")
    );
    assert_eq!(
        q("2024-03-10 07:00:00", "hour", "America/New_York"),
        json!("2024-03-10T03:00:00Z")
    );
    assert_eq!(
        q("2024-03-10 03:00:00", "day", "America/New_York"),
        json!("2024-03-09T00:00:00Z")
    );
    // Kathmandu is UTC+5:45.
    assert_eq!(
        q("2024-03-10 18:20:00", "day", "Asia/Kathmandu"),
        json!("2024-03-11T00:00:00Z")
    );
    // Weeks start on Sunday; months on the 1st.
    assert_eq!(
        q("2024-03-14 12:00:00", "week", "UTC"),
        json!("2024-03-10T00:00:00Z")
    );
    assert_eq!(
        q("2024-03-14 12:00:00", "month", "UTC"),
        json!("2024-03-01T00:00:00Z")
    );
    assert_eq!(
        q("2024-03-01 02:00:00", "month", "America/New_York"),
        json!("2024-02-01T00:00:00Z")
    );
}

#[test]
fn an_empty_project_answers_zero_not_an_error() {
    let f = Fixture::new(vec![], vec![]);
    assert_eq!(f.one("SELECT count() FROM events"), json!(0));
    assert_eq!(
        f.rows("SELECT event FROM events WHERE properties.$browser = 'x'"),
        Vec::<Vec<Value>>::new()
    );
    let out = f
        .query("UTC", json!({"kind": "TrendsQuery", "series": [{"event": "$pageview"}], "dateRange": {"date_from": "2024-01-01", "date_to": "2024-01-02"}}))
        .expect("trend runs");
    assert_eq!(out.results[0]["data"], json!([0, 0]));
    let out = f
        .query("UTC", json!({"kind": "RetentionQuery", "retentionFilter": {"totalIntervals": 2}, "dateRange": {"date_to": "2024-01-02"}}))
        .expect("retention runs");
    assert_eq!(out.results.len(), 2);
}

/// Statements the fuzzer found answered as engine faults: a statement whose materialized
/// columns did not plan (the JSON table was then registered a second time), and errors that
/// DataFusion shares between partitions when segments and the tail are read together.
#[test]
fn the_querys_own_errors_are_its_own_wherever_datafusion_wraps_them() {
    let rows = |n: usize| {
        (0..n)
            .map(|i| {
                event(
                    1,
                    "e",
                    &format!("u{i}"),
                    "2024-01-01T00:00:00Z",
                    json!({"$browser": "Chrome", "n": i}),
                )
            })
            .collect::<Vec<_>>()
    };
    let f = Fixture::new(rows(10), rows(10));
    for sql in [
        "SELECT JSONExtractString(properties.$browser, dateTrunc()) FROM events",
        "SELECT (275 OR timestamp) FROM events WHERE (JSONExtractString(distinct_id, distinct_id, person.properties.plan) / properties.$browser) GROUP BY event",
        "SELECT uniq(toStartOfMonth(distinct_id)) FROM events GROUP BY event LIMIT 0",
        "SELECT ('1e308' || distinct_id) FROM events WHERE (properties.$browser = timestamp)",
        "SELECT (event || 'x') FROM events WHERE (properties.$browser < toStartOfDay(timestamp))",
    ] {
        match f.run(sql) {
            Err(QueryError::Invalid(_) | QueryError::UnsupportedFunction(_)) => {}
            other => panic!("{sql}: {:?}", other.map(|o| o.rows)),
        }
    }
}

/// An erasure hides what it covers from every statement at once: segment rows (JSON and
/// materialized columns, with and without a limit) and tail rows, by person or distinct id,
/// only up to the request's instant.
#[test]
fn erased_events_are_hidden_from_every_statement() {
    let f = standard();
    let erasure = |person: uuid::Uuid, did: &str, at: &str| corvid_persons::Erasure {
        id: uuid::Uuid::new_v4(),
        project_id: 1,
        person_uuid: person,
        distinct_ids: vec![did.into()],
        requested_at: at.parse().expect("time"),
        requested_by: None,
        person_deleted: true,
        events: true,
        verified_at: None,
        events_removed: 0,
    };
    f.persons
        .update_erasures(
            1,
            &[
                // alice by her person id, asked between her second and third event.
                erasure(
                    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, b"alice"),
                    "someone-else",
                    "2024-01-02T20:00:00Z",
                ),
                // dave (whose events are in the tail) by distinct id.
                erasure(uuid::Uuid::new_v4(), "dave", "2024-01-04T00:00:00Z"),
            ],
        )
        .expect("erasures");
    assert_eq!(f.one("SELECT count() FROM events"), json!(4));
    assert_eq!(f.rows("SELECT * FROM events").len(), 4);
    assert_eq!(
        f.rows("SELECT event, count() AS c FROM events GROUP BY event ORDER BY event"),
        vec![
            vec![json!("$pageview"), json!(3)],
            vec![json!("signup"), json!(1)],
        ]
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE properties.$browser = 'Chrome'"),
        json!(1)
    );
    assert_eq!(
        f.one("SELECT distinct_id FROM events ORDER BY timestamp LIMIT 1"),
        json!("bob")
    );
    assert_eq!(
        f.one("SELECT count() FROM events WHERE distinct_id = 'alice'"),
        json!(1),
        "captured after the request"
    );
}

/// Bounds on `timestamp` are applied by the table to the days they cut through only (whole
/// days are read unfiltered): every bound must still count exactly what it admits, in the
/// segments and the tail, under a limit, and together with erasures.
#[test]
fn time_bounds_count_exactly_on_whole_and_cut_days() {
    let at = |i: usize| {
        format!(
            "2024-05-{:02}T{:02}:{:02}:00Z",
            1 + i % 6,
            (i * 7) % 24,
            i % 60
        )
    };
    let make = |i: usize| {
        event(
            1,
            ["a", "b", "c"][i % 3],
            &format!("u{}", i % 50),
            &at(i),
            json!({}),
        )
    };
    let segments: Vec<StoredEvent> = (0..3_000).map(make).collect();
    let tail: Vec<StoredEvent> = (3_000..3_300).map(make).collect();
    let all: Vec<String> = (0..3_300).map(at).collect();
    let f = Fixture::new(segments, tail);
    let within = |lo: &str, hi: &str, lo_incl: bool, hi_incl: bool| {
        all.iter()
            .filter(|t| {
                let t = t.as_str();
                (lo.is_empty() || if lo_incl { t >= lo } else { t > lo })
                    && (hi.is_empty() || if hi_incl { t <= hi } else { t < hi })
            })
            .count()
    };
    let iso = |s: &str| format!("{}T{}Z", &s[..10], &s[11..]);
    let cases = [
        ("timestamp >= toDateTime('2024-05-03 00:00:00')", within(&iso("2024-05-03 00:00:00"), "", true, false)),
        ("timestamp > toDateTime('2024-05-03 00:00:00')", within(&iso("2024-05-03 00:00:00"), "", false, false)),
        ("timestamp >= toDateTime('2024-05-03 12:00:00')", within(&iso("2024-05-03 12:00:00"), "", true, false)),
        ("timestamp < toDateTime('2024-05-05 00:00:00')", within("", &iso("2024-05-05 00:00:00"), false, false)),
        ("timestamp <= toDateTime('2024-05-04 21:00:00')", within("", &iso("2024-05-04 21:00:00"), false, true)),
        (
            "timestamp BETWEEN toDateTime('2024-05-02 06:00:00') AND toDateTime('2024-05-05 00:00:00')",
            within(&iso("2024-05-02 06:00:00"), &iso("2024-05-05 00:00:00"), true, true),
        ),
        (
            "toDateTime('2024-05-02 00:00:00') <= timestamp AND timestamp < toDateTime('2024-05-06 00:00:00') AND event = 'a'",
            (0..3_300)
                .filter(|&i| i % 3 == 0)
                .filter(|&i| at(i).as_str() >= "2024-05-02T00:00:00Z" && at(i).as_str() < "2024-05-06T00:00:00Z")
                .count(),
        ),
    ];
    for (condition, expected) in cases {
        assert!(expected > 0, "{condition}");
        let sql = format!("SELECT count() FROM events WHERE {condition}");
        assert_eq!(f.one(&sql), json!(expected), "{sql}");
        // A limit must not be applied before the bound: every row returned is inside it.
        let sql = format!("SELECT timestamp FROM events WHERE {condition} LIMIT 50");
        let inside = f.rows(&format!("SELECT count() FROM (SELECT timestamp, event FROM events WHERE {condition} LIMIT 50) WHERE {condition}"));
        assert_eq!(f.rows(&sql).len(), expected.min(50), "{sql}");
        assert_eq!(inside, vec![vec![json!(expected.min(50))]], "{sql}");
    }
    // With an erasure pending, the bound and the erasure both apply.
    let erasure = corvid_persons::Erasure {
        id: uuid::Uuid::new_v4(),
        project_id: 1,
        person_uuid: uuid::Uuid::new_v4(),
        distinct_ids: vec!["u7".into()],
        requested_at: "2024-06-01T00:00:00Z".parse().expect("time"),
        requested_by: None,
        person_deleted: true,
        events: true,
        verified_at: None,
        events_removed: 0,
    };
    f.persons.update_erasures(1, &[erasure]).expect("erasure");
    let kept = (0..3_300)
        .filter(|&i| i % 50 != 7 && at(i).as_str() >= "2024-05-03T12:00:00Z")
        .count();
    assert_eq!(
        f.one("SELECT count() FROM events WHERE timestamp >= toDateTime('2024-05-03 12:00:00')"),
        json!(kept)
    );
}
