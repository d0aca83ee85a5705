//! `/flags` and `/decide` (POST evaluates; GET answers an empty set with the fallback config;
//! HEAD and OPTIONS for browsers), in every query form the SDKs send.

use actix_web::http::header;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_flags::FlagRequestError;
use corvid_flags::{Caller, Flags, Served};
use corvid_kernel::wire::WireInput;
use serde_json::json;

use super::shapes::{add_config, decide_list_body, decide_map_body, legacy_body, v2_response};
use crate::auth::resolve_project_token;
use crate::body::read_body;
use crate::error::ApiError;
use crate::http::header_string;
use crate::state::AppState;
use crate::telemetry::RequestProject;

/// What a flags answer holds when the project's remote config is not at hand (PostHog's
/// fallback config), as the members of a JSON object without its braces.
pub const FALLBACK_CONFIG: &str = "\"config\":{\"enable_collect_everything\":true},\
    \"toolbarParams\":{},\"isAuthenticated\":false,\
    \"supportedCompression\":[\"gzip\",\"gzip-js\",\"lz64\"],\"sessionRecording\":false,\
    \"surveys\":false,\"heatmaps\":false,\"capturePerformance\":false,\
    \"autocaptureExceptions\":false";

/// Headers only browsers send: their presence marks a request from a client runtime. Names
/// made once, not parsed from text on every request.
const BROWSER_HEADERS: [header::HeaderName; 4] = [
    header::ORIGIN,
    header::REFERER,
    header::HeaderName::from_static("sec-fetch-mode"),
    header::HeaderName::from_static("sec-fetch-site"),
];

/// Which endpoint answers: they differ only in response shapes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    Flags,
    /// Legacy `/decide` for old SDKs.
    Decide,
}

/// The query parameters the SDKs send (`v`/`version`, `config`, `compression`, `data`,
/// `only_evaluate_survey_feature_flags`; `ip`, `_`, `ver` and others are accepted and ignored).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FlagsQuery {
    pub version: Option<u32>,
    /// `v`/`version` was given (even unparseable: then it counts as 1).
    pub versioned: bool,
    pub config: Option<bool>,
    pub compression: Option<String>,
    pub data: Option<String>,
    pub only_survey_flags: bool,
}

impl FlagsQuery {
    pub fn parse(query_string: &str) -> FlagsQuery {
        let truthy = |v: &str| {
            ["true", "1", "yes"]
                .iter()
                .any(|t| v.eq_ignore_ascii_case(t))
        };
        let mut q = FlagsQuery::default();
        // Borrowed pairs: every /flags request parses its query.
        for (k, v) in url::form_urlencoded::parse(query_string.as_bytes()) {
            match k.as_ref() {
                "v" | "version" => {
                    q.versioned = true;
                    q.version = Some(v.trim().parse().unwrap_or(1));
                }
                "config" => q.config = Some(truthy(&v)),
                "compression" if !v.is_empty() => q.compression = Some(v.into_owned()),
                "data" if !v.is_empty() => q.data = Some(v.into_owned()),
                "only_evaluate_survey_feature_flags" => q.only_survey_flags = truthy(&v),
                _ => {}
            }
        }
        q
    }
}

/// The body shape of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    V2,
    Legacy,
    DecideList,
    DecideMap,
}

/// PostHog's rules (`rust/feature-flags/src/api/types.rs`, `FlagsQueryParams`): with neither `v` nor `config`, `/flags` behaves as
/// `v=2&config=true`; `/decide` includes config unless `config=false` and maps versions to
/// its older shapes.
pub fn shape(endpoint: Endpoint, q: &FlagsQuery) -> (Shape, bool) {
    let version = q.version.unwrap_or(1);
    match endpoint {
        Endpoint::Flags => match (q.versioned, q.config) {
            (false, None) => (Shape::V2, true),
            (_, config) if version >= 2 => (Shape::V2, config.unwrap_or(false)),
            (_, config) => (Shape::Legacy, config.unwrap_or(false)),
        },
        Endpoint::Decide => {
            let config = q.config.unwrap_or(true);
            match version {
                0 | 1 => (Shape::DecideList, config),
                2 => (Shape::DecideMap, config),
                3 => (Shape::Legacy, config),
                _ => (Shape::V2, config),
            }
        }
    }
}

/// A `/flags` body that could not be decoded (for [`super::super::decoding::within_limits`]).
struct FlagDecodeError(FlagRequestError);

impl From<FlagDecodeError> for ApiError {
    fn from(err: FlagDecodeError) -> ApiError {
        flag_error(err.0)
    }
}

fn flag_error(err: FlagRequestError) -> ApiError {
    match err {
        FlagRequestError::TooLarge(limit) => ApiError::PayloadTooLarge { limit },
        FlagRequestError::MissingDistinctId => {
            ApiError::validation("The request has no distinct_id.", Some("distinct_id"))
        }
        other => ApiError::validation(other.to_string(), None),
    }
}

/// `POST /flags`: evaluates every selected flag for the request's subject.
pub async fn flags(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    evaluate_http(req, payload, state, Endpoint::Flags).await
}

/// `POST /decide`: `v` 1 → list of enabled keys; 2 → map of enabled flags; 3 → the legacy
/// `/flags` shape; 4 and above → the v2 shape. Config is included unless `config=false`.
pub async fn decide(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    evaluate_http(req, payload, state, Endpoint::Decide).await
}

/// `GET /flags`: no evaluation; an empty flag set with the fallback config.
pub async fn flags_get(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = FlagsQuery::parse(req.query_string());
    let empty = json!({"flags": {}, "featureFlags": {}, "errorsWhileComputingFlags": false,
                       "requestId": uuid::Uuid::new_v4(), "evaluatedAt": Utc::now().timestamp_millis()});
    let mut body = empty;
    if let Some(obj) = body.as_object_mut() {
        if q.version.unwrap_or(1) >= 2 {
            obj.remove("featureFlags");
        } else {
            obj.remove("flags");
        }
    }
    add_config(&mut body, FALLBACK_CONFIG)?;
    Ok(HttpResponse::Ok().json(body))
}

/// `HEAD /flags`: 200 with no body.
pub async fn flags_head() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header(header::ContentType::json())
        .finish()
}

/// Any other method: 405 naming the allowed ones.
pub async fn not_allowed() -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed {
        detail: "Method not allowed: use POST (or GET, HEAD, OPTIONS).",
    })
}

/// A kept header's value as text, when present and ASCII.
fn header_text(value: &Option<header::HeaderValue>) -> Option<&str> {
    value.as_ref().and_then(|v| v.to_str().ok())
}

async fn evaluate_http(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    endpoint: Endpoint,
) -> Result<HttpResponse, ApiError> {
    let query = FlagsQuery::parse(req.query_string());
    let decoded_limit = state.config.flags.max_decoded_bytes;
    let body = read_body(&req, payload.into_inner(), state.config.flags_body_limit()).await?;
    // Header values share the request's buffer: kept for the decoder (which may run on the
    // blocking pool) without copying their text.
    let content_type = req.headers().get(header::CONTENT_TYPE).cloned();
    let content_encoding = req.headers().get(header::CONTENT_ENCODING).cloned();
    let (data, compression) = (query.data.clone(), query.compression.clone());
    let decode = move |limit: usize| {
        Flags::decode_request(
            WireInput {
                body: &body,
                query_data: data.as_deref(),
                query_compression: compression.as_deref(),
                content_type: header_text(&content_type),
                content_encoding: header_text(&content_encoding),
            },
            limit,
        )
        .map_err(FlagDecodeError)
    };
    let mut request = super::super::decoding::within_limits(
        &state.decodes,
        decoded_limit,
        decode,
        |err: &FlagDecodeError| matches!(err.0, FlagRequestError::TooLarge(_)),
    )
    .await?;
    request.only_survey_flags = query.only_survey_flags;
    let project =
        resolve_project_token(&state, request.token.as_deref().unwrap_or_default()).await?;
    req.extensions_mut().insert(RequestProject(project.id));
    let caller = Caller {
        user_agent: header_string(&req, header::USER_AGENT),
        browser_headers: BROWSER_HEADERS
            .iter()
            .any(|h| req.headers().contains_key(h)),
        ip: crate::http::client_addr(&req),
    };
    let evaluated = match state
        .engine
        .flags
        .serve(&project, request, caller, Utc::now())
        .await?
    {
        Served::Evaluated(outcome) => outcome,
        // Over quota: not an error status; flags are empty and `quotaLimited` says why.
        Served::QuotaLimited => {
            return Ok(HttpResponse::Ok().json(json!({
                "flags": {},
                "errorsWhileComputingFlags": false,
                "quotaLimited": ["feature_flags"],
                "requestId": uuid::Uuid::new_v4(),
                "evaluatedAt": Utc::now().timestamp_millis(),
            })))
        }
    };

    let (shape, with_config) = shape(endpoint, &query);
    let config = if with_config {
        Some(
            state
                .engine
                .remote_config
                .config(&project)
                .await?
                .flags_members(),
        )
    } else {
        None
    };
    let mut body = match shape {
        Shape::V2 => return Ok(v2_response(&evaluated, config.as_deref())),
        Shape::Legacy => legacy_body(&evaluated),
        Shape::DecideList => decide_list_body(&evaluated),
        Shape::DecideMap => decide_map_body(&evaluated),
    };
    if let Some(members) = &config {
        add_config(&mut body, members)?;
    }
    Ok(HttpResponse::Ok().json(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_forms_and_shapes() {
        let q = FlagsQuery::parse("v=2&compression=base64&ip=1&_=1700000000000&ver=1.449.2");
        assert_eq!(q.version, Some(2));
        assert_eq!(q.compression.as_deref(), Some("base64"));
        assert_eq!(shape(Endpoint::Flags, &q), (Shape::V2, false));
        let q = FlagsQuery::parse("v=2&config=true&only_evaluate_survey_feature_flags=true");
        assert_eq!(shape(Endpoint::Flags, &q), (Shape::V2, true));
        assert!(q.only_survey_flags);
        assert_eq!(
            shape(Endpoint::Flags, &FlagsQuery::parse("")),
            (Shape::V2, true)
        );
        assert_eq!(
            shape(Endpoint::Flags, &FlagsQuery::parse("v=nope")),
            (Shape::Legacy, false)
        );
        assert_eq!(
            shape(Endpoint::Flags, &FlagsQuery::parse("config=true")),
            (Shape::Legacy, true)
        );
        assert_eq!(
            shape(Endpoint::Decide, &FlagsQuery::parse("v=3")),
            (Shape::Legacy, true)
        );
        assert_eq!(
            shape(Endpoint::Decide, &FlagsQuery::parse("v=2&config=false")),
            (Shape::DecideMap, false)
        );
        assert_eq!(
            shape(Endpoint::Decide, &FlagsQuery::parse("")).0,
            Shape::DecideList
        );
        assert_eq!(
            shape(Endpoint::Decide, &FlagsQuery::parse("v=4")).0,
            Shape::V2
        );
        // A malformed query string is not an error: it is ignored.
        assert_eq!(FlagsQuery::parse("%zz=%%"), FlagsQuery::default());
    }

    #[test]
    fn fallback_config_is_json_members() {
        let v: serde_json::Value =
            serde_json::from_str(&format!("{{{FALLBACK_CONFIG}}}")).expect("JSON");
        assert_eq!(
            v["supportedCompression"],
            json!(["gzip", "gzip-js", "lz64"])
        );
    }
}
