//! Helpers that run outside the test process: `corvid serve` as a child (for `kill -9`) and
//! moto's S3 server from PyPI (standing in for any S3-compatible service).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{sdk, wait_until};

/// Starts `corvid serve` as a child process on a free loopback port; returns it and its base
/// URL once it listens.
pub fn spawn_corvid(data_dir: &Path, config: Option<&Path>) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_corvid"));
    cmd.args([
        "--log-format",
        "json",
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--data-dir",
    ])
    .arg(data_dir);
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    let mut child = cmd
        .env("RUST_LOG", "info")
        .env_remove("CORVID_POSTGRES_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("server exited before listening:\n{}", seen.join("\n"));
        };
        let Ok(log) = serde_json::from_str::<Value>(&line) else {
            seen.push(line);
            continue;
        };
        if log["message"] == "corvid listening" {
            break log["addr"].as_str().expect("addr").to_string();
        }
        seen.push(line);
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, format!("http://{addr}"))
}

/// A child process killed when the test ends, pass or fail.
pub struct Helper(pub Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// moto's S3 server on a free loopback port (credentials `test`/`test`).
pub struct S3Server {
    pub url: String,
    _process: Helper,
}

impl S3Server {
    pub fn start() -> S3Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let process = Helper(
            Command::new(sdk::python())
                .args([
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("moto starts"),
        );
        let url = format!("http://127.0.0.1:{port}");
        let http = super::client_builder().build().expect("client");
        assert!(
            wait_until(Duration::from_secs(30), || http
                .get(format!("{url}/moto-api/"))
                .send()
                .is_ok_and(|r| r.status().is_success())),
            "the S3 server came up"
        );
        S3Server {
            url,
            _process: process,
        }
    }

    /// Creates `bucket`.
    pub fn create_bucket(&self, bucket: &str) {
        let res = super::client_builder()
            .build()
            .expect("client")
            .put(format!("{}/{bucket}", self.url))
            .send()
            .expect("create bucket");
        assert_eq!(res.status(), 200, "bucket {bucket} created");
    }

    /// The bytes of one object (read as the nodes read it: signed, through `object_store`).
    pub fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        let store = corvid_kernel::bucket::s3_store(&corvid_kernel::bucket::S3Settings {
            bucket: bucket.into(),
            region: Some("us-east-1".into()),
            endpoint: Some(self.url.clone()),
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
            prefix: None,
            allow_http: true,
        })
        .expect("bucket");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            use object_store::ObjectStoreExt;
            let path = object_store::path::Path::from(key);
            store
                .get(&path)
                .await
                .expect("get object")
                .bytes()
                .await
                .expect("body")
                .to_vec()
        })
    }

    /// The keys in `bucket` under `prefix` (one listing page).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let xml = super::client_builder()
            .build()
            .expect("client")
            .get(format!("{}/{bucket}?list-type=2&prefix={prefix}", self.url))
            .send()
            .expect("list")
            .text()
            .expect("xml");
        xml.split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split_once("</Key>").map(|(k, _)| k.to_string()))
            .collect()
    }

    /// Every row of the JSON Lines objects (gzip-compressed or not) that the manifests under
    /// `prefix` list, read as a reader that honours the manifests reads them: how many times
    /// each event uuid was written.
    pub fn manifest_rows(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> std::collections::BTreeMap<String, usize> {
        let mut seen = std::collections::BTreeMap::new();
        for manifest in self
            .keys(bucket, prefix)
            .iter()
            .filter(|k| k.ends_with("_manifest.json"))
        {
            let body: Value =
                serde_json::from_slice(&self.get(bucket, manifest)).expect("manifest");
            for key in body["files"].as_array().expect("files") {
                let key = key.as_str().expect("key");
                let bytes = self.get(bucket, key);
                let mut text = String::new();
                if key.ends_with(".gz") {
                    std::io::Read::read_to_string(
                        &mut flate2::read::GzDecoder::new(&bytes[..]),
                        &mut text,
                    )
                    .expect("gzip");
                } else {
                    text = String::from_utf8(bytes).expect("utf-8");
                }
                for line in text.lines() {
                    let row: Value = serde_json::from_str(line).expect("json line");
                    *seen
                        .entry(row["uuid"].as_str().expect("uuid").to_string())
                        .or_insert(0) += 1;
                }
            }
        }
        seen
    }
}
