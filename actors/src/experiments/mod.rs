//! Experiments and holdouts (`browser-and-surfaces.md` §5): an experiment owns a multivariate
//! flag (first variant `control`) that `/flags` evaluates like any other; its lifecycle
//! (launch, pause, resume, end, ship a variant, archive) drives that flag; its results compare
//! each variant with control from captured exposures and metric events
//! ([`metrics`], [`bayes`]). A holdout keeps a share of people out of every experiment using
//! it: their flags carry `filters.holdout`, and held-out people get `holdout-{id}`.
//!
//! [`Experiments`] is the one door.

pub(crate) mod bayes;
mod metrics;
mod model;
mod results;

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use crate::flags::model::{
    Condition, FlagDefinition, FlagFilters, Holdout as FlagHoldout, Multivariate, Variant,
};
use crate::flags::store::{FlagRecord, FlagStore};
use crate::kernel::{blocking, RecordStore};
use crate::query::QueryEngine;
use crate::surface::RecordError;

pub use model::{Action, Experiment, ExperimentChanges, Holdout, HoldoutChanges, Status};
pub use results::ExperimentResults;

/// The experiments facade. Cheap to clone.
#[derive(Clone)]
pub struct Experiments {
    inner: Arc<Inner>,
}

struct Inner {
    experiments: Arc<dyn RecordStore<Experiment>>,
    holdouts: Arc<dyn RecordStore<Holdout>>,
    flags: Arc<FlagStore>,
    query: Arc<QueryEngine>,
    writes: Mutex<()>,
}

/// List filters.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// `None`: every status.
    pub status: Option<Status>,
    /// Archived experiments are listed only when asked for (default false).
    pub archived: bool,
    pub feature_flag_id: Option<i64>,
    /// Case-insensitive substring of the name.
    pub search: Option<String>,
}

/// An experiment with its flag and holdout, ready to render.
#[derive(Debug, Clone)]
pub struct ExperimentView {
    pub experiment: Experiment,
    pub flag: Option<FlagRecord>,
    pub holdout: Option<Holdout>,
}

fn holdout_json(h: &Holdout) -> Value {
    json!({
        "id": h.id,
        "name": h.name,
        "description": h.description,
        "filters": h.filters(),
        "created_at": h.created_at,
        "updated_at": h.updated_at,
        "created_by": null,
    })
}

impl Holdout {
    /// The API's shape.
    pub fn to_json(&self) -> Value {
        holdout_json(self)
    }
}

impl ExperimentView {
    /// The API's shape.
    pub fn to_json(&self) -> Value {
        let e = &self.experiment;
        let mut parameters = e.parameters_extra.clone();
        parameters.insert("feature_flag_variants".into(), json!(e.variants));
        json!({
            "id": e.id,
            "name": e.name,
            "description": e.description,
            "start_date": e.start_date,
            "end_date": e.end_date,
            "feature_flag_key": e.feature_flag_key,
            "feature_flag": self.flag.as_ref().map(FlagRecord::summary),
            "holdout": self.holdout.as_ref().map(holdout_json),
            "holdout_id": e.holdout_id,
            "parameters": parameters,
            "metrics": e.metrics,
            "metrics_secondary": e.metrics_secondary,
            "saved_metrics": [],
            "filters": {},
            "exposure_criteria": e.exposure_criteria,
            "stats_config": e.stats_config,
            "type": e.kind.as_deref().unwrap_or("product"),
            "status": e.status(),
            "archived": e.archived,
            "deleted": e.deleted,
            "conclusion": e.conclusion,
            "conclusion_comment": e.conclusion_comment,
            "created_at": e.created_at,
            "updated_at": e.updated_at,
            "created_by": e.created_by,
        })
    }
}

const CONTROL: &str = "control";

/// Validates `parameters.feature_flag_variants` (equal split when absent) and keeps the rest.
fn parse_parameters(
    parameters: Option<&Value>,
) -> Result<(Vec<Variant>, Map<String, Value>), RecordError> {
    let mut extra = parameters
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let invalid = |d: String| RecordError::invalid(d, "parameters");
    let variants = match extra.remove("feature_flag_variants") {
        None | Some(Value::Null) => vec![
            Variant {
                key: CONTROL.into(),
                name: Some("Control".into()),
                rollout_percentage: 50.0,
            },
            Variant {
                key: "test".into(),
                name: Some("Test".into()),
                rollout_percentage: 50.0,
            },
        ],
        Some(list) => {
            let raw = list
                .as_array()
                .ok_or_else(|| invalid("feature_flag_variants must be a list.".into()))?;
            let mut variants = Vec::with_capacity(raw.len());
            let unset = raw.iter().all(|v| v.get("rollout_percentage").is_none());
            for v in raw {
                let key = v
                    .get("key")
                    .and_then(Value::as_str)
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| invalid("Every variant needs a non-empty `key`.".into()))?;
                if !key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(invalid(format!(
                        "Variant key `{key}` may only hold letters, numbers, hyphens and underscores."
                    )));
                }
                let rollout = match v.get("rollout_percentage") {
                    _ if unset => 0.0,
                    Some(Value::Number(n)) => n.as_f64().unwrap_or(-1.0),
                    _ => -1.0,
                };
                if !(0.0..=100.0).contains(&rollout) {
                    return Err(invalid(format!(
                        "Variant `{key}` needs a rollout_percentage between 0 and 100."
                    )));
                }
                variants.push(Variant {
                    key: key.to_string(),
                    name: v.get("name").and_then(Value::as_str).map(str::to_string),
                    rollout_percentage: rollout,
                });
            }
            if unset && !variants.is_empty() {
                // An equal split, the remainder to the first variants.
                let n = variants.len();
                let base = 100 / n;
                for (i, v) in variants.iter_mut().enumerate() {
                    v.rollout_percentage = (base + usize::from(i < 100 % n)) as f64;
                }
            }
            variants
        }
    };
    if variants.len() < 2 {
        return Err(invalid("An experiment needs at least two variants.".into()));
    }
    if variants.first().map(|v| v.key.as_str()) != Some(CONTROL) {
        return Err(invalid(
            "The first variant must have the key `control`.".into(),
        ));
    }
    let mut keys: Vec<&str> = variants.iter().map(|v| v.key.as_str()).collect();
    keys.sort_unstable();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid("Variant keys must be unique.".into()));
    }
    let total: f64 = variants.iter().map(|v| v.rollout_percentage).sum();
    if (total - 100.0).abs() > 1e-9 {
        return Err(invalid(format!(
            "Variant rollout percentages must sum to 100 (they sum to {total})."
        )));
    }
    Ok((variants, extra))
}

fn check_metrics(metrics: &[Value], attr: &'static str) -> Result<(), RecordError> {
    for m in metrics {
        metrics::parse(m, attr)?;
    }
    Ok(())
}

impl Experiments {
    pub fn new(
        experiments: Arc<dyn RecordStore<Experiment>>,
        holdouts: Arc<dyn RecordStore<Holdout>>,
        flags: Arc<FlagStore>,
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
        changes: ExperimentChanges,
        created_by: Option<Value>,
    ) -> Result<ExperimentView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let _guard = inner.lock();
            let e = inner.create(project, changes, created_by, Utc::now())?;
            inner.view(project, e)
        })
        .await
    }

    pub async fn update(
        &self,
        project: u64,
        id: u64,
        changes: ExperimentChanges,
    ) -> Result<ExperimentView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let _guard = inner.lock();
            let e = inner.update(project, id, changes, Utc::now())?;
            inner.view(project, e)
        })
        .await
    }

    /// Runs a lifecycle action at `now`.
    pub async fn act(
        &self,
        project: u64,
        id: u64,
        action: Action,
        now: DateTime<Utc>,
    ) -> Result<ExperimentView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let _guard = inner.lock();
            let e = inner.act(project, id, action, now)?;
            inner.view(project, e)
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
        changes: HoldoutChanges,
    ) -> Result<Holdout, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
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
        .await
    }

    /// Updates a holdout; the flags of experiments using it follow.
    pub async fn update_holdout(
        &self,
        project: u64,
        id: u64,
        changes: HoldoutChanges,
    ) -> Result<Holdout, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
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
                inner.flags.modify_flag(project, e.feature_flag_id, |f| {
                    f.filters.holdout = Some(FlagHoldout {
                        id: id as i64,
                        exclusion_percentage: holdout.exclusion_percentage,
                    })
                })?;
            }
            Ok(holdout)
        })
        .await
    }

    /// Deletes a holdout, taking it off every experiment (and flag) using it.
    pub async fn delete_holdout(&self, project: u64, id: u64) -> Result<(), RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let _guard = inner.lock();
            inner.holdout(project, id)?;
            for mut e in inner.users_of(project, id)? {
                inner
                    .flags
                    .modify_flag(project, e.feature_flag_id, |f| f.filters.holdout = None)?;
                e.holdout_id = None;
                e.updated_at = Utc::now();
                inner.experiments.put(project, &e.id.to_string(), &e)?;
            }
            inner.holdouts.delete(project, &id.to_string())?;
            Ok(())
        })
        .await
    }
}

/// The held-out share from a holdout's `filters` (`[{rollout_percentage: N}]`), if given.
fn exclusion(filters: Option<&Value>) -> Result<Option<f64>, RecordError> {
    let Some(filters) = filters else {
        return Ok(None);
    };
    let p = filters
        .as_array()
        .and_then(|groups| groups.first())
        .and_then(|g| g.get("rollout_percentage"))
        .and_then(Value::as_f64)
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| {
            RecordError::invalid(
                "filters must be [{\"properties\": [], \"rollout_percentage\": <0-100>}].",
                "filters",
            )
        })?;
    Ok(Some(p))
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn experiment(&self, project: u64, id: u64) -> Result<Experiment, RecordError> {
        self.experiments
            .get(project, &id.to_string())?
            .filter(|e| !e.deleted)
            .ok_or(RecordError::NotFound { what: "Experiment" })
    }

    fn holdout(&self, project: u64, id: u64) -> Result<Holdout, RecordError> {
        self.holdouts
            .get(project, &id.to_string())?
            .ok_or(RecordError::NotFound { what: "Holdout" })
    }

    fn users_of(&self, project: u64, holdout: u64) -> Result<Vec<Experiment>, RecordError> {
        let mut list = self.experiments.list(project)?;
        list.retain(|e| e.holdout_id == Some(holdout) && !e.deleted);
        Ok(list)
    }

    fn view(&self, project: u64, experiment: Experiment) -> Result<ExperimentView, RecordError> {
        let flag = self.flags.flag(project, experiment.feature_flag_id)?;
        let holdout = match experiment.holdout_id {
            Some(id) => self.holdouts.get(project, &id.to_string())?,
            None => None,
        };
        Ok(ExperimentView {
            experiment,
            flag,
            holdout,
        })
    }

    fn holdout_for(&self, project: u64, value: &Value) -> Result<Option<Holdout>, RecordError> {
        match value {
            Value::Null => Ok(None),
            v => {
                let missing = || RecordError::invalid("Holdout does not exist.", "holdout_id");
                let id = v.as_u64().ok_or_else(missing)?;
                self.holdouts
                    .get(project, &id.to_string())?
                    .map(Some)
                    .ok_or_else(missing)
            }
        }
    }

    fn create(
        &self,
        project: u64,
        c: ExperimentChanges,
        created_by: Option<Value>,
        now: DateTime<Utc>,
    ) -> Result<Experiment, RecordError> {
        let name = c
            .name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| RecordError::invalid("This field is required.", "name"))?;
        let key = c
            .feature_flag_key
            .clone()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| RecordError::invalid("This field is required.", "feature_flag_key"))?;
        let (variants, parameters_extra) = parse_parameters(c.parameters.as_ref())?;
        let holdout = match &c.holdout_id {
            Some(v) => self.holdout_for(project, v)?,
            None => None,
        };
        check_metrics(c.metrics.as_deref().unwrap_or_default(), "metrics")?;
        check_metrics(
            c.metrics_secondary.as_deref().unwrap_or_default(),
            "metrics_secondary",
        )?;
        let group_index = parameters_extra
            .get("aggregation_group_type_index")
            .and_then(Value::as_u64)
            .map(|i| i.min(4) as u8);
        let filters = FlagFilters {
            groups: vec![Condition::new(Vec::new(), Some(100.0))],
            multivariate: Some(Multivariate {
                variants: variants.clone(),
            }),
            aggregation_group_type_index: group_index,
            holdout: holdout.as_ref().map(|h| FlagHoldout {
                id: h.id as i64,
                exclusion_percentage: h.exclusion_percentage,
            }),
            ..FlagFilters::default()
        };
        let flag = match self.flags.live_flag_by_key(project, &key)? {
            Some(existing) => {
                let reusable = existing
                    .definition
                    .filters
                    .multivariate
                    .as_ref()
                    .is_some_and(|m| {
                        m.variants.len() >= 2 && m.variants.iter().any(|v| v.key == CONTROL)
                    });
                let used = self
                    .experiments
                    .list(project)?
                    .iter()
                    .any(|e| !e.deleted && e.feature_flag_id == existing.definition.id);
                if !reusable || used {
                    return Err(RecordError::invalid(
                        "There is already a feature flag with this key. An experiment can reuse \
                         it only if it is a multivariate flag with a `control` variant that no \
                         other experiment uses.",
                        "feature_flag_key",
                    ));
                }
                existing
            }
            None => {
                let definition = FlagDefinition::new(
                    key.clone(),
                    format!("Feature Flag for Experiment {name}"),
                    filters,
                    false,
                );
                crate::flags::validate::validate_flag(&definition, 5)?;
                self.flags.save_flag(project, definition, None)?
            }
        };
        let experiment = Experiment {
            id: self.experiments.next_id()?,
            project_id: project,
            name,
            description: c.description.unwrap_or_default(),
            feature_flag_key: key,
            feature_flag_id: flag.definition.id,
            variants: flag
                .definition
                .filters
                .multivariate
                .as_ref()
                .map(|m| m.variants.clone())
                .unwrap_or(variants),
            parameters_extra,
            holdout_id: holdout.map(|h| h.id),
            metrics: c.metrics.unwrap_or_default(),
            metrics_secondary: c.metrics_secondary.unwrap_or_default(),
            exposure_criteria: c.exposure_criteria,
            stats_config: c.stats_config,
            kind: c.kind,
            start_date: None,
            end_date: None,
            paused: false,
            archived: false,
            deleted: false,
            conclusion: None,
            conclusion_comment: None,
            created_at: now,
            updated_at: now,
            created_by,
        };
        self.experiments
            .put(project, &experiment.id.to_string(), &experiment)?;
        Ok(experiment)
    }

    fn update(
        &self,
        project: u64,
        id: u64,
        c: ExperimentChanges,
        now: DateTime<Utc>,
    ) -> Result<Experiment, RecordError> {
        let mut e = self.experiment(project, id)?;
        let draft = e.status() == Status::Draft;
        if let Some(name) = c.name {
            if name.trim().is_empty() {
                return Err(RecordError::invalid("This field may not be blank.", "name"));
            }
            e.name = name;
        }
        if let Some(description) = c.description {
            e.description = description;
        }
        if c.feature_flag_key
            .as_ref()
            .is_some_and(|k| *k != e.feature_flag_key)
        {
            return Err(RecordError::invalid(
                "The feature flag of an experiment cannot be changed.",
                "feature_flag_key",
            ));
        }
        if c.parameters.is_some() || c.holdout_id.is_some() {
            if !draft {
                return Err(RecordError::invalid(
                    "Variants and holdout can only be changed before the experiment is launched.",
                    "parameters",
                ));
            }
            if let Some(parameters) = &c.parameters {
                let (variants, extra) = parse_parameters(Some(parameters))?;
                e.variants = variants;
                e.parameters_extra = extra;
            }
            if let Some(h) = &c.holdout_id {
                e.holdout_id = self.holdout_for(project, h)?.map(|h| h.id);
            }
            let holdout = match e.holdout_id {
                Some(id) => Some(self.holdout(project, id)?),
                None => None,
            };
            let variants = e.variants.clone();
            self.flags.modify_flag(project, e.feature_flag_id, |f| {
                f.filters.multivariate = Some(Multivariate { variants });
                f.filters.holdout = holdout.map(|h| FlagHoldout {
                    id: h.id as i64,
                    exclusion_percentage: h.exclusion_percentage,
                });
            })?;
        }
        if let Some(metrics) = c.metrics {
            check_metrics(&metrics, "metrics")?;
            e.metrics = metrics;
        }
        if let Some(metrics) = c.metrics_secondary {
            check_metrics(&metrics, "metrics_secondary")?;
            e.metrics_secondary = metrics;
        }
        if c.exposure_criteria.is_some() {
            e.exposure_criteria = c.exposure_criteria;
        }
        if c.stats_config.is_some() {
            e.stats_config = c.stats_config;
        }
        if c.kind.is_some() {
            e.kind = c.kind;
        }
        if let Some(archived) = c.archived {
            e.archived = archived;
        }
        if let Some(deleted) = c.deleted {
            e.deleted = deleted;
        }
        if c.conclusion.is_some() {
            e.conclusion = c.conclusion;
        }
        if c.conclusion_comment.is_some() {
            e.conclusion_comment = c.conclusion_comment;
        }
        e.updated_at = now;
        self.experiments.put(project, &e.id.to_string(), &e)?;
        Ok(e)
    }

    fn act(
        &self,
        project: u64,
        id: u64,
        action: Action,
        now: DateTime<Utc>,
    ) -> Result<Experiment, RecordError> {
        let mut e = self.experiment(project, id)?;
        let status = e.status();
        let refuse = |what: &str, needs: &str| {
            Err(RecordError::invalid(
                format!(
                    "Cannot {what} an experiment that is {}; it must be {needs}.",
                    status.describe()
                ),
                "status",
            ))
        };
        let flag = e.feature_flag_id;
        match action {
            Action::Launch => {
                if status != Status::Draft {
                    return refuse("launch", "a draft");
                }
                let ok = e.variants.len() >= 2 && e.variants.iter().any(|v| v.key == CONTROL);
                if !ok {
                    return Err(RecordError::invalid(
                        "An experiment needs a `control` variant and at least one test variant to launch.",
                        "parameters",
                    ));
                }
                self.flags.modify_flag(project, flag, |f| f.active = true)?;
                e.start_date = Some(now);
            }
            Action::Pause => {
                if status != Status::Running {
                    return refuse("pause", "running");
                }
                self.flags
                    .modify_flag(project, flag, |f| f.active = false)?;
                e.paused = true;
            }
            Action::Resume => {
                if status != Status::Paused {
                    return refuse("resume", "paused");
                }
                self.flags.modify_flag(project, flag, |f| f.active = true)?;
                e.paused = false;
            }
            Action::End {
                conclusion,
                comment,
            } => {
                if !matches!(status, Status::Running | Status::Paused) {
                    return refuse("end", "running or paused");
                }
                e.end_date = Some(now);
                e.conclusion = conclusion.or(e.conclusion);
                e.conclusion_comment = comment.or(e.conclusion_comment);
            }
            Action::ShipVariant {
                variant,
                release_to_everyone,
                conclusion,
                comment,
            } => {
                if status == Status::Draft {
                    return refuse("ship a variant of", "launched");
                }
                if !e.variants.iter().any(|v| v.key == variant) {
                    let known: Vec<&str> = e.variants.iter().map(|v| v.key.as_str()).collect();
                    return Err(RecordError::invalid(
                        format!(
                            "Variant `{variant}` is not one of this experiment's variants ({}).",
                            known.join(", ")
                        ),
                        "variant_key",
                    ));
                }
                self.flags.modify_flag(project, flag, |f| {
                    if let Some(mv) = f.filters.multivariate.as_mut() {
                        for v in &mut mv.variants {
                            v.rollout_percentage = if v.key == variant { 100.0 } else { 0.0 };
                        }
                    }
                    f.filters.holdout = None;
                    if release_to_everyone {
                        f.filters
                            .groups
                            .insert(0, Condition::new(Vec::new(), Some(100.0)));
                    }
                    f.active = true;
                })?;
                if e.end_date.is_none() {
                    e.end_date = Some(now);
                }
                e.paused = false;
                e.conclusion = conclusion.or(e.conclusion);
                e.conclusion_comment = comment.or(e.conclusion_comment);
            }
            Action::Archive => {
                if status != Status::Stopped {
                    return refuse("archive", "ended");
                }
                e.archived = true;
            }
            Action::Unarchive => e.archived = false,
        }
        e.updated_at = now;
        self.experiments.put(project, &e.id.to_string(), &e)?;
        Ok(e)
    }
}

#[cfg(test)]
mod tests;
