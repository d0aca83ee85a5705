//! Managing endpoints: list, create, update (new versions, activation, materialization),
//! soft delete, version lookup and the OpenAPI document. The update semantics are
//! `changes`'; this is the door the service uses.

use serde_json::Value;

use super::changes::{self, EndpointRequest, Updated};
use super::model::{Endpoint, EndpointVersion};
use super::store::EndpointStore;
use super::{openapi, EndpointError, Endpoints};
use corvid_activity::{acting_as, Actor};
use corvid_kernel::{blocking, StoreError};

/// What an update did.
#[derive(Debug)]
pub enum UpdateOutcome {
    /// The request asked for `deleted: true`.
    Deleted,
    /// The endpoint as it now is, and the version the request targeted.
    Changed {
        endpoint: Endpoint,
        version: Option<u32>,
    },
}

impl Endpoints {
    /// Runs endpoint-store work on the blocking pool.
    pub(super) async fn stored<T: Send + 'static>(
        &self,
        work: impl FnOnce(&EndpointStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, EndpointError> {
        let store = std::sync::Arc::clone(&self.store);
        Ok(blocking(move || work(&store)).await?)
    }

    /// Runs endpoint-store work on the blocking pool, its writes logged as `actor`'s.
    pub(super) async fn stored_as<T: Send + 'static>(
        &self,
        actor: &Actor,
        work: impl FnOnce(&EndpointStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, EndpointError> {
        let store = std::sync::Arc::clone(&self.store);
        let actor = actor.clone();
        Ok(blocking(move || acting_as(&actor, || work(&store))).await?)
    }

    /// A project's endpoints by name; `active` keeps only active (or inactive) ones.
    pub async fn list(
        &self,
        project_id: u64,
        active: Option<bool>,
    ) -> Result<Vec<Endpoint>, EndpointError> {
        let all = self.stored(move |s| s.endpoints(project_id)).await?;
        Ok(all
            .into_iter()
            .filter(|e| active.is_none_or(|a| e.is_active == a))
            .collect())
    }

    /// The endpoint named `name` (active or not).
    pub async fn endpoint(&self, project_id: u64, name: &str) -> Result<Endpoint, EndpointError> {
        self.load(project_id, name)
            .await?
            .map(|e| (*e).clone())
            .ok_or(EndpointError::NotFound)
    }

    /// Creates an endpoint from a create request.
    pub async fn create(
        &self,
        project_id: u64,
        actor: &Actor,
        request: EndpointRequest,
        created_by: Option<String>,
    ) -> Result<Endpoint, EndpointError> {
        let store = std::sync::Arc::clone(&self.store);
        let actor = actor.clone();
        let endpoint = blocking(move || -> Result<Endpoint, EndpointError> {
            let variables = store.variables(project_id)?;
            let endpoint = changes::create(project_id, request, &variables, created_by)?;
            acting_as(&actor, || store.create(&endpoint))?;
            Ok(endpoint)
        })
        .await?;
        if endpoint.versions.iter().any(|v| v.is_materialized()) {
            self.kick_materializer();
        }
        Ok(endpoint)
    }

    /// Applies an update request; `target` is the `?version=` asked for.
    pub async fn update(
        &self,
        project_id: u64,
        actor: &Actor,
        name: &str,
        request: EndpointRequest,
        target: Option<u32>,
    ) -> Result<UpdateOutcome, EndpointError> {
        if request.deleted == Some(true) {
            self.delete(project_id, actor, name).await?;
            return Ok(UpdateOutcome::Deleted);
        }
        let (store, name) = (std::sync::Arc::clone(&self.store), name.to_string());
        let actor = actor.clone();
        let updated = blocking(move || {
            let variables = store.variables(project_id)?;
            acting_as(&actor, || {
                store.update(project_id, &name, |e| {
                    changes::update(e, request, target, &variables)
                })
            })
        })
        .await?;
        let (
            endpoint,
            Updated {
                version,
                kick_materializer,
            },
        ) = updated.ok_or(EndpointError::NotFound)?;
        self.forget(endpoint.id);
        if kick_materializer {
            self.kick_materializer();
        }
        Ok(UpdateOutcome::Changed { endpoint, version })
    }

    /// Soft delete: the name becomes free at once.
    pub async fn delete(
        &self,
        project_id: u64,
        actor: &Actor,
        name: &str,
    ) -> Result<(), EndpointError> {
        let name = name.to_string();
        let deleted = self
            .stored_as(actor, move |s| s.delete(project_id, &name))
            .await?
            .ok_or(EndpointError::NotFound)?;
        self.forget(deleted.id);
        Ok(())
    }

    /// The endpoint's OpenAPI document for one version.
    pub async fn openapi(
        &self,
        endpoint: &Endpoint,
        version: &EndpointVersion,
        base_url: &str,
    ) -> Result<Value, EndpointError> {
        let project_id = endpoint.project_id;
        let variables = self.stored(move |s| s.variables(project_id)).await?;
        Ok(openapi::document(endpoint, version, &variables, base_url))
    }
}

/// `?version=N` as a number, or PostHog's error for a bad one.
pub fn parse_version(raw: Option<&str>) -> Result<Option<u32>, EndpointError> {
    match raw {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| EndpointError::plain(400, format!("Invalid version parameter: {v}"))),
    }
}

/// Version `n` of `endpoint`, or its newest when `n` is `None`.
pub fn pick_version(
    endpoint: &Endpoint,
    n: Option<u32>,
) -> Result<&EndpointVersion, EndpointError> {
    match n {
        Some(n) => endpoint
            .version(n)
            .ok_or_else(|| EndpointError::plain(404, format!("Version {n} not found"))),
        None => endpoint
            .latest()
            .ok_or_else(|| EndpointError::plain(404, "No version found for this endpoint")),
    }
}
