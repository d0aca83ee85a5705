//! Persons, distinct ids, groups and usage counters, in sled beside the metadata.
//!
//! Writers are the ingest shards (person processing lives in `ingest::persons`, since it
//! changes the event); every mutation takes
//! the store's writer lock, so concurrent shards see consistent read-modify-write cycles (the
//! lock is the "person actor": one writer at a time). Readers (APIs, flags) never take it.

mod store;

pub use store::{Group, Person, PersonStore, UsageKind, UsageRow};
