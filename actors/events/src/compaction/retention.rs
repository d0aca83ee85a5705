//! Event retention: a project keeps the days its retention covers; older `(project, day)`
//! partitions leave the catalog and the store whole (every version of every segment of the
//! day), which is cheap because segments are partitioned by day. Each dropped day is recorded
//! ([`DayDrop`]) after its files went, so readers know answers computed before it may hold
//! that day.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::{project_job, Compactor};
use crate::catalog::{newest_versions, DayDrop, SegmentRef};

/// How many days each project keeps: `None` keeps everything. Read at every pass, so a
/// changed setting takes effect on the next one.
pub type RetentionPolicy = Arc<dyn Fn(u64) -> Result<Option<u32>, String> + Send + Sync>;

/// The first day a project keeping `days` days keeps at `now`: today and the `days - 1`
/// before it (UTC).
pub fn first_kept_day(days: u32, now: DateTime<Utc>) -> NaiveDate {
    let today = now.date_naive();
    today
        .checked_sub_days(chrono::Days::new(u64::from(days.saturating_sub(1))))
        .unwrap_or(NaiveDate::MIN)
}

impl Compactor {
    /// Drops every project's days past its retention, for the projects this node can claim.
    pub fn apply_retention(
        &self,
        policy: &RetentionPolicy,
        now: DateTime<Utc>,
    ) -> std::io::Result<Vec<DayDrop>> {
        let mut dropped = Vec::new();
        if self.backups.running() {
            // A backup may still copy the expired days; the next pass drops them.
            return Ok(dropped);
        }
        for project in self.catalog.projects()? {
            let days = match policy(project) {
                Ok(Some(days)) => days,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(project, %error, "retention unknown; the project is kept as is");
                    continue;
                }
            };
            let before = first_kept_day(days, now);
            if let Some(drops) = self.claimed(&project_job(project), || {
                self.drop_days_before(project, before, days)
            })? {
                dropped.extend(drops);
            }
        }
        Ok(dropped)
    }

    /// Removes every segment version of `project` whose day is before `before`, one day at a
    /// time, recording each day once its files are gone.
    fn drop_days_before(
        &self,
        project: u64,
        before: NaiveDate,
        retention_days: u32,
    ) -> std::io::Result<Vec<DayDrop>> {
        let versions = self.catalog.versions(project)?;
        let current = newest_versions(versions.clone());
        let mut days: BTreeMap<NaiveDate, (u64, Vec<SegmentRef>)> = BTreeMap::new();
        for segment in versions.into_iter().filter(|s| s.day < before) {
            days.entry(segment.day).or_default().1.push(segment);
        }
        for segment in current.iter().filter(|s| s.day < before) {
            let rows = self.rows_of(segment)?;
            if let Some(day) = days.get_mut(&segment.day) {
                day.0 += rows;
            }
        }
        let mut drops = Vec::new();
        for (day, (rows, segments)) in days {
            let dropped = self.backups.deleting(|| -> std::io::Result<DayDrop> {
                for segment in &segments {
                    self.catalog.remove(segment)?;
                }
                let drop = DayDrop {
                    project,
                    day,
                    rows,
                    files: segments.len(),
                    retention_days,
                    dropped_at: Utc::now(),
                };
                self.catalog.record_drop(&drop)?;
                Ok(drop)
            });
            // A backup began: the rest waits for the pass after it.
            let Some(drop) = dropped else { break };
            let drop = drop?;
            tracing::info!(project, %day, rows, "retention dropped a day of events");
            drops.push(drop);
        }
        Ok(drops)
    }

    /// Events in a segment, from its footer.
    fn rows_of(&self, segment: &SegmentRef) -> std::io::Result<u64> {
        let file = self.files.open(segment).map_err(std::io::Error::other)?;
        let reader =
            ParquetRecordBatchReaderBuilder::try_new(file).map_err(std::io::Error::other)?;
        Ok(u64::try_from(reader.metadata().file_metadata().num_rows()).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{erasure_config, fixture, one_segment, persons};
    use super::super::CompactionConfig;
    use super::*;
    use crate::backups::Backups;
    use corvid_kernel::JobLease;
    use std::time::Duration;

    #[test]
    fn expired_days_wait_while_a_backup_runs() {
        let store = fixture(vec![]);
        let (written, _) = one_segment(store.catalog.as_ref(), 7);
        let file = store.root.join(written.key());
        let backups = Backups::default();
        let compactor = Compactor::new(
            Arc::clone(&store.catalog),
            Arc::clone(&store.files),
            Arc::clone(&store.columns),
            CompactionConfig {
                auto_keys: 0,
                min_share: 0.5,
                sample_rows: 1_000,
                grace: Duration::ZERO,
                erasure: erasure_config(),
            },
            JobLease::local(Duration::from_secs(60)),
            persons(&store.db),
            Vec::new(),
        )
        .holding_deletions_for(backups.clone());
        let policy: RetentionPolicy = Arc::new(|_| Ok(Some(30)));
        let backup = backups.pin();
        let held = compactor
            .apply_retention(&policy, Utc::now())
            .expect("the pass runs");
        assert!(held.is_empty(), "{held:?}");
        assert!(file.exists());
        drop(backup);
        let dropped = compactor
            .apply_retention(&policy, Utc::now())
            .expect("the pass runs");
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert_eq!(dropped[0].rows, 50);
        assert!(!file.exists());
    }

    #[test]
    fn a_project_keeps_today_and_the_days_before_it() {
        let now: DateTime<Utc> = "2026-03-10T15:00:00Z".parse().expect("time");
        let day = |d: &str| d.parse::<NaiveDate>().expect("day");
        assert_eq!(first_kept_day(1, now), day("2026-03-10"));
        assert_eq!(first_kept_day(30, now), day("2026-02-09"));
        assert_eq!(first_kept_day(0, now), day("2026-03-10"));
    }
}
