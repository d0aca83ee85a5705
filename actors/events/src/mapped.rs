//! The embedded segment store: a local directory whose range reads map the file instead of
//! copying it.
//!
//! Queries read column chunks of segments through `get_ranges`. The local object store answers
//! each range with a zero-filled buffer and a `pread` into it: both a memset and a copy of
//! every byte from the page cache, a quarter of a `uniq(person_id)` over a week of events.
//! Here a range is a read-only mapping of the file's pages instead, prefaulted so decoding does
//! not take a page fault per page; the returned bytes own the mapping.
//!
//! Mapping is sound only because a committed segment never changes: the catalog stages a
//! segment in a temporary file, fsyncs it and renames it into place, and later removes it
//! whole (compaction, retention, erasure rewrite to new names). Removing a mapped file keeps
//! its pages until the mapping is dropped. A file cut short underneath a mapping by something
//! outside Corvid would fault the process, so a range is mapped only after checking it lies
//! within the file as opened. Every other call goes to the local store unchanged.

use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// Ranges at least this long are mapped; shorter ones (footers, small pages) are read, where a
/// mapping's system calls cost more than the copy they save.
const MAP_AT_LEAST: u64 = 64 * 1024;

/// A [`LocalFileSystem`] whose `get_ranges` maps files (see the module docs).
#[derive(Debug)]
pub struct MappedLocalStore {
    inner: Arc<LocalFileSystem>,
}

impl MappedLocalStore {
    pub fn new(inner: LocalFileSystem) -> MappedLocalStore {
        MappedLocalStore {
            inner: Arc::new(inner),
        }
    }
}

impl fmt::Display for MappedLocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mapped({})", self.inner)
    }
}

/// `ranges` of the file at `path`, each mapped or read as its length suits.
fn map_ranges(path: &std::path::Path, ranges: &[Range<u64>]) -> std::io::Result<Vec<Bytes>> {
    let file = File::open(path)?;
    let length = file.metadata()?.len();
    ranges
        .iter()
        .map(|range| {
            if range.start > range.end || range.end > length {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "range {}..{} is outside {} ({length} bytes)",
                        range.start,
                        range.end,
                        path.display()
                    ),
                ));
            }
            let len = (range.end - range.start) as usize;
            if range.end - range.start < MAP_AT_LEAST {
                return read_range(&file, range.start, len);
            }
            // SAFETY: the mapping is read-only and lies within the file's length as opened;
            // committed segments are never written or truncated in place (module docs), so
            // the mapped bytes cannot change or vanish while the returned `Bytes` lives.
            #[allow(unsafe_code)]
            let map = unsafe {
                memmap2::MmapOptions::new()
                    .offset(range.start)
                    .len(len)
                    .populate()
                    .map(&file)?
            };
            Ok(Bytes::from_owner(map))
        })
        .collect()
}

/// `len` bytes of `file` from `offset`, read into a buffer that is never zero-filled first.
fn read_range(file: &File, offset: u64, len: usize) -> std::io::Result<Bytes> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = file;
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(len);
    file.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the file ended before the range",
        ));
    }
    Ok(Bytes::from(buf))
}

fn store_error(path: &std::path::Path, source: std::io::Error) -> object_store::Error {
    if source.kind() == std::io::ErrorKind::NotFound {
        object_store::Error::NotFound {
            path: path.display().to_string(),
            source: Box::new(source),
        }
    } else {
        object_store::Error::Generic {
            store: "MappedLocal",
            source: Box::new(source),
        }
    }
}

#[async_trait]
impl ObjectStore for MappedLocalStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let path = self.inner.path_to_filesystem(location)?;
        let ranges = ranges.to_vec();
        tokio::task::spawn_blocking(move || {
            map_ranges(&path, &ranges).map_err(|e| store_error(&path, e))
        })
        .await
        .map_err(|e| object_store::Error::Generic {
            store: "MappedLocal",
            source: Box::new(e),
        })?
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn ranges_read_the_same_bytes_as_the_local_store() {
        let dir = tempfile::tempdir().expect("dir");
        let bytes: Vec<u8> = (0..600_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("seg.parquet"), &bytes).expect("write");
        let local = LocalFileSystem::new_with_prefix(dir.path()).expect("fs");
        let mapped =
            MappedLocalStore::new(LocalFileSystem::new_with_prefix(dir.path()).expect("fs"));
        let path = Path::from("seg.parquet");
        // Unaligned starts and ends, short and long, the whole file, an empty range.
        let ranges = vec![
            3..70_001,
            4_096..8_192,
            0..600_000,
            123_457..400_003,
            599_999..600_000,
            10..10,
        ];
        let got = mapped.get_ranges(&path, &ranges).await.expect("mapped");
        let want = local.get_ranges(&path, &ranges).await.expect("local");
        assert_eq!(got, want);
        for (range, got) in ranges.iter().zip(&got) {
            assert_eq!(
                got.as_ref(),
                &bytes[range.start as usize..range.end as usize]
            );
        }
        // The file removed while its bytes are held: they stay readable.
        std::fs::remove_file(dir.path().join("seg.parquet")).expect("remove");
        assert_eq!(got[2].as_ref(), bytes.as_slice());
    }

    #[tokio::test]
    async fn ranges_past_the_end_or_of_missing_files_are_errors() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("small"), vec![1u8; 100_000]).expect("write");
        let mapped =
            MappedLocalStore::new(LocalFileSystem::new_with_prefix(dir.path()).expect("fs"));
        for range in [50_000..200_000, 99_000..100_001, 200_000..300_000] {
            assert!(mapped
                .get_ranges(&Path::from("small"), &[range])
                .await
                .is_err());
        }
        let first_bytes = std::iter::once(0..10u64).collect::<Vec<_>>();
        let missing = mapped
            .get_ranges(&Path::from("missing"), &first_bytes)
            .await;
        assert!(matches!(missing, Err(object_store::Error::NotFound { .. })));
        // Everything else is the local store's.
        mapped
            .put(&Path::from("other"), PutPayload::from(vec![9u8; 10]))
            .await
            .expect("put");
        let read = mapped.get(&Path::from("other")).await.expect("get");
        assert_eq!(read.bytes().await.expect("bytes").as_ref(), &[9u8; 10]);
    }
}
