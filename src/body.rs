//! Reading request bodies within the configured limit, and strict JSON parsing whose errors name
//! the offending field.

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::web::{Bytes, BytesMut};
use actix_web::{FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// Reads the whole body, failing with 413 as soon as it exceeds `limit` bytes (a declared
/// `Content-Length` over the limit fails before anything is read).
pub async fn read_body(
    req: &HttpRequest,
    mut payload: Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|err| match err {
            actix_web::error::PayloadError::Overflow => ApiError::PayloadTooLarge { limit },
            other => {
                ApiError::validation(format!("Could not read the request body: {other}"), None)
            }
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Parses JSON into `T`, mapping serde's errors to 400s that name the field (`attr`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::validation(
            "Request body is empty; expected JSON.",
            None,
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.to_string();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::validation(format!("Malformed JSON: {message}"), None);
        }
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next());
        // For an unknown field the path already ends with the field's name.
        let attr = match (unknown, path.as_str()) {
            (Some(field), "." | "") => Some(field.to_string()),
            (_, "." | "") => None,
            (_, path) => Some(path.to_string()),
        };
        ApiError::Validation {
            detail: message,
            attr,
        }
    })
}

/// A JSON object body that may be left out (an action such as `unpause` whose fields are all
/// optional): an empty body is `{}`.
pub fn optional_json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    parse_json(bytes)
}

/// A JSON body parsed strictly into `T` (use `#[serde(deny_unknown_fields)]` on `T`).
pub struct ValidJson<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for ValidJson<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let payload = payload.take();
        Box::pin(async move {
            let limit = body_limit(&req);
            let body = read_body(&req, payload, limit).await?;
            parse_json(&body).map(ValidJson)
        })
    }
}

/// The configured wire limit for request bodies.
pub fn body_limit(req: &HttpRequest) -> usize {
    req.app_data::<actix_web::web::Data<AppState>>()
        .map(|state| state.config.limits.max_body_bytes)
        .unwrap_or(crate::config::Config::defaults().limits.max_body_bytes)
}
