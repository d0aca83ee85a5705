use std::marker::PhantomData;
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use corvid_tenancy::{Credential, Project};
use futures_util::future::LocalBoxFuture;

use super::bearer::{app_state, require_scope};
use super::scope::RequiredScope;
use super::Authed;
use crate::error::ApiError;
use crate::state::AppState;
use crate::telemetry::RequestProject;

/// A bearer credential with scope `S` that may act on the project named by the route's
/// `{project_id}` segment. Every project route takes this, so isolation holds by construction.
pub struct ProjectAccess<S: RequiredScope> {
    pub credential: Arc<Credential>,
    pub project: Arc<Project>,
    _scope: PhantomData<S>,
}

impl<S: RequiredScope> FromRequest for ProjectAccess<S> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let authed = Authed::<S>::from_request(&req, payload);
        Box::pin(async move {
            let Authed { credential, .. } = authed.await?;
            let state = app_state(&req)?;
            let raw = req.match_info().get("project_id").unwrap_or_default();
            let id: u64 = raw
                .parse()
                .map_err(|_| ApiError::not_found(format!("Project {raw}")))?;
            let project = load_project(&state, id).await?;
            // A project of another organization is reported as missing: no existence leak.
            let project = project
                .filter(|p| credential.can_see_project(p))
                .ok_or_else(|| ApiError::not_found(format!("Project {id}")))?;
            if !credential.allows_project(&project) {
                return Err(ApiError::PermissionDenied {
                    detail: format!("This API key does not have access to project {id}."),
                });
            }
            require_scope(&state, &credential, S::SCOPE)?;
            req.extensions_mut().insert(RequestProject(project.id));
            Ok(ProjectAccess {
                credential,
                project,
                _scope: PhantomData,
            })
        })
    }
}

/// A project by id, from the cache or the store.
pub(crate) async fn load_project(
    state: &AppState,
    id: u64,
) -> Result<Option<Arc<Project>>, ApiError> {
    Ok(state.engine.tenancy.project(id).await?)
}
