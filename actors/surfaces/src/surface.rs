//! What the product-surface domains (remote config, early access, surveys, experiments)
//! share: their error enum.

use corvid_kernel::StoreError;

/// What can go wrong in the product-surface domains (early access, surveys, experiments): one
/// enum for the four facades, since they fail the same ways. The service maps it to HTTP in
/// one place.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{what} not found.")]
    NotFound { what: &'static str },
    /// The caller's input breaks a rule: 400 with the field (`attr`) when one is to blame.
    #[error("{detail}")]
    Invalid {
        detail: String,
        attr: Option<&'static str>,
    },
    /// The operation is never allowed on this resource (e.g. hard-deleting an experiment): 405.
    #[error("{detail}")]
    NotAllowed { detail: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Query(#[from] corvid_query::QueryError),
}

impl RecordError {
    pub(crate) fn invalid(detail: impl Into<String>, attr: &'static str) -> RecordError {
        RecordError::Invalid {
            detail: detail.into(),
            attr: Some(attr),
        }
    }
}

/// Helpers the product surfaces' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use super::RecordError;
    use corvid_flags::{FlagDefinition, FlagStore, OwnedFlags};
    use corvid_persons::PersonStore;

    /// The flags of a sled database, as stored and through the surfaces' door.
    pub fn flags(db: &sled::Db) -> (Arc<FlagStore>, Arc<OwnedFlags>) {
        let store = Arc::new(FlagStore::open(db).expect("flags"));
        let persons = Arc::new(
            PersonStore::open(db, corvid_persons::PersonFiles::temporary()).expect("persons"),
        );
        let owned = Arc::new(OwnedFlags::new(Arc::clone(&store), persons));
        (store, owned)
    }

    /// The detail of a validation error (any other error fails the test).
    pub fn detail(err: RecordError) -> String {
        match err {
            RecordError::Invalid { detail, .. } => detail,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    /// Flag `id` of project 1 as stored.
    pub fn stored_flag(flags: &FlagStore, id: i64) -> FlagDefinition {
        flags.flag(1, id).expect("read").expect("flag").definition
    }
}
