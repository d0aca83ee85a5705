//! Persons, distinct ids, groups and usage counters.
//!
//! Writers are the ingest shards (person processing lives in the events crate, since it
//! changes the event); every mutation takes the store's writer lock, so concurrent shards see
//! consistent read-modify-write cycles (the lock is the "person actor": one writer at a time).
//! Readers (APIs, flags) never take it. Records live behind [`PersonRecords`] ([`SledPersons`]
//! in the embedded default). [`Persons`] is the door the service uses.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod model;
mod pg_store;
pub(crate) mod records;
mod sled_store;
mod store;

use std::sync::Arc;

pub use model::{Group, Person, UsageKind, UsageRow, MAX_GROUP_TYPES};
pub use pg_store::PgPersons;
pub use records::{PersonRecords, Touched};
pub use sled_store::SledPersons;
pub use store::PersonStore;

use corvid_kernel::{blocking, StoreError};

/// The persons facade the service uses. Cheap to clone.
#[derive(Clone)]
pub struct Persons {
    store: Arc<PersonStore>,
}

impl Persons {
    pub fn new(store: Arc<PersonStore>) -> Persons {
        Persons { store }
    }

    /// A project's persons, or the one person of `distinct_id`.
    pub async fn persons(
        &self,
        project_id: u64,
        distinct_id: Option<String>,
    ) -> Result<Vec<Person>, StoreError> {
        let store = Arc::clone(&self.store);
        blocking(move || match distinct_id {
            Some(did) => Ok(store
                .person_by_distinct_id(project_id, &did)?
                .into_iter()
                .collect()),
            None => store.persons(project_id),
        })
        .await
    }

    /// A project's groups, optionally of one type.
    pub async fn groups(
        &self,
        project_id: u64,
        index: Option<u8>,
    ) -> Result<Vec<Group>, StoreError> {
        let store = Arc::clone(&self.store);
        blocking(move || store.groups(project_id, index)).await
    }

    pub async fn group(
        &self,
        project_id: u64,
        index: u8,
        key: &str,
    ) -> Result<Option<Group>, StoreError> {
        let (store, key) = (Arc::clone(&self.store), key.to_string());
        blocking(move || store.group(project_id, index, &key)).await
    }

    /// Group types as `(name, index)`, by index.
    pub async fn group_types(&self, project_id: u64) -> Result<Vec<(String, u8)>, StoreError> {
        let store = Arc::clone(&self.store);
        blocking(move || store.group_types(project_id)).await
    }

    /// A project's usage by month, oldest first.
    pub async fn usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError> {
        let store = Arc::clone(&self.store);
        blocking(move || store.usage(project_id)).await
    }

    /// Writes the flag-request counts kept in memory.
    pub async fn flush_usage(&self) -> Result<(), StoreError> {
        let store = Arc::clone(&self.store);
        blocking(move || store.flush_pending_usage()).await
    }
}

/// The PostgreSQL schema of this crate's tables (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[corvid_kernel::Migration {
    version: 3,
    name: "persons",
    sql: include_str!("../migrations/0003_persons.sql"),
}];
