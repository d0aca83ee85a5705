//! Errors of the query engine. The HTTP layer maps them in one place (`src/error.rs`).

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The SQL does not parse; `line`/`column` are 1-based (0 when unknown).
    #[error("Syntax error: {message} (line {line}, column {column})")]
    Syntax {
        message: String,
        line: u64,
        column: u64,
    },
    /// The query is well-formed but not something we run (statement kind, clause, argument).
    #[error("{0}")]
    Invalid(String),
    #[error("Unsupported function: {0}")]
    UnsupportedFunction(String),
    /// A `{variables.x}` placeholder without a value.
    #[error("Variable {0} is missing from query")]
    MissingVariable(String),
    /// The insight query JSON is not one we understand.
    #[error("{0}")]
    InvalidInsight(String),
    #[error("The query needed more memory than its limit ({limit_bytes} bytes); narrow it or raise query.memory_limit.")]
    MemoryLimit { limit_bytes: usize },
    #[error("The query did not finish within {0:?}.")]
    Timeout(Duration),
    /// Reading stored data failed, or DataFusion failed in a way that is not the query's fault.
    #[error("internal query error: {0}")]
    Internal(String),
}

impl QueryError {
    /// A stable code for the error (HTTP bodies and endpoint execution logs).
    pub fn code(&self) -> &'static str {
        match self {
            QueryError::Syntax { .. } => "syntax_error",
            QueryError::Invalid(_)
            | QueryError::UnsupportedFunction(_)
            | QueryError::InvalidInsight(_) => "invalid_query",
            QueryError::MissingVariable(_) => "missing_variable",
            QueryError::MemoryLimit { .. } => "query_memory_limit",
            QueryError::Timeout(_) => "query_timeout",
            QueryError::Internal(_) => "internal_error",
        }
    }

    /// A DataFusion error, split into the query's fault (planning, types, unknown names) and ours.
    pub(crate) fn from_datafusion(
        e: datafusion::error::DataFusionError,
        limit_bytes: usize,
    ) -> Self {
        use datafusion::error::DataFusionError as D;
        match e {
            D::ResourcesExhausted(_) => QueryError::MemoryLimit { limit_bytes },
            D::SQL(e, _) => QueryError::Invalid(e.to_string()),
            D::Plan(msg) => match unknown_function(&msg) {
                Some(name) => QueryError::UnsupportedFunction(name),
                None => QueryError::Invalid(first_line(&msg)),
            },
            D::SchemaError(e, _) => QueryError::Invalid(first_line(&e.to_string())),
            D::NotImplemented(msg) => {
                QueryError::Invalid(format!("Not supported: {}", first_line(&msg)))
            }
            D::Execution(msg) => QueryError::Invalid(first_line(&msg)),
            D::ArrowError(e, _) => QueryError::Invalid(first_line(&e.to_string())),
            D::Context(_, inner) | D::Diagnostic(_, inner) => {
                QueryError::from_datafusion(*inner, limit_bytes)
            }
            D::Shared(inner) => QueryError::Invalid(first_line(&inner.to_string())),
            other => QueryError::Internal(other.to_string()),
        }
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

/// DataFusion says "Invalid function 'foo'." for an unknown name.
fn unknown_function(msg: &str) -> Option<String> {
    let rest = msg.split("Invalid function '").nth(1)?;
    Some(rest.split('\'').next()?.to_string())
}
