//! The ingest shard actor's contract: its messages and what they carry. A leaf of the
//! ingest module: the pipeline and the shards both build on it, it builds on neither.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::Message;

use super::error::IngestError;
use super::normalize::CapturedEvent;

/// The shard's parts of a group of durable WAL records, in log order: one message per group
/// commit rather than per record, so a busy shard wakes once per fsync, not once per request.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ProcessBatch {
    pub parts: Vec<RecordPart>,
}

/// The events of one WAL record that belong to this shard (possibly none: every shard receives
/// every record, so each shard's checkpoint advances with the log).
pub struct RecordPart {
    pub seq: u64,
    pub project_id: u64,
    pub historical: bool,
    pub events: Vec<CapturedEvent>,
    /// Uuids to skip (already in a segment); set only during replay.
    pub skip: Option<Arc<std::collections::HashSet<uuid::Uuid>>>,
    /// Completion of a live request: answered once every shard has processed the batch.
    pub done: Option<Arc<BatchDone>>,
}

/// Timer tick: flush when the oldest buffered event is older than the flush interval.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FlushTick;

/// Flush now, whatever the thresholds (shutdown, tests).
#[derive(Message)]
#[rtype(result = "Result<ShardStats, IngestError>")]
pub struct FlushNow;

/// Cheap statistics for tests and `/metrics`.
#[derive(Message)]
#[rtype(result = "ShardStats")]
pub struct GetStats;

/// A shard's counters (answer to [`GetStats`] and [`FlushNow`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, actix::MessageResponse)]
pub struct ShardStats {
    pub shard: usize,
    pub buffered_rows: usize,
    pub buffered_bytes: usize,
    pub processed_seq: u64,
    pub checkpoint: u64,
    pub segments_written: u64,
    pub events_stored: u64,
    pub events_dropped: u64,
    pub duplicates_skipped: u64,
    pub flush_failures: u64,
    /// Events whose person processing failed: of live requests, answered 503 and not stored;
    /// of a replayed WAL, stored without the person update.
    pub person_failures: u64,
}

/// Answers a live request once every shard has processed its batch, so an acknowledged event
/// is both durable and visible to reads.
pub struct BatchDone {
    remaining: AtomicUsize,
    reply: Mutex<Option<tokio::sync::oneshot::Sender<Result<(), IngestError>>>>,
}

impl BatchDone {
    /// A completion that answers `reply` once `shards` shards have finished.
    pub(crate) fn new(
        shards: usize,
        reply: tokio::sync::oneshot::Sender<Result<(), IngestError>>,
    ) -> BatchDone {
        BatchDone {
            remaining: AtomicUsize::new(shards),
            reply: Mutex::new(Some(reply)),
        }
    }

    pub(crate) fn shard_finished(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(reply) = self.reply.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = reply.send(Ok(()));
            }
        }
    }

    pub(crate) fn fail(&self, err: IngestError) {
        if let Some(reply) = self.reply.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = reply.send(Err(err));
        }
    }
}
