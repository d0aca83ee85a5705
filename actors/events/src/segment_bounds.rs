//! Each segment's span of event time, remembered once a read has seen its footer, so the
//! events API skips segments that cannot hold a row of the asked-for time range without
//! opening them. A probe for events of the last seconds would otherwise open every segment of
//! the day (hundreds under `/batch/` load) on every call.
//!
//! Safe because a segment never changes once written: every flush and compaction writes a new
//! name ([`SegmentRef`] carries node, WAL range and version). Bounded: two generations of at
//! most [`PER_GENERATION`] entries; when the newer one fills, the older one is dropped, so the
//! segments read recently stay and the rest are forgotten (and read again when asked for).

use std::collections::HashMap;
use std::sync::Mutex;

use super::catalog::SegmentRef;
use super::segment::TimeBounds;

/// Entries per generation (about 100 bytes each, so both stay within a few MiB).
const PER_GENERATION: usize = 32_768;

#[derive(Default)]
struct Generations {
    newer: HashMap<SegmentRef, TimeBounds>,
    older: HashMap<SegmentRef, TimeBounds>,
}

/// The remembered spans.
#[derive(Default)]
pub struct SegmentBounds {
    inner: Mutex<Generations>,
    capacity: usize,
}

impl SegmentBounds {
    pub fn new() -> SegmentBounds {
        SegmentBounds::with_capacity(PER_GENERATION)
    }

    fn with_capacity(capacity: usize) -> SegmentBounds {
        SegmentBounds {
            inner: Mutex::default(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `segment`'s span, when a read has seen it lately.
    pub fn get(&self, segment: &SegmentRef) -> Option<TimeBounds> {
        let mut g = self.lock();
        if let Some(b) = g.newer.get(segment) {
            return Some(*b);
        }
        let found = g.older.remove(segment)?;
        Self::put(&mut g, self.capacity, segment.clone(), found);
        Some(found)
    }

    /// Remembers `segment`'s span.
    pub fn remember(&self, segment: &SegmentRef, bounds: TimeBounds) {
        let mut g = self.lock();
        Self::put(&mut g, self.capacity, segment.clone(), bounds);
    }

    fn put(g: &mut Generations, capacity: usize, segment: SegmentRef, bounds: TimeBounds) {
        if g.newer.len() >= capacity && !g.newer.contains_key(&segment) {
            g.older = std::mem::take(&mut g.newer);
        }
        g.newer.insert(segment, bounds);
    }

    /// Spans held now (both generations).
    #[cfg(test)]
    fn len(&self) -> usize {
        let g = self.lock();
        g.newer.len() + g.older.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::segment_of;
    use chrono::NaiveDate;

    fn segment(seq: u64) -> SegmentRef {
        segment_of(NaiveDate::from_ymd_opt(2026, 1, 1).expect("date"), seq)
    }

    fn span(n: i64) -> TimeBounds {
        TimeBounds { min: n, max: n + 1 }
    }

    #[test]
    fn remembered_spans_are_answered() {
        let bounds = SegmentBounds::new();
        assert_eq!(bounds.get(&segment(1)), None);
        bounds.remember(&segment(1), span(10));
        assert_eq!(bounds.get(&segment(1)), Some(span(10)));
        assert_eq!(bounds.get(&segment(2)), None);
    }

    #[test]
    fn holds_at_most_two_generations_and_keeps_what_was_read_lately() {
        let bounds = SegmentBounds::with_capacity(4);
        for n in 0..100 {
            bounds.remember(&segment(n), span(n as i64));
            assert!(bounds.len() <= 8, "held {}", bounds.len());
        }
        // The newest entries are kept, the oldest forgotten.
        assert_eq!(bounds.get(&segment(99)), Some(span(99)));
        assert_eq!(bounds.get(&segment(0)), None);
        // An entry read from the older generation moves to the newer and outlives a rollover.
        let kept = (92..100).find(|&n| bounds.lock().older.contains_key(&segment(n)));
        let kept = kept.expect("an entry in the older generation");
        assert_eq!(bounds.get(&segment(kept)), Some(span(kept as i64)));
        for n in 100..103 {
            bounds.remember(&segment(n), span(n as i64));
        }
        assert_eq!(bounds.get(&segment(kept)), Some(span(kept as i64)));
    }
}
