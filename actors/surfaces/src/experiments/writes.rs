//! The locked read-modify-writes behind the operations: experiments, their flags and holdouts change together.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::model::{Action, Experiment, ExperimentChanges, Holdout, Status};
use super::{check_metrics, parse_parameters, ExperimentView, FlagHoldout, Inner, CONTROL};
use crate::surface::RecordError;
use corvid_flags::{Condition, FlagDefinition, FlagFilters, FlagRecord, Multivariate};
use corvid_kernel::StoreError;

/// The held-out share from a holdout's `filters` (`[{rollout_percentage: N}]`), if given.
pub(super) fn exclusion(filters: Option<&Value>) -> Result<Option<f64>, RecordError> {
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
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn experiment(&self, project: u64, id: u64) -> Result<Experiment, RecordError> {
        self.experiments
            .get(project, &id.to_string())?
            .filter(|e| !e.deleted)
            .ok_or(RecordError::NotFound { what: "Experiment" })
    }

    pub(super) fn holdout(&self, project: u64, id: u64) -> Result<Holdout, RecordError> {
        self.holdouts
            .get(project, &id.to_string())?
            .ok_or(RecordError::NotFound { what: "Holdout" })
    }

    pub(super) fn users_of(
        &self,
        project: u64,
        holdout: u64,
    ) -> Result<Vec<Experiment>, RecordError> {
        let mut list = self.experiments.list(project)?;
        list.retain(|e| e.holdout_id == Some(holdout) && !e.deleted);
        Ok(list)
    }

    pub(super) fn view(
        &self,
        project: u64,
        experiment: Experiment,
    ) -> Result<ExperimentView, RecordError> {
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

    pub(super) fn holdout_for(
        &self,
        project: u64,
        value: &Value,
    ) -> Result<Option<Holdout>, RecordError> {
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

    pub(super) fn create(
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
        let flag = self.experiment_flag(project, &key, &name, filters)?;
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
        // Two experiments reusing one flag at once, on two nodes: the store keeps one. A flag
        // this call created stays when the save fails: another node's experiment may have
        // taken it meanwhile, and if none did, it is an inactive flag the next create with its
        // key reuses.
        self.experiments
            .put(project, &experiment.id.to_string(), &experiment)
            .map_err(|e| match e {
                StoreError::Conflict { .. } => flag_key_taken(),
                other => other.into(),
            })?;
        Ok(experiment)
    }

    /// The flag a new experiment runs on: the live flag with its key when that is a free
    /// multivariate flag with a control variant, else a new one.
    fn experiment_flag(
        &self,
        project: u64,
        key: &str,
        name: &str,
        filters: FlagFilters,
    ) -> Result<FlagRecord, RecordError> {
        let found = match self.flags.live_flag_by_key(project, key)? {
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
                    return Err(flag_key_taken());
                }
                existing
            }
            None => {
                let definition = FlagDefinition::new(
                    key.to_string(),
                    format!("Feature Flag for Experiment {name}"),
                    filters,
                    false,
                );
                // Another writer may create the key first, on any node: the store decides.
                self.flags
                    .create(project, definition)
                    .map_err(|e| match e {
                        StoreError::Invalid {
                            attr: Some("key"), ..
                        } => flag_key_taken(),
                        other => other.into(),
                    })?
            }
        };
        Ok(found)
    }

    pub(super) fn update(
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
            self.flags.modify(project, e.feature_flag_id, |f| {
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

    pub(super) fn act(
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
                self.flags.modify(project, flag, |f| f.active = true)?;
                e.start_date = Some(now);
            }
            Action::Pause => {
                if status != Status::Running {
                    return refuse("pause", "running");
                }
                self.flags.modify(project, flag, |f| f.active = false)?;
                e.paused = true;
            }
            Action::Resume => {
                if status != Status::Paused {
                    return refuse("resume", "paused");
                }
                self.flags.modify(project, flag, |f| f.active = true)?;
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
                self.ship(project, &e, &variant, release_to_everyone)?;
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

    /// Ships `variant`: the experiment's flag serves it to everyone it matched (and to
    /// everyone with `release_to_everyone`), without the holdout, and turns on.
    fn ship(
        &self,
        project: u64,
        e: &Experiment,
        variant: &str,
        release_to_everyone: bool,
    ) -> Result<(), RecordError> {
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
        self.flags.modify(project, e.feature_flag_id, |f| {
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
        Ok(())
    }
}

/// PostHog's answer to an experiment whose flag key is taken by a flag it cannot reuse.
fn flag_key_taken() -> RecordError {
    RecordError::invalid(
        "There is already a feature flag with this key. An experiment can reuse it only if it \
         is a multivariate flag with a `control` variant that no other experiment uses.",
        "feature_flag_key",
    )
}
