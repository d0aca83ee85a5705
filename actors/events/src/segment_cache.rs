//! A bounded in-memory cache in front of the bucket that holds segment files, so a node reading
//! the same segments again (repeated queries, dashboards, materializations) does not fetch
//! them from the bucket each time.
//!
//! Safe because a segment object never changes once written: every flush and every
//! compaction writes a new key ([`super::catalog::SegmentName`] carries node, WAL range and
//! version), and a retried upload writes the same bytes. Reads with conditions or versions
//! pass through; a delete drops the key's entries. When the cache holds more than its budget,
//! the oldest entries go first.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    Attributes, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, Result,
};

/// Which bytes of an object a cached answer holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Span {
    Whole,
    Bounded(u64, u64),
    Offset(u64),
    Suffix(u64),
    /// The object's metadata alone (a HEAD).
    Head,
}

impl Span {
    fn of(options: &GetOptions) -> Span {
        if options.head {
            return Span::Head;
        }
        match &options.range {
            None => Span::Whole,
            Some(GetRange::Bounded(r)) => Span::Bounded(r.start, r.end),
            Some(GetRange::Offset(o)) => Span::Offset(*o),
            Some(GetRange::Suffix(n)) => Span::Suffix(*n),
        }
    }
}

/// One cached answer.
#[derive(Clone)]
struct Entry {
    meta: ObjectMeta,
    range: std::ops::Range<u64>,
    attributes: Attributes,
    bytes: Bytes,
}

#[derive(Default)]
struct State {
    entries: HashMap<Path, HashMap<Span, Entry>>,
    /// Insertion order, for eviction (an entry evicted already is skipped).
    order: VecDeque<(Path, Span)>,
    bytes: usize,
}

/// `inner` with a cache of at most `budget` bytes of object data in front of its reads.
pub struct CachedSegments {
    inner: Arc<dyn ObjectStore>,
    budget: usize,
    state: Arc<Mutex<State>>,
}

impl CachedSegments {
    pub fn new(inner: Arc<dyn ObjectStore>, budget: usize) -> CachedSegments {
        CachedSegments {
            inner,
            budget,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn cached(&self, location: &Path, span: &Span) -> Option<Entry> {
        self.state().entries.get(location)?.get(span).cloned()
    }

    fn keep(&self, location: &Path, span: Span, entry: Entry) {
        let size = entry.bytes.len();
        if size > self.budget {
            return;
        }
        let mut state = self.state();
        let previous = state
            .entries
            .entry(location.clone())
            .or_default()
            .insert(span.clone(), entry);
        match previous {
            Some(old) => state.bytes -= old.bytes.len(),
            None => state.order.push_back((location.clone(), span)),
        }
        state.bytes += size;
        while state.bytes > self.budget {
            let Some((path, span)) = state.order.pop_front() else {
                break;
            };
            let removed = state.entries.get_mut(&path).and_then(|e| e.remove(&span));
            if let Some(removed) = removed {
                state.bytes -= removed.bytes.len();
            }
            if state.entries.get(&path).is_some_and(HashMap::is_empty) {
                state.entries.remove(&path);
            }
        }
    }

    fn forget(&self, location: &Path) {
        forget(&self.state, location);
    }

    /// Bytes of object data held now.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        self.state().bytes
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every operation leaves the maps whole: a panic elsewhere cannot corrupt them.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops every cached answer about `location`.
fn forget(state: &Mutex<State>, location: &Path) {
    let mut state = lock(state);
    if let Some(spans) = state.entries.remove(location) {
        state.bytes -= spans.values().map(|e| e.bytes.len()).sum::<usize>();
    }
    state.order.retain(|(p, _)| p != location);
}

fn answer(entry: Entry) -> GetResult {
    let bytes = entry.bytes;
    GetResult {
        payload: GetResultPayload::Stream(stream::once(async move { Ok(bytes) }).boxed()),
        meta: entry.meta,
        range: entry.range,
        attributes: entry.attributes,
    }
}

/// Whether a read may be answered from (and kept in) the cache: no conditions, no version.
fn cacheable(options: &GetOptions) -> bool {
    options.if_match.is_none()
        && options.if_none_match.is_none()
        && options.if_modified_since.is_none()
        && options.if_unmodified_since.is_none()
        && options.version.is_none()
}

impl fmt::Debug for CachedSegments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedSegments")
            .field("inner", &self.inner)
            .field("budget", &self.budget)
            .finish()
    }
}

impl fmt::Display for CachedSegments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachedSegments({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CachedSegments {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.forget(location);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.forget(location);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if !cacheable(&options) {
            return self.inner.get_opts(location, options).await;
        }
        let span = Span::of(&options);
        if let Some(entry) = self.cached(location, &span) {
            return Ok(answer(entry));
        }
        let result = self.inner.get_opts(location, options).await?;
        let (meta, range, attributes) = (
            result.meta.clone(),
            result.range.clone(),
            result.attributes.clone(),
        );
        let bytes = if span == Span::Head {
            Bytes::new()
        } else {
            result.bytes().await?
        };
        let entry = Entry {
            meta,
            range,
            attributes,
            bytes,
        };
        self.keep(location, span, entry.clone());
        Ok(answer(entry))
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        // Each deleted object's entries are dropped as the inner store confirms it.
        let state = Arc::clone(&self.state);
        self.inner
            .delete_stream(locations)
            .map(move |deleted| {
                if let Ok(path) = &deleted {
                    forget(&state, path);
                }
                deleted
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.forget(to);
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    use super::*;

    /// Counts the reads that reach the store behind the cache.
    #[derive(Debug)]
    struct Counting {
        inner: InMemory,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl fmt::Display for Counting {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "Counting")
        }
    }

    #[async_trait]
    impl ObjectStore for Counting {
        async fn put_opts(&self, l: &Path, p: PutPayload, o: PutOptions) -> Result<PutResult> {
            self.inner.put_opts(l, p, o).await
        }
        async fn put_multipart_opts(
            &self,
            l: &Path,
            o: PutMultipartOptions,
        ) -> Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(l, o).await
        }
        async fn get_opts(&self, l: &Path, o: GetOptions) -> Result<GetResult> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.get_opts(l, o).await
        }
        fn delete_stream(
            &self,
            l: BoxStream<'static, Result<Path>>,
        ) -> BoxStream<'static, Result<Path>> {
            self.inner.delete_stream(l)
        }
        fn list(&self, p: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
            self.inner.list(p)
        }
        async fn list_with_delimiter(&self, p: Option<&Path>) -> Result<ListResult> {
            self.inner.list_with_delimiter(p).await
        }
        async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> Result<()> {
            self.inner.copy_opts(f, t, o).await
        }
    }

    #[tokio::test]
    async fn repeated_reads_are_served_from_memory_within_the_budget() {
        let inner = Arc::new(Counting {
            inner: InMemory::new(),
            reads: Default::default(),
        });
        let cache = CachedSegments::new(Arc::clone(&inner) as Arc<dyn ObjectStore>, 100);
        let reads = || inner.reads.load(std::sync::atomic::Ordering::SeqCst);
        let (a, b) = (Path::from("a"), Path::from("b"));
        cache
            .put(&a, PutPayload::from(vec![1u8; 60]))
            .await
            .expect("put");
        cache
            .put(&b, PutPayload::from(vec![2u8; 60]))
            .await
            .expect("put");

        assert_eq!(
            cache.get_range(&a, 10..20).await.expect("range"),
            vec![1u8; 10]
        );
        assert_eq!(
            cache.get_range(&a, 10..20).await.expect("range"),
            vec![1u8; 10]
        );
        assert_eq!(cache.head(&a).await.expect("head").size, 60);
        assert_eq!(cache.head(&a).await.expect("head").size, 60);
        assert_eq!(reads(), 2, "one range read and one HEAD reached the store");

        // Whole objects: the second one pushes the first out (budget 100 bytes).
        assert_eq!(
            cache
                .get(&a)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes")
                .len(),
            60
        );
        assert_eq!(
            cache
                .get(&b)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes")
                .len(),
            60
        );
        assert!(cache.held_bytes() <= 100, "{}", cache.held_bytes());
        let before = reads();
        cache
            .get(&b)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(reads(), before, "the newest object is still cached");
        cache
            .get(&a)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(reads(), before + 1, "the oldest went first");

        // A deleted object is not served from memory.
        cache.delete(&b).await.expect("delete");
        assert!(cache.get(&b).await.is_err());
    }
}
