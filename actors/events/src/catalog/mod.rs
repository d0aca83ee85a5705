//! The segment catalog: which Parquet segments exist (and which version of each is current),
//! each shard's WAL checkpoint, and where a segment's file is. The one owner of segment names
//! ([`SegmentName`]: one parser, one formatter) and of their keys (`project=<id>/day=<date>/…`).
//!
//! A flush makes its segments durable and visible in two steps, so that a crash at any point
//! leaves every acknowledged event exactly once: [`SegmentCatalog::record_flush`] (durable:
//! after it, recovery treats the flush as done) runs before the shard's tail is cleared, and
//! [`SegmentCatalog::publish_flush`] (cheap) runs under the tail's write lock, so readers never
//! see a row both in the tail and in a segment. [`DirCatalog`] keeps everything in the local
//! events directory (the embedded default); [`PgCatalog`] keeps rows and checkpoints in
//! PostgreSQL and files in a bucket (a cluster). Both pass [`contract::suite`].

mod local;
mod pg;

use std::path::PathBuf;
use std::time::SystemTime;

use chrono::NaiveDate;

pub use local::{backup_files, DirCatalog};
pub use pg::PgCatalog;

use super::segment::{write_segment, SegmentError, StoredEvent};

/// `[n<node>-]s<shard>-<first seq>-<last seq>[.v<version>].parquet`: the node and shard whose
/// flush wrote it, the WAL range it covered, and the compaction version (0 for the file the
/// flush wrote). WAL sequences are per node, so in a cluster the node number (from the
/// metastore; 0, and left out of the name, for the embedded default) keeps names unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentName {
    pub node: u32,
    pub shard: usize,
    pub first: u64,
    pub last: u64,
    pub version: u32,
}

impl SegmentName {
    /// Parses a segment file name (sequence numbers with or without zero padding).
    pub fn parse(file_name: &str) -> Option<SegmentName> {
        let stem = file_name.strip_suffix(".parquet")?;
        let (base, version) = match stem.rsplit_once(".v") {
            Some((base, v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                (base, v.parse().ok()?)
            }
            _ => (stem, 0),
        };
        let (node, base) = match base.strip_prefix('n').and_then(|b| b.split_once('-')) {
            Some((node, rest)) => (node.parse().ok()?, rest),
            None => (0, base),
        };
        let mut parts = base.strip_prefix('s')?.split('-');
        let name = SegmentName {
            node,
            shard: parts.next()?.parse().ok()?,
            first: parts.next()?.parse().ok()?,
            last: parts.next()?.parse().ok()?,
            version,
        };
        parts.next().is_none().then_some(name)
    }

    /// The file name (sequence numbers zero-padded, so names sort by WAL position).
    pub fn file_name(&self) -> String {
        let node = match self.node {
            0 => String::new(),
            n => format!("n{n}-"),
        };
        let base = format!("{node}s{}-{:020}-{:020}", self.shard, self.first, self.last);
        match self.version {
            0 => format!("{base}.parquet"),
            v => format!("{base}.v{v}.parquet"),
        }
    }

    /// The same segment, one version later.
    pub fn next_version(&self) -> SegmentName {
        SegmentName {
            version: self.version + 1,
            ..*self
        }
    }

    /// Whether two names are versions of the same segment.
    pub fn same_segment(&self, other: &SegmentName) -> bool {
        (self.node, self.shard, self.first, self.last)
            == (other.node, other.shard, other.first, other.last)
    }
}

/// One segment file: a project's events of one day from one flush.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentRef {
    pub project: u64,
    pub day: NaiveDate,
    pub name: SegmentName,
}

impl SegmentRef {
    /// The segment's key, relative to the events root: `project=<id>/day=<date>/<file>`.
    pub fn key(&self) -> String {
        format!(
            "project={}/day={}/{}",
            self.project,
            self.day.format("%Y-%m-%d"),
            self.name.file_name()
        )
    }

    /// Parses a key made by [`SegmentRef::key`].
    pub fn parse_key(key: &str) -> Option<SegmentRef> {
        let mut parts = key.split('/');
        let project = parts.next()?.strip_prefix("project=")?.parse().ok()?;
        let day =
            NaiveDate::parse_from_str(parts.next()?.strip_prefix("day=")?, "%Y-%m-%d").ok()?;
        let name = SegmentName::parse(parts.next()?)?;
        parts
            .next()
            .is_none()
            .then_some(SegmentRef { project, day, name })
    }

    /// The same segment, one version later.
    pub fn next_version(&self) -> SegmentRef {
        SegmentRef {
            name: self.name.next_version(),
            ..self.clone()
        }
    }
}

/// Keeps the newest version of each segment.
pub fn newest_versions(mut segments: Vec<SegmentRef>) -> Vec<SegmentRef> {
    segments.sort();
    let mut out: Vec<SegmentRef> = Vec::with_capacity(segments.len());
    for s in segments {
        match out.last_mut() {
            Some(prev)
                if prev.project == s.project
                    && prev.day == s.day
                    && prev.name.same_segment(&s.name) =>
            {
                // Sorted: a later entry of the same segment has a higher version.
                *prev = s;
            }
            _ => out.push(s),
        }
    }
    out
}

/// The current version of each of `versions`' segments whose day is in `[from, to]` (open
/// ends allowed): what [`SegmentCatalog::segments`] answers from a catalog's versions.
pub fn current_within(
    mut versions: Vec<SegmentRef>,
    from: Option<NaiveDate>,
    to: Option<NaiveDate>,
) -> Vec<SegmentRef> {
    versions.retain(|s| from.is_none_or(|f| s.day >= f) && to.is_none_or(|t| s.day <= t));
    newest_versions(versions)
}

/// What one shard's flush makes visible: its segments, and the WAL position they cover.
#[derive(Debug, Clone, PartialEq)]
pub struct Flush {
    pub shard: usize,
    /// The last WAL sequence the shard had processed when it froze these rows.
    pub checkpoint: u64,
    pub segments: Vec<SegmentRef>,
}

/// Where segments are listed and checkpoints kept.
pub trait SegmentCatalog: Send + Sync {
    /// The number this node's flushes name their segments with ([`SegmentName::node`]); its
    /// checkpoints are the ones [`SegmentCatalog::checkpoints`] lists.
    fn node(&self) -> u32 {
        0
    }

    /// The current version of each committed segment of `project` whose day is in
    /// `[from, to]` (open ends allowed), in key order.
    fn segments(
        &self,
        project: u64,
        from: Option<NaiveDate>,
        to: Option<NaiveDate>,
    ) -> std::io::Result<Vec<SegmentRef>>;

    /// Every committed version of every segment of `project` (compaction's view).
    fn versions(&self, project: u64) -> std::io::Result<Vec<SegmentRef>>;

    /// Projects with at least one committed segment.
    fn projects(&self) -> std::io::Result<Vec<u64>>;

    /// Each shard's checkpoint: the last WAL sequence whose events are all in segments.
    fn checkpoints(&self) -> std::io::Result<Vec<(usize, u64)>>;

    /// Sets a shard's checkpoint without segments (start-up).
    fn set_checkpoint(&self, shard: usize, seq: u64) -> std::io::Result<()>;

    /// Forgets a shard (the server now runs fewer shards).
    fn remove_checkpoint(&self, shard: usize) -> std::io::Result<()>;

    /// Where a segment's file is written before its flush is recorded (a local path whose
    /// parent directory exists).
    fn staging_path(&self, segment: &SegmentRef) -> std::io::Result<PathBuf>;

    /// The disk staged files are written through (what [`SegmentCatalog::record_flush`]
    /// makes durable).
    fn disk(&self) -> &dyn corvid_kernel::disk::Disk {
        &corvid_kernel::disk::RealDisk
    }

    /// Records a flush durably: its staged files and its checkpoint. After it returns, a crash
    /// recovers the flush as done. Its segments are not listed before `publish_flush`.
    fn record_flush(&self, flush: &Flush) -> std::io::Result<()>;

    /// Lists a recorded flush's segments. Cheap: called under the shard tail's write lock.
    fn publish_flush(&self, flush: &Flush) -> std::io::Result<()>;

    /// Drops a staged flush that could not be recorded.
    fn abandon_flush(&self, flush: &Flush);

    /// Start-up: publishes flushes recorded before a crash and drops staged files of flushes
    /// that were not, and unfinished compactions.
    fn recover(&self) -> std::io::Result<()>;

    /// Where a compaction writes a new version before publishing it.
    fn version_staging_path(&self, segment: &SegmentRef) -> std::io::Result<PathBuf>;

    /// Lists a staged new version; the previous one stays listed in `versions` until removed.
    fn publish_version(&self, segment: &SegmentRef) -> std::io::Result<()>;

    /// When a segment version was published (superseded versions are removed only once their
    /// successor is older than any query can run).
    fn published_at(&self, segment: &SegmentRef) -> std::io::Result<Option<SystemTime>>;

    /// Removes a segment version and its file.
    fn remove(&self, segment: &SegmentRef) -> std::io::Result<()>;

    /// Records that retention removed a day of a project (after its segments went): kept for
    /// the activity list, and so readers know answers computed before it may hold that day.
    fn record_drop(&self, drop: &DayDrop) -> std::io::Result<()>;

    /// The drops recorded for `project`, oldest first.
    fn drops(&self, project: u64) -> std::io::Result<Vec<DayDrop>>;

    /// Deletes stored files no listed segment owns, left by a node that died between writing
    /// a file and recording it; returns how many. Nothing to do where recording and writing
    /// are one step (the local directory).
    fn sweep_orphans(&self) -> std::io::Result<usize> {
        Ok(0)
    }
}

/// A `(project, day)` partition retention removed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DayDrop {
    pub project: u64,
    pub day: NaiveDate,
    /// Events the day held.
    pub rows: u64,
    /// Segment files removed (every version).
    pub files: usize,
    /// The project's retention when it was dropped.
    pub retention_days: u32,
    pub dropped_at: chrono::DateTime<chrono::Utc>,
}

/// Writes `rows` as one committed segment, outside any running ingest (staged, recorded with
/// the segment's last sequence as its shard's checkpoint, published): for data sets built
/// directly, such as benchmarks and test fixtures.
pub fn write_committed(
    catalog: &dyn SegmentCatalog,
    segment: &SegmentRef,
    rows: &mut [&StoredEvent],
    materialized: &[String],
) -> Result<(), SegmentError> {
    let staged = catalog.staging_path(segment)?;
    write_segment(catalog.disk(), &staged, rows, materialized)?;
    let flush = Flush {
        shard: segment.name.shard,
        checkpoint: segment.name.last,
        segments: vec![segment.clone()],
    };
    catalog.record_flush(&flush)?;
    catalog.publish_flush(&flush)?;
    Ok(())
}

/// The behaviour every [`SegmentCatalog`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use super::*;
    use crate::files::SegmentFiles;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2024, 5, d).expect("date")
    }

    fn seg(project: u64, d: u32, shard: usize, first: u64, last: u64) -> SegmentRef {
        SegmentRef {
            project,
            day: day(d),
            name: SegmentName {
                node: 0,
                shard,
                first,
                last,
                version: 0,
            },
        }
    }

    fn stage(catalog: &dyn SegmentCatalog, s: &SegmentRef) {
        let path = catalog.staging_path(s).expect("staging path");
        std::fs::write(path, s.key()).expect("staged file");
    }

    fn read(files: &SegmentFiles, s: &SegmentRef) -> String {
        let bytes = files.read(s).expect("published segment readable");
        String::from_utf8(bytes.to_vec()).expect("text")
    }

    /// Runs every check against an empty catalog whose published segments `files` reads;
    /// `reopen` gives a catalog over the same storage, as after a restart.
    pub fn suite(
        catalog: &dyn SegmentCatalog,
        files: &SegmentFiles,
        reopen: &dyn Fn() -> Box<dyn SegmentCatalog>,
    ) {
        flushes_become_visible_only_when_published(catalog, files);
        days_filter_and_projects_are_listed(catalog);
        checkpoints_are_kept_per_shard(catalog);
        versions_replace_and_are_removed(catalog, files);
        recovery_keeps_recorded_flushes_only(catalog, reopen);
        drops_are_kept_per_project(catalog, reopen);
    }

    fn drops_are_kept_per_project(
        catalog: &dyn SegmentCatalog,
        reopen: &dyn Fn() -> Box<dyn SegmentCatalog>,
    ) {
        let drop = |project: u64, d: u32| DayDrop {
            project,
            day: day(d),
            rows: u64::from(d) * 10,
            files: 2,
            retention_days: 30,
            dropped_at: "2024-07-01T00:00:00Z".parse().expect("time"),
        };
        assert!(catalog.drops(41).expect("none yet").is_empty());
        for d in [drop(41, 1), drop(42, 1), drop(41, 2)] {
            catalog.record_drop(&d).expect("record");
        }
        assert_eq!(
            catalog.drops(41).expect("list"),
            vec![drop(41, 1), drop(41, 2)]
        );
        assert_eq!(reopen().drops(42).expect("durable"), vec![drop(42, 1)]);
    }

    fn flushes_become_visible_only_when_published(
        catalog: &dyn SegmentCatalog,
        files: &SegmentFiles,
    ) {
        let flush = Flush {
            shard: 0,
            checkpoint: 10,
            segments: vec![seg(1, 1, 0, 1, 10), seg(2, 1, 0, 1, 10)],
        };
        for s in &flush.segments {
            stage(catalog, s);
        }
        catalog.record_flush(&flush).expect("record");
        assert!(catalog.segments(1, None, None).expect("list").is_empty());
        catalog.publish_flush(&flush).expect("publish");
        assert_eq!(
            catalog.segments(1, None, None).expect("list"),
            vec![flush.segments[0].clone()]
        );
        assert_eq!(read(files, &flush.segments[1]), flush.segments[1].key());
        assert!(catalog
            .checkpoints()
            .expect("checkpoints")
            .contains(&(0, 10)));
    }

    fn days_filter_and_projects_are_listed(catalog: &dyn SegmentCatalog) {
        let flush = Flush {
            shard: 1,
            checkpoint: 20,
            segments: vec![seg(1, 2, 1, 11, 20), seg(1, 4, 1, 11, 20)],
        };
        for s in &flush.segments {
            stage(catalog, s);
        }
        catalog.record_flush(&flush).expect("record");
        catalog.publish_flush(&flush).expect("publish");
        let days = |from, to| -> Vec<NaiveDate> {
            catalog
                .segments(1, from, to)
                .expect("list")
                .into_iter()
                .map(|s| s.day)
                .collect()
        };
        assert_eq!(days(None, None), vec![day(1), day(2), day(4)]);
        assert_eq!(days(Some(day(2)), Some(day(3))), vec![day(2)]);
        assert_eq!(days(Some(day(3)), None), vec![day(4)]);
        let mut projects = catalog.projects().expect("projects");
        projects.sort();
        assert_eq!(projects, vec![1, 2]);
    }

    fn checkpoints_are_kept_per_shard(catalog: &dyn SegmentCatalog) {
        catalog.set_checkpoint(5, 42).expect("set");
        catalog.set_checkpoint(5, 43).expect("set again");
        assert!(catalog.checkpoints().expect("list").contains(&(5, 43)));
        catalog.remove_checkpoint(5).expect("remove");
        assert!(!catalog
            .checkpoints()
            .expect("list")
            .iter()
            .any(|(s, _)| *s == 5));
    }

    fn versions_replace_and_are_removed(catalog: &dyn SegmentCatalog, files: &SegmentFiles) {
        let original = seg(1, 1, 0, 1, 10);
        let next = original.next_version();
        std::fs::write(catalog.version_staging_path(&next).expect("path"), "v1")
            .expect("staged version");
        assert_eq!(
            catalog.versions(1).expect("versions").len(),
            3,
            "not yet published"
        );
        catalog.publish_version(&next).expect("publish version");
        assert!(catalog.published_at(&next).expect("time").is_some());
        let current = catalog
            .segments(1, Some(day(1)), Some(day(1)))
            .expect("list");
        assert_eq!(current, vec![next.clone()]);
        assert_eq!(catalog.versions(1).expect("versions").len(), 4);
        catalog.remove(&original).expect("remove");
        assert_eq!(catalog.versions(1).expect("versions").len(), 3);
        assert_eq!(read(files, &next), "v1");
        assert!(
            files.read(&original).is_err(),
            "a removed version's file is gone"
        );
    }

    fn recovery_keeps_recorded_flushes_only(
        catalog: &dyn SegmentCatalog,
        reopen: &dyn Fn() -> Box<dyn SegmentCatalog>,
    ) {
        // Recorded but not published when the process died: recovered.
        let recorded = Flush {
            shard: 0,
            checkpoint: 30,
            segments: vec![seg(3, 1, 0, 21, 30)],
        };
        stage(catalog, &recorded.segments[0]);
        catalog.record_flush(&recorded).expect("record");
        // Staged but never recorded: dropped.
        let lost = seg(3, 1, 1, 21, 40);
        stage(catalog, &lost);
        // A compaction that never finished: dropped.
        let half = seg(1, 2, 1, 11, 20).next_version();
        std::fs::write(catalog.version_staging_path(&half).expect("path"), "half").expect("file");

        let after = reopen();
        after.recover().expect("recover");
        assert_eq!(
            after.segments(3, None, None).expect("list"),
            recorded.segments
        );
        assert!(after.checkpoints().expect("checkpoints").contains(&(0, 30)));
        let day_two = after.segments(1, Some(day(2)), Some(day(2))).expect("list");
        assert_eq!(
            day_two,
            vec![seg(1, 2, 1, 11, 20)],
            "the half compaction is gone"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_format_as_one() {
        let name = SegmentName {
            node: 0,
            shard: 2,
            first: 7,
            last: 99,
            version: 0,
        };
        assert_eq!(
            name.file_name(),
            "s2-00000000000000000007-00000000000000000099.parquet"
        );
        assert_eq!(SegmentName::parse(&name.file_name()), Some(name));
        let v3 = SegmentName { version: 3, ..name };
        assert_eq!(SegmentName::parse(&v3.file_name()), Some(v3));
        let on_node = SegmentName { node: 12, ..v3 };
        assert_eq!(
            on_node.file_name(),
            "n12-s2-00000000000000000007-00000000000000000099.v3.parquet"
        );
        assert_eq!(SegmentName::parse(&on_node.file_name()), Some(on_node));
        assert!(!on_node.same_segment(&v3), "another node's WAL range");
        assert_eq!(
            SegmentName::parse("s0-1-2.parquet").map(|n| n.last),
            Some(2)
        );
        for bad in [
            "s0-1-2.parquet.tmp",
            "x0-1-2.parquet",
            "s0-1.parquet",
            "s0-1-2-3.parquet",
            "nx-s0-1-2.parquet",
            "n1s0-1-2.parquet",
        ] {
            assert_eq!(SegmentName::parse(bad), None, "{bad}");
        }
        let r = SegmentRef {
            project: 5,
            day: NaiveDate::from_ymd_opt(2024, 1, 2).expect("date"),
            name: v3,
        };
        assert_eq!(SegmentRef::parse_key(&r.key()), Some(r));
    }

    #[test]
    fn the_newest_version_of_each_segment_wins() {
        let day = NaiveDate::from_ymd_opt(2024, 1, 2).expect("date");
        let at = |shard, version| SegmentRef {
            project: 1,
            day,
            name: SegmentName {
                node: 0,
                shard,
                first: 1,
                last: 2,
                version,
            },
        };
        let newest = newest_versions(vec![at(0, 0), at(0, 2), at(0, 1), at(1, 0)]);
        assert_eq!(newest, vec![at(0, 2), at(1, 0)]);
    }
}
