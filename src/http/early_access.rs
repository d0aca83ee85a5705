//! Early-access features: the admin API (`/api/projects/{id}/early_access_feature/`) and the
//! public list the browser SDK reads (`/api/early_access_features/?token=&stage=`).

use actix_web::http::Method;
use actix_web::middleware::from_fn;
use actix_web::{web, HttpRequest, HttpResponse};
use corvid_surfaces::early_access::{FeatureChanges, Stage};
use serde_json::{json, Value};

use super::{cors, project_route, uuid_path};
use crate::auth::scope::{EarlyAccessFeatureRead, EarlyAccessFeatureWrite};
use crate::auth::{actor, public_project, ProjectAccess};
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/api/early_access_features")
            .wrap(from_fn(cors::public))
            .route(web::get().to(public))
            .route(web::method(Method::OPTIONS).to(cors::preflight)),
    );
    project_route(cfg, "/early_access_feature", || web::get().to(list));
    project_route(cfg, "/early_access_feature", || web::post().to(create));
    project_route(cfg, "/early_access_feature/{id}", || web::get().to(get));
    project_route(cfg, "/early_access_feature/{id}", || {
        web::patch().to(update)
    });
    project_route(cfg, "/early_access_feature/{id}", || web::put().to(update));
    project_route(cfg, "/early_access_feature/{id}", || {
        web::delete().to(delete)
    });
}

fn page(results: Vec<Value>) -> HttpResponse {
    HttpResponse::Ok().json(
        json!({"count": results.len(), "next": null, "previous": null,
                                   "results": results}),
    )
}

async fn list(
    access: ProjectAccess<EarlyAccessFeatureRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let features = state.engine.early_access.list(access.project.id).await?;
    Ok(page(features.iter().map(|f| f.admin_json()).collect()))
}

async fn create(
    access: ProjectAccess<EarlyAccessFeatureWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<FeatureChanges>,
) -> Result<HttpResponse, ApiError> {
    let view = state
        .engine
        .early_access
        .create(access.project.id, &actor(&access.credential), body)
        .await?;
    Ok(HttpResponse::Created().json(view.admin_json()))
}

async fn get(
    access: ProjectAccess<EarlyAccessFeatureRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Early access feature")?;
    let view = state.engine.early_access.get(access.project.id, id).await?;
    Ok(HttpResponse::Ok().json(view.admin_json()))
}

async fn update(
    access: ProjectAccess<EarlyAccessFeatureWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<FeatureChanges>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Early access feature")?;
    let view = state
        .engine
        .early_access
        .update(access.project.id, &actor(&access.credential), id, body)
        .await?;
    Ok(HttpResponse::Ok().json(view.admin_json()))
}

async fn delete(
    access: ProjectAccess<EarlyAccessFeatureWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path.1, "Early access feature")?;
    state
        .engine
        .early_access
        .delete(access.project.id, &actor(&access.credential), id)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// `GET /api/early_access_features/?token=…[&stage=…]` (stage repeatable; `beta` by default).
async fn public(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let project = public_project(&state, &req).await?;
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    let stages = pairs
        .iter()
        .filter(|(k, _)| k == "stage")
        .map(|(_, v)| Stage::parse(v))
        .collect::<Result<Vec<_>, _>>()?;
    let features = state.engine.early_access.public(project.id, stages).await?;
    Ok(HttpResponse::Ok().json(json!({"earlyAccessFeatures": features})))
}
