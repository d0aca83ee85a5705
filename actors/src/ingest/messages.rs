//! Messages of the ingest shard actor.

use std::sync::Arc;

use actix::Message;

use super::pipeline::{BatchDone, IngestError};
use super::shard::ShardStats;
use super::CapturedEvent;

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
