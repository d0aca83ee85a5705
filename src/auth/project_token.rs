use std::collections::HashMap;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::web::Bytes;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use corvid_tenancy::Project;
use futures_util::future::LocalBoxFuture;
use serde::Deserialize;

use super::bearer::app_state;
use crate::body::read_body;
use crate::error::ApiError;
use crate::state::AppState;
use crate::telemetry::RequestProject;

/// A public route's project, identified by its project token (`phc_…`) in the JSON body's
/// `api_key` or `token` field, or else the `token` / `api_key` query parameter. The raw body is
/// kept so the handler can decode the rest of it.
pub struct ProjectToken {
    pub project: Arc<Project>,
    pub body: Bytes,
}

#[derive(Deserialize)]
struct TokenFields {
    api_key: Option<String>,
    token: Option<String>,
}

impl FromRequest for ProjectToken {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let payload = payload.take();
        Box::pin(async move {
            let state = app_state(&req)?;
            // A public route's body is parsed on the event loop: held to the small limit.
            let body = read_body(&req, payload, state.config.flags_body_limit()).await?;
            let from_body = serde_json::from_slice::<TokenFields>(&body)
                .ok()
                .and_then(|f| f.api_key.or(f.token));
            let from_query = || {
                let query =
                    web::Query::<HashMap<String, String>>::from_query(req.query_string()).ok()?;
                query.get("token").or_else(|| query.get("api_key")).cloned()
            };
            let token = from_body.or_else(from_query).unwrap_or_default();
            let project = resolve_project_token(&state, &token).await?;
            req.extensions_mut().insert(RequestProject(project.id));
            Ok(ProjectToken { project, body })
        })
    }
}

/// The project of a public read route (`/api/surveys/`, `/api/early_access_features/`), by the
/// `token` (or `api_key`) query parameter. 401 `missing_api_key` without one, 401
/// `invalid_api_key` for an unknown one (PostHog's codes for these routes).
pub async fn public_project(state: &AppState, req: &HttpRequest) -> Result<Arc<Project>, ApiError> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    let token = pairs
        .iter()
        .find(|(k, v)| (k == "token" || k == "api_key") && !v.trim().is_empty())
        .map(|(_, v)| v.trim().to_string());
    let Some(token) = token else {
        return Err(ApiError::MissingProjectToken {
            detail:
                "API key not provided. You can find your project API key in your project settings.",
        });
    };
    let project = resolve_project_token(state, &token)
        .await
        .map_err(|err| match err {
            ApiError::InvalidProjectToken { .. } => ApiError::InvalidProjectToken {
                detail: "Project API key invalid. You can find your project API key in your project settings.",
            },
            other => other,
        })?;
    req.extensions_mut().insert(RequestProject(project.id));
    Ok(project)
}

/// Resolves a project token (cache first, then sled). Missing or unknown tokens are a 401.
pub async fn resolve_project_token(
    state: &AppState,
    token: &str,
) -> Result<Arc<Project>, ApiError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(ApiError::InvalidProjectToken {
            detail: "Project token (`api_key` or `token`) was not provided.",
        });
    }
    let project = state.engine.tenancy.project_by_token(token).await?.ok_or(
        ApiError::InvalidProjectToken {
            detail: "Project token is not valid.",
        },
    )?;
    Ok(project)
}

#[cfg(test)]
mod tests {
    use actix_web::{test, web, App, HttpResponse};
    use corvid_tenancy::MintKey;

    use super::*;

    async fn echo(token: ProjectToken) -> HttpResponse {
        HttpResponse::Ok().body(format!("{}:{}", token.project.id, token.body.len()))
    }

    #[actix_web::test]
    async fn resolves_tokens_from_body_fields_or_query_and_rejects_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = AppState::for_test(dir.path()).await;
        let defaults = state
            .engine
            .tenancy
            .bootstrap(MintKey::OnFirstRun)
            .await
            .expect("defaults");
        let token = defaults.project.api_token.clone();
        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(state))
                .route("/t", web::post().to(echo)),
        )
        .await;

        for body in [
            format!(r#"{{"api_key":"{token}","event":"x"}}"#),
            format!(r#"{{"token":"{token}"}}"#),
        ] {
            let req = test::TestRequest::post()
                .uri("/t")
                .set_payload(body.clone())
                .to_request();
            let res = test::call_service(&app, req).await;
            assert_eq!(res.status(), 200, "{body}");
            let text = test::read_body(res).await;
            assert_eq!(text, format!("1:{}", body.len()).as_bytes());
        }
        let req = test::TestRequest::post()
            .uri(&format!("/t?token={token}"))
            .set_payload("not json")
            .to_request();
        assert_eq!(test::call_service(&app, req).await.status(), 200);

        for body in [
            r#"{"api_key":"phc_unknown"}"#,
            r#"{"event":"no token"}"#,
            "",
        ] {
            let req = test::TestRequest::post()
                .uri("/t")
                .set_payload(body)
                .to_request();
            let res = test::call_service(&app, req).await;
            assert_eq!(res.status(), 401, "{body}");
        }
    }
}
