//! Capture over real HTTP: routes × encodings, rejections, CORS, historical imports, persons,
//! groups, the events API, durability across restarts, and project isolation.

mod common;

use std::io::Write;

use base64::Engine;
use common::{error_body, fresh, TestServer};
use serde_json::{json, Value};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

const ROUTES: [&str; 12] = [
    "/capture/",
    "/capture",
    "/i/v0/e/",
    "/i/v0/e",
    "/batch/",
    "/batch",
    "/e/",
    "/e",
    "/track/",
    "/track",
    "/engage/",
    "/engage",
];

#[test]
fn every_route_accepts_every_encoding_and_events_are_visible_at_once() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let mut expected = 0;
    for route in ROUTES {
        let name = format!("enc{}", route.replace('/', "_"));
        let single = |tag: &str| {
            json!({"event": format!("{name}-{tag}"), "properties": {"distinct_id": "u-enc", "token": token}}).to_string()
        };
        let json_body = single("json");
        let gz = gzip(single("gzip").as_bytes());
        let lz = lz_str::compress_to_base64(&single("lz64"));
        let based = b64(single("base64").as_bytes());
        let form = format!("data={}", urlencode(&b64(single("form").as_bytes())));
        let query_data = format!("{route}?data={}", urlencode(&single("get")));
        let responses = vec![
            (
                "json",
                server.capture_raw(
                    route,
                    json_body.into_bytes(),
                    &[("content-type", "application/json")],
                ),
            ),
            (
                "gzip",
                server.capture_raw(route, gz.clone(), &[("content-encoding", "gzip")]),
            ),
            (
                "gzip-js",
                server.capture_raw(
                    &format!("{route}?compression=gzip-js"),
                    gzip(single("gzip-js").as_bytes()),
                    &[],
                ),
            ),
            (
                "lz64",
                server.capture_raw(&format!("{route}?compression=lz64"), lz.into_bytes(), &[]),
            ),
            ("base64", server.capture_raw(route, based.into_bytes(), &[])),
            (
                "form",
                server.capture_raw(
                    route,
                    form.into_bytes(),
                    &[("content-type", "application/x-www-form-urlencoded")],
                ),
            ),
            (
                "get",
                server
                    .client
                    .get(server.url(&query_data))
                    .send()
                    .expect("get"),
            ),
        ];
        for (what, res) in responses {
            assert_eq!(res.status(), 200, "{route} {what}");
            let body: Value = res.json().expect("json");
            assert_eq!(body, json!({"status": "Ok"}), "{route} {what}");
            expected += 1;
        }
    }
    let events = server.events(1, "distinct_id=u-enc&limit=1000");
    assert_eq!(
        events.len(),
        expected,
        "acknowledged events are visible immediately"
    );
    for tag in ["json", "gzip", "gzip-js", "lz64", "base64", "form", "get"] {
        assert!(
            events
                .iter()
                .any(|e| e["event"] == format!("enc_batch_-{tag}")),
            "an event sent with {tag} to /batch/ is stored"
        );
    }
}

#[test]
fn engage_becomes_identify_and_beacon_answers_204() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let res = server.post_json(
        "/engage/",
        None,
        &json!({"$token": token, "$distinct_id": "eng", "$set": {"plan": "pro"}}),
    );
    assert_eq!(res.status(), 200);
    let events = server.events(1, "distinct_id=eng");
    assert_eq!(events[0]["event"], "$identify");
    assert_eq!(server.persons(1, "eng")[0]["properties"]["plan"], "pro");

    let res = server.post_json(
        "/i/v0/e/?beacon=1",
        None,
        &json!({"api_key": token, "event": "b", "distinct_id": "x"}),
    );
    assert_eq!(res.status(), 204);
    assert_eq!(res.text().expect("body"), "");
}

/// (what, body, headers, status, text in `detail`, expected `attr`)
type Rejection<'a> = (
    &'a str,
    Vec<u8>,
    Vec<(&'a str, &'a str)>,
    u16,
    &'a str,
    Option<&'a str>,
);

#[test]
fn rejections_have_the_right_status_and_name_the_problem() {
    let (_dir, mut config) = fresh();
    config.limits.max_body_bytes = 64 * 1024;
    config.capture.max_decompressed_bytes = 256 * 1024;
    config.capture.max_event_bytes = 8 * 1024;
    let server = TestServer::start(config);
    let token = server.creds.project_token.clone();
    let ok = json!({"event": "fine", "distinct_id": "d"});
    let cases: Vec<Rejection> = vec![
        ("empty body", vec![], vec![], 400, "missing data payload", None),
        ("bad json", b"{nope".to_vec(), vec![], 400, "failed to parse", None),
        ("empty batch", json!({"api_key": token, "batch": []}).to_string().into_bytes(), vec![], 400, "no event", None),
        ("missing event name", json!({"api_key": token, "batch": [ok, {"distinct_id": "d"}]}).to_string().into_bytes(), vec![], 400, "event 1", Some("events[1]")),
        ("missing distinct_id", json!({"api_key": token, "batch": [ok, ok, {"event": "x"}]}).to_string().into_bytes(), vec![], 400, "distinct_id", Some("events[2]")),
        ("bad uuid", json!({"api_key": token, "batch": [{"event": "x", "distinct_id": "d", "uuid": "zzz"}]}).to_string().into_bytes(), vec![], 400, "uuid", Some("events[0]")),
        ("bad gzip", b"\x1f\x8b\x08\x00junk".to_vec(), vec![("content-encoding", "gzip")], 400, "gzip", None),
        ("bad base64", b"!!!notbase64".to_vec(), vec![], 400, "", None),
        ("bad base64 with hint", b"@@@@".to_vec(), vec![], 400, "", None),
        ("no token", json!({"event": "x", "distinct_id": "d"}).to_string().into_bytes(), vec![], 401, "api_key", None),
        ("unknown token", json!({"event": "x", "distinct_id": "d", "api_key": "phc_unknown"}).to_string().into_bytes(), vec![], 401, "not valid", None),
        ("personal key as token", json!({"event": "x", "distinct_id": "d", "api_key": "phx_abc"}).to_string().into_bytes(), vec![], 401, "personal_api_key", None),
        ("wire limit", vec![b' '; 70 * 1024], vec![], 413, "65536", None),
        ("decompressed limit", gzip(&vec![b' '; 300 * 1024]), vec![("content-encoding", "gzip")], 413, "262144", None),
        ("event limit", json!({"api_key": token, "batch": [ok, {"event": "big", "distinct_id": "d", "properties": {"x": "y".repeat(9000)}}]}).to_string().into_bytes(), vec![], 413, "8192", Some("events[1]")),
    ];
    for (what, body, headers, status, needle, attr) in cases {
        let res = server.capture_raw("/batch/", body, &headers);
        assert_eq!(res.status().as_u16(), status, "{what}");
        let body = error_body(res);
        assert!(
            body["detail"].as_str().expect("detail").contains(needle),
            "{what}: {body}"
        );
        if let Some(attr) = attr {
            assert_eq!(body["attr"], attr, "{what}");
        }
    }
    // Nothing of a rejected request was stored (one bad event rejects the whole request).
    assert!(server.events(1, "event=fine").is_empty());
    assert!(server.events(1, "event=big").is_empty());
}

#[test]
fn cors_preflight_echoes_origin_and_errors_carry_cors_headers() {
    let server = TestServer::new();
    for route in [
        "/e/",
        "/batch",
        "/i/v0/e/",
        "/capture/",
        "/engage",
        "/track/",
    ] {
        let res = server
            .client
            .request(reqwest::Method::OPTIONS, server.url(route))
            .header("origin", "https://shop.example")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type,x-posthog-custom",
            )
            .send()
            .expect("preflight");
        assert_eq!(res.status(), 200, "{route}");
        let h = res.headers();
        assert_eq!(h["access-control-allow-origin"], "https://shop.example");
        assert_eq!(h["access-control-allow-credentials"], "true");
        assert_eq!(
            h["access-control-allow-headers"],
            "content-type,x-posthog-custom"
        );
        assert!(h["access-control-allow-methods"]
            .to_str()
            .expect("ascii")
            .contains("POST"));
    }
    let res = server
        .client
        .post(server.url("/e/"))
        .header("origin", "https://shop.example")
        .body("{bad")
        .send()
        .expect("sent");
    assert_eq!(res.status(), 400);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
}

#[test]
fn historical_imports_need_old_timestamps_and_are_counted_apart() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let old = (chrono::Utc::now() - chrono::Duration::days(30)).to_rfc3339();
    let recent = (chrono::Utc::now() - chrono::Duration::hours(47)).to_rfc3339();
    let body =
        |events: Value| json!({"api_key": token, "historical_migration": true, "batch": events});

    let res = server.post_json(
        "/batch/",
        None,
        &body(json!([
            {"event": "$pageview", "distinct_id": "h1", "timestamp": old},
            {"event": "$pageview", "distinct_id": "h1", "timestamp": recent}
        ])),
    );
    assert_eq!(res.status(), 400);
    let err = error_body(res);
    assert_eq!(err["attr"], "events[1]");
    assert!(
        err["detail"].as_str().expect("detail").contains("48 hours"),
        "{err}"
    );

    let res = server.post_json(
        "/batch/",
        None,
        &body(json!([{"event": "$pageview", "distinct_id": "h1"}])),
    );
    assert_eq!(res.status(), 400, "a timestamp is required");
    let res = server.post_json(
        "/batch/",
        None,
        &body(json!([{"event": "$pageview", "timestamp": old}])),
    );
    assert_eq!(res.status(), 400, "a distinct_id is required");

    let res = server.post_json(
        "/batch/",
        None,
        &body(json!([
            {"event": "$pageview", "distinct_id": "h1", "timestamp": old},
            {"event": "$pageview", "distinct_id": "h2", "timestamp": old}
        ])),
    );
    assert_eq!(res.status(), 200);
    assert_eq!(
        server
            .capture_batch(&[json!({"event": "live", "distinct_id": "h1"})])
            .status(),
        200
    );

    let stored = server.events(1, "event=$pageview");
    assert_eq!(stored.len(), 2);
    let ts: chrono::DateTime<chrono::Utc> = stored[0]["timestamp"]
        .as_str()
        .expect("ts")
        .parse()
        .expect("parses");
    assert!(
        chrono::Utc::now() - ts > chrono::Duration::days(29),
        "historical timestamps are kept"
    );
    let usage = server.usage(1);
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0]["historical_events"], 2);
    assert_eq!(usage[0]["billable_events"], 1);
    assert_eq!(
        usage[0]["month"],
        chrono::Utc::now().format("%Y-%m").to_string()
    );
}

#[test]
fn normalization_ip_clock_skew_and_uuids() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let uuid = "01890000-0000-7000-8000-0000000000aa";
    let sent_at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let ts = (chrono::Utc::now() + chrono::Duration::minutes(59)).to_rfc3339();
    let res = server
        .client
        .post(server.url("/batch/"))
        .header("x-forwarded-for", "198.51.100.7, 10.0.0.1")
        .json(&json!({"api_key": token, "sent_at": sent_at, "batch": [
            {"event": "skewed", "distinct_id": "n1", "timestamp": ts, "uuid": uuid},
            {"event": "future", "distinct_id": "n1", "timestamp": (chrono::Utc::now() + chrono::Duration::days(3)).to_rfc3339(), "properties": {"$ignore_sent_at": true}},
            {"event": "n".repeat(250), "distinct_id": "n1"}
        ]}))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 200);
    let events = server.events(1, "distinct_id=n1");
    let skewed = events
        .iter()
        .find(|e| e["event"] == "skewed")
        .expect("stored");
    assert_eq!(skewed["uuid"], uuid);
    assert_eq!(skewed["properties"]["$ip"], "198.51.100.7");
    let t: chrono::DateTime<chrono::Utc> = skewed["timestamp"]
        .as_str()
        .expect("ts")
        .parse()
        .expect("ts");
    let drift = (chrono::Utc::now() - t).num_seconds();
    assert!(
        (0..=120).contains(&drift),
        "clock skew corrected to ~1 min ago, got {drift}s"
    );
    let future = events
        .iter()
        .find(|e| e["event"] == "future")
        .expect("stored");
    let t: chrono::DateTime<chrono::Utc> = future["timestamp"]
        .as_str()
        .expect("ts")
        .parse()
        .expect("ts");
    assert!(
        t < chrono::Utc::now() + chrono::Duration::minutes(1),
        "more than 23 h ahead is clamped"
    );
    assert!(events
        .iter()
        .any(|e| e["event"].as_str().expect("name").chars().count() == 200));
    let generated = events
        .iter()
        .find(|e| e["event"] == "future")
        .expect("stored");
    let id: uuid::Uuid = generated["uuid"]
        .as_str()
        .expect("uuid")
        .parse()
        .expect("uuid");
    assert_eq!(id.get_version_num(), 7, "missing uuids become UUIDv7");

    // A project that anonymizes IPs never stores them.
    let res = server.post_json(
        "/api/projects/",
        Some(server.admin_key()),
        &json!({"name": "private", "anonymize_ips": true}),
    );
    let private: Value = res.json().expect("json");
    let res = server.post_json("/batch/", None, &json!({"api_key": private["api_token"], "batch": [{"event": "p", "distinct_id": "x", "properties": {"$ip": "1.2.3.4"}}]}));
    assert_eq!(res.status(), 200);
    let events = server.events(private["id"].as_u64().expect("id"), "");
    assert!(events[0]["properties"].get("$ip").is_none());
}

/// Events that change nothing reuse the text of the person's properties made for an earlier
/// event; once the person changes, later events must carry the new properties.
#[test]
fn each_event_carries_the_person_as_it_was_then() {
    let server = TestServer::new();
    let steps = [
        json!({"$set": {"plan": "free"}}),
        json!({}),
        json!({"$set": {"plan": "free"}}),
        json!({"$set": {"plan": "pro"}, "$set_once": {"first": "x"}}),
        json!({}),
        json!({"$unset": ["plan"]}),
        json!({"other": 1}),
    ];
    for (i, props) in steps.iter().enumerate() {
        let event =
            json!({"event": format!("step-{i}"), "distinct_id": "walker", "properties": props});
        assert_eq!(server.capture_batch(&[event]).status(), 200);
    }
    let expected = [
        json!({"plan": "free"}),
        json!({"plan": "free"}),
        json!({"plan": "free"}),
        json!({"plan": "pro", "first": "x"}),
        json!({"plan": "pro", "first": "x"}),
        json!({"first": "x"}),
        json!({"first": "x"}),
    ];
    for (i, want) in expected.iter().enumerate() {
        let event = &server.events(1, &format!("event=step-{i}"))[0];
        assert_eq!(&event["person"]["properties"], want, "step {i}");
        if i == 6 {
            assert_eq!(
                event["properties"]["other"], 1,
                "unread keys are still stored"
            );
        }
    }
}

#[test]
fn persons_groups_and_personless_events() {
    let server = TestServer::new();
    // Events of different distinct ids are processed in parallel (by shard), so the anonymous
    // pageview goes first in its own request: acknowledgement orders it before the identify.
    let first = [
        json!({"event": "$pageview", "distinct_id": "anon-9", "properties": {"$set_once": {"first": "a"}, "$set": {"n": 1}}}),
    ];
    assert_eq!(server.capture_batch(&first).status(), 200);
    let batch = [
        json!({"event": "$identify", "distinct_id": "ann", "properties": {"$anon_distinct_id": "anon-9", "$set": {"email": "ann@x"}}}),
        json!({"event": "$create_alias", "distinct_id": "ann", "properties": {"alias": "ann-alt"}}),
        json!({"event": "$identify", "distinct_id": "bob", "properties": {"$anon_distinct_id": "undefined"}}),
        json!({"event": "$groupidentify", "distinct_id": "ann", "properties": {"$group_type": "company", "$group_key": "acme", "$group_set": {"size": 10}}}),
        json!({"event": "bought", "distinct_id": "ann", "properties": {"$groups": {"company": "acme"}, "$unset": ["n"]}}),
        json!({"event": "ghost", "distinct_id": "casper", "properties": {"$process_person_profile": false, "$set": {"x": 1}}}),
        json!({"event": "$identify", "distinct_id": "casper", "properties": {"$process_person_profile": false, "$anon_distinct_id": "z"}}),
    ];
    assert_eq!(server.capture_batch(&batch).status(), 200);

    let ann = server.persons(1, "ann-alt");
    assert_eq!(ann.len(), 1);
    let ids: Vec<&str> = ann[0]["distinct_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_str().expect("s"))
        .collect();
    for id in ["anon-9", "ann", "ann-alt"] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    assert_eq!(
        ann[0]["properties"],
        json!({"first": "a", "email": "ann@x"})
    );
    assert_eq!(ann[0]["is_identified"], true);
    assert!(
        server.persons(1, "undefined").is_empty(),
        "illegal ids are never merged"
    );
    assert!(
        server.persons(1, "casper").is_empty(),
        "personless events create no person"
    );

    let bought = &server.events(1, "event=bought")[0];
    assert_eq!(bought["properties"]["$group_0"], "acme");
    assert_eq!(bought["person_id"], ann[0]["id"]);
    assert_eq!(
        bought["person"]["properties"],
        json!({"first": "a", "email": "ann@x"})
    );
    let pageview = &server.events(1, "event=$pageview")[0];
    assert_eq!(
        pageview["person"]["properties"],
        json!({"first": "a", "n": 1}),
        "snapshot at ingest time"
    );

    let ghost = &server.events(1, "event=ghost")[0];
    let expected = uuid::Uuid::new_v5(
        &uuid::Uuid::parse_str("932979b4-65c3-4424-8467-0b66ec27bc22").expect("ns"),
        b"1:casper",
    );
    assert_eq!(ghost["person_id"], expected.to_string());
    assert_eq!(ghost["person"]["properties"], json!({}));
    assert!(
        server
            .events(1, "distinct_id=casper&event=$identify")
            .is_empty(),
        "personless $identify is dropped"
    );

    let res = server.get(
        "/api/projects/1/groups/find?group_type_index=0&group_key=acme",
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 200);
    let group: Value = res.json().expect("json");
    assert_eq!(group["group_properties"], json!({"size": 10}));
    let list: Value = server
        .get(
            "/api/projects/1/groups/?group_type_index=0",
            Some(server.admin_key()),
        )
        .json()
        .expect("json");
    assert_eq!(list["results"].as_array().expect("results").len(), 1);
    let types: Value = server
        .get("/api/projects/1/groups_types/", Some(server.admin_key()))
        .json()
        .expect("json");
    assert_eq!(
        types,
        json!([{"group_type": "company", "group_type_index": 0}])
    );
}

#[test]
fn events_api_filters_and_orders_newest_first() {
    let server = TestServer::new();
    let base = chrono::Utc::now() - chrono::Duration::hours(5);
    let events: Vec<Value> = (0..6)
        .map(|i| json!({"event": if i % 2 == 0 { "even" } else { "odd" }, "distinct_id": "f", "timestamp": (base + chrono::Duration::minutes(i)).to_rfc3339()}))
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    let all = server.events(1, "distinct_id=f");
    let times: Vec<&str> = all
        .iter()
        .map(|e| e["timestamp"].as_str().expect("ts"))
        .collect();
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(times, sorted, "newest first");
    assert_eq!(server.events(1, "event=even").len(), 3);
    assert_eq!(server.events(1, "limit=2").len(), 2);
    let after = (base + chrono::Duration::seconds(150)).to_rfc3339();
    assert_eq!(
        server
            .events(1, &format!("after={}", urlencode(&after)))
            .len(),
        3
    );
    let res = server.get(
        "/api/projects/1/events/?after=yesterday-ish",
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "after");
}

#[test]
fn events_survive_restart_and_projects_are_isolated() {
    let (dir, config) = fresh();
    let server = TestServer::start(config.clone());
    let other = server.create_project("Other");
    let other_id = other["id"].as_u64().expect("id");
    assert_eq!(
        server
            .capture_batch(&[json!({"event": "mine", "distinct_id": "iso"})])
            .status(),
        200
    );
    let res = server.post_json("/batch/", None, &json!({"api_key": other["api_token"], "batch": [{"event": "theirs", "distinct_id": "iso"}]}));
    assert_eq!(res.status(), 200);

    assert_eq!(server.events(1, "").len(), 1);
    assert_eq!(server.events(1, "")[0]["event"], "mine");
    assert_eq!(server.events(other_id, "")[0]["event"], "theirs");
    assert_eq!(server.persons(other_id, "iso").len(), 1);
    assert_ne!(
        server.persons(other_id, "iso")[0]["id"],
        server.persons(1, "iso")[0]["id"]
    );

    let (_, key_a) = server.create_key(
        &["query:read", "person:read", "group:read", "project:read"],
        Some(&[1]),
    );
    for path in ["events/", "persons/", "groups/", "usage/", "groups_types/"] {
        let res = server.get(&format!("/api/projects/{other_id}/{path}"), Some(&key_a));
        assert_eq!(res.status(), 403, "{path}");
        assert_eq!(
            server
                .get(&format!("/api/projects/1/{path}"), Some(&key_a))
                .status(),
            200,
            "{path}"
        );
    }
    let (_, no_scope) = server.create_key(&["project:read"], None);
    assert_eq!(
        server
            .get("/api/projects/1/events/", Some(&no_scope))
            .status(),
        403
    );

    server.stop();
    let server = TestServer::start(config);
    assert_eq!(
        server.events(1, "")[0]["event"],
        "mine",
        "flushed on shutdown, read back after restart"
    );
    // Reads from segments honour every filter (pushed into the Parquet reader).
    let soon = urlencode(&(chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339());
    let past = urlencode(&(chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339());
    assert_eq!(server.events(1, "event=mine").len(), 1);
    assert_eq!(server.events(1, "event=theirs").len(), 0);
    assert_eq!(server.events(1, "distinct_id=iso").len(), 1);
    assert_eq!(server.events(1, "distinct_id=nobody").len(), 0);
    assert_eq!(server.events(1, &format!("after={soon}")).len(), 0);
    assert_eq!(
        server
            .events(1, &format!("after={past}&before={soon}"))
            .len(),
        1
    );
    assert_eq!(server.events(1, &format!("before={past}")).len(), 0);
    assert_eq!(server.events(other_id, "").len(), 1);
    assert_eq!(server.persons(1, "iso").len(), 1);
    drop(server);
    drop(dir);
}

#[test]
fn full_buffers_answer_503_with_retry_after_and_store_nothing_of_that_request() {
    let (_dir, mut config) = fresh();
    config.ingest.max_buffered_events = std::num::NonZeroUsize::new(50).expect("nonzero");
    config.ingest.flush_max_rows = std::num::NonZeroUsize::new(1_000_000).expect("nonzero");
    config.ingest.flush_interval = std::time::Duration::from_secs(3600);
    let server = TestServer::start(config);
    let batch = |tag: &str| -> Vec<Value> {
        (0..20)
            .map(|i| json!({"event": tag, "distinct_id": format!("bp{i}")}))
            .collect()
    };
    assert_eq!(server.capture_batch(&batch("first")).status(), 200);
    assert_eq!(server.capture_batch(&batch("second")).status(), 200);
    let res = server.capture_batch(&batch("third"));
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    let body = error_body(res);
    assert_eq!(body["code"], "overloaded");
    assert!(server.events(1, "event=third").is_empty());
    assert_eq!(server.events(1, "event=second").len(), 20);

    // Filled to the last event, the buffers hold a request back before decoding it, and
    // refuse it when no room comes within `ingest.admission_wait`: an overloaded server spends
    // no time on what it cannot take, not even on telling what is wrong with it.
    let last: Vec<Value> = (0..10)
        .map(|i| json!({"event": "fourth", "distinct_id": format!("bq{i}")}))
        .collect();
    assert_eq!(server.capture_batch(&last).status(), 200);
    let res = server.post_raw("/batch/", None, "{not json");
    assert_eq!(res.status(), 503);
    assert_eq!(error_body(res)["code"], "overloaded");
    assert_eq!(server.events(1, "event=fourth").len(), 10);
}
