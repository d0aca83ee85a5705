//! Durability to power loss, not only to `kill -9`: a server writes its WAL and segment files
//! through a model of the disk (`PowerCutDisk`) that keeps, after every sync, what a power cut
//! at that moment would leave: only synced file bytes, only directory entries whose directory
//! was synced. Events are captured while shards flush, checkpoints move and covered WAL files
//! are deleted; then a server is started on every one of those states, and each must hold every
//! event that was acknowledged before it, exactly once.

mod common;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{fresh, wait_until, TestServer};
use corvid::config::Config;
use corvid_kernel::PowerCutDisk;
use serde_json::{json, Value};

/// Copies what the model does not cover (sled, credentials) from `from` into `to`.
fn copy_unmodelled(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("image dir");
    for entry in std::fs::read_dir(from)
        .expect("data dir")
        .filter_map(Result::ok)
    {
        let name = entry.file_name();
        if name == "wal" || name == "events" {
            continue;
        }
        copy_tree(&entry.path(), &to.join(&name));
    }
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("dir");
        for entry in std::fs::read_dir(from)
            .expect("read dir")
            .filter_map(Result::ok)
        {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else if from.is_file() {
        // (Regular files only: a serving node's control socket is no state.)
        std::fs::copy(from, to).expect("copy");
    }
}

fn stored_uuids(server: &TestServer) -> HashMap<String, u64> {
    let res = server.post_json(
        &format!("/api/projects/{}/query/", server.creds.project_id),
        Some(server.admin_key()),
        &json!({"query": {"kind": "HogQLQuery",
            "query": "SELECT toString(uuid), count() FROM events GROUP BY uuid LIMIT 100000"}}),
    );
    assert_eq!(res.status(), 200, "query the image");
    let body: Value = res.json().expect("json");
    body["results"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r[0].as_str().expect("uuid").to_string(),
                r[1].as_u64().expect("count"),
            )
        })
        .collect()
}

fn checkpoints(server: &TestServer) -> Vec<(u64, u64)> {
    let stats = server.admin_get("/_internal/ingest");
    stats["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| {
            (
                s["processed_seq"].as_u64().unwrap_or(0),
                s["checkpoint"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn no_acknowledged_event_is_lost_at_any_power_cut() {
    let (dir, mut config) = fresh();
    let data = config.data_dir.clone();
    let disk = PowerCutDisk::new(&data);
    config.disk_override = Some(Arc::new(disk.clone()));
    config.ingest.shards = NonZeroUsize::new(1);
    config.ingest.flush_interval = Duration::from_millis(100);
    // One record per WAL file: every flush lets the writer delete files.
    config.ingest.wal_segment_bytes = 1024;
    let server = TestServer::start(config);

    // (uuids, operations done when the 200 arrived)
    let mut acked: Vec<(Vec<String>, u64)> = Vec::new();
    for round in 0..6 {
        let uuids: Vec<String> = (0..8).map(|_| uuid::Uuid::now_v7().to_string()).collect();
        let events: Vec<Value> = uuids
            .iter()
            .map(|u| {
                json!({"event": "cut", "distinct_id": format!("p{round}"), "uuid": u,
                "properties": {"round": round, "$set": {"round": round}}})
            })
            .collect();
        assert_eq!(server.capture_batch(&events).status(), 200);
        acked.push((uuids, disk.ops()));
        if round % 2 == 1 {
            // Let a flush record a checkpoint past these events, and the WAL drop its files.
            assert!(
                wait_until(Duration::from_secs(20), || checkpoints(&server)
                    .iter()
                    .all(|(processed, checkpoint)| checkpoint >= processed)),
                "checkpoints catch up"
            );
        }
    }
    assert!(
        wait_until(Duration::from_secs(20), || {
            // (Log files only: a prepared spare the log rolls to next holds no records.)
            std::fs::read_dir(data.join("wal"))
                .map(|d| {
                    d.filter_map(Result::ok)
                        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                        .count()
                        <= 2
                })
                .unwrap_or(false)
        }),
        "covered WAL files are deleted"
    );
    server.stop();

    let snapshots = disk.snapshots();
    assert!(snapshots.len() > 10, "{} states", snapshots.len());
    let images = tempfile::tempdir().expect("images");
    for (i, snapshot) in snapshots.iter().enumerate() {
        let expected: Vec<&String> = acked
            .iter()
            .filter(|(_, ops)| *ops <= snapshot.after_ops)
            .flat_map(|(uuids, _)| uuids)
            .collect();
        let image = images.path().join(format!("cut-{i}"));
        copy_unmodelled(&data, &image);
        snapshot.write_to(&image).expect("write the image");
        let mut config: Config = Config::for_test(&image);
        config.ingest.shards = NonZeroUsize::new(1);
        let restarted = TestServer::start(config);
        let stored = stored_uuids(&restarted);
        for uuid in &expected {
            assert_eq!(
                stored.get(*uuid),
                Some(&1),
                "power cut after {} operations (state {i} of {}): acknowledged event {uuid} \
                 is missing or duplicated; files left: {:?}",
                snapshot.after_ops,
                snapshots.len(),
                snapshot.files()
            );
        }
        restarted.stop();
        std::fs::remove_dir_all(&image).expect("clean up");
    }
    drop(dir);
}
