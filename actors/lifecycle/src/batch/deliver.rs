//! One attempt of a run: the interval's events written to local files (as a file export
//! writes them), uploaded to the destination under keys that depend only on the interval,
//! objects an earlier attempt left beyond them deleted, and the manifest written last, so a
//! reader that waits for the manifest never sees a half-written interval and a retried one
//! overwrites rather than duplicates.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use corvid_kernel::bucket::{s3_destination, upload_file, S3Settings};
use corvid_query::QueryEngine;

use super::config::{check_endpoint, BatchExport};
use super::runs::BatchExportRun;
use super::schedule::{fill_prefix, interval_stem, manifest_name, object_key};
use crate::request::ExportRequest;

/// What an attempt wrote.
pub struct Delivered {
    /// The data objects' keys, then the manifest's.
    pub keys: Vec<String>,
    pub rows: u64,
    pub bytes: u64,
}

/// Everything an attempt needs besides the run and its export.
pub struct Delivery<'a> {
    pub engine: &'a QueryEngine,
    /// Where the attempt's files are written before they are uploaded (removed after).
    pub dir: PathBuf,
    pub deadline: Duration,
    pub allow_private: bool,
}

fn other(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The destination's bucket, its endpoint checked again (a name may resolve elsewhere now).
async fn bucket(export: &BatchExport, allow_private: bool) -> Result<Arc<dyn ObjectStore>, String> {
    let d = &export.destination;
    if let Some(endpoint) = &d.endpoint_url {
        let url = check_endpoint(endpoint, allow_private).map_err(|e| e.detail)?;
        if let (Some(url::Host::Domain(host)), false) = (url.host(), allow_private) {
            let port = url.port_or_known_default().unwrap_or(443);
            let addresses = tokio::net::lookup_host((host.to_string(), port))
                .await
                .map_err(|e| format!("could not resolve the endpoint: {e}"))?;
            for address in addresses {
                if corvid_kernel::net::is_special_use(address.ip()) {
                    return Err(format!("Invalid endpoint_url: '{endpoint}'"));
                }
            }
        }
    }
    s3_destination(
        &S3Settings {
            bucket: d.bucket_name.clone(),
            region: Some(d.region.clone()).filter(|r| !r.is_empty()),
            endpoint: d.endpoint_url.clone(),
            access_key_id: Some(d.aws_access_key_id.clone()),
            secret_access_key: Some(d.aws_secret_access_key.clone()),
            prefix: None,
            allow_http: d
                .endpoint_url
                .as_deref()
                .is_some_and(|u| u.starts_with("http://")),
        },
        d.use_virtual_style_addressing,
    )
}

impl Delivery<'_> {
    /// Exports `run`'s interval of `export` to its destination.
    pub async fn deliver(
        &self,
        export: &BatchExport,
        run: &BatchExportRun,
    ) -> Result<Delivered, String> {
        let outcome = self.attempt(export, run).await;
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        outcome
    }

    async fn attempt(
        &self,
        export: &BatchExport,
        run: &BatchExportRun,
    ) -> Result<Delivered, String> {
        let store = bucket(export, self.allow_private).await?;
        let (start, end) = (run.data_interval_start, run.data_interval_end);
        let d = &export.destination;
        let request = ExportRequest {
            format: d.file_format,
            compression: d.compression,
            max_size_mb: d.max_file_size_mb,
            data_interval_start: start,
            data_interval_end: end,
            include: d.include_events.clone(),
            exclude: d.exclude_events.clone(),
        };
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)
        })
        .await
        .map_err(other)?
        .map_err(other)?;
        let (files, rows) = crate::write_export(
            self.engine,
            export.team_id,
            &request,
            &self.dir,
            self.deadline,
        )
        .await?;

        let prefix = fill_prefix(&d.prefix, start, end);
        let mut keys = Vec::with_capacity(files.len() + 1);
        let mut bytes = 0u64;
        for name in &files {
            let key = object_key(&prefix, name);
            bytes += upload_file(store.as_ref(), &self.dir.join(name), &key)
                .await?
                .bytes;
            keys.push(key);
        }
        // Parts an earlier attempt wrote beyond this one's (the rows changed in between, an
        // erasure say) would be read twice: they go before the manifest is written.
        let stem = object_key(&prefix, &interval_stem(start, end));
        let manifest = object_key(&prefix, &manifest_name(start, end));
        let listed = {
            use futures_util::TryStreamExt;
            let parent = ObjectPath::from(prefix.trim_matches('/'));
            store
                .list(Some(&parent))
                .try_collect::<Vec<_>>()
                .await
                .map_err(other)?
        };
        for object in listed {
            let key = object.location.to_string();
            if key.starts_with(&stem) && key != manifest && !keys.contains(&key) {
                store.delete(&object.location).await.map_err(other)?;
            }
        }
        let body = serde_json::to_vec(&serde_json::json!({"files": keys})).map_err(other)?;
        store
            .put(&ObjectPath::from(manifest.as_str()), PutPayload::from(body))
            .await
            .map_err(other)?;
        keys.push(manifest);
        Ok(Delivered { keys, rows, bytes })
    }
}
