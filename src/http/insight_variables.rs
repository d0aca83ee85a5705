//! `/api/{projects|environments}/{id}/insight_variables/`: the variables SQL endpoints
//! reference as `{variables.<code_name>}`.

use actix_web::{web, HttpResponse};
use chrono::Utc;
use corvid_actors::endpoints::model::{code_name_from, InsightVariable, VariableType};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::project_route;
use crate::auth::scope::{InsightVariableRead, InsightVariableWrite};
use crate::auth::ProjectAccess;
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
    #[serde(default)]
    values: Option<Value>,
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

/// A code name is what SQL writes after `variables.`: a letter or `_`, then letters, digits, `_`.
fn check_code_name(code: &str) -> Result<(), ApiError> {
    let mut chars = code.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::validation(
            format!("Invalid code_name '{code}': use letters, digits and underscores, starting with a letter."),
            Some("code_name"),
        ))
    }
}

fn check_default(kind: VariableType, value: &Value) -> Result<(), ApiError> {
    let ok = match (kind, value) {
        (_, Value::Null) => true,
        (VariableType::String, Value::String(_)) => true,
        (VariableType::Number, Value::Number(_)) => true,
        (VariableType::Number, Value::String(s)) => s.trim().parse::<f64>().is_ok(),
        (VariableType::Boolean, Value::Bool(_)) => true,
        (VariableType::List, Value::Array(_)) => true,
        (VariableType::List, Value::String(_)) => true,
        (VariableType::Date, Value::String(s)) => {
            chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok()
                || chrono::DateTime::parse_from_rfc3339(s).is_ok()
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::validation(
            format!("default_value does not fit type {kind:?}."),
            Some("default_value"),
        ))
    }
}

async fn list(
    access: ProjectAccess<InsightVariableRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let all = state
        .endpoint_store(move |store| store.variables(project))
        .await?;
    let results: Vec<Value> = all.iter().map(variable_json).collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn create(
    access: ProjectAccess<InsightVariableWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<VariableBody>,
) -> Result<HttpResponse, ApiError> {
    let _ = body.values;
    let name = body
        .name
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| ApiError::validation("This field is required.", Some("name")))?;
    let kind = body
        .kind
        .ok_or_else(|| ApiError::validation("This field is required.", Some("type")))?;
    let code_name = body.code_name.unwrap_or_else(|| code_name_from(&name));
    check_code_name(&code_name)?;
    let default_value = body.default_value.unwrap_or(Value::Null);
    check_default(kind, &default_value)?;
    let now = Utc::now();
    let variable = InsightVariable {
        id: Uuid::new_v4(),
        project_id: access.project.id,
        name,
        code_name,
        kind,
        default_value,
        created_at: now,
        updated_at: now,
    };
    let saved = variable.clone();
    state
        .endpoint_store(move |store| store.save_variable(&saved))
        .await?;
    Ok(HttpResponse::Created().json(variable_json(&variable)))
}

async fn load(state: &AppState, project: u64, id: Uuid) -> Result<InsightVariable, ApiError> {
    state
        .endpoint_store(move |store| store.variable(project, id))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("Variable {id}")))
}

async fn get(
    access: ProjectAccess<InsightVariableRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path.into_inner().1)?;
    let v = load(&state, access.project.id, id).await?;
    Ok(HttpResponse::Ok().json(variable_json(&v)))
}

async fn update(
    access: ProjectAccess<InsightVariableWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<VariableBody>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path.into_inner().1)?;
    let mut v = load(&state, access.project.id, id).await?;
    if let Some(name) = body.name {
        v.name = name;
    }
    if let Some(code) = body.code_name {
        check_code_name(&code)?;
        v.code_name = code;
    }
    if let Some(kind) = body.kind {
        v.kind = kind;
    }
    if let Some(d) = body.default_value {
        v.default_value = d;
    }
    check_default(v.kind, &v.default_value)?;
    v.updated_at = Utc::now();
    let saved = v.clone();
    state
        .endpoint_store(move |store| store.save_variable(&saved))
        .await?;
    Ok(HttpResponse::Ok().json(variable_json(&v)))
}

async fn delete(
    access: ProjectAccess<InsightVariableWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path.into_inner().1)?;
    let project = access.project.id;
    let removed = state
        .endpoint_store(move |store| store.delete_variable(project, id))
        .await?;
    if !removed {
        return Err(ApiError::not_found(format!("Variable {id}")));
    }
    Ok(HttpResponse::NoContent().finish())
}
