//! Log search for ops over real HTTP: endpoint runs searched across endpoints by text, status
//! and duration, with a histogram and percentiles that add up; a live tail over SSE that shows
//! a run's line as it happens and resumes after `Last-Event-ID`.

mod common;

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use common::{wait_until, TestServer};
use serde_json::{json, Value};

fn create(server: &TestServer, name: &str, sql: &str) {
    let res = server.post_json(
        "/api/projects/1/endpoints/",
        Some(server.admin_key()),
        &json!({"name": name, "query": {"kind": "HogQLQuery", "query": sql}}),
    );
    assert_eq!(res.status(), 201, "{}", res.text().unwrap_or_default());
}

fn run(server: &TestServer, name: &str) -> u16 {
    server
        .post_json(
            &format!("/api/projects/1/endpoints/{name}/run"),
            Some(server.admin_key()),
            &json!({}),
        )
        .status()
        .as_u16()
}

fn search(server: &TestServer, query: &str) -> Value {
    let res = server.get(
        &format!("/api/projects/1/logs/search/?{query}"),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 200);
    res.json().expect("json")
}

/// Waits until the search finds `n` lines (the log is written a moment after each run).
fn settled(server: &TestServer, query: &str, n: u64) -> Value {
    assert!(
        wait_until(Duration::from_secs(10), || search(server, query)["total"]
            == n),
        "{query}: {}",
        search(server, query)
    );
    search(server, query)
}

#[test]
fn runs_are_searched_across_endpoints_with_a_histogram_and_percentiles() {
    let server = TestServer::new();
    create(&server, "counts", "SELECT count() FROM events");
    create(&server, "broken", "SELECT 1 / 0 FROM events");
    for _ in 0..3 {
        assert_eq!(run(&server, "counts"), 200);
    }
    let failed = run(&server, "broken");
    assert!(failed >= 400, "the broken endpoint fails: {failed}");

    let all = settled(&server, "", 4);
    let histogram = all["histogram"].as_array().expect("histogram");
    let counted: u64 = histogram
        .iter()
        .map(|b| b["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(counted, 4, "the buckets add up to the total");
    assert_eq!(all["bucket_seconds"], 60, "an hour in minute buckets");
    let endpoints = all["endpoints"].as_array().expect("endpoints");
    let counts = endpoints
        .iter()
        .find(|e| e["endpoint"] == "counts")
        .expect("counts");
    assert_eq!(counts["count"], 3);
    assert_eq!(counts["errors"], 0);
    assert!(counts["duration_ms"]["p50"].is_u64(), "{counts}");
    assert!(counts["duration_ms"]["p99"].as_u64() >= counts["duration_ms"]["p50"].as_u64());
    let broken = endpoints
        .iter()
        .find(|e| e["endpoint"] == "broken")
        .expect("broken");
    assert_eq!(broken["error_rate"], 1.0);

    let errors = search(&server, "status=%3E%3D400");
    assert_eq!(errors["total"], 1);
    assert_eq!(errors["results"][0]["endpoint"], "broken");
    assert_eq!(errors["results"][0]["level"], "ERROR");
    assert_eq!(errors["results"][0]["status"], failed);
    assert_eq!(search(&server, "endpoint=counts")["total"], 3);
    assert_eq!(
        search(&server, "search=cache%3Dmiss&endpoint=counts")["total"],
        1
    );
    assert_eq!(search(&server, "level=ERROR")["total"], 1);
    assert_eq!(search(&server, "min_duration_ms=100000")["total"], 0);
    assert_eq!(
        search(&server, "limit=2")["results"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let before = "before=2000-01-01T00:00:00Z&after=1999-12-31T00:00:00Z";
    assert_eq!(search(&server, before)["total"], 0);

    let bad = server.get(
        "/api/projects/1/logs/search/?status=abc",
        Some(server.admin_key()),
    );
    assert_eq!(bad.status(), 400);
    let missing = server.get(
        "/api/projects/1/logs/search/?endpoint=nope",
        Some(server.admin_key()),
    );
    assert_eq!(missing.status(), 404);
    let (_, no_scope) = server.create_key(&["feature_flag:read"], None);
    assert_eq!(
        server
            .get("/api/projects/1/logs/search/", Some(&no_scope))
            .status(),
        403
    );
}

/// Reads `(id, data)` events of an SSE response on a thread, as they come.
fn events(res: reqwest::blocking::Response) -> mpsc::Receiver<(String, Value)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut id = String::new();
        for line in BufReader::new(res).lines() {
            let Ok(line) = line else { return };
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.to_string();
            } else if let Some(data) = line.strip_prefix("data: ") {
                let Ok(data) = serde_json::from_str(data) else {
                    continue;
                };
                if tx.send((id.clone(), data)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

fn tail(server: &TestServer, last_event_id: Option<&str>) -> reqwest::blocking::Response {
    let client = common::client_builder()
        .timeout(None)
        .build()
        .expect("client");
    let mut req = client
        .get(server.url("/api/projects/1/logs/tail/?endpoint=counts"))
        .bearer_auth(server.admin_key());
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id);
    }
    let res = req.send().expect("tail");
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    res
}

#[test]
fn a_live_tail_shows_each_run_and_resumes_after_the_last_event() {
    let server = TestServer::new();
    create(&server, "counts", "SELECT count() FROM events");
    create(&server, "other", "SELECT 1");
    let live = events(tail(&server, None));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(run(&server, "other"), 200);
    assert_eq!(run(&server, "counts"), 200);
    let (first_id, first) = live.recv_timeout(Duration::from_secs(10)).expect("a line");
    assert_eq!(first["endpoint"], "counts", "the tail's filter holds");
    assert_eq!(first["status"], 200);
    assert!(first["message"]
        .as_str()
        .is_some_and(|m| m.contains("Endpoint executed")));

    // Two more runs; a tail resumed after the first event sees exactly those.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(run(&server, "counts"), 200);
    assert_eq!(run(&server, "counts"), 200);
    let resumed = events(tail(&server, Some(&first_id)));
    let a = resumed
        .recv_timeout(Duration::from_secs(10))
        .expect("second");
    let b = resumed
        .recv_timeout(Duration::from_secs(10))
        .expect("third");
    assert!(
        a.0 != first_id && b.0 != first_id && a.0 < b.0,
        "{} {} {}",
        first_id,
        a.0,
        b.0
    );
    assert!(
        resumed.recv_timeout(Duration::from_millis(1500)).is_err(),
        "nothing else"
    );
}
