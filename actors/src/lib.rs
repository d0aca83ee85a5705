//! Corvid's engine. Each domain lives beside the actor (or store) that owns its state; the
//! `corvid` service crate only validates HTTP input and hands typed calls to these owners.
//!
//! - [`meta`]: organizations, projects, users and personal API keys in sled.
//! - [`ingest`]: capture decoding, the write-ahead log, ingest shard actors, Parquet segments.
//! - [`persons`]: persons, groups and usage counters in sled.
//! - [`flags`]: feature-flag definitions and in-memory evaluation.
//! - [`query`]: HogQL, trends and retention over the events (DataFusion).
//! - [`endpoints`]: saved queries as versioned APIs, materialization, execution logs.
//! - [`wire`]: the public routes' body decoding, shared by capture and `/flags`.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

#[doc(hidden)]
pub mod bench;
pub mod early_access;
pub mod endpoints;
pub mod engine;
pub mod experiments;
pub mod flags;
pub mod ingest;
pub mod jobs;
pub mod json;
/// The storage kernel, a crate of its own at the bottom of the engine's layers.
pub use corvid_kernel as kernel;
pub mod meta;
pub mod oauth;
pub mod persons;
pub mod query;

pub mod remote_config;
pub mod surface;
pub mod surveys;
/// The public routes' body decoding, in the kernel crate.
pub use corvid_kernel::wire;
