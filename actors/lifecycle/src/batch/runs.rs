//! Runs of a scheduled export (one per data interval, PostHog's statuses and fields) and
//! backfills (a set of runs over past intervals, asked for by a person).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

/// PostHog's run statuses that Corvid's runs take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchRunStatus {
    /// Created, waiting for a node to run it.
    Starting,
    Running,
    Completed,
    /// Failed; tried again at `next_attempt_at`.
    FailedRetryable,
    /// Failed for good (out of attempts).
    Failed,
    Cancelled,
}

impl BatchRunStatus {
    /// Whether the run will not change again by itself.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            BatchRunStatus::Completed | BatchRunStatus::Failed | BatchRunStatus::Cancelled
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            BatchRunStatus::Starting => "Starting",
            BatchRunStatus::Running => "Running",
            BatchRunStatus::Completed => "Completed",
            BatchRunStatus::FailedRetryable => "FailedRetryable",
            BatchRunStatus::Failed => "Failed",
            BatchRunStatus::Cancelled => "Cancelled",
        }
    }
}

/// One run: the export of one data interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchExportRun {
    pub id: Uuid,
    pub batch_export_id: Uuid,
    pub team_id: u64,
    pub status: BatchRunStatus,
    pub data_interval_start: DateTime<Utc>,
    pub data_interval_end: DateTime<Utc>,
    pub records_completed: Option<u64>,
    pub bytes_exported: Option<u64>,
    pub latest_error: Option<String>,
    /// The backfill (or retry) that made the run; `None` for the schedule's own runs.
    pub backfill: Option<Uuid>,
    /// Attempts begun so far.
    pub attempts: u32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The objects the last completed attempt wrote, the manifest last.
    pub keys: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub last_updated_at: DateTime<Utc>,
}

impl BatchExportRun {
    /// A new run of `export`'s interval `[start, end)`. Its id depends only on the export,
    /// the backfill and the interval, so two nodes (or a restarted one) making the same run
    /// make one record.
    pub fn new(
        export: Uuid,
        team: u64,
        backfill: Option<Uuid>,
        (start, end): (DateTime<Utc>, DateTime<Utc>),
        now: DateTime<Utc>,
    ) -> BatchExportRun {
        let name = format!(
            "{}/{}/{}",
            backfill.map(|b| b.to_string()).unwrap_or_default(),
            start.timestamp_micros(),
            end.timestamp_micros()
        );
        BatchExportRun {
            id: Uuid::new_v5(&export, name.as_bytes()),
            batch_export_id: export,
            team_id: team,
            status: BatchRunStatus::Starting,
            data_interval_start: start,
            data_interval_end: end,
            records_completed: None,
            bytes_exported: None,
            latest_error: None,
            backfill,
            attempts: 0,
            next_attempt_at: None,
            keys: Vec::new(),
            created_at: now,
            finished_at: None,
            last_updated_at: now,
        }
    }

    /// PostHog's BatchExportRun JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "batch_export": self.batch_export_id,
            "status": self.status.name(),
            "records_completed": self.records_completed,
            "records_total_count": self.records_completed,
            "bytes_exported": self.bytes_exported,
            "latest_error": self.latest_error,
            "data_interval_start": self.data_interval_start,
            "data_interval_end": self.data_interval_end,
            "cursor": null,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "last_updated_at": self.last_updated_at,
            "backfill": self.backfill,
            "attempts": self.attempts,
        })
    }
}

/// A backfill: runs over the intervals of `[start_at, end_at)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Backfill {
    pub id: Uuid,
    pub batch_export_id: Uuid,
    pub team_id: u64,
    pub start_at: Option<DateTime<Utc>>,
    pub end_at: Option<DateTime<Utc>>,
    pub cancelled: bool,
    pub total_runs: u64,
    pub created_at: DateTime<Utc>,
    pub last_updated_at: DateTime<Utc>,
}

impl Backfill {
    /// PostHog's backfill JSON, its status and progress from its runs.
    pub fn to_json(&self, runs: &[&BatchExportRun]) -> Value {
        let finished = runs.iter().filter(|r| r.status.is_final()).count() as u64;
        let status = if self.cancelled {
            "Cancelled"
        } else if finished < self.total_runs {
            "Running"
        } else if runs.iter().all(|r| r.status == BatchRunStatus::Completed) {
            "Completed"
        } else {
            "Failed"
        };
        let finished_at = (finished == self.total_runs)
            .then(|| runs.iter().filter_map(|r| r.finished_at).max())
            .flatten();
        json!({
            "id": self.id,
            "batch_export": self.batch_export_id,
            "team_id": self.team_id,
            "start_at": self.start_at,
            "end_at": self.end_at,
            "status": status,
            "created_at": self.created_at,
            "finished_at": finished_at,
            "last_updated_at": self.last_updated_at,
            "total_runs": self.total_runs,
            "progress": {
                "total_runs": self.total_runs,
                "finished_runs": finished,
                "progress": if self.total_runs == 0 { 1.0 } else { finished as f64 / self.total_runs as f64 },
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_the_same_interval_has_the_same_id() {
        let export = Uuid::now_v7();
        let start: DateTime<Utc> = "2026-11-26T13:00:00Z".parse().expect("time");
        let end = start + chrono::Duration::hours(1);
        let a = BatchExportRun::new(export, 1, None, (start, end), Utc::now());
        let b = BatchExportRun::new(export, 1, None, (start, end), Utc::now());
        assert_eq!(a.id, b.id);
        let backfilled =
            BatchExportRun::new(export, 1, Some(Uuid::now_v7()), (start, end), Utc::now());
        assert_ne!(a.id, backfilled.id);
    }
}
