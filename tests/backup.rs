//! Backup and restore with the real binary: `corvid snapshot` of a node that serves under
//! capture load (through its control socket) and of a stopped one, `corvid restore` into a
//! new data dir, and the restored node giving the same answers.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::TestServer;
use corvid::config::Config;
use serde_json::{json, Value};

const BATCH: u64 = 50;

fn corvid(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(args)
        .env_remove("CORVID_DATA_DIR")
        .output()
        .expect("corvid runs")
}

fn hogql(server: &TestServer, sql: &str) -> Value {
    let res = server.post_json(
        "/api/projects/1/query/",
        Some(server.admin_key()),
        &json!({"query": {"kind": "HogQLQuery", "query": sql}}),
    );
    assert_eq!(res.status(), 200, "{sql}");
    res.json::<Value>().expect("json")["results"].clone()
}

/// The answers compared between the node and its restored copy, over events with `n < k`.
fn answers(server: &TestServer, k: u64) -> Vec<Value> {
    [
        format!("SELECT count(), uniq(distinct_id), sum(toInt64(properties.n)) FROM events WHERE toInt64(properties.n) < {k}"),
        format!("SELECT event, count() FROM events WHERE toInt64(properties.n) < {k} GROUP BY event ORDER BY event"),
        format!("SELECT distinct_id, count() FROM events WHERE toInt64(properties.n) < {k} GROUP BY distinct_id ORDER BY distinct_id LIMIT 20"),
    ]
    .iter()
    .map(|sql| hogql(server, sql))
    .collect()
}

fn ok(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn a_snapshot_under_capture_load_restores_to_identical_answers() {
    let (dir, mut config) = common::fresh();
    config.ingest.flush_interval = Duration::from_millis(300);
    let data = dir.path().to_path_buf();
    let server = Arc::new(TestServer::start_in(dir, config));
    let flag = server.admin_post(
        "/api/projects/1/feature_flags/",
        &json!({"key": "kept-flag", "name": "kept", "filters": {"groups": [{"properties": [], "rollout_percentage": 40}]}}),
        201,
    );

    // One writer, batch after batch, each acknowledged before the next: whatever cut the
    // snapshot makes, it holds a prefix of `n`.
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (server, acked, stop) = (Arc::clone(&server), Arc::clone(&acked), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut batch = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let events: Vec<Value> = (0..BATCH)
                    .map(|i| {
                        let n = batch * BATCH + i;
                        json!({"event": if n % 3 == 0 { "signup" } else { "$pageview" },
                               "distinct_id": format!("user-{}", n % 97),
                               "properties": {"n": n, "$set": {"last_n": n}}})
                    })
                    .collect();
                assert_eq!(server.capture_batch(&events).status(), 200);
                batch += 1;
                acked.store(batch * BATCH, Ordering::SeqCst);
            }
        })
    };
    while acked.load(Ordering::SeqCst) < 5_000 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let backups = tempfile::tempdir().expect("tempdir");
    let snapshot = backups.path().join("snap");
    let before = acked.load(Ordering::SeqCst);
    let report = ok(&corvid(&[
        "snapshot",
        "--data-dir",
        path_str(&data),
        "--to",
        path_str(&snapshot),
    ]));
    let after = acked.load(Ordering::SeqCst);
    assert!(report["wal_last_seq"].as_u64() > Some(0), "{report}");
    while acked.load(Ordering::SeqCst) < after + 1_000 {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
    assert!(snapshot.join("manifest.json").exists());

    let restored_dir = backups.path().join("restored");
    ok(&corvid(&[
        "restore",
        "--from",
        path_str(&snapshot),
        "--data-dir",
        path_str(&restored_dir),
    ]));
    // A second restore into the now-used dir is refused.
    let again = corvid(&[
        "restore",
        "--from",
        path_str(&snapshot),
        "--data-dir",
        path_str(&restored_dir),
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));

    let restored = TestServer::start(Config::for_test(&restored_dir));
    // Exactly the events acknowledged before the WAL was copied: a prefix of n, at least
    // everything acknowledged before the snapshot began, at most what was by its end.
    let k = hogql(&restored, "SELECT count() FROM events")[0][0]
        .as_u64()
        .expect("count");
    // (The writer counts a batch once it has its answer: one more may be acknowledged.)
    assert!(
        k >= before && k <= after + BATCH,
        "{before} <= {k} <= {after} + {BATCH}"
    );
    let top = hogql(&restored, "SELECT max(toInt64(properties.n)) FROM events")[0][0]
        .as_u64()
        .expect("max");
    assert_eq!(
        top + 1,
        k,
        "no gap: the snapshot holds a prefix of the events"
    );
    assert_eq!(answers(&restored, k), answers(&server, k));
    // Metadata came along: the flag, the persons, the admin's key (the same credentials).
    let flags = restored.admin_get("/api/projects/1/feature_flags/");
    assert_eq!(flags["results"][0]["key"], flag["key"]);
    assert!(!restored.persons(1, "user-1").is_empty());

    // A stopped node's data dir is snapshotted directly, with the same result (once the
    // stopped node's threads have let go of its metadata store).
    drop(restored);
    let second = backups.path().join("snap-offline");
    let mut offline = None;
    assert!(common::wait_until(Duration::from_secs(30), || {
        let out = corvid(&[
            "snapshot",
            "--data-dir",
            path_str(&restored_dir),
            "--to",
            path_str(&second),
        ]);
        let done = out.status.success();
        offline = Some(out);
        done
    }));
    ok(&offline.expect("ran"));
    let again_dir = backups.path().join("restored-again");
    ok(&corvid(&[
        "restore",
        "--from",
        path_str(&second),
        "--data-dir",
        path_str(&again_dir),
    ]));
    let again = TestServer::start(Config::for_test(&again_dir));
    assert_eq!(answers(&again, k), answers(&server, k));
}

#[test]
fn a_damaged_snapshot_is_refused() {
    let server = TestServer::new();
    assert_eq!(
        server
            .capture_batch(&[json!({"event": "e", "distinct_id": "d"})])
            .status(),
        200
    );
    let data = server.data_dir.clone();
    let backups = tempfile::tempdir().expect("tempdir");
    let snapshot = backups.path().join("snap");
    ok(&corvid(&[
        "snapshot",
        "--data-dir",
        path_str(&data),
        "--to",
        path_str(&snapshot),
    ]));
    std::fs::write(snapshot.join("meta.export"), b"tampered").expect("tamper");
    let out = corvid(&[
        "restore",
        "--from",
        path_str(&snapshot),
        "--data-dir",
        path_str(&backups.path().join("restored")),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not match the manifest"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !backups.path().join("restored").exists(),
        "nothing half-made is left"
    );
}

#[test]
fn a_snapshot_goes_to_and_comes_back_from_a_bucket() {
    let s3 = common::process::S3Server::start();
    s3.create_bucket("backups");
    let server = TestServer::new();
    let events: Vec<Value> = (0..500)
        .map(
            |n| json!({"event": "e", "distinct_id": format!("d{}", n % 7), "properties": {"n": n}}),
        )
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    let with_aws = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(args)
            .env_remove("CORVID_DATA_DIR")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", &s3.url)
            .env("AWS_ALLOW_HTTP", "true")
            .output()
            .expect("corvid runs")
    };
    let data = server.data_dir.clone();
    ok(&with_aws(&[
        "snapshot",
        "--data-dir",
        path_str(&data),
        "--to",
        "s3://backups/nightly/1",
    ]));
    assert!(s3
        .keys("backups", "nightly/1/")
        .contains(&"nightly/1/manifest.json".to_string()));
    let restored_dir = tempfile::tempdir().expect("tempdir");
    let target = restored_dir.path().join("data");
    ok(&with_aws(&[
        "restore",
        "--from",
        "s3://backups/nightly/1",
        "--data-dir",
        path_str(&target),
    ]));
    let restored = TestServer::start(Config::for_test(&target));
    assert_eq!(answers(&restored, 500), answers(&server, 500));
}
