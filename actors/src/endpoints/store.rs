//! Endpoints and insight variables in sled. An endpoint is one record (with its versions) keyed
//! by project and name, so a lookup by name is one read; writes go through one lock so that
//! read-modify-write updates (API edits, materializer status) never lose each other.

use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use uuid::Uuid;

use super::model::{Endpoint, InsightVariable};
use crate::kernel::codec::{decode, encode, scan_prefix, u64_key};
use crate::kernel::StoreError;

const ENDPOINTS: &str = "endpoints";
const DELETED: &str = "endpoints_deleted";
const VARIABLES: &str = "insight_variables";

pub struct EndpointStore {
    endpoints: sled::Tree,
    /// Soft-deleted endpoints by id: kept for audit, invisible to the API, name free for reuse.
    deleted: sled::Tree,
    variables: sled::Tree,
    write: Mutex<()>,
    /// Endpoints read since start, by key: runs look endpoints up without touching sled.
    /// Every write goes through this store and refreshes the entry.
    cached: DashMap<Vec<u8>, Arc<Endpoint>>,
}

fn endpoint_key(project_id: u64, name: &str) -> Vec<u8> {
    let mut k = u64_key(project_id).to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

fn variable_key(project_id: u64, id: Uuid) -> Vec<u8> {
    let mut k = u64_key(project_id).to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

impl EndpointStore {
    pub fn open(db: &sled::Db) -> Result<EndpointStore, StoreError> {
        Ok(EndpointStore {
            endpoints: db.open_tree(ENDPOINTS)?,
            deleted: db.open_tree(DELETED)?,
            variables: db.open_tree(VARIABLES)?,
            write: Mutex::new(()),
            cached: DashMap::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic while holding it cannot leave anything half-done.
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A project's endpoints, by name.
    pub fn endpoints(&self, project_id: u64) -> Result<Vec<Endpoint>, StoreError> {
        scan_prefix(&self.endpoints, ENDPOINTS, u64_key(project_id))
    }

    /// Every endpoint of every project (the materializer's schedule scan).
    pub fn all_endpoints(&self) -> Result<Vec<Endpoint>, StoreError> {
        scan_prefix(&self.endpoints, ENDPOINTS, [])
    }

    /// The endpoint if it is in memory already (no I/O): the run path's fast lookup.
    pub fn cached(&self, project_id: u64, name: &str) -> Option<Arc<Endpoint>> {
        self.cached
            .get(&endpoint_key(project_id, name))
            .map(|e| Arc::clone(e.value()))
    }

    /// The endpoint, from memory or sled (then remembered).
    pub fn load(&self, project_id: u64, name: &str) -> Result<Option<Arc<Endpoint>>, StoreError> {
        if let Some(hit) = self.cached(project_id, name) {
            return Ok(Some(hit));
        }
        let _guard = self.lock();
        let found = self.endpoint(project_id, name)?.map(Arc::new);
        if let Some(e) = &found {
            self.cached
                .insert(endpoint_key(project_id, name), Arc::clone(e));
        }
        Ok(found)
    }

    pub fn endpoint(&self, project_id: u64, name: &str) -> Result<Option<Endpoint>, StoreError> {
        let key = endpoint_key(project_id, name);
        self.endpoints
            .get(&key)?
            .map(|v| decode(ENDPOINTS, &key, &v))
            .transpose()
    }

    /// Stores a new endpoint; its name must be free in its project.
    pub fn create(&self, endpoint: &Endpoint) -> Result<(), StoreError> {
        let _guard = self.lock();
        let key = endpoint_key(endpoint.project_id, &endpoint.name);
        if self.endpoints.contains_key(&key)? {
            return Err(StoreError::Invalid {
                detail: format!("An endpoint named '{}' already exists.", endpoint.name),
                attr: Some("name"),
            });
        }
        self.endpoints.insert(key.clone(), encode(endpoint))?;
        self.endpoints.flush()?;
        self.cached.insert(key, Arc::new(endpoint.clone()));
        Ok(())
    }

    /// Read-modify-write of one endpoint. `change` sees the current record and may refuse with
    /// its own error; nothing is written then. `Ok(None)` when there is no such endpoint.
    pub fn update<T, E>(
        &self,
        project_id: u64,
        name: &str,
        change: impl FnOnce(&mut Endpoint) -> Result<T, E>,
    ) -> Result<Option<(Endpoint, T)>, E>
    where
        E: From<StoreError>,
    {
        let _guard = self.lock();
        let Some(mut endpoint) = self.endpoint(project_id, name)? else {
            return Ok(None);
        };
        let out = change(&mut endpoint)?;
        let key = endpoint_key(project_id, name);
        self.endpoints
            .insert(key.clone(), encode(&endpoint))
            .map_err(StoreError::from)?;
        self.endpoints.flush().map_err(StoreError::from)?;
        self.cached.insert(key, Arc::new(endpoint.clone()));
        Ok(Some((endpoint, out)))
    }

    /// Like [`EndpointStore::update`], but only when the endpoint still has `id` (it may have
    /// been deleted and re-created while a materialization ran).
    pub fn update_by_id(
        &self,
        project_id: u64,
        name: &str,
        id: Uuid,
        change: impl FnOnce(&mut Endpoint),
    ) -> Result<bool, StoreError> {
        let done = self.update(project_id, name, |e| {
            if e.id == id {
                change(e);
                Ok::<bool, StoreError>(true)
            } else {
                Ok(false)
            }
        })?;
        Ok(done.is_some_and(|(_, d)| d))
    }

    /// Soft delete: the record moves aside and the name becomes free.
    pub fn delete(&self, project_id: u64, name: &str) -> Result<Option<Endpoint>, StoreError> {
        let _guard = self.lock();
        let key = endpoint_key(project_id, name);
        self.cached.remove(&key);
        let Some(bytes) = self.endpoints.remove(&key)? else {
            return Ok(None);
        };
        let endpoint: Endpoint = decode(ENDPOINTS, &key, &bytes)?;
        self.deleted.insert(endpoint.id.as_bytes(), bytes)?;
        self.endpoints.flush()?;
        Ok(Some(endpoint))
    }

    pub fn variables(&self, project_id: u64) -> Result<Vec<InsightVariable>, StoreError> {
        let mut out: Vec<InsightVariable> =
            scan_prefix(&self.variables, VARIABLES, u64_key(project_id))?;
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    pub fn variable(
        &self,
        project_id: u64,
        id: Uuid,
    ) -> Result<Option<InsightVariable>, StoreError> {
        let key = variable_key(project_id, id);
        self.variables
            .get(&key)?
            .map(|v| decode(VARIABLES, &key, &v))
            .transpose()
    }

    /// Creates or replaces a variable; its code name must be unique in the project.
    pub fn save_variable(&self, variable: &InsightVariable) -> Result<(), StoreError> {
        let _guard = self.lock();
        let clash = self
            .variables(variable.project_id)?
            .into_iter()
            .any(|v| v.id != variable.id && v.code_name == variable.code_name);
        if clash {
            return Err(StoreError::Invalid {
                detail: format!(
                    "A variable with code_name '{}' already exists.",
                    variable.code_name
                ),
                attr: Some("code_name"),
            });
        }
        self.variables.insert(
            variable_key(variable.project_id, variable.id),
            encode(variable),
        )?;
        self.variables.flush()?;
        Ok(())
    }

    pub fn delete_variable(&self, project_id: u64, id: Uuid) -> Result<bool, StoreError> {
        let _guard = self.lock();
        let removed = self
            .variables
            .remove(variable_key(project_id, id))?
            .is_some();
        self.variables.flush()?;
        Ok(removed)
    }
}
