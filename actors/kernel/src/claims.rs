//! Leases on background jobs (materializing an endpoint version, compacting a project's day),
//! so that of all the nodes that find a job due exactly one runs it, and a node that dies
//! holding one loses it when its lease runs out.
//!
//! [`LocalClaims`] serves one process (the embedded default); the PostgreSQL implementation
//! ([`super::PgClaims`]) serves a cluster. Both pass [`contract::suite`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::StoreError;

pub trait JobClaims: Send + Sync {
    /// Claims `job` for `holder` until `now + lease`. True when it is `holder`'s now: it was
    /// free, its lease had run out, or `holder` held it already (the lease is renewed).
    fn claim(
        &self,
        job: &str,
        holder: &str,
        now: DateTime<Utc>,
        lease: Duration,
    ) -> Result<bool, StoreError>;
    /// Gives back a claim `holder` holds (nothing when another holds it).
    fn release(&self, job: &str, holder: &str) -> Result<(), StoreError>;
    /// The claims on jobs named `prefix…` whose lease is not over at `now`, by job name
    /// (the cluster's live nodes are the holders of `node/…`).
    fn live(&self, prefix: &str, now: DateTime<Utc>) -> Result<Vec<Claim>, StoreError>;
}

/// A claim held now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub job: String,
    pub holder: String,
    pub until: DateTime<Utc>,
}

/// Who claims jobs, where, and for how long: what a job runner needs.
#[derive(Clone)]
pub struct JobLease {
    pub claims: std::sync::Arc<dyn JobClaims>,
    /// This node (`cluster.node_id`; one fixed name in the embedded default).
    pub holder: String,
    /// Longer than any run of the job can take.
    pub lease: Duration,
}

impl JobLease {
    /// Leases within this process alone (the embedded default).
    pub fn local(lease: Duration) -> JobLease {
        JobLease {
            claims: std::sync::Arc::new(LocalClaims::default()),
            holder: "local".into(),
            lease,
        }
    }
}

/// Claims within this process.
#[derive(Default)]
pub struct LocalClaims {
    held: Mutex<HashMap<String, (String, DateTime<Utc>)>>,
}

impl LocalClaims {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, DateTime<Utc>)>> {
        // Each operation leaves the map whole: a panic elsewhere cannot corrupt it.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `now + lease`, saturating.
pub fn lease_end(now: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl JobClaims for LocalClaims {
    fn claim(
        &self,
        job: &str,
        holder: &str,
        now: DateTime<Utc>,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut held = self.held();
        let free = held
            .get(job)
            .is_none_or(|(h, until)| h == holder || *until <= now);
        if free {
            held.insert(job.to_string(), (holder.to_string(), lease_end(now, lease)));
        }
        Ok(free)
    }

    fn release(&self, job: &str, holder: &str) -> Result<(), StoreError> {
        let mut held = self.held();
        if held.get(job).is_some_and(|(h, _)| h == holder) {
            held.remove(job);
        }
        Ok(())
    }

    fn live(&self, prefix: &str, now: DateTime<Utc>) -> Result<Vec<Claim>, StoreError> {
        let mut live: Vec<Claim> = self
            .held()
            .iter()
            .filter(|(job, (_, until))| job.starts_with(prefix) && *until > now)
            .map(|(job, (holder, until))| Claim {
                job: job.clone(),
                holder: holder.clone(),
                until: *until,
            })
            .collect();
        live.sort_by(|a, b| a.job.cmp(&b.job));
        Ok(live)
    }
}

/// The behaviour every [`JobClaims`] must show, written against the trait.
#[cfg(test)]
pub mod contract {
    use std::sync::Arc;

    use super::*;

    /// Runs every check; `nodes` are claim stores over one shared state (one per node).
    pub fn suite(nodes: &[Arc<dyn JobClaims>]) {
        let now = Utc::now();
        let lease = Duration::from_secs(60);
        let (a, b) = (&nodes[0], &nodes[nodes.len() - 1]);
        assert!(a.claim("j1", "node-a", now, lease).expect("claim"));
        assert!(!b.claim("j1", "node-b", now, lease).expect("taken"));
        assert!(
            a.claim("j1", "node-a", now, lease).expect("renew"),
            "the holder renews"
        );
        // The holder died: once its lease is over, another node takes the job.
        let later = now + chrono::Duration::seconds(61);
        assert!(b.claim("j1", "node-b", later, lease).expect("expired"));
        assert!(!a.claim("j1", "node-a", later, lease).expect("lost"));
        // Only the holder's release frees it.
        a.release("j1", "node-a").expect("release");
        assert!(!a.claim("j1", "node-a", later, lease).expect("still b's"));
        b.release("j1", "node-b").expect("release");
        assert!(a.claim("j1", "node-a", later, lease).expect("free"));

        // What is held now, seen from any node; an ended lease is not.
        assert!(a.claim("node/a", "node-a", now, lease).expect("claim"));
        assert!(b.claim("node/b", "node-b", later, lease).expect("claim"));
        let live: Vec<(String, String)> = b
            .live("node/", later)
            .expect("live")
            .into_iter()
            .map(|c| (c.job, c.holder))
            .collect();
        assert_eq!(live, vec![("node/b".to_string(), "node-b".to_string())]);
        let both = a.live("node/", now).expect("live");
        assert_eq!(both.len(), 2, "{both:?}");
        // Stores may keep time to the microsecond.
        let off = (both[0].until - lease_end(now, lease)).num_microseconds();
        assert!(off.is_some_and(|us| us.abs() < 1_000), "{both:?}");

        // Many nodes at once: one wins each job.
        for round in 0..5 {
            let job = format!("race-{round}");
            let won = std::thread::scope(|s| {
                let runs: Vec<_> = nodes
                    .iter()
                    .enumerate()
                    .flat_map(|(i, n)| [(i, n), (i + 100, n)])
                    .map(|(i, node)| {
                        let job = job.clone();
                        s.spawn(move || {
                            node.claim(&job, &format!("node-{i}"), now, lease)
                                .expect("claim")
                        })
                    })
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().expect("thread"))
                    .filter(|won| *won)
                    .count()
            });
            assert_eq!(won, 1, "round {round}");
        }
    }

    #[test]
    fn local_claims_pass_the_contract() {
        let local: Arc<dyn JobClaims> = Arc::new(LocalClaims::default());
        suite(&[Arc::clone(&local), local]);
    }
}
