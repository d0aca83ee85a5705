//! Persons, distinct ids, groups and usage counters.
//!
//! Writers are the ingest shards (person processing lives in the events crate, since it
//! changes the event); every mutation takes the store's writer lock, so concurrent shards see
//! consistent read-modify-write cycles (the lock is the "person actor": one writer at a time).
//! Readers (APIs, flags) never take it. Records live behind [`PersonRecords`] ([`EmbeddedPersons`]
//! in the embedded default). [`Persons`] is the door the service uses.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod deletion;
mod disk_reads;
mod embedded_store;
mod erasure;
mod files;
mod model;
mod pg_store;
pub(crate) mod records;
mod resident;
mod store;
mod write_behind;

use std::sync::Arc;

pub use deletion::{
    BulkErasure, DeletionError, ErasureSummary, ErasureTargets, PersonRef, StatusFilter,
    MAX_BULK_IDS,
};
pub use embedded_store::EmbeddedPersons;
pub use erasure::{ErasedSet, Erasure, ProjectErasures, HIDE_AFTER_VERIFIED};
pub use files::PersonFiles;
pub use model::{Group, Person, UsageKind, UsageRow, MAX_GROUP_TYPES};
pub use pg_store::PgPersons;
pub use records::{NewIds, PersonRecords, PersonWrite, Touched};
pub use resident::CompactPerson;
pub use store::{ErasureOptions, MemoryStats, PersonStore, DEFAULT_PERSON_BUDGET};
pub use write_behind::WriteBehind;

/// What [`delegate_other_person_records`]'s methods name, for crates that use it.
#[doc(hidden)]
pub mod delegated {
    pub use chrono::{DateTime, Utc};
    pub use corvid_activity::ActivityEntry;
    pub use corvid_kernel::StoreError;
}

use chrono::Utc;
use corvid_activity::Actor;
use corvid_kernel::{blocking, StoreError};
use uuid::Uuid;

/// The persons facade the service uses. Cheap to clone.
#[derive(Clone)]
pub struct Persons {
    store: Arc<PersonStore>,
}

impl Persons {
    pub fn new(store: Arc<PersonStore>) -> Persons {
        Persons { store }
    }

    /// What memory holds of the persons now (cheap: counts under each shard's lock).
    pub fn memory(&self) -> MemoryStats {
        self.store.memory()
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

    /// The person a path names; `None` when there is none (numeric ids name nobody: Corvid
    /// keeps none).
    pub async fn person(
        &self,
        project_id: u64,
        person: PersonRef,
    ) -> Result<Option<Person>, StoreError> {
        let PersonRef::Uuid(id) = person else {
            return Ok(None);
        };
        let store = Arc::clone(&self.store);
        blocking(move || store.person(project_id, id)).await
    }

    /// Erases the persons `request` names: each person's request is recorded (its events
    /// captured until now are hidden from every read at once and removed from storage by the
    /// compactor), then its profile and distinct ids are deleted unless `keep_person`. Each
    /// request commits with its activity entry, as `actor`'s (scope `Person`).
    pub async fn erase(
        &self,
        project_id: u64,
        actor: &Actor,
        request: BulkErasure,
    ) -> Result<ErasureSummary, StoreError> {
        let store = Arc::clone(&self.store);
        let actor = actor.clone();
        blocking(move || {
            let now = Utc::now();
            let mut persons: Vec<Uuid> = match &request.targets {
                ErasureTargets::Ids(ids) => ids
                    .iter()
                    .filter_map(|id| Uuid::try_parse(id).ok())
                    .map(|id| Ok(store.person(project_id, id)?.map(|p| p.id)))
                    .filter_map(Result::transpose)
                    .collect::<Result<_, StoreError>>()?,
                ErasureTargets::DistinctIds(ids) => ids
                    .iter()
                    .map(|did| store.person_id_by_distinct_id(project_id, did))
                    .filter_map(Result::transpose)
                    .collect::<Result<_, StoreError>>()?,
            };
            persons.sort_unstable();
            persons.dedup();
            let mut summary = ErasureSummary {
                persons_found: persons.len(),
                events_queued_for_deletion: request.options.delete_events && !persons.is_empty(),
                ..ErasureSummary::default()
            };
            for person in persons {
                match store.erase(project_id, person, &request.options, &actor, now) {
                    Ok(Some(_)) => {
                        if !request.options.keep_person {
                            summary.persons_deleted += 1;
                        }
                    }
                    Ok(None) => {}
                    Err(err) => {
                        tracing::warn!(project_id, %person, error = %err, "a person could not be erased");
                        summary.deletion_errors.push(DeletionError { person_uuid: person });
                    }
                }
            }
            Ok(summary)
        })
        .await
    }

    /// The event erasures of a project, newest request first (PostHog's `deletion_status`).
    pub async fn deletion_status(
        &self,
        project_id: u64,
        status: StatusFilter,
        person: Option<Uuid>,
    ) -> Result<Vec<Erasure>, StoreError> {
        let store = Arc::clone(&self.store);
        let erasures = blocking(move || store.erasures(project_id)).await?;
        Ok(erasures
            .records
            .iter()
            .rev()
            .filter(|e| e.events)
            .filter(|e| person.is_none_or(|p| e.person_uuid == p))
            .filter(|e| match status {
                StatusFilter::All => true,
                StatusFilter::Pending => e.verified_at.is_none(),
                StatusFilter::Completed => e.verified_at.is_some(),
            })
            .cloned()
            .collect())
    }

    /// Every erasure request of a project (profile deletions too), newest first: the
    /// deletions' activity.
    pub async fn deletions(&self, project_id: u64) -> Result<Vec<Erasure>, StoreError> {
        let store = Arc::clone(&self.store);
        let erasures = blocking(move || store.erasures(project_id)).await?;
        Ok(erasures.records.iter().rev().cloned().collect())
    }

    /// Whether `distinct_id` belongs to a person or to an erased one (what
    /// `reset_person_distinct_id` may reset).
    pub async fn distinct_id_known(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<bool, StoreError> {
        let (store, did) = (Arc::clone(&self.store), distinct_id.to_string());
        blocking(move || {
            Ok(store.person_id_by_distinct_id(project_id, &did)?.is_some()
                || store
                    .erasures(project_id)?
                    .records
                    .iter()
                    .any(|e| e.distinct_ids.contains(&did)))
        })
        .await
    }

    /// Removes one property from a person; false when the person does not exist.
    pub async fn unset_property(
        &self,
        project_id: u64,
        person: Uuid,
        key: &str,
    ) -> Result<bool, StoreError> {
        let (store, key) = (Arc::clone(&self.store), key.to_string());
        blocking(move || store.unset_property(project_id, person, &key)).await
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
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[
    corvid_kernel::Migration {
        version: 3,
        name: "persons",
        sql: include_str!("../migrations/0003_persons.sql"),
    },
    corvid_kernel::Migration {
        version: 9,
        name: "person_erasures",
        sql: include_str!("../migrations/0009_person_erasures.sql"),
    },
];
