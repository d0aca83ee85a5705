//! The engine's periodic jobs, in one home: each runs every `period` on a task of its own,
//! under a job lease when it must run once per cluster, with what it did kept for `/metrics`.
//!
//! A run that errs or panics is logged and counted, and the next one waits longer (doubling,
//! at most 64 periods); a success resets the wait. A failing job never takes the process
//! down. A job that runs once per cluster keeps its lease for one and a half periods and
//! renews it on each run, so the node that holds it keeps it while it lives, and another
//! takes over within that time when it dies (or keeps failing).
//!
//! The compactor and the materializer have loops of their own (they lease per project and
//! per endpoint, not per job); they are started by the engine beside these.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::FutureExt;

use corvid_kernel::{panic_message, JobLease};

/// One run of a job: `Err` with what went wrong.
pub type JobRun = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Where a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobScope {
    /// On every node: its work is the node's own (counts held in this node's memory).
    EveryNode,
    /// On one node of the cluster at a time, under a lease (one node when embedded).
    OneNode,
}

/// What a job did, for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    pub name: &'static str,
    pub scope: JobScope,
    pub period: Duration,
    /// Runs on this node (failed ones included).
    pub runs: u64,
    pub failures: u64,
    /// Failures since the last success (the wait before the next run grows with them).
    pub consecutive_failures: u32,
    /// Periods this node left the job to the node that holds its lease.
    pub left_to_another_node: u64,
    pub last_run_at: Option<DateTime<Utc>>,
    pub last_duration: Option<Duration>,
    pub last_error: Option<String>,
}

/// The engine's periodic jobs.
#[derive(Default)]
pub struct Jobs {
    reports: Mutex<Vec<Arc<Mutex<JobReport>>>>,
    stop: Arc<AtomicBool>,
    /// Runs under way, and a wake-up for [`Jobs::stop_and_wait`] when the last one ends: a
    /// run cut off by the process ending may leave work done but not recorded (a webhook
    /// sent, not yet marked delivered, is sent again after a restart).
    running: Arc<AtomicUsize>,
    idle: Arc<tokio::sync::Notify>,
}

/// One job to start: its name (also its lease's name), period, scope and work.
pub struct Job {
    pub name: &'static str,
    pub period: Duration,
    pub scope: JobScope,
    pub run: Arc<dyn Fn() -> JobRun + Send + Sync>,
}

impl Jobs {
    /// Starts `job` on the current tokio runtime; `lease` claims it when its scope is
    /// [`JobScope::OneNode`].
    pub fn spawn(&self, job: Job, lease: &JobLease) {
        let report = Arc::new(Mutex::new(JobReport {
            name: job.name,
            scope: job.scope,
            period: job.period,
            runs: 0,
            failures: 0,
            consecutive_failures: 0,
            left_to_another_node: 0,
            last_run_at: None,
            last_duration: None,
            last_error: None,
        }));
        lock(&self.reports).push(Arc::clone(&report));
        let lease = JobLease {
            claims: Arc::clone(&lease.claims),
            holder: lease.holder.clone(),
            lease: job.period.saturating_add(job.period / 2),
        };
        let stop = Arc::clone(&self.stop);
        let (running, idle) = (Arc::clone(&self.running), Arc::clone(&self.idle));
        tokio::spawn(async move {
            loop {
                let failures = lock(&report).consecutive_failures;
                tokio::time::sleep(job.period.saturating_mul(1 << failures.min(6))).await;
                // Counted before the flag is read: a stop that finds no run under way is
                // seen by every run that starts after it.
                running.fetch_add(1, Ordering::SeqCst);
                if stop.load(Ordering::SeqCst) {
                    ended(&running, &idle);
                    return;
                }
                if job.scope == JobScope::OneNode && !claimed(job.name, &lease).await {
                    lock(&report).left_to_another_node += 1;
                    ended(&running, &idle);
                    continue;
                }
                let started = Instant::now();
                let ran = std::panic::AssertUnwindSafe((job.run)())
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| Err(format!("panicked: {}", panic_message(&*panic))));
                record(&report, ran, started);
                ended(&running, &idle);
            }
        });
    }

    /// What every job did so far, in the order they were started.
    pub fn reports(&self) -> Vec<JobReport> {
        lock(&self.reports)
            .iter()
            .map(|r| lock(r).clone())
            .collect()
    }

    /// No job starts another run after this (a run under way finishes).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// [`Jobs::stop`], then waits up to `within` for the runs under way to finish; whether
    /// they all did.
    pub async fn stop_and_wait(&self, within: Duration) -> bool {
        self.stop();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Made before the count is read, so the last run's wake-up is not missed.
            let idle = self.idle.notified();
            if self.running.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return false;
            }
        }
    }
}

/// One run (or a skipped period) is over: wakes [`Jobs::stop_and_wait`] after the last.
fn ended(running: &AtomicUsize, idle: &tokio::sync::Notify) {
    if running.fetch_sub(1, Ordering::SeqCst) == 1 {
        idle.notify_waiters();
    }
}

/// Whether this node holds (or now takes) the job's lease. A claim that fails to reach the
/// store counts as not held: the job is skipped this period rather than run twice.
async fn claimed(name: &'static str, lease: &JobLease) -> bool {
    let (claims, holder, length) = (Arc::clone(&lease.claims), lease.holder.clone(), lease.lease);
    let job = format!("job/{name}");
    let outcome =
        tokio::task::spawn_blocking(move || claims.claim(&job, &holder, Utc::now(), length)).await;
    match outcome {
        Ok(Ok(held)) => held,
        Ok(Err(err)) => {
            tracing::warn!(job = name, error = %err, "could not claim the job's lease; skipped this period");
            false
        }
        Err(err) => {
            tracing::warn!(job = name, error = %err, "the lease claim did not finish; skipped this period");
            false
        }
    }
}

fn record(report: &Mutex<JobReport>, ran: Result<(), String>, started: Instant) {
    let mut report = lock(report);
    report.runs = report.runs.saturating_add(1);
    report.last_run_at = Some(Utc::now());
    report.last_duration = Some(started.elapsed());
    match ran {
        Ok(()) => {
            report.consecutive_failures = 0;
            report.last_error = None;
        }
        Err(error) => {
            report.failures = report.failures.saturating_add(1);
            report.consecutive_failures = report.consecutive_failures.saturating_add(1);
            tracing::warn!(job = report.name, %error, failures = report.consecutive_failures, "background job failed; it will retry");
            report.last_error = Some(error);
        }
    }
}

/// Each guarded value is whole after every operation: a panic elsewhere cannot corrupt it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use corvid_kernel::{JobClaims, LocalClaims};

    fn counting(runs: &Arc<AtomicU32>, fail: bool) -> Arc<dyn Fn() -> JobRun + Send + Sync> {
        let runs = Arc::clone(runs);
        Arc::new(move || {
            let runs = Arc::clone(&runs);
            Box::pin(async move {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                if fail && n == 0 {
                    panic!("the first run panics");
                }
                if fail {
                    return Err("always fails".to_string());
                }
                Ok(())
            })
        })
    }

    /// Three nodes sharing one set of claims run a one-node job once per period between
    /// them; an every-node job runs on each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_one_node_job_runs_on_one_node_of_three() {
        let claims: Arc<dyn JobClaims> = Arc::new(LocalClaims::default());
        let period = Duration::from_millis(50);
        let (one, every) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let nodes: Vec<Jobs> = (0..3).map(|_| Jobs::default()).collect();
        for (i, jobs) in nodes.iter().enumerate() {
            let lease = JobLease {
                claims: Arc::clone(&claims),
                holder: format!("node-{i}"),
                lease: period,
            };
            jobs.spawn(
                Job {
                    name: "upkeep",
                    period,
                    scope: JobScope::OneNode,
                    run: counting(&one, false),
                },
                &lease,
            );
            jobs.spawn(
                Job {
                    name: "flush",
                    period,
                    scope: JobScope::EveryNode,
                    run: counting(&every, false),
                },
                &lease,
            );
        }
        tokio::time::sleep(Duration::from_millis(525)).await;
        for jobs in &nodes {
            jobs.stop();
        }
        let (one, every) = (one.load(Ordering::SeqCst), every.load(Ordering::SeqCst));
        // About ten periods: ten runs between three nodes (not thirty), thirty for the
        // every-node job.
        assert!((4..=11).contains(&one), "one-node job ran {one} times");
        assert!(every >= 12, "every-node job ran {every} times");
        let skipped: u64 = nodes
            .iter()
            .map(|j| j.reports()[0].left_to_another_node)
            .sum();
        assert!(skipped >= 8, "the other two nodes left it: {skipped}");
    }

    /// Stopping waits for a run under way to finish (and says when one did not in time).
    #[tokio::test]
    async fn stopping_waits_for_the_run_under_way() {
        let (started, finished) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let jobs = Jobs::default();
        let (start, done) = (Arc::clone(&started), Arc::clone(&finished));
        jobs.spawn(
            Job {
                name: "slow",
                period: Duration::from_millis(10),
                scope: JobScope::EveryNode,
                run: Arc::new(move || {
                    let (start, done) = (Arc::clone(&start), Arc::clone(&done));
                    Box::pin(async move {
                        start.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        done.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                }),
            },
            &JobLease::local(Duration::from_secs(1)),
        );
        while started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            !jobs.stop_and_wait(Duration::from_millis(20)).await,
            "still running"
        );
        assert!(jobs.stop_and_wait(Duration::from_secs(30)).await);
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "the run under way finished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "none started after the stop"
        );
        assert!(
            jobs.stop_and_wait(Duration::ZERO).await,
            "nothing under way"
        );
    }

    #[tokio::test]
    async fn a_failing_or_panicking_job_is_counted_and_waits_longer() {
        let runs = Arc::new(AtomicU32::new(0));
        let jobs = Jobs::default();
        jobs.spawn(
            Job {
                name: "broken",
                period: Duration::from_millis(20),
                scope: JobScope::EveryNode,
                run: counting(&runs, true),
            },
            &JobLease::local(Duration::from_secs(1)),
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        jobs.stop();
        let report = jobs.reports().remove(0);
        // Waits of 20, 40, 80, 160 ms (runs at 20, 60, 140, 300): at most four within 400 ms
        // (fewer on a busy machine), where a fixed period would make twenty.
        assert!((1..=4).contains(&report.runs), "{report:?}");
        assert_eq!(report.failures, report.runs);
        assert_eq!(report.consecutive_failures as u64, report.runs);
        assert!(report.last_error.is_some());
        assert!(report.last_duration.is_some() && report.last_run_at.is_some());
    }
}
