use thiserror::Error;

/// Everything that can go wrong in the metadata store. The service maps each variant to HTTP in
/// one place (`corvid::error`).
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("storage failure")]
    Sled(#[from] sled::Error),
    /// The embedded persons' keyspaces failed (I/O, or a write after a failed sync).
    #[error("storage failure")]
    Keyspace(#[from] fjall::Error),
    /// A PostgreSQL statement failed (cluster mode).
    #[error("metastore failure")]
    Postgres(#[from] tokio_postgres::Error),
    /// The metastore cannot be reached (no connection within the pool's wait).
    #[error("the metastore is unavailable: {0}")]
    Unavailable(String),
    #[error("stored record `{key}` in tree `{tree}` could not be decoded")]
    Corrupt {
        tree: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the data was written by a newer Corvid (schema {found}, this build reads up to {supported})")]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("{what} already exists")]
    Conflict { what: String },
    #[error("{what} was not found")]
    NotFound { what: String },
    #[error("{detail}")]
    Invalid {
        detail: String,
        attr: Option<&'static str>,
    },
    #[error("password hashing failed")]
    PasswordHash,
    #[error("the id sequence `{name}` holds an unreadable value")]
    Sequence { name: String },
    /// A record could not be serialized (a bug: our records always serialize).
    #[error("{what} could not be encoded")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A blocking storage task panicked or was cancelled.
    #[error("a storage task failed: {0}")]
    TaskFailed(String),
    /// The credential may not do this at all, whatever its scopes.
    #[error("{detail}")]
    Forbidden { detail: &'static str },
    /// Bounded work (password verification) is at its limit: retry shortly.
    #[error("{what} is busy; retry shortly")]
    Busy { what: &'static str },
}

impl StoreError {
    pub fn invalid(detail: impl Into<String>, attr: &'static str) -> Self {
        StoreError::Invalid {
            detail: detail.into(),
            attr: Some(attr),
        }
    }
}

impl From<sled::transaction::TransactionError<StoreError>> for StoreError {
    fn from(err: sled::transaction::TransactionError<StoreError>) -> Self {
        match err {
            sled::transaction::TransactionError::Abort(inner) => inner,
            sled::transaction::TransactionError::Storage(e) => StoreError::Sled(e),
        }
    }
}
