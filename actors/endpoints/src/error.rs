//! The endpoints layer's one error type. The service maps each variant to HTTP in one place
//! (`corvid::error`); the texts are PostHog's, so clients that match on them keep working.

use serde_json::{Map, Value};
use thiserror::Error;

use corvid_kernel::StoreError;
use corvid_query::QueryError;

#[derive(Debug, Error)]
pub enum EndpointError {
    /// 404 for a missing insight variable.
    #[error("Variable {id} not found.")]
    MissingVariable { id: String },
    /// A field-level validation error: 400 `{type: "validation_error", detail, attr}`.
    #[error("{detail}")]
    Invalid {
        attr: Option<String>,
        detail: String,
    },
    /// Errors PostHog's view builds itself, rendered as `{"error": detail, ..extra}`.
    #[error("{detail}")]
    Plain {
        status: u16,
        detail: String,
        extra: Map<String, Value>,
    },
    /// 404 for a missing endpoint (or an inactive one: it is not runnable).
    #[error("Endpoint not found.")]
    NotFound,
    #[error("{0}")]
    Query(#[from] QueryError),
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Over the caller's run rate limit.
    #[error("Request was throttled. Expected available in {retry_after_secs} seconds.")]
    Throttled { retry_after_secs: u64 },
    /// The materialized result could not be computed, written or read.
    #[error("materialized result storage failed: {0}")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl EndpointError {
    pub fn invalid(attr: &str, detail: impl Into<String>) -> EndpointError {
        EndpointError::Invalid {
            attr: Some(attr.to_string()),
            detail: detail.into(),
        }
    }

    pub fn plain(status: u16, detail: impl Into<String>) -> EndpointError {
        EndpointError::Plain {
            status,
            detail: detail.into(),
            extra: Map::new(),
        }
    }

    /// The HTTP status a run that failed this way answers, for its log line's `status=`.
    pub fn http_status(&self) -> u16 {
        match self {
            EndpointError::Invalid { .. } => 400,
            EndpointError::Plain { status, .. } => *status,
            EndpointError::NotFound | EndpointError::MissingVariable { .. } => 404,
            EndpointError::Throttled { .. } => 429,
            EndpointError::Query(QueryError::Timeout(_)) => 504,
            EndpointError::Query(QueryError::Busy) => 503,
            EndpointError::Query(QueryError::CredentialBusy) => 429,
            EndpointError::Query(QueryError::Internal(_))
            | EndpointError::Store(_)
            | EndpointError::Storage(_) => 500,
            EndpointError::Query(_) => 400,
        }
    }

    /// The token a failed run's log line carries as `error=` (a code name, never values).
    pub fn log_code(&self) -> String {
        match self {
            EndpointError::Invalid { .. } | EndpointError::Plain { .. } => {
                "validation_error".into()
            }
            EndpointError::NotFound | EndpointError::MissingVariable { .. } => "not_found".into(),
            EndpointError::Throttled { .. } => "throttled".into(),
            EndpointError::Query(q) => q.code().into(),
            EndpointError::Store(_) => "StoreError".into(),
            EndpointError::Storage(_) => "StorageError".into(),
        }
    }
}
