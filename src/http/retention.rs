//! The days retention dropped from a project (`GET …/retention_drops/`, newest first): what
//! went, when, under which setting, and how many events the day held.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use serde_json::{json, Value};

use super::project_route;
use crate::auth::scope::ProjectRead;
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/retention_drops", || web::get().to(drops));
}

async fn drops(
    req: actix_web::HttpRequest,
    access: ProjectAccess<ProjectRead>,
    state: web::Data<AppState>,
    params: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let (ingest, project) = (state.engine.ingest.clone(), access.project.id);
    let drops = web::block(move || ingest.retention_drops(project))
        .await?
        .map_err(ApiError::Ingest)?;
    let rows: Vec<Value> = drops
        .iter()
        .rev()
        .map(|d| {
            json!({
                "day": d.day,
                "events": d.rows,
                "files": d.files,
                "event_retention_days": d.retention_days,
                "dropped_at": d.dropped_at,
            })
        })
        .collect();
    super::paged(&req, &state, &params, rows)
}
