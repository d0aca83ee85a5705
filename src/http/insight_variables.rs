//! `/api/{projects|environments}/{id}/insight_variables/`: the variables SQL endpoints
//! reference as `{variables.<code_name>}`.

use actix_web::{web, HttpResponse};
use chrono::Utc;
use corvid_endpoints::{InsightVariable, VariableChanges, VariableType};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::project_route;
use crate::auth::scope::{InsightVariableRead, InsightVariableWrite};
use crate::auth::{actor, ProjectAccess};
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/insight_variables", || web::get().to(list));
    project_route(cfg, "/insight_variables", || web::post().to(create));
    project_route(cfg, "/insight_variables/{id}", || web::get().to(get));
    project_route(cfg, "/insight_variables/{id}", || web::patch().to(update));
    project_route(cfg, "/insight_variables/{id}", || web::delete().to(delete));
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VariableBody {
    name: Option<String>,
    code_name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<VariableType>,
    default_value: Option<Value>,
    /// Accepted for compatibility with PostHog clients; not used.
    #[serde(default, rename = "values")]
    _values: Option<Value>,
}

fn variable_json(v: &InsightVariable) -> Value {
    json!({
        "id": v.id,
        "name": v.name,
        "code_name": v.code_name,
        "type": v.kind,
        "default_value": v.default_value,
        "created_at": v.created_at,
        "updated_at": v.updated_at,
    })
}

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::not_found(format!("Variable {raw}")))
}

impl From<VariableBody> for VariableChanges {
    /// `values` is accepted for compatibility with PostHog clients and not used.
    fn from(body: VariableBody) -> VariableChanges {
        VariableChanges {
            name: body.name,
            code_name: body.code_name,
            kind: body.kind,
            default_value: body.default_value,
        }
    }
}

async fn list(
    access: ProjectAccess<InsightVariableRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let all = state.engine.endpoints.variables(access.project.id).await?;
    let results: Vec<Value> = all.iter().map(variable_json).collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn create(
    access: ProjectAccess<InsightVariableWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<VariableBody>,
) -> Result<HttpResponse, ApiError> {
    let variable = state
        .engine
        .endpoints
        .create_variable(
            access.project.id,
            &actor(&access.credential),
            body.into(),
            Utc::now(),
        )
        .await?;
    Ok(HttpResponse::Created().json(variable_json(&variable)))
}

async fn get(
    access: ProjectAccess<InsightVariableRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path.into_inner().1)?;
    let v = state
        .engine
        .endpoints
        .variable(access.project.id, id)
        .await?;
    Ok(HttpResponse::Ok().json(variable_json(&v)))
}

async fn update(
    access: ProjectAccess<InsightVariableWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<VariableBody>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path.into_inner().1)?;
    let v = state
        .engine
        .endpoints
        .update_variable(
            access.project.id,
            &actor(&access.credential),
            id,
            body.into(),
            Utc::now(),
        )
        .await?;
    Ok(HttpResponse::Ok().json(variable_json(&v)))
}

async fn delete(
    access: ProjectAccess<InsightVariableWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path.into_inner().1)?;
    state
        .engine
        .endpoints
        .delete_variable(access.project.id, &actor(&access.credential), id)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}
