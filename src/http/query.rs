//! `POST /api/projects/{id}/query/` (and `/api/environments/{id}/query/`): HogQL SQL, trends
//! and retention. The handler decodes the request and hands it to the query engine, which runs
//! it on its own runtime; shaping lives in `corvid_query`.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use chrono_tz::Tz;
use corvid_query::QueryKind;
use serde::Deserialize;
use serde_json::Value;

use super::project_route;
use crate::auth::scope::QueryRead;
use crate::auth::ProjectAccess;
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/query", || web::post().to(run));
}

/// The request envelope. PostHog clients also send `refresh`, `client_query_id`, `name` and
/// `async`; they are accepted and have no effect (queries always run synchronously here).
#[derive(Deserialize)]
struct QueryBody {
    query: Value,
    /// Values for `{variables.<code_name>}`, by code name; override those stored in the query.
    #[serde(default)]
    variables_override: Option<HashMap<String, Value>>,
}

/// The project's timezone, UTC when unset or unknown.
pub fn project_timezone(name: &str) -> Tz {
    name.parse().unwrap_or(Tz::UTC)
}

/// Decodes the `query` object, naming what is wrong with it.
pub fn parse_query(query: Value) -> Result<QueryKind, ApiError> {
    let kind = query
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_string);
    serde_json::from_value(query).map_err(|e| {
        let detail = match kind {
            None => "query.kind is required (HogQLQuery, TrendsQuery or RetentionQuery).".into(),
            Some(k) if !["HogQLQuery", "TrendsQuery", "RetentionQuery"].contains(&k.as_str()) => {
                format!(
                    "Unsupported query kind {k}: use HogQLQuery, TrendsQuery or RetentionQuery."
                )
            }
            Some(k) => format!("Invalid {k}: {e}"),
        };
        ApiError::validation(detail, Some("query"))
    })
}

async fn run(
    access: ProjectAccess<QueryRead>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<QueryBody>,
) -> Result<HttpResponse, ApiError> {
    let key = access.credential.limit_key();
    state.rate_limits.query_per_key.check(&key)?;
    let _running = state.engine.query.admit(&key)?;
    let kind = parse_query(body.query)?;
    let tz = project_timezone(&access.project.timezone);
    let variables = body.variables_override.unwrap_or_default();
    let answer = state
        .engine
        .query
        .insight(access.project.id, tz, kind, &variables)
        .await?;
    Ok(HttpResponse::Ok().json(answer.into_response(tz)))
}
