//! Surveys: definitions, the flags that decide who sees them, the public list the browser SDK
//! fetches, statistics from captured events, and the upkeep that stops a survey at its
//! response limit and moves iterating surveys to their next iteration.
//!
//! [`Surveys`] is the one door. Writes are serialised (one lock) because a survey and its flags
//! change together; reads of a project's surveys come from memory after the first.

mod model;
pub(crate) mod stats;
mod targeting;
mod validate;

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use dashmap::DashMap;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::flags::model::FlagDefinition;
use crate::flags::store::{FlagRecord, FlagStore};
use crate::kernel::StoreError;
use crate::kernel::{blocking, RecordStore};
use crate::query::QueryEngine;
use crate::surface::RecordError;

pub use model::{EventStats, Survey, SurveyChanges, SurveyStats, SurveyType};
pub use stats::Period;
pub use targeting::FLAG_PREFIX;
pub use validate::QUESTION_TYPES;

/// The largest `iteration_count` accepted (PostHog's `MAX_ITERATION_COUNT`).
pub const MAX_ITERATIONS: u64 = 500;

/// The surveys facade. Cheap to clone.
#[derive(Clone)]
pub struct Surveys {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn RecordStore<Survey>>,
    flags: Arc<FlagStore>,
    query: Arc<QueryEngine>,
    /// Each project's surveys, loaded on first use and replaced on every write.
    cache: DashMap<u64, Arc<Vec<Survey>>>,
    writes: Mutex<()>,
}

/// A survey with the flags it names, ready to render.
#[derive(Debug, Clone)]
pub struct SurveyView {
    pub survey: Survey,
    pub linked_flag: Option<FlagRecord>,
    pub targeting_flag: Option<FlagRecord>,
    pub internal_targeting_flag: Option<FlagRecord>,
}

/// Who created a survey (the user summary shown as `created_by`).
pub type Creator = Option<Value>;

impl Surveys {
    pub fn new(
        store: Arc<dyn RecordStore<Survey>>,
        flags: Arc<FlagStore>,
        query: Arc<QueryEngine>,
    ) -> Surveys {
        Surveys {
            inner: Arc::new(Inner {
                store,
                flags,
                query,
                cache: DashMap::new(),
                writes: Mutex::new(()),
            }),
        }
    }

    /// The project's surveys, archived ones included (`archived` filters when given).
    pub async fn list(
        &self,
        project: u64,
        archived: Option<bool>,
    ) -> Result<Vec<SurveyView>, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let mut surveys: Vec<Survey> = inner.surveys(project)?.as_ref().clone();
            surveys.retain(|s| archived.is_none_or(|a| s.archived == a));
            surveys.sort_by_key(|s| std::cmp::Reverse(s.created_at));
            inner.views(project, surveys)
        })
        .await
    }

    pub async fn get(&self, project: u64, id: Uuid) -> Result<SurveyView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let survey = inner.survey(project, id)?;
            Ok(inner.views(project, vec![survey])?.remove(0))
        })
        .await
    }

    pub async fn create(
        &self,
        project: u64,
        changes: SurveyChanges,
        created_by: Creator,
    ) -> Result<SurveyView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let _guard = inner.lock();
            let survey = inner.create(project, changes, created_by, Utc::now())?;
            Ok(inner.views(project, vec![survey])?.remove(0))
        })
        .await
    }

    pub async fn update(
        &self,
        project: u64,
        id: Uuid,
        changes: SurveyChanges,
    ) -> Result<SurveyView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let _guard = inner.lock();
            let survey = inner.update(project, id, changes, Utc::now())?;
            Ok(inner.views(project, vec![survey])?.remove(0))
        })
        .await
    }

    /// Surveys are archived, never hard deleted: their responses stay meaningful.
    pub async fn archive(&self, project: u64, id: Uuid) -> Result<(), RecordError> {
        let changes = SurveyChanges {
            archived: Some(true),
            ..SurveyChanges::default()
        };
        self.update(project, id, changes).await.map(|_| ())
    }

    /// What the browser SDK fetches: every non-archived survey, without the fields PostHog
    /// keeps private (`description`, `responses_limit`, creator).
    pub async fn public(&self, project: u64) -> Result<Vec<Value>, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let mut surveys: Vec<Survey> = inner.surveys(project)?.as_ref().clone();
            surveys.retain(|s| !s.archived);
            surveys.sort_by_key(|s| s.created_at);
            Ok(inner
                .views(project, surveys)?
                .iter()
                .map(SurveyView::public_json)
                .collect())
        })
        .await
    }

    /// Whether the project has a running survey (remote config's `surveys`).
    pub async fn any_running(&self, project: u64) -> Result<bool, RecordError> {
        if let Some(cached) = self.inner.cache.get(&project) {
            return Ok(cached.iter().any(Survey::is_running));
        }
        let inner = Arc::clone(&self.inner);
        blocking(move || Ok(inner.surveys(project)?.iter().any(Survey::is_running))).await
    }

    /// Shown / dismissed / sent statistics of one survey.
    pub async fn stats(
        &self,
        project: u64,
        id: Uuid,
        period: Period,
    ) -> Result<(Survey, SurveyStats), RecordError> {
        let inner = Arc::clone(&self.inner);
        let survey = blocking(move || inner.survey(project, id)).await?;
        let stats = stats::survey_stats(&self.inner.query, project, id, period).await?;
        Ok((survey, stats))
    }

    /// Upkeep, run periodically: surveys that reached their `responses_limit` stop (end date
    /// set, flags off), and iterating surveys move to the iteration `now` falls in. Returns the
    /// surveys it stopped.
    pub async fn maintain(&self, now: DateTime<Utc>) -> Result<Vec<Uuid>, RecordError> {
        let inner = Arc::clone(&self.inner);
        let all = blocking(move || Ok::<_, RecordError>(inner.store.list_all()?)).await?;
        let mut limited: std::collections::BTreeMap<u64, Vec<(Uuid, DateTime<Utc>, u64)>> =
            Default::default();
        let mut advance = Vec::new();
        for (project, s) in &all {
            if !s.is_running() {
                continue;
            }
            if let (Some(limit), Some(start)) = (s.responses_limit, s.start_date) {
                limited
                    .entry(*project)
                    .or_default()
                    .push((s.id, start, limit));
            }
            if s.iterates() && iteration_at(s, now).map(|(i, _)| i) != s.current_iteration {
                advance.push((*project, s.id));
            }
        }
        let mut stopped = Vec::new();
        for (project, surveys) in limited {
            let since: Vec<(Uuid, DateTime<Utc>)> =
                surveys.iter().map(|(id, start, _)| (*id, *start)).collect();
            let counts = stats::response_counts(&self.inner.query, project, &since).await?;
            for ((id, _, limit), (_, count)) in surveys.iter().zip(counts) {
                if count >= *limit {
                    stopped.push((project, *id));
                }
            }
        }
        let inner = Arc::clone(&self.inner);
        let done = stopped.iter().map(|(_, id)| *id).collect();
        blocking(move || {
            let _guard = inner.lock();
            for (project, id) in stopped {
                let stop = SurveyChanges {
                    end_date: Some(Value::String(now.to_rfc3339())),
                    ..SurveyChanges::default()
                };
                inner.update(project, id, stop, now)?;
                tracing::info!(project, survey = %id, "survey reached its response limit");
            }
            for (project, id) in advance {
                inner.update(project, id, SurveyChanges::default(), now)?;
            }
            Ok::<_, RecordError>(())
        })
        .await?;
        Ok(done)
    }
}

/// The iteration (1-based) `now` falls in and its start, for a launched iterating survey.
fn iteration_at(survey: &Survey, now: DateTime<Utc>) -> Option<(u32, DateTime<Utc>)> {
    survey
        .iteration_start_dates
        .iter()
        .enumerate()
        .rfind(|(_, start)| **start <= now)
        .map(|(i, start)| (i as u32 + 1, *start))
        .or_else(|| {
            survey
                .iteration_start_dates
                .first()
                .map(|start| (1, *start))
        })
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn surveys(&self, project: u64) -> Result<Arc<Vec<Survey>>, StoreError> {
        if let Some(cached) = self.cache.get(&project) {
            return Ok(Arc::clone(&cached));
        }
        self.reload(project)
    }

    fn reload(&self, project: u64) -> Result<Arc<Vec<Survey>>, StoreError> {
        let surveys = Arc::new(self.store.list(project)?);
        self.cache.insert(project, Arc::clone(&surveys));
        Ok(surveys)
    }

    fn survey(&self, project: u64, id: Uuid) -> Result<Survey, RecordError> {
        self.surveys(project)?
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .ok_or(RecordError::NotFound { what: "Survey" })
    }

    fn views(&self, project: u64, surveys: Vec<Survey>) -> Result<Vec<SurveyView>, RecordError> {
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

    fn create(
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

    fn update(
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
    fn apply(
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
                    .modify_flag(project, id, |f| {
                        f.filters = filters;
                        f.active = active;
                        f.name = name;
                    })?
                    .map(|f| f.definition.id)
            }
            None => None,
        };
        if survey.internal_targeting_flag_id.is_none() {
            let flag = self
                .flags
                .save_flag(project, targeting::internal_flag(&survey), None)?;
            survey.internal_targeting_flag_id = Some(flag.definition.id);
        }

        // The targeting flag: created from filters, updated, or removed.
        let targeting_active = survey.end_date.is_none() && !survey.archived;
        if changes.remove_targeting_flag == Some(true)
            || changes.targeting_flag_filters == Some(Value::Null)
        {
            if let Some(id) = survey.targeting_flag_id.take() {
                self.flags.modify_flag(project, id, |f| f.deleted = true)?;
            }
        } else if let Some(filters) = targeting {
            let existing = match survey.targeting_flag_id {
                Some(id) => self.flags.modify_flag(project, id, |f| {
                    f.filters = filters.clone();
                    f.active = targeting_active;
                })?,
                None => None,
            };
            let flag = match existing {
                Some(flag) => flag,
                None => self.flags.save_flag(
                    project,
                    FlagDefinition::new(
                        targeting::new_key(""),
                        format!("Targeting flag for survey {}", survey.name),
                        filters,
                        targeting_active,
                    ),
                    None,
                )?,
            };
            survey.targeting_flag_id = Some(flag.definition.id);
        } else if let Some(id) = survey.targeting_flag_id {
            self.flags
                .modify_flag(project, id, |f| f.active = targeting_active)?;
        }

        self.store.put(project, &survey.id.to_string(), &survey)?;
        self.reload(project)?;
        Ok(survey)
    }

    /// The plain fields of a create or update body.
    fn change_fields(
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
            survey.iteration_count = count.map(|n| n as u32);
        }
        if let Some(days) = c.iteration_frequency_days {
            survey.iteration_frequency_days =
                validate::optional_count(days, "iteration_frequency_days")?.map(|d| d as u32);
        }
        if let Some(partial) = c.enable_partial_responses {
            survey.enable_partial_responses = partial;
        }
        Ok(())
    }
}

/// Iteration dates of a launched iterating survey, and the iteration `now` falls in.
fn plan_iterations(
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
            .map(|k| start + Duration::days(i64::from(k) * i64::from(days)))
            .collect();
    }
    if let Some((iteration, begun)) = iteration_at(survey, now) {
        survey.current_iteration = Some(iteration);
        survey.current_iteration_start_date = Some(begun);
    }
    Ok(())
}

impl SurveyView {
    fn flag_key(flag: &Option<FlagRecord>) -> Value {
        flag.as_ref()
            .map(|f| Value::String(f.definition.key.clone()))
            .unwrap_or(Value::Null)
    }

    /// The admin API's shape.
    pub fn admin_json(&self) -> Value {
        let s = &self.survey;
        let summary = |f: &Option<FlagRecord>| f.as_ref().map(FlagRecord::summary);
        json!({
            "id": s.id,
            "name": s.name,
            "description": s.description,
            "type": s.kind,
            "schedule": s.schedule,
            "linked_flag": summary(&self.linked_flag),
            "linked_flag_id": s.linked_flag_id,
            "linked_insight_id": s.linked_insight_id,
            "targeting_flag": summary(&self.targeting_flag),
            "internal_targeting_flag": summary(&self.internal_targeting_flag),
            "questions": s.questions,
            "conditions": s.conditions,
            "appearance": s.appearance,
            "created_at": s.created_at,
            "created_by": s.created_by,
            "start_date": s.start_date,
            "end_date": s.end_date,
            "archived": s.archived,
            "responses_limit": s.responses_limit,
            "feature_flag_keys": [
                {"key": "linked_flag_key", "value": Self::flag_key(&self.linked_flag)},
                {"key": "targeting_flag_key", "value": Self::flag_key(&self.targeting_flag)},
                {"key": "internal_targeting_flag_key", "value": Self::flag_key(&self.internal_targeting_flag)},
                {"key": "internal_response_sampling_flag_key", "value": null},
            ],
            "iteration_count": s.iteration_count,
            "iteration_frequency_days": s.iteration_frequency_days,
            "iteration_start_dates": s.iteration_start_dates,
            "current_iteration": s.current_iteration,
            "current_iteration_start_date": s.current_iteration_start_date,
            "response_sampling_start_date": null,
            "response_sampling_interval_type": null,
            "response_sampling_interval": null,
            "response_sampling_limit": null,
            "response_sampling_daily_limits": null,
            "enable_partial_responses": s.enable_partial_responses,
        })
    }

    /// The public (`/api/surveys/?token=`) shape: what posthog-js reads.
    pub fn public_json(&self) -> Value {
        let s = &self.survey;
        json!({
            "id": s.id,
            "name": s.name,
            "type": s.kind,
            "linked_flag_key": Self::flag_key(&self.linked_flag),
            "targeting_flag_key": Self::flag_key(&self.targeting_flag),
            "internal_targeting_flag_key": Self::flag_key(&self.internal_targeting_flag),
            "questions": s.questions,
            "conditions": s.conditions,
            "appearance": s.appearance,
            "start_date": s.start_date,
            "end_date": s.end_date,
            "current_iteration": s.current_iteration,
            "current_iteration_start_date": s.current_iteration_start_date,
            "schedule": s.schedule,
            "enable_partial_responses": s.enable_partial_responses,
        })
    }
}

#[cfg(test)]
mod tests;
