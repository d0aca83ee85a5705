//! Endpoints over real HTTP: CRUD and versions, variables and their error texts, runs (cache,
//! refresh modes, pagination), materialization lifecycle and fallback, insight endpoints,
//! execution logs, OpenAPI, rate limits and project isolation.

mod common;

use std::time::Duration;

use common::{error_body, fresh, wait_until, TestServer};
use serde_json::{json, Value};

fn base(server: &TestServer) -> String {
    format!("/api/environments/{}", server.creds.project_id)
}

fn patch(server: &TestServer, path: &str, body: &Value) -> reqwest::blocking::Response {
    server
        .client
        .patch(server.url(path))
        .bearer_auth(server.admin_key())
        .json(body)
        .send()
        .expect("patch")
}

fn create(server: &TestServer, body: Value) -> reqwest::blocking::Response {
    server.post_json(
        &format!("{}/endpoints/", base(server)),
        Some(server.admin_key()),
        &body,
    )
}

fn run(server: &TestServer, name: &str, body: Value) -> reqwest::blocking::Response {
    server.post_json(
        &format!("{}/endpoints/{name}/run", base(server)),
        Some(server.admin_key()),
        &body,
    )
}

fn run_ok(server: &TestServer, name: &str, body: Value) -> Value {
    let res = run(server, name, body.clone());
    let status = res.status();
    let out: Value = res.json().expect("json");
    assert_eq!(status, 200, "{name} {body}: {out}");
    out
}

fn variable(server: &TestServer, name: &str, kind: &str, default: Value) -> Value {
    let res = server.post_json(
        &format!("{}/insight_variables/", base(server)),
        Some(server.admin_key()),
        &json!({"name": name, "type": kind, "default_value": default}),
    );
    assert_eq!(res.status(), 201);
    res.json().expect("variable")
}

fn seed(server: &TestServer) {
    let events: Vec<Value> = [
        ("$pageview", "a", "Chrome"),
        ("$pageview", "b", "Safari"),
        ("$pageview", "a", "Chrome"),
        ("signup", "a", "Chrome"),
        ("signup", "c", "Firefox"),
    ]
    .iter()
    .map(|(e, d, b)| json!({"event": e, "distinct_id": d, "properties": {"$browser": b}}))
    .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
}

fn hogql(sql: &str) -> Value {
    json!({"kind": "HogQLQuery", "query": sql})
}

fn status_of(server: &TestServer, name: &str) -> Value {
    let res = server.get(
        &format!("{}/endpoints/{name}/materialization_status", base(server)),
        Some(server.admin_key()),
    );
    res.json().expect("status")
}

fn wait_materialized(server: &TestServer, name: &str) {
    let done = wait_until(Duration::from_secs(30), || {
        status_of(server, name)["status"] == json!("Completed")
    });
    assert!(
        done,
        "materialization finished: {}",
        status_of(server, name)
    );
}

fn logs(server: &TestServer, name: &str, query: &str) -> Vec<Value> {
    let res = server.get(
        &format!("{}/endpoints/{name}/logs/?{query}", base(server)),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 200);
    let body: Value = res.json().expect("logs");
    body["results"].as_array().cloned().unwrap_or_default()
}

#[test]
fn crud_by_name_with_versions_under_both_prefixes() {
    let server = TestServer::new();
    let res = create(&server, json!({"name": "1bad", "query": hogql("SELECT 1")}));
    assert_eq!(res.status(), 400);
    let err = error_body(res);
    assert_eq!(err["attr"], "name");
    assert_eq!(err["detail"], "Invalid name '1bad'. Must start with a letter, contain only alphanumeric characters, hyphens, or underscores, and be between 1 and 128 characters long.");
    let err = error_body(create(&server, json!({"query": hogql("SELECT 1")})));
    assert_eq!(
        (err["attr"].as_str(), err["detail"].as_str()),
        (Some("name"), Some("This field is required."))
    );
    let err = error_body(create(
        &server,
        json!({"name": "x", "query": hogql("SELECT 1"), "data_freshness_seconds": 60}),
    ));
    assert_eq!(err["attr"], "data_freshness_seconds");

    let res = create(
        &server,
        json!({"name": "daily-counts", "description": "Counts", "query": hogql("SELECT count() AS c FROM events"), "data_freshness_seconds": 900}),
    );
    assert_eq!(res.status(), 201);
    let created: Value = res.json().expect("json");
    assert_eq!(created["current_version"], 1);
    assert_eq!(
        created["endpoint_path"],
        format!(
            "/api/environments/{}/endpoints/daily-counts/run",
            server.creds.project_id
        )
    );
    assert_eq!(created["data_freshness_seconds"], 900);
    assert_eq!(
        created["is_materialized"], true,
        "SQL endpoints materialize by default"
    );
    assert_eq!(
        create(
            &server,
            json!({"name": "daily-counts", "query": hogql("SELECT 2")})
        )
        .status(),
        400,
        "names are unique"
    );

    let path = format!(
        "/api/projects/{}/endpoints/daily-counts/",
        server.creds.project_id
    );
    let got: Value = server
        .get(&path, Some(server.admin_key()))
        .json()
        .expect("json");
    assert_eq!(got["description"], "Counts");

    // Same query (keys reordered): no new version; a different query: version 2.
    let same = patch(
        &server,
        &path,
        &json!({"query": {"query": "SELECT count() AS c FROM events", "kind": "HogQLQuery"}}),
    );
    assert_eq!(same.json::<Value>().expect("json")["current_version"], 1);
    let changed: Value = patch(
        &server,
        &path,
        &json!({"query": hogql("SELECT count() AS n FROM events")}),
    )
    .json()
    .expect("json");
    assert_eq!(changed["current_version"], 2);
    assert_eq!(changed["description"], "Counts", "description carries over");
    let versions: Value = server
        .get(&format!("{path}versions/"), Some(server.admin_key()))
        .json()
        .expect("json");
    let numbers: Vec<u64> = versions["results"]
        .as_array()
        .expect("list")
        .iter()
        .map(|v| v["version"].as_u64().expect("n"))
        .collect();
    assert_eq!(numbers, vec![2, 1], "newest first");
    let v1: Value = server
        .get(&format!("{path}?version=1"), Some(server.admin_key()))
        .json()
        .expect("json");
    assert_eq!(v1["query"]["query"], "SELECT count() AS c FROM events");
    let missing = server.get(&format!("{path}?version=9"), Some(server.admin_key()));
    assert_eq!(missing.status(), 404);
    assert_eq!(
        missing.json::<Value>().expect("json"),
        json!({"error": "Version 9 not found"})
    );

    let list: Value = server
        .get(
            &format!("{}/endpoints/", base(&server)),
            Some(server.admin_key()),
        )
        .json()
        .expect("json");
    assert_eq!(list["results"].as_array().expect("list").len(), 1);
    assert_eq!(server.delete(&path, Some(server.admin_key())).status(), 204);
    assert_eq!(server.get(&path, Some(server.admin_key())).status(), 404);
    assert_eq!(
        create(
            &server,
            json!({"name": "daily-counts", "query": hogql("SELECT 2")})
        )
        .status(),
        201,
        "a deleted name is free again"
    );
}

#[test]
fn variables_are_checked_at_save_and_bound_at_run() {
    let server = TestServer::new();
    seed(&server);
    let err = error_body(create(
        &server,
        json!({"name": "by-event", "query": hogql("SELECT count() AS c FROM events WHERE event = {variables.event_name}")}),
    ));
    assert_eq!(err["detail"], "Query references undefined variable(s): event_name. See https://posthog.com/docs/endpoints/variables for detail.");
    let bad = json!({"kind": "HogQLQuery", "query": "SELECT {variables.x}", "variables": {"not-a-uuid": {"code_name": "x"}}});
    assert_eq!(
        error_body(create(&server, json!({"name": "a", "query": bad})))["detail"],
        "Variable ID(s) not valid UUIDs: not-a-uuid. "
    );
    let ghost = uuid::Uuid::new_v4().to_string();
    let q = json!({"kind": "HogQLQuery", "query": "SELECT {variables.x}", "variables": {ghost.clone(): {"code_name": "x"}}});
    let detail = error_body(create(&server, json!({"name": "a", "query": q})))["detail"]
        .as_str()
        .expect("text")
        .to_string();
    assert!(
        detail.starts_with(&format!("Variable ID(s) not found: {ghost}.")),
        "{detail}"
    );

    let var = variable(&server, "Event name", "String", Value::Null);
    assert_eq!(var["code_name"], "event_name");
    let res = create(
        &server,
        json!({"name": "by-event", "is_materialized": false, "query": hogql("SELECT count() AS c FROM events WHERE event = {variables.event_name}")}),
    );
    assert_eq!(res.status(), 201);
    let out = run_ok(
        &server,
        "by-event",
        json!({"variables": {"event_name": "signup"}}),
    );
    assert_eq!(out["results"], json!([[2]]));
    assert_eq!(out["columns"], json!(["c"]));
    assert_eq!(out["types"], json!([["c", "Int64"]]));
    assert_eq!(out["endpoint_version"], 1);
    assert_eq!(out["endpoint_materialized"], false);
    assert!(uuid::Uuid::parse_str(out["execution_id"].as_str().expect("id")).is_ok());
    assert!(out.get("hogql").is_none(), "hogql only with debug");
    let debug = run_ok(
        &server,
        "by-event",
        json!({"variables": {"event_name": "' OR 1=1 --"}, "debug": true}),
    );
    assert_eq!(
        debug["results"],
        json!([[0]]),
        "values are literals, never SQL"
    );
    assert!(debug["hogql"]
        .as_str()
        .is_some_and(|s| s.contains("SELECT")));

    let err = error_body(run(&server, "by-event", json!({})));
    assert_eq!(
        (err["attr"].as_str(), err["detail"].as_str()),
        (
            Some("variables"),
            Some("Required variable(s) 'event_name' not provided")
        )
    );
    let err = error_body(run(
        &server,
        "by-event",
        json!({"variables": {"event_name": "x", "zzz": 1, "aaa": 2}}),
    ));
    assert_eq!(err["detail"], "Unknown variable(s): aaa, zzz");
    let err = error_body(run(
        &server,
        "by-event",
        json!({"variables": {"event_name": "x"}, "query_override": {}}),
    ));
    assert_eq!(err["attr"], "query_override");
    let err = error_body(run(&server, "by-event", json!({"refresh": "sometimes"})));
    assert_eq!(err["attr"], "refresh");
    let err = error_body(run(
        &server,
        "by-event",
        json!({"refresh": "direct", "variables": {"event_name": "x"}}),
    ));
    assert_eq!(err["detail"], "'direct' refresh mode is only valid for materialized endpoints. Use 'cache' or 'force' instead, or enable materialization on this endpoint.");
    let err = error_body(run(&server, "by-event", json!({"colour": "red"})));
    assert_eq!(err["attr"], "colour");

    // A variable with a default needs no value; the default applies.
    variable(&server, "min_count", "Number", json!(2));
    create(
        &server,
        json!({"name": "with-default", "is_materialized": false, "query": hogql("SELECT event, count() AS c FROM events GROUP BY event HAVING count() >= {variables.min_count} ORDER BY event")}),
    );
    assert_eq!(
        run_ok(&server, "with-default", json!({}))["results"],
        json!([["$pageview", 3], ["signup", 2]])
    );
    assert_eq!(
        run_ok(
            &server,
            "with-default",
            json!({"variables": {"min_count": 3}})
        )["results"],
        json!([["$pageview", 3]])
    );
}

#[test]
fn run_errors_versions_pagination_and_cache() {
    let server = TestServer::new();
    seed(&server);
    create(
        &server,
        json!({"name": "events", "is_materialized": false, "query": hogql("SELECT event, distinct_id FROM events ORDER BY event, distinct_id")}),
    );
    let all = run_ok(&server, "events", json!({}));
    assert_eq!(all["results"].as_array().expect("rows").len(), 5);
    assert_eq!(all["hasMore"], false);

    let page = run_ok(&server, "events", json!({"limit": 2, "offset": 1}));
    assert_eq!(
        page["results"],
        json!([["$pageview", "a"], ["$pageview", "b"]])
    );
    assert_eq!(page["hasMore"], true);
    let last = run_ok(&server, "events", json!({"limit": 2, "offset": 4}));
    assert_eq!(
        (last["results"].as_array().map(Vec::len), &last["hasMore"]),
        (Some(1), &json!(false))
    );

    let bad = run(&server, "events", json!({"limit": "x"}));
    assert_eq!(bad.status(), 400);
    assert_eq!(
        bad.json::<Value>().expect("json"),
        json!({"error": "Invalid limit parameter: x"})
    );
    let bad = server.post_json(
        &format!("{}/endpoints/events/run?version=abc", base(&server)),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(
        bad.json::<Value>().expect("json"),
        json!({"error": "Invalid version parameter: abc"})
    );
    assert_eq!(
        run(&server, "events", json!({"offset": 1}))
            .json::<Value>()
            .expect("json"),
        json!({"error": "offset requires limit to be set"})
    );
    let missing = run(&server, "events", json!({"version": 7}));
    assert_eq!(missing.status(), 404);
    assert_eq!(
        missing.json::<Value>().expect("json"),
        json!({"error": "Version 7 not found for endpoint 'events'", "current_version": 1})
    );
    assert_eq!(run(&server, "nope", json!({})).status(), 404);

    // Cache: the same run within the freshness window is served from the cache.
    create(
        &server,
        json!({"name": "total", "is_materialized": false, "query": hogql("SELECT count() AS c FROM events")}),
    );
    let first = run_ok(&server, "total", json!({}));
    assert_eq!(
        (first["results"].clone(), first["is_cached"].clone()),
        (json!([[5]]), json!(false))
    );
    assert_eq!(
        server
            .capture_batch(&[json!({"event": "late", "distinct_id": "z"})])
            .status(),
        200
    );
    let cached = run_ok(&server, "total", json!({}));
    assert_eq!(
        (cached["results"].clone(), cached["is_cached"].clone()),
        (json!([[5]]), json!(true))
    );
    assert_ne!(
        cached["execution_id"], first["execution_id"],
        "every run has its own id"
    );
    let forced = run_ok(&server, "total", json!({"refresh": "force"}));
    assert_eq!(
        (forced["results"].clone(), forced["is_cached"].clone()),
        (json!([[6]]), json!(false))
    );

    // A pinned old version still runs; an inactive version does not; an inactive endpoint is 404.
    let path = format!("{}/endpoints/total/", base(&server));
    patch(
        &server,
        &path,
        &json!({"query": hogql("SELECT count() * 10 AS c FROM events")}),
    );
    assert_eq!(
        run_ok(&server, "total", json!({}))["results"],
        json!([[60]])
    );
    assert_eq!(
        run_ok(&server, "total", json!({"version": 1}))["results"],
        json!([[6]])
    );
    assert_eq!(
        patch(
            &server,
            &format!("{path}?version=1"),
            &json!({"is_active": false})
        )
        .status(),
        200
    );
    let err = error_body(run(&server, "total", json!({"version": 1})));
    assert_eq!(
        err["detail"],
        "Version 1 is inactive and cannot be executed."
    );
    patch(&server, &path, &json!({"is_active": false}));
    assert_eq!(run(&server, "total", json!({})).status(), 404);
}

#[test]
fn materialized_endpoint_lifecycle_reads_stored_results() {
    let server = TestServer::new();
    seed(&server);
    variable(&server, "ev", "String", Value::Null);
    let err = error_body(create(
        &server,
        json!({"name": "like", "is_materialized": true, "query": hogql("SELECT count() FROM events WHERE event LIKE {variables.ev}")}),
    ));
    assert_eq!(err["detail"], "Cannot materialize endpoint. Reason: Unsupported operator LIKE, supported: =, >=, >, <, <=");

    let res = create(
        &server,
        json!({"name": "per-browser", "is_materialized": true, "data_freshness_seconds": 900,
        "query": hogql("SELECT properties.$browser AS browser, count() AS c FROM events WHERE event = {variables.ev} GROUP BY browser ORDER BY c DESC, browser")}),
    );
    assert_eq!(res.status(), 201);
    wait_materialized(&server, "per-browser");
    let direct = run_ok(
        &server,
        "per-browser",
        json!({"variables": {"ev": "$pageview"}, "refresh": "direct"}),
    );
    assert_eq!(direct["endpoint_materialized"], false);
    let mat = run_ok(
        &server,
        "per-browser",
        json!({"variables": {"ev": "$pageview"}, "refresh": "force"}),
    );
    assert_eq!(mat["endpoint_materialized"], true);
    assert!(mat["endpoint_materialized_at"].is_string());
    assert_eq!(mat["results"], direct["results"]);
    assert_eq!(mat["results"], json!([["Chrome", 2], ["Safari", 1]]));
    assert_eq!(mat["columns"], json!(["browser", "c"]));
    let none = run_ok(
        &server,
        "per-browser",
        json!({"variables": {"ev": "nothing"}, "refresh": "force"}),
    );
    assert_eq!(none["results"], json!([]));

    // Materialized reads never scan events: new events show only in direct runs (until the
    // next refresh).
    let more: Vec<Value> = (0..3).map(|i| json!({"event": "$pageview", "distinct_id": format!("n{i}"), "properties": {"$browser": "Safari"}})).collect();
    assert_eq!(server.capture_batch(&more).status(), 200);
    assert_eq!(
        run_ok(
            &server,
            "per-browser",
            json!({"variables": {"ev": "$pageview"}, "refresh": "force"})
        )["results"],
        json!([["Chrome", 2], ["Safari", 1]])
    );
    assert_eq!(
        run_ok(
            &server,
            "per-browser",
            json!({"variables": {"ev": "$pageview"}, "refresh": "direct"})
        )["results"],
        json!([["Safari", 4], ["Chrome", 2]])
    );

    // Security rule: a materialized endpoint needs every variable.
    let err = error_body(run(&server, "per-browser", json!({})));
    assert_eq!(err["detail"], "Required variable(s) 'ev' not provided");

    // Logs say which path answered.
    assert!(wait_until(Duration::from_secs(5), || !logs(
        &server,
        "per-browser",
        "search=path%3Dmaterialized"
    )
    .is_empty()));
    let inline = logs(&server, "per-browser", "search=path%3Dinline");
    assert!(!inline.is_empty(), "direct runs are logged as inline");

    // Disabling materialization: runs go inline.
    patch(
        &server,
        &format!("{}/endpoints/per-browser/", base(&server)),
        &json!({"is_materialized": false}),
    );
    let after = run_ok(
        &server,
        "per-browser",
        json!({"variables": {"ev": "$pageview"}, "refresh": "force"}),
    );
    assert_eq!(after["endpoint_materialized"], false);
    assert_eq!(status_of(&server, "per-browser")["can_materialize"], true);
}

#[test]
fn range_variables_reaggregate_materialized_rows() {
    let server = TestServer::new();
    let today = chrono::Utc::now().date_naive();
    let day = |back: i64| format!("{}T12:00:00Z", today - chrono::Duration::days(back));
    let events: Vec<Value> = [(3, "a"), (3, "b"), (2, "a"), (1, "a"), (1, "b"), (0, "b")]
        .iter()
        .map(|(d, e)| json!({"event": e, "distinct_id": "u", "timestamp": day(*d)}))
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    variable(&server, "since", "Date", Value::Null);
    create(
        &server,
        json!({"name": "since", "is_materialized": true,
        "query": hogql("SELECT event, count() AS c FROM events WHERE timestamp >= {variables.since} GROUP BY event ORDER BY c DESC, event")}),
    );
    wait_materialized(&server, "since");
    for back in [3, 2, 1, 0] {
        let since = (today - chrono::Duration::days(back)).to_string();
        let mat = run_ok(&server, "since", json!({"variables": {"since": since}}));
        let direct = run_ok(
            &server,
            "since",
            json!({"variables": {"since": since}, "refresh": "direct"}),
        );
        assert_eq!(mat["endpoint_materialized"], true);
        assert_eq!(mat["results"], direct["results"], "since {since}");
    }
}

#[test]
fn failed_materialization_falls_back_to_direct_runs() {
    let (_dir, mut config) = fresh();
    config.endpoints.materialize_max_rows = std::num::NonZeroUsize::new(1).expect("nonzero");
    let server = TestServer::start(config);
    seed(&server);
    create(
        &server,
        json!({"name": "rows", "is_materialized": true, "query": hogql("SELECT event FROM events ORDER BY event")}),
    );
    assert!(wait_until(Duration::from_secs(30), || status_of(
        &server, "rows"
    )["status"]
        == json!("Failed")));
    let status = status_of(&server, "rows");
    assert!(
        status["error"]
            .as_str()
            .is_some_and(|e| e.contains("more than 1 rows")),
        "{status}"
    );
    let out = run_ok(&server, "rows", json!({}));
    assert_eq!(out["endpoint_materialized"], false);
    assert_eq!(out["results"].as_array().map(Vec::len), Some(5));
    assert!(wait_until(Duration::from_secs(5), || !logs(
        &server,
        "rows",
        "search=materialized_fallback"
    )
    .is_empty()));
}

#[test]
fn insight_endpoints_take_breakdown_and_date_variables() {
    let server = TestServer::new();
    seed(&server);
    let trends = json!({"kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview", "math": "total"}],
        "interval": "day", "dateRange": {"date_from": "-7d"}, "breakdownFilter": {"breakdown": "$browser", "breakdown_type": "event"}});
    assert_eq!(
        create(&server, json!({"name": "views", "query": trends.clone()})).status(),
        201
    );
    let all = run_ok(&server, "views", json!({}));
    assert_eq!(all["results"].as_array().map(Vec::len), Some(2));
    let chrome = run_ok(
        &server,
        "views",
        json!({"variables": {"$browser": "Chrome"}}),
    );
    let series = chrome["results"].as_array().expect("series");
    assert_eq!(series.len(), 1);
    assert_eq!(series[0]["breakdown_value"], "Chrome");
    assert_eq!(series[0]["count"], 2.0);
    let today = chrono::Utc::now().date_naive();
    let dated = run_ok(
        &server,
        "views",
        json!({"variables": {"date_from": (today - chrono::Duration::days(2)).to_string(), "date_to": today.to_string()}}),
    );
    assert_eq!(
        dated["results"][0]["days"].as_array().map(Vec::len),
        Some(3)
    );
    let err = error_body(run(&server, "views", json!({"limit": 5})));
    assert_eq!(
        err["detail"],
        "Limit/offset parameters are only supported for HogQLQuery, not TrendsQuery"
    );

    // Materialized: the breakdown variable is required and dates are not accepted.
    assert_eq!(
        create(
            &server,
            json!({"name": "views-m", "query": trends, "is_materialized": true})
        )
        .status(),
        201
    );
    wait_materialized(&server, "views-m");
    let err = error_body(run(&server, "views-m", json!({})));
    assert_eq!(
        err["detail"],
        "Required variable(s) '$browser' not provided"
    );
    let err = error_body(run(
        &server,
        "views-m",
        json!({"variables": {"$browser": "Chrome", "date_from": "2024-01-01"}}),
    ));
    assert_eq!(err["detail"], "Unknown variable(s): date_from");
    let mat = run_ok(
        &server,
        "views-m",
        json!({"variables": {"$browser": "Chrome"}}),
    );
    assert_eq!(mat["endpoint_materialized"], true);
    assert_eq!(mat["results"], chrome["results"]);
}

#[test]
fn execution_logs_filter_search_and_survive_restart() {
    let (_dir, config) = fresh();
    let server = TestServer::start(config.clone());
    seed(&server);
    create(
        &server,
        json!({"name": "logged", "is_materialized": false, "query": hogql("SELECT count() FROM events")}),
    );
    let ok = run_ok(&server, "logged", json!({}));
    assert_eq!(
        run(&server, "logged", json!({"refresh": "bogus"})).status(),
        400
    );
    assert!(wait_until(Duration::from_secs(5), || logs(
        &server, "logged", ""
    )
    .len()
        == 2));
    let entries = logs(&server, "logged", "");
    assert_eq!(entries[0]["level"], "ERROR", "newest first");
    assert!(entries[0]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("Endpoint execution failed · invalid request · refresh: ")));
    assert_eq!(entries[1]["level"], "INFO");
    assert_eq!(entries[1]["instance_id"], ok["execution_id"]);
    let msg = entries[1]["message"].as_str().expect("message");
    assert!(
        msg.starts_with("Endpoint executed · path=inline cache=miss duration_ms="),
        "{msg}"
    );
    assert!(msg.ends_with("rows=1 version=1"), "{msg}");
    assert_eq!(logs(&server, "logged", "level=error").len(), 1);
    assert_eq!(logs(&server, "logged", "level=INFO,ERROR").len(), 2);
    assert_eq!(logs(&server, "logged", "search=CACHE%3DMISS").len(), 1);
    let id = ok["execution_id"].as_str().expect("id");
    assert_eq!(
        logs(&server, "logged", &format!("instance_id={id}")).len(),
        1
    );
    assert_eq!(logs(&server, "logged", "limit=1").len(), 1);
    let newest = entries[0]["timestamp"]
        .as_str()
        .expect("ts")
        .replace(' ', "T");
    assert_eq!(
        logs(&server, "logged", &format!("before={newest}Z")).len(),
        1
    );
    assert_eq!(
        logs(&server, "logged", &format!("after={newest}Z")).len(),
        0
    );
    server.stop();

    let server = TestServer::start(config);
    assert_eq!(
        logs(&server, "logged", "").len(),
        2,
        "logs survive a restart"
    );
}

#[test]
fn openapi_document_validates_and_generates_a_working_client() {
    let server = TestServer::new();
    seed(&server);
    variable(&server, "ev", "String", Value::Null);
    variable(&server, "min", "Number", json!(1));
    create(
        &server,
        json!({"name": "per-event", "description": "Count of one event", "is_materialized": false,
        "query": hogql("SELECT event, count() AS c FROM events WHERE event = {variables.ev} GROUP BY event HAVING count() >= {variables.min}")}),
    );
    let spec_path = format!(
        "/api/projects/{}/endpoints/per-event/openapi.json",
        server.creds.project_id
    );
    let spec: Value = server
        .get(&spec_path, Some(server.admin_key()))
        .json()
        .expect("json");
    assert_eq!(spec["openapi"], "3.0.3");
    assert_eq!(spec["info"]["title"], "per-event");
    assert_eq!(spec["info"]["description"], "Count of one event");
    assert_eq!(spec["info"]["version"], "1");
    let op = &spec["paths"][format!(
        "/api/projects/{}/endpoints/per-event/run",
        server.creds.project_id
    )]["post"];
    assert_eq!(op["operationId"], "run_per_event");
    assert_eq!(op["summary"], "Execute per-event");
    assert_eq!(op["security"], json!([{"PersonalAPIKey": []}]));
    assert_eq!(op["requestBody"]["required"], true);
    let vars = &spec["components"]["schemas"]["Variables"];
    assert_eq!(vars["properties"]["ev"]["type"], "string");
    assert_eq!(vars["properties"]["min"]["type"], "number");
    assert_eq!(
        vars["required"],
        json!(["ev"]),
        "variables without a default are required"
    );
    assert_eq!(
        spec["components"]["securitySchemes"]["PersonalAPIKey"]["scheme"],
        "bearer"
    );
    assert_eq!(
        server
            .get(&format!("{spec_path}?version=3"), Some(server.admin_key()))
            .status(),
        404
    );

    let work = tempfile::tempdir().expect("tempdir");
    let out = common::sdk::run_python(
        "endpoint_openapi.py",
        &[
            &server.base,
            &spec_path,
            server.admin_key(),
            r#"{"ev": "signup"}"#,
            &work.path().display().to_string(),
        ],
    );
    let out: Value = serde_json::from_str(out.trim()).expect("script output");
    assert_eq!(out["results"], json!([["signup", 2]]));
    assert_eq!(out["columns"], json!(["event", "c"]));
}

#[test]
fn projects_are_isolated_and_scopes_enforced() {
    let server = TestServer::new();
    seed(&server);
    create(
        &server,
        json!({"name": "mine", "is_materialized": false, "query": hogql("SELECT count() FROM events")}),
    );
    let other = server.create_project("Other");
    let other_id = other["id"].as_u64().expect("id");
    let res = server.post_json(
        &format!("/api/environments/{other_id}/endpoints/mine/run"),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(res.status(), 404, "an endpoint belongs to its project");
    let (_, scoped) = server.create_key(&["endpoint:read"], Some(&[other_id]));
    let res = server.post_json(
        &format!("{}/endpoints/mine/run", base(&server)),
        Some(&scoped),
        &json!({}),
    );
    assert_eq!(res.status(), 403, "a key scoped to another project");
    let (_, reader) = server.create_key(&["endpoint:read"], None);
    let res = server.post_json(
        &format!("{}/endpoints/", base(&server)),
        Some(&reader),
        &json!({"name": "x", "query": hogql("SELECT 1")}),
    );
    assert_eq!(res.status(), 403, "creating needs endpoint:write");
    let res = server.post_json(
        &format!("{}/endpoints/mine/run", base(&server)),
        Some(&reader),
        &json!({}),
    );
    assert_eq!(res.status(), 200);
    let res = server.post_json(
        &format!("{}/endpoints/mine/run", base(&server)),
        None,
        &json!({}),
    );
    assert_eq!(res.status(), 401);
    assert!(res.headers().get("www-authenticate").is_some());
}

#[test]
fn runs_are_rate_limited_per_key() {
    let (_dir, mut config) = fresh();
    config.endpoints.inline_per_minute = 3;
    let server = TestServer::start(config);
    create(
        &server,
        json!({"name": "limited", "is_materialized": false, "query": hogql("SELECT 1")}),
    );
    for _ in 0..3 {
        assert_eq!(run(&server, "limited", json!({})).status(), 200);
    }
    let res = run(&server, "limited", json!({}));
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("retry-after").is_some());
    let (_, other) = server.create_key(&["endpoint:read"], None);
    let res = server.post_json(
        &format!("{}/endpoints/limited/run", base(&server)),
        Some(&other),
        &json!({}),
    );
    assert_eq!(res.status(), 200, "another key has its own budget");
    // Every run leaves a log entry, the refused one included.
    // Entries are written within a flush interval: wait until all five are there.
    let (mut errors, mut infos) = (Vec::new(), Vec::new());
    assert!(wait_until(Duration::from_secs(5), || {
        errors = logs(&server, "limited", "level=ERROR");
        infos = logs(&server, "limited", "level=INFO");
        errors.len() + infos.len() >= 5
    }));
    assert_eq!(errors.len(), 1);
    let message = errors[0]["message"].as_str().expect("message");
    assert!(message.contains("error=throttled"), "{message}");
    assert_eq!(infos.len(), 4);
}

#[test]
fn insight_variables_crud() {
    let server = TestServer::new();
    let path = format!("{}/insight_variables/", base(&server));
    let err = error_body(server.post_json(
        &path,
        Some(server.admin_key()),
        &json!({"name": "x", "type": "Colour"}),
    ));
    assert_eq!(err["code"], "invalid_input");
    let err = error_body(server.post_json(
        &path,
        Some(server.admin_key()),
        &json!({"name": "d", "type": "Date", "default_value": "not a date"}),
    ));
    assert_eq!(err["attr"], "default_value");
    let created = variable(&server, "Start date", "Date", json!("2024-01-01"));
    let id = created["id"].as_str().expect("id");
    assert!(uuid::Uuid::parse_str(id).is_ok());
    assert_eq!(created["code_name"], "start_date");
    let dup = server.post_json(
        &path,
        Some(server.admin_key()),
        &json!({"name": "start date", "type": "Date"}),
    );
    assert_eq!(dup.status(), 400, "code names are unique per project");
    let item = format!("{path}{id}/");
    let updated: Value = patch(&server, &item, &json!({"default_value": "2024-02-01"}))
        .json()
        .expect("json");
    assert_eq!(updated["default_value"], "2024-02-01");
    let list: Value = server
        .get(&path, Some(server.admin_key()))
        .json()
        .expect("json");
    assert_eq!(list["results"].as_array().map(Vec::len), Some(1));
    assert_eq!(server.delete(&item, Some(server.admin_key())).status(), 204);
    assert_eq!(server.get(&item, Some(server.admin_key())).status(), 404);
}

#[test]
fn several_breakdown_variables_combine_with_and_and_retention_runs() {
    let server = TestServer::new();
    let events: Vec<Value> = [("a", "Chrome", "Mac"), ("b", "Chrome", "Windows"), ("c", "Safari", "Mac"), ("d", "Chrome", "Mac")]
        .iter()
        .map(|(d, b, os)| json!({"event": "$pageview", "distinct_id": d, "properties": {"$browser": b, "$os": os}}))
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    let trends = json!({"kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview"}], "dateRange": {"date_from": "-3d"},
        "breakdownFilter": {"breakdowns": [{"property": "$browser", "type": "event"}, {"property": "$os", "type": "event"}]}});
    create(&server, json!({"name": "two", "query": trends}));
    let out = run_ok(
        &server,
        "two",
        json!({"variables": {"$browser": "Chrome", "$os": "Mac"}}),
    );
    let series = out["results"].as_array().expect("series");
    assert_eq!(series.len(), 1);
    assert_eq!(series[0]["breakdown_value"], json!(["Chrome", "Mac"]));
    assert_eq!(series[0]["count"], 2.0);

    let retention = json!({"kind": "RetentionQuery", "retentionFilter": {"period": "Day", "totalIntervals": 3,
        "targetEntity": {"id": "$pageview", "type": "events"}, "returningEntity": {"id": "$pageview", "type": "events"}},
        "breakdownFilter": {"breakdown": "$os", "breakdown_type": "event"}});
    create(&server, json!({"name": "ret", "query": retention}));
    let out = run_ok(&server, "ret", json!({"variables": {"$os": "Mac"}}));
    let cohorts = out["results"].as_array().expect("cohorts");
    assert!(!cohorts.is_empty());
    assert!(
        cohorts.iter().all(|c| c["breakdown_value"] == json!("Mac")),
        "{out}"
    );
    let day0: f64 = cohorts
        .iter()
        .map(|c| c["values"][0]["count"].as_f64().unwrap_or(0.0))
        .sum();
    assert_eq!(day0, 3.0, "three Mac users start a cohort");
}

#[test]
fn a_clean_shutdown_keeps_the_last_runs_log_entries() {
    let (_dir, config) = fresh();
    let server = TestServer::start(config.clone());
    create(
        &server,
        json!({"name": "quick", "is_materialized": false, "query": hogql("SELECT 1")}),
    );
    for _ in 0..30 {
        run_ok(&server, "quick", json!({}));
    }
    // Stop at once: entries recorded in the last flush interval must still be written.
    server.stop();
    let server = TestServer::start(config);
    assert_eq!(logs(&server, "quick", "limit=500").len(), 30);
}

#[test]
fn materialized_results_can_live_in_an_s3_compatible_bucket() {
    // moto's S3 server (PyPI) stands in for any S3-compatible service.
    let s3_server = common::process::S3Server::start();
    s3_server.create_bucket("results");
    let s3 = s3_server.url.clone();
    let (dir, mut config) = fresh();
    config.endpoints.s3 = Some(corvid::config::S3Config {
        bucket: "results".into(),
        region: Some("us-east-1".into()),
        endpoint: Some(s3.clone()),
        access_key_id: Some("test".into()),
        secret_access_key: Some("test".into()),
        prefix: Some("corvid".into()),
        allow_http: true,
    });
    let server = TestServer::start(config);
    seed(&server);
    variable(&server, "ev", "String", Value::Null);
    let res = create(
        &server,
        json!({"name": "in-bucket", "is_materialized": true,
        "query": hogql("SELECT properties.$browser AS browser, count() AS c FROM events WHERE event = {variables.ev} GROUP BY browser ORDER BY c DESC, browser")}),
    );
    assert_eq!(res.status(), 201);
    wait_materialized(&server, "in-bucket");
    let mat = run_ok(
        &server,
        "in-bucket",
        json!({"variables": {"ev": "$pageview"}, "refresh": "force"}),
    );
    assert_eq!(mat["endpoint_materialized"], true);
    assert_eq!(mat["results"], json!([["Chrome", 2], ["Safari", 1]]));

    let keys = s3_server.keys("results", "corvid/");
    assert!(
        keys.iter()
            .any(|k| k.starts_with("corvid/project_") && k.ends_with(".arrow")),
        "{keys:?}"
    );
    let local = dir.path().join("materialized");
    let local_files = std::fs::read_dir(&local).map(|d| d.count()).unwrap_or(0);
    assert_eq!(local_files, 0, "nothing written to the local directory");
}
