//! The one place where errors become HTTP answers.
//!
//! Every handler returns `Result<_, ApiError>`; lower layers' errors convert with `From`. The
//! body is always stable JSON `{"type", "code", "detail", "attr"}` (PostHog's shape). Internal
//! details are logged, never sent.

use std::sync::Arc;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use corvid_endpoints::EndpointError;
use corvid_events::IngestError;
use corvid_events::NormalizeError;
use corvid_events::{DecodeError, ErrorClass};
use corvid_oauth::OAuthError;
use corvid_query::QueryError;
use corvid_surfaces::RecordError;
use corvid_tenancy::StoreError;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No credential, or one we do not recognise: 401 with the OAuth discovery header.
    #[error("{detail}")]
    Unauthenticated {
        detail: &'static str,
        code: &'static str,
        /// URL of our protected-resource metadata, for `WWW-Authenticate`.
        resource_metadata: Arc<str>,
    },
    /// A public route's project token is missing or unknown.
    #[error("{detail}")]
    InvalidProjectToken { detail: &'static str },
    /// A public read route (surveys, early access) got no project token at all.
    #[error("{detail}")]
    MissingProjectToken { detail: &'static str },
    /// The method is never allowed on this resource (e.g. hard-deleting an experiment).
    #[error("{detail}")]
    MethodNotAllowed { detail: &'static str },
    #[error("{detail}")]
    PermissionDenied { detail: String },
    /// A bearer credential without the scope a route needs: 403 whose `WWW-Authenticate`
    /// names the scope (RFC 6750 §3.1), so OAuth clients can ask the user for it.
    #[error("{detail}")]
    InsufficientScope {
        detail: String,
        scope: &'static str,
        resource_metadata: Arc<str>,
    },
    #[error("{what} not found.")]
    NotFound { what: String },
    /// A 404 whose text is not "<what> not found." (PostHog words some differently).
    #[error("{detail}")]
    Missing { detail: String },
    #[error("{detail}")]
    Validation {
        detail: String,
        attr: Option<String>,
    },
    #[error("{detail}")]
    Conflict { detail: String },
    #[error("Request body is larger than the limit of {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    #[error("Request was throttled. Expected available in {retry_after_secs} seconds.")]
    RateLimited { retry_after_secs: u64 },
    #[error("{detail}")]
    Unavailable {
        detail: &'static str,
        retry_after_secs: u64,
    },
    /// A capture payload that could not be decoded (400, 401 or 413 by its class).
    #[error("{0}")]
    Capture(#[source] DecodeError),
    #[error("{0}")]
    Normalize(#[source] NormalizeError),
    /// The ingest pipeline could not take the events (always retryable: 503).
    #[error("{0}")]
    Ingest(#[source] IngestError),
    /// A SQL or insight query that failed (400 for the query's fault, 504 on timeout).
    #[error("{0}")]
    Query(#[source] QueryError),
    /// An error PostHog's endpoint views build themselves: `{"error": detail, ..extra}`.
    #[error("{detail}")]
    Plain {
        status: StatusCode,
        detail: String,
        extra: serde_json::Map<String, serde_json::Value>,
    },
    #[error("internal storage error")]
    Store(#[source] StoreError),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
    /// The handler panicked (`http::recover`): a 500 naming the request id of the log line.
    #[error("An internal error occurred (request {request_id}). It has been logged.")]
    Panicked { request_id: uuid::Uuid },
    /// An error answer the framework wrote itself (an extractor's, a method not allowed),
    /// re-shaped by `http::recover::json_errors`.
    #[error("{detail}")]
    Framework { status: StatusCode, detail: String },
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    code: &'static str,
    detail: String,
    attr: Option<&'a str>,
    /// Where a SQL syntax error is (1-based), for query errors only.
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<Position>,
    /// The id of the log line, for internal errors the log can explain.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
}

#[derive(Serialize)]
struct Position {
    line: u64,
    column: u64,
}

/// `events[i]`, naming the offending event of a capture request.
fn event_attr(index: Option<usize>) -> Option<String> {
    index.map(|i| format!("events[{i}]"))
}

impl ApiError {
    pub fn validation(detail: impl Into<String>, attr: Option<&str>) -> ApiError {
        ApiError::Validation {
            detail: detail.into(),
            attr: attr.map(str::to_string),
        }
    }

    pub fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::NotFound { what: what.into() }
    }

    /// (status, type, code, attr) — exhaustive on purpose: a new variant must decide here.
    fn parts(&self) -> (StatusCode, &'static str, &'static str, Option<&str>) {
        match self {
            ApiError::Unauthenticated { code, .. } => {
                (StatusCode::UNAUTHORIZED, "authentication_error", code, None)
            }
            ApiError::InvalidProjectToken { .. } => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
                None,
            ),
            ApiError::MissingProjectToken { .. } => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing_api_key",
                None,
            ),
            ApiError::MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request",
                "method_not_allowed",
                None,
            ),
            ApiError::PermissionDenied { .. } | ApiError::InsufficientScope { .. } => (
                StatusCode::FORBIDDEN,
                "authentication_error",
                "permission_denied",
                None,
            ),
            ApiError::NotFound { .. } | ApiError::Missing { .. } => {
                (StatusCode::NOT_FOUND, "invalid_request", "not_found", None)
            }
            ApiError::Validation { attr, .. } => (
                StatusCode::BAD_REQUEST,
                "validation_error",
                "invalid_input",
                attr.as_deref(),
            ),
            ApiError::Conflict { .. } => {
                (StatusCode::CONFLICT, "validation_error", "conflict", None)
            }
            ApiError::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                "payload_too_large",
                None,
            ),
            ApiError::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "throttled_error",
                "throttled",
                None,
            ),
            ApiError::Unavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "service_unavailable",
                None,
            ),
            ApiError::Capture(err) => match err.class() {
                ErrorClass::BadRequest => (
                    StatusCode::BAD_REQUEST,
                    "validation_error",
                    "invalid_payload",
                    None,
                ),
                ErrorClass::Unauthorized => (
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "invalid_api_key",
                    None,
                ),
                ErrorClass::TooLarge => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request",
                    "payload_too_large",
                    None,
                ),
            },
            ApiError::Plain { status, .. } => (*status, "validation_error", "invalid_input", None),
            ApiError::Normalize(_) => (
                StatusCode::BAD_REQUEST,
                "validation_error",
                "invalid_payload",
                None,
            ),
            ApiError::Ingest(err) => match err {
                IngestError::Overloaded => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "overloaded",
                    None,
                ),
                IngestError::ShuttingDown
                | IngestError::Wal(_)
                | IngestError::Segment(_)
                | IngestError::Store(_)
                | IngestError::Encode(_)
                | IngestError::ActorGone => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "service_unavailable",
                    None,
                ),
            },
            ApiError::Store(err) => match err {
                StoreError::Invalid { attr, .. } => (
                    StatusCode::BAD_REQUEST,
                    "validation_error",
                    "invalid_input",
                    *attr,
                ),
                StoreError::Conflict { .. } => {
                    (StatusCode::CONFLICT, "validation_error", "conflict", None)
                }
                StoreError::NotFound { .. } => {
                    (StatusCode::NOT_FOUND, "invalid_request", "not_found", None)
                }
                StoreError::Forbidden { .. } => (
                    StatusCode::FORBIDDEN,
                    "authentication_error",
                    "permission_denied",
                    None,
                ),
                StoreError::Unavailable(_) | StoreError::Busy { .. } => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "service_unavailable",
                    None,
                ),
                StoreError::Sled(_)
                | StoreError::Keyspace(_)
                | StoreError::Postgres(_)
                | StoreError::Corrupt { .. }
                | StoreError::SchemaTooNew { .. }
                | StoreError::PasswordHash
                | StoreError::Sequence { .. }
                | StoreError::Encode { .. }
                | StoreError::TaskFailed(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "internal_error",
                    None,
                ),
            },
            ApiError::Query(err) => match err {
                QueryError::Syntax { .. } => (
                    StatusCode::BAD_REQUEST,
                    "validation_error",
                    err.code(),
                    Some("query"),
                ),
                QueryError::Invalid(_)
                | QueryError::UnsupportedFunction(_)
                | QueryError::InvalidInsight(_) => (
                    StatusCode::BAD_REQUEST,
                    "validation_error",
                    err.code(),
                    Some("query"),
                ),
                QueryError::MissingVariable(_) => (
                    StatusCode::BAD_REQUEST,
                    "validation_error",
                    err.code(),
                    Some("variables"),
                ),
                QueryError::MemoryLimit { .. } => (
                    StatusCode::BAD_REQUEST,
                    "validation_error",
                    err.code(),
                    Some("query"),
                ),
                QueryError::Timeout(_) => (
                    StatusCode::GATEWAY_TIMEOUT,
                    "server_error",
                    err.code(),
                    None,
                ),
                QueryError::Busy => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    err.code(),
                    None,
                ),
                QueryError::CredentialBusy => (
                    StatusCode::TOO_MANY_REQUESTS,
                    "throttled_error",
                    err.code(),
                    None,
                ),
                QueryError::Internal(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    err.code(),
                    None,
                ),
            },
            ApiError::Internal(_) | ApiError::Panicked { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
                None,
            ),
            ApiError::Framework { status, .. } => {
                let (kind, code) = match *status {
                    StatusCode::NOT_FOUND => ("invalid_request", "not_found"),
                    StatusCode::METHOD_NOT_ALLOWED => ("invalid_request", "method_not_allowed"),
                    StatusCode::PAYLOAD_TOO_LARGE => ("invalid_request", "payload_too_large"),
                    StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                        ("invalid_request", "unsupported_media_type")
                    }
                    StatusCode::UNAUTHORIZED => ("authentication_error", "not_authenticated"),
                    StatusCode::FORBIDDEN => ("authentication_error", "permission_denied"),
                    StatusCode::TOO_MANY_REQUESTS => ("throttled_error", "throttled"),
                    s if s.is_server_error() => ("server_error", "internal_error"),
                    _ => ("validation_error", "invalid_input"),
                };
                (*status, kind, code, None)
            }
        }
    }

    /// What the client is told. Store errors that are the caller's fault keep their message;
    /// internal ones are replaced by a generic text (the details go to the log).
    fn public_detail(&self) -> String {
        match self {
            ApiError::Store(
                err @ (StoreError::Invalid { .. }
                | StoreError::Conflict { .. }
                | StoreError::NotFound { .. }
                | StoreError::Forbidden { .. }
                | StoreError::Busy { .. }),
            ) => err.to_string(),
            ApiError::Store(_)
            | ApiError::Internal(_)
            | ApiError::Query(QueryError::Internal(_)) => {
                "An internal error occurred. It has been logged.".into()
            }
            ApiError::Ingest(IngestError::Overloaded) => {
                "Ingest buffers are full; retry shortly.".into()
            }
            ApiError::Ingest(_) => "Transient error, please retry.".into(),
            other => other.to_string(),
        }
    }
}

impl From<DecodeError> for ApiError {
    fn from(err: DecodeError) -> Self {
        ApiError::Capture(err)
    }
}

impl From<NormalizeError> for ApiError {
    fn from(err: NormalizeError) -> Self {
        ApiError::Normalize(err)
    }
}

impl From<IngestError> for ApiError {
    fn from(err: IngestError) -> Self {
        ApiError::Ingest(err)
    }
}

impl From<QueryError> for ApiError {
    fn from(err: QueryError) -> Self {
        ApiError::Query(err)
    }
}

impl From<EndpointError> for ApiError {
    fn from(err: EndpointError) -> Self {
        match err {
            EndpointError::Invalid { attr, detail } => ApiError::Validation { detail, attr },
            EndpointError::Plain {
                status,
                detail,
                extra,
            } => ApiError::Plain {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                detail,
                extra,
            },
            EndpointError::NotFound => ApiError::not_found("Endpoint"),
            EndpointError::MissingVariable { id } => ApiError::not_found(format!("Variable {id}")),
            EndpointError::Throttled { retry_after_secs } => {
                ApiError::RateLimited { retry_after_secs }
            }
            EndpointError::Query(q) => ApiError::Query(q),
            EndpointError::Store(s) => ApiError::Store(s),
            EndpointError::Storage(err) => ApiError::Internal(anyhow::anyhow!(err)),
        }
    }
}

impl From<RecordError> for ApiError {
    fn from(err: RecordError) -> Self {
        match err {
            RecordError::NotFound { what } => ApiError::not_found(what),
            RecordError::Invalid { detail, attr } => ApiError::Validation {
                detail,
                attr: attr.map(str::to_string),
            },
            RecordError::NotAllowed { detail } => ApiError::MethodNotAllowed { detail },
            RecordError::Store(err) => ApiError::Store(err),
            RecordError::Query(err) => ApiError::Query(err),
        }
    }
}

impl From<OAuthError> for ApiError {
    /// Outside the token endpoint (which answers in RFC 6749's format itself), an OAuth
    /// error is a validation error or a storage failure.
    fn from(err: OAuthError) -> Self {
        match err {
            OAuthError::Store(e) => ApiError::Store(e),
            other => ApiError::validation(other.to_string(), None),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        ApiError::Store(err)
    }
}

impl From<actix_web::error::BlockingError> for ApiError {
    fn from(err: actix_web::error::BlockingError) -> Self {
        ApiError::Internal(anyhow::anyhow!("blocking task failed: {err}"))
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.parts().0
    }

    fn error_response(&self) -> HttpResponse {
        let (status, kind, code, attr) = self.parts();
        if status.is_server_error() {
            tracing::error!(error = ?self, "request failed");
        }
        let mut response = HttpResponse::build(status);
        match self {
            ApiError::Unauthenticated {
                resource_metadata, ..
            } => {
                let value = format!("Bearer resource_metadata=\"{resource_metadata}\"");
                if let Ok(value) = HeaderValue::from_str(&value) {
                    response.insert_header((header::WWW_AUTHENTICATE, value));
                }
            }
            ApiError::InsufficientScope {
                scope,
                resource_metadata,
                ..
            } => {
                let value = format!(
                    "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{resource_metadata}\""
                );
                if let Ok(value) = HeaderValue::from_str(&value) {
                    response.insert_header((header::WWW_AUTHENTICATE, value));
                }
            }
            ApiError::RateLimited { retry_after_secs }
            | ApiError::Unavailable {
                retry_after_secs, ..
            } => {
                response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
            }
            ApiError::Ingest(_)
            | ApiError::Store(StoreError::Busy { .. })
            | ApiError::Query(QueryError::Busy | QueryError::CredentialBusy) => {
                response.insert_header((header::RETRY_AFTER, "1"));
            }
            _ => {}
        }
        if let ApiError::Plain { detail, extra, .. } = self {
            let mut body = extra.clone();
            body.insert("error".into(), serde_json::Value::String(detail.clone()));
            return response.json(body);
        }
        let event_attr = match self {
            ApiError::Capture(err) => event_attr(err.event_index()),
            ApiError::Normalize(err) => event_attr(Some(err.event_index())),
            _ => None,
        };
        response.json(ErrorBody {
            kind,
            code,
            detail: self.public_detail(),
            attr: event_attr.as_deref().or(attr),
            position: match self {
                ApiError::Query(QueryError::Syntax { line, column, .. }) => Some(Position {
                    line: *line,
                    column: *column,
                }),
                _ => None,
            },
            request_id: match self {
                ApiError::Panicked { request_id } => Some(request_id.to_string()),
                _ => None,
            },
        })
    }
}
