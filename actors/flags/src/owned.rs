//! The flags other domains own: an early-access feature's flag, a survey's targeting flag, an
//! experiment's flag. Product surfaces create and change them only through [`OwnedFlags`], so
//! every flag, whoever writes it, passes the same validation as the definitions API and the
//! same store rules (one live key per project, every change a new version).

use std::sync::Arc;

use corvid_activity::current_actor;
use corvid_kernel::StoreError;
use corvid_persons::PersonStore;

use crate::model::FlagDefinition;
use crate::store::{FlagRecord, FlagStore};
use crate::validate::validate_flag;

/// The flags door for the domains that own flags. Blocking (sled or PostgreSQL): call it from
/// a blocking context, as the surfaces' facades do. Its writes are logged as the user the
/// caller runs under ([`corvid_activity::acting_as`]).
#[derive(Clone)]
pub struct OwnedFlags {
    store: Arc<FlagStore>,
    persons: Arc<PersonStore>,
}

impl OwnedFlags {
    pub fn new(store: Arc<FlagStore>, persons: Arc<PersonStore>) -> OwnedFlags {
        OwnedFlags { store, persons }
    }

    /// Flag `id` of the project as stored, deleted or not.
    pub fn flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError> {
        self.store.flag(project_id, id)
    }

    /// Every flag of the project, deleted ones included.
    pub fn flags(&self, project_id: u64) -> Result<Vec<FlagRecord>, StoreError> {
        self.store.flags(project_id)
    }

    /// Flag `id` of the project unless it is deleted.
    pub fn live_flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError> {
        self.store.live_flag(project_id, id)
    }

    /// The project's live flag with this key.
    pub fn live_flag_by_key(
        &self,
        project_id: u64,
        key: &str,
    ) -> Result<Option<FlagRecord>, StoreError> {
        self.store.live_flag_by_key(project_id, key)
    }

    /// Whether the project has any flag to evaluate, from the in-memory snapshot when this
    /// node holds one (`None` when it does not: ask [`OwnedFlags::has_flags`]).
    pub fn cached_has_flags(&self, project_id: u64) -> Option<bool> {
        self.store
            .cached_snapshot(project_id)
            .map(|snapshot| !snapshot.flags.is_empty())
    }

    /// Whether the project has any flag to evaluate, loading its snapshot when needed.
    pub fn has_flags(&self, project_id: u64) -> Result<bool, StoreError> {
        Ok(!self.store.snapshot(project_id)?.flags.is_empty())
    }

    /// Validates and stores a new flag (id and version 1 assigned). A live flag with the same
    /// key fails with `Invalid { attr: "key" }`, on any node.
    pub fn create(
        &self,
        project_id: u64,
        definition: FlagDefinition,
    ) -> Result<FlagRecord, StoreError> {
        validate_flag(&definition, self.persons.group_type_count(project_id)?)?;
        self.store
            .create_flag(project_id, &current_actor(), definition)
    }

    /// Applies `change` to a live flag, validates the result and stores it as the next version,
    /// exclusive against every other writer; a change that leaves the flag as it was is not
    /// written. `None` when the flag is gone.
    pub fn modify(
        &self,
        project_id: u64,
        id: i64,
        change: impl FnOnce(&mut FlagDefinition),
    ) -> Result<Option<FlagRecord>, StoreError> {
        let group_types = self.persons.group_type_count(project_id)?;
        self.store
            .modify_flag(project_id, id, &current_actor(), change, |definition| {
                if definition.deleted {
                    return Ok(());
                }
                validate_flag(definition, group_types)
            })
    }

    /// Takes back a flag created for a record whose own write then failed, so no flag is left
    /// pointing at a record that does not exist: the flag is soft-deleted, as the definitions
    /// API deletes. Logged, not returned: the record's error is the one the caller reports.
    pub fn withdraw(&self, project_id: u64, id: i64) {
        let result = self.store.modify_flag(
            project_id,
            id,
            &current_actor(),
            |f| f.deleted = true,
            |_| Ok(()),
        );
        if let Err(e) = result {
            tracing::error!(project_id, flag_id = id, error = %e,
                "a flag created for a record that failed to save could not be withdrawn");
        }
    }
}
