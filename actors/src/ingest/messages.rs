//! Messages of the ingest shard actor.

use std::sync::Arc;

use actix::Message;

use super::pipeline::{BatchDone, IngestError};
use super::shard::ShardStats;
use super::CapturedEvent;

/// The events of one durable WAL record that belong to this shard (possibly none: every shard
/// receives every record, so each shard's checkpoint advances with the log).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ProcessBatch {
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
