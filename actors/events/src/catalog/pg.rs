//! The cluster's segment catalog: segment rows and WAL checkpoints in PostgreSQL, segment files
//! in the bucket ([`SegmentFiles`]).
//!
//! A flush uploads its staged files first, then commits their rows **and** the shard's
//! checkpoint in one transaction. A crash before the commit leaves objects no row names (an
//! orphan, deleted by [`SegmentCatalog::sweep_orphans`] once old enough that no upload can still
//! be on its way to a commit); it never leaves a row without its object, nor a checkpoint
//! that covers events in no segment. Every node lists every node's segments; a node's own
//! recorded flush stays hidden from its own listings until published, because until then its
//! rows are still in the shard's in-memory tail.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use chrono::{NaiveDate, Utc};
use tokio_postgres::Row;

use super::{current_within, DayDrop, Flush, SegmentCatalog, SegmentName, SegmentRef};
use crate::files::SegmentFiles;
use corvid_kernel::pg::{bigint, Pg};
use corvid_kernel::StoreError;

const STAGED: &str = ".tmp";
const COMPACTING: &str = ".compacting";

/// Segment rows and checkpoints in PostgreSQL, files in a bucket.
pub struct PgCatalog {
    pg: Arc<Pg>,
    files: Arc<SegmentFiles>,
    node: u32,
    /// Local directory where files are written before upload.
    staging: PathBuf,
    /// An unlisted object younger than this may be an upload whose commit is still coming.
    orphan_age: Duration,
    /// This node's recorded flushes not yet published (their rows are still in the tails).
    unpublished: Mutex<HashSet<SegmentRef>>,
}

fn io(err: StoreError) -> std::io::Error {
    std::io::Error::other(err)
}

/// The key columns of a segment row, in the order every statement here binds them.
fn key_params(s: &SegmentRef) -> (i64, NaiveDate, i32, i32, i64, i64, i32) {
    (
        bigint(s.project),
        s.day,
        s.name.node as i32,
        s.name.shard as i32,
        bigint(s.name.first),
        bigint(s.name.last),
        s.name.version as i32,
    )
}

fn segment_of(row: &Row) -> Result<SegmentRef, StoreError> {
    let number = |i: usize| -> Result<i64, StoreError> { Ok(row.try_get(i)?) };
    let small = |i: usize| -> Result<i32, StoreError> { Ok(row.try_get(i)?) };
    Ok(SegmentRef {
        project: number(0)? as u64,
        day: row.try_get(1)?,
        name: SegmentName {
            node: small(2)? as u32,
            shard: small(3)? as usize,
            first: number(4)? as u64,
            last: number(5)? as u64,
            version: small(6)? as u32,
        },
    })
}

const COLUMNS: &str = "project, day, node, shard, first_seq, last_seq, version";

impl PgCatalog {
    /// The catalog for the node named `node_id` (numbered on first use), staging files under
    /// `staging`. `pg`'s schema must be migrated.
    pub fn open(
        pg: Arc<Pg>,
        files: Arc<SegmentFiles>,
        node_id: &str,
        staging: PathBuf,
        orphan_age: Duration,
    ) -> std::io::Result<PgCatalog> {
        fs::create_dir_all(&staging)?;
        let name = node_id.to_string();
        let number: i32 = pg
            .run(move |client| async move {
                let row = client
                    .query_one(
                        "INSERT INTO nodes (node_id) VALUES ($1)
                     ON CONFLICT (node_id) DO UPDATE SET node_id = EXCLUDED.node_id
                     RETURNING number",
                        &[&name],
                    )
                    .await?;
                Ok(row.try_get(0)?)
            })
            .map_err(io)?;
        Ok(PgCatalog {
            pg,
            files,
            node: u32::try_from(number).unwrap_or(0),
            staging,
            orphan_age,
            unpublished: Mutex::new(HashSet::new()),
        })
    }

    fn unpublished(&self) -> MutexGuard<'_, HashSet<SegmentRef>> {
        // Every operation leaves the set whole: a panic elsewhere cannot corrupt it.
        self.unpublished.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn staged(&self, segment: &SegmentRef, suffix: &str) -> std::io::Result<PathBuf> {
        let mut path = self.staging.join(segment.key()).into_os_string();
        path.push(suffix);
        let path = PathBuf::from(path);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        Ok(path)
    }

    fn rows(&self, sql: &'static str, project: Option<u64>) -> std::io::Result<Vec<SegmentRef>> {
        let project = project.map(bigint);
        self.pg
            .run(move |client| async move {
                let rows = match project {
                    Some(p) => client.query(sql, &[&p]).await?,
                    None => client.query(sql, &[]).await?,
                };
                rows.iter().map(segment_of).collect()
            })
            .map_err(io)
    }

    fn upsert_checkpoint(&self, shard: usize, seq: u64) -> std::io::Result<()> {
        let (node, shard, seq) = (self.node as i32, shard as i32, bigint(seq));
        self.pg
            .run(move |client| async move {
                client
                    .execute(
                        "INSERT INTO wal_checkpoints (node, shard, seq) VALUES ($1, $2, $3)
                         ON CONFLICT (node, shard) DO UPDATE SET seq = $3",
                        &[&node, &shard, &seq],
                    )
                    .await?;
                Ok(())
            })
            .map_err(io)
    }

    fn remove_staging(&self) -> std::io::Result<()> {
        match fs::remove_dir_all(&self.staging) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        fs::create_dir_all(&self.staging)
    }
}

fn remove_file(path: &Path) {
    let _ = fs::remove_file(path);
}

impl SegmentCatalog for PgCatalog {
    fn node(&self) -> u32 {
        self.node
    }

    fn segments(
        &self,
        project: u64,
        from: Option<NaiveDate>,
        to: Option<NaiveDate>,
    ) -> std::io::Result<Vec<SegmentRef>> {
        let mut all = self.versions(project)?;
        let hidden = self.unpublished();
        all.retain(|s| !hidden.contains(s));
        Ok(current_within(all, from, to))
    }

    fn versions(&self, project: u64) -> std::io::Result<Vec<SegmentRef>> {
        let mut out = self.rows(
            "SELECT project, day, node, shard, first_seq, last_seq, version
             FROM segments WHERE project = $1",
            Some(project),
        )?;
        out.sort();
        Ok(out)
    }

    fn projects(&self) -> std::io::Result<Vec<u64>> {
        self.pg
            .run(|client| async move {
                let rows = client
                    .query("SELECT DISTINCT project FROM segments ORDER BY 1", &[])
                    .await?;
                rows.iter()
                    .map(|r| Ok(r.try_get::<_, i64>(0)? as u64))
                    .collect()
            })
            .map_err(io)
    }

    fn checkpoints(&self) -> std::io::Result<Vec<(usize, u64)>> {
        let node = self.node as i32;
        self.pg
            .run(move |client| async move {
                let rows = client
                    .query(
                        "SELECT shard, seq FROM wal_checkpoints WHERE node = $1 ORDER BY shard",
                        &[&node],
                    )
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok((
                            r.try_get::<_, i32>(0)? as usize,
                            r.try_get::<_, i64>(1)? as u64,
                        ))
                    })
                    .collect()
            })
            .map_err(io)
    }

    fn set_checkpoint(&self, shard: usize, seq: u64) -> std::io::Result<()> {
        self.upsert_checkpoint(shard, seq)
    }

    fn remove_checkpoint(&self, shard: usize) -> std::io::Result<()> {
        let (node, shard) = (self.node as i32, shard as i32);
        self.pg
            .run(move |client| async move {
                client
                    .execute(
                        "DELETE FROM wal_checkpoints WHERE node = $1 AND shard = $2",
                        &[&node, &shard],
                    )
                    .await?;
                Ok(())
            })
            .map_err(io)
    }

    fn staging_path(&self, segment: &SegmentRef) -> std::io::Result<PathBuf> {
        self.staged(segment, STAGED)
    }

    fn record_flush(&self, flush: &Flush) -> std::io::Result<()> {
        for segment in &flush.segments {
            self.files.upload(segment, &self.staged(segment, STAGED)?)?;
        }
        self.unpublished().extend(flush.segments.iter().cloned());
        let keys: Vec<_> = flush.segments.iter().map(key_params).collect();
        let (node, shard, seq) = (
            self.node as i32,
            flush.shard as i32,
            bigint(flush.checkpoint),
        );
        self.pg
            .run(move |mut client| async move {
                let tx = client.transaction().await?;
                for (project, day, node, shard, first, last, version) in &keys {
                    // A retried flush may find its rows there already.
                    tx.execute(
                        &format!(
                            "INSERT INTO segments ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)
                             ON CONFLICT DO NOTHING"
                        ),
                        &[project, day, node, shard, first, last, version],
                    )
                    .await?;
                }
                tx.execute(
                    "INSERT INTO wal_checkpoints (node, shard, seq) VALUES ($1, $2, $3)
                     ON CONFLICT (node, shard) DO UPDATE SET seq = $3",
                    &[&node, &shard, &seq],
                )
                .await?;
                tx.commit().await?;
                Ok(())
            })
            .map_err(io)?;
        for segment in &flush.segments {
            remove_file(&self.staged(segment, STAGED)?);
        }
        Ok(())
    }

    fn publish_flush(&self, flush: &Flush) -> std::io::Result<()> {
        let mut hidden = self.unpublished();
        for segment in &flush.segments {
            hidden.remove(segment);
        }
        Ok(())
    }

    fn abandon_flush(&self, flush: &Flush) {
        let mut hidden = self.unpublished();
        for segment in &flush.segments {
            hidden.remove(segment);
            if let Ok(path) = self.staged(segment, STAGED) {
                remove_file(&path);
            }
        }
        // An uploaded object whose rows were not committed is an orphan for the sweep.
    }

    fn recover(&self) -> std::io::Result<()> {
        // Recorded flushes are committed rows already; anything staged was never recorded,
        // or is a compaction the crash interrupted.
        self.unpublished().clear();
        self.remove_staging()
    }

    fn version_staging_path(&self, segment: &SegmentRef) -> std::io::Result<PathBuf> {
        self.staged(segment, COMPACTING)
    }

    fn publish_version(&self, segment: &SegmentRef) -> std::io::Result<()> {
        let staged = self.staged(segment, COMPACTING)?;
        self.files.upload(segment, &staged)?;
        let (project, day, node, shard, first, last, version) = key_params(segment);
        self.pg
            .run(move |client| async move {
                client
                    .execute(
                        &format!(
                            "INSERT INTO segments ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)
                             ON CONFLICT DO NOTHING"
                        ),
                        &[&project, &day, &node, &shard, &first, &last, &version],
                    )
                    .await?;
                Ok(())
            })
            .map_err(io)?;
        remove_file(&staged);
        Ok(())
    }

    fn published_at(&self, segment: &SegmentRef) -> std::io::Result<Option<SystemTime>> {
        let (project, day, node, shard, first, last, version) = key_params(segment);
        self.pg
            .run(move |client| async move {
                let row = client
                    .query_opt(
                        "SELECT published_at FROM segments WHERE project = $1 AND day = $2
                         AND node = $3 AND shard = $4 AND first_seq = $5 AND last_seq = $6
                         AND version = $7",
                        &[&project, &day, &node, &shard, &first, &last, &version],
                    )
                    .await?;
                Ok(match row {
                    Some(row) => Some(SystemTime::from(
                        row.try_get::<_, chrono::DateTime<Utc>>(0)?,
                    )),
                    None => None,
                })
            })
            .map_err(io)
    }

    fn remove(&self, segment: &SegmentRef) -> std::io::Result<()> {
        let (project, day, node, shard, first, last, version) = key_params(segment);
        self.pg
            .run(move |client| async move {
                client
                    .execute(
                        "DELETE FROM segments WHERE project = $1 AND day = $2 AND node = $3
                         AND shard = $4 AND first_seq = $5 AND last_seq = $6 AND version = $7",
                        &[&project, &day, &node, &shard, &first, &last, &version],
                    )
                    .await?;
                Ok(())
            })
            .map_err(io)?;
        // Row first: a crash now leaves an orphan object, never a row without its file.
        self.files.delete(segment)
    }

    fn record_drop(&self, drop: &DayDrop) -> std::io::Result<()> {
        let (project, day, at) = (bigint(drop.project), drop.day, drop.dropped_at);
        let record = corvid_kernel::pg::record_json("retention drop", drop).map_err(io)?;
        self.pg
            .run(move |client| async move {
                client
                    .execute(
                        "INSERT INTO retention_drops (project, day, dropped_at, record)
                         VALUES ($1, $2, $3, $4)",
                        &[&project, &day, &at, &record],
                    )
                    .await?;
                Ok(())
            })
            .map_err(io)
    }

    fn drops(&self, project: u64) -> std::io::Result<Vec<DayDrop>> {
        let p = bigint(project);
        self.pg
            .run(move |client| async move {
                let rows = client
                    .query(
                        "SELECT record FROM retention_drops WHERE project = $1
                         ORDER BY dropped_at, day",
                        &[&p],
                    )
                    .await?;
                rows.iter()
                    .map(|r| corvid_kernel::pg::record_of(r, "retention_drops", project))
                    .collect()
            })
            .map_err(io)
    }

    fn sweep_orphans(&self) -> std::io::Result<usize> {
        // Objects first, rows second: an object whose commit lands in between is kept.
        let objects = self.files.list()?;
        let listed: HashSet<SegmentRef> = self
            .rows(
                "SELECT project, day, node, shard, first_seq, last_seq, version FROM segments",
                None,
            )?
            .into_iter()
            .collect();
        let now = Utc::now();
        let mut deleted = 0;
        for (segment, written) in objects {
            let age = (now - written).to_std().unwrap_or_default();
            if !listed.contains(&segment) && age >= self.orphan_age {
                self.files.delete(&segment)?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::pg::migrations::migrate;
    use corvid_kernel::pg::testing::TestPostgres;

    fn segment(node: u32, last: u64) -> SegmentRef {
        SegmentRef {
            project: 9,
            day: NaiveDate::from_ymd_opt(2024, 6, 1).expect("date"),
            name: SegmentName {
                node,
                shard: 0,
                first: 1,
                last,
                version: 0,
            },
        }
    }

    #[test]
    fn the_postgres_catalog_passes_the_contract_and_sweeps_orphans() {
        let server = TestPostgres::start();
        let db = server.database();
        let pg = Arc::new(db.connect());
        migrate(&pg, &[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]).expect("migrate");
        let dir = tempfile::tempdir().expect("tempdir");
        // A directory stands in for the bucket: the catalog only needs an object store.
        let files = Arc::new(SegmentFiles::local(&dir.path().join("bucket")).expect("files"));
        let open = |node_id: &str, staging: &str| {
            PgCatalog::open(
                Arc::clone(&pg),
                Arc::clone(&files),
                node_id,
                dir.path().join(staging),
                Duration::ZERO,
            )
            .expect("catalog")
        };
        let catalog = open("node-a", "staging-a");
        let reopen = || -> Box<dyn SegmentCatalog> { Box::new(open("node-a", "staging-a")) };
        super::super::contract::suite(&catalog, &files, &reopen);

        // Nodes are numbered once each; each sees only its own checkpoints.
        let other = open("node-b", "staging-b");
        assert_ne!(catalog.node(), other.node());
        assert_eq!(open("node-a", "staging-a").node(), catalog.node());
        other.set_checkpoint(0, 77).expect("checkpoint");
        assert!(!catalog.checkpoints().expect("list").contains(&(0, 77)));

        // A flush of node b is listed on node a once committed.
        let theirs = segment(other.node(), 50);
        fs::write(other.staging_path(&theirs).expect("path"), "b").expect("stage");
        let flush = Flush {
            shard: 0,
            checkpoint: 50,
            segments: vec![theirs.clone()],
        };
        other.record_flush(&flush).expect("record");
        assert!(catalog
            .segments(9, None, None)
            .expect("list")
            .contains(&theirs));

        // An upload whose commit never came is swept; listed segments stay.
        let orphan = segment(other.node(), 60);
        let staged = other.staging_path(&orphan).expect("path");
        fs::write(&staged, "orphan").expect("stage");
        files.upload(&orphan, &staged).expect("upload");
        assert_eq!(catalog.sweep_orphans().expect("sweep"), 1);
        assert!(files.read(&orphan).is_err());
        assert_eq!(files.read(&theirs).expect("kept").as_ref(), b"b");
    }
}
