//! Structured fuzzing through the real server. Generators build what a stranger (or a careless
//! client) can send: hostile LZ-string streams; events with every field the pipeline reads
//! (`timestamp`, `sent_at`, `offset`, `$set`, `distinct_id` of every JSON type) in every
//! encoding; flag definitions with every operator and hostile values, evaluated for hostile
//! persons; insight queries with hostile date ranges, intervals and breakdowns (run, and saved
//! as endpoints); and HogQL. Every case goes decode → normalize → store → evaluate → compile
//! inside the server, and every answer must be a success or a 4xx in the JSON error shape: no
//! 5xx, no dropped connection, and the server still answers at the end.
//!
//! CI runs a budget of about a minute with a fixed seed. A longer run multiplies every
//! generator's cases and explores other seeds:
//! `CORVID_FUZZ_SCALE=50 CORVID_FUZZ_SEED=$RANDOM cargo nextest run --test fuzz`.

mod common;

use std::cell::Cell;
use std::io::Write;

use base64::Engine;
use common::{peak_rss, TestServer};
use corvid_flags::PROPERTY_OPERATORS;
use corvid_kernel::wire::lz64::bomb;
use proptest::prelude::*;
use proptest::test_runner::{
    Config as RunnerConfig, RngAlgorithm, TestCaseError, TestRng, TestRunner,
};
use reqwest::blocking::Response;
use serde_json::{json, Map, Value};

/// Cases of one generator: `base` times `CORVID_FUZZ_SCALE` (1 by default).
fn cases(base: u32) -> u32 {
    let scale: u32 = std::env::var("CORVID_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    base.saturating_mul(scale.max(1))
}

/// A server whose rate limits do not stand in the fuzzer's way (they are tested elsewhere).
fn fuzz_server() -> TestServer {
    let (dir, mut config) = common::fresh();
    let many = std::num::NonZeroU32::new(1_000_000).expect("nonzero");
    config.rate_limits.query_per_key = many;
    config.endpoints.inline_per_minute = 1_000_000;
    config.endpoints.inline_per_hour = 1_000_000;
    config.query.max_concurrent_per_credential = std::num::NonZeroUsize::new(64).expect("nonzero");
    TestServer::start_in(dir, config)
}

/// The generators' seed: fixed, so CI runs the same cases every time, unless
/// `CORVID_FUZZ_SEED` names another (longer runs explore new ground with it).
fn seed() -> u64 {
    std::env::var("CORVID_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn runner(base: u32) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed().to_le_bytes());
    TestRunner::new_with_rng(
        RunnerConfig {
            cases: cases(base),
            failure_persistence: None,
            max_shrink_iters: 64,
            ..RunnerConfig::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// The server answered with a success or a client error in the stable JSON shape.
fn answered(res: reqwest::Result<Response>, what: &str) -> Result<(u16, Value), TestCaseError> {
    let res = res.map_err(|e| TestCaseError::fail(format!("{what}: no answer: {e}")))?;
    let status = res.status().as_u16();
    let retry_after = res.headers().contains_key("retry-after");
    let text = res.text().unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if status >= 500 && !(status == 503 && retry_after) {
        return Err(TestCaseError::fail(format!("{what}: {status} {text}")));
    }
    if status >= 400 {
        let shaped = ["type", "code", "detail", "attr"]
            .iter()
            .all(|k| body.get(*k).is_some());
        let endpoint_shape = body.get("error").is_some();
        if !shaped && !endpoint_shape {
            return Err(TestCaseError::fail(format!(
                "{what}: {status} without the JSON error body: {text}"
            )));
        }
    }
    Ok((status, body))
}

// ---- values ----

/// Text that breaks naive parsing: multi-byte ends, extreme dates, numbers as text.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1é23".to_string()),
        Just("é".to_string()),
        Just("2024-03-01T12:00:00+é".to_string()),
        Just("+262142-12-31T23:59:59Z".to_string()),
        Just("-262143-01-01T00:00:00Z".to_string()),
        Just("9999-12-31T23:59:59.999999999Z".to_string()),
        Just("0000-01-01T00:00:00Z".to_string()),
        Just("2024-13-45T99:99:99Z".to_string()),
        Just("9223372036854775807".to_string()),
        Just("-9223372036854775808".to_string()),
        Just("1e308".to_string()),
        Just("-200000000d".to_string()),
        Just("-9223372036854775807m".to_string()),
        Just("dStart".to_string()),
        Just("all".to_string()),
        Just("1.2.3-beta.1+build".to_string()),
        Just("(".to_string()),
        Just("\u{0}".to_string()),
        Just("x".repeat(3000)),
        "\\PC{0,24}",
        "[0-9]{1,22}[a-zA-Zé]{0,6}",
        "-?[0-9]{1,12}[smhdwqMyY](Start|End)?",
    ]
}

fn hostile_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(i64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(5e-324)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
    ]
}

/// Any JSON value, biased to the hostile.
fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        hostile_number(),
        hostile_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn object_of(values: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    prop::collection::btree_map("[$a-z_]{1,10}", values, 0..5)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>()))
}

// ---- capture ----

fn event() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just(json!("$pageview")),
            Just(json!("$identify")),
            Just(json!("$groupidentify")),
            Just(json!("$feature_flag_called")),
            hostile_value()
        ],
        hostile_value(),
        prop::option::of(hostile_value()),
        prop::option::of(hostile_value()),
        prop::option::of(object_of(hostile_value())),
        prop::option::of(object_of(hostile_value())),
        prop::option::of(prop_oneof![
            Just(json!(uuid::Uuid::now_v7().to_string())),
            hostile_value()
        ]),
    )
        .prop_map(|(name, distinct_id, timestamp, offset, set, props, uuid)| {
            let mut properties = match props {
                Some(Value::Object(map)) => map,
                _ => Map::new(),
            };
            if let Some(set) = set {
                properties.insert("$set".into(), set);
            }
            properties.insert("$process_person_profile".into(), json!(true));
            let mut event =
                json!({"event": name, "distinct_id": distinct_id, "properties": properties});
            if let Some(t) = timestamp {
                event["timestamp"] = t;
            }
            if let Some(o) = offset {
                event["offset"] = o;
            }
            if let Some(u) = uuid {
                event["uuid"] = u;
            }
            event
        })
}

#[derive(Debug, Clone, Copy)]
enum Encoding {
    Json,
    Gzip,
    Base64,
    Lz64,
    Form,
    GetData,
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn send_capture(
    server: &TestServer,
    route: &str,
    payload: &Value,
    encoding: Encoding,
) -> reqwest::Result<Response> {
    let text = payload.to_string();
    let url = server.url(route);
    let client = &server.client;
    match encoding {
        Encoding::Json => client.post(&url).body(text).send(),
        Encoding::Gzip => client
            .post(format!("{url}?compression=gzip-js"))
            .body(gzip(text.as_bytes()))
            .send(),
        Encoding::Base64 => client
            .post(format!("{url}?compression=base64"))
            .body(b64(text.as_bytes()))
            .send(),
        Encoding::Lz64 => client
            .post(format!("{url}?compression=lz64"))
            .body(lz_str::compress_to_base64(text.as_str()))
            .send(),
        Encoding::Form => client
            .post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "data={}&compression=base64",
                url::form_urlencoded::byte_serialize(b64(text.as_bytes()).as_bytes())
                    .collect::<String>()
            ))
            .send(),
        Encoding::GetData => client
            .get(format!(
                "{url}?data={}",
                url::form_urlencoded::byte_serialize(b64(text.as_bytes()).as_bytes())
                    .collect::<String>()
            ))
            .send(),
    }
}

fn encoding() -> impl Strategy<Value = Encoding> {
    prop_oneof![
        Just(Encoding::Json),
        Just(Encoding::Gzip),
        Just(Encoding::Base64),
        Just(Encoding::Lz64),
        Just(Encoding::Form),
        Just(Encoding::GetData),
    ]
}

#[test]
fn capture_answers_every_payload_and_reads_what_it_stored() {
    let server = fuzz_server();
    let token = server.creds.project_token.clone();
    let payload = (
        prop::collection::vec(event(), 1..6),
        prop::option::of(hostile_value()),
        any::<bool>(),
        prop_oneof![
            Just("/batch/"),
            Just("/e/"),
            Just("/i/v0/e/"),
            Just("/capture/"),
            Just("/engage/")
        ],
        encoding(),
    );
    let stored = Cell::new(0u64);
    runner(800)
        .run(&payload, |(events, sent_at, batch, route, encoding)| {
            let body = if batch || events.len() > 1 {
                let mut b = json!({"api_key": token, "batch": events});
                if let Some(s) = sent_at {
                    b["sent_at"] = s;
                }
                b
            } else {
                let mut e = events[0].clone();
                e["api_key"] = json!(token);
                e
            };
            let (status, _) = answered(
                send_capture(&server, route, &body, encoding),
                &format!("capture {route} {encoding:?} {body}"),
            )?;
            prop_assert!(
                [200, 204, 400, 401, 413].contains(&status),
                "capture answered {status}"
            );
            if status == 200 {
                stored.set(stored.get() + 1);
            }
            Ok(())
        })
        .expect("every capture payload is answered");
    assert!(stored.get() > 0, "some payloads are valid and stored");
    // What was stored reads back: the events API (with hostile cursors) and HogQL.
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    runner(40)
        .run(&(hostile_text(), hostile_text()), |(after, before)| {
            let query = format!(
                "/api/projects/{project}/events/?after={}&before={}&limit=5",
                url::form_urlencoded::byte_serialize(after.as_bytes()).collect::<String>(),
                url::form_urlencoded::byte_serialize(before.as_bytes()).collect::<String>()
            );
            let (status, _) = answered(
                server
                    .client
                    .get(server.url(&query))
                    .bearer_auth(&key)
                    .send(),
                &query,
            )?;
            prop_assert!([200, 400].contains(&status), "events API answered {status}");
            Ok(())
        })
        .expect("the events API answers every cursor");
    let res = server.post_json(
        &format!("/api/projects/{project}/query/"),
        Some(&key),
        &json!({"query": {"kind": "HogQLQuery",
            "query": "SELECT event, distinct_id, timestamp, properties, person.properties FROM events ORDER BY timestamp LIMIT 1000"}}),
    );
    assert_eq!(res.status(), 200, "stored hostile events read back");
    assert_eq!(server.health().status(), 200);
}

// ---- LZ-string ----

/// Streams in `compressToBase64`'s alphabet: random ones, truncated valid ones, and bombs
/// whose every code names the entry it defines.
fn lz_stream() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9+/=]{1,400}",
        "\\PC{1,40}".prop_map(|t| {
            let s = lz_str::compress_to_base64(t.as_str());
            let cut = s.len() / 2;
            s[..cut].to_string()
        }),
        (1usize..40_000).prop_map(|codes| bomb(codes, b'{')),
    ]
}

#[test]
fn hostile_lz_string_streams_are_refused_cleanly() {
    let server = fuzz_server();
    let before = peak_rss();
    runner(200)
        .run(
            &(
                lz_stream(),
                prop_oneof![Just("/batch/"), Just("/flags"), Just("/decide")],
            ),
            |(stream, route)| {
                let url = format!("{}?compression=lz64", server.url(route));
                let (status, _) = answered(
                    server.client.post(&url).body(stream.clone()).send(),
                    &format!("lz64 to {route}"),
                )?;
                prop_assert!(
                    [400, 401, 413].contains(&status),
                    "{route} answered {status} to an LZ stream"
                );
                Ok(())
            },
        )
        .expect("every LZ stream is refused with a 4xx");
    // Streams that decode to gigabytes were refused without holding their output; one within
    // the limit (100 MiB) is decoded once, into a buffer of its exact size.
    let grew = peak_rss().saturating_sub(before);
    assert!(grew < 200 << 20, "the process grew by {grew} bytes");
    assert_eq!(server.health().status(), 200);
}

// ---- flags ----

/// Every operator the engine knows, those it reads beside property values, and one it does
/// not know.
fn operators() -> Vec<&'static str> {
    let mut all = PROPERTY_OPERATORS.to_vec();
    all.extend(["in", "not_in", "flag_evaluates_to", "no_such_operator"]);
    all
}

fn property_filter() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("plan"), Just("$browser"), Just("joined"), Just("version"), Just("n")],
        prop::sample::select(operators()),
        hostile_value(),
        prop_oneof![
            Just("person"),
            Just("group"),
            Just("cohort"),
            Just("flag"),
            Just("event")
        ],
    )
        .prop_map(|(key, operator, value, kind)| {
            json!({"key": key, "operator": operator, "value": value, "type": kind, "group_type_index": 0})
        })
}

fn flag_filters() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(
            (
                prop::collection::vec(property_filter(), 0..4),
                prop::option::of(hostile_value()),
                prop::option::of(hostile_value()),
            ),
            1..3,
        ),
        prop::option::of(hostile_value()),
        prop::option::of(hostile_value()),
    )
        .prop_map(|(groups, multivariate, payloads)| {
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(properties, rollout, variant)| {
                    let mut g = json!({"properties": properties});
                    if let Some(r) = rollout {
                        g["rollout_percentage"] = r;
                    }
                    if let Some(v) = variant {
                        g["variant"] = v;
                    }
                    g
                })
                .collect();
            let mut filters = json!({"groups": groups});
            if let Some(m) = multivariate {
                filters["multivariate"] = m;
            }
            if let Some(p) = payloads {
                filters["payloads"] = p;
            }
            filters
        })
}

#[test]
fn flags_with_every_operator_and_hostile_values_evaluate_or_are_refused() {
    let server = fuzz_server();
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let token = server.creds.project_token.clone();
    let created = Cell::new(0u32);
    let n = Cell::new(0u32);
    runner(300)
        .run(&flag_filters(), |filters| {
            n.set(n.get() + 1);
            let n = n.get();
            let (status, _) = answered(
                server
                    .client
                    .post(server.url(&format!("/api/projects/{project}/feature_flags/")))
                    .bearer_auth(&key)
                    .json(&json!({"key": format!("fuzz-{n}"), "filters": filters}))
                    .send(),
                "create flag",
            )?;
            prop_assert!(
                [201, 400].contains(&status),
                "flag create answered {status}"
            );
            if status == 201 {
                created.set(created.get() + 1);
            }
            Ok(())
        })
        .expect("every flag definition is stored or refused");
    assert!(created.get() > 0, "some definitions are valid");
    let request = (
        hostile_value(),
        object_of(hostile_value()),
        prop::option::of(object_of(hostile_value())),
        prop::option::of(object_of(object_of(hostile_value()))),
    );
    runner(300)
        .run(
            &request,
            |(distinct_id, person_properties, groups, group_properties)| {
                let mut body = json!({"token": token, "distinct_id": distinct_id,
                                  "person_properties": person_properties});
                if let Some(g) = groups {
                    body["groups"] = g;
                }
                if let Some(g) = group_properties {
                    body["group_properties"] = g;
                }
                let (status, _) = answered(
                    server
                        .client
                        .post(server.url("/flags?v=2"))
                        .json(&body)
                        .send(),
                    &format!("/flags {body}"),
                )?;
                prop_assert!([200, 400].contains(&status), "/flags answered {status}");
                Ok(())
            },
        )
        .expect("every /flags request is answered");
    let res = server.get(
        &format!("/api/feature_flag/local_evaluation?token={token}"),
        Some(&key),
    );
    assert!(res.status().is_success(), "{}", res.status());
}

// ---- insights and endpoints ----

fn date_range() -> impl Strategy<Value = Value> {
    prop_oneof![
        (
            prop::option::of(hostile_text()),
            prop::option::of(hostile_text())
        )
            .prop_map(|(from, to)| json!({"date_from": from, "date_to": to})),
        hostile_value(),
    ]
}

fn trends_query() -> impl Strategy<Value = Value> {
    (
        date_range(),
        prop_oneof![
            Just(json!("hour")),
            Just(json!("day")),
            Just(json!("week")),
            Just(json!("month")),
            hostile_value()
        ],
        prop::option::of(prop_oneof![
            Just(json!({"breakdown": "$browser", "breakdown_type": "event"})),
            Just(json!({"breakdowns": [{"property": "$os", "type": "event"}, {"property": "plan", "type": "person"}]})),
            object_of(hostile_value()),
        ]),
        prop_oneof![
            Just(json!("total")),
            Just(json!("dau")),
            Just(json!("weekly_active")),
            Just(json!("monthly_active")),
            Just(json!("sum")),
            hostile_value()
        ],
    )
        .prop_map(|(range, interval, breakdown, math)| {
            let mut q = json!({"kind": "TrendsQuery",
                "series": [{"kind": "EventsNode", "event": "$pageview", "math": math, "math_property": "n"}],
                "interval": interval, "dateRange": range});
            if let Some(b) = breakdown {
                q["breakdownFilter"] = b;
            }
            q
        })
}

fn retention_query() -> impl Strategy<Value = Value> {
    (date_range(), hostile_value(), hostile_value()).prop_map(|(range, period, total)| {
        json!({"kind": "RetentionQuery", "dateRange": range,
            "retentionFilter": {"period": period, "totalIntervals": total,
                "targetEntity": {"id": "$pageview", "type": "events"},
                "returningEntity": {"id": "$pageview", "type": "events"}}})
    })
}

#[test]
fn insight_queries_with_hostile_ranges_run_or_are_refused_and_endpoints_too() {
    let server = fuzz_server();
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let today = chrono::Utc::now();
    let events: Vec<Value> = (0..20)
        .map(|i| {
            json!({"event": "$pageview", "distinct_id": format!("u{}", i % 4),
            "timestamp": (today - chrono::Duration::hours(i * 7)).to_rfc3339(),
            "properties": {"$browser": if i % 2 == 0 {"Chrome"} else {"Safari"}, "n": i}})
        })
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    let n = Cell::new(0u32);
    runner(100)
        .run(&prop_oneof![trends_query(), retention_query()], |query| {
            n.set(n.get() + 1);
            let n = n.get();
            let (status, _) = answered(
                server
                    .client
                    .post(server.url(&format!("/api/projects/{project}/query/")))
                    .bearer_auth(&key)
                    .json(&json!({"query": query}))
                    .send(),
                &format!("query {query}"),
            )?;
            prop_assert!([200, 400, 504].contains(&status), "query answered {status}");
            // Saved as an endpoint: refused when it cannot compile, else runnable.
            let (status, _) = answered(
                server
                    .client
                    .post(server.url(&format!("/api/projects/{project}/endpoints/")))
                    .bearer_auth(&key)
                    .json(&json!({"name": format!("fuzz_{n}"), "query": query}))
                    .send(),
                &format!("endpoint {query}"),
            )?;
            prop_assert!(
                [201, 400].contains(&status),
                "endpoint create answered {status}"
            );
            if status == 201 {
                let (status, _) = answered(
                    server
                        .client
                        .post(
                            server.url(&format!("/api/projects/{project}/endpoints/fuzz_{n}/run")),
                        )
                        .bearer_auth(&key)
                        .json(&json!({}))
                        .send(),
                    "endpoint run",
                )?;
                prop_assert!(
                    [200, 400, 429, 504].contains(&status),
                    "run answered {status}"
                );
            }
            Ok(())
        })
        .expect("every insight is answered");
    assert_eq!(server.health().status(), 200);
}

// ---- HogQL ----

fn expression() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("event".to_string()),
        Just("distinct_id".to_string()),
        Just("timestamp".to_string()),
        Just("properties.$browser".to_string()),
        Just("properties.n".to_string()),
        Just("person.properties.plan".to_string()),
        hostile_number().prop_map(|n| n.to_string()),
        hostile_text().prop_map(|t| format!("'{}'", t.replace(['\'', '\\'], ""))),
    ];
    leaf.prop_recursive(3, 16, 3, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(&["+", "-", "*", "/", "%", "=", "<", "AND", "OR", "||"][..]),
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (
                prop::sample::select(
                    &[
                        "toDateTime",
                        "toDate",
                        "toStartOfDay",
                        "toStartOfWeek",
                        "toStartOfMonth",
                        "dateAdd",
                        "dateDiff",
                        "dateTrunc",
                        "substring",
                        "lower",
                        "length",
                        "toInt",
                        "toFloat",
                        "toString",
                        "JSONExtractString",
                        "coalesce",
                        "round",
                        "abs",
                        "if",
                        "replaceAll",
                        "splitByChar",
                        "uniq",
                        "count",
                        "sum",
                        "avg",
                        "min",
                        "max",
                        "argMax",
                        "quantile",
                        "now",
                        "today",
                        "parseDateTime",
                    ][..]
                ),
                prop::collection::vec(inner, 0..4)
            )
                .prop_map(|(f, args)| format!("{f}({})", args.join(", "))),
        ]
    })
}

#[test]
fn hogql_answers_or_refuses_any_statement() {
    let server = fuzz_server();
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let events: Vec<Value> = (0..10)
        .map(|i| json!({"event": "e", "distinct_id": format!("u{i}"), "properties": {"$browser": "Chrome", "n": i}}))
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    let statement = (
        prop::collection::vec(expression(), 1..3),
        prop::option::of(expression()),
        any::<bool>(),
        prop_oneof![
            Just(String::new()),
            hostile_number().prop_map(|n| format!(" LIMIT {n}"))
        ],
    )
        .prop_map(|(select, filter, group, limit)| {
            let mut sql = format!("SELECT {} FROM events", select.join(", "));
            if let Some(f) = filter {
                sql.push_str(&format!(" WHERE {f}"));
            }
            if group {
                sql.push_str(" GROUP BY event");
            }
            sql + &limit
        });
    runner(300)
        .run(&statement, |sql| {
            let (status, _) = answered(
                server
                    .client
                    .post(server.url(&format!("/api/projects/{project}/query/")))
                    .bearer_auth(&key)
                    .json(&json!({"query": {"kind": "HogQLQuery", "query": sql}}))
                    .send(),
                &sql,
            )?;
            prop_assert!([200, 400, 504].contains(&status), "{sql}: {status}");
            Ok(())
        })
        .expect("every statement is answered");
    assert_eq!(server.health().status(), 200);
}
