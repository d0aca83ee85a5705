//! The embedded endpoint records (sled). An endpoint is one record (with its versions) keyed by
//! project and name, so a lookup by name is one read; writes go through one lock so that
//! read-modify-write updates (API edits, materializer status) never lose each other.

use std::sync::Mutex;

use sled::Transactional;
use uuid::Uuid;

use super::model::{Endpoint, InsightVariable};
use super::store::{code_name_taken, name_taken, EndpointEdit, EndpointRecords};
use corvid_activity::{stage, ActivityEntry};
use corvid_kernel::codec::{decode, encode, scan_prefix, u64_key};
use corvid_kernel::StoreError;

const ENDPOINTS: &str = "endpoints";
const DELETED: &str = "endpoints_deleted";
const VARIABLES: &str = "insight_variables";

pub struct SledEndpoints {
    endpoints: sled::Tree,
    /// Soft-deleted endpoints by id: kept for audit, invisible to the API, name free for reuse.
    deleted: sled::Tree,
    variables: sled::Tree,
    activity: sled::Tree,
    write: Mutex<()>,
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

impl SledEndpoints {
    pub fn open(db: &sled::Db) -> Result<SledEndpoints, StoreError> {
        Ok(SledEndpoints {
            endpoints: db.open_tree(ENDPOINTS)?,
            deleted: db.open_tree(DELETED)?,
            variables: db.open_tree(VARIABLES)?,
            activity: db.open_tree(corvid_activity::TREE)?,
            write: Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic while holding it cannot leave anything half-done.
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `value` at `key` of `tree` (removes it when `None`) and writes `log`, in one sled
    /// transaction, then flushes.
    fn write_logged(
        &self,
        tree: &sled::Tree,
        key: &[u8],
        value: Option<Vec<u8>>,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        (tree, &self.activity).transaction(|(records, activity)| {
            match &value {
                Some(v) => records.insert(key, v.clone())?,
                None => records.remove(key)?,
            };
            for entry in log {
                stage(activity, entry)?;
            }
            Ok(())
        })?;
        tree.flush()?;
        Ok(())
    }
}

impl EndpointRecords for SledEndpoints {
    fn endpoints(&self, project_id: u64) -> Result<Vec<Endpoint>, StoreError> {
        scan_prefix(&self.endpoints, ENDPOINTS, u64_key(project_id))
    }

    fn all_endpoints(&self) -> Result<Vec<Endpoint>, StoreError> {
        scan_prefix(&self.endpoints, ENDPOINTS, [])
    }

    fn endpoint(&self, project_id: u64, name: &str) -> Result<Option<Endpoint>, StoreError> {
        let key = endpoint_key(project_id, name);
        self.endpoints
            .get(&key)?
            .map(|v| decode(ENDPOINTS, &key, &v))
            .transpose()
    }

    fn create(&self, endpoint: &Endpoint, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let _guard = self.lock();
        let key = endpoint_key(endpoint.project_id, &endpoint.name);
        if self.endpoints.contains_key(&key)? {
            return Err(name_taken(&endpoint.name));
        }
        self.write_logged(&self.endpoints, &key, Some(encode(endpoint)?), log)
    }

    fn update(
        &self,
        project_id: u64,
        name: &str,
        change: &mut EndpointEdit<'_>,
    ) -> Result<Option<Endpoint>, StoreError> {
        let _guard = self.lock();
        let Some(mut endpoint) = self.endpoint(project_id, name)? else {
            return Ok(None);
        };
        let Some(log) = change(&mut endpoint) else {
            return self.endpoint(project_id, name);
        };
        let key = endpoint_key(project_id, name);
        self.write_logged(&self.endpoints, &key, Some(encode(&endpoint)?), &log)?;
        Ok(Some(endpoint))
    }

    fn delete(
        &self,
        project_id: u64,
        name: &str,
        log: &[ActivityEntry],
    ) -> Result<Option<Endpoint>, StoreError> {
        let _guard = self.lock();
        let key = endpoint_key(project_id, name);
        let Some(bytes) = self.endpoints.get(&key)? else {
            return Ok(None);
        };
        let endpoint: Endpoint = decode(ENDPOINTS, &key, &bytes)?;
        (&self.endpoints, &self.deleted, &self.activity).transaction(
            |(endpoints, deleted, activity)| {
                endpoints.remove(key.as_slice())?;
                deleted.insert(endpoint.id.as_bytes(), bytes.clone())?;
                for entry in log {
                    stage(activity, entry)?;
                }
                Ok(())
            },
        )?;
        self.endpoints.flush()?;
        Ok(Some(endpoint))
    }

    fn variables(&self, project_id: u64) -> Result<Vec<InsightVariable>, StoreError> {
        let mut out: Vec<InsightVariable> =
            scan_prefix(&self.variables, VARIABLES, u64_key(project_id))?;
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    fn variable(&self, project_id: u64, id: Uuid) -> Result<Option<InsightVariable>, StoreError> {
        let key = variable_key(project_id, id);
        self.variables
            .get(&key)?
            .map(|v| decode(VARIABLES, &key, &v))
            .transpose()
    }

    fn save_variable(
        &self,
        variable: &InsightVariable,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        let _guard = self.lock();
        let clash = self
            .variables(variable.project_id)?
            .into_iter()
            .any(|v| v.id != variable.id && v.code_name == variable.code_name);
        if clash {
            return Err(code_name_taken(&variable.code_name));
        }
        let key = variable_key(variable.project_id, variable.id);
        self.write_logged(&self.variables, &key, Some(encode(variable)?), log)
    }

    fn delete_variable(
        &self,
        project_id: u64,
        id: Uuid,
        log: &[ActivityEntry],
    ) -> Result<bool, StoreError> {
        let _guard = self.lock();
        let key = variable_key(project_id, id);
        if !self.variables.contains_key(&key)? {
            return Ok(false);
        }
        self.write_logged(&self.variables, &key, None, log)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sled_endpoints_pass_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        crate::store::contract::suite(
            &SledEndpoints::open(&db).expect("open"),
            &corvid_activity::SledActivity::open(&db).expect("log"),
        );
    }
}
