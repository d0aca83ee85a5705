//! Persons, distinct ids, groups and usage counters, in sled beside the metadata.
//!
//! Writers are the ingest shards (through [`process::process_event`]); every mutation takes
//! the store's writer lock, so concurrent shards see consistent read-modify-write cycles (the
//! lock is the "person actor": one writer at a time). Readers (APIs, flags) never take it.

pub mod process;
mod store;

pub use process::{process_event, Outcome, PERSONLESS_NAMESPACE};
pub use store::{Group, Person, PersonStore, UsageKind, UsageRow};
