//! Reading stored events: committed Parquet segments plus each shard's not-yet-flushed tail, so
//! an event is visible as soon as it is acknowledged and processed.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use chrono::{DateTime, NaiveDate, Utc};

use super::catalog::{SegmentCatalog, SegmentRef};
use super::files::SegmentFiles;
use super::segment::{read_segment_filtered, SegmentError, SegmentFilter, StoredEvent};
use corvid_persons::ErasedSet;

/// A shard's buffered rows, shared read-only with readers: the `active` rows being appended
/// to, and `frozen` batches handed to the shard's flusher but not yet committed to segments.
#[derive(Default)]
pub struct Tail {
    rows: RwLock<TailRows>,
}

#[derive(Default)]
pub struct TailRows {
    pub active: RowChunks,
    pub frozen: Vec<Arc<FrozenRows>>,
}

/// Rows frozen for one flush; removed from the tail when their segments are committed.
pub struct FrozenRows {
    pub id: u64,
    pub rows: RowChunks,
}

/// Rows per chunk of a [`RowChunks`]: about 650 KiB of row structs, small enough for the
/// allocator to recycle chunks freed by the flusher.
const CHUNK_ROWS: usize = 2048;

/// An append-only list of rows kept in fixed-size chunks, so appending never moves the rows
/// already held. A shard's buffer grows to `flush_max_rows` (200,000 by default); as one `Vec`,
/// each doubling copied up to ~40 MB and faulted in ~80 MB of fresh memory on the shard thread,
/// and every acknowledgement waiting on that shard stalled for 100 ms or more.
#[derive(Default)]
pub struct RowChunks {
    chunks: Vec<Vec<StoredEvent>>,
    len: usize,
}

impl RowChunks {
    pub fn push(&mut self, row: StoredEvent) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK_ROWS => chunk.push(row),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK_ROWS);
                chunk.push(row);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    pub fn iter(&self) -> impl Iterator<Item = &StoredEvent> {
        self.chunks.iter().flatten()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Extend<StoredEvent> for RowChunks {
    fn extend<I: IntoIterator<Item = StoredEvent>>(&mut self, rows: I) {
        for row in rows {
            self.push(row);
        }
    }
}

impl TailRows {
    /// Every buffered row, frozen and active.
    pub fn iter(&self) -> impl Iterator<Item = &StoredEvent> {
        self.frozen
            .iter()
            .flat_map(|f| f.rows.iter())
            .chain(self.active.iter())
    }

    pub fn len(&self) -> usize {
        self.active.len() + self.frozen.iter().map(|f| f.rows.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Tail {
    pub fn read(&self) -> RwLockReadGuard<'_, TailRows> {
        self.rows.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, TailRows> {
        self.rows.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Filters of the events API.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub project_id: u64,
    pub event: Option<String>,
    pub distinct_id: Option<String>,
    /// Exclusive lower bound.
    pub after: Option<DateTime<Utc>>,
    /// Exclusive upper bound; with `before_uuid`, the page cursor: events older than
    /// `before`, or at `before` with a smaller uuid (the order pages are listed in).
    pub before: Option<DateTime<Utc>>,
    pub before_uuid: Option<uuid::Uuid>,
    pub limit: usize,
}

impl EventFilter {
    fn matches(&self, e: &StoredEvent) -> bool {
        e.project_id == self.project_id
            && self.event.as_ref().is_none_or(|n| &e.event == n)
            && self
                .distinct_id
                .as_ref()
                .is_none_or(|d| &e.distinct_id == d)
            && self.after.is_none_or(|a| e.timestamp > a)
            && self.before.is_none_or(|b| {
                e.timestamp < b
                    || (e.timestamp == b && self.before_uuid.is_some_and(|u| e.uuid < u))
            })
    }

    /// The upper bound segment reads may use (inclusive of the cursor's instant).
    fn scan_before(&self) -> Option<DateTime<Utc>> {
        match (self.before, self.before_uuid) {
            (Some(b), Some(_)) => Some(b + chrono::Duration::microseconds(1)),
            (before, None) => before,
            (None, Some(_)) => None,
        }
    }
}

/// A consistent view: the segments and tail rows at one instant. Flushes publish segments
/// under the tails' write locks, so a view never sees a row twice or not at all.
pub struct Snapshot {
    pub segments: Vec<SegmentRef>,
    pub tail: Vec<StoredEvent>,
}

pub fn snapshot(
    catalog: &dyn SegmentCatalog,
    tails: &[Arc<Tail>],
    project_id: u64,
    from: Option<NaiveDate>,
    to: Option<NaiveDate>,
    keep: impl Fn(&StoredEvent) -> bool,
) -> std::io::Result<Snapshot> {
    let guards: Vec<_> = tails.iter().map(|t| t.read()).collect();
    let segments = catalog.segments(project_id, from, to)?;
    let tail = guards
        .iter()
        .flat_map(|g| g.iter())
        .filter(|e| keep(e))
        .cloned()
        .collect();
    Ok(Snapshot { segments, tail })
}

/// Events matching `filter`, newest first, at most `filter.limit`.
///
/// Events `erased` covers are left out (an erasure hides them at once; the compactor removes
/// them from segments later). A read that fails while the project's segments changed (a
/// version it listed was superseded and deleted meanwhile) is done again on a fresh listing.
pub fn query_events(
    catalog: &dyn SegmentCatalog,
    files: &SegmentFiles,
    tails: &[Arc<Tail>],
    filter: &EventFilter,
    erased: &ErasedSet,
) -> Result<Vec<StoredEvent>, SegmentError> {
    let mut attempts = 0;
    loop {
        let listed = catalog.segments(filter.project_id, None, None)?;
        match query_once(catalog, files, tails, filter, erased) {
            Err(err)
                if attempts < 3 && catalog.segments(filter.project_id, None, None)? != listed =>
            {
                attempts += 1;
                tracing::debug!(error = %err, "segments changed during an events read; reading again");
            }
            outcome => return outcome,
        }
    }
}

fn query_once(
    catalog: &dyn SegmentCatalog,
    files: &SegmentFiles,
    tails: &[Arc<Tail>],
    filter: &EventFilter,
    erased: &ErasedSet,
) -> Result<Vec<StoredEvent>, SegmentError> {
    let from = filter.after.map(|a| a.date_naive());
    let to = filter.scan_before().map(|b| b.date_naive());
    let snap = snapshot(catalog, tails, filter.project_id, from, to, |e| {
        filter.matches(e) && !e.erased_by(erased)
    })?;
    // Newest day first; stop once a whole day leaves us with enough rows.
    let mut by_day: std::collections::BTreeMap<NaiveDate, Vec<SegmentRef>> = Default::default();
    for segment in snap.segments {
        by_day.entry(segment.day).or_default().push(segment);
    }
    let segment_filter = SegmentFilter {
        event: filter.event.clone(),
        distinct_id: filter.distinct_id.clone(),
        after: filter.after,
        before: filter.scan_before(),
    };
    let mut rows = snap.tail;
    for (day, segments) in by_day.into_iter().rev() {
        // Every row of this day and older days is older than rows of newer days: once those
        // fill the page, nothing further can make it.
        if rows.iter().filter(|e| e.day() > day).count() >= filter.limit {
            break;
        }
        for segment in segments {
            // A segment whose span of event time is known and outside the range holds no row
            // of it: skipped without opening it (probes of the last seconds stay cheap).
            if files
                .time_bounds(&segment)
                .is_some_and(|b| !b.may_match(&segment_filter))
            {
                continue;
            }
            let file = files.open(&segment)?;
            let read = read_segment_filtered(file, &segment.key(), &segment_filter)?;
            if let Some(bounds) = read.bounds {
                files.remember_time_bounds(&segment, bounds);
            }
            rows.extend(
                read.rows
                    .into_iter()
                    .filter(|e| filter.matches(e) && !e.erased_by(erased)),
            );
        }
    }
    rows.sort_by(|a, b| b.timestamp.cmp(&a.timestamp).then(b.uuid.cmp(&a.uuid)));
    rows.truncate(filter.limit);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{at, event};
    use serde_json::json;

    #[test]
    fn row_chunks_keep_every_row_in_order_across_chunk_boundaries() {
        let mut rows = RowChunks::default();
        assert!(rows.is_empty());
        let n = CHUNK_ROWS * 2 + 3;
        rows.extend(
            (0..n).map(|i| event(1, "e", &format!("u{i}"), "2024-01-01T00:00:00Z", json!({}))),
        );
        assert_eq!(rows.len(), n);
        let ids: Vec<String> = rows.iter().map(|r| r.distinct_id.clone()).collect();
        let expected: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
        assert_eq!(ids, expected);
        // No chunk ever holds more than its fixed size, so appending never moves old rows.
        assert!(rows.chunks.iter().all(|c| c.len() <= CHUNK_ROWS));
        assert_eq!(rows.chunks.len(), 3);
    }

    #[test]
    fn reads_skip_segments_outside_their_time_range_without_losing_rows() {
        use crate::catalog::{write_committed, DirCatalog};
        use crate::testing::segment_of;

        let dir = tempfile::tempdir().expect("tempdir");
        let catalog = DirCatalog::open(dir.path().to_path_buf()).expect("catalog");
        let files = SegmentFiles::local(dir.path()).expect("files");
        let day = at("2024-01-01T00:00:00Z").date_naive();
        let (morning, evening) = (segment_of(day, 1), segment_of(day, 2));
        for (seg, hour) in [(&morning, "08"), (&evening, "20")] {
            let rows: Vec<_> = (0..3)
                .map(|i| {
                    let ts = format!("2024-01-01T{hour}:0{i}:00Z");
                    event(1, "e", &format!("u{hour}{i}"), &ts, json!({}))
                })
                .collect();
            write_committed(&catalog, seg, &mut rows.iter().collect::<Vec<_>>(), &[])
                .expect("segment");
        }
        let erased = ErasedSet::default();
        let read = |after: Option<&str>, before: Option<&str>| {
            let filter = EventFilter {
                project_id: 1,
                after: after.map(at),
                before: before.map(at),
                limit: 100,
                ..EventFilter::default()
            };
            let rows = query_events(&catalog, &files, &[], &filter, &erased).expect("read");
            let mut ids: Vec<String> = rows.into_iter().map(|e| e.distinct_id).collect();
            ids.sort();
            ids
        };
        let everything = read(None, None);
        assert_eq!(everything.len(), 6);
        // Every read learned both segments' spans.
        assert!(files.time_bounds(&morning).is_some() && files.time_bounds(&evening).is_some());
        // The morning segment's bytes are spoiled: a read of the evening alone does not open
        // them.
        std::fs::write(dir.path().join(morning.key()), b"not parquet").expect("spoil");
        assert_eq!(
            read(Some("2024-01-01T12:00:00Z"), None),
            ["u200", "u201", "u202"]
        );
        assert_eq!(read(Some("2024-01-01T20:00:30Z"), None), ["u201", "u202"]);
        // A range that reaches into the morning still reads it (and fails on its bytes).
        let filter = EventFilter {
            project_id: 1,
            before: Some(at("2024-01-01T12:00:00Z")),
            limit: 100,
            ..EventFilter::default()
        };
        assert!(query_events(&catalog, &files, &[], &filter, &erased).is_err());
    }
}
