//! Definitions for SDK local evaluation (`/flags/definitions`,
//! `/api/feature_flag/local_evaluation`), with an ETag.

use std::collections::HashMap;

use actix_web::http::header;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use corvid_flags::LocalEvaluation;

use crate::auth::scope::FeatureFlagRead;
use crate::auth::{resolve_project_token, Authed};
use crate::error::ApiError;
use crate::state::AppState;
use crate::telemetry::RequestProject;

/// Definitions for SDK local evaluation, for a key that may read the token's project.
pub(super) async fn definitions(
    req: HttpRequest,
    auth: Authed<FeatureFlagRead>,
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let token = query
        .get("token")
        .or_else(|| query.get("api_key"))
        .cloned()
        .unwrap_or_default();
    let project = resolve_project_token(&state, &token).await?;
    if !auth.credential.allows_project(&project) {
        return Err(ApiError::PermissionDenied {
            detail: "This API key does not have access to that project.".into(),
        });
    }
    req.extensions_mut().insert(RequestProject(project.id));
    let LocalEvaluation { body, etag } = state.engine.flags.local_evaluation(project.id).await?;
    let matches = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    if matches {
        return Ok(HttpResponse::NotModified()
            .insert_header((header::ETAG, etag))
            .finish());
    }
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag))
        .content_type("application/json")
        .body(body))
}
