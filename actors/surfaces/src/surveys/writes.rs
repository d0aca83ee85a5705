//! The locked read-modify-writes behind the operations: a survey and its targeting flags change together.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::model::{Survey, SurveyChanges, SurveyType};
use super::{
    iteration_at, targeting, validate, Creator, Inner, SurveyView, MAX_ITERATIONS,
    MAX_ITERATION_DAYS,
};
use crate::surface::RecordError;
use corvid_flags::FlagDefinition;
use corvid_kernel::StoreError;

impl Inner {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn surveys(&self, project: u64) -> Result<Arc<Vec<Survey>>, StoreError> {
        if let Some(cached) = self.cache.get(&project) {
            return Ok(Arc::clone(&cached));
        }
        self.reload(project)
    }

    pub(super) fn reload(&self, project: u64) -> Result<Arc<Vec<Survey>>, StoreError> {
        let surveys = Arc::new(self.store.list(project)?);
        self.cache.insert(project, Arc::clone(&surveys));
        Ok(surveys)
    }

    pub(super) fn survey(&self, project: u64, id: Uuid) -> Result<Survey, RecordError> {
        self.surveys(project)?
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .ok_or(RecordError::NotFound { what: "Survey" })
    }

    pub(super) fn views(
        &self,
        project: u64,
        surveys: Vec<Survey>,
    ) -> Result<Vec<SurveyView>, RecordError> {
        let flags = self.flags.flags(project)?;
        let find = |id: Option<i64>| {
            id.and_then(|id| flags.iter().find(|f| f.definition.id == id).cloned())
        };
        Ok(surveys
            .into_iter()
            .map(|survey| SurveyView {
                linked_flag: find(survey.linked_flag_id),
                targeting_flag: find(survey.targeting_flag_id),
                internal_targeting_flag: find(survey.internal_targeting_flag_id),
                survey,
            })
            .collect())
    }

    pub(super) fn create(
        &self,
        project: u64,
        changes: SurveyChanges,
        created_by: Creator,
        now: DateTime<Utc>,
    ) -> Result<Survey, RecordError> {
        let name = changes.name.clone().unwrap_or_default();
        if name.trim().is_empty() {
            return Err(RecordError::invalid("This field is required.", "name"));
        }
        if changes.kind.is_none() {
            return Err(RecordError::invalid("This field is required.", "type"));
        }
        if changes.questions.is_none() {
            return Err(RecordError::invalid("This field is required.", "questions"));
        }
        let blank = Survey {
            id: Uuid::now_v7(),
            project_id: project,
            name,
            description: String::new(),
            kind: SurveyType::Popover,
            schedule: Some("once".into()),
            linked_flag_id: None,
            linked_insight_id: None,
            targeting_flag_id: None,
            internal_targeting_flag_id: None,
            questions: Vec::new(),
            conditions: None,
            appearance: None,
            start_date: None,
            end_date: None,
            archived: false,
            responses_limit: None,
            iteration_count: None,
            iteration_frequency_days: None,
            iteration_start_dates: Vec::new(),
            current_iteration: None,
            current_iteration_start_date: None,
            enable_partial_responses: false,
            created_at: now,
            created_by,
        };
        self.apply(project, blank, None, changes, now)
    }

    pub(super) fn update(
        &self,
        project: u64,
        id: Uuid,
        changes: SurveyChanges,
        now: DateTime<Utc>,
    ) -> Result<Survey, RecordError> {
        let old = self.survey(project, id)?;
        self.apply(project, old.clone(), Some(old), changes, now)
    }

    /// Validates `changes` onto `survey`, brings its flags in line and stores it.
    pub(super) fn apply(
        &self,
        project: u64,
        mut survey: Survey,
        old: Option<Survey>,
        changes: SurveyChanges,
        now: DateTime<Utc>,
    ) -> Result<Survey, RecordError> {
        let targeting = changes
            .targeting_flag_filters
            .clone()
            .filter(|v| !v.is_null())
            .map(targeting::targeting_filters)
            .transpose()?;
        self.change_fields(project, &mut survey, old.as_ref(), changes.clone())?;
        plan_iterations(&mut survey, old.as_ref(), now)?;

        // The internal targeting flag always exists and follows the survey's state.
        survey.internal_targeting_flag_id = match survey.internal_targeting_flag_id {
            Some(id) => {
                let filters = targeting::internal_filters(&survey);
                let active = survey.is_running();
                let name = format!("Targeting flag for survey {}", survey.name);
                self.flags
                    .modify(project, id, |f| {
                        f.filters = filters;
                        f.active = active;
                        f.name = name;
                    })?
                    .map(|f| f.definition.id)
            }
            None => None,
        };
        // Flags created by this write, withdrawn if the survey itself cannot be saved.
        let mut created = Vec::new();
        if survey.internal_targeting_flag_id.is_none() {
            let flag = self
                .flags
                .create(project, targeting::internal_flag(&survey))?;
            created.push(flag.definition.id);
            survey.internal_targeting_flag_id = Some(flag.definition.id);
        }

        // The targeting flag: created from filters, updated, or removed.
        let targeting_active = survey.end_date.is_none() && !survey.archived;
        if changes.remove_targeting_flag == Some(true)
            || changes.targeting_flag_filters == Some(Value::Null)
        {
            if let Some(id) = survey.targeting_flag_id.take() {
                let removed = self.flags.modify(project, id, |f| f.deleted = true);
                self.withdrawing(project, &created, removed)?;
            }
        } else if let Some(filters) = targeting {
            let existing = match survey.targeting_flag_id {
                Some(id) => {
                    let changed = self.flags.modify(project, id, |f| {
                        f.filters = filters.clone();
                        f.active = targeting_active;
                    });
                    self.withdrawing(project, &created, changed)?
                }
                None => None,
            };
            let flag = match existing {
                Some(flag) => flag,
                None => {
                    let flag = self.flags.create(
                        project,
                        FlagDefinition::new(
                            targeting::new_key(""),
                            format!("Targeting flag for survey {}", survey.name),
                            filters,
                            targeting_active,
                        ),
                    );
                    let flag = self.withdrawing(project, &created, flag)?;
                    created.push(flag.definition.id);
                    flag
                }
            };
            survey.targeting_flag_id = Some(flag.definition.id);
        } else if let Some(id) = survey.targeting_flag_id {
            let changed = self
                .flags
                .modify(project, id, |f| f.active = targeting_active);
            self.withdrawing(project, &created, changed)?;
        }

        let saved = self.store.put(project, &survey.id.to_string(), &survey);
        self.withdrawing(project, &created, saved)?;
        self.reload(project)?;
        Ok(survey)
    }

    /// `result`, after withdrawing the flags `created` for a survey when it failed.
    fn withdrawing<T, E: Into<RecordError>>(
        &self,
        project: u64,
        created: &[i64],
        result: Result<T, E>,
    ) -> Result<T, RecordError> {
        result.map_err(|e| {
            for id in created {
                self.flags.withdraw(project, *id);
            }
            e.into()
        })
    }

    /// The plain fields of a create or update body.
    pub(super) fn change_fields(
        &self,
        project: u64,
        survey: &mut Survey,
        old: Option<&Survey>,
        c: SurveyChanges,
    ) -> Result<(), RecordError> {
        if let Some(name) = c.name {
            if name.trim().is_empty() {
                return Err(RecordError::invalid("This field may not be blank.", "name"));
            }
            let taken = self
                .surveys(project)?
                .iter()
                .any(|s| s.id != survey.id && !s.archived && s.name == name);
            if taken {
                return Err(RecordError::invalid(
                    if old.is_some() {
                        "There is already another survey with this name."
                    } else {
                        "There is already a survey with this name."
                    },
                    "name",
                ));
            }
            survey.name = name;
        }
        if let Some(description) = c.description {
            survey.description = description;
        }
        if let Some(kind) = c.kind {
            survey.kind = SurveyType::parse(&kind).ok_or_else(|| {
                RecordError::invalid(format!("\"{kind}\" is not a valid choice."), "type")
            })?;
        }
        if let Some(schedule) = c.schedule {
            survey.schedule = validate::schedule(schedule)?;
        }
        if let Some(linked) = c.linked_flag_id {
            survey.linked_flag_id = match linked {
                Value::Null => None,
                id => {
                    let missing = || {
                        RecordError::invalid(
                            "Feature Flag with this ID does not exist",
                            "linked_flag_id",
                        )
                    };
                    let id = id.as_i64().ok_or_else(missing)?;
                    self.flags.live_flag(project, id)?.ok_or_else(missing)?;
                    Some(id)
                }
            };
        }
        if let Some(insight) = c.linked_insight_id {
            survey.linked_insight_id = insight.as_i64();
        }
        if let Some(questions) = c.questions {
            survey.questions = validate::questions(questions)?;
        }
        if let Some(conditions) = c.conditions {
            survey.conditions = validate::conditions(conditions)?;
        }
        if let Some(appearance) = c.appearance {
            survey.appearance = validate::appearance(appearance)?;
        }
        if let Some(start) = c.start_date {
            survey.start_date = validate::optional_date(start, "start_date")?;
        }
        if let Some(end) = c.end_date {
            survey.end_date = validate::optional_date(end, "end_date")?;
        }
        if let Some(archived) = c.archived {
            survey.archived = archived;
        }
        if let Some(limit) = c.responses_limit {
            survey.responses_limit = validate::optional_count(limit, "responses_limit")?;
        }
        if let Some(count) = c.iteration_count {
            let count = validate::optional_count(count, "iteration_count")?;
            if count.is_some_and(|n| n > MAX_ITERATIONS) {
                return Err(RecordError::invalid(
                    format!("Iteration count must be at most {MAX_ITERATIONS}."),
                    "iteration_count",
                ));
            }
            if let (Some(n), Some(current)) = (count, survey.current_iteration) {
                if survey.start_date.is_some() && n < u64::from(current) {
                    return Err(RecordError::invalid(
                        format!(
                            "Cannot change survey recurrence to {n}, should be at least {current}"
                        ),
                        "iteration_count",
                    ));
                }
            }
            survey.iteration_count = count.and_then(|n| u32::try_from(n).ok());
        }
        if let Some(days) = c.iteration_frequency_days {
            let days = validate::optional_count(days, "iteration_frequency_days")?;
            if days.is_some_and(|d| d > MAX_ITERATION_DAYS) {
                return Err(RecordError::invalid(
                    format!("Iteration frequency must be at most {MAX_ITERATION_DAYS} days."),
                    "iteration_frequency_days",
                ));
            }
            survey.iteration_frequency_days = days.and_then(|d| u32::try_from(d).ok());
        }
        if let Some(partial) = c.enable_partial_responses {
            survey.enable_partial_responses = partial;
        }
        Ok(())
    }
}

/// Iteration dates of a launched iterating survey, and the iteration `now` falls in.
pub(super) fn plan_iterations(
    survey: &mut Survey,
    old: Option<&Survey>,
    now: DateTime<Utc>,
) -> Result<(), RecordError> {
    if !survey.iterates() {
        survey.iteration_start_dates.clear();
        survey.current_iteration = None;
        survey.current_iteration_start_date = None;
        return Ok(());
    }
    let days = survey.iteration_frequency_days.unwrap_or(0);
    if days == 0 {
        return Err(RecordError::invalid(
            "Iteration frequency (days) must be set for a repeating survey.",
            "iteration_frequency_days",
        ));
    }
    let Some(start) = survey.start_date else {
        return Ok(());
    };
    let unchanged = old.is_some_and(|o| {
        o.start_date == survey.start_date
            && o.iteration_count == survey.iteration_count
            && o.iteration_frequency_days == survey.iteration_frequency_days
            && !o.iteration_start_dates.is_empty()
    });
    if !unchanged {
        let count = survey.iteration_count.unwrap_or(0);
        survey.iteration_start_dates = (0..count)
            .map(|k| {
                i64::from(k)
                    .checked_mul(i64::from(days))
                    .and_then(Duration::try_days)
                    .and_then(|offset| start.checked_add_signed(offset))
            })
            .collect::<Option<_>>()
            .ok_or_else(|| {
                RecordError::invalid(
                    "The survey's iterations would end past the last representable date.",
                    "iteration_count",
                )
            })?;
    }
    if let Some((iteration, begun)) = iteration_at(survey, now) {
        survey.current_iteration = Some(iteration);
        survey.current_iteration_start_date = Some(begun);
    }
    Ok(())
}
