//! The schedule's side of scheduled exports: each tick makes the runs of intervals that
//! ended, starts the due ones on this node under leases of their own (renewed by a
//! heartbeat while they run), records each attempt's outcome and retry time, and deletes
//! finished runs past their time to live.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use corvid_kernel::{blocking, StoreError};

use super::{
    cancel, deliver, BatchExportError, BatchExportRun, BatchExports, BatchRecords, BatchRunStatus,
    Cursor, MAX_RUNNING,
};
use std::sync::Arc;

/// Intervals the schedule catches up on per export and tick (a node that was down long).
const CATCH_UP_PER_TICK: usize = 1_000;

/// How long a run's lease lasts; its heartbeat renews it three times as often.
const RUN_LEASE: Duration = Duration::from_secs(30);

impl BatchExports {
    /// One pass of the schedule: runs made for intervals that ended, due runs started on
    /// this node, finished runs past their time to live deleted. Returns the runs started.
    pub async fn tick(&self, now: DateTime<Utc>) -> Result<usize, BatchExportError> {
        let records = Arc::clone(&self.records);
        let ttl =
            chrono::Duration::from_std(self.settings.run_ttl).unwrap_or(chrono::Duration::MAX);
        let runs = blocking(move || schedule_and_list(&records, now, ttl)).await?;
        let settle = chrono::Duration::from_std(self.settings.settle).unwrap_or_default();
        let mut due: Vec<BatchExportRun> = {
            let active = self.active();
            runs.into_iter()
                .filter(|r| r.data_interval_end + settle <= now && !active.contains(&r.id))
                .filter(|r| match r.status {
                    BatchRunStatus::Starting | BatchRunStatus::Running => true,
                    BatchRunStatus::FailedRetryable => r.next_attempt_at.is_none_or(|at| at <= now),
                    _ => false,
                })
                .collect()
        };
        due.sort_by_key(|r| (r.data_interval_start, r.created_at));
        let mut started = 0;
        for run in due {
            if self.active().len() >= MAX_RUNNING {
                break;
            }
            if !self.claim(run.id).await {
                continue;
            }
            self.active().insert(run.id);
            started += 1;
            let this = self.clone();
            tokio::spawn(async move {
                let id = run.id;
                this.execute(run).await;
                this.release(id).await;
                this.active().remove(&id);
            });
        }
        Ok(started)
    }

    async fn claim(&self, run: Uuid) -> bool {
        let (claims, holder) = (Arc::clone(&self.lease.claims), self.lease.holder.clone());
        let job = format!("batch_export_run/{run}");
        tokio::task::spawn_blocking(move || claims.claim(&job, &holder, Utc::now(), RUN_LEASE))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false)
    }

    async fn release(&self, run: Uuid) {
        let (claims, holder) = (Arc::clone(&self.lease.claims), self.lease.holder.clone());
        let job = format!("batch_export_run/{run}");
        let _ = tokio::task::spawn_blocking(move || claims.release(&job, &holder)).await;
    }

    /// One attempt of `run`, its lease renewed while it lasts, its outcome recorded.
    async fn execute(&self, run: BatchExportRun) {
        let heartbeat = {
            let this = self.clone();
            let id = run.id;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(RUN_LEASE / 3).await;
                    if !this.claim(id).await {
                        tracing::warn!(run = %id, "lost the lease of a batch-export run");
                    }
                }
            })
        };
        if let Err(e) = self.attempt(run.clone()).await {
            tracing::error!(run = %run.id, error = %e, "could not record a batch-export run");
        }
        heartbeat.abort();
    }

    async fn attempt(&self, run: BatchExportRun) -> Result<(), BatchExportError> {
        let (project, id) = (run.team_id, run.id);
        let records = Arc::clone(&self.records);
        let export_id = run.batch_export_id;
        let (current, export) = blocking(move || {
            Ok::<_, StoreError>((
                records.runs.get(project, &id.to_string())?,
                records.exports.get(project, &export_id.to_string())?,
            ))
        })
        .await?;
        let Some(mut run) = current.filter(|r| !r.status.is_final()) else {
            return Ok(());
        };
        let Some(export) = export.filter(|e| !e.deleted) else {
            cancel(&mut run);
            run.latest_error = Some("The batch export was deleted.".into());
            return self.put_run(run).await;
        };
        run.status = BatchRunStatus::Running;
        run.attempts += 1;
        run.last_updated_at = Utc::now();
        self.put_run(run.clone()).await?;
        tracing::info!(project, export = %export.id, run = %run.id, attempt = run.attempts, "batch export run started");
        let delivery = deliver::Delivery {
            engine: &self.engine,
            dir: self.dir.join(run.id.to_string()),
            deadline: self.settings.deadline,
            allow_private: self.settings.allow_private_endpoints,
        };
        let outcome = delivery.deliver(&export, &run).await;
        // A cancel while the attempt ran stands.
        let records = Arc::clone(&self.records);
        let latest = blocking(move || records.runs.get(project, &id.to_string())).await?;
        if latest.is_some_and(|r| r.status == BatchRunStatus::Cancelled) {
            return Ok(());
        }
        let now = Utc::now();
        run.last_updated_at = now;
        match outcome {
            Ok(done) => {
                tracing::info!(project, run = %run.id, rows = done.rows, "batch export run completed");
                run.status = BatchRunStatus::Completed;
                run.records_completed = Some(done.rows);
                run.bytes_exported = Some(done.bytes);
                run.keys = done.keys;
                run.latest_error = None;
                run.next_attempt_at = None;
                run.finished_at = Some(now);
            }
            Err(error) => {
                tracing::warn!(project, run = %run.id, attempt = run.attempts, %error, "batch export run failed");
                run.latest_error = Some(error);
                if run.attempts >= self.settings.max_attempts {
                    run.status = BatchRunStatus::Failed;
                    run.finished_at = Some(now);
                    run.next_attempt_at = None;
                } else {
                    let wait = self
                        .settings
                        .retry_after
                        .saturating_mul(1 << (run.attempts - 1).min(8))
                        .min(Duration::from_secs(3600));
                    run.status = BatchRunStatus::FailedRetryable;
                    run.next_attempt_at =
                        Some(now + chrono::Duration::from_std(wait).unwrap_or_default());
                }
            }
        }
        self.put_run(run).await
    }

    async fn put_run(&self, run: BatchExportRun) -> Result<(), BatchExportError> {
        let records = Arc::clone(&self.records);
        blocking(move || records.runs.put(run.team_id, &run.id.to_string(), &run)).await?;
        Ok(())
    }
}

/// The schedule's part of a tick, on a blocking thread: a run for every interval of every
/// unpaused export that ended, and every run (finished ones past `ttl` deleted, with their
/// backfills once no run of theirs is left).
fn schedule_and_list(
    records: &BatchRecords,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> Result<Vec<BatchExportRun>, StoreError> {
    for (project, export) in records.exports.list_all()? {
        if export.deleted || export.paused {
            continue;
        }
        let key = export.id.to_string();
        let stored = records.cursors.get(project, &key)?;
        let mut cursor = stored.clone().unwrap_or(Cursor {
            next_start: export
                .interval
                .floor(export.start_at.unwrap_or(export.created_at)),
        });
        let length = export.interval.length();
        let mut made = 0;
        while cursor.next_start + length <= now
            && export.end_at.is_none_or(|end| cursor.next_start < end)
            && made < CATCH_UP_PER_TICK
        {
            let run = BatchExportRun::new(
                export.id,
                project,
                None,
                (cursor.next_start, cursor.next_start + length),
                now,
            );
            if records.runs.get(project, &run.id.to_string())?.is_none() {
                records.runs.put(project, &run.id.to_string(), &run)?;
            }
            cursor.next_start += length;
            made += 1;
        }
        if stored.as_ref() != Some(&cursor) {
            records.cursors.put(project, &key, &cursor)?;
        }
    }
    let mut kept = Vec::new();
    let mut backfills_in_use = HashSet::new();
    for (project, run) in records.runs.list_all()? {
        let expired = run.status.is_final() && run.finished_at.is_some_and(|at| now - at > ttl);
        if expired {
            records.runs.delete(project, &run.id.to_string())?;
        } else {
            if let Some(b) = run.backfill {
                backfills_in_use.insert(b);
            }
            kept.push(run);
        }
    }
    for (project, backfill) in records.backfills.list_all()? {
        if !backfills_in_use.contains(&backfill.id) && now - backfill.created_at > ttl {
            records
                .backfills
                .delete(project, &backfill.id.to_string())?;
        }
    }
    Ok(kept)
}
