//! Cluster mode from the outside: `corvid migrate` against a real PostgreSQL server started by
//! the test, the `[cluster]` configuration a node is started with, and three nodes sharing one
//! PostgreSQL and one bucket (moto's S3 server), two in-process and one a child process that
//! is killed with SIGKILL mid-ingest.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::oauth::{approve, authorize_query, pkce, post_token, Browser, CimdServer};
use common::process::{spawn_corvid, S3Server};
use common::{wait_until, TestServer};
use corvid::config::{ClusterMode, ClusterObjectStore, Config};
use corvid_kernel::pg::testing::TestPostgres;
use serde_json::{json, Value};

fn corvid(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(args)
        .env_remove("CORVID_POSTGRES_URL")
        .output()
        .expect("runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn migrate_applies_the_schema_once_and_reports_it_current_afterwards() {
    let server = TestPostgres::start();
    let db = server.database();
    let first = corvid(&["migrate", "--postgres-url", &db.url]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("metastore schema migrated to version"),
        "{}",
        text(&first)
    );
    // The URL may also come from the environment, as a deployment sets it.
    let again = Command::new(env!("CARGO_BIN_EXE_corvid"))
        .arg("migrate")
        .env("CORVID_POSTGRES_URL", &db.url)
        .output()
        .expect("runs");
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("metastore schema is current"),
        "{}",
        text(&again)
    );
}

#[test]
fn migrate_without_a_metastore_or_an_unreachable_one_fails_with_a_clear_message() {
    let none = corvid(&["migrate"]);
    assert!(!none.status.success());
    assert!(
        text(&none).contains("CORVID_POSTGRES_URL"),
        "{}",
        text(&none)
    );

    // A loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("postgres://corvid@127.0.0.1:{port}/corvid");
    let down = corvid(&["migrate", "--postgres-url", &url]);
    assert!(!down.status.success());
    assert!(text(&down).contains("metastore"), "{}", text(&down));
}

#[test]
fn migrate_over_tls_verifies_the_server_certificate() {
    // A private CA and a certificate for 127.0.0.1, made with trustme (PyPI).
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(common::sdk::python())
        .arg("-c")
        .arg(
            "import sys, trustme\n\
             ca = trustme.CA()\n\
             cert = ca.issue_cert('127.0.0.1')\n\
             ca.cert_pem.write_to_path(sys.argv[1] + '/ca.pem')\n\
             cert.private_key_pem.write_to_path(sys.argv[1] + '/server.key')\n\
             cert.cert_chain_pems[0].write_to_path(sys.argv[1] + '/server.crt')\n",
        )
        .arg(dir.path())
        .output()
        .expect("trustme runs");
    assert!(out.status.success(), "{}", text(&out));
    let server = TestPostgres::start_tls(
        &dir.path().join("server.crt"),
        &dir.path().join("server.key"),
    );
    let db = server.database();
    let url = format!("{}?sslmode=require", db.url);

    // In plain text the server refuses this database.
    let plain = corvid(&["migrate", "--postgres-url", &db.url]);
    assert!(!plain.status.success(), "{}", text(&plain));
    // Over TLS, a certificate from an unknown CA is refused.
    let unknown = corvid(&["migrate", "--postgres-url", &url]);
    assert!(!unknown.status.success(), "{}", text(&unknown));
    // Trusting the CA, it migrates.
    let config = dir.path().join("tls.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster.postgres]\nca_file = \"{}\"\n",
            dir.path().join("ca.pem").display()
        ),
    )
    .expect("config");
    let trusted = corvid(&[
        "migrate",
        "--config",
        &config.to_string_lossy(),
        "--postgres-url",
        &url,
    ]);
    assert!(trusted.status.success(), "{}", text(&trusted));
    assert!(
        text(&trusted).contains("metastore schema migrated"),
        "{}",
        text(&trusted)
    );
}

#[test]
fn a_node_started_before_its_metastore_answers_503_until_it_can_reach_it() {
    let pg = TestPostgres::start();
    let existing = pg.database();
    // A database that does not exist yet: the node cannot use its metastore until it does.
    let (base_url, _) = existing.url.rsplit_once('/').expect("url");
    let later = format!("{base_url}/corvid_later");
    let s3 = S3Server::start();
    s3.create_bucket(BUCKET);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nmode = \"distributed\"\nnode_id = \"early\"\n\
             [cluster.postgres]\nurl = \"{later}\"\nconnect_timeout = \"1s\"\n\
             [cluster.object_store]\nbucket = \"{BUCKET}\"\nendpoint = \"{}\"\n\
             region = \"us-east-1\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n\
             allow_http = true\n",
            s3.url
        ),
    )
    .expect("config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let node = common::process::Helper(
        Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(["serve", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .env_remove("CORVID_POSTGRES_URL")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starts"),
    );
    let http = common::client_builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let get = |path: &str| http.get(format!("http://127.0.0.1:{port}{path}")).send();
    assert!(
        wait_until(Duration::from_secs(30), || get("/_readiness")
            .is_ok_and(|r| r.status() == 503)),
        "the port answers while the node waits"
    );
    let body: Value = get("/_readiness").expect("readiness").json().expect("json");
    assert_eq!(body["status"], "starting");
    assert_eq!(get("/_health").expect("health").status(), 200);
    assert_eq!(
        get("/api/projects/").expect("api").status(),
        503,
        "nothing is served before the engine is up"
    );

    existing
        .connect()
        .run(|client| async move {
            client.batch_execute("CREATE DATABASE corvid_later").await?;
            Ok(())
        })
        .expect("create the database");
    assert!(
        wait_until(Duration::from_secs(30), || get("/_readiness")
            .is_ok_and(|r| r.status() == 200)),
        "ready once the metastore is reachable"
    );
    drop(node);
}

/// `corvid serve` with `config` as its config file, in `dir`.
fn serve_with(dir: &std::path::Path, config: &str) -> Output {
    let file = dir.join("node.toml");
    std::fs::write(&file, config).expect("config");
    corvid(&[
        "serve",
        "--config",
        &file.to_string_lossy(),
        "--data-dir",
        &dir.join("data").to_string_lossy(),
        "--bind",
        "127.0.0.1:0",
    ])
}

#[test]
fn a_distributed_node_names_what_its_config_lacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = serve_with(dir.path(), "[cluster]\nmode = \"distributed\"\n");
    assert!(!out.status.success());
    assert!(text(&out).contains("cluster.node_id"), "{}", text(&out));

    // Complete but with no metastore listening: once its start timeout runs out it stops,
    // naming what it could not reach, without having opened anything.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let out = serve_with(
        dir.path(),
        &format!(
            "[cluster]\nmode = \"distributed\"\nnode_id = \"node-1\"\n\
             start_timeout = \"2s\"\n\
             [cluster.postgres]\nurl = \"postgres://corvid@127.0.0.1:{port}/corvid\"\n\
             connect_timeout = \"1s\"\n[cluster.object_store]\nbucket = \"corvid\"\n"
        ),
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("metastore"), "{}", text(&out));
    assert!(
        !dir.path().join("data").join("meta").exists(),
        "no embedded store was opened"
    );
}

const BUCKET: &str = "corvid";
const CALLBACK: &str = "http://127.0.0.1/callback";

/// The shared services and where each node keeps its own state.
struct Services {
    pg_url: String,
    s3: S3Server,
    cimd: CimdServer,
}

impl Services {
    /// An in-process node's config.
    fn config(&self, dir: &Path, node_id: &str) -> Config {
        let mut c = Config::for_test(dir);
        c.cluster.mode = ClusterMode::Distributed;
        c.cluster.node_id = Some(node_id.into());
        c.cluster.postgres.url = Some(self.pg_url.clone());
        c.cluster.object_store = Some(ClusterObjectStore {
            bucket: BUCKET.into(),
            endpoint: Some(self.s3.url.clone()),
            region: Some("us-east-1".into()),
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
            allow_http: true,
            prefix: String::new(),
        });
        c.oauth.dev_allow_loopback_fetch = true;
        c.oauth.dev_extra_ca_file = Some(self.cimd.ca());
        c.oauth.cimd_fetch_timeout = Duration::from_secs(10);
        c.lifecycle.erasure_interval = Duration::from_millis(200);
        c.lifecycle.erasure_settle = Duration::from_secs(3);
        c.lifecycle.erasure_grace = Duration::from_secs(5);
        c.lifecycle.batch_export_tick = Duration::from_millis(500);
        c.lifecycle.batch_export_settle = Duration::from_secs(5);
        c.lifecycle.dev_allow_private_export_endpoints = true;
        c.webhooks.dev_allow_loopback = true;
        c.webhooks.dispatch_interval = Duration::from_millis(200);
        c
    }

    /// A child-process node's config file, written into `dir`.
    fn config_file(&self, dir: &Path, node_id: &str) -> std::path::PathBuf {
        let path = dir.join(format!("{node_id}.toml"));
        let text = format!(
            "[cluster]\nmode = \"distributed\"\nnode_id = \"{node_id}\"\n\
             [cluster.postgres]\nurl = \"{}\"\n\
             [cluster.object_store]\nbucket = \"{BUCKET}\"\nendpoint = \"{}\"\n\
             region = \"us-east-1\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n\
             allow_http = true\n\
             [surveys]\nmaintenance_interval = \"200ms\"\n\
             [lifecycle]\nerasure_interval = \"200ms\"\nerasure_settle = \"3s\"\n\
             erasure_grace = \"5s\"\nbatch_export_tick = \"500ms\"\n\
             batch_export_settle = \"5s\"\ndev_allow_private_export_endpoints = true\n\
             [webhooks]\ndev_allow_loopback = true\ndispatch_interval = \"200ms\"\n",
            self.pg_url, self.s3.url
        );
        std::fs::write(&path, text).expect("node config");
        path
    }
}

/// A node run as a child process, so it can be killed with SIGKILL.
struct ChildNode {
    child: Child,
    base: String,
    http: reqwest::blocking::Client,
}

impl ChildNode {
    fn start(data_dir: &Path, config: &Path) -> ChildNode {
        let (child, base) = spawn_corvid(data_dir, Some(config));
        ChildNode {
            child,
            base,
            http: common::client_builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn three_nodes_share_one_postgres_and_one_bucket() {
    let pg = TestPostgres::start();
    let db = pg.database();
    let services = Services {
        pg_url: db.url.clone(),
        s3: S3Server::start(),
        cimd: CimdServer::start(),
    };
    services.s3.create_bucket(BUCKET);
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();

    // Node 1 bootstraps the cluster's tenancy; the others find it.
    let node1 = TestServer::start(services.config(dirs[0].path(), "node-1"));
    std::fs::copy(
        dirs[0].path().join("credentials.json"),
        dirs[2].path().join("credentials.json"),
    )
    .expect("credentials for node 3's tests");
    let node2_config = services.config_file(dirs[1].path(), "node-2");
    let mut node2 = ChildNode::start(&dirs[1].path().join("data"), &node2_config);
    let node3 = TestServer::start(services.config(dirs[2].path(), "node-3"));
    for res in [
        node1.readiness(),
        node3.readiness(),
        node2
            .http
            .get(node2.url("/_readiness"))
            .send()
            .expect("ready"),
    ] {
        assert_eq!(res.status(), 200, "every node is ready");
    }

    events_captured_on_one_node_are_queryable_on_another(&node1, &node3);
    flag_edits_reach_other_nodes_within_a_second(&node1, &node2, &node3);
    a_flag_changed_on_one_node_is_logged_and_reverted_through_another(&node1, &node3);
    changes_on_every_node_are_delivered_once_by_one_node(&node1, &node3);
    deleted_keys_are_refused_everywhere_within_a_second(&node1, &node3);
    oauth_codes_and_refresh_tokens_are_single_use_across_nodes(&services, &node1, &node3);
    an_endpoint_is_materialized_once_and_served_by_every_node(&services, &node1, &node2, &node3);
    concurrent_writers_on_every_node_lose_nothing(&node1, &node2, &node3);
    one_person_written_on_three_nodes_at_once_keeps_every_write(&node1, &node2, &node3);
    one_node_jobs_run_once_per_period_across_the_cluster(&node1, &node2, &node3);
    the_console_lists_every_live_node(&node1);
    a_person_erased_through_one_node_is_gone_from_every_node(&services, &node1, &node2, &node3);
    a_scheduled_export_runs_each_interval_on_one_node(&services, &node1, &node2, &node3);

    // SIGKILL node 2 mid-ingest, restart it: every acknowledged event is stored exactly once.
    let acked = kill_9_while_posting(&node1, &mut node2);
    node2 = ChildNode::start(&dirs[1].path().join("data"), &node2_config);
    let mut stored: HashMap<String, usize> = HashMap::new();
    let complete = wait_until(Duration::from_secs(30), || {
        stored.clear();
        for worker in 0..4 {
            for e in node3.events(1, &format!("distinct_id=crash-{worker}&limit=1000")) {
                *stored
                    .entry(e["uuid"].as_str().expect("uuid").to_string())
                    .or_default() += 1;
            }
        }
        acked.iter().all(|u| stored.contains_key(u))
    });
    let missing = acked.iter().filter(|u| !stored.contains_key(*u)).count();
    assert!(
        complete,
        "{missing} of {} acknowledged events are missing",
        acked.len()
    );
    assert!(stored.values().all(|n| *n == 1), "no event is stored twice");
    assert_eq!(
        node2
            .http
            .get(node2.url("/_readiness"))
            .send()
            .expect("ready")
            .status(),
        200
    );
}

/// Sends the same kind of write from twelve threads spread over the three nodes at once:
/// each answer's status and body.
fn at_once_on_every_node(
    bases: &[String; 3],
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: impl Fn(usize) -> Value + Sync,
) -> Vec<(u16, Value)> {
    let start = std::sync::Barrier::new(12);
    std::thread::scope(|scope| {
        let sent: Vec<_> = (0..12)
            .map(|i| {
                let (start, body, method) = (&start, &body, method.clone());
                scope.spawn(move || {
                    let client = common::client_builder().build().expect("client");
                    let request = client
                        .request(method, format!("{}{path}", bases[i % 3]))
                        .bearer_auth(key)
                        .json(&body(i));
                    start.wait();
                    let res = request.send().expect("sent");
                    let status = res.status().as_u16();
                    (status, res.json().unwrap_or(Value::Null))
                })
            })
            .collect();
        sent.into_iter()
            .map(|t| t.join().expect("writer"))
            .collect()
    })
}

/// Writers racing on one record from every node: one create of a key wins, every update
/// counts.
fn concurrent_writers_on_every_node_lose_nothing(
    node1: &TestServer,
    node2: &ChildNode,
    node3: &TestServer,
) {
    let bases = [node1.url(""), node2.url(""), node3.url("")];
    let key = node1.admin_key();
    let winners = |answers: &[(u16, Value)], what: &str| {
        let created = answers.iter().filter(|(s, _)| *s == 201).count();
        assert_eq!(created, 1, "exactly one {what} is created: {answers:?}");
        for (status, body) in answers.iter().filter(|(s, _)| *s != 201) {
            assert_eq!(*status, 400, "{body}");
            assert_eq!(body["type"], "validation_error", "{body}");
        }
    };
    let flags = at_once_on_every_node(
        &bases,
        key,
        reqwest::Method::POST,
        "/api/projects/1/feature_flags/",
        |_| json!({"key": "raced", "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}),
    );
    winners(&flags, "flag");
    let id = flags.iter().find(|(s, _)| *s == 201).expect("winner").1["id"].clone();

    let patches = at_once_on_every_node(
        &bases,
        key,
        reqwest::Method::PATCH,
        &format!("/api/projects/1/feature_flags/{id}/"),
        |i| json!({"name": format!("edit {i}")}),
    );
    assert!(patches.iter().all(|(s, _)| *s == 200), "{patches:?}");
    let flag: Value = node3
        .get(&format!("/api/projects/1/feature_flags/{id}/"), Some(key))
        .json()
        .expect("flag");
    assert_eq!(
        flag["version"], 13,
        "twelve updates after the create: {flag}"
    );

    let endpoints = at_once_on_every_node(
        &bases,
        key,
        reqwest::Method::POST,
        "/api/environments/1/endpoints/",
        |_| json!({"name": "raced", "query": {"kind": "HogQLQuery", "query": "SELECT 1"}}),
    );
    winners(&endpoints, "endpoint");

    let experiments = at_once_on_every_node(
        &bases,
        key,
        reqwest::Method::POST,
        "/api/projects/1/experiments/",
        |i| json!({"name": format!("Raced {i}"), "feature_flag_key": "raced-exp"}),
    );
    winners(&experiments, "experiment");
    let listed: Value = node1
        .get("/api/projects/1/experiments/", Some(key))
        .json()
        .expect("experiments");
    let on_flag = listed["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|e| e["feature_flag_key"] == "raced-exp")
        .count();
    assert_eq!(on_flag, 1, "{listed}");
}

/// One person written from three nodes at once, round after round: node 1 identifies the
/// anonymous id as the user with `$set`, node 2 sets a property through the anonymous id,
/// node 3 through the user id. Every round ends with one person holding both distinct ids and
/// all three properties, whichever order the nodes took turns in.
fn one_person_written_on_three_nodes_at_once_keeps_every_write(
    node1: &TestServer,
    node2: &ChildNode,
    node3: &TestServer,
) {
    const ROUNDS: usize = 8;
    let bases = [node1.url(""), node2.url(""), node3.url("")];
    let token = node1.creds.project_token.clone();
    let event = |node: usize, round: usize| match node {
        0 => json!({"event": "$identify", "distinct_id": format!("user-{round}"),
            "properties": {"$anon_distinct_id": format!("anon-{round}"), "$set": {"from_identify": round}}}),
        1 => json!({"event": "seen", "distinct_id": format!("anon-{round}"),
            "properties": {"$set": {"from_anon": round}}}),
        _ => json!({"event": "seen", "distinct_id": format!("user-{round}"),
            "properties": {"$set": {"from_user": round}}}),
    };
    let start = std::sync::Barrier::new(3 * ROUNDS);
    std::thread::scope(|scope| {
        let sent: Vec<_> = (0..3 * ROUNDS)
            .map(|i| {
                let (start, bases, token) = (&start, &bases, &token);
                scope.spawn(move || {
                    let (node, round) = (i % 3, i / 3);
                    let request = common::client_builder()
                        .build()
                        .expect("client")
                        .post(format!("{}/batch/", bases[node]))
                        .json(&json!({"api_key": token, "batch": [event(node, round)]}));
                    start.wait();
                    request.send().expect("sent").status().as_u16()
                })
            })
            .collect();
        for t in sent {
            assert_eq!(t.join().expect("writer"), 200, "capture acknowledged");
        }
    });
    for round in 0..ROUNDS {
        let mut last = Vec::new();
        let whole = wait_until(Duration::from_secs(10), || {
            last = node3.persons(1, &format!("anon-{round}"));
            last.len() == 1
                && ["from_identify", "from_anon", "from_user"]
                    .iter()
                    .all(|k| last[0]["properties"][*k] == json!(round))
                && node3
                    .persons(1, &format!("user-{round}"))
                    .first()
                    .map(|p| p["id"].clone())
                    == Some(last[0]["id"].clone())
        });
        assert!(
            whole,
            "round {round}: one person with every property: {last:?}"
        );
        let ids = last[0]["distinct_ids"].as_array().expect("distinct ids");
        assert_eq!(ids.len(), 2, "both distinct ids: {ids:?}");
    }
}

/// A job's `corvid_job_runs_total` in a node's `/metrics`.
fn job_runs(metrics: &str, job: &str) -> f64 {
    let series = format!("corvid_job_runs_total{{job=\"{job}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Survey upkeep (every 200 ms here) runs on one node at a time: over two seconds the three
/// nodes together run it about ten times, not thirty; the usage flush runs on each node.
fn one_node_jobs_run_once_per_period_across_the_cluster(
    node1: &TestServer,
    node2: &ChildNode,
    node3: &TestServer,
) {
    let read = || -> Vec<String> {
        [
            node1.url("/metrics"),
            node2.url("/metrics"),
            node3.url("/metrics"),
        ]
        .iter()
        .map(|url| {
            reqwest::blocking::get(url)
                .and_then(|r| r.text())
                .expect("metrics")
        })
        .collect()
    };
    let before = read();
    std::thread::sleep(Duration::from_secs(2));
    let after = read();
    let delta = |job: &str| -> Vec<f64> {
        before
            .iter()
            .zip(&after)
            .map(|(b, a)| job_runs(a, job) - job_runs(b, job))
            .collect()
    };
    let upkeep: f64 = delta("survey_upkeep").iter().sum();
    assert!(
        (3.0..=13.0).contains(&upkeep),
        "survey upkeep ran {upkeep} times in 2 s across three nodes (period 200 ms)"
    );
    let flushes = delta("usage_flush");
    assert!(
        flushes.iter().all(|n| *n >= 1.0),
        "every node flushes its own usage counts: {flushes:?}"
    );
}

/// The console's overview on one node lists the three nodes by their heartbeats, itself
/// marked.
fn the_console_lists_every_live_node(node1: &TestServer) {
    let mut browser = Browser::new(node1);
    browser.login(
        &node1.creds.email,
        node1.creds.password.as_deref().expect("password"),
    );
    let mut table = String::new();
    let listed = wait_until(Duration::from_secs(15), || {
        let html = browser.get("/console").text().expect("overview");
        table = html
            .split("id=\"nodes\"")
            .nth(1)
            .and_then(|t| t.split("</table>").next())
            .unwrap_or_default()
            .to_string();
        ["node-1", "node-2", "node-3"]
            .iter()
            .all(|n| table.contains(&format!("<td>{n}</td>")))
    });
    assert!(listed, "every node is listed: {table}");
    assert!(
        table.contains("<td>node-1</td>") && table.matches("this node").count() == 1,
        "{table}"
    );
}

/// `count()` of `events` matching `condition`, asked of a node by its base URL.
fn count_on(http: &reqwest::blocking::Client, base: &str, key: &str, condition: &str) -> u64 {
    let res = http
        .post(format!("{base}/api/projects/1/query/"))
        .bearer_auth(key)
        .json(&json!({"query": {"kind": "HogQLQuery",
                                "query": format!("SELECT count() FROM events WHERE {condition}")}}))
        .send()
        .expect("query");
    let body: Value = res.json().expect("json");
    body["results"][0][0].as_u64().expect("count")
}

/// A person erased through one node is hidden by every node from the next read on, one node
/// rewrites the bucket's segments without their events, and the request completes.
fn a_person_erased_through_one_node_is_gone_from_every_node(
    services: &Services,
    node1: &TestServer,
    node2: &ChildNode,
    node3: &TestServer,
) {
    let key = node1.admin_key();
    // One day of their own, so the bucket listing below stays one page.
    let events = |who: &str, n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| {
                json!({"event": "erasable", "distinct_id": who,
                            "timestamp": "2020-02-02T12:00:00Z", "properties": {"i": i}})
            })
            .collect()
    };
    assert_eq!(node1.capture_batch(&events("gone", 50)).status(), 200);
    assert_eq!(node1.capture_batch(&events("kept", 50)).status(), 200);
    assert_eq!(node3.capture_batch(&events("gone", 50)).status(), 200);
    let prefix = "events/project=1/day=2020-02-02/";
    let nodes = [
        (&node1.client, node1.base.as_str()),
        (&node2.http, node2.base.as_str()),
        (&node3.client, node3.base.as_str()),
    ];
    // Every node sees all 150 (a node reads another's events once they are flushed to the
    // bucket), so what follows checks the erasure, not how soon flushes arrive.
    assert!(wait_until(Duration::from_secs(20), || {
        nodes
            .iter()
            .all(|(http, base)| count_on(http, base, key, "event = 'erasable'") == 150)
            && !services.s3.keys(BUCKET, prefix).is_empty()
    }));
    let uuid = node3.persons(1, "gone")[0]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let res = node2
        .http
        .delete(node2.url(&format!("/api/projects/1/persons/{uuid}/?delete_events")))
        .bearer_auth(key)
        .send()
        .expect("delete");
    assert_eq!(res.status(), 202);
    for (http, base) in nodes {
        assert_eq!(
            count_on(http, base, key, "distinct_id = 'gone'"),
            0,
            "{base}"
        );
        assert_eq!(
            count_on(http, base, key, "distinct_id = 'kept'"),
            50,
            "{base}"
        );
    }
    for node in [node1, node3] {
        assert!(node.events(1, "distinct_id=gone").is_empty());
        assert!(node.persons(1, "gone").is_empty());
    }
    let completed = || {
        let res = node3.get(
            &format!("/api/projects/1/persons/deletion_status/?person_uuid={uuid}"),
            Some(key),
        );
        let body: Value = res.json().expect("json");
        body["results"][0]["status"] == json!("completed")
    };
    assert!(
        wait_until(Duration::from_secs(90), completed),
        "the erasure completes"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let mut kept = 0;
    for object in services.s3.keys(BUCKET, prefix) {
        let path = dir.path().join("segment.parquet");
        std::fs::write(&path, services.s3.get(BUCKET, &object)).expect("copy");
        let rows = common::segment_rows(std::fs::File::open(&path).expect("segment"));
        assert!(
            rows.iter().all(|(id, _)| id != "gone"),
            "{object} holds no erased event"
        );
        kept += rows.iter().filter(|(id, _)| id == "kept").count();
    }
    assert_eq!(kept, 50, "the other person's events stay, once");
}

/// Events captured on two nodes, an export made through the third: each interval has one
/// run, and each event is in the bucket once.
fn a_scheduled_export_runs_each_interval_on_one_node(
    services: &Services,
    node1: &TestServer,
    node2: &ChildNode,
    node3: &TestServer,
) {
    let key = node1.admin_key();
    services.s3.create_bucket("cluster-exports");
    let events = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"event": "exported", "distinct_id": format!("x{i}"), "properties": {"i": i}}))
            .collect()
    };
    assert_eq!(node1.capture_batch(&events(100)).status(), 200);
    assert_eq!(node3.capture_batch(&events(100)).status(), 200);
    let start_at = chrono::Utc::now() - chrono::Duration::minutes(2);
    let res = node2
        .http
        .post(node2.url("/api/projects/1/batch_exports/"))
        .bearer_auth(key)
        .json(&json!({"name": "cluster", "interval": "every 1 minute",
                      "start_at": start_at.to_rfc3339(),
                      "destination": {"type": "S3", "config": {
                          "bucket_name": "cluster-exports", "region": "us-east-1",
                          "endpoint_url": services.s3.url, "prefix": "{table}",
                          "aws_access_key_id": "test", "aws_secret_access_key": "test",
                          "include_events": ["exported"]}}}))
        .send()
        .expect("create");
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    assert!(
        wait_until(Duration::from_secs(180), || services
            .s3
            .manifest_rows("cluster-exports", "events/")
            .len()
            == 200),
        "every event is exported"
    );
    let rows = services.s3.manifest_rows("cluster-exports", "events/");
    assert!(rows.values().all(|n| *n == 1), "no event twice");
    let runs: Value = node3
        .get(
            &format!("/api/projects/1/batch_exports/{id}/runs/"),
            Some(key),
        )
        .json()
        .expect("json");
    let runs = runs["results"].as_array().expect("runs");
    let intervals: std::collections::BTreeSet<&str> = runs
        .iter()
        .map(|r| r["data_interval_start"].as_str().expect("start"))
        .collect();
    assert_eq!(
        intervals.len(),
        runs.len(),
        "one run per interval: {runs:#?}"
    );
    let res = node1.delete(&format!("/api/projects/1/batch_exports/{id}/"), Some(key));
    assert_eq!(res.status(), 204);

    // A file export run by one node is downloaded through another (its files are in the
    // bucket).
    let now = chrono::Utc::now();
    let res = node1.post_json(
        "/api/environments/1/file_download_batch_exports",
        Some(key),
        &json!({"model": "events", "file": {"format": "JSONLines"}, "include": ["exported"],
                "data_interval_start": (now - chrono::Duration::hours(1)).to_rfc3339(),
                "data_interval_end": (now + chrono::Duration::minutes(1)).to_rfc3339()}),
    );
    assert_eq!(res.status(), 202);
    let run = res.json::<Value>().expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    let status = format!("/api/environments/1/file_download_batch_exports/{run}");
    assert!(wait_until(Duration::from_secs(60), || {
        node3.get(&status, Some(key)).json::<Value>().expect("json")["status"] == "Completed"
    }));
    let res = node3.get(&format!("{status}/download"), Some(key));
    assert_eq!(res.status(), 200, "followed to the file, served by node 3");
    let text = res.text().expect("body");
    assert_eq!(text.lines().count(), 200);
}

fn events_captured_on_one_node_are_queryable_on_another(node1: &TestServer, node3: &TestServer) {
    let events: Vec<Value> = (0..20)
        .map(|i| json!({"event": "across", "distinct_id": format!("c{i}"), "properties": {"i": i}}))
        .collect();
    let sent = Instant::now();
    assert_eq!(node1.capture_batch(&events).status(), 200);
    let seen = wait_until(Duration::from_secs(5), || {
        node3.events(1, "event=across&limit=100").len() == 20
    });
    assert!(
        seen,
        "events acknowledged on node 1 are queryable on node 3 within 5 s (took {:?})",
        sent.elapsed()
    );
    let counted = node3.post_json(
        "/api/projects/1/query/",
        Some(node1.admin_key()),
        &json!({"query": {"kind": "HogQLQuery", "query": "SELECT count() FROM events WHERE event = 'across'"}}),
    );
    let counted: Value = counted.json().expect("json");
    assert_eq!(counted["results"], json!([[20]]), "{counted}");
    // Persons are shared too.
    assert_eq!(node3.persons(1, "c7").len(), 1);
}

fn flag_edits_reach_other_nodes_within_a_second(
    node1: &TestServer,
    node2: &ChildNode,
    node3: &TestServer,
) {
    let evaluate = || -> Value {
        let res = node3
            .client
            .post(node3.url("/flags?v=2"))
            .json(&json!({"api_key": node1.creds.project_token, "distinct_id": "someone"}))
            .send()
            .expect("flags");
        assert_eq!(res.status(), 200);
        res.json().expect("json")
    };
    assert!(evaluate()["flags"].get("cluster-flag").is_none());
    let res = node2
        .http
        .post(node2.url("/api/projects/1/feature_flags/"))
        .bearer_auth(node1.admin_key())
        .json(&json!({"key": "cluster-flag", "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}))
        .send()
        .expect("create flag");
    assert_eq!(res.status(), 201);
    let saved = Instant::now();
    let served = wait_until(Duration::from_secs(1), || {
        evaluate()["flags"]["cluster-flag"]["enabled"] == json!(true)
    });
    assert!(
        served,
        "a flag created on node 2 is served by node 3 within 1 s ({:?})",
        saved.elapsed()
    );

    // A cohort edited on node 1 changes node 3's answer within a second.
    let admin = |res: reqwest::blocking::Response| -> Value {
        assert!(res.status().is_success(), "{}", res.status());
        res.json().expect("json")
    };
    let cohort = admin(node1.post_json(
        "/api/projects/1/cohorts/",
        Some(node1.admin_key()),
        &json!({"name": "Pros", "filters": {"properties": {"type": "OR", "values": [
            {"type": "AND", "values": [{"key": "plan", "value": "pro", "type": "person"}]}]}}}),
    ));
    admin(node1.post_json(
        "/api/projects/1/feature_flags/",
        Some(node1.admin_key()),
        &json!({"key": "pros-only", "filters": {"groups": [{"properties": [
            {"key": "id", "value": cohort["id"], "type": "cohort"}], "rollout_percentage": 100}]}}),
    ));
    let pro = || -> Value {
        let res = node3
            .client
            .post(node3.url("/flags?v=2"))
            .json(
                &json!({"api_key": node1.creds.project_token, "distinct_id": "ann",
                          "person_properties": {"plan": "pro"}}),
            )
            .send()
            .expect("flags");
        res.json().expect("json")
    };
    assert!(
        wait_until(Duration::from_secs(1), || pro()["flags"]["pros-only"]
            ["enabled"]
            == json!(true)),
        "{}",
        pro()
    );
    admin(node1.patch_json(
        &format!("/api/projects/1/cohorts/{}/", cohort["id"]),
        Some(node1.admin_key()),
        &json!({"filters": {"properties": {"type": "OR", "values": [
            {"type": "AND", "values": [{"key": "plan", "value": "enterprise", "type": "person"}]}]}}}),
    ));
    assert!(
        wait_until(Duration::from_secs(1), || pro()["flags"]["pros-only"]
            ["enabled"]
            == json!(false)),
        "a cohort edited on node 1 is served by node 3 within 1 s: {}",
        pro()
    );
}

/// The activity log is the cluster's: a change made through one node is in every node's log,
/// with the entries of the other nodes' changes, and a revert through another node restores
/// the flag every node serves.
fn a_flag_changed_on_one_node_is_logged_and_reverted_through_another(
    node1: &TestServer,
    node3: &TestServer,
) {
    let key = node1.admin_key();
    let flags: Value = node1
        .get("/api/projects/1/feature_flags/", Some(key))
        .json()
        .expect("flags");
    let id = flags["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|f| f["key"] == "cluster-flag")
        .expect("made on node 2")["id"]
        .clone();
    let res = node1.patch_json(
        &format!("/api/projects/1/feature_flags/{id}/"),
        Some(key),
        &json!({"filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}}),
    );
    assert_eq!(res.status(), 200);
    let history: Value = node3
        .get(
            &format!("/api/projects/1/feature_flags/{id}/activity/"),
            Some(key),
        )
        .json()
        .expect("history");
    let activities: Vec<&str> = history["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|e| e["activity"].as_str().expect("activity"))
        .collect();
    assert_eq!(activities, vec!["updated", "created"], "{history}");
    let res = node3.post_json(
        &format!("/api/projects/1/feature_flags/{id}/revert/"),
        Some(key),
        &json!({}),
    );
    assert_eq!(res.status(), 200);
    let enabled = || -> Value {
        let res = node1
            .client
            .post(node1.url("/flags?v=2"))
            .json(&json!({"api_key": node1.creds.project_token, "distinct_id": "someone"}))
            .send()
            .expect("flags");
        res.json::<Value>().expect("json")["flags"]["cluster-flag"]["enabled"].clone()
    };
    assert!(
        wait_until(Duration::from_secs(1), || enabled() == json!(true)),
        "node 1 serves the flag node 3 reverted within 1 s"
    );
    let log: Value = node1
        .get(
            "/api/projects/1/activity_log/?scope=FeatureFlag&page=1",
            Some(key),
        )
        .json()
        .expect("log");
    assert_eq!(log["results"][0]["activity"], "reverted", "{log}");
}

/// A webhook made through one node gets the changes made through every node, each once: one
/// node of the cluster sends a webhook's deliveries.
fn changes_on_every_node_are_delivered_once_by_one_node(node1: &TestServer, node3: &TestServer) {
    let receiver = common::receiver::Receiver::start(&[]);
    let key = node1.admin_key();
    let res = node1.post_json(
        "/api/projects/1/webhooks/",
        Some(key),
        &json!({"url": receiver.url, "events": ["FeatureFlag.created"], "secret": "cluster"}),
    );
    assert_eq!(res.status(), 201);
    for (i, node) in [node1, node3].iter().cycle().take(6).enumerate() {
        let res = node.post_json(
            "/api/projects/1/feature_flags/",
            Some(key),
            &json!({"key": format!("hooked-{i}"), "filters": {"groups": []}}),
        );
        assert_eq!(res.status(), 201);
    }
    receiver.wait_for(6);
    std::thread::sleep(Duration::from_secs(1));
    let got = receiver.received();
    let mut ids: Vec<&str> = got
        .iter()
        .map(|r| r.headers["x-corvid-delivery"].as_str())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!((got.len(), ids.len()), (6, 6), "each change delivered once");
}

fn deleted_keys_are_refused_everywhere_within_a_second(node1: &TestServer, node3: &TestServer) {
    let (id, secret) = node1.create_key(&["project:read"], None);
    assert_eq!(
        node3.list_projects(&secret).status(),
        200,
        "the key works (and is cached)"
    );
    let res = node1.delete(
        &format!("/api/personal_api_keys/{id}/"),
        Some(node1.admin_key()),
    );
    assert_eq!(res.status(), 204);
    assert!(
        wait_until(Duration::from_secs(1), || node3
            .list_projects(&secret)
            .status()
            == 401),
        "a key deleted on node 1 is refused by node 3 within 1 s"
    );
}

fn oauth_codes_and_refresh_tokens_are_single_use_across_nodes(
    services: &Services,
    node1: &TestServer,
    node3: &TestServer,
) {
    let client_id = services
        .cimd
        .client("cluster.json", "Cluster client", &[CALLBACK]);
    let mut browser = Browser::new(node1);
    browser.login(
        &node1.creds.email,
        node1.creds.password.as_deref().expect("first-run password"),
    );
    // A code approved on node 1, and its exchange on a node.
    let mut approved = || {
        let (verifier, challenge) = pkce();
        let query = approve(
            &mut browser,
            &authorize_query(&client_id, CALLBACK, &challenge, &[]),
        );
        (query["code"].clone(), verifier)
    };
    let exchange = |node: &TestServer, (code, verifier): &(String, String)| {
        post_token(
            node,
            "/oauth/token",
            &[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("client_id", &client_id),
                ("redirect_uri", CALLBACK),
                ("code_verifier", verifier),
            ],
        )
    };

    // One code redeemed on two nodes at once: exactly one gets (working) tokens.
    let raced = approved();
    let (first, second) = std::thread::scope(|s| {
        let a = s.spawn(|| exchange(node1, &raced));
        let b = s.spawn(|| exchange(node3, &raced));
        (a.join().expect("node 1"), b.join().expect("node 3"))
    });
    let winners: Vec<&Value> = [&first, &second]
        .iter()
        .filter(|(status, _, _)| *status == 200)
        .map(|(_, body, _)| body)
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "one node issues tokens: {first:?} {second:?}"
    );
    let access = winners[0]["access_token"].as_str().expect("access token");
    for node in [node1, node3] {
        assert_eq!(node.me(access).status(), 200, "the winner's tokens work");
    }

    // A refresh on node 3 rotates; replaying the old refresh token on node 1 revokes the grant.
    let (status, tokens, _) = exchange(node1, &approved());
    assert_eq!(status, 200, "{tokens}");
    let refresh = |node: &TestServer, token: &str| {
        post_token(
            node,
            "/oauth/token",
            &[
                ("grant_type", "refresh_token"),
                ("refresh_token", token),
                ("client_id", &client_id),
            ],
        )
    };
    let old = tokens["refresh_token"].as_str().expect("refresh token");
    let (status, rotated, _) = refresh(node3, old);
    assert_eq!(status, 200, "{rotated}");
    let access = rotated["access_token"].as_str().expect("access token");
    assert_eq!(node3.me(access).status(), 200);
    let (status, _, _) = refresh(node1, old);
    assert_eq!(status, 400, "a reused refresh token is refused");
    assert!(
        wait_until(Duration::from_secs(1), || node3.me(access).status() == 401),
        "the reuse on node 1 revoked the family on node 3 within 1 s"
    );

    // A token revoked on node 1 (RFC 7009) is refused by node 3 within a second, though
    // node 3 had it cached.
    let (status, tokens, _) = exchange(node1, &approved());
    assert_eq!(status, 200, "{tokens}");
    let access = tokens["access_token"].as_str().expect("access token");
    assert_eq!(node3.me(access).status(), 200);
    let (status, _, _) = post_token(
        node1,
        "/oauth/revoke",
        &[("token", access), ("client_id", &client_id)],
    );
    assert_eq!(status, 200);
    assert!(
        wait_until(Duration::from_secs(1), || node3.me(access).status() == 401),
        "a token revoked on node 1 is refused by node 3 within 1 s"
    );
}

fn an_endpoint_is_materialized_once_and_served_by_every_node(
    services: &Services,
    node1: &TestServer,
    node2: &ChildNode,
    node3: &TestServer,
) {
    let base = "/api/environments/1/endpoints";
    let res = node1.post_json(
        &format!("{base}/"),
        Some(node1.admin_key()),
        &json!({"name": "shared", "is_materialized": true,
                "query": {"kind": "HogQLQuery", "query": "SELECT count() AS c FROM events WHERE event = 'across'"}}),
    );
    assert_eq!(res.status(), 201);
    let status = || -> Value {
        node3
            .get(
                &format!("{base}/shared/materialization_status"),
                Some(node1.admin_key()),
            )
            .json()
            .expect("status")
    };
    assert!(
        wait_until(Duration::from_secs(30), || status()["status"]
            == json!("Completed")),
        "materialized: {}",
        status()
    );
    let run = |url: String, client: &reqwest::blocking::Client| -> Value {
        let res = client
            .post(url)
            .bearer_auth(node1.admin_key())
            .json(&json!({}))
            .send()
            .expect("run");
        assert_eq!(res.status(), 200);
        res.json().expect("json")
    };
    let mut executions = Vec::new();
    for out in [
        run(node1.url(&format!("{base}/shared/run")), &node1.client),
        run(node2.url(&format!("{base}/shared/run")), &node2.http),
        run(node3.url(&format!("{base}/shared/run")), &node3.client),
    ] {
        assert_eq!(out["endpoint_materialized"], true, "{out}");
        assert_eq!(out["results"], json!([[20]]), "{out}");
        executions.push(out["execution_id"].clone());
    }
    // Each node logged its own run; any node finds all of them.
    let logged = || -> Vec<Value> {
        let res = node1.get(
            &format!("{base}/shared/logs/?limit=100"),
            Some(node1.admin_key()),
        );
        assert_eq!(res.status(), 200);
        let body: Value = res.json().expect("logs");
        body["results"].as_array().cloned().unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(10), || {
            let entries = logged();
            executions
                .iter()
                .all(|id| entries.iter().any(|e| &e["instance_id"] == id))
        }),
        "runs on three nodes are in one log: {:?}",
        logged()
    );
    // Every node's materializer saw the version due; one ran it.
    std::thread::sleep(Duration::from_secs(2));
    let results: Vec<String> = services
        .s3
        .keys(BUCKET, "materialized/")
        .into_iter()
        .filter(|k| k.ends_with(".arrow"))
        .collect();
    assert_eq!(results.len(), 1, "one result in the bucket: {results:?}");
}

/// Posts batches to node 2 from four workers until 300 events are acknowledged, then kills it
/// with SIGKILL; returns the acknowledged uuids.
fn kill_9_while_posting(node1: &TestServer, node2: &mut ChildNode) -> Vec<String> {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (url, token) = (node2.url("/batch/"), node1.creds.project_token.clone());
            let (acked, count, stop) = (acked.clone(), count.clone(), stop.clone());
            std::thread::spawn(move || {
                let http = common::client_builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .expect("client");
                for _ in 0..60 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let uuids: Vec<String> =
                        (0..10).map(|_| uuid::Uuid::now_v7().to_string()).collect();
                    let batch: Vec<Value> = uuids
                        .iter()
                        .map(|u| json!({"event": "crash", "distinct_id": format!("crash-{worker}"), "uuid": u}))
                        .collect();
                    match http
                        .post(&url)
                        .json(&json!({"api_key": token, "batch": batch}))
                        .send()
                    {
                        Ok(r) if r.status() == 200 => {
                            count.fetch_add(uuids.len(), Ordering::SeqCst);
                            acked.lock().expect("lock").extend(uuids);
                        }
                        _ => break,
                    }
                }
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(60), || count.load(Ordering::SeqCst)
            >= 300),
        "enough events were acknowledged before the crash"
    );
    node2.child.kill().expect("SIGKILL");
    node2.child.wait().expect("reaped");
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("worker");
    }
    let acked = acked.lock().expect("lock").clone();
    acked
}
