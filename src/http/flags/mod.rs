//! Feature flags: definitions (`/api/projects/{id}/feature_flags/`), evaluation (`/flags`,
//! `/decide`: [`evaluate`]) and definitions for SDK local evaluation ([`local_eval`]).

mod evaluate;
mod local_eval;
mod shapes;
mod v2;

use actix_web::http::Method;
use actix_web::middleware::from_fn;
use actix_web::{web, HttpResponse};
use corvid_actors::flags::model::{FlagDefinition, FlagFilters};
use corvid_actors::flags::store::FlagRecord;
use corvid_actors::flags::validate::validate_flag;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{cors, project_route};
use crate::auth::scope::{FeatureFlagRead, FeatureFlagWrite};
use crate::auth::ProjectAccess;
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/feature_flags", || web::get().to(list));
    project_route(cfg, "/feature_flags", || web::post().to(create));
    project_route(cfg, "/feature_flags/{flag_id}", || web::get().to(get));
    project_route(cfg, "/feature_flags/{flag_id}", || web::patch().to(update));
    project_route(cfg, "/feature_flags/{flag_id}", || web::delete().to(delete));
}

/// The public evaluation and definitions routes (static paths; registered first, see
/// [`super::configure`]).
pub fn configure_public(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/flags")
            .wrap(from_fn(cors::public))
            .route(web::post().to(evaluate::flags))
            .route(web::get().to(evaluate::flags_get))
            .route(web::head().to(evaluate::flags_head))
            .route(web::method(Method::OPTIONS).to(cors::preflight))
            .default_service(web::to(evaluate::not_allowed)),
    )
    .service(
        web::resource("/decide")
            .wrap(from_fn(cors::public))
            .route(web::post().to(evaluate::decide))
            .route(web::get().to(evaluate::flags_get))
            .route(web::head().to(evaluate::flags_head))
            .route(web::method(Method::OPTIONS).to(cors::preflight))
            .default_service(web::to(evaluate::not_allowed)),
    )
    .route("/flags/definitions", web::get().to(local_eval::definitions))
    .route(
        "/api/feature_flag/local_evaluation",
        web::get().to(local_eval::definitions),
    );
}

fn flag_json(r: &FlagRecord) -> Value {
    let d = &r.definition;
    json!({
        "id": d.id,
        "key": d.key,
        "name": d.name,
        "filters": d.filters,
        "active": d.active,
        "deleted": d.deleted,
        "ensure_experience_continuity": d.ensure_experience_continuity,
        "version": d.version,
        "evaluation_runtime": d.evaluation_runtime.as_deref().unwrap_or("all"),
        "evaluation_contexts": d.evaluation_contexts,
        "bucketing_identifier": d.bucketing_identifier,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
    })
}

/// A create or update body in PostHog's shape; on update every field is optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FlagBody {
    key: Option<String>,
    name: Option<String>,
    filters: Option<FlagFilters>,
    active: Option<bool>,
    deleted: Option<bool>,
    ensure_experience_continuity: Option<bool>,
    evaluation_runtime: Option<String>,
    #[serde(alias = "tags", alias = "evaluation_tags")]
    evaluation_contexts: Option<Vec<String>>,
    bucketing_identifier: Option<String>,
}

impl FlagBody {
    fn apply(self, mut d: FlagDefinition) -> FlagDefinition {
        if let Some(v) = self.key {
            d.key = v;
        }
        if let Some(v) = self.name {
            d.name = v;
        }
        if let Some(v) = self.filters {
            d.filters = v;
        }
        if let Some(v) = self.active {
            d.active = v;
        }
        if let Some(v) = self.deleted {
            d.deleted = v;
        }
        if let Some(v) = self.ensure_experience_continuity {
            d.ensure_experience_continuity = v;
        }
        if let Some(v) = self.evaluation_runtime {
            d.evaluation_runtime = Some(v);
        }
        if let Some(v) = self.evaluation_contexts {
            d.evaluation_contexts = v;
        }
        if let Some(v) = self.bucketing_identifier {
            d.bucketing_identifier = Some(v);
        }
        d
    }
}

async fn list(
    access: ProjectAccess<FeatureFlagRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let flags = state.flags_op(move |f| f.flags(project)).await?;
    let results: Vec<Value> = flags
        .iter()
        .filter(|f| !f.definition.deleted)
        .map(flag_json)
        .collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn create(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<FlagBody>,
) -> Result<HttpResponse, ApiError> {
    if body.key.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::validation("This field is required.", Some("key")));
    }
    let project = access.project.id;
    let persons = state.persons.clone();
    let definition = body.apply(FlagDefinition::new(
        String::new(),
        String::new(),
        FlagFilters::default(),
        true,
    ));
    let record = state
        .flags_op(move |f| {
            validate_flag(&definition, persons.group_type_count(project)?)?;
            f.save_flag(project, definition, None)
        })
        .await?;
    Ok(HttpResponse::Created().json(flag_json(&record)))
}

async fn existing(state: &AppState, project: u64, raw: &str) -> Result<FlagRecord, ApiError> {
    let id: i64 = raw
        .parse()
        .map_err(|_| ApiError::not_found("Feature flag"))?;
    let found = state.flags_op(move |f| f.flag(project, id)).await?;
    found
        .filter(|r| !r.definition.deleted)
        .ok_or_else(|| ApiError::not_found("Feature flag"))
}

async fn get(
    access: ProjectAccess<FeatureFlagRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let record = existing(&state, access.project.id, &path.1).await?;
    Ok(HttpResponse::Ok().json(flag_json(&record)))
}

async fn update(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<FlagBody>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let old = existing(&state, project, &path.1).await?;
    let definition = body.apply(old.definition.clone());
    let persons = state.persons.clone();
    let record = state
        .flags_op(move |f| {
            validate_flag(&definition, persons.group_type_count(project)?)?;
            f.save_flag(project, definition, Some(&old))
        })
        .await?;
    Ok(HttpResponse::Ok().json(flag_json(&record)))
}

async fn delete(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let old = existing(&state, project, &path.1).await?;
    let mut definition = old.definition.clone();
    definition.deleted = true;
    state
        .flags_op(move |f| f.save_flag(project, definition, Some(&old)))
        .await?;
    Ok(HttpResponse::NoContent().finish())
}
