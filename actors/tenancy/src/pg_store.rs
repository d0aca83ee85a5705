//! The cluster metadata store: tenancy records in PostgreSQL (schema in
//! `kernel/pg/migrations`), shared by every node. Each write is one committed statement or
//! transaction, so it is durable when it returns; uniqueness (project tokens, user emails,
//! key hashes) is enforced by the database, so two nodes racing for one value cannot both win.

use std::sync::Arc;

use uuid::Uuid;

use super::model::{Invite, Organization, PersonalApiKey, Project, User};
use super::store::{MetadataRecords, OnRevoked, ProjectEdit, UserEdit, ROTATED_PROJECT};
use corvid_activity::ActivityEntry;
use corvid_kernel::pg::{
    bigint, is_unique_violation, next_in_sequence, record_json, record_of, Pg, CREDENTIALS_CHANNEL,
    RESYNC,
};
use corvid_kernel::StoreError;

pub struct PgMetadata {
    pg: Arc<Pg>,
}

impl PgMetadata {
    /// The store over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgMetadata {
        PgMetadata { pg }
    }
}

/// Advisory-lock key of [`MetadataRecords::exclusively`] ("tenancy").
const TENANCY_LOCK: i64 = 0x7465_6e61_6e63;

fn conflict(err: tokio_postgres::Error, what: impl Into<String>) -> StoreError {
    if is_unique_violation(&err) {
        StoreError::Conflict { what: what.into() }
    } else {
        StoreError::Postgres(err)
    }
}

impl MetadataRecords for PgMetadata {
    fn exclusively(
        &self,
        work: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.pg.exclusive(TENANCY_LOCK, work)
    }

    fn next_id(&self, sequence: &str) -> Result<u64, StoreError> {
        let name = sequence.to_string();
        self.pg
            .run(move |client| async move { next_in_sequence(&client, &name).await })
    }

    fn put_organization(&self, org: &Organization) -> Result<(), StoreError> {
        let (id, record) = (org.id, record_json("organization", org)?);
        self.pg.run(move |client| async move {
            client
                .execute(
                    "INSERT INTO organizations (id, record) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
                    &[&id, &record],
                )
                .await?;
            Ok(())
        })
    }

    fn organization(&self, id: Uuid) -> Result<Option<Organization>, StoreError> {
        self.pg.run(move |client| async move {
            let row = client
                .query_opt("SELECT record FROM organizations WHERE id = $1", &[&id])
                .await?;
            row.map(|r| record_of(&r, "organizations", id)).transpose()
        })
    }

    fn organizations(&self) -> Result<Vec<Organization>, StoreError> {
        self.pg.run(|client| async move {
            let rows = client
                .query("SELECT id, record FROM organizations ORDER BY id", &[])
                .await?;
            rows.iter()
                .map(|r| record_of(r, "organizations", r.get::<_, Uuid>(0)))
                .collect()
        })
    }

    fn insert_project(&self, project: &Project) -> Result<(), StoreError> {
        let (id, token) = (bigint(project.id), project.api_token.clone());
        let record = record_json("project", project)?;
        self.pg.run(move |client| async move {
            client
                .execute(
                    "INSERT INTO projects (id, api_token, record) VALUES ($1, $2, $3)",
                    &[&id, &token, &record],
                )
                .await
                .map_err(|e| conflict(e, "project token"))?;
            Ok(())
        })
    }

    fn put_project(&self, project: &Project) -> Result<(), StoreError> {
        let id = bigint(project.id);
        let record = record_json("project", project)?;
        self.pg.run(move |client| async move {
            client
                .execute(
                    "UPDATE projects SET record = $2 WHERE id = $1",
                    &[&id, &record],
                )
                .await?;
            Ok(())
        })
    }

    fn update_project(&self, id: u64, change: &mut ProjectEdit<'_>) -> Result<Project, StoreError> {
        let key = bigint(id);
        let mut tx = self.pg.begin()?;
        let found = tx.step(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM projects WHERE id = $1 FOR UPDATE",
                    &[&key],
                )
                .await;
            let found = row.map_err(StoreError::from).and_then(|r| {
                r.map(|r| record_of::<Project>(&r, "projects", id))
                    .transpose()
            });
            (client, found)
        })?;
        let Some(mut project) = found else {
            return Err(StoreError::NotFound {
                what: format!("project {id}"),
            });
        };
        let old_token = project.api_token.clone();
        let log = change(&mut project)?;
        let record = record_json("project", &project)?;
        let token = project.api_token.clone();
        // A rotated token: every node forgets the project (and with it the old token).
        let news = (token != old_token).then(|| format!("{ROTATED_PROJECT}{id}"));
        tx.step(move |client| async move {
            let done = client
                .query(
                    "WITH changed AS (
                         UPDATE projects SET record = $2, api_token = $3 WHERE id = $1 RETURNING 1
                     )
                     SELECT pg_notify($4, $5) FROM changed WHERE $5 IS NOT NULL",
                    &[&key, &record, &token, &CREDENTIALS_CHANNEL, &news],
                )
                .await;
            (
                client,
                done.map(|_| ()).map_err(|e| conflict(e, "project token")),
            )
        })?;
        corvid_activity::insert_all(&mut tx, &log)?;
        tx.commit()?;
        Ok(project)
    }

    fn project(&self, id: u64) -> Result<Option<Project>, StoreError> {
        let key = bigint(id);
        self.pg.run(move |client| async move {
            let row = client
                .query_opt("SELECT record FROM projects WHERE id = $1", &[&key])
                .await?;
            row.map(|r| record_of(&r, "projects", id)).transpose()
        })
    }

    fn project_by_token(&self, token: &str) -> Result<Option<Project>, StoreError> {
        let token = token.to_string();
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT id, record FROM projects WHERE api_token = $1",
                    &[&token],
                )
                .await?;
            row.map(|r| record_of(&r, "projects", r.get::<_, i64>(0)))
                .transpose()
        })
    }

    fn projects(&self) -> Result<Vec<Project>, StoreError> {
        self.pg.run(|client| async move {
            let rows = client
                .query("SELECT id, record FROM projects ORDER BY id", &[])
                .await?;
            rows.iter()
                .map(|r| record_of(r, "projects", r.get::<_, i64>(0)))
                .collect()
        })
    }

    fn insert_user(&self, user: &User) -> Result<(), StoreError> {
        let (id, email) = (bigint(user.id), user.email.clone());
        let record = record_json("user", user)?;
        self.pg.run(move |client| async move {
            client
                .execute(
                    "INSERT INTO users (id, email, record) VALUES ($1, $2, $3)",
                    &[&id, &email, &record],
                )
                .await
                .map_err(|e| conflict(e, format!("user {email}")))?;
            Ok(())
        })
    }

    fn user(&self, id: u64) -> Result<Option<User>, StoreError> {
        let key = bigint(id);
        self.pg.run(move |client| async move {
            let row = client
                .query_opt("SELECT record FROM users WHERE id = $1", &[&key])
                .await?;
            row.map(|r| record_of(&r, "users", id)).transpose()
        })
    }

    fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        let email = email.to_string();
        self.pg.run(move |client| async move {
            let row = client
                .query_opt("SELECT id, record FROM users WHERE email = $1", &[&email])
                .await?;
            row.map(|r| record_of(&r, "users", r.get::<_, i64>(0)))
                .transpose()
        })
    }

    fn insert_key(&self, key: &PersonalApiKey, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let (id, user, hash) = (
            key.id.clone(),
            bigint(key.user_id),
            key.secure_value_sha256.clone(),
        );
        let record = record_json("personal API key", key)?;
        let mut tx = self.pg.begin()?;
        tx.step(move |client| async move {
            let done = client
                .execute(
                    "INSERT INTO personal_api_keys (id, user_id, secure_value_sha256, record)
                     VALUES ($1, $2, $3, $4)",
                    &[&id, &user, &hash, &record],
                )
                .await
                .map(|_| ())
                .map_err(|e| conflict(e, "personal API key"));
            (client, done)
        })?;
        corvid_activity::insert_all(&mut tx, log)?;
        tx.commit()
    }

    fn put_key(&self, key: &PersonalApiKey) -> Result<(), StoreError> {
        let id = key.id.clone();
        let record = record_json("personal API key", key)?;
        self.pg.run(move |client| async move {
            client
                .execute(
                    "UPDATE personal_api_keys SET record = $2 WHERE id = $1",
                    &[&id, &record],
                )
                .await?;
            Ok(())
        })
    }

    fn key(&self, id: &str) -> Result<Option<PersonalApiKey>, StoreError> {
        let id = id.to_string();
        self.pg.run(move |client| async move {
            let row = client
                .query_opt("SELECT record FROM personal_api_keys WHERE id = $1", &[&id])
                .await?;
            row.map(|r| record_of(&r, "personal_api_keys", &id))
                .transpose()
        })
    }

    fn key_by_hash(&self, sha256_hex: &str) -> Result<Option<PersonalApiKey>, StoreError> {
        let hash = sha256_hex.to_string();
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT id, record FROM personal_api_keys WHERE secure_value_sha256 = $1",
                    &[&hash],
                )
                .await?;
            row.map(|r| record_of(&r, "personal_api_keys", r.get::<_, String>(0)))
                .transpose()
        })
    }

    fn keys_of_user(&self, user_id: u64) -> Result<Vec<PersonalApiKey>, StoreError> {
        let user = bigint(user_id);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM personal_api_keys WHERE user_id = $1 ORDER BY id",
                    &[&user],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "personal_api_keys", r.get::<_, String>(0)))
                .collect()
        })
    }

    fn delete_key(
        &self,
        id: &str,
        log: &[ActivityEntry],
    ) -> Result<Option<PersonalApiKey>, StoreError> {
        let id = id.to_string();
        let mut tx = self.pg.begin()?;
        let deleted = tx.step(move |client| async move {
            // Every node's listener hears of it when the delete commits.
            let row = client
                .query_opt(
                    "WITH gone AS (
                         DELETE FROM personal_api_keys WHERE id = $1
                         RETURNING record, secure_value_sha256
                     )
                     SELECT record, pg_notify($2, secure_value_sha256) FROM gone",
                    &[&id, &CREDENTIALS_CHANNEL],
                )
                .await;
            let found = row.map_err(StoreError::from).and_then(|r| {
                r.map(|r| record_of::<PersonalApiKey>(&r, "personal_api_keys", &id))
                    .transpose()
            });
            (client, found)
        })?;
        if deleted.is_some() {
            corvid_activity::insert_all(&mut tx, log)?;
        }
        tx.commit()?;
        Ok(deleted)
    }

    fn users_of_organization(&self, org: Uuid) -> Result<Vec<User>, StoreError> {
        let org = org.to_string();
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM users WHERE record->>'organization_id' = $1 ORDER BY id",
                    &[&org],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "users", r.get::<_, i64>(0)))
                .collect()
        })
    }

    fn update_user(&self, id: u64, change: &mut UserEdit<'_>) -> Result<User, StoreError> {
        let key = bigint(id);
        let mut tx = self.pg.begin()?;
        let found = tx.step(move |client| async move {
            let row = client
                .query_opt("SELECT record FROM users WHERE id = $1 FOR UPDATE", &[&key])
                .await;
            let found = row
                .map_err(StoreError::from)
                .and_then(|r| r.map(|r| record_of::<User>(&r, "users", id)).transpose());
            (client, found)
        })?;
        let Some(mut user) = found else {
            return Err(StoreError::NotFound {
                what: format!("user {id}"),
            });
        };
        let email = user.email.clone();
        let log = change(&mut user)?;
        user.email = email;
        let record = record_json("user", &user)?;
        tx.step(move |client| async move {
            // Every node drops its cached credentials when this commits ("*": any may have
            // changed), so a deactivated user's keys and tokens stop at once everywhere.
            let done = client
                .query(
                    "WITH changed AS (UPDATE users SET record = $2 WHERE id = $1 RETURNING 1)
                     SELECT pg_notify($3, '*') FROM changed",
                    &[&key, &record, &CREDENTIALS_CHANNEL],
                )
                .await;
            (client, done.map(|_| ()).map_err(StoreError::from))
        })?;
        corvid_activity::insert_all(&mut tx, &log)?;
        tx.commit()?;
        Ok(user)
    }

    fn put_invite(&self, invite: &Invite, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let (id, org, record) = (
            invite.id,
            invite.organization_id,
            record_json("invite", invite)?,
        );
        let mut tx = self.pg.begin()?;
        tx.step(move |client| async move {
            let done = client
                .execute(
                    "INSERT INTO invites (id, organization_id, record) VALUES ($1, $2, $3)
                     ON CONFLICT (id) DO UPDATE SET record = $3",
                    &[&id, &org, &record],
                )
                .await;
            (client, done.map(|_| ()).map_err(StoreError::from))
        })?;
        corvid_activity::insert_all(&mut tx, log)?;
        tx.commit()
    }

    fn invite(&self, id: Uuid) -> Result<Option<Invite>, StoreError> {
        self.pg.run(move |client| async move {
            let row = client
                .query_opt("SELECT record FROM invites WHERE id = $1", &[&id])
                .await?;
            row.map(|r| record_of(&r, "invites", id)).transpose()
        })
    }

    fn invites_of_organization(&self, org: Uuid) -> Result<Vec<Invite>, StoreError> {
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM invites WHERE organization_id = $1 ORDER BY id",
                    &[&org],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "invites", r.get::<_, Uuid>(0)))
                .collect()
        })
    }

    fn delete_invite(&self, id: Uuid, log: &[ActivityEntry]) -> Result<bool, StoreError> {
        let mut tx = self.pg.begin()?;
        let existed = tx.step(move |client| async move {
            let done = client
                .execute("DELETE FROM invites WHERE id = $1", &[&id])
                .await;
            (client, done.map(|n| n > 0).map_err(StoreError::from))
        })?;
        if existed {
            corvid_activity::insert_all(&mut tx, log)?;
        }
        tx.commit()?;
        Ok(existed)
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Every write above is a committed statement: durable already.
        Ok(())
    }

    fn watch_credentials(&self, on_revoked: OnRevoked) {
        self.pg.listen(
            CREDENTIALS_CHANNEL,
            RESYNC,
            Arc::new(move |payload: Option<&str>| {
                on_revoked(payload.filter(|p| *p != "*"));
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::pg::migrations::migrate;
    use corvid_kernel::pg::testing::TestPostgres;

    #[test]
    fn postgres_metadata_passes_the_contract() {
        let server = TestPostgres::start();
        let db = server.database();
        let pg = Arc::new(db.connect());
        migrate(
            &pg,
            &[
                corvid_kernel::MIGRATIONS,
                corvid_activity::MIGRATIONS,
                crate::MIGRATIONS,
            ],
        )
        .expect("migrate");
        super::super::store::contract::suite(&|| -> Box<dyn MetadataRecords> {
            Box::new(PgMetadata::new(Arc::new(db.connect())))
        });
    }

    #[test]
    fn two_nodes_racing_for_one_email_or_token_get_one_winner() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[
            corvid_kernel::MIGRATIONS,
            corvid_activity::MIGRATIONS,
            crate::MIGRATIONS,
        ]);
        let nodes: Vec<PgMetadata> = (0..4)
            .map(|_| PgMetadata::new(Arc::new(db.connect())))
            .collect();
        let org = Uuid::now_v7();
        let results: Vec<bool> = std::thread::scope(|s| {
            let runs: Vec<_> = nodes
                .iter()
                .enumerate()
                .map(|(i, node)| {
                    s.spawn(move || {
                        let id = node.next_id("users").expect("id");
                        let user = User {
                            id,
                            uuid: Uuid::now_v7(),
                            email: "same@example.com".into(),
                            first_name: format!("n{i}"),
                            password_hash: "hash".into(),
                            organization_id: org,
                            is_staff: false,
                            created_at: chrono::Utc::now(),
                            level: crate::model::Level::Member,
                            is_active: true,
                            deactivated_at: None,
                        };
                        match node.insert_user(&user) {
                            Ok(()) => true,
                            Err(StoreError::Conflict { .. }) => false,
                            Err(e) => panic!("{e}"),
                        }
                    })
                })
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("thread"))
                .collect()
        });
        assert_eq!(results.iter().filter(|won| **won).count(), 1, "{results:?}");
        let mut ids: Vec<u64> = (0..4).map(|_| nodes[0].next_id("x").expect("id")).collect();
        ids.dedup();
        assert_eq!(ids.len(), 4, "sequence values are never handed out twice");
    }
}

#[cfg(test)]
mod cluster_tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{MintKey, Tenancy, TenancySettings};

    use corvid_kernel::pg::testing::TestPostgres;

    fn node(db: &corvid_kernel::pg::testing::TestDatabase) -> Tenancy {
        Tenancy::new(
            Arc::new(PgMetadata::new(Arc::new(db.connect()))),
            TenancySettings {
                cache_ttl: Duration::from_secs(60),
                last_used_resolution: Duration::from_secs(3600),
                password_threads: 1,
                password_queue: 8,
                invite_ttl: Duration::from_secs(3 * 86_400),
            },
        )
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_key_deleted_on_one_node_is_refused_by_another_within_a_second() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[
            corvid_kernel::MIGRATIONS,
            corvid_activity::MIGRATIONS,
            crate::MIGRATIONS,
        ]);
        let node1 = node(&db);
        let node3 = node(&db);
        let boot = node1
            .bootstrap(MintKey::OnFirstRun)
            .await
            .expect("bootstrap");
        let secret = boot.personal_api_key.expect("key");
        // Node 3 has the key in its cache before the deletion.
        assert!(node3
            .authenticate_key(&secret)
            .await
            .expect("auth")
            .is_some());
        let key_id = node1
            .authenticate_key(&secret)
            .await
            .expect("auth")
            .and_then(|c| match &c.source {
                crate::CredentialSource::PersonalApiKey { id, .. } => Some(id.clone()),
                _ => None,
            })
            .expect("key id");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(node1
            .delete_personal_api_key(boot.admin.id, &key_id, &corvid_activity::Actor::system())
            .await
            .expect("delete"));
        let deadline = Instant::now() + Duration::from_secs(1);
        while node3
            .authenticate_key(&secret)
            .await
            .expect("auth")
            .is_some()
        {
            assert!(
                Instant::now() < deadline,
                "node 3 still accepts the key after 1 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
