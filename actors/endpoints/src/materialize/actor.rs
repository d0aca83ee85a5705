//! The materializer actor: on a timer (and when kicked), finds materialized endpoint versions
//! whose result is missing, stale or failed, computes each on the query runtime and stores it
//! as an Arrow IPC object, then records Completed (with the object key) or Failed (with the
//! error). One job per version at a time; superseded objects are deleted.
//!
//! A job that errs or panics marks its version failed and the actor goes on. Failed versions
//! are retried after `retry_after`, doubled for each further failure in a row (at most
//! [`MAX_BACKOFF_DOUBLINGS`] times); a run a crash cut short counts as a failure, so a version
//! whose run takes the process down is not run first again on every start; and each scan runs
//! versions that never failed before those that keep failing.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use uuid::Uuid;

use super::Results;
use crate::model::{Endpoint, MaterializationStatus};
use crate::store::EndpointStore;
use corvid_kernel::time::{add_or_max, from_std};
use corvid_kernel::JobLease;
use corvid_query::QueryEngine;
use corvid_tenancy::Tenancy;

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
    /// Which node runs a due version: of all that find it due, the one that claims it.
    pub lease: JobLease,
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
        lease: JobLease,
    ) -> Materializer {
        Materializer {
            store,
            tenancy,
            engine,
            results,
            interval,
            retry_after,
            lease,
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
    /// Failures in a row before this run.
    failures: u32,
    /// When the newest erasure of the project's events was requested: a result computed
    /// before it is due again.
    erased_at: Option<DateTime<Utc>>,
}

/// A failing version's retry wait doubles this many times at most (64 × `retry_after`).
pub const MAX_BACKOFF_DOUBLINGS: u32 = 6;

/// How long after its `failures`-th failure in a row a version is retried.
fn backoff(retry_after: Duration, failures: u32) -> chrono::TimeDelta {
    let doublings = failures.saturating_sub(1).min(MAX_BACKOFF_DOUBLINGS);
    from_std(retry_after.saturating_mul(1 << doublings))
}

/// The versions due now, those that never failed first, then by how long they have waited.
/// `erased_at` says when a project's newest erasure was requested: a result computed before
/// it is due at once.
fn due_jobs(
    endpoints: Vec<Endpoint>,
    now: DateTime<Utc>,
    retry_after: Duration,
    erased_at: &dyn Fn(u64) -> Option<DateTime<Utc>>,
) -> Vec<Job> {
    let mut jobs = Vec::new();
    for e in endpoints.into_iter().filter(|e| e.is_active) {
        let erased = erased_at(e.project_id);
        for v in e.versions.iter().filter(|v| v.is_active) {
            let Some(m) = &v.materialization else {
                continue;
            };
            let freshness = corvid_kernel::time::seconds(v.data_freshness_seconds);
            let due_since = if m.failures > 0 || m.status == MaterializationStatus::Failed {
                // The last attempt failed or was cut short (a crash, a panic): retry later.
                match m.last_attempt_at {
                    None => Some(now),
                    Some(t) => Some(add_or_max(t, backoff(retry_after, m.failures.max(1))))
                        .filter(|at| *at <= now),
                }
            } else {
                match (m.status, m.last_run_at) {
                    (MaterializationStatus::Completed, Some(t))
                        if erased.is_some_and(|erased| t < erased) =>
                    {
                        erased
                    }
                    (MaterializationStatus::Completed, Some(t)) => {
                        Some(add_or_max(t, freshness)).filter(|at| *at <= now)
                    }
                    _ => Some(m.last_attempt_at.unwrap_or(now)),
                }
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
                    failures: m.failures,
                    erased_at: erased,
                });
            }
        }
    }
    jobs.sort_by_key(|j| (j.failures, j.due_since));
    jobs
}

impl Materializer {
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        let store = Arc::clone(&self.store);
        let engine = Arc::clone(&self.engine);
        let retry_after = self.retry_after;
        let now = Utc::now();
        let scan = async move {
            tokio::task::spawn_blocking(move || {
                let all = store.all_endpoints()?;
                let erased_at = |project: u64| match engine.last_removal_blocking(project) {
                    Ok(at) => at,
                    Err(e) => {
                        tracing::warn!(project, error = %e, "removals unreadable");
                        None
                    }
                };
                Ok::<_, corvid_kernel::StoreError>(due_jobs(all, now, retry_after, &erased_at))
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
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
        let (lease, retry_after) = (self.lease.clone(), self.retry_after);
        let deps = Deps {
            store: Arc::clone(&self.store),
            tenancy: self.tenancy.clone(),
            engine: Arc::clone(&self.engine),
            results: Arc::clone(&self.results),
        };
        let work = claimed(
            job,
            Arc::clone(&self.store),
            lease,
            retry_after,
            move |job| contained(job, deps),
        );
        ctx.spawn(work.into_actor(self).map(move |ran, this, _| {
            this.in_flight.remove(&slot);
            match ran {
                Some(true) => this.counters.completed += 1,
                Some(false) => this.counters.failed += 1,
                // Another node has it, or it is no longer due.
                None => {}
            }
        }));
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Runs `job` only once this node has claimed it and it is still due as stored now (another
/// node may have just finished it), then gives the claim back. `None` when it did not run.
async fn claimed<F, Fut>(
    job: Job,
    store: Arc<EndpointStore>,
    lease: JobLease,
    retry_after: Duration,
    run: F,
) -> Option<bool>
where
    F: FnOnce(Job) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let key = format!("materialize/{}/v{}", job.endpoint_id, job.version);
    let still_due = {
        let (key, lease, job) = (key.clone(), lease.clone(), job.clone());
        blocking(move || {
            let now = Utc::now();
            if !lease.claims.claim(&key, &lease.holder, now, lease.lease)? {
                return Ok(false);
            }
            let due = store
                .stored(job.project_id, &job.name)?
                .into_iter()
                .flat_map(|e| due_jobs(vec![e], now, retry_after, &|_| job.erased_at))
                .any(|j| j.endpoint_id == job.endpoint_id && j.version == job.version);
            if !due {
                lease.claims.release(&key, &lease.holder)?;
            }
            Ok::<bool, corvid_kernel::StoreError>(due)
        })
        .await
    };
    match still_due {
        Some(Ok(true)) => {}
        Some(Ok(false)) => return None,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot claim a materialization; retrying later");
            return None;
        }
        None => return None,
    }
    let ran = run(job).await;
    let _ = blocking(move || lease.claims.release(&key, &lease.holder)).await;
    Some(ran)
}

/// What a job reads and writes.
struct Deps {
    store: Arc<EndpointStore>,
    tenancy: Tenancy,
    engine: Arc<QueryEngine>,
    results: Arc<Results>,
}

/// Runs one job; a panic inside it marks the version failed instead of stopping the actor.
async fn contained(job: Job, deps: Deps) -> bool {
    let (name, version) = (job.name.clone(), job.version);
    let marker = marker(&job, Arc::clone(&deps.store));
    let run = run_job(job, deps);
    match std::panic::AssertUnwindSafe(run).catch_unwind().await {
        Ok(ran) => ran,
        Err(panic) => {
            let text = format!(
                "internal error while materializing: {}",
                corvid_kernel::panic_message(&*panic)
            );
            tracing::error!(endpoint = %name, version, error = %text, "materialization panicked");
            let _ = blocking(move || marker(Box::new(move |m| fail(m, text)))).await;
            false
        }
    }
}

/// A change to one version's materialization record.
type Change = Box<dyn FnOnce(&mut crate::model::Materialization) + Send>;

/// Applies a [`Change`] to `job`'s version as stored; false when the endpoint was re-created
/// or the materialization disabled meanwhile.
fn marker(
    job: &Job,
    store: Arc<EndpointStore>,
) -> impl Fn(Change) -> Result<bool, corvid_kernel::StoreError> + Clone + Send + 'static {
    let job = job.clone();
    move |change: Change| {
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
        Ok(applied)
    }
}

/// Records a failed attempt (already counted in `failures` when it started).
fn fail(m: &mut crate::model::Materialization, error: String) {
    m.status = MaterializationStatus::Failed;
    m.error = Some(error);
}

async fn run_job(job: Job, deps: Deps) -> bool {
    let Deps {
        store,
        tenancy,
        engine,
        results,
    } = deps;
    let started = Utc::now();
    let mark = marker(&job, Arc::clone(&store));
    let mark_attempt = mark.clone();
    // The attempt counts as a failure until it succeeds: one that a crash cuts short is then
    // retried after its back-off, not first on the next start.
    let _ = blocking(move || {
        mark_attempt(Box::new(move |m| {
            m.last_attempt_at = Some(started);
            m.failures = m.failures.saturating_add(1);
        }))
    })
    .await;

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
    // Background work: it waits for a query slot rather than failing when requests hold them.
    let computed = QueryEngine::waiting(results.compute(&engine, job.project_id, tz, &job.query));
    let outcome = match computed.await {
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
                    m.failures = 0;
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
            let _ = blocking(move || mark(Box::new(move |m| fail(m, text)))).await;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;
    use crate::SledEndpoints;
    use corvid_kernel::LocalClaims;

    /// An endpoint whose version 1 is materialized and has never run (due now).
    fn due_endpoint() -> Endpoint {
        serde_json::from_value(json!({
            "id": Uuid::new_v4(), "project_id": 1, "name": "daily", "is_active": true,
            "current_version": 1, "derived_from_insight": null,
            "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-01T00:00:00Z",
            "created_by": null, "last_executed_at": null,
            "versions": [{
                "id": Uuid::new_v4(), "version": 1,
                "query": {"kind": "HogQLQuery", "query": "SELECT 1"},
                "data_freshness_seconds": 3600, "is_active": true,
                "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-01T00:00:00Z",
                "materialization": {"status": "Completed"}
            }]
        }))
        .expect("endpoint")
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn of_several_nodes_finding_a_version_due_one_runs_it() {
        let db = sled::Config::new().temporary(true).open().expect("sled");
        let store = Arc::new(EndpointStore::new(Arc::new(
            SledEndpoints::open(&db).expect("records"),
        )));
        let endpoint = due_endpoint();
        store.create(&endpoint).expect("create");
        let job = due_jobs(vec![endpoint], Utc::now(), Duration::from_secs(60), &|_| {
            None
        })
        .pop()
        .expect("due");
        let claims: Arc<dyn corvid_kernel::JobClaims> = Arc::new(LocalClaims::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let nodes = (0..3).map(|n| {
            let lease = JobLease {
                claims: Arc::clone(&claims),
                holder: format!("node-{n}"),
                lease: Duration::from_secs(60),
            };
            let runs = Arc::clone(&runs);
            let store = Arc::clone(&store);
            claimed(
                job.clone(),
                store,
                lease,
                Duration::from_secs(60),
                move |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Holds the claim while the others try.
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    true
                },
            )
        });
        let outcomes = futures_util::future::join_all(nodes).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{outcomes:?}");
        assert_eq!(outcomes.iter().filter(|o| o.is_some()).count(), 1);
    }
}
