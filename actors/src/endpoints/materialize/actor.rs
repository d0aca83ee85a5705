//! The materializer actor: on a timer (and when kicked), finds materialized endpoint versions
//! whose result is missing, stale or failed, computes each on the query runtime and stores it
//! as an Arrow IPC object, then records Completed (with the object key) or Failed (with the
//! error). One job per version at a time; superseded objects are deleted.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Results;
use crate::endpoints::model::{Endpoint, MaterializationStatus};
use crate::endpoints::store::EndpointStore;
use crate::meta::Tenancy;
use crate::query::QueryEngine;

/// What a materialization job needs.
pub struct Materializer {
    pub store: Arc<EndpointStore>,
    pub tenancy: Tenancy,
    pub engine: Arc<QueryEngine>,
    pub results: Arc<Results>,
    /// How often the schedule is checked.
    pub interval: Duration,
    /// How long after a failure a version is retried.
    pub retry_after: Duration,
    in_flight: HashSet<(Uuid, u32)>,
    counters: Counters,
}

/// What the materializer has done, answered to [`GetMaterializerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, MessageResponse)]
pub struct MaterializerStats {
    /// Jobs running now.
    pub running: usize,
    /// Versions found due at the last scan.
    pub due: usize,
    /// How long the most overdue version has waited past its freshness (or retry) time, in
    /// seconds, at the last scan: the materializer's lag.
    pub lag_seconds: f64,
    pub completed: u64,
    pub failed: u64,
}

/// The materializer's counters.
#[derive(Debug, Default)]
struct Counters {
    due: usize,
    lag_seconds: f64,
    completed: u64,
    failed: u64,
}

/// Asks for [`MaterializerStats`].
#[derive(Message)]
#[rtype(result = "MaterializerStats")]
pub struct GetMaterializerStats;

impl Materializer {
    pub fn new(
        store: Arc<EndpointStore>,
        tenancy: Tenancy,
        engine: Arc<QueryEngine>,
        results: Arc<Results>,
        interval: Duration,
        retry_after: Duration,
    ) -> Materializer {
        Materializer {
            store,
            tenancy,
            engine,
            results,
            interval,
            retry_after,
            in_flight: HashSet::new(),
            counters: Counters::default(),
        }
    }
}

/// Check the schedule now (materialization was just enabled).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Kick;

impl Actor for Materializer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.interval, |this, ctx| this.schedule(ctx));
        self.schedule(ctx);
    }
}

impl Handler<GetMaterializerStats> for Materializer {
    type Result = MaterializerStats;

    fn handle(&mut self, _: GetMaterializerStats, _: &mut Context<Self>) -> MaterializerStats {
        let c = &self.counters;
        MaterializerStats {
            running: self.in_flight.len(),
            due: c.due,
            lag_seconds: c.lag_seconds,
            completed: c.completed,
            failed: c.failed,
        }
    }
}

impl Handler<Kick> for Materializer {
    type Result = ();

    fn handle(&mut self, _: Kick, ctx: &mut Context<Self>) {
        self.schedule(ctx);
    }
}

/// One version to (re)compute.
#[derive(Debug, Clone)]
struct Job {
    project_id: u64,
    name: String,
    endpoint_id: Uuid,
    version: u32,
    query: serde_json::Value,
    previous_key: Option<String>,
    /// Since when the version has been due.
    due_since: DateTime<Utc>,
}

fn due_jobs(endpoints: Vec<Endpoint>, now: DateTime<Utc>, retry_after: Duration) -> Vec<Job> {
    let retry = chrono::Duration::from_std(retry_after).unwrap_or(chrono::Duration::minutes(1));
    let mut jobs = Vec::new();
    for e in endpoints.into_iter().filter(|e| e.is_active) {
        for v in e.versions.iter().filter(|v| v.is_active) {
            let Some(m) = &v.materialization else {
                continue;
            };
            let freshness = chrono::Duration::seconds(v.data_freshness_seconds as i64);
            let due_since = match m.status {
                MaterializationStatus::Running => Some(m.last_attempt_at.unwrap_or(now)),
                MaterializationStatus::Completed => match m.last_run_at {
                    None => Some(now),
                    Some(t) => Some(t + freshness).filter(|at| *at <= now),
                },
                MaterializationStatus::Failed => match m.last_attempt_at {
                    None => Some(now),
                    Some(t) => Some(t + retry).filter(|at| *at <= now),
                },
            };
            if let Some(due_since) = due_since {
                jobs.push(Job {
                    project_id: e.project_id,
                    name: e.name.clone(),
                    endpoint_id: e.id,
                    version: v.version,
                    query: v.query.clone(),
                    previous_key: m.object_key.clone(),
                    due_since,
                });
            }
        }
    }
    jobs
}

impl Materializer {
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        let store = Arc::clone(&self.store);
        let retry_after = self.retry_after;
        let now = Utc::now();
        let scan = async move {
            tokio::task::spawn_blocking(move || store.all_endpoints())
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
                .map(|all| due_jobs(all, now, retry_after))
        };
        ctx.spawn(
            scan.into_actor(self)
                .map(move |jobs, this, ctx| match jobs {
                    Ok(jobs) => {
                        this.counters.due = jobs.len();
                        this.counters.lag_seconds = jobs
                            .iter()
                            .map(|j| (now - j.due_since).num_milliseconds().max(0) as f64 / 1000.0)
                            .fold(0.0, f64::max);
                        for job in jobs {
                            this.start(job, ctx);
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "materializer could not scan endpoints"),
                }),
        );
    }

    fn start(&mut self, job: Job, ctx: &mut Context<Self>) {
        let slot = (job.endpoint_id, job.version);
        if !self.in_flight.insert(slot) {
            return;
        }
        let work = run_job(
            job,
            Arc::clone(&self.store),
            self.tenancy.clone(),
            Arc::clone(&self.engine),
            Arc::clone(&self.results),
        );
        ctx.spawn(work.into_actor(self).map(move |ok, this, _| {
            this.in_flight.remove(&slot);
            if ok {
                this.counters.completed += 1;
            } else {
                this.counters.failed += 1;
            }
        }));
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

async fn run_job(
    job: Job,
    store: Arc<EndpointStore>,
    tenancy: Tenancy,
    engine: Arc<QueryEngine>,
    results: Arc<Results>,
) -> bool {
    let started = Utc::now();
    let mark = {
        let store = Arc::clone(&store);
        let job = job.clone();
        // Applies `change` to the version's materialization; false when the endpoint was
        // re-created or the materialization disabled meanwhile.
        move |change: Box<dyn FnOnce(&mut crate::endpoints::model::Materialization) + Send>| {
            let mut applied = false;
            store.update_by_id(job.project_id, &job.name, job.endpoint_id, |e| {
                if let Some(m) = e
                    .version_mut(job.version)
                    .and_then(|v| v.materialization.as_mut())
                {
                    change(m);
                    applied = true;
                }
            })?;
            Ok::<bool, crate::kernel::StoreError>(applied)
        }
    };
    let mark_attempt = mark.clone();
    let _ =
        blocking(move || mark_attempt(Box::new(move |m| m.last_attempt_at = Some(started)))).await;

    let project_id = job.project_id;
    let tz = tenancy
        .project(project_id)
        .await
        .ok()
        .flatten()
        .and_then(|p| p.timezone.parse().ok())
        .unwrap_or(chrono_tz::Tz::UTC);
    let key = format!(
        "project_{}/endpoint_{}/v{}/{}.arrow",
        job.project_id,
        job.endpoint_id.simple(),
        job.version,
        Uuid::now_v7().simple()
    );
    let outcome = match results
        .compute(&engine, job.project_id, tz, &job.query)
        .await
    {
        Ok((schema, batches)) => results
            .storage()
            .write(&key, &schema, &batches)
            .await
            .map(|_| batches.iter().map(|b| b.num_rows()).sum::<usize>()),
        Err(e) => Err(e),
    };
    match outcome {
        Ok(rows) => {
            let new_key = key.clone();
            let done = blocking(move || {
                mark(Box::new(move |m| {
                    m.status = MaterializationStatus::Completed;
                    m.last_run_at = Some(started);
                    m.error = None;
                    m.object_key = Some(new_key);
                }))
            })
            .await;
            tracing::info!(endpoint = %job.name, version = job.version, rows, "materialized endpoint result");
            if let Some(old) = &job.previous_key {
                results.evict(old);
                results.storage().delete(old).await;
            }
            // The version was disabled or deleted meanwhile: the new object is orphaned.
            if !matches!(done, Some(Ok(true))) {
                results.storage().delete(&key).await;
            }
            true
        }
        Err(e) => {
            let text = e.to_string();
            tracing::warn!(endpoint = %job.name, version = job.version, error = %text, "materialization failed");
            let _ = blocking(move || {
                mark(Box::new(move |m| {
                    m.status = MaterializationStatus::Failed;
                    m.error = Some(text);
                }))
            })
            .await;
            false
        }
    }
}
