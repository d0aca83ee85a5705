//! The control socket: `<data_dir>/control.sock`, a Unix socket only the data dir's owner can
//! reach (mode 0600; whoever can read the data dir can read all of it anyway). `corvid
//! snapshot` asks the node serving a data dir to snapshot itself through it, because a second
//! process cannot open the node's metadata store while it runs.
//!
//! One request per connection: a JSON line `{"command": "snapshot", "to": "<dir or s3://…>"}`,
//! answered by a JSON line `{"ok": true, "report": {…}}` or `{"ok": false, "error": "…"}`.

use std::path::{Path, PathBuf};

use actix_web::web;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::state::AppState;

/// The longest request line read.
const MAX_REQUEST: usize = 64 * 1024;

/// Where a data dir's control socket is.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "lowercase")]
pub enum Request {
    /// `aws`: the asker's `AWS_*` variables, for an `s3://` target.
    Snapshot {
        to: String,
        #[serde(default)]
        aws: Vec<(String, String)>,
    },
}

/// Listens on the data dir's control socket (an embedded node only). A socket that cannot be
/// made is logged, not fatal: snapshots then need the node stopped.
#[cfg(unix)]
pub fn spawn(state: web::Data<AppState>, data_dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path(data_dir);
    // A socket file left by a node that was killed; no other node serves this data dir (its
    // metadata store is locked).
    let _ = std::fs::remove_file(&path);
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!(%error, path = %path.display(), "no control socket; `corvid snapshot` needs the node stopped");
            return;
        }
    };
    if let Err(error) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!(%error, "could not restrict the control socket to its owner");
        return;
    }
    actix_web::rt::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let state = state.clone();
            actix_web::rt::spawn(async move {
                if let Err(error) = answer(stream, &state).await {
                    tracing::warn!(%error, "control socket request failed");
                }
            });
        }
    });
}

#[cfg(not(unix))]
pub fn spawn(_state: web::Data<AppState>, _data_dir: &Path) {}

#[cfg(unix)]
async fn answer(stream: tokio::net::UnixStream, state: &AppState) -> std::io::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST as u64))
        .read_line(&mut line)
        .await?;
    let reply = match serde_json::from_str::<Request>(&line) {
        Ok(Request::Snapshot { to, aws }) => match state.engine.snapshot(&to, &aws).await {
            Ok(report) => json!({"ok": true, "report": report}),
            Err(error) => json!({"ok": false, "error": error.to_string()}),
        },
        Err(error) => json!({"ok": false, "error": format!("not a control request: {error}")}),
    };
    let mut bytes = serde_json::to_vec(&reply)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    write.shutdown().await
}

/// Sends `request` to the node serving `data_dir`; `None` when no node answers there.
#[cfg(unix)]
pub fn ask(data_dir: &Path, request: &Request) -> Option<std::io::Result<Value>> {
    use std::io::{BufRead, Write};
    let stream = std::os::unix::net::UnixStream::connect(socket_path(data_dir)).ok()?;
    let exchange = || -> std::io::Result<Value> {
        let mut writer = stream.try_clone()?;
        let mut line = serde_json::to_vec(request)?;
        line.push(b'\n');
        writer.write_all(&line)?;
        writer.flush()?;
        let mut reply = String::new();
        std::io::BufReader::new(stream).read_line(&mut reply)?;
        serde_json::from_str(&reply).map_err(std::io::Error::other)
    };
    Some(exchange())
}

#[cfg(not(unix))]
pub fn ask(_data_dir: &Path, _request: &Request) -> Option<std::io::Result<Value>> {
    None
}
