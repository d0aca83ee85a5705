//! Event ingestion: decode → normalize → write-ahead log (group-committed fsync) → ingest shard
//! actors (person processing, in-memory tail, Parquet segments).
//!
//! An event is acknowledged only after its WAL record is durable. Shards flush segments on
//! count, bytes, age and shutdown, then record a checkpoint; WAL files wholly below every
//! shard's checkpoint are deleted. On start, uncommitted segment files are rolled back or
//! forward by the checkpoints and the WAL is replayed past them, skipping events whose uuid is
//! already in a segment, so every acknowledged event is stored exactly once.

pub(crate) mod catalog;
pub(crate) mod columns;
pub(crate) mod compaction;
pub(crate) mod decode;
#[cfg(test)]
mod decode_tests;
mod dedup;
mod error;
pub(crate) mod files;
pub(crate) mod messages;
pub(crate) mod normalize;
mod persons;
mod pipeline;
pub(crate) mod read;
pub(crate) mod segment;
pub(crate) mod segment_cache;
mod shard;
pub(crate) mod time;
pub(crate) mod wal;

pub use compaction::CompactionConfig;
pub use decode::{
    decode, CaptureQuery, DecodeError, DecodedRequest, ErrorClass, Limits, Payload, RouteKind,
};
pub use error::IngestError;
pub use messages::ShardStats;
pub use normalize::CapturedEvent;
pub use normalize::{normalize_all, Context as CaptureContext, NormalizeError};
pub use pipeline::{Durability, Ingest, IngestConfig, WalBatch};
pub use read::{EventFilter, Tail};
pub use segment::StoredEvent;
