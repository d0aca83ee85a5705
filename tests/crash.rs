//! Crash safety: `kill -9` in the middle of concurrent posting, then restart. Every event that
//! got a 200 is stored exactly once; none from a request answered with an error is stored.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::process::spawn_corvid;
use common::{wait_until, TestServer};
use serde_json::{json, Value};

#[derive(Default)]
struct Outcomes {
    acked: Vec<String>,
    rejected: Vec<String>,
    unknown: Vec<String>,
}

#[test]
fn acknowledged_events_survive_kill_9_exactly_once() {
    kill_9_while_posting(None);
}

#[test]
fn acknowledged_events_survive_kill_9_during_segment_flushes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("flushy.toml");
    std::fs::write(
        &config,
        "[ingest]\nflush_max_rows = 40\nflush_interval = \"50ms\"\n",
    )
    .expect("config");
    kill_9_while_posting(Some(&config));
}

fn kill_9_while_posting(config: Option<&std::path::Path>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, base) = spawn_corvid(dir.path(), config);
    let creds = common::read_credentials(dir.path());
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));

    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (base, token) = (base.clone(), creds.project_token.clone());
            let (outcomes, stop, acked) = (outcomes.clone(), stop.clone(), acked.clone());
            std::thread::spawn(move || {
                let client = common::client_builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .expect("client");
                for round in 0..60 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let uuids: Vec<String> = (0..10).map(|_| uuid::Uuid::now_v7().to_string()).collect();
                    // Every fifth request carries one invalid event, so the whole request is refused.
                    let poisoned = round % 5 == 4;
                    let events: Vec<Value> = uuids
                        .iter()
                        .enumerate()
                        .map(|(i, u)| {
                            if poisoned && i == 9 {
                                json!({"event": "crash", "uuid": u})
                            } else {
                                json!({"event": "crash", "distinct_id": format!("w{worker}"), "uuid": u})
                            }
                        })
                        .collect();
                    let res = client
                        .post(format!("{base}/batch/"))
                        .json(&json!({"api_key": token, "batch": events}))
                        .send();
                    let mut o = outcomes.lock().expect("lock");
                    match res {
                        Ok(r) if r.status() == 200 => {
                            acked.fetch_add(uuids.len(), Ordering::SeqCst);
                            o.acked.extend(uuids);
                        }
                        Ok(r) if r.status().is_client_error() => o.rejected.extend(uuids),
                        _ => {
                            o.unknown.extend(uuids);
                            break;
                        }
                    }
                }
            })
        })
        .collect();

    assert!(
        wait_until(Duration::from_secs(60), || acked.load(Ordering::SeqCst)
            >= 300),
        "enough events were acknowledged before the crash"
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("worker");
    }

    let outcomes = outcomes.lock().expect("lock");
    if config.is_some() {
        let segments = std::fs::read_dir(dir.path().join("events/project=1"))
            .map(|days| {
                days.filter_map(|d| d.ok())
                    .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten())
                    .count()
            })
            .unwrap_or(0);
        assert!(
            segments > 0,
            "segments were being committed when the process was killed"
        );
    }
    assert!(
        !outcomes.rejected.is_empty(),
        "some requests were refused with 400"
    );
    let server = TestServer::start(corvid::config::Config::for_test(dir.path()));
    let mut stored: HashMap<String, usize> = HashMap::new();
    for worker in 0..4 {
        for e in server.events(1, &format!("distinct_id=w{worker}&limit=1000")) {
            *stored
                .entry(e["uuid"].as_str().expect("uuid").to_string())
                .or_default() += 1;
        }
    }
    for uuid in &outcomes.acked {
        assert_eq!(
            stored.get(uuid),
            Some(&1),
            "acknowledged event {uuid} stored exactly once"
        );
    }
    let rejected: HashSet<&String> = outcomes.rejected.iter().collect();
    assert!(
        stored.keys().all(|u| !rejected.contains(u)),
        "no event of a refused request is stored"
    );
    let known: HashSet<&String> = outcomes
        .acked
        .iter()
        .chain(outcomes.unknown.iter())
        .collect();
    assert!(
        stored.keys().all(|u| known.contains(u)),
        "nothing unexpected is stored"
    );
    assert!(stored.values().all(|n| *n == 1), "no duplicates at all");
    // Usage is counted in memory and stored with each segment flush; replay counts again what
    // the checkpoint did not cover, so no acknowledged event goes uncounted.
    let billable: u64 = server
        .usage(1)
        .iter()
        .map(|row| row["billable_events"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        billable >= outcomes.acked.len() as u64,
        "usage counts every acknowledged event: {billable} < {}",
        outcomes.acked.len()
    );

    // A second crash-free restart changes nothing (replay is idempotent).
    server.stop();
    let server = TestServer::start(corvid::config::Config::for_test(dir.path()));
    let again: usize = (0..4)
        .map(|w| {
            server
                .events(1, &format!("distinct_id=w{w}&limit=1000"))
                .len()
        })
        .sum();
    assert_eq!(again, stored.len());
}
