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
    #[error("The query needed more memory than it may use ({limit_bytes} bytes, less what other running queries hold of query.node_memory_bytes); narrow it, retry when fewer queries run, or raise query.memory_limit_bytes.")]
    MemoryLimit { limit_bytes: usize },
    /// The node runs as many queries as it may (`query.max_concurrent`): retry shortly.
    #[error("Too many queries are running on this server; retry shortly.")]
    Busy,
    /// This credential runs as many queries as it may (`query.max_concurrent_per_credential`).
    #[error("This credential already runs as many queries as it may at once; retry when one has finished.")]
    CredentialBusy,
    #[error("The query did not finish within {0:?}.")]
    Timeout(Duration),
    /// Reading stored data failed, or DataFusion failed in a way that is not the query's fault.
    #[error("internal query error: {0}")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl QueryError {
    /// The stable code of the error: the one name HTTP bodies and endpoint execution logs
    /// both use.
    pub fn code(&self) -> &'static str {
        match self {
            QueryError::Syntax { .. } => "syntax_error",
            QueryError::Invalid(_)
            | QueryError::UnsupportedFunction(_)
            | QueryError::InvalidInsight(_) => "invalid_query",
            QueryError::MissingVariable(_) => "missing_variable",
            QueryError::MemoryLimit { .. } => "memory_limit_exceeded",
            QueryError::Timeout(_) => "query_timeout",
            QueryError::Busy => "too_many_queries",
            QueryError::CredentialBusy => "too_many_concurrent_queries",
            QueryError::Internal(_) => "internal_error",
        }
    }

    /// A DataFusion error, classified: the query's fault (planning, types, unknown names, bad
    /// values) is a 4xx that names the problem; running out of memory is a 4xx with the
    /// remedy; anything else (I/O, storage, DataFusion's own internal errors) is an engine
    /// fault whose text is logged, never shown.
    pub(crate) fn from_datafusion(
        e: datafusion::error::DataFusionError,
        limit_bytes: usize,
    ) -> Self {
        classify(&e, limit_bytes).unwrap_or_else(|| QueryError::Internal(Box::new(e)))
    }
}

/// The query's fault in `e`, wherever DataFusion wrapped it (context, a collection, an error
/// shared between partitions, an external box); `None` for the engine's own faults.
fn classify(e: &datafusion::error::DataFusionError, limit_bytes: usize) -> Option<QueryError> {
    use datafusion::arrow::error::ArrowError as A;
    use datafusion::error::DataFusionError as D;
    Some(match e {
        D::ResourcesExhausted(_) => QueryError::MemoryLimit { limit_bytes },
        D::SQL(e, _) => QueryError::Invalid(e.to_string()),
        D::Plan(msg) => match unknown_function(msg) {
            Some(name) => QueryError::UnsupportedFunction(name),
            None => QueryError::Invalid(first_line(msg)),
        },
        D::SchemaError(e, _) => QueryError::Invalid(first_line(&e.to_string())),
        D::NotImplemented(msg) => {
            QueryError::Invalid(format!("Not supported: {}", first_line(msg)))
        }
        // Our functions report bad arguments this way; DataFusion reports its own
        // invariants as `Internal`, which stays the engine's fault.
        D::Execution(msg) => QueryError::Invalid(first_line(msg)),
        D::ArrowError(e, _) => classify_arrow(e, limit_bytes)?,
        D::Context(_, inner) | D::Diagnostic(_, inner) => classify(inner, limit_bytes)?,
        D::Collection(errors) => classify(errors.first()?, limit_bytes)?,
        D::Shared(inner) => classify(inner, limit_bytes)?,
        D::External(inner) => {
            if let Some(df) = inner.downcast_ref::<D>() {
                classify(df, limit_bytes)?
            } else if let Some(arrow) = inner.downcast_ref::<A>() {
                classify_arrow(arrow, limit_bytes)?
            } else {
                return None;
            }
        }
        _ => return None,
    })
}

fn classify_arrow(
    e: &datafusion::arrow::error::ArrowError,
    limit_bytes: usize,
) -> Option<QueryError> {
    use datafusion::arrow::error::ArrowError as A;
    Some(match e {
        A::DivideByZero => QueryError::Invalid("Division by zero.".into()),
        A::CastError(msg) | A::ParseError(msg) | A::InvalidArgumentError(msg) => {
            QueryError::Invalid(first_line(msg))
        }
        A::ComputeError(msg) if msg.contains("overflow") => QueryError::Invalid(first_line(msg)),
        A::MemoryError(_) => QueryError::MemoryLimit { limit_bytes },
        A::ExternalError(inner) => {
            let df = inner.downcast_ref::<datafusion::error::DataFusionError>()?;
            classify(df, limit_bytes)?
        }
        _ => return None,
    })
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

/// DataFusion says "Invalid function 'foo'." for an unknown name.
fn unknown_function(msg: &str) -> Option<String> {
    let rest = msg.split("Invalid function '").nth(1)?;
    Some(rest.split('\'').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::error::ArrowError;
    use datafusion::error::DataFusionError as D;

    use super::*;

    fn classify(e: D) -> QueryError {
        QueryError::from_datafusion(e, 1024)
    }

    #[test]
    fn limits_are_the_callers_with_a_remedy_and_faults_are_ours() {
        let memory = classify(D::ResourcesExhausted("pool".into()));
        assert!(matches!(
            memory,
            QueryError::MemoryLimit { limit_bytes: 1024 }
        ));
        assert!(memory
            .to_string()
            .contains("raise query.memory_limit_bytes"));
        assert_eq!(memory.code(), "memory_limit_exceeded");
        let shared = classify(D::Shared(std::sync::Arc::new(D::ResourcesExhausted(
            "x".into(),
        ))));
        assert!(matches!(shared, QueryError::MemoryLimit { .. }));
        let wrapped = classify(D::Context(
            "ctx".into(),
            Box::new(D::ResourcesExhausted("x".into())),
        ));
        assert!(matches!(wrapped, QueryError::MemoryLimit { .. }));

        for fault in [
            D::Internal("invariant broken".into()),
            D::IoError(std::io::Error::other("disk")),
            D::ArrowError(
                Box::new(ArrowError::IoError("x".into(), std::io::Error::other("y"))),
                None,
            ),
        ] {
            let e = classify(fault);
            assert!(matches!(e, QueryError::Internal(_)), "{e:?}");
            assert_eq!(e.code(), "internal_error");
        }

        let zero = classify(D::ArrowError(Box::new(ArrowError::DivideByZero), None));
        assert!(matches!(zero, QueryError::Invalid(ref m) if m == "Division by zero."));
        let unknown = classify(D::Plan(
            "Invalid function 'fooBar'.\nDid you mean 'foo'?".into(),
        ));
        assert!(matches!(unknown, QueryError::UnsupportedFunction(ref f) if f == "fooBar"));
    }
}
