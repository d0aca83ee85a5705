//! The facade's operations: each validates, then runs one locked read-modify-write on the blocking pool.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::model::{Action, Experiment, ExperimentChanges, Holdout, HoldoutChanges};
use super::results::ExperimentResults;
use super::{exclusion, results, ExperimentView, Experiments, FlagHoldout, Inner, ListFilter};
use crate::surface::RecordError;
use corvid_activity::{acting_as, Actor};
use corvid_flags::OwnedFlags;
use corvid_kernel::{blocking, DefinitionRecords};
use corvid_query::QueryEngine;

impl Experiments {
    pub fn new(
        experiments: Arc<dyn DefinitionRecords<Experiment>>,
        holdouts: Arc<dyn DefinitionRecords<Holdout>>,
        flags: Arc<OwnedFlags>,
        query: Arc<QueryEngine>,
    ) -> Experiments {
        Experiments {
            inner: Arc::new(Inner {
                experiments,
                holdouts,
                flags,
                query,
                writes: Mutex::new(()),
            }),
        }
    }

    pub async fn list(
        &self,
        project: u64,
        filter: ListFilter,
    ) -> Result<Vec<ExperimentView>, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let mut list = inner.experiments.list(project)?;
            let search = filter.search.map(|s| s.to_lowercase());
            list.retain(|e| {
                !e.deleted
                    && e.archived == filter.archived
                    && filter.status.is_none_or(|s| e.status() == s)
                    && filter
                        .feature_flag_id
                        .is_none_or(|f| e.feature_flag_id == f)
                    && search
                        .as_ref()
                        .is_none_or(|s| e.name.to_lowercase().contains(s))
            });
            list.sort_by_key(|e| std::cmp::Reverse(e.created_at));
            list.into_iter().map(|e| inner.view(project, e)).collect()
        })
        .await
    }

    pub async fn get(&self, project: u64, id: u64) -> Result<ExperimentView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let e = inner.experiment(project, id)?;
            inner.view(project, e)
        })
        .await
    }

    /// Creates a draft experiment and its flag (inactive until launch).
    pub async fn create(
        &self,
        project: u64,
        actor: &Actor,
        changes: ExperimentChanges,
        created_by: Option<Value>,
    ) -> Result<ExperimentView, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let e = inner.create(project, changes, created_by, Utc::now())?;
                inner.view(project, e)
            })
        })
        .await
    }

    pub async fn update(
        &self,
        project: u64,
        actor: &Actor,
        id: u64,
        changes: ExperimentChanges,
    ) -> Result<ExperimentView, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let e = inner.update(project, id, changes, Utc::now())?;
                inner.view(project, e)
            })
        })
        .await
    }

    /// Runs a lifecycle action at `now`.
    pub async fn act(
        &self,
        project: u64,
        actor: &Actor,
        id: u64,
        action: Action,
        now: DateTime<Utc>,
    ) -> Result<ExperimentView, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let e = inner.act(project, id, action, now)?;
                inner.view(project, e)
            })
        })
        .await
    }

    /// Results as of `now`: exposures per variant and each metric compared with control.
    pub async fn results(
        &self,
        project: u64,
        id: u64,
        now: DateTime<Utc>,
    ) -> Result<ExperimentResults, RecordError> {
        let inner = Arc::clone(&self.inner);
        let view = blocking(move || {
            let e = inner.experiment(project, id)?;
            inner.view(project, e)
        })
        .await?;
        results::compute(&self.inner.query, project, &view, now).await
    }

    // ---- holdouts ----

    pub async fn holdouts(&self, project: u64) -> Result<Vec<Holdout>, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let mut list = inner.holdouts.list(project)?;
            list.sort_by_key(|h| h.id);
            Ok(list)
        })
        .await
    }

    pub async fn holdout(&self, project: u64, id: u64) -> Result<Holdout, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.holdout(project, id)).await
    }

    pub async fn create_holdout(
        &self,
        project: u64,
        actor: &Actor,
        changes: HoldoutChanges,
    ) -> Result<Holdout, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let now = Utc::now();
                let name = changes
                    .name
                    .clone()
                    .filter(|n| !n.trim().is_empty())
                    .ok_or_else(|| RecordError::invalid("This field is required.", "name"))?;
                let mut holdout = Holdout {
                    id: inner.holdouts.next_id()?,
                    project_id: project,
                    name,
                    description: changes.description.clone().unwrap_or_default(),
                    exclusion_percentage: 0.0,
                    created_at: now,
                    updated_at: now,
                };
                holdout.exclusion_percentage = exclusion(changes.filters.as_ref())?
                    .ok_or_else(|| RecordError::invalid("This field is required.", "filters"))?;
                inner
                    .holdouts
                    .put(project, &holdout.id.to_string(), &holdout)?;
                Ok(holdout)
            })
        })
        .await
    }

    /// Updates a holdout; the flags of experiments using it follow.
    pub async fn update_holdout(
        &self,
        project: u64,
        actor: &Actor,
        id: u64,
        changes: HoldoutChanges,
    ) -> Result<Holdout, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let mut holdout = inner.holdout(project, id)?;
                if let Some(name) = changes.name {
                    if name.trim().is_empty() {
                        return Err(RecordError::invalid("This field may not be blank.", "name"));
                    }
                    holdout.name = name;
                }
                if let Some(description) = changes.description {
                    holdout.description = description;
                }
                if let Some(p) = exclusion(changes.filters.as_ref())? {
                    holdout.exclusion_percentage = p;
                }
                holdout.updated_at = Utc::now();
                inner
                    .holdouts
                    .put(project, &holdout.id.to_string(), &holdout)?;
                for e in inner.users_of(project, id)? {
                    inner.flags.modify(project, e.feature_flag_id, |f| {
                        f.filters.holdout = Some(FlagHoldout {
                            id: id as i64,
                            exclusion_percentage: holdout.exclusion_percentage,
                        })
                    })?;
                }
                Ok(holdout)
            })
        })
        .await
    }

    /// Deletes a holdout, taking it off every experiment (and flag) using it.
    pub async fn delete_holdout(
        &self,
        project: u64,
        actor: &Actor,
        id: u64,
    ) -> Result<(), RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                inner.holdout(project, id)?;
                for mut e in inner.users_of(project, id)? {
                    inner
                        .flags
                        .modify(project, e.feature_flag_id, |f| f.filters.holdout = None)?;
                    e.holdout_id = None;
                    e.updated_at = Utc::now();
                    inner.experiments.put(project, &e.id.to_string(), &e)?;
                }
                inner.holdouts.delete(project, &id.to_string())?;
                Ok(())
            })
        })
        .await
    }
}
