//! Segment files, read through `object_store`: a local directory in the embedded default (the
//! events directory the [`DirCatalog`](super::catalog::DirCatalog) commits into), a bucket
//! in a cluster. Every reader of segment bytes comes through here — the events API, WAL
//! replay's dedup scan, compaction, and queries, which name files by [`SegmentFiles::url`]
//! and read them through the same store registered in their runtime.
//!
//! Writing stays with the catalog: a segment is staged as a local file and fsynced (the local
//! object store does not fsync), and the catalog's publish makes it visible at its key.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaDataReader;

use super::catalog::SegmentRef;
use super::segment::SegmentError;
use crate::kernel::runtime::OwnedRuntime;

/// The URL queries know the segment store by.
const SEGMENTS_URL: &str = "corvid-segments://events/";

/// Bytes read from a segment's end to find its footer in one request.
const FOOTER_GUESS: u64 = 64 * 1024;

/// Where segment bytes are read from.
pub struct SegmentFiles {
    store: Arc<dyn ObjectStore>,
    url: ObjectStoreUrl,
    /// Runs the store's futures for callers on plain threads (shards, compaction, the
    /// events API's blocking tasks).
    io: OwnedRuntime,
}

impl SegmentFiles {
    /// Segment files under the local directory `root` (created when missing).
    pub fn local(root: &Path) -> std::io::Result<SegmentFiles> {
        std::fs::create_dir_all(root)?;
        let store = LocalFileSystem::new_with_prefix(root).map_err(std::io::Error::other)?;
        SegmentFiles::new(Arc::new(store))
    }

    /// Segment files in any object store, keyed by [`SegmentRef::key`].
    pub fn new(store: Arc<dyn ObjectStore>) -> std::io::Result<SegmentFiles> {
        let url = ObjectStoreUrl::parse(SEGMENTS_URL).map_err(std::io::Error::other)?;
        Ok(SegmentFiles {
            store,
            url,
            io: OwnedRuntime::new("corvid-segment-io", 1)?,
        })
    }

    /// Makes the store readable by queries run with `runtime`, under [`SegmentFiles::url`].
    pub fn register(&self, runtime: &RuntimeEnv) {
        runtime.register_object_store(self.url.as_ref(), Arc::clone(&self.store));
    }

    /// The URL a query names `segment` by.
    pub fn url(&self, segment: &SegmentRef) -> String {
        format!("{}{}", self.url.as_str(), segment.key())
    }

    /// A segment's bytes (blocking: call from a plain or blocking-pool thread).
    pub fn read(&self, segment: &SegmentRef) -> Result<Bytes, SegmentError> {
        let (store, path) = (Arc::clone(&self.store), object_path(segment));
        self.io
            .wait(async move { store.get(&path).await?.bytes().await })?
            .map_err(SegmentError::from)
    }

    /// A segment's column names, from its footer alone (one ranged read when the footer fits
    /// in [`FOOTER_GUESS`] bytes, as it does for every segment ingest writes).
    pub async fn column_names(
        &self,
        segment: &SegmentRef,
    ) -> Result<BTreeSet<String>, SegmentError> {
        let path = object_path(segment);
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

fn object_path(segment: &SegmentRef) -> ObjectPath {
    ObjectPath::from(segment.key())
}
