//! Scheduled exports to an S3-compatible bucket (moto's server from PyPI) over real HTTP, on
//! PostHog's `/batch_exports/` routes: runs on the schedule, the objects and their manifest
//! read back and matched against the events, a failing bucket retried without duplicate rows,
//! retries, backfills, pause, cancel, PostHog's 400 texts, and a node killed mid-run.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::process::S3Server;
use common::{error_body, wait_until, TestServer};
use corvid::config::Config;
use serde_json::{json, Value};

/// A schedule quick enough for a test: a tick a second, runs two seconds after their
/// interval, retries after a second.
fn quick(config: &mut Config) {
    config.lifecycle.batch_export_tick = Duration::from_millis(500);
    config.lifecycle.batch_export_settle = Duration::from_secs(2);
    config.lifecycle.batch_export_retry = Duration::from_secs(1);
    config.lifecycle.dev_allow_private_export_endpoints = true;
    config.ingest.flush_interval = Duration::from_secs(1);
}

fn quick_server() -> TestServer {
    let (dir, mut config) = common::fresh();
    quick(&mut config);
    TestServer::start_in(dir, config)
}

fn path(server: &TestServer, rest: &str) -> String {
    format!(
        "/api/projects/{}/batch_exports/{rest}",
        server.creds.project_id
    )
}

fn destination(s3: &S3Server, bucket: &str, extra: Value) -> Value {
    let mut config = json!({
        "bucket_name": bucket,
        "region": "us-east-1",
        "prefix": "corvid/{table}/",
        "endpoint_url": s3.url,
        "aws_access_key_id": "test",
        "aws_secret_access_key": "hidden-secret",
        "file_format": "JSONLines",
    });
    for (k, v) in extra.as_object().expect("object") {
        config[k] = v.clone();
    }
    json!({"type": "S3", "config": config})
}

/// Events of several names, all captured now.
fn capture(server: &TestServer, tag: &str, n: usize) {
    let events: Vec<Value> = (0..n)
        .map(|i| {
            json!({"event": if i % 4 == 0 { "excluded" } else { "$pageview" },
                   "distinct_id": format!("{tag}-{}", i % 50),
                   "properties": {"n": i, "tag": tag}})
        })
        .collect();
    for chunk in events.chunks(500) {
        assert_eq!(server.capture_batch(chunk).status(), 200);
    }
}

fn hogql_uuids(server: &TestServer, condition: &str) -> BTreeSet<String> {
    let res = server.post_json(
        &format!("/api/projects/{}/query/", server.creds.project_id),
        Some(server.admin_key()),
        &json!({"query": {"kind": "HogQLQuery",
                          "query": format!("SELECT uuid FROM events WHERE {condition} LIMIT 100000")}}),
    );
    assert_eq!(res.status(), 200);
    res.json::<Value>().expect("json")["results"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r[0].as_str().expect("uuid").to_string())
        .collect()
}

fn runs(server: &TestServer, export: &str) -> Vec<Value> {
    let res = server.get(
        &path(server, &format!("{export}/runs/")),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 200);
    res.json::<Value>().expect("json")["results"]
        .as_array()
        .expect("runs")
        .clone()
}

fn create(server: &TestServer, body: &Value) -> Value {
    let res = server.post_json(&path(server, ""), Some(server.admin_key()), body);
    let status = res.status();
    let created: Value = res.json().expect("json");
    assert_eq!(status, 201, "{created}");
    created
}

#[test]
fn a_scheduled_export_writes_every_interval_once_with_its_manifest_last() {
    let s3 = S3Server::start();
    s3.create_bucket("exports");
    let server = quick_server();
    capture(&server, "a", 2_000);
    let start_at = chrono::Utc::now() - chrono::Duration::minutes(2);
    let created = create(
        &server,
        &json!({"name": "to moto", "interval": "every 1 minute", "model": "events",
                "start_at": start_at.to_rfc3339(),
                "destination": destination(&s3, "exports", json!({"exclude_events": ["excluded"]}))}),
    );
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["interval"], "every 1 minute");
    assert!(
        !created.to_string().contains("hidden-secret"),
        "keys are never returned: {created}"
    );
    assert!(created["destination"]["config"]
        .get("aws_secret_access_key")
        .is_none());
    let read = server.admin_get(&path(&server, &format!("{id}/")));
    assert!(!read.to_string().contains("hidden-secret"));
    let expected = hogql_uuids(&server, "event != 'excluded'");
    assert_eq!(expected.len(), 1_500);

    // The schedule runs each interval that ended; the one the events fell in among them.
    let done = wait_until(Duration::from_secs(180), || {
        s3.manifest_rows("exports", "corvid/events/").len() == expected.len()
    });
    let all_runs = runs(&server, &id);
    assert!(done, "every event exported: {all_runs:#?}");
    let seen = s3.manifest_rows("exports", "corvid/events/");
    let listed = s3.keys("exports", "corvid/events/");
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(seen.values().all(|n| *n == 1), "no row twice");
    assert!(listed
        .iter()
        .all(|k| k.ends_with(".jsonl") || k.ends_with("_manifest.json")));
    // Every run is the schedule's own (no backfill), one per interval, completed with its
    // rows counted; the manifest is the last key it wrote.
    let completed: Vec<&Value> = all_runs
        .iter()
        .filter(|r| r["status"] == "Completed")
        .collect();
    assert!(completed.len() >= 2, "{all_runs:#?}");
    assert!(all_runs.iter().all(|r| r["backfill"].is_null()));
    let intervals: BTreeSet<&str> = all_runs
        .iter()
        .map(|r| r["data_interval_start"].as_str().expect("start"))
        .collect();
    assert_eq!(intervals.len(), all_runs.len(), "one run per interval");
    let exported_rows: u64 = completed
        .iter()
        .map(|r| r["records_completed"].as_u64().expect("records"))
        .sum();
    assert_eq!(exported_rows, 1_500);
    let latest = server.admin_get(&path(&server, &format!("{id}/")))["latest_runs"].clone();
    let latest = latest.as_array().expect("latest runs");
    assert!(!latest.is_empty() && latest.len() <= 10, "{latest:?}");

    // A second look at the schedule later adds runs for the new intervals, not for old ones.
    let before = runs(&server, &id).len();
    assert!(wait_until(Duration::from_secs(150), || runs(&server, &id)
        .len()
        > before));
    let after = runs(&server, &id);
    let intervals: BTreeSet<&str> = after
        .iter()
        .map(|r| r["data_interval_start"].as_str().expect("start"))
        .collect();
    assert_eq!(intervals.len(), after.len());

    // Pausing stops new runs; DELETE hides the export.
    let res = server.post_json(
        &path(&server, &format!("{id}/pause/")),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(res.json::<Value>().expect("json"), json!({"paused": true}));
    assert_eq!(
        server.admin_get(&path(&server, &format!("{id}/")))["paused"],
        true
    );
    let res = server.delete(&path(&server, &format!("{id}/")), Some(server.admin_key()));
    assert_eq!(res.status(), 204);
    let res = server.get(&path(&server, &format!("{id}/")), Some(server.admin_key()));
    assert_eq!(res.status(), 404);
}

#[test]
fn a_failing_bucket_is_retried_and_a_retry_overwrites_rather_than_duplicates() {
    let s3 = S3Server::start();
    let server = quick_server();
    capture(&server, "b", 1_000);
    let start_at = chrono::Utc::now() - chrono::Duration::minutes(3);
    // The bucket does not exist yet: every attempt fails until it does.
    let created = create(
        &server,
        &json!({"name": "late bucket", "interval": "every 1 minute",
                "start_at": start_at.to_rfc3339(),
                "destination": destination(&s3, "late", json!({"file_format": "JSONLines", "compression": "gzip"}))}),
    );
    let id = created["id"].as_str().expect("id").to_string();
    assert!(
        wait_until(Duration::from_secs(120), || runs(&server, &id).iter().any(
            |r| r["status"] == "FailedRetryable" && r["latest_error"].is_string()
        )),
        "a failed attempt is recorded and will be retried: {:#?}",
        runs(&server, &id)
    );
    s3.create_bucket("late");
    let expected = hogql_uuids(&server, "1 = 1");
    let gz = |s3: &S3Server| s3.manifest_rows("late", "corvid/");
    assert!(
        wait_until(Duration::from_secs(180), || gz(&s3).len() == expected.len()),
        "the retried runs complete once the bucket exists: {:#?}",
        runs(&server, &id)
    );
    let seen = gz(&s3);
    assert!(seen.values().all(|n| *n == 1));
    assert!(s3
        .keys("late", "corvid/")
        .iter()
        .all(|k| k.ends_with(".jsonl.gz") || k.ends_with("_manifest.json")));
    let all = runs(&server, &id);
    let retried = all
        .iter()
        .find(|r| r["status"] == "Completed" && r["attempts"].as_u64() > Some(1))
        .expect("a run that failed first, then completed");
    assert!(retried["latest_error"].is_null());

    // Retrying a completed run is a one-interval backfill that writes the same keys again.
    let with_rows = all
        .iter()
        .find(|r| r["records_completed"].as_u64() > Some(0))
        .expect("the run with the events");
    let keys_before = s3.keys("late", "corvid/");
    let res = server.post_json(
        &path(
            &server,
            &format!("{id}/runs/{}/retry/", with_rows["id"].as_str().expect("id")),
        ),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(res.status(), 200);
    let backfill = res.json::<Value>().expect("json")["backfill_id"]
        .as_str()
        .expect("backfill id")
        .to_string();
    assert!(wait_until(Duration::from_secs(60), || {
        server.admin_get(&path(&server, &format!("{id}/backfills/{backfill}/")))["status"]
            == "Completed"
    }));
    let read = server.admin_get(&path(&server, &format!("{id}/backfills/{backfill}/")));
    assert_eq!(read["progress"]["finished_runs"], 1);
    assert_eq!(
        s3.keys("late", "corvid/"),
        keys_before,
        "the same keys, overwritten"
    );
    let seen = gz(&s3);
    assert_eq!(seen.len(), expected.len());
    assert!(
        seen.values().all(|n| *n == 1),
        "no duplicate rows after the retry"
    );

    // A finished run cannot be cancelled (PostHog's text).
    let res = server.post_json(
        &path(
            &server,
            &format!(
                "{id}/runs/{}/cancel/",
                with_rows["id"].as_str().expect("id")
            ),
        ),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(
        error_body(res)["detail"],
        "Cannot cancel a run that is in 'Completed' status"
    );
}

#[test]
fn backfills_pause_and_bad_input_speak_posthogs_contract() {
    let s3 = S3Server::start();
    s3.create_bucket("backfills");
    let server = quick_server();
    let body = |interval: &str, extra: Value| json!({"name": "x", "interval": interval, "destination": destination(&s3, "backfills", extra)});
    let refused = |b: Value| -> Value {
        let res = server.post_json(&path(&server, ""), Some(server.admin_key()), &b);
        assert_eq!(res.status(), 400, "{b}");
        error_body(res)
    };
    assert_eq!(
        refused(body("minute", json!({})))["detail"],
        "\"minute\" is not a valid choice."
    );
    assert_eq!(refused(body("minute", json!({})))["attr"], "interval");
    assert_eq!(
        refused(body("hour", json!({"file_format": "JSONLines", "compression": "zstd"})))["detail"],
        "Compression zstd is not supported for file format JSONLines. Supported compressions are ['gzip', 'brotli']"
    );
    assert_eq!(
        refused(body("hour", json!({"file_format": "CSV"})))["detail"],
        "File format CSV is not supported. Supported file formats are ['Parquet', 'JSONLines']"
    );
    assert_eq!(
        refused(body(
            "hour",
            json!({"aws_access_key_id": "", "aws_secret_access_key": ""})
        ))["detail"],
        "The following inputs are empty: ['aws_access_key_id', 'aws_secret_access_key']"
    );
    assert!(
        refused(body("hour", json!({"prefix": "x/{nope}/"})))["detail"]
            .as_str()
            .expect("text")
            .contains("{nope}")
    );

    // A project with no events has nothing to backfill.
    let created = create(&server, &body("hour", json!({"file_format": "Parquet"})));
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["destination"]["config"]["compression"], "zstd");
    let backfill = |b: Value| {
        server.post_json(
            &path(&server, &format!("{id}/backfills/")),
            Some(server.admin_key()),
            &b,
        )
    };
    let res = backfill(json!({}));
    assert_eq!(res.status(), 400);
    assert_eq!(
        error_body(res)["detail"],
        "There is no data to backfill for this model."
    );
    capture(&server, "c", 300);
    let now = chrono::Utc::now();
    let res = backfill(
        json!({"start_at": now.to_rfc3339(), "end_at": (now - chrono::Duration::hours(1)).to_rfc3339()}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(
        error_body(res)["detail"],
        "The initial backfill datetime 'start_at' happens after 'end_at'"
    );
    let res = backfill(json!({"end_at": (now + chrono::Duration::days(3)).to_rfc3339()}));
    assert_eq!(res.status(), 400);
    assert!(error_body(res)["detail"]
        .as_str()
        .expect("text")
        .contains("too far into the future"));
    let res = backfill(json!({"start_at": "2026-01-01T00:00:00"}));
    assert_eq!(res.status(), 400, "a bound without a zone is refused");

    // Pause, then a backfill from the first event up to half an hour ahead.
    let res = server.post_json(
        &path(&server, &format!("{id}/pause/")),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(res.status(), 200);
    let res = backfill(json!({"end_at": (now + chrono::Duration::minutes(30)).to_rfc3339()}));
    assert_eq!(res.status(), 200);
    let bid = res.json::<Value>().expect("json")["backfill_id"]
        .as_str()
        .expect("id")
        .to_string();
    let listed = server.admin_get(&path(&server, &format!("{id}/backfills/")));
    assert_eq!(listed["results"][0]["id"], bid.as_str());
    // The hour is not over yet: the run waits for its interval to end. Cancelling the
    // backfill cancels it.
    let res = server.post_json(
        &path(&server, &format!("{id}/backfills/{bid}/cancel/")),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(res.status(), 200);
    let read = server.admin_get(&path(&server, &format!("{id}/backfills/{bid}/")));
    assert_eq!(read["status"], "Cancelled");
    assert!(runs(&server, &id)
        .iter()
        .all(|r| r["status"] == "Cancelled"));

    // A backfill of past hours runs at once.
    let past = now - chrono::Duration::hours(3);
    let res = backfill(
        json!({"start_at": past.to_rfc3339(), "end_at": (now - chrono::Duration::hours(1)).to_rfc3339()}),
    );
    assert_eq!(res.status(), 400, "no data before the first event");
    let res = server.post_json(
        &path(&server, &format!("{id}/unpause/")),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(res.json::<Value>().expect("json"), json!({"paused": false}));
    let res = server.patch_json(
        &path(&server, &format!("{id}/")),
        Some(server.admin_key()),
        &json!({"name": "renamed", "destination": {"config": {"prefix": "renamed/"}}}),
    );
    assert_eq!(res.status(), 200);
    let patched: Value = res.json().expect("json");
    assert_eq!(patched["name"], "renamed");
    assert_eq!(patched["destination"]["config"]["prefix"], "renamed/");
    assert_eq!(patched["destination"]["config"]["bucket_name"], "backfills");
    assert!(!patched.to_string().contains("hidden-secret"));
    let res = server.get(
        &path(&server, "00000000-0000-0000-0000-000000000000/"),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 404);
    let list = server.admin_get(&path(&server, ""));
    assert_eq!(list["results"].as_array().map(Vec::len), Some(1));
}

#[test]
fn a_node_killed_during_a_scheduled_export_finishes_it_after_restart() {
    use common::process::spawn_corvid;
    let s3 = S3Server::start();
    s3.create_bucket("killed");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("corvid.toml");
    std::fs::write(
        &config,
        "[ingest]\nflush_interval = \"1s\"\n\
         [lifecycle]\nbatch_export_tick = \"500ms\"\nbatch_export_settle = \"1s\"\n\
         batch_export_retry = \"1s\"\ndev_allow_private_export_endpoints = true\n",
    )
    .expect("config");
    let data = dir.path().join("data");
    let (mut child, base) = spawn_corvid(&data, Some(&config));
    let creds = common::read_credentials(&data);
    let http = common::client_builder().build().expect("client");
    let events: Vec<Value> = (0..20_000)
        .map(|i| json!({"event": "$pageview", "distinct_id": format!("k-{}", i % 300), "properties": {"n": i}}))
        .collect();
    for chunk in events.chunks(1000) {
        let res = http
            .post(format!("{base}/batch/"))
            .json(&json!({"api_key": creds.project_token, "batch": chunk}))
            .send()
            .expect("capture");
        assert_eq!(res.status(), 200);
    }
    let start_at = chrono::Utc::now() - chrono::Duration::minutes(2);
    let res = http
        .post(format!("{base}/api/projects/1/batch_exports/"))
        .bearer_auth(&creds.personal_api_key)
        .json(
            &json!({"name": "k", "interval": "every 1 minute", "start_at": start_at.to_rfc3339(),
                      "destination": destination(&s3, "killed", json!({}))}),
        )
        .send()
        .expect("create");
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    // Killed as soon as a run has begun.
    assert!(wait_until(Duration::from_secs(60), || {
        http.get(format!("{base}/api/projects/1/batch_exports/{id}/runs/"))
            .bearer_auth(&creds.personal_api_key)
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .is_some_and(|b| {
                b["results"]
                    .as_array()
                    .is_some_and(|runs| runs.iter().any(|r| r["status"] != "Starting"))
            })
    }));
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let mut config = Config::for_test(&data);
    quick(&mut config);
    let server = TestServer::start(config);
    let expected = hogql_uuids(&server, "1 = 1");
    assert_eq!(expected.len(), 20_000);
    assert!(
        wait_until(Duration::from_secs(180), || s3
            .manifest_rows("killed", "corvid/events/")
            .len()
            == expected.len()),
        "the export completes after the restart: {:#?}",
        runs(&server, &id)
    );
    let seen = s3.manifest_rows("killed", "corvid/events/");
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(seen.values().all(|n| *n == 1), "no row twice");
}
