//! The facade's operations, and the upkeep that stops surveys at their limits and moves iterations on.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use serde_json::Value;
use uuid::Uuid;

use super::model::{Survey, SurveyChanges, SurveyStats};
use super::stats::Period;
use super::{stats, Creator, Inner, SurveyView, Surveys, UPKEEP_RETRY, UPKEEP_RETRY_MAX};
use crate::surface::RecordError;
use corvid_activity::{acting_as, Actor};
use corvid_flags::OwnedFlags;
use corvid_kernel::{blocking, DefinitionRecords};
use corvid_query::QueryEngine;

impl Surveys {
    pub fn new(
        store: Arc<dyn DefinitionRecords<Survey>>,
        flags: Arc<OwnedFlags>,
        query: Arc<QueryEngine>,
    ) -> Surveys {
        Surveys {
            inner: Arc::new(Inner {
                store,
                flags,
                query,
                cache: DashMap::new(),
                writes: Mutex::new(()),
                upkeep: Mutex::new(corvid_kernel::Backoff::new(UPKEEP_RETRY, UPKEEP_RETRY_MAX)),
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
        actor: &Actor,
        changes: SurveyChanges,
        created_by: Creator,
    ) -> Result<SurveyView, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let survey = inner.create(project, changes, created_by, Utc::now())?;
                Ok(inner.views(project, vec![survey])?.remove(0))
            })
        })
        .await
    }

    pub async fn update(
        &self,
        project: u64,
        actor: &Actor,
        id: Uuid,
        changes: SurveyChanges,
    ) -> Result<SurveyView, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let survey = inner.update(project, id, changes, Utc::now())?;
                Ok(inner.views(project, vec![survey])?.remove(0))
            })
        })
        .await
    }

    /// Surveys are archived, never hard deleted: their responses stay meaningful.
    pub async fn archive(&self, project: u64, actor: &Actor, id: Uuid) -> Result<(), RecordError> {
        let changes = SurveyChanges {
            archived: Some(true),
            ..SurveyChanges::default()
        };
        self.update(project, actor, id, changes).await.map(|_| ())
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
    /// surveys it stopped. A survey (or a project's response count) that errs or panics is
    /// logged and retried after a growing wait; the others go on.
    pub async fn maintain(&self, now: DateTime<Utc>) -> Result<Vec<Uuid>, RecordError> {
        use futures_util::FutureExt;
        let inner = Arc::clone(&self.inner);
        let all = blocking(move || Ok::<_, RecordError>(inner.store.list_all()?)).await?;
        let clock = std::time::Instant::now();
        let mut limited: std::collections::BTreeMap<u64, Vec<(Uuid, DateTime<Utc>, u64)>> =
            Default::default();
        let mut advance = Vec::new();
        {
            let backoff = self.inner.upkeep_backoff();
            for (project, s) in &all {
                if !s.is_running() || !backoff.ready(&s.id, clock) {
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
        }
        let mut stopped = Vec::new();
        for (project, surveys) in limited {
            let since: Vec<(Uuid, DateTime<Utc>)> =
                surveys.iter().map(|(id, start, _)| (*id, *start)).collect();
            let counting = stats::response_counts(&self.inner.query, project, &since);
            let counted = std::panic::AssertUnwindSafe(QueryEngine::waiting(counting))
                .catch_unwind()
                .await;
            let counts = match counted {
                Ok(Ok(counts)) => counts,
                Ok(Err(err)) => {
                    self.inner.upkeep_failed(&since, &err.to_string(), clock);
                    continue;
                }
                Err(panic) => {
                    let error = format!("panicked: {}", corvid_kernel::panic_message(&*panic));
                    self.inner.upkeep_failed(&since, &error, clock);
                    continue;
                }
            };
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
            let stops = stopped.into_iter().map(|(project, id)| {
                let stop = SurveyChanges {
                    end_date: Some(Value::String(now.to_rfc3339())),
                    ..SurveyChanges::default()
                };
                (project, id, stop)
            });
            let moves = advance
                .into_iter()
                .map(|(project, id)| (project, id, SurveyChanges::default()));
            for (project, id, change) in stops.chain(moves) {
                let stopping = change.end_date.is_some();
                match corvid_kernel::contain(|| inner.update(project, id, change, now)) {
                    Ok(_) if stopping => {
                        tracing::info!(project, survey = %id, "survey reached its response limit")
                    }
                    Ok(_) => inner.upkeep_backoff().succeeded(&id),
                    Err(error) => inner.upkeep_failed(&[(id, now)], &error, clock),
                }
            }
            Ok::<_, RecordError>(())
        })
        .await?;
        Ok(done)
    }
}

impl Inner {
    fn upkeep_backoff(&self) -> std::sync::MutexGuard<'_, corvid_kernel::Backoff<Uuid>> {
        self.upkeep.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs a failed upkeep of `surveys` and makes them wait.
    fn upkeep_failed(
        &self,
        surveys: &[(Uuid, DateTime<Utc>)],
        error: &str,
        now: std::time::Instant,
    ) {
        let mut backoff = self.upkeep_backoff();
        for (id, _) in surveys {
            let wait = backoff.failed(*id, now);
            tracing::warn!(survey = %id, %error, ?wait, "survey upkeep failed; the others go on");
        }
    }
}

/// The iteration (1-based) `now` falls in and its start, for a launched iterating survey.
pub(super) fn iteration_at(survey: &Survey, now: DateTime<Utc>) -> Option<(u32, DateTime<Utc>)> {
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
