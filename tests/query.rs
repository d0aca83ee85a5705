//! The query API over real HTTP: HogQL, trends and retention against what capture stored,
//! freshly captured events visible at once, restart, project isolation, errors and scopes.

mod common;

use common::{error_body, fresh, TestServer};
use serde_json::{json, Value};

fn query(server: &TestServer, project: u64, key: &str, q: Value) -> reqwest::blocking::Response {
    server.post_json(
        &format!("/api/projects/{project}/query/"),
        Some(key),
        &json!({"query": q}),
    )
}

fn hogql(server: &TestServer, sql: &str) -> Value {
    let res = query(
        server,
        server.creds.project_id,
        server.admin_key(),
        json!({"kind": "HogQLQuery", "query": sql}),
    );
    assert_eq!(res.status(), 200, "{sql}");
    res.json().expect("json")
}

#[test]
fn captured_events_are_queryable_at_once_and_after_restart() {
    let (_dir, config) = fresh();
    let server = TestServer::start(config.clone());
    let events: Vec<Value> = (0..5)
        .map(|i| {
            json!({"event": if i < 3 { "$pageview" } else { "signup" }, "distinct_id": format!("user-{i}"),
                   "properties": {"$browser": if i % 2 == 0 { "Chrome" } else { "Firefox" }, "amount": i * 10}})
        })
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);

    let body = hogql(
        &server,
        "SELECT event, count() AS c FROM events GROUP BY event ORDER BY event",
    );
    assert_eq!(body["results"], json!([["$pageview", 3], ["signup", 2]]));
    assert_eq!(body["columns"], json!(["event", "c"]));
    assert_eq!(body["types"], json!([["event", "String"], ["c", "Int64"]]));
    assert_eq!(body["hasMore"], json!(false));
    assert!(body["hogql"].as_str().is_some_and(|s| s.contains("SELECT")));

    let body = hogql(
        &server,
        "SELECT properties.$browser AS b, sum(toFloat(properties.amount)) FROM events WHERE properties.amount >= 20 GROUP BY b ORDER BY b",
    );
    assert_eq!(
        body["results"],
        json!([["Chrome", 60.0], ["Firefox", 30.0]])
    );

    server.stop();
    let server = TestServer::start(config);
    let body = hogql(&server, "SELECT count(), uniq(distinct_id) FROM events");
    assert_eq!(body["results"], json!([[5, 5]]));
}

#[test]
fn trends_and_retention_over_http() {
    let server = TestServer::new();
    let today = chrono::Utc::now().date_naive();
    let day = |back: i64| format!("{}T12:00:00Z", today - chrono::Duration::days(back));
    let events = vec![
        json!({"event": "$pageview", "distinct_id": "a", "timestamp": day(2), "properties": {"$browser": "Chrome"}}),
        json!({"event": "$pageview", "distinct_id": "b", "timestamp": day(2), "properties": {"$browser": "Safari"}}),
        json!({"event": "$pageview", "distinct_id": "a", "timestamp": day(1), "properties": {"$browser": "Chrome"}}),
        json!({"event": "$pageview", "distinct_id": "a", "timestamp": day(0), "properties": {"$browser": "Chrome"}}),
    ];
    assert_eq!(server.capture_batch(&events).status(), 200);
    let res = query(
        &server,
        server.creds.project_id,
        server.admin_key(),
        json!({"kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview", "math": "dau"}],
               "interval": "day", "dateRange": {"date_from": "-2d"},
               "breakdownFilter": {"breakdown": "$browser", "breakdown_type": "event"}}),
    );
    assert_eq!(res.status(), 200);
    let body: Value = res.json().expect("json");
    let series = body["results"].as_array().expect("results");
    assert_eq!(series.len(), 2);
    assert_eq!(series[0]["breakdown_value"], "Chrome");
    assert_eq!(series[0]["data"], json!([1, 1, 1]));
    assert_eq!(series[1]["breakdown_value"], "Safari");
    assert_eq!(series[1]["data"], json!([1, 0, 0]));
    assert!(body["hogql"]
        .as_str()
        .is_some_and(|s| s.contains("corvid_bucket")));

    let res = query(
        &server,
        server.creds.project_id,
        server.admin_key(),
        json!({"kind": "RetentionQuery", "retentionFilter": {"period": "Day", "totalIntervals": 3,
               "targetEntity": {"id": "$pageview", "type": "events"}, "returningEntity": {"id": "$pageview", "type": "events"}}}),
    );
    assert_eq!(res.status(), 200);
    let body: Value = res.json().expect("json");
    let cohorts = body["results"].as_array().expect("results");
    let counts: Vec<Vec<u64>> = cohorts
        .iter()
        .map(|c| {
            c["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| v["count"].as_u64().expect("n"))
                .collect()
        })
        .collect();
    // Day −2: a and b; a returns on −1 and 0. Day −1: a; returns on 0. Day 0: a.
    assert_eq!(counts, vec![vec![2, 1, 1], vec![1, 1], vec![1]]);
}

#[test]
fn a_query_cannot_see_another_project() {
    let server = TestServer::new();
    let other = server.create_project("Other");
    let other_id = other["id"].as_u64().expect("id");
    let res = server.post_json(
        "/batch/",
        None,
        &json!({"api_key": other["api_token"], "batch": [{"event": "secret", "distinct_id": "x"}]}),
    );
    assert_eq!(res.status(), 200);
    assert_eq!(
        server
            .capture_batch(&[json!({"event": "mine", "distinct_id": "y"})])
            .status(),
        200
    );
    let body = hogql(&server, "SELECT event FROM events");
    assert_eq!(body["results"], json!([["mine"]]));
    for sql in [
        format!("SELECT * FROM 'events/project={other_id}'"),
        format!("SELECT count() FROM events WHERE project_id = {other_id}"),
        "SELECT * FROM read_parquet('../events')".to_string(),
    ] {
        let res = query(
            &server,
            server.creds.project_id,
            server.admin_key(),
            json!({"kind": "HogQLQuery", "query": sql}),
        );
        if res.status() == 200 {
            let body: Value = res.json().expect("json");
            assert_eq!(body["results"], json!([[0]]), "{sql}");
        } else {
            assert_eq!(res.status(), 400, "{sql}");
        }
    }
    // A key scoped to project 1 cannot query the other project at all.
    let (_, key) = server.create_key(&["query:read"], Some(&[server.creds.project_id]));
    let res = query(
        &server,
        other_id,
        &key,
        json!({"kind": "HogQLQuery", "query": "SELECT 1"}),
    );
    assert_eq!(res.status(), 403);
    // …and the environments alias routes the same way.
    let res = server.post_json(
        &format!("/api/environments/{}/query/", server.creds.project_id),
        Some(&key),
        &json!({"query": {"kind": "HogQLQuery", "query": "SELECT 1 AS one"}}),
    );
    assert_eq!(res.status(), 200);
}

#[test]
fn errors_are_clear_json() {
    let server = TestServer::new();
    let run = |q: Value| query(&server, server.creds.project_id, server.admin_key(), q);
    let res = run(json!({"kind": "HogQLQuery", "query": "SELECT event FROM events WHERE"}));
    assert_eq!(res.status(), 400);
    let body = error_body(res);
    assert_eq!(body["code"], "syntax_error");
    assert_eq!(body["position"]["line"], 1);
    assert!(body["position"]["column"].as_u64().is_some_and(|c| c > 0));

    let res = run(json!({"kind": "HogQLQuery", "query": "DROP TABLE events"}));
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["code"], "invalid_query");

    let res = run(json!({"kind": "HogQLQuery", "query": "SELECT frobnicate(1)"}));
    assert_eq!(res.status(), 400);
    assert!(error_body(res)["detail"]
        .as_str()
        .is_some_and(|d| d.contains("frobnicate")));

    let res = run(json!({"kind": "HogQLQuery", "query": "SELECT {variables.missing}"}));
    assert_eq!(res.status(), 400);
    assert!(error_body(res)["detail"]
        .as_str()
        .is_some_and(|d| d.contains("missing")));

    let res = run(json!({"kind": "FunnelsQuery"}));
    assert_eq!(res.status(), 400);
    assert!(error_body(res)["detail"]
        .as_str()
        .is_some_and(|d| d.contains("FunnelsQuery")));

    let res = run(json!({"kind": "TrendsQuery", "series": [{"event": "x", "math": "sum"}]}));
    assert_eq!(res.status(), 400);

    // Scope: a key without query:read is refused.
    let (_, key) = server.create_key(&["project:read"], None);
    let res = query(
        &server,
        server.creds.project_id,
        &key,
        json!({"kind": "HogQLQuery", "query": "SELECT 1"}),
    );
    assert_eq!(res.status(), 403);
}

#[test]
fn variables_bind_as_values() {
    let server = TestServer::new();
    assert_eq!(
        server
            .capture_batch(&[
                json!({"event": "a", "distinct_id": "1"}),
                json!({"event": "b", "distinct_id": "2"}),
            ])
            .status(),
        200
    );
    let res = server.post_json(
        &format!("/api/projects/{}/query/", server.creds.project_id),
        Some(server.admin_key()),
        &json!({"query": {"kind": "HogQLQuery", "query": "SELECT count() FROM events WHERE event = {variables.name}",
                          "variables": {"7c2d3a2e-0000-4000-8000-000000000001": {"variableId": "7c2d3a2e-0000-4000-8000-000000000001", "code_name": "name", "value": "a"}}}}),
    );
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().expect("json")["results"], json!([[1]]));
    let res = server.post_json(
        &format!("/api/projects/{}/query/", server.creds.project_id),
        Some(server.admin_key()),
        &json!({"query": {"kind": "HogQLQuery", "query": "SELECT count() FROM events WHERE event = {variables.name}"},
                "variables_override": {"name": "b' OR 'x'='x"}}),
    );
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().expect("json")["results"], json!([[0]]));
}
