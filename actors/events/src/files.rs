//! Segment files, read through `object_store`: a local directory in the embedded default (the
//! events directory the [`DirCatalog`](super::catalog::DirCatalog) commits into, whose range
//! reads map the files: [`super::mapped`]), a bucket in a cluster. Every reader of segment bytes comes through here — the events API, WAL
//! replay's dedup scan, compaction, and queries, which name files by [`SegmentFiles::url`]
//! and read them through the same store registered in their runtime.
//!
//! Writing stays with the catalog: a segment is staged as a local file and fsynced (the local
//! object store does not fsync), and the catalog's publish makes it visible at its key — by a
//! rename in the local directory, or by [`SegmentFiles::upload`] to a bucket.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Buf;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaDataReader;
use parquet::file::reader::{ChunkReader, Length};

use super::catalog::SegmentRef;
use super::mapped::MappedLocalStore;
use super::segment::{SegmentError, TimeBounds};
use super::segment_bounds::SegmentBounds;
use corvid_kernel::runtime::OwnedRuntime;

/// The URL queries know the segment store by (a scheme and host of our own, so it cannot
/// clash with a real store a query runtime knows).
pub const SEGMENTS_URL: &str = "corvid-segments://events/";

/// Bytes read from a segment's end to find its footer in one request.
const FOOTER_GUESS: u64 = 64 * 1024;

/// Where segment bytes are read from.
/// A project's share of the segment store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectBytes {
    pub project: u64,
    pub files: u64,
    pub bytes: u64,
}

pub struct SegmentFiles {
    store: Arc<dyn ObjectStore>,
    /// Prepended to every segment key ("" for a store holding segments alone). Kept here
    /// rather than in a prefixed view of the store, because queries read the store's own
    /// object metadata.
    prefix: String,
    /// Runs the store's futures for callers on plain threads (shards, compaction, the
    /// events API's blocking tasks).
    io: Arc<OwnedRuntime>,
    /// Segments' spans of event time, so reads skip segments outside their range unopened.
    bounds: SegmentBounds,
}

impl SegmentFiles {
    /// Segment files under the local directory `root` (created when missing).
    pub fn local(root: &Path) -> std::io::Result<SegmentFiles> {
        std::fs::create_dir_all(root)?;
        let store = LocalFileSystem::new_with_prefix(root).map_err(std::io::Error::other)?;
        SegmentFiles::new(Arc::new(MappedLocalStore::new(store)))
    }

    /// Segment files in any object store, keyed by [`SegmentRef::key`].
    pub fn new(store: Arc<dyn ObjectStore>) -> std::io::Result<SegmentFiles> {
        SegmentFiles::under(store, "")
    }

    /// Segment files in `store` below the key prefix `prefix` (a shared bucket).
    pub fn under(store: Arc<dyn ObjectStore>, prefix: &str) -> std::io::Result<SegmentFiles> {
        let prefix = prefix.trim_matches('/');
        Ok(SegmentFiles {
            store,
            prefix: match prefix {
                "" => String::new(),
                p => format!("{p}/"),
            },
            io: Arc::new(OwnedRuntime::new("corvid-segment-io", 1)?),
            bounds: SegmentBounds::new(),
        })
    }

    /// The store queries read segments from, to be registered under [`SEGMENTS_URL`].
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    /// The URL a query names `segment` by.
    pub fn url(&self, segment: &SegmentRef) -> String {
        format!("{SEGMENTS_URL}{}{}", self.prefix, segment.key())
    }

    /// Where `segment` is in the store.
    fn object_path(&self, segment: &SegmentRef) -> ObjectPath {
        ObjectPath::from(format!("{}{}", self.prefix, segment.key()))
    }

    /// A segment's bytes (blocking: call from a plain or blocking-pool thread).
    pub fn read(&self, segment: &SegmentRef) -> Result<Bytes, SegmentError> {
        let (store, path) = (Arc::clone(&self.store), self.object_path(segment));
        self.io
            .wait(async move { store.get(&path).await?.bytes().await })?
            .map_err(SegmentError::from)
    }

    /// Stores the local file `staged` as `segment`'s bytes (one put: a reader sees all of it
    /// or nothing). Blocking.
    pub fn upload(&self, segment: &SegmentRef, staged: &Path) -> std::io::Result<()> {
        let bytes = std::fs::read(staged)?;
        let (store, path) = (Arc::clone(&self.store), self.object_path(segment));
        self.io
            .wait(async move { store.put(&path, PutPayload::from(bytes)).await })?
            .map(|_| ())
            .map_err(std::io::Error::other)
    }

    /// Deletes `segment`'s bytes (nothing when already gone). Blocking.
    pub fn delete(&self, segment: &SegmentRef) -> std::io::Result<()> {
        let (store, path) = (Arc::clone(&self.store), self.object_path(segment));
        match self.io.wait(async move { store.delete(&path).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    /// Every stored segment, with when it was written (objects whose key is not a segment's
    /// are left out). Blocking.
    pub fn list(&self) -> std::io::Result<Vec<(SegmentRef, DateTime<Utc>)>> {
        Ok(self
            .objects()?
            .into_iter()
            .map(|(segment, o)| (segment, o.last_modified))
            .collect())
    }

    /// Every stored segment's object (objects whose key is not a segment's are left out).
    /// Blocking.
    fn objects(&self) -> std::io::Result<Vec<(SegmentRef, ObjectMeta)>> {
        let store = Arc::clone(&self.store);
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let objects: Vec<ObjectMeta> = self
            .io
            .wait(async move { store.list(prefix.as_ref()).try_collect().await })?
            .map_err(std::io::Error::other)?;
        Ok(objects
            .into_iter()
            .filter_map(|o| {
                let key = o.location.as_ref().strip_prefix(self.prefix.as_str())?;
                Some((SegmentRef::parse_key(key)?, o))
            })
            .collect())
    }

    /// Segment files and their bytes per project, as stored now (every version not yet
    /// removed). Blocking: it lists the whole store.
    pub fn bytes_by_project(&self) -> std::io::Result<Vec<ProjectBytes>> {
        let mut by_project: std::collections::BTreeMap<u64, ProjectBytes> = Default::default();
        for (segment, o) in self.objects()? {
            let entry = by_project
                .entry(segment.project)
                .or_insert_with(|| ProjectBytes {
                    project: segment.project,
                    files: 0,
                    bytes: 0,
                });
            entry.files += 1;
            entry.bytes += o.size;
        }
        Ok(by_project.into_values().collect())
    }

    /// A segment opened for ranged reads: the Parquet reader fetches only the footer and the
    /// column chunks it decodes (the events API skips row groups and columns), instead of the
    /// whole file. Blocking, like [`SegmentFiles::read`].
    pub fn open(&self, segment: &SegmentRef) -> Result<RangedSegment, SegmentError> {
        let (store, path) = (Arc::clone(&self.store), self.object_path(segment));
        let head = {
            let (store, path) = (Arc::clone(&store), path.clone());
            self.io.wait(async move { store.head(&path).await })??
        };
        Ok(RangedSegment {
            store,
            path,
            size: head.size,
            io: Arc::clone(&self.io),
        })
    }

    /// `segment`'s span of event time, when a read has seen it lately.
    pub fn time_bounds(&self, segment: &SegmentRef) -> Option<TimeBounds> {
        self.bounds.get(segment)
    }

    /// Remembers `segment`'s span of event time (what a read found in its footer).
    pub fn remember_time_bounds(&self, segment: &SegmentRef, bounds: TimeBounds) {
        self.bounds.remember(segment, bounds);
    }

    /// A segment's column names, from its footer alone (one ranged read when the footer fits
    /// in [`FOOTER_GUESS`] bytes, as it does for every segment ingest writes).
    pub async fn column_names(
        &self,
        segment: &SegmentRef,
    ) -> Result<BTreeSet<String>, SegmentError> {
        let path = self.object_path(segment);
        let size = self.store.head(&path).await?.size;
        let mut wanted = size.min(FOOTER_GUESS);
        let mut reader = ParquetMetaDataReader::new();
        loop {
            let tail = self.store.get_range(&path, size - wanted..size).await?;
            match reader.try_parse_sized(&tail, size) {
                Ok(()) => break,
                Err(ParquetError::NeedMoreData(needed)) if (needed as u64) > wanted => {
                    wanted = (needed as u64).min(size);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let metadata = reader.finish()?;
        let file = metadata.file_metadata();
        let schema = parquet_to_arrow_schema(file.schema_descr(), file.key_value_metadata())?;
        Ok(schema.fields().iter().map(|f| f.name().clone()).collect())
    }
}

/// A segment read in ranges through the store ([`SegmentFiles::open`]); a clone reads the
/// same object.
#[derive(Clone)]
pub struct RangedSegment {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    size: u64,
    io: Arc<OwnedRuntime>,
}

impl RangedSegment {
    fn range(&self, start: u64, end: u64) -> parquet::errors::Result<Bytes> {
        let (store, path) = (Arc::clone(&self.store), self.path.clone());
        self.io
            .wait(async move { store.get_range(&path, start..end).await })
            .map_err(|e| ParquetError::External(Box::new(e)))?
            .map_err(|e| ParquetError::External(Box::new(e)))
    }
}

impl Length for RangedSegment {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for RangedSegment {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.range(start, self.size)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let end = start.saturating_add(length as u64).min(self.size);
        self.range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::catalog::{write_committed, DirCatalog, SegmentName};
    use crate::segment::{read_segment, read_segment_filtered, SegmentFilter};
    use crate::testing::event;

    #[test]
    fn ranged_reads_give_the_rows_a_whole_read_gives() {
        let dir = tempfile::tempdir().expect("tempdir");
        let catalog = DirCatalog::open(dir.path().to_path_buf()).expect("catalog");
        let files = SegmentFiles::local(dir.path()).expect("files");
        let rows: Vec<_> = (0..500)
            .map(|i| {
                let name = if i % 3 == 0 { "signup" } else { "$pageview" };
                event(
                    1,
                    name,
                    &format!("u{i}"),
                    "2024-01-01T00:00:00Z",
                    json!({"i": i}),
                )
            })
            .collect();
        let segment = SegmentRef {
            project: 1,
            day: rows[0].day(),
            name: SegmentName {
                node: 0,
                shard: 0,
                first: 1,
                last: 500,
                version: 0,
            },
        };
        write_committed(
            &catalog,
            &segment,
            &mut rows.iter().collect::<Vec<_>>(),
            &[],
        )
        .expect("segment");
        let whole = read_segment(files.read(&segment).expect("bytes"), "whole").expect("rows");
        assert_eq!(whole.len(), 500);
        // The WAL replay's duplicate check reads the uuid column alone: the same uuids.
        let uuids = crate::segment::read_uuids(files.read(&segment).expect("bytes"), "uuids")
            .expect("uuids");
        assert_eq!(uuids, whole.iter().map(|e| e.uuid).collect::<Vec<_>>());
        let filter = SegmentFilter {
            event: Some("signup".into()),
            ..SegmentFilter::default()
        };
        let ranged = read_segment_filtered(files.open(&segment).expect("open"), "ranged", &filter)
            .expect("rows");
        let mut expected: Vec<_> = whole.into_iter().filter(|e| e.event == "signup").collect();
        let midnight = rows[0].timestamp.timestamp_micros();
        assert_eq!(
            ranged.bounds,
            Some(crate::segment::TimeBounds {
                min: midnight,
                max: midnight
            })
        );
        let mut got = ranged.rows;
        expected.sort_by_key(|e| e.uuid);
        got.sort_by_key(|e| e.uuid);
        assert_eq!(got, expected);
        assert_eq!(got.len(), 167);
        // Every row group carries a bloom filter of its distinct ids: a read for an id the
        // segment does not hold skips it, one for an id it holds finds its row.
        let bytes = files.read(&segment).expect("bytes");
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .expect("footer");
        let column = crate::segment::schema()
            .index_of("distinct_id")
            .expect("column");
        let bloom = parquet::bloom_filter::Sbbf::read_from_column_chunk(
            meta.row_group(0).column(column),
            &bytes,
        )
        .expect("read")
        .expect("a bloom filter");
        assert!((0..500).all(|i| bloom.check(format!("u{i}").as_str())));
        let absent = (0..1000).filter(|i| bloom.check(format!("v{i}").as_str()));
        assert!(absent.count() < 50);
        // Columns read by most queries are stored as they are, the rest in zstd.
        for c in meta.row_group(0).columns() {
            let expected = match c.column_path().string().as_str() {
                "event" | "timestamp" | "created_at" | "person_id" => "UNCOMPRESSED",
                _ => "ZSTD",
            };
            let got = format!("{:?}", c.compression());
            assert!(got.starts_with(expected), "{}: {got}", c.column_path());
        }
        for (id, rows) in [("u7", 1), ("nobody", 0)] {
            let filter = SegmentFilter {
                distinct_id: Some(id.into()),
                ..SegmentFilter::default()
            };
            let read = read_segment_filtered(files.open(&segment).expect("open"), "one", &filter)
                .expect("rows");
            assert_eq!(read.rows.len(), rows, "{id}");
        }
    }
}
