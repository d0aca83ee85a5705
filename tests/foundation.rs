//! Foundation: auth, scopes, isolation, errors, limits, lifecycle and persistence, over real HTTP.

mod common;

use std::time::Duration;

use common::{error_body, fresh, wait_until, TestServer};
use serde_json::{json, Value};

#[test]
fn first_run_bootstraps_default_tenancy_and_key_works() {
    let server = TestServer::new();
    assert_eq!(server.creds.project_id, 1);
    assert!(server.creds.project_token.starts_with("phc_"));
    assert_eq!(server.creds.project_token.len(), 47);
    assert!(server.creds.personal_api_key.starts_with("phx_"));
    assert_eq!(server.creds.email, "admin@localhost");
    assert!(server
        .creds
        .password
        .as_deref()
        .is_some_and(|p| p.len() >= 16));

    let saved = common::read_credentials(&server.data_dir);
    assert_eq!(
        saved, server.creds,
        "credentials.json holds what was printed"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(server.data_dir.join("credentials.json"))
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let res = server.list_projects(server.admin_key());
    assert_eq!(res.status(), 200);
    let body: Value = res.json().expect("json");
    assert_eq!(body["count"], 1);
    let project = &body["results"][0];
    assert_eq!(project["id"], 1);
    assert_eq!(project["name"], "Default project");
    assert_eq!(project["timezone"], "UTC");
    assert_eq!(project["api_token"], server.creds.project_token.as_str());

    let me: Value = server.me(server.admin_key()).json().expect("json");
    assert_eq!(me["email"], "admin@localhost");
    assert_eq!(me["organization"]["name"], "Default");
    assert_eq!(me["team"]["id"], 1);
    assert!(me.get("password_hash").is_none());
}

#[test]
fn missing_or_invalid_bearer_gets_401_with_resource_metadata_header() {
    let (_dir, mut config) = fresh();
    config.public_url = Some("https://corvid.example.com".into());
    let server = TestServer::start(config);
    let expected =
        "Bearer resource_metadata=\"https://corvid.example.com/.well-known/oauth-protected-resource\"";

    let cases: Vec<(&str, Option<&str>)> = vec![
        ("no header", None),
        ("unknown key", Some("Bearer phx_notarealkey")),
        ("project token is not a bearer", Some("Bearer phc_abc")),
        ("wrong scheme", Some("Basic YWRtaW46YWRtaW4=")),
        ("empty bearer", Some("Bearer ")),
    ];
    for (what, header) in cases {
        let mut req = server.client.get(server.url("/api/projects/"));
        if let Some(h) = header {
            req = req.header("authorization", h);
        }
        let res = req.send().expect("sent");
        assert_eq!(res.status(), 401, "{what}");
        assert_eq!(
            res.headers()["www-authenticate"].to_str().expect("ascii"),
            expected,
            "{what}"
        );
        let body = error_body(res);
        assert_eq!(body["type"], "authentication_error", "{what}");
    }
}

#[test]
fn key_scopes_are_enforced_per_route_and_cannot_escalate() {
    let server = TestServer::new();
    let (_, read_only) = server.create_key(&["project:read"], None);
    assert_eq!(server.list_projects(&read_only).status(), 200);
    assert_eq!(server.project(&read_only, 1).status(), 200);

    let res = server.post_json("/api/projects/", Some(&read_only), &json!({"name": "nope"}));
    assert_eq!(res.status(), 403);
    let body = error_body(res);
    assert_eq!(body["code"], "permission_denied");
    assert!(body["detail"]
        .as_str()
        .expect("detail")
        .contains("project:write"));

    assert_eq!(
        server.me(&read_only).status(),
        403,
        "user:read is not granted"
    );
    assert_eq!(
        server
            .get("/api/personal_api_keys/", Some(&read_only))
            .status(),
        403
    );

    // write implies read
    let (_, writer) = server.create_key(&["project:write"], None);
    assert_eq!(server.list_projects(&writer).status(), 200);

    // A key may only mint keys within its own scopes.
    let (_, delegator) = server.create_key(&["personal_api_key:write", "project:read"], None);
    let res = server.create_key_with(
        &delegator,
        &json!({"label": "wider", "scopes": ["project:write"]}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "scopes");
    let res = server.create_key_with(&delegator, &json!({"label": "all", "scopes": ["*"]}));
    assert_eq!(res.status(), 400);
    let res = server.create_key_with(
        &delegator,
        &json!({"label": "narrower", "scopes": ["project:read"]}),
    );
    assert_eq!(res.status(), 201);

    // Unknown scopes are rejected.
    let res = server.create_key_with(
        server.admin_key(),
        &json!({"label": "x", "scopes": ["warp_drive:read"]}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "scopes");
}

#[test]
fn a_key_of_project_a_never_reaches_project_b() {
    let server = TestServer::new();
    let b = server.create_project("Project B");
    let b_id = b["id"].as_u64().expect("id");
    assert_eq!(b_id, 2);
    assert_ne!(b["api_token"], server.creds.project_token.as_str());

    let (_, key_a) = server.create_key(&["*"], Some(&[1]));
    assert_eq!(server.project(&key_a, 1).status(), 200);
    for path in [
        format!("/api/projects/{b_id}/"),
        format!("/api/environments/{b_id}/"),
    ] {
        let res = server.get(&path, Some(&key_a));
        assert_eq!(res.status(), 403, "{path}");
        assert_eq!(error_body(res)["code"], "permission_denied");
    }
    let listed: Value = server.list_projects(&key_a).json().expect("json");
    let ids: Vec<u64> = listed["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|p| p["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(ids, vec![1], "listing shows only the key's projects");

    // A project-limited key cannot create projects or mint an unlimited key.
    let res = server.post_json("/api/projects/", Some(&key_a), &json!({"name": "C"}));
    assert_eq!(res.status(), 403);
    let res = server.create_key_with(&key_a, &json!({"label": "escape", "scopes": ["*"]}));
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "scoped_teams");
    let res = server.create_key_with(
        &key_a,
        &json!({"label": "escape", "scopes": ["*"], "scoped_teams": [b_id]}),
    );
    assert_eq!(res.status(), 400);

    // Projects that do not exist are 404, not 500 or 403.
    assert_eq!(server.project(server.admin_key(), 999).status(), 404);
    assert_eq!(server.project(server.admin_key(), 0).status(), 404);
    assert_eq!(
        server
            .get("/api/projects/abc/", Some(server.admin_key()))
            .status(),
        404
    );
    // The unrestricted admin key reaches both.
    assert_eq!(server.project(server.admin_key(), b_id).status(), 200);
    assert_eq!(
        server
            .get(
                &format!("/api/environments/{b_id}"),
                Some(server.admin_key())
            )
            .status(),
        200
    );
}

#[test]
fn personal_api_keys_show_the_secret_once_and_deletion_revokes_at_once() {
    let server = TestServer::new();
    let (id, secret) = server.create_key(&["project:read"], None);
    assert_eq!(
        server.list_projects(&secret).status(),
        200,
        "key works (and is cached)"
    );

    let listed: Value = server
        .get("/api/personal_api_keys/", Some(server.admin_key()))
        .json()
        .expect("json");
    let entry = listed
        .as_array()
        .expect("array")
        .iter()
        .find(|k| k["id"] == id.as_str())
        .expect("listed")
        .clone();
    assert!(entry.get("value").is_none(), "secret is not shown again");
    assert_eq!(
        entry["mask_value"],
        format!("phx_...{}", &secret[secret.len() - 4..])
    );
    let one: Value = server
        .get(
            &format!("/api/personal_api_keys/{id}/"),
            Some(server.admin_key()),
        )
        .json()
        .expect("json");
    assert!(one.get("value").is_none());
    assert_eq!(one["scopes"], json!(["project:read"]));
    let raw = std::fs::read_dir(server.data_dir.join("meta"))
        .expect("meta dir")
        .count();
    assert!(raw > 0);

    let res = server.delete(
        &format!("/api/personal_api_keys/{id}/"),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 204);
    assert_eq!(
        server.list_projects(&secret).status(),
        401,
        "revoked key fails at once"
    );
    assert_eq!(
        server
            .delete(
                &format!("/api/personal_api_keys/{id}/"),
                Some(server.admin_key())
            )
            .status(),
        404
    );
}

#[test]
fn malformed_and_unknown_json_are_400_with_a_json_body() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let res = server.post_raw("/api/projects/", Some(&key), "{\"name\": ");
    assert_eq!(res.status(), 400);
    let body = error_body(res);
    assert_eq!(body["type"], "validation_error");
    assert!(body["detail"]
        .as_str()
        .expect("detail")
        .contains("Malformed JSON"));

    let res = server.post_json(
        "/api/projects/",
        Some(&key),
        &json!({"name": "x", "colour": "red"}),
    );
    assert_eq!(res.status(), 400);
    let body = error_body(res);
    assert_eq!(body["attr"], "colour");

    let res = server.post_json("/api/projects/", Some(&key), &json!({"name": 42}));
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "name");

    let res = server.post_json(
        "/api/projects/",
        Some(&key),
        &json!({"name": "x", "timezone": "Mars/Base"}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "timezone");

    let res = server.post_raw("/api/projects/", Some(&key), "");
    assert_eq!(res.status(), 400);
    error_body(res);

    let res = server.get("/api/no/such/route", Some(&key));
    assert_eq!(res.status(), 404);
    assert_eq!(error_body(res)["code"], "not_found");
}

#[test]
fn bodies_over_the_limit_get_413() {
    let (_dir, mut config) = fresh();
    config.limits.max_body_bytes = 1024;
    let server = TestServer::start(config);
    let big = json!({"name": "x".repeat(4096)});
    let res = server.post_json("/api/projects/", Some(server.admin_key()), &big);
    assert_eq!(res.status(), 413);
    let body = error_body(res);
    assert_eq!(body["code"], "payload_too_large");
    assert!(body["detail"].as_str().expect("detail").contains("1024"));

    // Chunked upload with no Content-Length is cut off as well.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..8).map(|_| Ok(vec![b' '; 512])).collect();
    let res = server
        .client
        .post(server.url("/api/projects/"))
        .bearer_auth(server.admin_key())
        .body(reqwest::blocking::Body::new(ChunkReader::new(chunks)))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 413);
    error_body(res);

    // Under the limit still works.
    let res = server.post_json(
        "/api/projects/",
        Some(server.admin_key()),
        &json!({"name": "ok"}),
    );
    assert_eq!(res.status(), 201);
}

/// A reader of unknown length, so reqwest sends the body chunked.
struct ChunkReader {
    chunks: std::vec::IntoIter<Result<Vec<u8>, std::io::Error>>,
    current: std::io::Cursor<Vec<u8>>,
}

impl ChunkReader {
    fn new(chunks: Vec<Result<Vec<u8>, std::io::Error>>) -> Self {
        ChunkReader {
            chunks: chunks.into_iter(),
            current: std::io::Cursor::new(Vec::new()),
        }
    }
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.current.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            match self.chunks.next() {
                Some(chunk) => self.current = std::io::Cursor::new(chunk?),
                None => return Ok(0),
            }
        }
    }
}

#[test]
fn readiness_turns_503_during_shutdown_while_liveness_stays_up() {
    let (_dir, mut config) = fresh();
    config.server.shutdown_grace = Duration::from_secs(3);
    let mut server = TestServer::start(config);
    assert_eq!(server.readiness().status(), 200);
    assert_eq!(server.health().status(), 200);

    server.begin_stop();
    assert!(
        wait_until(Duration::from_secs(2), || server.readiness().status()
            == 503),
        "readiness should report 503 once shutdown begins"
    );
    assert_eq!(
        server.health().status(),
        200,
        "still serving during the grace period"
    );
    let body: Value = server.readiness().json().expect("json");
    assert_eq!(body["status"], "shutting_down");
    server.stop();
}

#[test]
fn restart_keeps_all_metadata() {
    let (dir, config) = fresh();
    let server = TestServer::start(config.clone());
    let first_creds = server.creds.clone();
    let b = server.create_project("Survivor");
    let (key_id, key) = server.create_key(&["project:read"], Some(&[2]));
    server.stop();

    let server = TestServer::start(config);
    assert_eq!(server.creds, first_creds, "no second bootstrap on restart");
    let listed: Value = server
        .list_projects(server.admin_key())
        .json()
        .expect("json");
    assert_eq!(listed["count"], 2);
    let again: Value = server.project(&key, 2).json().expect("json");
    assert_eq!(again, b, "project record unchanged");
    assert_eq!(
        server.project(&key, 1).status(),
        403,
        "key restrictions survive"
    );
    let keys: Value = server
        .get("/api/personal_api_keys/", Some(server.admin_key()))
        .json()
        .expect("json");
    assert!(keys
        .as_array()
        .expect("array")
        .iter()
        .any(|k| k["id"] == key_id.as_str()));
    let c = server.create_project("Next");
    assert_eq!(c["id"], 3, "id allocation continues after restart");
    drop(server);
    drop(dir);
}

#[test]
fn metrics_count_requests_per_route() {
    let server = TestServer::new();
    server.list_projects(server.admin_key());
    server.list_projects("phx_bad");
    let text = server.metrics();
    assert!(
        text.contains(
            r#"corvid_http_requests_total{method="GET",route="/api/projects",status="200"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"route="/api/projects",status="401"} 1"#),
        "{text}"
    );
    assert!(text.contains("corvid_http_request_duration_seconds_bucket"));
}

#[test]
fn metrics_show_every_engine_component() {
    let server = TestServer::new();
    let res = server.capture_batch(&[serde_json::json!({"event": "e", "distinct_id": "u1"})]);
    assert_eq!(res.status(), 200);
    let flag =
        serde_json::json!({"key": "beta", "filters": {"groups": [{"rollout_percentage": 100}]}});
    server.admin_post("/api/projects/1/feature_flags", &flag, 201);
    let text = server.metrics();
    for series in [
        "corvid_ingest_pending_events ",
        "corvid_ingest_shard_lag_records{shard=\"0\"} ",
        "corvid_ingest_shard_buffered_events{shard=\"0\"} ",
        "corvid_wal_fsync_duration_seconds_bucket{le=\"+Inf\"} ",
        "corvid_wal_fsync_duration_seconds_count ",
        "corvid_flag_snapshot_version{project=\"1\"} ",
        "corvid_materializer_up 1",
        "corvid_materializer_lag_seconds ",
        "corvid_materializer_jobs_total{outcome=\"failed\"} ",
        "corvid_execution_log_writer_up 1",
        "corvid_execution_log_queue_entries ",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    let syncs: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("corvid_wal_fsync_duration_seconds_count "))
        .and_then(|v| v.parse().ok())
        .expect("a sync count");
    assert!(syncs >= 1.0, "the capture was synced: {syncs}");
}
