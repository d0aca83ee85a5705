//! The real server, started in-process on 127.0.0.1:0 with its own temp data dir, and one
//! helper per endpoint. Every test gets its own server.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use corvid::bootstrap::Credentials;
use corvid::config::Config;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::{json, Value};
use tempfile::TempDir;

/// A running server. Dropping it stops it.
pub struct TestServer {
    pub base: String,
    pub creds: Credentials,
    pub data_dir: PathBuf,
    pub client: Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: Option<TempDir>,
}

/// A client builder whose pool drops a connection after 2 s idle. The server closes a
/// keep-alive connection after 5 s idle (actix's default); a request sent on a pooled
/// connection at that moment fails with `IncompleteMessage`, and a POST is not retried.
pub fn client_builder() -> reqwest::blocking::ClientBuilder {
    Client::builder().pool_idle_timeout(Duration::from_secs(2))
}

/// A fresh temp data dir and a test config pointing at it.
pub fn fresh() -> (TempDir, Config) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_test(dir.path());
    (dir, config)
}

impl TestServer {
    /// Starts a server with the test defaults in a new temp dir.
    pub fn new() -> TestServer {
        let (dir, config) = fresh();
        let mut server = TestServer::start(config);
        server._dir = Some(dir);
        server
    }

    /// Starts a server with `config`, keeping `dir` (its data dir) until the server is dropped.
    pub fn start_in(dir: TempDir, config: Config) -> TestServer {
        let mut server = TestServer::start(config);
        server._dir = Some(dir);
        server
    }

    /// Starts a server with `config` (its `data_dir` is kept by the caller).
    pub fn start(config: Config) -> TestServer {
        let data_dir = config.data_dir.clone();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let running = match corvid::app::start(config).await {
                    Ok(running) => running,
                    Err(err) => {
                        let _ = addr_tx.send(Err(format!("{err:#}")));
                        return Err(err);
                    }
                };
                let _ = addr_tx.send(Ok((running.local_addr(), running.first_run.clone())));
                running
                    .run_until(async {
                        let _ = stop_rx.await;
                    })
                    .await
            })
        });
        let (addr, first_run) = addr_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("server reported its address")
            .expect("server started");
        let creds = first_run.unwrap_or_else(|| read_credentials(&data_dir));
        TestServer {
            base: format!("http://{addr}"),
            creds,
            data_dir,
            client: client_builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            stop: Some(stop_tx),
            thread: Some(thread),
            _dir: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Signals a clean shutdown without waiting for it.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops cleanly and waits; panics if shutdown failed.
    pub fn stop(mut self) {
        self.begin_stop();
        if let Some(thread) = self.thread.take() {
            thread
                .join()
                .expect("server thread")
                .expect("clean shutdown");
        }
    }

    // ---- request helpers ----

    pub fn get(&self, path: &str, key: Option<&str>) -> Response {
        self.send(self.client.get(self.url(path)), key)
    }

    pub fn post_json(&self, path: &str, key: Option<&str>, body: &Value) -> Response {
        self.send(self.client.post(self.url(path)).json(body), key)
    }

    pub fn post_raw(&self, path: &str, key: Option<&str>, body: impl Into<Vec<u8>>) -> Response {
        self.send(
            self.client
                .post(self.url(path))
                .header("content-type", "application/json")
                .body(body.into()),
            key,
        )
    }

    pub fn patch_json(&self, path: &str, key: Option<&str>, body: &Value) -> Response {
        self.send(self.client.patch(self.url(path)).json(body), key)
    }

    /// POSTs JSON with the admin key, asserts `status` and returns the body.
    pub fn admin_post(&self, path: &str, body: &Value, status: u16) -> Value {
        let res = self.post_json(path, Some(self.admin_key()), body);
        assert_eq!(res.status(), status, "POST {path} {body}");
        res.json().expect("json body")
    }

    /// PATCHes JSON with the admin key, asserts `status` and returns the body.
    pub fn admin_patch(&self, path: &str, body: &Value, status: u16) -> Value {
        let res = self.patch_json(path, Some(self.admin_key()), body);
        assert_eq!(res.status(), status, "PATCH {path} {body}");
        res.json().expect("json body")
    }

    /// GETs with the admin key, asserts 200 and returns the body.
    pub fn admin_get(&self, path: &str) -> Value {
        let res = self.get(path, Some(self.admin_key()));
        assert_eq!(res.status(), 200, "GET {path}");
        res.json().expect("json body")
    }

    pub fn delete(&self, path: &str, key: Option<&str>) -> Response {
        self.send(self.client.delete(self.url(path)), key)
    }

    fn send(&self, req: RequestBuilder, key: Option<&str>) -> Response {
        let req = match key {
            Some(key) => req.bearer_auth(key),
            None => req,
        };
        req.send().expect("request sent")
    }

    /// The bootstrap admin key (all scopes).
    pub fn admin_key(&self) -> &str {
        &self.creds.personal_api_key
    }

    // ---- one helper per endpoint ----

    pub fn health(&self) -> Response {
        self.get("/_health", None)
    }

    pub fn readiness(&self) -> Response {
        self.get("/_readiness", None)
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics", None).text().expect("metrics text")
    }

    pub fn list_projects(&self, key: &str) -> Response {
        self.get("/api/projects/", Some(key))
    }

    pub fn project(&self, key: &str, id: u64) -> Response {
        self.get(&format!("/api/projects/{id}/"), Some(key))
    }

    /// Creates a project with the admin key and returns its JSON.
    pub fn create_project(&self, name: &str) -> Value {
        let res = self.post_json(
            "/api/projects/",
            Some(self.admin_key()),
            &json!({ "name": name }),
        );
        assert_eq!(res.status(), 201, "create project");
        res.json().expect("project json")
    }

    pub fn create_key_with(&self, creator: &str, body: &Value) -> Response {
        self.post_json("/api/personal_api_keys/", Some(creator), body)
    }

    /// Creates a personal API key with the admin key; returns (id, secret).
    pub fn create_key(&self, scopes: &[&str], scoped_teams: Option<&[u64]>) -> (String, String) {
        let res = self.create_key_with(
            self.admin_key(),
            &json!({"label": "test", "scopes": scopes, "scoped_teams": scoped_teams}),
        );
        assert_eq!(res.status(), 201, "create key");
        let body: Value = res.json().expect("key json");
        (
            body["id"].as_str().expect("id").to_string(),
            body["value"].as_str().expect("value").to_string(),
        )
    }

    pub fn me(&self, key: &str) -> Response {
        self.get("/api/users/@me/", Some(key))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.begin_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub fn read_credentials(data_dir: &Path) -> Credentials {
    let text = std::fs::read_to_string(data_dir.join("credentials.json")).expect("credentials");
    serde_json::from_str(&text).expect("credentials json")
}

/// Polls `check` until it returns true or `deadline` passes.
pub fn wait_until(deadline: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// The peak resident memory of this process (the server runs in it), in bytes.
pub fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Asserts the stable error body shape and returns it.
pub fn error_body(res: Response) -> Value {
    let body: Value = res.json().expect("error body is JSON");
    for field in ["type", "code", "detail", "attr"] {
        assert!(
            body.get(field).is_some(),
            "error body lacks `{field}`: {body}"
        );
    }
    body
}

/// Every `(distinct_id, created_at µs)` row of a segment file, read with a Parquet reader.
pub fn segment_rows(file: std::fs::File) -> Vec<(String, i64)> {
    use arrow::array::{Array, StringArray, TimestampMicrosecondArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).expect("parquet");
    // Only the two columns read here (segments also hold every event's JSON).
    let mask = ProjectionMask::columns(builder.parquet_schema(), ["distinct_id", "created_at"]);
    let reader = builder.with_projection(mask).build().expect("reader");
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.expect("batch");
        let ids = batch
            .column_by_name("distinct_id")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .expect("distinct_id");
        let created = batch
            .column_by_name("created_at")
            .and_then(|c| c.as_any().downcast_ref::<TimestampMicrosecondArray>())
            .expect("created_at");
        for i in 0..batch.num_rows() {
            rows.push((ids.value(i).to_string(), created.value(i)));
        }
    }
    rows
}

pub mod oauth;
pub mod process;
pub mod receiver;
pub mod sdk;

// ---- capture helpers ----

impl TestServer {
    /// POSTs raw bytes to a capture route with optional headers.
    pub fn capture_raw(&self, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Response {
        let mut req = self.client.post(self.url(path)).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().expect("capture sent")
    }

    /// POSTs a JSON batch of events with this server's project token to `/batch/`.
    pub fn capture_batch(&self, events: &[Value]) -> Response {
        self.post_json(
            "/batch/",
            None,
            &json!({"api_key": self.creds.project_token, "batch": events}),
        )
    }

    /// `GET /api/projects/{id}/events/` with query pairs.
    pub fn events(&self, project: u64, query: &str) -> Vec<Value> {
        let res = self.get(
            &format!("/api/projects/{project}/events/?{query}"),
            Some(self.admin_key()),
        );
        let status = res.status();
        let body: Value = res.json().expect("json");
        assert_eq!(status, 200, "events API: {body}");
        body["results"].as_array().expect("results").clone()
    }

    pub fn persons(&self, project: u64, distinct_id: &str) -> Vec<Value> {
        let res = self.get(
            &format!("/api/projects/{project}/persons/?distinct_id={distinct_id}"),
            Some(self.admin_key()),
        );
        assert_eq!(res.status(), 200, "persons API");
        let body: Value = res.json().expect("json");
        body["results"].as_array().expect("results").clone()
    }

    pub fn usage(&self, project: u64) -> Vec<Value> {
        let res = self.get(
            &format!("/api/projects/{project}/usage/"),
            Some(self.admin_key()),
        );
        assert_eq!(res.status(), 200, "usage API");
        let body: Value = res.json().expect("json");
        body["results"].as_array().expect("results").clone()
    }
}
