//! OAuth grants in PostgreSQL (cluster mode), shared by every node. The races the trait settles
//! are settled by the database: a code or refresh token is redeemed by one conditional `UPDATE`
//! (of any number of nodes, one sees a row), and issuing and revoking a grant lock its family
//! row, so no token is stored into a grant another node revoked.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Json;
use uuid::Uuid;

use super::records::{
    CodeRecord, FamilyRecord, Redeemed, SessionRecord, TokenRecord, TokenState, VerifiedClient,
};
use super::store::{grant_revoked, GrantRecords};
use corvid_activity::{insert_all, ActivityEntry};
use corvid_kernel::pg::{record_json, record_of, Pg, CREDENTIALS_CHANNEL};
use corvid_kernel::StoreError;

pub struct PgGrants {
    pg: Arc<Pg>,
}

impl PgGrants {
    /// The store over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgGrants {
        PgGrants { pg }
    }

    /// Inserts or replaces a record keyed by a secret's hash that expires (codes, sessions).
    fn put_expiring(
        &self,
        table: &'static str,
        hash: &str,
        expires: DateTime<Utc>,
        record: Json<serde_json::Value>,
    ) -> Result<(), StoreError> {
        let hash = hash.to_string();
        self.pg.run(move |client| async move {
            let statement = format!(
                "INSERT INTO {table} (hash, expires_at, record) VALUES ($1, $2, $3)
                 ON CONFLICT (hash) DO UPDATE SET expires_at = $2, record = $3"
            );
            client
                .execute(&statement, &[&hash, &expires, &record])
                .await?;
            Ok(())
        })
    }

    /// Marks a one-time record used with one conditional statement; `flag` is its JSON field.
    fn redeem<T>(
        &self,
        table: &'static str,
        flag: &'static str,
        hash: &str,
    ) -> Result<Redeemed<T>, StoreError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let hash = hash.to_string();
        self.pg.run(move |client| async move {
            let mark = format!(
                "UPDATE {table} SET record = jsonb_set(record, '{{{flag}}}', 'true')
                 WHERE hash = $1 AND NOT coalesce((record->>'{flag}')::boolean, false)
                 RETURNING record"
            );
            if let Some(row) = client.query_opt(&mark, &[&hash]).await? {
                return Ok(Redeemed::Fresh(record_of(&row, table, &hash)?));
            }
            let read = format!("SELECT record FROM {table} WHERE hash = $1");
            Ok(match client.query_opt(&read, &[&hash]).await? {
                Some(row) => Redeemed::Replayed(record_of(&row, table, &hash)?),
                None => Redeemed::Missing,
            })
        })
    }
}

/// The grant family `family_id` (created from `template` when new), locked for the rest of
/// the transaction.
async fn lock_family(
    tx: &deadpool_postgres::Transaction<'_>,
    family_id: Uuid,
    created: Option<DateTime<Utc>>,
    template: &Json<serde_json::Value>,
) -> Result<FamilyRecord, StoreError> {
    tx.execute(
        "INSERT INTO oauth_families (id, created_at, record) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO NOTHING",
        &[&family_id, &created, template],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT record FROM oauth_families WHERE id = $1 FOR UPDATE",
            &[&family_id],
        )
        .await?;
    record_of(&row, "oauth_families", family_id)
}

impl GrantRecords for PgGrants {
    fn put_code(&self, hash: &str, code: &CodeRecord) -> Result<(), StoreError> {
        let record = record_json("authorization code", code)?;
        self.put_expiring("oauth_codes", hash, code.expires_at, record)
    }

    fn redeem_code(&self, hash: &str) -> Result<Redeemed<CodeRecord>, StoreError> {
        self.redeem("oauth_codes", "used", hash)
    }

    fn redeem_refresh(&self, hash: &str) -> Result<Redeemed<TokenRecord>, StoreError> {
        self.redeem("oauth_tokens", "revoked", hash)
    }

    fn issue(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        tokens: &[(String, TokenRecord)],
    ) -> Result<(), StoreError> {
        let family = record_json("grant family", template)?;
        let created = template.created_at;
        let tokens = tokens
            .iter()
            .map(|(hash, t)| Ok((hash.clone(), t.expires_at, record_json("token", t)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            // The row lock orders this against a concurrent revocation of the same grant.
            let current = lock_family(&tx, family_id, created, &family).await?;
            if current.revoked_at.is_some() {
                return Err(grant_revoked());
            }
            for (hash, expires, record) in &tokens {
                tx.execute(
                    "INSERT INTO oauth_tokens (hash, family_id, expires_at, record)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (hash) DO UPDATE SET family_id = $2, expires_at = $3, record = $4",
                    &[hash, &family_id, expires, record],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    fn revoke_family(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let family = record_json("grant family", template)?;
        let created = template.created_at;
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            let mut current = lock_family(&tx, family_id, created, &family).await?;
            if current.revoked_at.is_none() {
                current.revoked_at = Some(now);
                let record = record_json("grant family", &current)?;
                tx.execute(
                    "UPDATE oauth_families SET record = $2 WHERE id = $1",
                    &[&family_id, &record],
                )
                .await?;
                // Its access tokens may be cached on any node under any hash: drop them all.
                tx.execute("SELECT pg_notify($1, '*')", &[&CREDENTIALS_CHANNEL])
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    fn revoke_token(&self, hash: &str, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let Some(state) = self.token(hash)? else {
            return Ok(false);
        };
        let active = state.is_active(now);
        if !state.token.revoked {
            let hash = hash.to_string();
            self.pg.run(move |client| async move {
                client
                    .query(
                        "WITH revoked AS (
                             UPDATE oauth_tokens
                             SET record = jsonb_set(record, '{revoked}', 'true')
                             WHERE hash = $1 RETURNING hash
                         )
                         SELECT pg_notify($2, hash) FROM revoked",
                        &[&hash, &CREDENTIALS_CHANNEL],
                    )
                    .await?;
                Ok(())
            })?;
        }
        Ok(active)
    }

    fn token(&self, hash: &str) -> Result<Option<TokenState>, StoreError> {
        let hash = hash.to_string();
        self.pg.run(move |client| async move {
            let Some(row) = client
                .query_opt(
                    "SELECT t.record, f.record AS family FROM oauth_tokens t
                     LEFT JOIN oauth_families f ON f.id = t.family_id WHERE t.hash = $1",
                    &[&hash],
                )
                .await?
            else {
                return Ok(None);
            };
            let token: TokenRecord = record_of(&row, "oauth_tokens", &hash)?;
            let family: Option<Json<FamilyRecord>> = row.try_get("family").ok().flatten();
            Ok(Some(TokenState {
                token,
                // A token whose family is gone belongs to no live grant.
                family_revoked: family.is_none_or(|Json(f)| f.revoked_at.is_some()),
            }))
        })
    }

    fn prune(&self, now: DateTime<Utc>) -> Result<usize, StoreError> {
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            let mut removed = 0;
            for statement in [
                // Codes stay a day past expiry, so a late replay still revokes their grant.
                "DELETE FROM oauth_codes WHERE expires_at + interval '1 day' < $1",
                "DELETE FROM oauth_tokens WHERE expires_at < $1",
                "DELETE FROM oauth_families f
                 WHERE (f.created_at IS NULL OR f.created_at + interval '1 day' < $1)
                   AND NOT EXISTS (SELECT 1 FROM oauth_tokens t WHERE t.family_id = f.id)",
                "DELETE FROM oauth_sessions WHERE expires_at < $1",
            ] {
                removed += tx.execute(statement, &[&now]).await?;
            }
            tx.commit().await?;
            Ok(removed as usize)
        })
    }

    fn put_session(&self, hash: &str, session: &SessionRecord) -> Result<(), StoreError> {
        let record = record_json("session", session)?;
        self.put_expiring("oauth_sessions", hash, session.expires_at, record)
    }

    fn session(&self, hash: &str, now: DateTime<Utc>) -> Result<Option<SessionRecord>, StoreError> {
        let hash = hash.to_string();
        self.pg.run(move |client| async move {
            let Some(row) = client
                .query_opt(
                    "SELECT record FROM oauth_sessions WHERE hash = $1",
                    &[&hash],
                )
                .await?
            else {
                return Ok(None);
            };
            let session: SessionRecord = record_of(&row, "oauth_sessions", &hash)?;
            if session.expires_at <= now {
                client
                    .execute("DELETE FROM oauth_sessions WHERE hash = $1", &[&hash])
                    .await?;
                return Ok(None);
            }
            Ok(Some(session))
        })
    }

    fn delete_session(&self, hash: &str) -> Result<(), StoreError> {
        let hash = hash.to_string();
        self.pg.run(move |client| async move {
            client
                .execute("DELETE FROM oauth_sessions WHERE hash = $1", &[&hash])
                .await?;
            Ok(())
        })
    }

    fn set_verified(
        &self,
        client: &VerifiedClient,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        let id = client.client_id.clone();
        let record = record_json("verified client", client)?;
        let mut tx = self.pg.begin()?;
        tx.step(move |client| async move {
            let done = client
                .execute(
                    "INSERT INTO oauth_verified_clients (client_id, record) VALUES ($1, $2)
                     ON CONFLICT (client_id) DO UPDATE SET record = $2",
                    &[&id, &record],
                )
                .await;
            (client, done.map(|_| ()).map_err(StoreError::from))
        })?;
        insert_all(&mut tx, log)?;
        tx.commit()
    }

    fn unset_verified(&self, client_id: &str, log: &[ActivityEntry]) -> Result<bool, StoreError> {
        let id = client_id.to_string();
        let mut tx = self.pg.begin()?;
        let existed = tx.step(move |client| async move {
            let n = client
                .execute(
                    "DELETE FROM oauth_verified_clients WHERE client_id = $1",
                    &[&id],
                )
                .await;
            (client, n.map(|n| n > 0).map_err(StoreError::from))
        })?;
        if existed {
            insert_all(&mut tx, log)?;
        }
        tx.commit()?;
        Ok(existed)
    }

    fn is_verified(&self, client_id: &str) -> Result<bool, StoreError> {
        let id = client_id.to_string();
        self.pg.run(move |client| async move {
            Ok(client
                .query_opt(
                    "SELECT 1 FROM oauth_verified_clients WHERE client_id = $1",
                    &[&id],
                )
                .await?
                .is_some())
        })
    }

    fn verified_clients(&self) -> Result<Vec<VerifiedClient>, StoreError> {
        self.pg.run(|client| async move {
            let rows = client
                .query(
                    "SELECT client_id, record FROM oauth_verified_clients ORDER BY client_id",
                    &[],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "oauth_verified_clients", r.get::<_, String>(0)))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::pg::migrations::migrate;
    use corvid_kernel::pg::testing::TestPostgres;

    #[test]
    fn postgres_grants_pass_the_contract() {
        let server = TestPostgres::start();
        let db = server.database();
        let pg = Arc::new(db.connect());
        migrate(&pg, &[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]).expect("migrate");
        super::super::store::contract::suite(Arc::new(PgGrants::new(pg)));
    }

    #[test]
    fn a_code_redeemed_on_several_nodes_at_once_is_fresh_on_exactly_one() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]);
        let nodes: Vec<PgGrants> = (0..3)
            .map(|_| PgGrants::new(Arc::new(db.connect())))
            .collect();
        let now = Utc::now();
        let code = CodeRecord {
            user_id: 1,
            client_id: "https://app.example/c.json".into(),
            redirect_uri: "http://127.0.0.1/cb".into(),
            scopes: vec![],
            code_challenge: "c".into(),
            resource: None,
            expires_at: now + chrono::Duration::minutes(5),
            used: false,
            family_id: Uuid::new_v4(),
        };
        for round in 0..5 {
            let hash = format!("code-{round}");
            nodes[0].put_code(&hash, &code).expect("put");
            let fresh = std::thread::scope(|s| {
                let runs: Vec<_> = nodes
                    .iter()
                    .flat_map(|n| [n, n])
                    .map(|node| {
                        let hash = hash.clone();
                        s.spawn(move || node.redeem_code(&hash).expect("redeem"))
                    })
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().expect("thread"))
                    .filter(|r| matches!(r, Redeemed::Fresh(_)))
                    .count()
            });
            assert_eq!(fresh, 1, "round {round}");
        }
    }
}
