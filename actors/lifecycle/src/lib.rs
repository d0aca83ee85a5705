//! Data leaving Corvid: one-off file exports of a project's events, PostHog's "file download"
//! batch exports (`POST …/file_download_batch_exports` → 202 `{id}`, the run's status, its
//! files downloaded part by part), and scheduled exports to S3-compatible buckets
//! ([`batch`]).
//!
//! A run selects events by capture time (`created_at`) in its data interval, so late events
//! are never missed, reads them through the query runtime (erased events are left out, as
//! from every read) and writes Parquet or JSON Lines files under
//! `<data_dir>/exports/project_<id>/<run>/`; in a cluster they then move to the bucket's
//! `exports/project_<id>/<run>/`, so every node serves the download. Runs are records
//! ([`DefinitionRecords`]); a run a crash interrupted is marked failed when the node starts
//! again.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

pub mod batch;
mod files;
mod request;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use corvid_kernel::{blocking, DefinitionRecords, StoreError};
use corvid_query::{ExportScan, QueryEngine};
use object_store::ObjectStore;

pub use batch::{
    Backfill, BatchExportError, BatchExportRun, BatchExports, BatchRecords, BatchSettings,
    ExportView,
};
pub use request::{file_settings, Compression, ExportRequest, FileFormat, MAX_INTERVAL};

/// PostHog's run statuses that a file export takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
}

/// One export run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportRun {
    pub id: Uuid,
    pub project_id: u64,
    pub request: ExportRequest,
    pub status: RunStatus,
    /// Who asked, for the activity list.
    pub requested_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The files, in order (their names are their ids).
    pub files: Vec<String>,
    pub records_completed: u64,
    pub bytes_exported: u64,
    pub error: Option<String>,
}

/// Why an export request or download is refused.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Invalid(String),
    #[error("export run not found")]
    NotFound,
    /// The run has no file to give yet, or never will (PostHog's texts).
    #[error("{0}")]
    NotDownloadable(String),
    /// [`MAX_RUNNING`] exports are running on this node already.
    #[error("Too many exports are running; try again in a minute.")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Exports one node runs at once; past it a request is refused (each export holds a query
/// slot and writes files, so they are not queued without bound).
pub const MAX_RUNNING: usize = 4;

/// A file of a finished run, to send: its name, size and bytes.
pub struct ExportDownload {
    pub name: String,
    pub len: u64,
    pub body: futures_util::stream::BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
}

/// The exports facade. Cheap to clone.
#[derive(Clone)]
pub struct Exports {
    records: Arc<dyn DefinitionRecords<ExportRun>>,
    engine: Arc<QueryEngine>,
    dir: PathBuf,
    /// Where finished files are kept: the cluster's bucket (under `exports/`), so every node
    /// serves every download; `None` keeps them in `dir` (one node).
    bucket: Option<Arc<dyn ObjectStore>>,
    deadline: Duration,
    running: Arc<std::sync::atomic::AtomicUsize>,
}

/// Writes `project`'s events `request` selects to files in `dir` (made when missing): their
/// names in order, and the rows written.
pub(crate) async fn write_export(
    engine: &QueryEngine,
    project: u64,
    request: &ExportRequest,
    dir: &std::path::Path,
    deadline: Duration,
) -> Result<(Vec<String>, u64), String> {
    let made = dir.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::create_dir_all(made))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let writer = Arc::new(std::sync::Mutex::new(Some(files::PartWriter::new(
        dir, request,
    ))));
    let sink_writer = Arc::clone(&writer);
    let scan = ExportScan {
        start: request.data_interval_start,
        end: request.data_interval_end,
        include: request.include.clone(),
        exclude: request.exclude.clone(),
    };
    let rows = engine
        .export_events(
            project,
            scan,
            deadline,
            Box::new(move |batch| {
                let mut guard = sink_writer.lock().unwrap_or_else(|p| p.into_inner());
                match guard.as_mut() {
                    Some(w) => w.write(batch),
                    None => Err("the export's files are closed".into()),
                }
            }),
        )
        .await
        .map_err(|e| e.to_string())?;
    let last = writer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or("the export's files are closed")?;
    let schema = export_schema();
    let files = tokio::task::spawn_blocking(move || last.finish(Some(&schema)))
        .await
        .map_err(|e| e.to_string())??;
    Ok((files, rows))
}

/// A run's files, below the exports directory or the bucket's `exports/`.
fn run_key(project: u64, run: Uuid) -> String {
    format!("project_{project}/{run}")
}

/// The columns every export file has (PostHog's defaults for the events model).
fn export_schema() -> Schema {
    let time = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let text = |name: &str| Field::new(name, DataType::Utf8, true);
    Schema::new(vec![
        text("uuid"),
        Field::new("timestamp", time.clone(), true),
        Field::new("_inserted_at", time.clone(), true),
        Field::new("created_at", time, true),
        text("event"),
        text("properties"),
        text("distinct_id"),
        text("elements_chain"),
        text("person_properties"),
        text("person_id"),
    ])
}

impl Exports {
    /// Over `records`, writing files under `dir`; each run may take `deadline`. Runs left
    /// `Running` by a crash are marked failed.
    pub fn open(
        records: Arc<dyn DefinitionRecords<ExportRun>>,
        engine: Arc<QueryEngine>,
        dir: PathBuf,
        bucket: Option<Arc<dyn ObjectStore>>,
        deadline: Duration,
    ) -> Result<Exports, StoreError> {
        for (project, mut run) in records.list_all()? {
            if run.status == RunStatus::Running {
                run.status = RunStatus::Failed;
                run.error = Some("The export was interrupted by a restart.".into());
                run.finished_at = Some(Utc::now());
                records.put(project, &run.id.to_string(), &run)?;
            }
        }
        Ok(Exports {
            records,
            engine,
            dir,
            bucket,
            deadline,
            running: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        })
    }

    fn run_dir(&self, project: u64, run: Uuid) -> PathBuf {
        self.dir.join(run_key(project, run))
    }

    /// Where finished files are read from: the bucket, or this node's directory.
    fn files(&self) -> Result<Arc<dyn ObjectStore>, String> {
        match &self.bucket {
            Some(bucket) => Ok(Arc::clone(bucket)),
            None => Ok(Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(&self.dir)
                    .map_err(|e| e.to_string())?,
            )),
        }
    }

    /// Moves a finished run's files to the bucket (in a cluster); they leave this node.
    async fn publish(&self, project: u64, run: Uuid, files: &[String]) -> Result<(), String> {
        let Some(bucket) = &self.bucket else {
            return Ok(());
        };
        let dir = self.run_dir(project, run);
        for name in files {
            let key = format!("{}/{name}", run_key(project, run));
            corvid_kernel::bucket::upload_file(bucket.as_ref(), &dir.join(name), &key).await?;
        }
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        Ok(())
    }

    /// Records a run and starts it in the background; returns it (status `Running`).
    pub async fn start(
        &self,
        project: u64,
        request: ExportRequest,
        requested_by: Option<String>,
    ) -> Result<ExportRun, ExportError> {
        use std::sync::atomic::Ordering;
        if self
            .running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_RUNNING).then_some(n + 1)
            })
            .is_err()
        {
            return Err(ExportError::Busy);
        }
        let started = self.start_counted(project, request, requested_by).await;
        if started.is_err() {
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
        started
    }

    /// [`Exports::start`] once the run is counted; the spawned run uncounts itself.
    async fn start_counted(
        &self,
        project: u64,
        request: ExportRequest,
        requested_by: Option<String>,
    ) -> Result<ExportRun, ExportError> {
        let run = ExportRun {
            id: Uuid::now_v7(),
            project_id: project,
            request,
            status: RunStatus::Running,
            requested_by,
            created_at: Utc::now(),
            finished_at: None,
            files: Vec::new(),
            records_completed: 0,
            bytes_exported: 0,
            error: None,
        };
        let (records, stored) = (Arc::clone(&self.records), run.clone());
        blocking(move || records.put(project, &stored.id.to_string(), &stored)).await?;
        let this = self.clone();
        let started = run.clone();
        tokio::spawn(async move {
            this.execute(started).await;
            this.running
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        });
        Ok(run)
    }

    /// Runs `run` to its end and records the outcome.
    async fn execute(&self, mut run: ExportRun) {
        let dir = self.run_dir(run.project_id, run.id);
        let mut outcome = write_export(
            &self.engine,
            run.project_id,
            &run.request,
            &dir,
            self.deadline,
        )
        .await;
        if let Ok((files, _)) = &outcome {
            run.bytes_exported = files
                .iter()
                .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
                .map(|m| m.len())
                .sum();
            if let Err(e) = self.publish(run.project_id, run.id, files).await {
                outcome = Err(format!("could not store the export's files: {e}"));
            }
        }
        run.finished_at = Some(Utc::now());
        match outcome {
            Ok((files, rows)) => {
                run.status = RunStatus::Completed;
                run.files = files;
                run.records_completed = rows;
                tracing::info!(project = run.project_id, run = %run.id, rows, "export completed");
            }
            Err(error) => {
                tracing::warn!(project = run.project_id, run = %run.id, %error, "export failed");
                run.status = RunStatus::Failed;
                run.error = Some(error);
            }
        }
        let (records, project, id) = (Arc::clone(&self.records), run.project_id, run.id);
        if let Err(e) = blocking(move || records.put(project, &id.to_string(), &run)).await {
            tracing::error!(error = %e, run = %id, "could not record an export's outcome");
        }
    }

    /// A run of `project`.
    pub async fn run(&self, project: u64, id: Uuid) -> Result<Option<ExportRun>, ExportError> {
        let records = Arc::clone(&self.records);
        Ok(blocking(move || records.get(project, &id.to_string())).await?)
    }

    /// Deletes finished runs older than `ttl` (their records and this node's files), and this
    /// node's files of runs whose record is gone (another node expired it). Returns how many
    /// runs went.
    pub async fn expire(&self, now: DateTime<Utc>, ttl: Duration) -> Result<usize, ExportError> {
        let (records, dir) = (Arc::clone(&self.records), self.dir.clone());
        let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let (count, gone_runs) = blocking(move || {
            let mut expired = std::collections::HashSet::new();
            let mut gone_runs = Vec::new();
            let mut kept = std::collections::HashSet::new();
            for (project, run) in records.list_all()? {
                let old = run
                    .finished_at
                    .is_some_and(|at| now.signed_duration_since(at) > ttl);
                if old {
                    records.delete(project, &run.id.to_string())?;
                    expired.insert(run.id.to_string());
                    gone_runs.push((project, run.id));
                } else {
                    kept.insert(run.id.to_string());
                }
            }
            // This node's files of the runs that went, and of runs with no record that are
            // older than the time to live (a run started after the listing above is younger).
            let stale = |path: &std::path::Path| {
                std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .and_then(|age| chrono::Duration::from_std(age).ok())
                    .is_some_and(|age| age > ttl)
            };
            let projects = std::fs::read_dir(&dir).into_iter().flatten().flatten();
            for project in projects.filter(|p| p.file_name().to_string_lossy().starts_with("project_")) {
                for run in std::fs::read_dir(project.path()).into_iter().flatten().flatten() {
                    let name = run.file_name().to_string_lossy().into_owned();
                    let gone = expired.contains(&name)
                        || (!kept.contains(&name) && stale(&run.path()));
                    if gone {
                        if let Err(e) = std::fs::remove_dir_all(run.path()) {
                            tracing::warn!(error = %e, run = name, "could not delete an expired export's files");
                        }
                    }
                }
            }
            Ok::<_, StoreError>((expired.len(), gone_runs))
        })
        .await?;
        // Their files in the bucket (in a cluster every node may try; deleting twice is fine).
        if let Some(bucket) = &self.bucket {
            use futures_util::TryStreamExt;
            use object_store::ObjectStoreExt;
            for (project, run) in gone_runs {
                let prefix = object_store::path::Path::from(run_key(project, run));
                let objects: Vec<_> = bucket
                    .list(Some(&prefix))
                    .try_collect()
                    .await
                    .map_err(|e| ExportError::Store(StoreError::TaskFailed(e.to_string())))?;
                for object in objects {
                    match bucket.delete(&object.location).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "could not delete an expired export's object")
                        }
                    }
                }
            }
        }
        Ok(count)
    }

    /// The name of the file `part` (a 0-based index or a file's name) of a finished run;
    /// PostHog's texts for a run that has none to give.
    pub async fn file_name(
        &self,
        project: u64,
        id: Uuid,
        part: &str,
    ) -> Result<String, ExportError> {
        let run = self.run(project, id).await?.ok_or(ExportError::NotFound)?;
        match run.status {
            RunStatus::Running => {
                return Err(ExportError::NotDownloadable(
                    "Batch export run is still in progress".into(),
                ))
            }
            RunStatus::Failed => {
                return Err(ExportError::NotDownloadable(
                    "Batch export run has failed".into(),
                ))
            }
            RunStatus::Completed => {}
        }
        match part.parse::<usize>() {
            Ok(index) => run.files.get(index).cloned(),
            Err(_) => run.files.iter().find(|f| f.as_str() == part).cloned(),
        }
        .ok_or_else(|| ExportError::NotDownloadable(format!("No files with index {part}")))
    }

    /// The file `part` of a finished run, to stream (from the bucket in a cluster, so any
    /// node serves it).
    pub async fn download(
        &self,
        project: u64,
        id: Uuid,
        part: &str,
    ) -> Result<ExportDownload, ExportError> {
        let name = self.file_name(project, id, part).await?;
        use futures_util::{StreamExt, TryStreamExt};
        use object_store::ObjectStoreExt;
        let files = self
            .files()
            .map_err(|e| ExportError::Store(StoreError::TaskFailed(e)))?;
        let key = object_store::path::Path::from(format!("{}/{name}", run_key(project, id)));
        let got = files.get(&key).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => ExportError::NotDownloadable(format!(
                "The file {name} of this run is no longer available"
            )),
            other => ExportError::Store(StoreError::TaskFailed(other.to_string())),
        })?;
        let len = got.meta.size;
        let body = got.into_stream().map_err(std::io::Error::other).boxed();
        Ok(ExportDownload { name, len, body })
    }
}
