//! Data lifecycle over real HTTP: person erasure on PostHog's routes (one person, bulk, events
//! only), every read path hiding erased events at once, the compactor removing them from the
//! segment files (read back with a Parquet reader), and `deletion_status` going from pending
//! to completed.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{error_body, fresh, segment_rows, wait_until, TestServer};
use corvid::config::Config;
use serde_json::{json, Value};

/// Erasure settings short enough for a test: a request is worked on after a second. A
/// superseded version stays 10 s, longer than any query of these tests runs on a busy machine
/// (the default is a minute, twice the query deadline).
fn quick(config: &mut Config) {
    config.lifecycle.erasure_interval = Duration::from_millis(200);
    config.lifecycle.erasure_settle = Duration::from_secs(1);
    config.lifecycle.erasure_grace = Duration::from_secs(10);
    config.ingest.flush_interval = Duration::from_secs(1);
}

fn persons_path(server: &TestServer, rest: &str) -> String {
    format!("/api/projects/{}/persons/{rest}", server.creds.project_id)
}

fn hogql(server: &TestServer, sql: &str) -> Value {
    let res = server.post_json(
        &format!("/api/projects/{}/query/", server.creds.project_id),
        Some(server.admin_key()),
        &json!({"query": {"kind": "HogQLQuery", "query": sql}}),
    );
    let status = res.status();
    let body = res.json::<Value>().expect("json");
    assert_eq!(status, 200, "{sql}: {body}");
    body["results"].clone()
}

fn count(server: &TestServer, condition: &str) -> u64 {
    hogql(
        server,
        &format!("SELECT count() FROM events WHERE {condition}"),
    )[0][0]
        .as_u64()
        .expect("count")
}

fn deletion_status(server: &TestServer, query: &str) -> Value {
    let res = server.get(
        &persons_path(server, &format!("deletion_status/?{query}")),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 200);
    res.json().expect("json")
}

/// Every `(distinct_id, created_at µs)` row of the project's segment files on disk.
fn rows_in_segments(data_dir: &Path, project: u64) -> Vec<(String, i64)> {
    let mut rows = Vec::new();
    let root = data_dir.join("events").join(format!("project={project}"));
    let Ok(days) = std::fs::read_dir(&root) else {
        return rows;
    };
    for day in days.flatten() {
        for file in std::fs::read_dir(day.path()).expect("day").flatten() {
            let path = file.path();
            if path.extension().is_some_and(|e| e == "parquet") {
                rows.extend(segment_rows(std::fs::File::open(&path).expect("segment")));
            }
        }
    }
    rows
}

/// How many rows the project's segment files hold, from their footers alone.
fn rows_counted_in_segments(data_dir: &Path, project: u64) -> i64 {
    let root = data_dir.join("events").join(format!("project={project}"));
    let mut rows = 0;
    for day in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(day.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = file.path();
            if path.extension().is_some_and(|e| e == "parquet") {
                let Ok(file) = std::fs::File::open(&path) else {
                    continue; // replaced by a compaction meanwhile
                };
                if let Ok(reader) =
                    parquet::file::serialized_reader::SerializedFileReader::new(file)
                {
                    use parquet::file::reader::FileReader;
                    rows += reader.metadata().file_metadata().num_rows();
                }
            }
        }
    }
    rows
}

fn capture(server: &TestServer, events: &[Value]) {
    for chunk in events.chunks(1000) {
        assert_eq!(server.capture_batch(chunk).status(), 200);
    }
}

/// Events of many people over thirty days, and of one person (first anonymous, then
/// identified) among them.
fn population(total: usize, victim: usize) -> Vec<Value> {
    let others = total - victim;
    let day = |i: usize| format!("2026-10-{:02}T12:00:00Z", 1 + i % 30);
    let mut events: Vec<Value> = (0..others)
        .map(|i| {
            json!({"event": if i % 3 == 0 { "signup" } else { "$pageview" },
                   "distinct_id": format!("user-{}", i % 5000),
                   "timestamp": day(i),
                   "properties": {"$browser": if i % 2 == 0 { "Chrome" } else { "Firefox" }, "n": i}})
        })
        .collect();
    for i in 0..victim {
        let id = if i < victim / 2 {
            "victim-anon"
        } else {
            "victim"
        };
        events.push(
            json!({"event": "$pageview", "distinct_id": id, "timestamp": day(i),
                           "properties": {"$browser": "Chrome", "email": "victim@example.com"}}),
        );
    }
    // The anonymous id becomes the identified person's.
    events.push(json!({"event": "$identify", "distinct_id": "victim", "timestamp": day(0),
                       "properties": {"$anon_distinct_id": "victim-anon", "$set": {"email": "victim@example.com"}}}));
    events
}

#[test]
fn an_erased_person_is_hidden_at_once_and_gone_from_segments_after_the_compactor() {
    const TOTAL: usize = 1_000_000;
    const VICTIM: usize = 10_000;
    let (dir, mut config) = fresh();
    quick(&mut config);
    config.lifecycle.erasure_settle = Duration::from_secs(5);
    // Longer than any query below takes over a million rows in a debug build: a version the
    // erasure superseded stays while a query that listed it may still read it (the rule
    // `erasure_grace` > `query.timeout` the defaults keep).
    config.lifecycle.erasure_grace = Duration::from_secs(90);
    let server = TestServer::start_in(dir, config);
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    capture(&server, &population(TOTAL, VICTIM));
    let victim_rows = (VICTIM + 1) as u64;
    assert_eq!(
        count(&server, "distinct_id IN ('victim', 'victim-anon')"),
        victim_rows
    );
    // Most rows are in segments, the rest still in the tails.
    assert!(wait_until(Duration::from_secs(180), || {
        rows_counted_in_segments(&server.data_dir, project) >= TOTAL as i64 / 2
    }));

    // An endpoint, run once so its answer is cached.
    let endpoint = server.post_json(
        &format!("/api/environments/{project}/endpoints/"),
        Some(&key),
        &json!({"name": "total", "is_materialized": false,
                "query": {"kind": "HogQLQuery", "query": "SELECT count() AS c FROM events"}}),
    );
    assert_eq!(endpoint.status(), 201);
    let run = || {
        let res = server.post_json(
            &format!("/api/environments/{project}/endpoints/total/run"),
            Some(&key),
            &json!({}),
        );
        assert_eq!(res.status(), 200);
        res.json::<Value>().expect("json")["results"][0][0].clone()
    };
    assert_eq!(run(), json!(TOTAL as u64 + 1));

    let person = server.persons(project, "victim");
    assert_eq!(person.len(), 1);
    let uuid = person[0]["uuid"].as_str().expect("uuid").to_string();
    assert_eq!(
        person[0]["distinct_ids"]
            .as_array()
            .expect("ids")
            .iter()
            .filter_map(Value::as_str)
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["victim", "victim-anon"])
    );

    let res = server.delete(
        &persons_path(&server, &format!("{uuid}/?delete_events=true")),
        Some(&key),
    );
    assert_eq!(res.status(), 202);
    let requested = chrono::Utc::now().timestamp_micros();
    // The compactor waits `erasure_settle` before it starts.
    let status = deletion_status(&server, "");
    assert_eq!(status["count"], json!(1));
    assert_eq!(status["results"][0]["person_uuid"], json!(uuid));
    assert_eq!(status["results"][0]["status"], json!("pending"));
    assert_eq!(status["results"][0]["delete_verified_at"], Value::Null);

    // Gone from every read path at once.
    assert!(server.persons(project, "victim").is_empty());
    assert!(server.persons(project, "victim-anon").is_empty());
    assert_eq!(
        server
            .get(&persons_path(&server, &format!("{uuid}/")), Some(&key))
            .status(),
        404
    );
    // (Two days of the thirty, each holding the person's events: an events-API page that finds
    // nothing reads every row of its range, a million in a debug build is slow.)
    let days = "after=2026-10-29T00:00:00Z&before=2026-10-31T00:00:00Z";
    assert!(!server.events(project, days).is_empty());
    assert!(server
        .events(project, &format!("distinct_id=victim&{days}"))
        .is_empty());
    assert!(server
        .events(project, &format!("distinct_id=victim-anon&{days}"))
        .is_empty());
    assert_eq!(
        count(&server, "distinct_id IN ('victim', 'victim-anon')"),
        0
    );
    assert_eq!(
        count(&server, "properties.$browser = 'Chrome'"),
        (TOTAL - VICTIM) as u64 / 2
    );
    assert_eq!(
        run(),
        json!((TOTAL - VICTIM) as u64),
        "the cached answer is not served"
    );
    let trends = server.post_json(
        &format!("/api/projects/{project}/query/"),
        Some(&key),
        &json!({"query": {"kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview", "math": "total"}],
                "dateRange": {"date_from": "2026-10-01", "date_to": "2026-10-31"}, "interval": "month"}}),
    );
    assert_eq!(trends.status(), 200);
    let trends: Value = trends.json().expect("json");
    let pageviews = (0..TOTAL - VICTIM).filter(|i| i % 3 != 0).count() as f64;
    assert_eq!(trends["results"][0]["count"].as_f64(), Some(pageviews));

    // The distinct id seen again makes a new person, whose events stay.
    capture(
        &server,
        &[json!({"event": "came back", "distinct_id": "victim", "properties": {}})],
    );
    assert_eq!(server.persons(project, "victim").len(), 1);
    assert_eq!(
        server
            .events(project, "distinct_id=victim&after=2026-11-01T00:00:00Z")
            .len(),
        1
    );

    // The compactor removes the rows from the files, then verifies.
    assert!(
        wait_until(Duration::from_secs(400), || {
            deletion_status(&server, "status=completed")["count"] == json!(1)
        }),
        "completed: {}",
        deletion_status(&server, "")
    );
    let completed = deletion_status(&server, &format!("person_uuid={uuid}"));
    assert_eq!(completed["results"][0]["status"], json!("completed"));
    assert!(completed["results"][0]["delete_verified_at"].is_string());
    assert_eq!(
        deletion_status(&server, "status=pending")["count"],
        json!(0)
    );
    let rows = rows_in_segments(&server.data_dir, project);
    let leftovers = rows
        .iter()
        .filter(|(id, at)| (id == "victim" || id == "victim-anon") && *at <= requested)
        .count();
    assert_eq!(leftovers, 0, "no erased event is left in any segment file");
    assert!(rows.len() >= TOTAL / 2, "the other events are still stored");
    assert_eq!(
        count(&server, "1 = 1"),
        (TOTAL - VICTIM) as u64 + 1,
        "and the new one"
    );

    // The deletion is in the activity list: who, when, what, how many events.
    let activity: Value = server
        .get(&persons_path(&server, "activity/"), Some(&key))
        .json()
        .expect("json");
    let entry = &activity["results"][0];
    assert_eq!(entry["scope"], json!("Person"));
    assert_eq!(entry["activity"], json!("deleted"));
    assert_eq!(entry["item_id"], json!(uuid));
    assert!(entry["user"]["email"].is_string());
    assert!(entry["detail"]["events_removed"].as_u64().expect("count") <= victim_rows);
}

#[test]
fn bulk_delete_speaks_posthogs_contract() {
    let (dir, mut config) = fresh();
    quick(&mut config);
    let server = TestServer::start_in(dir, config);
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let events: Vec<Value> = ["a", "b", "c", "d"]
        .iter()
        .flat_map(|d| {
            (0..3).map(move |i| {
                json!({"event": "e", "distinct_id": d, "properties": {"$set": {"plan": "pro", "i": i}}})
            })
        })
        .collect();
    capture(&server, &events);
    let bulk =
        |body: Value| server.post_json(&persons_path(&server, "bulk_delete/"), Some(&key), &body);

    // PostHog's 400 texts, in its order.
    let many: Vec<String> = (0..1001).map(|i| format!("d{i}")).collect();
    for (body, text) in [
        (
            json!({"ids": ["x"], "distinct_ids": ["a"]}),
            "You must provide either distinct_ids or ids, not both",
        ),
        (
            json!({"distinct_ids": many}),
            "You can only pass 1000 distinct_ids in one call",
        ),
        (
            json!({"ids": many}),
            "You can only pass 1000 ids in one call",
        ),
        (json!({}), "You need to specify either distinct_ids or ids"),
    ] {
        let err = error_body(bulk(body));
        assert_eq!(err["detail"], json!(text));
        assert_eq!(err["type"], json!("validation_error"));
    }
    let err = error_body(server.delete(&persons_path(&server, "not-a-person/"), Some(&key)));
    assert_eq!(
        err["detail"],
        json!("The ID provided does not look like a personID. If you are using a distinctId, please use /persons?distinct_id=not-a-person instead.")
    );
    let missing = server.delete(
        &persons_path(&server, &format!("{}/", uuid::Uuid::new_v4())),
        Some(&key),
    );
    assert_eq!(missing.status(), 404);
    assert_eq!(error_body(missing)["detail"], json!("Person not found."));
    let err = error_body(server.get(
        &persons_path(&server, "deletion_status/?status=done"),
        Some(&key),
    ));
    assert_eq!(err["attr"], json!("status"));

    // By distinct ids, events too: a and b go, an unknown id is not counted.
    let res = bulk(json!({"distinct_ids": ["a", "b", "nobody"], "delete_events": true}));
    assert_eq!(res.status(), 202);
    assert_eq!(
        res.json::<Value>().expect("json"),
        json!({"persons_found": 2, "persons_deleted": 2, "events_queued_for_deletion": true,
               "recordings_queued_for_deletion": false, "deletion_errors": []})
    );
    assert!(server.persons(project, "a").is_empty());
    assert_eq!(count(&server, "distinct_id IN ('a', 'b')"), 0);
    assert_eq!(
        deletion_status(&server, "status=pending")["count"],
        json!(2)
    );

    // keep_person: the person stays, its events go.
    let c = server.persons(project, "c")[0]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let res = bulk(json!({"ids": [c], "delete_events": true, "keep_person": true}));
    assert_eq!(
        res.json::<Value>().expect("json"),
        json!({"persons_found": 1, "persons_deleted": 0, "events_queued_for_deletion": true,
               "recordings_queued_for_deletion": false, "deletion_errors": []})
    );
    assert_eq!(server.persons(project, "c").len(), 1);
    assert_eq!(count(&server, "distinct_id = 'c'"), 0);

    // Without delete_events the events stay (PostHog's default).
    let d = server.persons(project, "d")[0]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    assert_eq!(
        server
            .delete(&persons_path(&server, &format!("{d}/")), Some(&key))
            .status(),
        202
    );
    assert!(server.persons(project, "d").is_empty());
    assert_eq!(count(&server, "distinct_id = 'd'"), 3);
    assert_eq!(
        deletion_status(&server, "")["count"],
        json!(3),
        "only event erasures are listed"
    );

    // delete_events on one person, delete_property, reset_person_distinct_id.
    capture(
        &server,
        &[
            json!({"event": "e", "distinct_id": "f", "properties": {"$set": {"plan": "pro", "email": "f@example.com"}}}),
        ],
    );
    let f = server.persons(project, "f")[0]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let res = server.post_json(
        &persons_path(&server, &format!("{f}/delete_property/")),
        Some(&key),
        &json!({"$unset": "email"}),
    );
    assert_eq!(res.status(), 201);
    assert_eq!(res.json::<Value>().expect("json"), json!({"success": true}));
    let props = &server.persons(project, "f")[0]["properties"];
    assert_eq!(props, &json!({"plan": "pro"}));
    let res = server.post_json(
        &persons_path(&server, &format!("{f}/delete_events/")),
        Some(&key),
        &json!({}),
    );
    assert_eq!(res.status(), 202);
    assert_eq!(count(&server, "distinct_id = 'f'"), 0);
    assert_eq!(server.persons(project, "f").len(), 1);
    let reset = |id: &str| {
        server.post_json(
            &persons_path(&server, "reset_person_distinct_id/"),
            Some(&key),
            &json!({"distinct_id": id}),
        )
    };
    assert_eq!(reset("a").status(), 202, "an erased person's id");
    let err = error_body(reset("never-seen"));
    assert_eq!(err["detail"], json!("Distinct id never-seen not found"));
    let err = error_body(server.post_json(
        &persons_path(&server, "reset_person_distinct_id/"),
        Some(&key),
        &json!({}),
    ));
    assert_eq!(err["detail"], json!("distinct_id is required"));

    // Reading keys cannot delete.
    let (_, reader) = server.create_key(&["person:read"], None);
    assert_eq!(
        bulk_with(&server, &reader, json!({"distinct_ids": ["c"]})).status(),
        403
    );

    assert!(wait_until(Duration::from_secs(60), || {
        deletion_status(&server, "status=pending")["count"] == json!(0)
    }));
    let activity: Value = server
        .get(&persons_path(&server, "activity/?limit=2"), Some(&key))
        .json()
        .expect("json");
    assert_eq!(activity["count"], json!(5));
    assert_eq!(activity["results"].as_array().expect("page").len(), 2);
    assert!(activity["next"]
        .as_str()
        .is_some_and(|n| n.contains("offset=2")));
}

fn bulk_with(server: &TestServer, key: &str, body: Value) -> reqwest::blocking::Response {
    server.post_json(&persons_path(server, "bulk_delete/"), Some(key), &body)
}

/// Every segment file of the project (current and superseded versions).
fn segment_files(data_dir: &Path, project: u64) -> Vec<std::path::PathBuf> {
    let root = data_dir.join("events").join(format!("project={project}"));
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|day| {
            std::fs::read_dir(day.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect()
}

#[test]
fn an_erasure_cut_short_by_kill_9_completes_after_restart() {
    use common::process::spawn_corvid;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("corvid.toml");
    std::fs::write(
        &config,
        "[ingest]\nflush_interval = \"1s\"\n\
         [lifecycle]\nerasure_interval = \"100ms\"\nerasure_settle = \"0s\"\nerasure_grace = \"10s\"\n",
    )
    .expect("config");
    let data = dir.path().join("data");
    let (mut child, base) = spawn_corvid(&data, Some(&config));
    let creds = common::read_credentials(&data);
    let http = common::client_builder().build().expect("client");
    let events = population(60_000, 6_000);
    for chunk in events.chunks(1000) {
        let res = http
            .post(format!("{base}/batch/"))
            .json(&json!({"api_key": creds.project_token, "batch": chunk}))
            .send()
            .expect("capture");
        assert_eq!(res.status(), 200);
    }
    let persons: Value = http
        .get(format!("{base}/api/projects/1/persons/?distinct_id=victim"))
        .bearer_auth(&creds.personal_api_key)
        .send()
        .expect("persons")
        .json()
        .expect("json");
    let uuid = persons["results"][0]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    // Everything is in segments before the request, so the pass has thirty days to rewrite.
    assert!(wait_until(Duration::from_secs(30), || {
        segment_files(&data, 1)
            .iter()
            .map(|p| segment_rows(std::fs::File::open(p).expect("segment")).len())
            .sum::<usize>()
            == 60_001
    }));
    let res = http
        .delete(format!(
            "{base}/api/projects/1/persons/{uuid}/?delete_events"
        ))
        .bearer_auth(&creds.personal_api_key)
        .send()
        .expect("delete");
    assert_eq!(res.status(), 202);
    let requested = chrono::Utc::now().timestamp_micros();
    // Killed as soon as the first rewritten version is published.
    assert!(wait_until(Duration::from_secs(60), || {
        segment_files(&data, 1)
            .iter()
            .any(|p| p.to_string_lossy().contains(".v1."))
    }));
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let mut config = corvid::config::Config::for_test(&data);
    quick(&mut config);
    let server = TestServer::start(config);
    // Nothing half-done shows: the person's events are hidden, everyone else's are all there.
    assert_eq!(
        count(&server, "distinct_id IN ('victim', 'victim-anon')"),
        0
    );
    assert_eq!(count(&server, "1 = 1"), 54_000);
    assert!(
        wait_until(Duration::from_secs(120), || {
            deletion_status(&server, "status=completed")["count"] == json!(1)
        }),
        "the erasure completes after the restart: {}",
        deletion_status(&server, "")
    );
    let leftovers: usize = segment_files(&data, 1)
        .iter()
        .flat_map(|p| segment_rows(std::fs::File::open(p).expect("segment")))
        .filter(|(id, at)| (id == "victim" || id == "victim-anon") && *at <= requested)
        .count();
    assert_eq!(leftovers, 0);
    assert_eq!(count(&server, "1 = 1"), 54_000);
}

#[test]
fn materialized_endpoint_answers_forget_an_erased_person() {
    let (dir, mut config) = fresh();
    quick(&mut config);
    config.endpoints.materialize_check_interval = Duration::from_millis(200);
    let server = TestServer::start_in(dir, config);
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let events: Vec<Value> = ["a", "a", "b"]
        .iter()
        .map(|d| json!({"event": "e", "distinct_id": d, "properties": {}}))
        .collect();
    capture(&server, &events);
    let res = server.post_json(
        &format!("/api/environments/{project}/endpoints/"),
        Some(&key),
        &json!({"name": "per-person", "is_materialized": true, "data_freshness_seconds": 3600,
                "query": {"kind": "HogQLQuery",
                          "query": "SELECT distinct_id, count() AS c FROM events GROUP BY distinct_id ORDER BY distinct_id"}}),
    );
    assert_eq!(res.status(), 201);
    let status = || -> Value {
        server
            .get(
                &format!("/api/environments/{project}/endpoints/per-person/materialization_status"),
                Some(&key),
            )
            .json()
            .expect("json")
    };
    let run = || -> Value {
        let res = server.post_json(
            &format!("/api/environments/{project}/endpoints/per-person/run"),
            Some(&key),
            &json!({}),
        );
        assert_eq!(res.status(), 200);
        res.json().expect("json")
    };
    assert!(wait_until(Duration::from_secs(30), || status()["status"]
        == json!("Completed")));
    let before = status()["last_materialized_at"].clone();
    assert_eq!(run()["results"], json!([["a", 2], ["b", 1]]));

    let requested = chrono::Utc::now();
    let res = server.post_json(
        &persons_path(&server, "bulk_delete/"),
        Some(&key),
        &json!({"distinct_ids": ["a"], "delete_events": true}),
    );
    assert_eq!(res.status(), 202);
    // The stored result predates the erasure: not served; the run goes to the events.
    assert_eq!(run()["results"], json!([["b", 1]]));
    // The materializer computes the result again, from a run begun after the request (one
    // begun before it does not count); answers still leave the person out.
    let materialized_after_request = || {
        status()["last_materialized_at"]
            .as_str()
            .and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok())
            .is_some_and(|t| t >= requested)
    };
    assert!(
        wait_until(Duration::from_secs(30), || status()["status"]
            == json!("Completed")
            && materialized_after_request()),
        "{}",
        status()
    );
    assert_ne!(status()["last_materialized_at"], before);
    assert_eq!(run()["results"], json!([["b", 1]]));
}

#[test]
fn retention_drops_old_days_and_keeps_the_rest() {
    let (dir, mut config) = fresh();
    quick(&mut config);
    config.lifecycle.retention_interval = Duration::from_millis(200);
    let server = TestServer::start_in(dir, config);
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let today = chrono::Utc::now().date_naive();
    let at = |days_ago: u64| {
        let day = today - chrono::Days::new(days_ago);
        format!("{day}T12:00:00Z")
    };
    let mut events = Vec::new();
    for (days_ago, n) in [(0, 3), (5, 4), (29, 2), (30, 5), (100, 6)] {
        for i in 0..n {
            events.push(json!({"event": "e", "distinct_id": format!("u{i}"), "timestamp": at(days_ago), "properties": {}}));
        }
    }
    capture(&server, &events);
    assert!(wait_until(Duration::from_secs(20), || {
        rows_in_segments(&server.data_dir, project).len() == 20
    }));
    assert_eq!(count(&server, "1 = 1"), 20);

    let patch = |body: Value| {
        server
            .client
            .patch(server.url(&format!("/api/projects/{project}/")))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .expect("patch")
    };
    for bad in [json!(0), json!(-3), json!("thirty"), json!(36_501)] {
        let res = patch(json!({"event_retention_days": bad}));
        assert_eq!(res.status(), 400, "{bad}");
    }
    let res = patch(json!({"event_retention_days": 30}));
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().expect("json")["event_retention_days"],
        json!(30)
    );

    // Today and the 29 days before it stay; the older days leave every read path.
    assert!(wait_until(Duration::from_secs(20), || count(
        &server, "1 = 1"
    ) == 9));
    let kept: BTreeSet<String> = server
        .events(project, "limit=100")
        .iter()
        .map(|e| e["timestamp"].as_str().expect("ts")[..10].to_string())
        .collect();
    assert_eq!(
        kept,
        [0u64, 5, 29]
            .iter()
            .map(|d| (today - chrono::Days::new(*d)).to_string())
            .collect()
    );
    assert_eq!(rows_in_segments(&server.data_dir, project).len(), 9);
    let drops: Value = server
        .get(
            &format!("/api/projects/{project}/retention_drops/"),
            Some(&key),
        )
        .json()
        .expect("json");
    assert_eq!(drops["count"], json!(2));
    assert_eq!(drops["results"][0]["event_retention_days"], json!(30));
    let dropped: BTreeSet<(String, u64)> = drops["results"]
        .as_array()
        .expect("drops")
        .iter()
        .map(|d| {
            (
                d["day"].as_str().expect("day").to_string(),
                d["events"].as_u64().expect("n"),
            )
        })
        .collect();
    assert_eq!(
        dropped,
        BTreeSet::from([
            ((today - chrono::Days::new(30)).to_string(), 5),
            ((today - chrono::Days::new(100)).to_string(), 6),
        ])
    );

    // Back to the instance's default (keep everything): nothing more goes.
    let res = patch(json!({"event_retention_days": null}));
    assert_eq!(
        res.json::<Value>().expect("json")["event_retention_days"],
        Value::Null
    );
    capture(
        &server,
        &[json!({"event": "e", "distinct_id": "late", "timestamp": at(200), "properties": {}})],
    );
    assert!(wait_until(Duration::from_secs(10), || count(
        &server, "1 = 1"
    ) == 10));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(&server, "1 = 1"), 10);
}

/// The `(uuid, event, distinct_id)` rows of an export file, read by pyarrow (Parquet) or by
/// Python's own gzip and json (JSON Lines).
fn read_back(path: &Path, format: &str) -> Vec<(String, String, String)> {
    let script = r#"
import gzip, json, sys
path, fmt = sys.argv[1], sys.argv[2]
if fmt == "Parquet":
    import pyarrow.parquet as pq
    table = pq.read_table(path)
    assert table.column_names == ["uuid", "timestamp", "_inserted_at", "created_at", "event",
        "properties", "distinct_id", "elements_chain", "person_properties", "person_id"], table.column_names
    rows = table.to_pylist()
else:
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
for r in rows:
    json.loads(r["properties"])
print(json.dumps([[r["uuid"], r["event"], r["distinct_id"]] for r in rows]))
"#;
    let out = std::process::Command::new(common::sdk::python())
        .args(["-c", script])
        .arg(path)
        .arg(format)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<(String, String, String)> = serde_json::from_slice(&out.stdout).expect("rows");
    rows
}

#[test]
fn file_exports_are_read_back_by_an_independent_reader_and_match_the_events() {
    let server = TestServer::new();
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let base = format!("/api/environments/{project}/file_download_batch_exports");
    let events: Vec<Value> = (0..2500)
        .map(|i| {
            json!({"event": if i % 10 == 0 { "skip" } else { "kept" }, "distinct_id": format!("u{}", i % 40),
                   "timestamp": format!("2025-0{}-0{}T10:00:00Z", 1 + i % 3, 1 + i % 7),
                   "properties": {"i": i}})
        })
        .collect();
    capture(&server, &events);
    let expected: BTreeSet<(String, String, String)> = hogql(
        &server,
        "SELECT toString(uuid), event, distinct_id FROM events WHERE event != 'skip' LIMIT 50000",
    )
    .as_array()
    .expect("rows")
    .iter()
    .map(|r| {
        (
            r[0].as_str().expect("uuid").to_string(),
            r[1].as_str().expect("event").to_string(),
            r[2].as_str().expect("id").to_string(),
        )
    })
    .collect();
    assert_eq!(expected.len(), 2250);
    let now = chrono::Utc::now();
    let window = |format: &str, compression: Value| {
        json!({"model": "events",
               "file": {"format": format, "compression": compression},
               "data_interval_start": (now - chrono::Duration::hours(1)).to_rfc3339(),
               "data_interval_end": (now + chrono::Duration::hours(1)).to_rfc3339(),
               "exclude": ["skip"]})
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for (format, compression) in [("Parquet", json!("zstd")), ("JSONLines", json!("gzip"))] {
        let res = server.post_json(&base, Some(&key), &window(format, compression));
        assert_eq!(res.status(), 202);
        let id = res.json::<Value>().expect("json")["id"]
            .as_str()
            .expect("id")
            .to_string();
        let status = || -> Value {
            server
                .get(&format!("{base}/{id}"), Some(&key))
                .json()
                .expect("json")
        };
        assert!(
            wait_until(Duration::from_secs(60), || status()["status"]
                == json!("Completed")),
            "{}",
            status()
        );
        assert_eq!(status()["files"].as_array().expect("files").len(), 1);
        // PostHog answers a download with a redirect to the file.
        let res = server
            .client
            .get(server.url(&format!("{base}/{id}/download")))
            .bearer_auth(&key)
            .send()
            .expect("download");
        assert_eq!(res.status(), 200);
        let path = dir.path().join(format!("export.{format}"));
        std::fs::write(&path, res.bytes().expect("bytes")).expect("save");
        let rows: BTreeSet<_> = read_back(&path, format).into_iter().collect();
        assert_eq!(
            rows, expected,
            "{format}: the export holds exactly the events"
        );
        let missing = server.get(&format!("{base}/{id}/download/1"), Some(&key));
        assert_eq!(
            error_body(missing)["detail"],
            json!("No files with index 1")
        );
    }

    // PostHog's refusals.
    let err = error_body(server.post_json(&base, Some(&key), &window("JSONLines", json!("zstd"))));
    assert!(
        err["detail"]
            .as_str()
            .expect("detail")
            .contains("not supported"),
        "{err}"
    );
    let mut long = window("Parquet", Value::Null);
    long["data_interval_start"] = json!((now - chrono::Duration::days(8)).to_rfc3339());
    let err = error_body(server.post_json(&base, Some(&key), &long));
    assert!(
        err["detail"].as_str().expect("detail").contains("one week"),
        "{err}"
    );
    let unknown = server.get(&format!("{base}/{}", uuid::Uuid::new_v4()), Some(&key));
    assert_eq!(unknown.status(), 404);
    let (_, reader) = server.create_key(&["batch_export:read"], None);
    assert_eq!(
        server
            .post_json(&base, Some(&reader), &window("Parquet", Value::Null))
            .status(),
        403
    );
}

#[test]
fn finished_exports_expire_with_their_files() {
    let (dir, mut config) = fresh();
    config.lifecycle.retention_interval = Duration::from_millis(200);
    config.lifecycle.export_run_ttl = Duration::from_secs(2);
    let server = TestServer::start_in(dir, config);
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let base = format!("/api/environments/{project}/file_download_batch_exports");
    capture(
        &server,
        &[json!({"event": "e", "distinct_id": "a", "properties": {}})],
    );
    let now = chrono::Utc::now();
    let res = server.post_json(
        &base,
        Some(&key),
        &json!({"model": "events", "file": {"format": "JSONLines"},
                "data_interval_start": (now - chrono::Duration::hours(1)).to_rfc3339(),
                "data_interval_end": (now + chrono::Duration::hours(1)).to_rfc3339()}),
    );
    assert_eq!(res.status(), 202);
    let id = res.json::<Value>().expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    let run_dir = server
        .data_dir
        .join("exports")
        .join(format!("project_{project}"))
        .join(&id);
    assert!(wait_until(Duration::from_secs(30), || {
        server
            .get(&format!("{base}/{id}"), Some(&key))
            .json::<Value>()
            .expect("json")["status"]
            == json!("Completed")
    }));
    assert!(run_dir.exists());
    assert!(
        wait_until(Duration::from_secs(30), || {
            server.get(&format!("{base}/{id}"), Some(&key)).status() == 404
        }),
        "the run expires"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !run_dir.exists()),
        "with its files"
    );
}
