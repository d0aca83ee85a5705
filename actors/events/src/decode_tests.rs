//! Tests of the capture decoder: shapes × encodings, every rejection, and no panics on any
//! input (property tests).

use std::io::Write;

use base64::Engine;
use proptest::prelude::*;
use serde_json::json;

use super::decode::*;
use corvid_kernel::wire::WireError;

const TOKEN: &str = "phc_test_token";

/// (what, body, query, content type, content encoding)
type EncodingCase<'a> = (
    &'a str,
    Vec<u8>,
    &'a CaptureQuery,
    Option<&'a str>,
    Option<&'a str>,
);
/// (body, query, content type, content encoding, expected error)
type RejectCase<'a> = (
    &'a [u8],
    CaptureQuery,
    Option<&'a str>,
    Option<&'a str>,
    DecodeError,
);

fn q() -> CaptureQuery {
    CaptureQuery::default()
}

fn decode_body(
    route: RouteKind,
    body: &[u8],
    query: &CaptureQuery,
    content_type: Option<&str>,
    encoding: Option<&str>,
) -> Result<DecodedRequest, DecodeError> {
    decode(
        Payload {
            route,
            body,
            query,
            content_type,
            content_encoding: encoding,
        },
        Limits::default(),
    )
}

fn json_ok(route: RouteKind, body: &serde_json::Value) -> DecodedRequest {
    decode_body(
        route,
        body.to_string().as_bytes(),
        &q(),
        Some("application/json"),
        None,
    )
    .expect("decodes")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sample_batch() -> serde_json::Value {
    json!({"api_key": TOKEN, "historical_migration": false, "sent_at": "2024-03-01T12:00:00Z", "batch": [
        {"event": "$pageview", "properties": {"distinct_id": "u1", "$current_url": "https://x"}},
        {"event": "signup", "distinct_id": 42, "timestamp": "2024-03-01T11:59:00Z", "uuid": "01890000-0000-7000-8000-000000000001"}
    ]})
}

#[test]
fn batch_shape_takes_batch_token_and_sent_at() {
    let d = json_ok(RouteKind::Analytics, &sample_batch());
    assert_eq!(d.token, TOKEN);
    assert_eq!(d.events.len(), 2);
    assert_eq!(d.events[0].distinct_id, "u1");
    assert_eq!(d.events[1].distinct_id, "42", "numbers become strings");
    assert_eq!(
        d.events[1].uuid.map(|u| u.to_string()).as_deref(),
        Some("01890000-0000-7000-8000-000000000001")
    );
    assert_eq!(
        d.sent_at.map(|t| t.to_rfc3339()).as_deref(),
        Some("2024-03-01T12:00:00+00:00")
    );
    assert!(!d.historical_migration);
}

#[test]
fn single_event_array_and_engage_shapes() {
    let single = json!({"event": "e", "api_key": TOKEN, "distinct_id": "d"});
    assert_eq!(json_ok(RouteKind::Analytics, &single).events.len(), 1);
    let array = json!([
        {"event": "a", "properties": {"distinct_id": "d", "token": TOKEN}},
        {"event": "b", "properties": {"distinct_id": "d", "token": TOKEN}}
    ]);
    assert_eq!(json_ok(RouteKind::Legacy, &array).events.len(), 2);
    let engage = json!({"$token": TOKEN, "$distinct_id": "d", "$set": {"name": "Ann"}});
    let d = json_ok(RouteKind::Engage, &engage);
    assert_eq!(d.events[0].event, "$identify");
    assert_eq!(
        d.events[0].set.as_ref().map(|s| s["name"].clone()),
        Some(json!("Ann"))
    );
    let err = decode_body(
        RouteKind::Analytics,
        engage.to_string().as_bytes(),
        &q(),
        None,
        None,
    )
    .expect_err("no event name");
    assert_eq!(err, DecodeError::MissingEventName { index: 0 });
}

#[test]
fn token_precedence_and_validation() {
    // Event-level token, then properties.token.
    let d = json_ok(
        RouteKind::Analytics,
        &json!({"event": "e", "distinct_id": "d", "properties": {"token": TOKEN}}),
    );
    assert_eq!(d.token, TOKEN);
    let d = json_ok(
        RouteKind::Analytics,
        &json!({"event": "e", "distinct_id": "d", "$token": " phc_padded ", "properties": {"token": "phc_other"}}),
    );
    assert_eq!(d.token, "phc_padded");
    let cases = [
        (
            json!({"event": "e", "distinct_id": "d"}),
            DecodeError::NoToken,
        ),
        (
            json!([{"event": "e", "distinct_id": "d", "token": "phc_a"}, {"event": "e", "distinct_id": "d", "token": "phc_b"}]),
            DecodeError::MultipleTokens,
        ),
        (
            json!({"event": "e", "distinct_id": "d", "token": "phx_personal"}),
            DecodeError::InvalidToken {
                reason: "personal_api_key",
            },
        ),
        (
            json!({"event": "e", "distinct_id": "d", "token": "x".repeat(65)}),
            DecodeError::InvalidToken { reason: "too_long" },
        ),
        (
            json!({"event": "e", "distinct_id": "d", "token": "phc_ü"}),
            DecodeError::InvalidToken {
                reason: "not_ascii",
            },
        ),
    ];
    for (body, expected) in cases {
        let err = decode_body(
            RouteKind::Analytics,
            body.to_string().as_bytes(),
            &q(),
            None,
            None,
        )
        .expect_err("rejected");
        assert_eq!(err, expected, "{body}");
        assert_eq!(err.class(), ErrorClass::Unauthorized);
    }
}

#[test]
fn every_encoding_decodes_to_the_same_events() {
    let body = sample_batch().to_string();
    let expected = json_ok(RouteKind::Analytics, &sample_batch());
    let lz = lz_str::compress_to_base64(&body);
    let gz = gzip(body.as_bytes());
    let form_b64 = format!("data={}", b64(body.as_bytes()).replace('+', "%2B"));
    let form_plain = format!(
        "data={}&compression=none",
        body.replace('%', "%25")
            .replace('&', "%26")
            .replace('+', "%2B")
    );
    let form_lz = format!(
        "data={}&compression=lz64",
        lz.replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D")
    );
    let gz_query = CaptureQuery {
        compression: Some("gzip-js".into()),
        ..q()
    };
    let lz_query = CaptureQuery {
        compression: Some("lz64".into()),
        ..q()
    };
    let b64_query = CaptureQuery {
        compression: Some("base64".into()),
        ..q()
    };
    let data_query = CaptureQuery {
        data: Some(b64(body.as_bytes())),
        ..q()
    };
    let form = Some("application/x-www-form-urlencoded");
    let none = q();
    let cases: Vec<EncodingCase> = vec![
        ("gzip by header", gz.clone(), &none, None, Some("gzip")),
        ("gzip by query", gz.clone(), &gz_query, None, None),
        ("gzip by magic bytes", gz.clone(), &none, None, None),
        (
            "lz64 by query",
            lz.clone().into_bytes(),
            &lz_query,
            None,
            None,
        ),
        (
            "base64 body",
            b64(body.as_bytes()).into_bytes(),
            &none,
            None,
            None,
        ),
        (
            "base64 by query hint",
            b64(body.as_bytes()).into_bytes(),
            &b64_query,
            None,
            None,
        ),
        (
            "form with base64 data",
            form_b64.into_bytes(),
            &none,
            form,
            None,
        ),
        (
            "form with plain data",
            form_plain.into_bytes(),
            &none,
            form,
            None,
        ),
        (
            "form with lz64 data",
            form_lz.into_bytes(),
            &none,
            form,
            None,
        ),
        ("data query parameter", Vec::new(), &data_query, None, None),
    ];
    for (what, bytes, query, ct, ce) in cases {
        let got = decode_body(RouteKind::Analytics, &bytes, query, ct, ce)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got, expected, "{what}");
    }
    // Legacy routes also unwrap base64 inside gzip.
    let wrapped = gzip(b64(body.as_bytes()).as_bytes());
    let got = decode_body(RouteKind::Legacy, &wrapped, &q(), None, None).expect("legacy");
    assert_eq!(got, expected);
}

#[test]
fn bad_payloads_get_400s_that_name_the_problem() {
    let cases: Vec<RejectCase> = vec![
        (
            b"",
            q(),
            None,
            None,
            DecodeError::Wire(WireError::EmptyPayload),
        ),
        (
            b"{not json",
            q(),
            None,
            None,
            DecodeError::InvalidJson(String::new()),
        ),
        (b"[]", q(), None, None, DecodeError::NoEvents),
        (b"42", q(), None, None, DecodeError::WrongShape),
        (
            b"\x1f\x8b\x08garbage",
            q(),
            None,
            None,
            DecodeError::Wire(WireError::InvalidGzip(String::new())),
        ),
        (
            b"!!!!",
            CaptureQuery {
                compression: Some("b64".into()),
                ..q()
            },
            None,
            None,
            DecodeError::Wire(WireError::InvalidBase64),
        ),
        (
            b"%%%%",
            CaptureQuery {
                compression: Some("lz64".into()),
                ..q()
            },
            None,
            None,
            DecodeError::Wire(WireError::InvalidLz64),
        ),
        (
            b"ver=1&x=1",
            q(),
            Some("application/x-www-form-urlencoded"),
            None,
            DecodeError::Wire(WireError::InvalidForm),
        ),
        (
            b"plain text",
            q(),
            Some("application/x-www-form-urlencoded"),
            None,
            DecodeError::Wire(WireError::InvalidForm),
        ),
        (
            b"\xff\xfe",
            q(),
            None,
            None,
            DecodeError::Wire(WireError::NotUtf8),
        ),
    ];
    for (body, query, ct, ce, expected) in cases {
        let err = decode_body(RouteKind::Analytics, body, &query, ct, ce).expect_err("rejected");
        assert_eq!(
            variant(&err),
            variant(&expected),
            "{:?} → {err:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(err.class(), ErrorClass::BadRequest);
    }
}

#[test]
fn one_bad_event_rejects_the_request_and_is_named_by_index() {
    let good = json!({"event": "ok", "properties": {"distinct_id": "d"}});
    let cases = [
        (
            json!({"properties": {"distinct_id": "d"}}),
            DecodeError::MissingEventName { index: 2 },
        ),
        (
            json!({"event": "", "properties": {"distinct_id": "d"}}),
            DecodeError::EmptyEventName { index: 2 },
        ),
        (
            json!({"event": "x"}),
            DecodeError::MissingDistinctId { index: 2 },
        ),
        (
            json!({"event": "x", "distinct_id": ""}),
            DecodeError::MissingDistinctId { index: 2 },
        ),
        (
            json!({"event": "x", "distinct_id": null, "properties": {"distinct_id": null}}),
            DecodeError::MissingDistinctId { index: 2 },
        ),
        (
            json!({"event": "x", "distinct_id": "d", "uuid": "not-a-uuid"}),
            DecodeError::InvalidUuid { index: 2 },
        ),
        (
            json!({"event": "x", "distinct_id": "d", "properties": [1]}),
            DecodeError::InvalidField {
                index: 2,
                field: "properties",
                expected: "an object",
            },
        ),
        (
            json!("just a string"),
            DecodeError::EventNotObject { index: 2 },
        ),
    ];
    for (bad, expected) in cases {
        let body = json!({"api_key": TOKEN, "batch": [good, good, bad]});
        let err = decode_body(
            RouteKind::Analytics,
            body.to_string().as_bytes(),
            &q(),
            None,
            None,
        )
        .expect_err("rejected");
        assert_eq!(err, expected);
        assert_eq!(err.event_index(), Some(2));
        assert!(err.to_string().contains("event 2"), "{err}");
    }
}

/// Properties are kept as sent unless capture edits them in place, and are checked as a parse
/// into values would check them either way.
#[test]
fn properties_keep_their_text_unless_capture_edits_them() {
    let text = r#"{"distinct_id":"d","$current_url":"https://x","n":[1.5,{"a":null}]}"#;
    let body = |route: RouteKind, event: &str, props: &str| {
        let body = format!(
            r#"{{"api_key":"{TOKEN}","batch":[{{"event":"{event}","properties":{props}}}]}}"#
        );
        decode_body(route, body.as_bytes(), &q(), None, None).map(|mut d| d.events.remove(0))
    };
    let kept = body(RouteKind::Analytics, "$pageview", text).expect("decodes");
    assert_eq!(kept.distinct_id, "d");
    assert!(
        matches!(&kept.properties, RawProperties::Text { text: t, .. } if t == text),
        "{:?}",
        kept.properties
    );
    for (route, event) in [
        (RouteKind::Engage, "$pageview"),
        (RouteKind::Analytics, "$groupidentify"),
        (RouteKind::Analytics, "$feature_enrollment_update"),
    ] {
        let parsed = body(route, event, text).expect("decodes");
        assert!(
            matches!(parsed.properties, RawProperties::Parsed(_)),
            "{event} on {route:?}"
        );
    }
    for bad in [r#"{"a":1e400}"#, r#"{"a":{"\ud800":1}}"#] {
        assert_eq!(
            body(RouteKind::Analytics, "$pageview", bad).map(|_| ()),
            Err(DecodeError::EventNotObject { index: 0 }),
            "{bad}"
        );
    }
}

#[test]
fn limits_are_enforced_with_413() {
    let limits = Limits {
        max_decompressed_bytes: 10_000,
        max_event_bytes: 1_000,
    };
    let big_event = json!({"api_key": TOKEN, "batch": [{"event": "x", "distinct_id": "d", "properties": {"blob": "y".repeat(2_000)}}]});
    let err = decode(
        Payload {
            route: RouteKind::Analytics,
            body: big_event.to_string().as_bytes(),
            query: &q(),
            content_type: None,
            content_encoding: None,
        },
        limits,
    )
    .expect_err("too big");
    assert_eq!(
        err,
        DecodeError::EventTooLarge {
            limit: 1_000,
            index: 0
        }
    );
    assert!(err.to_string().contains("1000"));
    // A gzip bomb stops at the decompressed limit.
    let bomb = gzip(&vec![b' '; 1_000_000]);
    let err = decode(
        Payload {
            route: RouteKind::Analytics,
            body: &bomb,
            query: &q(),
            content_type: None,
            content_encoding: None,
        },
        limits,
    )
    .expect_err("bomb");
    assert_eq!(err.class(), ErrorClass::TooLarge);
}

#[test]
fn distinct_ids_are_truncated_and_nul_replaced_and_perf_events_dropped() {
    let d = json_ok(
        RouteKind::Analytics,
        &json!({"api_key": TOKEN, "batch": [
            {"event": "x", "distinct_id": format!("a\u{0}{}", "b".repeat(300))},
            {"event": "$performance_event", "distinct_id": "d"}
        ]}),
    );
    assert_eq!(d.events.len(), 1, "$performance_event is dropped silently");
    assert_eq!(d.events[0].distinct_id.chars().count(), 200);
    assert!(d.events[0].distinct_id.starts_with("a\u{FFFD}"));
    // The limit counts characters, not bytes.
    for (sent, kept) in [(150, 150), (200, 200), (250, 200)] {
        let d = json_ok(
            RouteKind::Analytics,
            &json!({"api_key": TOKEN, "batch": [{"event": "x", "distinct_id": "é".repeat(sent)}]}),
        );
        assert_eq!(d.events[0].distinct_id, "é".repeat(kept), "{sent}");
    }
    let d = json_ok(
        RouteKind::Analytics,
        &json!({"api_key": TOKEN, "batch": [{"event": "x", "distinct_id": {"id": 1}}]}),
    );
    assert_eq!(d.events[0].distinct_id, "{\"id\":1}");
}

#[test]
fn historical_flag_and_query_sent_at() {
    let body = json!({"api_key": TOKEN, "historical_migration": true, "batch": [{"event": "x", "distinct_id": "d"}]});
    assert!(json_ok(RouteKind::Analytics, &body).historical_migration);
    let bad = json!({"api_key": TOKEN, "historical_migration": "yes", "batch": [{"event": "x", "distinct_id": "d"}]});
    assert!(decode_body(
        RouteKind::Analytics,
        bad.to_string().as_bytes(),
        &q(),
        None,
        None
    )
    .is_err());
    let query = CaptureQuery::from_pairs([("_", "1709294400000"), ("beacon", "1")]);
    assert!(query.beacon);
    let d = decode_body(
        RouteKind::Analytics,
        json!({"event": "x", "distinct_id": "d", "token": TOKEN})
            .to_string()
            .as_bytes(),
        &query,
        None,
        None,
    )
    .expect("ok");
    assert_eq!(d.sent_at.map(|t| t.timestamp()), Some(1_709_294_400));
    // Seconds (year ≤ 2020 once read as ms) are ignored.
    let query = CaptureQuery::from_pairs([("_", "1709294400")]);
    let d = decode_body(
        RouteKind::Analytics,
        json!({"event": "x", "distinct_id": "d", "token": TOKEN})
            .to_string()
            .as_bytes(),
        &query,
        None,
        None,
    )
    .expect("ok");
    assert_eq!(d.sent_at, None);
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("event".to_string()),
                    Just("distinct_id".to_string()),
                    Just("token".to_string()),
                    Just("batch".to_string()),
                    Just("api_key".to_string()),
                    Just("properties".to_string()),
                    ".{0,6}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512), hint in prop::option::of(prop_oneof![Just("gzip"), Just("lz64"), Just("base64"), Just("nope")])) {
        let query = CaptureQuery { compression: hint.map(str::to_string), ..CaptureQuery::default() };
        for route in [RouteKind::Analytics, RouteKind::Legacy, RouteKind::Engage] {
            for ct in [None, Some("application/x-www-form-urlencoded")] {
                let _ = decode(Payload { route, body: &body, query: &query, content_type: ct, content_encoding: None }, Limits::default());
            }
        }
    }

    #[test]
    fn arbitrary_json_never_panics_and_accepted_events_are_well_formed(value in arb_json()) {
        let text = value.to_string();
        for route in [RouteKind::Analytics, RouteKind::Engage] {
            if let Ok(d) = decode(Payload { route, body: text.as_bytes(), query: &CaptureQuery::default(), content_type: None, content_encoding: None }, Limits::default()) {
                prop_assert!(!d.token.is_empty() && d.token.len() <= 64);
                for e in &d.events {
                    prop_assert!(!e.event.is_empty());
                    prop_assert!(!e.distinct_id.trim().is_empty());
                    prop_assert!(e.distinct_id.chars().count() <= 200);
                }
            }
        }
    }

    #[test]
    fn gzip_round_trips_any_valid_batch(n in 1usize..20, name in "[a-z$]{1,20}") {
        let events: Vec<_> = (0..n).map(|i| json!({"event": name, "distinct_id": format!("u{i}")})).collect();
        let body = json!({"api_key": TOKEN, "batch": events}).to_string();
        let d = decode(Payload { route: RouteKind::Analytics, body: &gzip(body.as_bytes()), query: &CaptureQuery::default(), content_type: None, content_encoding: Some("gzip") }, Limits::default()).expect("decodes");
        prop_assert_eq!(d.events.len(), if name == "$performance_event" { 0 } else { n });
    }
}

/// The variant path of an error (`Wire(InvalidGzip(`), without its data.
fn variant(err: &DecodeError) -> String {
    let debug = format!("{err:?}");
    debug
        .split(['{', '"'])
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The properties object is read where the event's walk finds it: members after it, white
/// space around it and brackets inside its strings change nothing.
#[test]
fn properties_anywhere_in_the_event_keep_their_text() {
    let props = r#"{"s":"}{][\"\\","n":{"a":[{}]},"distinct_id":"p"}"#;
    for event in [
        format!(r#"{{"properties":{props},"event":"e","distinct_id":"d"}}"#),
        format!(r#"{{ "event" : "e", "properties" :  {props}  , "distinct_id":"d" }}"#),
        format!(r#"{{"properties":{{"x":1}},"event":"e","properties":{props},"distinct_id":"d"}}"#),
    ] {
        let body = format!(r#"{{"api_key":"{TOKEN}","batch":[{event}]}}"#);
        let mut decoded =
            decode_body(RouteKind::Analytics, body.as_bytes(), &q(), None, None).expect(&event);
        let decoded = decoded.events.remove(0);
        assert_eq!(decoded.distinct_id, "d", "{event}");
        assert!(
            matches!(&decoded.properties, RawProperties::Text { text, .. } if text == props),
            "{event}: {:?}",
            decoded.properties
        );
    }
}

/// The one-pass reading of a body takes exactly what parsing it first takes, and gives the
/// same events; whatever it leaves is read the long way. Each body below is a valid batch
/// changed in one place.
#[test]
fn the_one_pass_reading_takes_only_what_a_parse_takes() {
    let event = |i: usize| {
        format!(
            r#"{{"event":"e{i}","distinct_id":"d{i}","uuid":"0193a8a0-47c1-7b8e-9c4e-6b2f6c1d2e3{i}","properties":{{"$browser":"Chrome","n":[1,{{"a":null}}],"$set":{{"plan":"pro"}},"s":"x\"y"}},"timestamp":"2026-11-20T12:00:00Z","extra":{{"k":[true,false]}}}}"#
        )
    };
    let events = (0..3).map(event).collect::<Vec<_>>().join(",");
    let batch = format!(
        r#"{{"api_key":"{TOKEN}","sent_at":"2026-11-20T12:00:01Z","batch":[{events}],"other":[1,2]}}"#
    );
    let array = format!(
        r#"[{}]"#,
        event(0).replacen('{', &format!(r#"{{"token":"{TOKEN}","#), 1)
    );
    let mut bodies = vec![
        batch.clone(),
        array.clone(),
        format!(" \n{batch}\t\r\n"),
        batch.replace(",", " , "),
        batch.replace(":", " :\n"),
        // Not JSON, or not taken by a parse into the request.
        batch.replace(r#","other""#, "\u{c},\"other\""),
        batch.replace(r#""other""#, "\"ot\u{1}her\""),
        batch.replace(r#""extra""#, "\"ex\ttra\""),
        batch.replace(r#""s":"x"#, "\"s\":\"\u{1}x"),
        batch.replace("[1,2]", "1e400"),
        batch.replace("[1,2]", "[1,2,]"),
        batch.replace("[1,2]", "[1,2"),
        batch.replace("[true,false]", "[tru,false]"),
        batch.replace(r#""a":null"#, r#""a":nul"#),
        batch.replace(r#""a":null"#, r#""a":"\ud800""#),
        batch.replace(r#""n":"#, r#""\ud800":"#),
        batch.replace(r#""sent_at""#, r#""api_key":"x","sent_at""#),
        batch.replace(r#""batch":["#, r#""batch":[],"batch":["#),
        batch.replace(r#""batch":["#, r#""batch":[7,"#),
        batch.replace(r#""batch":["#, r#""batch":null,"x":["#),
        format!("{batch}x"),
        format!("{batch},"),
        format!("{array}]"),
        batch.replacen("}", "}}", 1),
        batch.replace(r#""distinct_id":"d1","#, ""),
        batch.replace(r#""other""#, r#""historical_migration":1,"other""#),
        array.replace(r#""token""#, r#""token":"phc_other","token""#),
    ];
    for i in 0..batch.len() {
        if batch.is_char_boundary(i) && i % 7 == 0 {
            bodies.push(batch[..i].to_string());
        }
    }
    let mut walked = 0;
    for body in &bodies {
        let trimmed = body.trim_start();
        let long = parse_parsed(trimmed, RouteKind::Analytics, &q(), Limits::default());
        if let Some(one_pass) = parse_walked(trimmed, RouteKind::Analytics, &q(), Limits::default())
        {
            walked += 1;
            assert_eq!(Ok(one_pass), long, "{body}");
        }
    }
    assert_eq!(walked, 5, "the valid bodies are read in one pass");
}
