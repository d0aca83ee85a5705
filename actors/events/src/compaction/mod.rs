//! The compactor: promotes a project's frequent property keys to columns
//! ([`super::columns`]) and keeps older segments in step (backfill).
//!
//! Segments are immutable and readers open them by key, so a rewrite never replaces a file in
//! place: it writes the same rows as the next version, `<stem>.v<N>.parquet`. Listings pick the
//! newest version of each stem; superseded versions are deleted once older than a grace period
//! longer than any query can run.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use chrono::Utc;
use serde::de::IgnoredAny;

use super::backups::Backups;
use super::catalog::{newest_versions, SegmentCatalog, SegmentRef};
use super::columns::PropertyColumns;
use super::files::SegmentFiles;
use super::read::Tail;
use super::segment::{self, materialized_column, read_segment, write_segment, StoredEvent};
use corvid_kernel::JobLease;
use corvid_persons::PersonStore;

mod erasure;
mod retention;

pub use erasure::{ErasureConfig, ErasureReport};
pub use retention::{first_kept_day, RetentionPolicy};

/// Settings of the property-column compactor.
#[derive(Debug, Clone)]
pub struct CompactionConfig {
    /// Most frequent keys promoted per project, besides the configured ones.
    pub auto_keys: usize,
    /// Share of sampled events a key must appear in to be promoted.
    pub min_share: f64,
    /// Rows sampled per project (from its newest segments).
    pub sample_rows: usize,
    /// Superseded segment versions are deleted once the newer version is this old.
    pub grace: Duration,
    /// How erasure requests are carried out.
    pub erasure: ErasureConfig,
}

/// What one compaction pass did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CompactionReport {
    pub promoted: Vec<(u64, Vec<String>)>,
    pub rewritten: usize,
    pub deleted: usize,
    /// Stored files no segment owned (uploads whose commit never came), deleted.
    pub swept: usize,
    /// Projects whose compaction failed this pass, with the error; each is retried after a
    /// growing wait while the others go on.
    pub failed: Vec<(u64, String)>,
}

/// A project whose compaction fails waits this long before the next try, doubled for each
/// further failure in a row up to [`MAX_RETRY_WAIT`].
const FIRST_RETRY_WAIT: Duration = Duration::from_secs(60);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(6 * 3600);

/// The job name under which one node at a time compacts `project`.
fn project_job(project: u64) -> String {
    format!("compaction/project/{project}")
}

/// The job name under which one node at a time sweeps orphaned segment files.
const SWEEP_JOB: &str = "compaction/sweep";

pub struct Compactor {
    catalog: Arc<dyn SegmentCatalog>,
    files: Arc<SegmentFiles>,
    columns: Arc<PropertyColumns>,
    config: CompactionConfig,
    /// Of all nodes sharing the catalog, one compacts a project at a time; a node that dies
    /// mid-pass loses the project when its lease runs out.
    lease: JobLease,
    /// Projects whose last compaction failed, and until when they wait.
    backoff: std::sync::Mutex<corvid_kernel::Backoff<u64>>,
    /// Erasure requests, and where they are recorded as done.
    persons: Arc<PersonStore>,
    /// This node's shard tails: an erasure is verified only once none of them holds a row
    /// it covers.
    tails: Vec<Arc<Tail>>,
    /// Each project's retention, and how often it is enforced (none: keep everything).
    retention: Option<(RetentionPolicy, Duration)>,
    /// This node's running backups: while one runs, no superseded version or expired day is
    /// deleted (a backup skips a file gone between its listing and its copy).
    backups: Backups,
}

impl Compactor {
    pub fn new(
        catalog: Arc<dyn SegmentCatalog>,
        files: Arc<SegmentFiles>,
        columns: Arc<PropertyColumns>,
        config: CompactionConfig,
        lease: JobLease,
        persons: Arc<PersonStore>,
        tails: Vec<Arc<Tail>>,
    ) -> Compactor {
        Compactor {
            catalog,
            files,
            columns,
            config,
            lease,
            backoff: std::sync::Mutex::new(corvid_kernel::Backoff::new(
                FIRST_RETRY_WAIT,
                MAX_RETRY_WAIT,
            )),
            persons,
            tails,
            retention: None,
            backups: Backups::default(),
        }
    }

    /// Holds every deletion while one of `backups` runs.
    pub fn holding_deletions_for(mut self, backups: Backups) -> Compactor {
        self.backups = backups;
        self
    }

    /// Enforces `policy` every `interval` besides compacting.
    pub fn with_retention(mut self, policy: RetentionPolicy, interval: Duration) -> Compactor {
        self.retention = Some((policy, interval));
        self
    }

    /// Runs `job` if this node can claim it (and gives the claim back after); `None` when
    /// another node holds it.
    fn claimed<T>(
        &self,
        job: &str,
        work: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<Option<T>> {
        let JobLease {
            claims,
            holder,
            lease,
        } = &self.lease;
        if !claims
            .claim(job, holder, Utc::now(), *lease)
            .map_err(std::io::Error::other)?
        {
            return Ok(None);
        }
        let result = work();
        if let Err(err) = claims.release(job, holder) {
            tracing::warn!(error = %err, job, "could not release a compaction claim; it expires");
        }
        result.map(Some)
    }

    /// Runs a compaction pass every `interval`, an erasure pass every erasure interval and a
    /// retention pass every retention interval on the `corvid-compact` thread until `stop` is
    /// set. One thread does both, so they never
    /// rewrite one segment at once (across nodes, the project's lease keeps them apart).
    pub fn spawn(
        self,
        interval: Duration,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("corvid-compact".into())
            .spawn(move || {
                corvid_kernel::sched::join_batch();
                let step = Duration::from_millis(200);
                let mut waited = Duration::ZERO;
                let mut erasure_waited = Duration::ZERO;
                let mut retention_waited = Duration::ZERO;
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(step);
                    waited += step;
                    erasure_waited += step;
                    retention_waited += step;
                    if let Some((policy, every)) = &self.retention {
                        // While a backup runs the pass waits, and runs once it ends.
                        if retention_waited >= *every && !self.backups.running() {
                            retention_waited = Duration::ZERO;
                            if let Err(err) =
                                corvid_kernel::contain(|| self.apply_retention(policy, Utc::now()))
                            {
                                tracing::warn!(error = %err, "retention pass failed");
                            }
                        }
                    }
                    if erasure_waited >= self.config.erasure.interval {
                        erasure_waited = Duration::ZERO;
                        match corvid_kernel::contain(|| self.erase_once(Utc::now())) {
                            Ok(report) if report != ErasureReport::default() => {
                                tracing::info!(?report, "erasure pass")
                            }
                            Ok(_) => {}
                            Err(err) => tracing::warn!(error = %err, "erasure pass failed"),
                        }
                    }
                    if waited < interval {
                        continue;
                    }
                    waited = Duration::ZERO;
                    match corvid_kernel::contain(|| self.run_once()) {
                        Ok(report) if report != CompactionReport::default() => {
                            tracing::info!(?report, "property-column compaction")
                        }
                        Ok(_) => {}
                        Err(err) => {
                            tracing::warn!(error = %err, "property-column compaction failed")
                        }
                    }
                }
            })
    }

    /// One pass over every project this node can claim (see [`Compactor::compact_project`]),
    /// then a sweep of orphaned segment files.
    pub fn run_once(&self) -> std::io::Result<CompactionReport> {
        let mut report = CompactionReport::default();
        for project in self.catalog.projects()? {
            let now = std::time::Instant::now();
            if !self.backoff().ready(&project, now) {
                continue;
            }
            let outcome = corvid_kernel::contain(|| {
                self.claimed(&project_job(project), || {
                    self.compact_project(project, &mut report)
                })
            });
            match outcome {
                Ok(_) => self.backoff().succeeded(&project),
                Err(error) => {
                    let wait = self.backoff().failed(project, now);
                    tracing::warn!(project, %error, ?wait, "compaction of a project failed; the others go on");
                    report.failed.push((project, error));
                }
            }
        }
        if let Some(swept) = self.claimed(SWEEP_JOB, || self.catalog.sweep_orphans())? {
            report.swept = swept;
        }
        Ok(report)
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, corvid_kernel::Backoff<u64>> {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Promotes `project`'s frequent keys, backfills its segments lacking a column, and
    /// deletes its superseded versions past the grace period.
    fn compact_project(&self, project: u64, report: &mut CompactionReport) -> std::io::Result<()> {
        let files = self.catalog.segments(project, None, None)?;
        let frequent = self.frequent_keys(&files)?;
        if !frequent.is_empty()
            && self
                .columns
                .promote(project, &frequent, self.config.auto_keys)
                .map_err(std::io::Error::other)?
        {
            report
                .promoted
                .push((project, self.columns.keys_for(project)));
        }
        let keys = self.columns.keys_for(project);
        for file in &files {
            if self.backfill(file, &keys)? {
                report.rewritten += 1;
            }
        }
        report.deleted += self.delete_superseded(project, self.config.grace)?.0;
        Ok(())
    }

    /// Keys in at least `min_share` of the rows sampled from the newest segments, most
    /// frequent first.
    fn frequent_keys(&self, files: &[SegmentRef]) -> std::io::Result<Vec<String>> {
        if self.config.auto_keys == 0 {
            return Ok(Vec::new());
        }
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut rows = 0usize;
        for file in files.iter().rev() {
            if rows >= self.config.sample_rows {
                break;
            }
            // Segments are sorted by event: sample evenly across the file, not its first rows.
            let events = self.read(file)?;
            let step = events.len().div_ceil(self.config.sample_rows - rows).max(1);
            for e in events.iter().step_by(step) {
                if rows >= self.config.sample_rows {
                    break;
                }
                rows += 1;
                if let Ok(map) =
                    serde_json::from_str::<HashMap<Cow<'_, str>, IgnoredAny>>(&e.properties)
                {
                    for key in map.into_keys() {
                        *counts.entry(key.into_owned()).or_default() += 1;
                    }
                }
            }
        }
        let threshold = (rows as f64 * self.config.min_share).ceil().max(1.0) as usize;
        let mut frequent: Vec<(String, usize)> = counts
            .into_iter()
            .filter(|(_, c)| *c >= threshold)
            .collect();
        frequent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(frequent.into_iter().map(|(k, _)| k).collect())
    }

    fn read(&self, segment: &SegmentRef) -> std::io::Result<Vec<StoredEvent>> {
        let bytes = self.files.read(segment).map_err(std::io::Error::other)?;
        read_segment(bytes, &segment.key()).map_err(std::io::Error::other)
    }

    /// Rewrites `segment` as its next version when it lacks a column of `keys`.
    fn backfill(&self, segment: &SegmentRef, keys: &[String]) -> std::io::Result<bool> {
        let bytes = self.files.read(segment).map_err(std::io::Error::other)?;
        let columns = segment::column_names(bytes.clone()).map_err(std::io::Error::other)?;
        if keys
            .iter()
            .all(|k| columns.contains(&materialized_column(k)))
        {
            return Ok(false);
        }
        let next = segment.next_version();
        let staged = self.catalog.version_staging_path(&next)?;
        let rows: Vec<StoredEvent> =
            read_segment(bytes, &segment.key()).map_err(std::io::Error::other)?;
        let mut refs: Vec<&StoredEvent> = rows.iter().collect();
        write_segment(self.catalog.disk(), &staged, &mut refs, keys)
            .map_err(std::io::Error::other)?;
        self.catalog.publish_version(&next)?;
        Ok(true)
    }

    /// Deletes versions older than the current one of their segment, once that one is older
    /// than `grace` (no query can still be reading the old file) and no backup runs. Returns
    /// how many went and how many superseded versions are left.
    fn delete_superseded(&self, project: u64, grace: Duration) -> std::io::Result<(usize, usize)> {
        let all = self.catalog.versions(project)?;
        let current = newest_versions(all.clone());
        let mut deleted = 0;
        let mut left = 0;
        for old in all.iter().filter(|s| !current.contains(s)) {
            let successor = current
                .iter()
                .find(|c| c.day == old.day && c.name.same_segment(&old.name));
            let old_enough = match successor {
                Some(s) => self
                    .catalog
                    .published_at(s)?
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .is_some_and(|age| age >= grace),
                None => false,
            };
            let removed = if old_enough {
                self.backups.deleting(|| self.catalog.remove(old))
            } else {
                None
            };
            match removed {
                Some(removed) => {
                    removed?;
                    deleted += 1;
                }
                None => left += 1,
            }
        }
        Ok((deleted, left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{DirCatalog, Flush, SegmentName};
    use chrono::TimeZone;
    use corvid_kernel::{JobClaims, LocalClaims};
    use uuid::Uuid;

    fn event(i: usize) -> StoredEvent {
        let ts = Utc
            .with_ymd_and_hms(2024, 1, 1, 0, 0, 0)
            .single()
            .expect("test setup")
            + chrono::Duration::seconds(i as i64);
        let props = if i % 10 == 0 {
            serde_json::json!({"plan": "pro", "rare": i})
        } else {
            serde_json::json!({"plan": "free"})
        };
        StoredEvent {
            uuid: Uuid::now_v7(),
            event: "e".into(),
            distinct_id: format!("u{i}"),
            person_id: Uuid::nil(),
            properties: props.to_string(),
            person_properties: "{}".into(),
            timestamp: ts,
            created_at: ts,
            project_id: 7,
            groups: [None, None, None, None, None],
            session_id: None,
            window_id: None,
        }
    }

    /// Fifty events of `project` committed as one segment.
    pub(super) fn one_segment(
        catalog: &dyn SegmentCatalog,
        project: u64,
    ) -> (SegmentRef, Vec<StoredEvent>) {
        let rows: Vec<StoredEvent> = (0..50).map(event).collect();
        let mut refs: Vec<&StoredEvent> = rows.iter().collect();
        let written = SegmentRef {
            project,
            day: rows[0].day(),
            name: SegmentName {
                node: 0,
                shard: 0,
                first: 1,
                last: 50,
                version: 0,
            },
        };
        let flush = Flush {
            shard: 0,
            checkpoint: 50,
            segments: vec![written.clone()],
        };
        write_segment(
            &corvid_kernel::disk::RealDisk,
            &catalog.staging_path(&written).expect("test setup"),
            &mut refs,
            &[],
        )
        .expect("test setup");
        catalog.record_flush(&flush).expect("test setup");
        catalog.publish_flush(&flush).expect("test setup");
        (written, rows)
    }

    /// A temporary event store: property columns with `pinned` keys, the catalog and the
    /// segment files under `root`.
    pub(super) struct Fixture {
        pub(super) _dir: tempfile::TempDir,
        pub(super) root: std::path::PathBuf,
        pub(super) db: sled::Db,
        pub(super) columns: Arc<PropertyColumns>,
        pub(super) catalog: Arc<dyn SegmentCatalog>,
        pub(super) files: Arc<SegmentFiles>,
    }

    pub(super) fn erasure_config() -> ErasureConfig {
        ErasureConfig {
            interval: Duration::from_secs(10),
            settle: Duration::ZERO,
            grace: Duration::ZERO,
            // Longer than the test events have existed.
            record_ttl: Duration::from_secs(100 * 365 * 86_400),
        }
    }

    pub(super) fn persons(db: &sled::Db) -> Arc<PersonStore> {
        Arc::new(
            PersonStore::open(db, corvid_persons::PersonFiles::temporary()).expect("test setup"),
        )
    }

    pub(super) fn fixture(pinned: Vec<String>) -> Fixture {
        let dir = tempfile::tempdir().expect("test setup");
        let root = dir.path().join("events");
        let db = sled::Config::new()
            .temporary(true)
            .open()
            .expect("test setup");
        let columns = Arc::new(PropertyColumns::open(&db, pinned).expect("test setup"));
        let catalog: Arc<dyn SegmentCatalog> =
            Arc::new(DirCatalog::open(root.clone()).expect("test setup"));
        let files = Arc::new(SegmentFiles::local(&root).expect("test setup"));
        Fixture {
            _dir: dir,
            root,
            db,
            columns,
            catalog,
            files,
        }
    }

    #[test]
    fn a_project_that_fails_waits_while_the_others_are_compacted() {
        let Fixture {
            _dir,
            root,
            db,
            columns,
            catalog,
            files,
        } = fixture(vec![]);
        one_segment(catalog.as_ref(), 7);
        // Project 3's only segment is not Parquet at all.
        let (broken, _) = one_segment(catalog.as_ref(), 3);
        std::fs::write(root.join(broken.key()), b"not parquet").expect("test setup");
        let compactor = Compactor::new(
            Arc::clone(&catalog),
            files,
            Arc::clone(&columns),
            CompactionConfig {
                auto_keys: 5,
                min_share: 0.5,
                sample_rows: 1_000,
                grace: Duration::from_secs(3600),
                erasure: erasure_config(),
            },
            JobLease::local(Duration::from_secs(60)),
            persons(&db),
            Vec::new(),
        );
        let report = compactor.run_once().expect("the pass goes on");
        assert_eq!(
            report.failed.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            vec![3]
        );
        assert_eq!(report.promoted, vec![(7, vec!["plan".to_string()])]);
        // The failed project waits: the next pass does not try it again at once.
        let again = compactor.run_once().expect("the pass goes on");
        assert!(again.failed.is_empty(), "{again:?}");
    }

    #[test]
    fn promotes_frequent_keys_and_backfills_old_segments() {
        let Fixture {
            _dir,
            root,
            db,
            columns,
            catalog,
            files,
        } = fixture(vec!["$browser".into()]);
        let (written, rows) = one_segment(catalog.as_ref(), 7);
        let original = root.join(written.key());

        let config = CompactionConfig {
            auto_keys: 5,
            min_share: 0.5,
            sample_rows: 1_000,
            grace: Duration::from_secs(3600),
            erasure: erasure_config(),
        };
        // While another node holds the project, this one leaves it alone.
        let claims: Arc<dyn JobClaims> = Arc::new(LocalClaims::default());
        let lease = |holder: &str| JobLease {
            claims: Arc::clone(&claims),
            holder: holder.into(),
            lease: Duration::from_secs(60),
        };
        assert!(claims
            .claim(
                &project_job(7),
                "other",
                Utc::now(),
                Duration::from_secs(60)
            )
            .expect("claim"));
        let compactor = Compactor::new(
            Arc::clone(&catalog),
            Arc::clone(&files),
            Arc::clone(&columns),
            config.clone(),
            lease("this"),
            persons(&db),
            Vec::new(),
        );
        assert_eq!(
            compactor.run_once().expect("test setup"),
            CompactionReport::default()
        );
        // A node that died holding it loses it when its lease runs out.
        assert!(claims
            .claim(
                &project_job(7),
                "other",
                Utc::now() - chrono::Duration::seconds(120),
                Duration::from_secs(60),
            )
            .expect("renew in the past"));
        let report = compactor.run_once().expect("test setup");
        // `plan` is in every event, `rare` in a tenth: only `plan` is promoted.
        assert_eq!(
            report.promoted,
            vec![(7, vec!["$browser".to_string(), "plan".to_string()])]
        );
        assert_eq!((report.rewritten, report.deleted), (1, 0));
        let current = catalog.segments(7, None, None).expect("test setup");
        assert_eq!(current, vec![written.next_version()]);
        let bytes = files.read(&current[0]).expect("test setup");
        let names = segment::column_names(bytes.clone()).expect("test setup");
        assert!(names.contains("properties.plan") && names.contains("properties.$browser"));
        let mut before: Vec<Uuid> = rows.iter().map(|e| e.uuid).collect();
        let mut after: Vec<Uuid> = read_segment(bytes, "test")
            .expect("test setup")
            .iter()
            .map(|e| e.uuid)
            .collect();
        before.sort();
        after.sort();
        assert_eq!(before, after);
        // The old version stays during the grace period, then goes; nothing else changes.
        assert!(original.exists());
        let backups = Backups::default();
        let later = Compactor::new(
            Arc::clone(&catalog),
            files,
            Arc::clone(&columns),
            CompactionConfig {
                grace: Duration::ZERO,
                ..config
            },
            lease("this"),
            persons(&db),
            Vec::new(),
        )
        .holding_deletions_for(backups.clone());
        // While a backup runs (it may have listed the old version), nothing is deleted.
        let backup = backups.pin();
        let held = later.run_once().expect("test setup");
        assert_eq!(held, CompactionReport::default());
        assert!(original.exists());
        drop(backup);
        let report = later.run_once().expect("test setup");
        assert_eq!(
            report,
            CompactionReport {
                deleted: 1,
                ..Default::default()
            }
        );
        assert!(!original.exists());
        // Promotions are durable.
        drop(columns);
        let reopened = PropertyColumns::open(&db, vec!["$browser".into()]).expect("test setup");
        assert_eq!(
            reopened.keys_for(7),
            vec!["$browser".to_string(), "plan".to_string()]
        );
        assert_eq!(reopened.keys_for(8), vec!["$browser".to_string()]);
    }
}
