//! Event ingestion: decode → normalize → write-ahead log (group-committed fsync) → ingest shard
//! actors (person processing, in-memory tail, Parquet segments).
//!
//! An event is acknowledged only after its WAL record is durable. Shards flush segments on
//! count, bytes, age and shutdown, then record a checkpoint; WAL files wholly below every
//! shard's checkpoint are deleted. On start, uncommitted segment files are rolled back or
//! forward by the checkpoints and the WAL is replayed past them, skipping events whose uuid is
//! already in a segment, so every acknowledged event is stored exactly once.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod backups;
mod catalog;
mod columns;
mod compaction;
mod decode;
#[cfg(test)]
mod decode_tests;
mod dedup;
mod error;
mod files;
mod mapped;
mod messages;
mod normalize;
mod persons;
mod pipeline;
mod property_keys;
mod raw_properties;
mod read;
mod segment;
mod segment_bounds;
mod segment_cache;
mod shard;
mod time;
mod wal;

pub use compaction::{
    first_kept_day, CompactionConfig, ErasureConfig, ErasureReport, RetentionPolicy,
};
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

// The read door: what the query engine (and the engine that composes it) reads the stored
// events through. Committed segments are listed by a catalog and read from a file store; the
// in-memory tails hold what the shards have not flushed yet; property columns say which
// properties a segment stores as columns of their own.
pub use catalog::{
    write_committed, DayDrop, DirCatalog, PgCatalog, SegmentCatalog, SegmentName, SegmentRef,
};
pub use columns::PropertyColumns;

// What a backup of an embedded node copies of the events: the segment directory's files, the
// WAL's, and the pin that keeps them in place meanwhile.
pub use backups::{BackupPin, Backups};
pub use catalog::backup_files as segment_backup_files;
pub use compaction::Compactor;
pub use files::{ProjectBytes, SegmentFiles, SEGMENTS_URL};
pub use read::snapshot as tail_snapshot;
pub use segment::{
    materialized_column, schema as segment_schema, schema_with as segment_schema_with,
    to_record_batch_with as segment_batch, write_segment,
};
pub use segment_cache::CachedSegments;
pub use wal::backup_files as wal_backup_files;

/// Builders the tests of this crate and of the crates that read events share.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;

/// The PostgreSQL schema of this crate's tables (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[
    corvid_kernel::Migration {
        version: 7,
        name: "segments",
        sql: include_str!("../migrations/0007_segments.sql"),
    },
    corvid_kernel::Migration {
        version: 10,
        name: "retention_drops",
        sql: include_str!("../migrations/0010_retention_drops.sql"),
    },
];
