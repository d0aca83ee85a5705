//! Remote config for the browser SDK (`/array/{token}/config`, `/array/{token}/config.js`) and
//! the SDK's lazily loaded scripts (`/static/*`, redirected to the configured asset host).
//! Public: the token in the path names the project.

use actix_web::http::{header, Method};
use actix_web::middleware::from_fn;
use actix_web::{web, HttpRequest, HttpResponse};
use corvid_surfaces::remote_config::check_token;

use super::cors;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/array/{token}/config")
            .wrap(from_fn(cors::public))
            .route(web::get().to(config_json))
            .route(web::method(Method::OPTIONS).to(cors::preflight)),
    )
    .service(
        web::resource("/array/{token}/config.js")
            .wrap(from_fn(cors::public))
            .route(web::get().to(config_js))
            .route(web::method(Method::OPTIONS).to(cors::preflight)),
    )
    .service(
        web::resource("/static/{path:.+}")
            .wrap(from_fn(cors::public))
            .route(web::get().to(static_asset))
            .route(web::method(Method::OPTIONS).to(cors::preflight)),
    );
}

/// The project's remote config, after the token's shape is checked (400) and it is found (404).
async fn remote_config(
    state: &AppState,
    token: &str,
) -> Result<corvid_surfaces::remote_config::ConfigDoc, ApiError> {
    check_token(token)?;
    let project = match crate::auth::resolve_project_token(state, token).await {
        Ok(project) => project,
        Err(ApiError::InvalidProjectToken { .. }) => return Err(ApiError::not_found("Project")),
        Err(other) => return Err(other),
    };
    Ok(state.engine.remote_config.config(&project).await?)
}

fn cached(state: &AppState, content_type: &'static str) -> actix_web::HttpResponseBuilder {
    let mut res = HttpResponse::Ok();
    res.content_type(content_type)
        .insert_header((
            header::CACHE_CONTROL,
            format!(
                "public, max-age={}",
                state.config.browser.remote_config_max_age.as_secs()
            ),
        ))
        .insert_header((header::VARY, "Origin, Referer"));
    res
}

async fn config_json(
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let doc = remote_config(&state, &path).await?;
    Ok(cached(&state, "application/json").body(doc.json().to_string()))
}

async fn config_js(
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let doc = remote_config(&state, &path).await?;
    Ok(cached(&state, "application/javascript").body(doc.script()))
}

/// `/static/<path>` → 302 to the same path on `browser.assets_url` (404 when unset).
async fn static_asset(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let base = &state.config.browser.assets_url;
    if base.is_empty() {
        return Err(ApiError::not_found("Static asset"));
    }
    let mut location = format!("{base}{}", req.path());
    if !req.query_string().is_empty() {
        location.push('?');
        location.push_str(req.query_string());
    }
    Ok(HttpResponse::Found()
        .insert_header((header::LOCATION, location))
        .insert_header((header::CACHE_CONTROL, "public, max-age=300"))
        .finish())
}
