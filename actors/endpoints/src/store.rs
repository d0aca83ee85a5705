//! Where endpoints (each with its versions) and insight variables live.
//!
//! [`EndpointRecords`] is the storage trait ([`super::SledEndpoints`] in the embedded default; every
//! implementation passes [`contract::suite`]). [`EndpointStore`] is what the domain uses: the
//! records plus the in-memory copy of endpoints that runs read without I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;
use uuid::Uuid;

use super::logged::{endpoint_entries, variable_entry, ENDPOINT, VARIABLE};
use super::model::{Endpoint, InsightVariable};
use corvid_activity::{current_actor, ActivityEntry};
use corvid_kernel::StoreError;

/// `create`'s refusal when the project already has an endpoint named `name`.
pub(crate) fn name_taken(name: &str) -> StoreError {
    StoreError::Invalid {
        detail: format!("An endpoint named '{name}' already exists."),
        attr: Some("name"),
    }
}

/// `save_variable`'s refusal when another variable of the project has `code_name`.
pub(crate) fn code_name_taken(code_name: &str) -> StoreError {
    StoreError::Invalid {
        detail: format!("A variable with code_name '{code_name}' already exists."),
        attr: Some("code_name"),
    }
}

/// An endpoint another process created, changed or deleted.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EndpointChange {
    pub project_id: u64,
    pub name: String,
    pub id: Uuid,
}

/// Told of an endpoint another process changed (`None`: any may have changed).
pub type OnEndpointChange = Arc<dyn Fn(Option<EndpointChange>) + Send + Sync>;

/// A read-modify-write of one endpoint: `None` leaves it as it was; otherwise the
/// activity-log entries to write with it.
pub type EndpointEdit<'a> = dyn FnMut(&mut Endpoint) -> Option<Vec<ActivityEntry>> + 'a;

/// Endpoints and insight variables, by project. Writes are durable when they return, and each
/// writes the activity-log entries it is given in the same transaction.
pub trait EndpointRecords: Send + Sync {
    /// A project's endpoints, by name.
    fn endpoints(&self, project_id: u64) -> Result<Vec<Endpoint>, StoreError>;
    /// Every endpoint of every project (the materializer's schedule scan).
    fn all_endpoints(&self) -> Result<Vec<Endpoint>, StoreError>;
    fn endpoint(&self, project_id: u64, name: &str) -> Result<Option<Endpoint>, StoreError>;
    /// Stores a new endpoint: `Invalid` (attr `name`) when its name is taken in its project.
    fn create(&self, endpoint: &Endpoint, log: &[ActivityEntry]) -> Result<(), StoreError>;
    /// Read-modify-write of one endpoint: `change` is called exactly once, while no other
    /// writer can change the record, and answers whether to write (with which entries). The
    /// record as it now is, or `None` when there is no such endpoint.
    fn update(
        &self,
        project_id: u64,
        name: &str,
        change: &mut EndpointEdit<'_>,
    ) -> Result<Option<Endpoint>, StoreError>;
    /// Soft delete: the record is kept aside by id and the name becomes free; `log` is
    /// written only when there was such an endpoint.
    fn delete(
        &self,
        project_id: u64,
        name: &str,
        log: &[ActivityEntry],
    ) -> Result<Option<Endpoint>, StoreError>;

    /// A project's variables, oldest first.
    fn variables(&self, project_id: u64) -> Result<Vec<InsightVariable>, StoreError>;
    fn variable(&self, project_id: u64, id: Uuid) -> Result<Option<InsightVariable>, StoreError>;
    /// Creates or replaces a variable: `Invalid` (attr `code_name`) when another variable of
    /// the project has its code name.
    fn save_variable(
        &self,
        variable: &InsightVariable,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError>;
    /// Whether it existed (`log` is written only then).
    fn delete_variable(
        &self,
        project_id: u64,
        id: Uuid,
        log: &[ActivityEntry],
    ) -> Result<bool, StoreError>;

    /// Calls `on_change` when another process changes an endpoint, so copies kept in memory
    /// (records, cached answers) can be dropped. A store only this process writes (the
    /// embedded one) never calls it: the writer refreshed its own copies.
    fn watch(&self, on_change: OnEndpointChange) {
        let _ = on_change;
    }
}

/// The domain's view of the records: every write goes through here and refreshes the
/// in-memory copy that runs read.
pub struct EndpointStore {
    records: Arc<dyn EndpointRecords>,
    /// Endpoints read since start, by project and name.
    cached: DashMap<(u64, String), Arc<Endpoint>>,
    /// Held while a record is written and its copy refreshed, and while a miss is filled:
    /// without it a fill that read the record just before a delete could put the deleted
    /// endpoint back in memory. Hits do not take it.
    writing: Mutex<()>,
    /// Counts changes other nodes announced: a fill that read before one is not kept.
    remote_changes: AtomicU64,
}

impl EndpointStore {
    pub fn new(records: Arc<dyn EndpointRecords>) -> EndpointStore {
        EndpointStore {
            records,
            cached: DashMap::new(),
            writing: Mutex::new(()),
            remote_changes: AtomicU64::new(0),
        }
    }

    /// The records, to watch for other nodes' changes.
    pub fn records(&self) -> &Arc<dyn EndpointRecords> {
        &self.records
    }

    /// Drops the in-memory copy of an endpoint another node changed (`None`: of all).
    pub fn forget_remote(&self, change: Option<&EndpointChange>) {
        self.remote_changes.fetch_add(1, Ordering::SeqCst);
        match change {
            Some(c) => {
                self.cached.remove(&(c.project_id, c.name.clone()));
            }
            None => self.cached.clear(),
        }
    }

    fn write_lock(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic elsewhere cannot leave it inconsistent.
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn endpoints(&self, project_id: u64) -> Result<Vec<Endpoint>, StoreError> {
        self.records.endpoints(project_id)
    }

    pub fn all_endpoints(&self) -> Result<Vec<Endpoint>, StoreError> {
        self.records.all_endpoints()
    }

    /// The endpoint if it is in memory already (no I/O): the run path's fast lookup.
    pub fn cached(&self, project_id: u64, name: &str) -> Option<Arc<Endpoint>> {
        self.cached
            .get(&(project_id, name.to_string()))
            .map(|e| Arc::clone(e.value()))
    }

    /// The endpoint as stored now, bypassing memory (another node may have changed it).
    pub fn stored(&self, project_id: u64, name: &str) -> Result<Option<Endpoint>, StoreError> {
        self.records.endpoint(project_id, name)
    }

    /// The endpoint, from memory or storage (then remembered).
    pub fn load(&self, project_id: u64, name: &str) -> Result<Option<Arc<Endpoint>>, StoreError> {
        if let Some(hit) = self.cached(project_id, name) {
            return Ok(Some(hit));
        }
        let _writing = self.write_lock();
        if let Some(hit) = self.cached(project_id, name) {
            return Ok(Some(hit));
        }
        let seen = self.remote_changes.load(Ordering::SeqCst);
        let found = self.records.endpoint(project_id, name)?.map(Arc::new);
        if let Some(e) = &found {
            let key = (project_id, name.to_string());
            self.cached.insert(key.clone(), Arc::clone(e));
            if self.remote_changes.load(Ordering::SeqCst) != seen {
                // Another node changed something while this read: answer, but do not keep it.
                self.cached.remove(&key);
            }
        }
        Ok(found)
    }

    /// Stores a new endpoint, logged as the acting user's.
    pub fn create(&self, endpoint: &Endpoint) -> Result<(), StoreError> {
        let _writing = self.write_lock();
        self.records
            .create(endpoint, &endpoint_entries(None, endpoint))?;
        self.cached.insert(
            (endpoint.project_id, endpoint.name.clone()),
            Arc::new(endpoint.clone()),
        );
        Ok(())
    }

    /// Read-modify-write of one endpoint, logged as the acting user's. `change` sees the
    /// current record and may refuse with its own error; nothing is written then. `Ok(None)`
    /// when there is no such endpoint.
    pub fn update<T, E>(
        &self,
        project_id: u64,
        name: &str,
        change: impl FnOnce(&mut Endpoint) -> Result<T, E>,
    ) -> Result<Option<(Endpoint, T)>, E>
    where
        E: From<StoreError>,
    {
        self.rewrite(project_id, name, true, change)
    }

    /// [`EndpointStore::update`]; with `logged` false, the write is bookkeeping of Corvid's
    /// own (materialization status) and is not logged.
    fn rewrite<T, E>(
        &self,
        project_id: u64,
        name: &str,
        logged: bool,
        change: impl FnOnce(&mut Endpoint) -> Result<T, E>,
    ) -> Result<Option<(Endpoint, T)>, E>
    where
        E: From<StoreError>,
    {
        let mut change = Some(change);
        let mut outcome = None;
        let _writing = self.write_lock();
        let stored = self.records.update(project_id, name, &mut |e| {
            let change = change.take()?;
            let before = logged.then(|| e.clone());
            let result = change(e);
            let write = result.is_ok();
            outcome = Some(result);
            write.then(|| match &before {
                Some(before) => endpoint_entries(Some(before), e),
                None => Vec::new(),
            })
        })?;
        let Some(endpoint) = stored else {
            return Ok(None);
        };
        let value = match outcome {
            Some(result) => result?,
            None => return Ok(None),
        };
        self.cached
            .insert((project_id, name.to_string()), Arc::new(endpoint.clone()));
        Ok(Some((endpoint, value)))
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
        let done = self.rewrite(project_id, name, false, |e| {
            if e.id == id {
                change(e);
                Ok::<bool, StoreError>(true)
            } else {
                Ok(false)
            }
        })?;
        Ok(done.is_some_and(|(_, d)| d))
    }

    /// Soft-deletes an endpoint, logged as the acting user's.
    pub fn delete(&self, project_id: u64, name: &str) -> Result<Option<Endpoint>, StoreError> {
        let _writing = self.write_lock();
        let log = match self.records.endpoint(project_id, name)? {
            Some(e) => vec![ActivityEntry::removal(
                project_id,
                &current_actor(),
                ENDPOINT,
                e.id.to_string(),
                Some(e.name),
            )],
            None => Vec::new(),
        };
        let deleted = self.records.delete(project_id, name, &log)?;
        self.cached.remove(&(project_id, name.to_string()));
        Ok(deleted)
    }

    pub fn variables(&self, project_id: u64) -> Result<Vec<InsightVariable>, StoreError> {
        self.records.variables(project_id)
    }

    pub fn variable(
        &self,
        project_id: u64,
        id: Uuid,
    ) -> Result<Option<InsightVariable>, StoreError> {
        self.records.variable(project_id, id)
    }

    /// Creates or replaces a variable, logged as the acting user's.
    pub fn save_variable(&self, variable: &InsightVariable) -> Result<(), StoreError> {
        let before = self.records.variable(variable.project_id, variable.id)?;
        let log = variable_entry(before.as_ref(), variable);
        self.records.save_variable(variable, &log)
    }

    /// Deletes a variable, logged as the acting user's.
    pub fn delete_variable(&self, project_id: u64, id: Uuid) -> Result<bool, StoreError> {
        let log = match self.records.variable(project_id, id)? {
            Some(v) => vec![ActivityEntry::removal(
                project_id,
                &current_actor(),
                VARIABLE,
                id.to_string(),
                Some(v.name),
            )],
            None => Vec::new(),
        };
        self.records.delete_variable(project_id, id, &log)
    }
}

/// The behaviour every [`EndpointRecords`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use chrono::Utc;

    use super::*;
    use crate::model::VariableType;
    use corvid_activity::{ActivityQuery, ActivityRecords, Actor};

    fn endpoint(project_id: u64, name: &str) -> Endpoint {
        Endpoint {
            id: Uuid::new_v4(),
            project_id,
            name: name.into(),
            is_active: true,
            current_version: 0,
            derived_from_insight: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            created_by: None,
            last_executed_at: None,
            versions: Vec::new(),
        }
    }

    fn variable(project_id: u64, code_name: &str) -> InsightVariable {
        InsightVariable {
            id: Uuid::new_v4(),
            project_id,
            name: code_name.into(),
            code_name: code_name.into(),
            kind: VariableType::String,
            default_value: serde_json::Value::Null,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }
    }

    /// Runs every check against an empty store; `log` reads the activity log of the same
    /// backing.
    pub fn suite(records: &dyn EndpointRecords, log: &dyn ActivityRecords) {
        endpoints_are_kept_per_project_with_unique_names(records);
        updates_write_only_what_change_accepts(records);
        deleting_frees_the_name(records);
        variables_have_unique_code_names_per_project(records);
        changes_are_logged_with_them(records, log);
    }

    fn logged(project: u64, item: &str) -> ActivityEntry {
        ActivityEntry::removal(project, &Actor::system(), "Endpoint", item.into(), None)
    }

    /// The entries given with a write are in the log once it returns; a refused write (a
    /// taken name, a change that says no, a missing endpoint or variable) leaves none.
    fn changes_are_logged_with_them(records: &dyn EndpointRecords, log: &dyn ActivityRecords) {
        let created = logged(30, "created");
        records
            .create(&endpoint(30, "e"), std::slice::from_ref(&created))
            .expect("create");
        assert!(records
            .create(&endpoint(30, "e"), &[logged(30, "taken")])
            .is_err());
        let updated = logged(30, "updated");
        records
            .update(30, "e", &mut |e| {
                e.created_by = Some("x".into());
                Some(vec![updated.clone()])
            })
            .expect("update");
        records.update(30, "e", &mut |_| None).expect("refused");
        let deleted = logged(30, "deleted");
        records
            .delete(30, "e", std::slice::from_ref(&deleted))
            .expect("delete");
        records
            .delete(30, "e", &[logged(30, "missing")])
            .expect("nothing to delete");
        let var = variable(30, "v");
        let saved = logged(30, "saved");
        records
            .save_variable(&var, std::slice::from_ref(&saved))
            .expect("save");
        assert!(records
            .save_variable(&variable(30, "v"), &[logged(30, "clash")])
            .is_err());
        let dropped = logged(30, "dropped");
        assert!(records
            .delete_variable(30, var.id, std::slice::from_ref(&dropped))
            .expect("delete"));
        assert!(!records
            .delete_variable(30, var.id, &[logged(30, "gone")])
            .expect("again"));
        let items: Vec<String> = log
            .query(
                30,
                &ActivityQuery {
                    limit: 20,
                    ..ActivityQuery::default()
                },
            )
            .expect("log")
            .entries
            .into_iter()
            .map(|e| e.item_id)
            .collect();
        assert_eq!(
            items,
            vec!["dropped", "saved", "deleted", "updated", "created"]
        );
    }

    fn endpoints_are_kept_per_project_with_unique_names(records: &dyn EndpointRecords) {
        records.create(&endpoint(1, "b"), &[]).expect("create");
        records.create(&endpoint(1, "a"), &[]).expect("create");
        records
            .create(&endpoint(2, "a"), &[])
            .expect("same name, other project");
        let clash = records.create(&endpoint(1, "a"), &[]);
        assert!(matches!(
            clash,
            Err(StoreError::Invalid {
                attr: Some("name"),
                ..
            })
        ));
        let names: Vec<String> = records
            .endpoints(1)
            .expect("list")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec!["a", "b"], "by name");
        assert_eq!(records.all_endpoints().expect("all").len(), 3);
        assert_eq!(
            records
                .endpoint(2, "a")
                .expect("read")
                .expect("found")
                .project_id,
            2
        );
        assert!(records.endpoint(3, "a").expect("read").is_none());
    }

    fn updates_write_only_what_change_accepts(records: &dyn EndpointRecords) {
        records.create(&endpoint(5, "u"), &[]).expect("create");
        let updated = records
            .update(5, "u", &mut |e| {
                e.created_by = Some("changed".into());
                Some(Vec::new())
            })
            .expect("update")
            .expect("exists");
        assert_eq!(updated.created_by.as_deref(), Some("changed"));
        let refused = records
            .update(5, "u", &mut |e| {
                e.created_by = Some("refused".into());
                None
            })
            .expect("update")
            .expect("exists");
        assert_eq!(
            refused.created_by.as_deref(),
            Some("changed"),
            "nothing written when change says no"
        );
        assert_eq!(
            records
                .endpoint(5, "u")
                .expect("read")
                .expect("found")
                .created_by
                .as_deref(),
            Some("changed")
        );
        assert!(records
            .update(5, "missing", &mut |_| Some(Vec::new()))
            .expect("update")
            .is_none());
    }

    fn deleting_frees_the_name(records: &dyn EndpointRecords) {
        let first = endpoint(6, "d");
        records.create(&first, &[]).expect("create");
        assert_eq!(
            records.delete(6, "d", &[]).expect("delete").map(|e| e.id),
            Some(first.id)
        );
        assert!(records.endpoint(6, "d").expect("read").is_none());
        assert!(records.delete(6, "d", &[]).expect("again").is_none());
        records
            .create(&endpoint(6, "d"), &[])
            .expect("the name is free again");
    }

    fn variables_have_unique_code_names_per_project(records: &dyn EndpointRecords) {
        let a = variable(7, "country");
        records.save_variable(&a, &[]).expect("save");
        let clash = records.save_variable(&variable(7, "country"), &[]);
        assert!(matches!(
            clash,
            Err(StoreError::Invalid {
                attr: Some("code_name"),
                ..
            })
        ));
        records
            .save_variable(&variable(8, "country"), &[])
            .expect("other project");
        let mut renamed = a.clone();
        renamed.name = "Country".into();
        records
            .save_variable(&renamed, &[])
            .expect("replacing itself is no clash");
        assert_eq!(
            records.variable(7, a.id).expect("read").map(|v| v.name),
            Some(renamed.name)
        );
        records
            .save_variable(&variable(7, "plan"), &[])
            .expect("save");
        let codes: Vec<String> = records
            .variables(7)
            .expect("list")
            .into_iter()
            .map(|v| v.code_name)
            .collect();
        assert_eq!(codes, vec!["country", "plan"], "oldest first");
        assert!(records.delete_variable(7, a.id, &[]).expect("delete"));
        assert!(!records.delete_variable(7, a.id, &[]).expect("again"));
        assert!(records.variable(7, a.id).expect("read").is_none());
    }
}
