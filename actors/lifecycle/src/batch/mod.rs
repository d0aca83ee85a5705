//! Scheduled exports to S3-compatible buckets on PostHog's `/batch_exports/` routes: the
//! exports, their runs (one per data interval), backfills, retries, pause and unpause.
//!
//! [`BatchExports::tick`] runs on one node of a cluster at a time (the engine's job lease):
//! it makes a run for each interval that ended, and starts runs that are due on this node,
//! each under a lease of its own that a heartbeat renews while it runs, so a run a dead node
//! held is taken over once its lease lapses. A run starts `settle` after its interval ended
//! (events acknowledged before the end have reached a segment or this node's tails by then),
//! selects events by capture time, so late events are never missed, and writes its objects
//! under keys that depend only on the interval, the manifest last.

mod config;
mod deliver;
mod runner;
mod runs;
mod schedule;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use corvid_kernel::{blocking, DefinitionRecords, JobLease, StoreError};
use corvid_query::QueryEngine;

pub use config::{BatchExport, Invalid, S3Destination};
pub use runs::{Backfill, BatchExportRun, BatchRunStatus};
pub use schedule::Interval;

/// Runs one node has under way at once; more wait for the next tick.
pub const MAX_RUNNING: usize = 4;

/// Intervals one backfill may cover.
pub const MAX_BACKFILL_RUNS: u64 = 10_000;

/// How scheduled exports behave.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    /// Wait after an interval ends before its run starts.
    pub settle: Duration,
    /// Wait before the first retry of a failed attempt; each further one waits twice as long.
    pub retry_after: Duration,
    /// Attempts a run makes before it fails for good.
    pub max_attempts: u32,
    /// How long one attempt may take.
    pub deadline: Duration,
    /// Finished runs and backfills are deleted this long after they ended.
    pub run_ttl: Duration,
    /// DEVELOPMENT ONLY: let an export write to a loopback or private endpoint.
    pub allow_private_endpoints: bool,
}

/// Why a batch-export request is refused.
#[derive(Debug, thiserror::Error)]
pub enum BatchExportError {
    #[error("{}", .0.detail)]
    Invalid(Invalid),
    /// What was not found: "Batch export", "Batch export run" or "Backfill".
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid(detail: impl Into<String>, attr: Option<&'static str>) -> BatchExportError {
    BatchExportError::Invalid(Invalid {
        detail: detail.into(),
        attr,
    })
}

/// Where the schedule of one export has got to: the start of the next interval to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    pub next_start: DateTime<Utc>,
}

/// Stores of the batch-export records.
pub struct BatchRecords {
    pub exports: Arc<dyn DefinitionRecords<BatchExport>>,
    pub runs: Arc<dyn DefinitionRecords<BatchExportRun>>,
    pub backfills: Arc<dyn DefinitionRecords<Backfill>>,
    pub cursors: Arc<dyn DefinitionRecords<Cursor>>,
}

/// An export with its newest runs (PostHog's `latest_runs`, at most ten).
#[derive(Debug, Clone)]
pub struct ExportView {
    pub export: BatchExport,
    pub latest_runs: Vec<BatchExportRun>,
}

/// The scheduled-exports facade. Cheap to clone.
#[derive(Clone)]
pub struct BatchExports {
    records: Arc<BatchRecords>,
    engine: Arc<QueryEngine>,
    lease: JobLease,
    dir: PathBuf,
    settings: BatchSettings,
    /// Runs under way on this node.
    active: Arc<Mutex<HashSet<Uuid>>>,
}

fn newest_first(runs: &mut [BatchExportRun]) {
    runs.sort_by(|a, b| {
        b.data_interval_start
            .cmp(&a.data_interval_start)
            .then(b.created_at.cmp(&a.created_at))
    });
}

impl BatchExports {
    /// Over `records`, writing attempts' files under `dir`, leasing runs with `lease`.
    pub fn new(
        records: BatchRecords,
        engine: Arc<QueryEngine>,
        lease: JobLease,
        dir: PathBuf,
        settings: BatchSettings,
    ) -> BatchExports {
        BatchExports {
            records: Arc::new(records),
            engine,
            lease,
            dir,
            settings,
            active: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashSet<Uuid>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A live (not deleted) export of `project`.
    async fn live(&self, project: u64, id: Uuid) -> Result<BatchExport, BatchExportError> {
        let records = Arc::clone(&self.records);
        let export = blocking(move || records.exports.get(project, &id.to_string())).await?;
        export
            .filter(|e| !e.deleted)
            .ok_or(BatchExportError::NotFound("Batch export"))
    }

    async fn put_export(&self, export: &BatchExport) -> Result<(), BatchExportError> {
        let (records, stored) = (Arc::clone(&self.records), export.clone());
        blocking(move || {
            records
                .exports
                .put(stored.team_id, &stored.id.to_string(), &stored)
        })
        .await?;
        Ok(())
    }

    /// Every run of `project` (of `export` when given).
    async fn project_runs(
        &self,
        project: u64,
        export: Option<Uuid>,
    ) -> Result<Vec<BatchExportRun>, BatchExportError> {
        let records = Arc::clone(&self.records);
        let mut runs = blocking(move || records.runs.list(project)).await?;
        runs.retain(|r| export.is_none_or(|e| r.batch_export_id == e));
        Ok(runs)
    }

    fn view(export: BatchExport, runs: &[BatchExportRun]) -> ExportView {
        let mut latest: Vec<BatchExportRun> = runs
            .iter()
            .filter(|r| r.batch_export_id == export.id)
            .cloned()
            .collect();
        newest_first(&mut latest);
        latest.truncate(10);
        ExportView {
            export,
            latest_runs: latest,
        }
    }

    /// Creates an export of `project` from a PostHog create body.
    pub async fn create(&self, project: u64, body: &Value) -> Result<ExportView, BatchExportError> {
        let export = BatchExport::create(
            project,
            body,
            self.settings.allow_private_endpoints,
            Utc::now(),
        )
        .map_err(BatchExportError::Invalid)?;
        self.put_export(&export).await?;
        tracing::info!(project, export = %export.id, "batch export created");
        Ok(ExportView {
            export,
            latest_runs: Vec::new(),
        })
    }

    /// `project`'s live exports, oldest first.
    pub async fn list(&self, project: u64) -> Result<Vec<ExportView>, BatchExportError> {
        let records = Arc::clone(&self.records);
        let exports = blocking(move || records.exports.list(project)).await?;
        let runs = self.project_runs(project, None).await?;
        let mut views: Vec<ExportView> = exports
            .into_iter()
            .filter(|e| !e.deleted)
            .map(|e| Self::view(e, &runs))
            .collect();
        views.sort_by_key(|v| v.export.created_at);
        Ok(views)
    }

    pub async fn get(&self, project: u64, id: Uuid) -> Result<ExportView, BatchExportError> {
        let export = self.live(project, id).await?;
        let runs = self.project_runs(project, Some(id)).await?;
        Ok(Self::view(export, &runs))
    }

    /// Applies a PATCH body.
    pub async fn update(
        &self,
        project: u64,
        id: Uuid,
        body: &Value,
    ) -> Result<ExportView, BatchExportError> {
        let mut export = self.live(project, id).await?;
        export
            .update(body, self.settings.allow_private_endpoints, Utc::now())
            .map_err(BatchExportError::Invalid)?;
        self.put_export(&export).await?;
        self.get(project, id).await
    }

    /// Deletes an export (kept as deleted, as PostHog does): no run of it starts again.
    pub async fn delete(&self, project: u64, id: Uuid) -> Result<(), BatchExportError> {
        let mut export = self.live(project, id).await?;
        export.deleted = true;
        export.last_updated_at = Utc::now();
        self.put_export(&export).await
    }

    /// Pauses the schedule (runs under way finish; backfills go on).
    pub async fn pause(&self, project: u64, id: Uuid) -> Result<(), BatchExportError> {
        let mut export = self.live(project, id).await?;
        if !export.paused {
            export.paused = true;
            export.last_paused_at = Some(Utc::now());
            export.last_updated_at = Utc::now();
            self.put_export(&export).await?;
        }
        Ok(())
    }

    /// Resumes the schedule. With `backfill`, the intervals missed while paused are run;
    /// without, the schedule goes on from the current interval.
    pub async fn unpause(
        &self,
        project: u64,
        id: Uuid,
        backfill: bool,
    ) -> Result<(), BatchExportError> {
        let mut export = self.live(project, id).await?;
        if !export.paused {
            return Ok(());
        }
        export.paused = false;
        export.last_updated_at = Utc::now();
        if !backfill {
            let cursor = Cursor {
                next_start: export.interval.floor(Utc::now()),
            };
            let records = Arc::clone(&self.records);
            blocking(move || records.cursors.put(project, &id.to_string(), &cursor)).await?;
        }
        self.put_export(&export).await
    }

    /// Starts a backfill of the intervals in `[start_at, end_at)` (PostHog's body; an unset
    /// start means from the first stored event, an unset end means now).
    pub async fn backfill(
        &self,
        project: u64,
        id: Uuid,
        body: &Value,
    ) -> Result<Backfill, BatchExportError> {
        let export = self.live(project, id).await?;
        let bound = |name: &'static str| -> Result<Option<DateTime<Utc>>, BatchExportError> {
            match body.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(text)) => {
                    if !has_zone(text) {
                        return Err(invalid(
                            format!("Input {name} must include a timezone offset (e.g. \"Z\")."),
                            Some(name),
                        ));
                    }
                    corvid_kernel::parse_timestamp(text)
                        .map(Some)
                        .ok_or_else(|| {
                            invalid(format!("{name} must be an ISO 8601 date-time"), Some(name))
                        })
                }
                Some(_) => Err(invalid(
                    format!("{name} must be an ISO 8601 date-time"),
                    Some(name),
                )),
            }
        };
        let (start_at, end_at) = (bound("start_at")?, bound("end_at")?);
        let now = Utc::now();
        let length = export.interval.length();
        if let Some(end) = end_at {
            if end > now + length {
                return Err(invalid(
                    format!(
                        "The provided 'end_at' ({}) is too far into the future. Cannot backfill \
                         beyond 1 batch period into the future.",
                        end.to_rfc3339()
                    ),
                    Some("end_at"),
                ));
            }
        }
        if let (Some(start), Some(end)) = (start_at, end_at) {
            if start >= end {
                return Err(invalid(
                    "The initial backfill datetime 'start_at' happens after 'end_at'",
                    Some("start_at"),
                ));
            }
        }
        let first = self
            .engine
            .first_capture(project, self.settings.deadline)
            .await
            .map_err(|e| BatchExportError::Store(StoreError::TaskFailed(e.to_string())))?;
        let Some(first) = first else {
            return Err(invalid(
                "There is no data to backfill for this model.",
                None,
            ));
        };
        let start = export
            .interval
            .floor(start_at.map_or(first, |s| s.max(first)));
        let end = end_at.unwrap_or(now);
        if start >= end {
            return Err(invalid(
                "There is no data to backfill for this model.",
                None,
            ));
        }
        let steps = (end - start).num_seconds() / length.num_seconds().max(1) + 1;
        if steps as u64 > MAX_BACKFILL_RUNS {
            return Err(invalid(
                format!(
                    "A backfill covers at most {MAX_BACKFILL_RUNS} intervals; this one covers {steps}."
                ),
                None,
            ));
        }
        let backfill_id = Uuid::now_v7();
        let mut intervals = Vec::new();
        let mut at = start;
        while at < end {
            intervals.push((at, at + length));
            at += length;
        }
        let backfill = Backfill {
            id: backfill_id,
            batch_export_id: id,
            team_id: project,
            start_at,
            end_at,
            cancelled: false,
            total_runs: intervals.len() as u64,
            created_at: now,
            last_updated_at: now,
        };
        self.record_backfill(&backfill, intervals).await?;
        tracing::info!(project, export = %id, backfill = %backfill_id, runs = backfill.total_runs, "backfill started");
        Ok(backfill)
    }

    async fn record_backfill(
        &self,
        backfill: &Backfill,
        intervals: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    ) -> Result<(), BatchExportError> {
        let (records, backfill) = (Arc::clone(&self.records), backfill.clone());
        blocking(move || {
            let project = backfill.team_id;
            records
                .backfills
                .put(project, &backfill.id.to_string(), &backfill)?;
            for interval in intervals {
                let run = BatchExportRun::new(
                    backfill.batch_export_id,
                    project,
                    Some(backfill.id),
                    interval,
                    backfill.created_at,
                );
                records.runs.put(project, &run.id.to_string(), &run)?;
            }
            Ok::<_, StoreError>(())
        })
        .await?;
        Ok(())
    }

    /// The backfills of an export, newest first, each with its runs.
    pub async fn backfills(
        &self,
        project: u64,
        id: Uuid,
    ) -> Result<Vec<(Backfill, Vec<BatchExportRun>)>, BatchExportError> {
        self.live(project, id).await?;
        let records = Arc::clone(&self.records);
        let mut backfills = blocking(move || records.backfills.list(project)).await?;
        backfills.retain(|b| b.batch_export_id == id);
        backfills.sort_by_key(|b| std::cmp::Reverse(b.created_at));
        let runs = self.project_runs(project, Some(id)).await?;
        Ok(backfills
            .into_iter()
            .map(|b| {
                let of: Vec<BatchExportRun> = runs
                    .iter()
                    .filter(|r| r.backfill == Some(b.id))
                    .cloned()
                    .collect();
                (b, of)
            })
            .collect())
    }

    pub async fn backfill_get(
        &self,
        project: u64,
        id: Uuid,
        backfill: Uuid,
    ) -> Result<(Backfill, Vec<BatchExportRun>), BatchExportError> {
        self.backfills(project, id)
            .await?
            .into_iter()
            .find(|(b, _)| b.id == backfill)
            .ok_or(BatchExportError::NotFound("Backfill"))
    }

    /// Cancels a backfill: its runs that have not finished are cancelled.
    pub async fn cancel_backfill(
        &self,
        project: u64,
        id: Uuid,
        backfill: Uuid,
    ) -> Result<(), BatchExportError> {
        let (mut found, runs) = self.backfill_get(project, id, backfill).await?;
        found.cancelled = true;
        found.last_updated_at = Utc::now();
        let records = Arc::clone(&self.records);
        blocking(move || {
            records
                .backfills
                .put(project, &found.id.to_string(), &found)?;
            for mut run in runs.into_iter().filter(|r| !r.status.is_final()) {
                cancel(&mut run);
                records.runs.put(project, &run.id.to_string(), &run)?;
            }
            Ok::<_, StoreError>(())
        })
        .await?;
        Ok(())
    }

    /// An export's runs created in `(after, before)`, newest first.
    pub async fn runs(
        &self,
        project: u64,
        id: Uuid,
        after: Option<DateTime<Utc>>,
        before: Option<DateTime<Utc>>,
    ) -> Result<Vec<BatchExportRun>, BatchExportError> {
        self.live(project, id).await?;
        let mut runs = self.project_runs(project, Some(id)).await?;
        runs.retain(|r| {
            after.is_none_or(|a| r.created_at >= a) && before.is_none_or(|b| r.created_at < b)
        });
        newest_first(&mut runs);
        Ok(runs)
    }

    pub async fn run(
        &self,
        project: u64,
        id: Uuid,
        run: Uuid,
    ) -> Result<BatchExportRun, BatchExportError> {
        self.live(project, id).await?;
        let records = Arc::clone(&self.records);
        blocking(move || records.runs.get(project, &run.to_string()))
            .await?
            .filter(|r| r.batch_export_id == id)
            .ok_or(BatchExportError::NotFound("Batch export run"))
    }

    /// Runs a run's interval again, as a one-interval backfill (PostHog's retry).
    pub async fn retry(
        &self,
        project: u64,
        id: Uuid,
        run: Uuid,
    ) -> Result<Backfill, BatchExportError> {
        let run = self.run(project, id, run).await?;
        let now = Utc::now();
        let backfill = Backfill {
            id: Uuid::now_v7(),
            batch_export_id: id,
            team_id: project,
            start_at: Some(run.data_interval_start),
            end_at: Some(run.data_interval_end),
            cancelled: false,
            total_runs: 1,
            created_at: now,
            last_updated_at: now,
        };
        self.record_backfill(
            &backfill,
            vec![(run.data_interval_start, run.data_interval_end)],
        )
        .await?;
        Ok(backfill)
    }

    /// Cancels a run that has not finished; PostHog's text for one that has.
    pub async fn cancel_run(
        &self,
        project: u64,
        id: Uuid,
        run: Uuid,
    ) -> Result<(), BatchExportError> {
        let mut run = self.run(project, id, run).await?;
        if run.status.is_final() {
            return Err(invalid(
                format!(
                    "Cannot cancel a run that is in '{}' status",
                    run.status.name()
                ),
                None,
            ));
        }
        cancel(&mut run);
        let records = Arc::clone(&self.records);
        blocking(move || records.runs.put(project, &run.id.to_string(), &run)).await?;
        Ok(())
    }
}

/// Marks a run cancelled (a cancel while an attempt runs stands: the attempt leaves it).
fn cancel(run: &mut BatchExportRun) {
    let now = Utc::now();
    run.status = BatchRunStatus::Cancelled;
    run.finished_at = Some(now);
    run.last_updated_at = now;
    run.next_attempt_at = None;
}

/// Whether an ISO 8601 text names its zone (`Z` or an offset after the time).
fn has_zone(text: &str) -> bool {
    let text = text.trim();
    let Some(time) = text.split_once('T').map(|(_, t)| t) else {
        return false;
    };
    time.ends_with('Z') || time.ends_with('z') || time.contains('+') || time.contains('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_are_required_on_backfill_bounds() {
        assert!(has_zone("2026-11-26T10:00:00Z"));
        assert!(has_zone("2026-11-26T10:00:00+02:00"));
        assert!(has_zone("2026-11-26T10:00:00-05:00"));
        assert!(!has_zone("2026-11-26T10:00:00"));
        assert!(!has_zone("2026-11-26"));
    }
}
