//! [`JobClaims`] in PostgreSQL (cluster mode): one row per claimed job. A claim is one
//! conditional upsert, so of any number of nodes claiming at once exactly one gets a row back.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::claims::{lease_end, Claim, JobClaims};
use super::pg::Pg;
use super::StoreError;

pub struct PgClaims {
    pg: Arc<Pg>,
}

impl PgClaims {
    /// Claims over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgClaims {
        PgClaims { pg }
    }
}

impl JobClaims for PgClaims {
    fn claim(
        &self,
        job: &str,
        holder: &str,
        now: DateTime<Utc>,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let (job, holder, until) = (job.to_string(), holder.to_string(), lease_end(now, lease));
        self.pg.run(move |client| async move {
            let won = client
                .query_opt(
                    "INSERT INTO job_claims (job, holder, expires_at) VALUES ($1, $2, $3)
                     ON CONFLICT (job) DO UPDATE SET holder = $2, expires_at = $3
                     WHERE job_claims.holder = $2 OR job_claims.expires_at <= $4
                     RETURNING 1",
                    &[&job, &holder, &until, &now],
                )
                .await?;
            Ok(won.is_some())
        })
    }

    fn release(&self, job: &str, holder: &str) -> Result<(), StoreError> {
        let (job, holder) = (job.to_string(), holder.to_string());
        self.pg.run(move |client| async move {
            client
                .execute(
                    "DELETE FROM job_claims WHERE job = $1 AND holder = $2",
                    &[&job, &holder],
                )
                .await?;
            Ok(())
        })
    }

    fn live(&self, prefix: &str, now: DateTime<Utc>) -> Result<Vec<Claim>, StoreError> {
        // LIKE's wildcards in the prefix are matched as themselves.
        let pattern = format!(
            "{}%",
            prefix
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT job, holder, expires_at FROM job_claims
                     WHERE job LIKE $1 AND expires_at > $2 ORDER BY job",
                    &[&pattern, &now],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| Claim {
                    job: r.get(0),
                    holder: r.get(1),
                    until: r.get(2),
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::contract;

    use crate::pg::testing::TestPostgres;

    #[test]
    fn postgres_claims_pass_the_contract_across_three_nodes() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[crate::MIGRATIONS]);
        let nodes: Vec<Arc<dyn JobClaims>> = (0..3)
            .map(|_| Arc::new(PgClaims::new(Arc::new(db.connect()))) as Arc<dyn JobClaims>)
            .collect();
        contract::suite(&nodes);
    }
}
