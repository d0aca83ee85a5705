//! Endpoints and insight variables in PostgreSQL (cluster mode), shared by every node. An
//! update is a read-modify-write under the row's lock (`SELECT … FOR UPDATE`), so API edits
//! and materialization status from different nodes never lose each other; names and code
//! names are unique by constraint.

use std::sync::Arc;

use uuid::Uuid;

use super::model::{Endpoint, InsightVariable};
use super::store::{code_name_taken, name_taken, EndpointEdit, EndpointRecords, OnEndpointChange};
use corvid_activity::{insert_all, ActivityEntry};
use corvid_kernel::pg::{bigint, is_unique_violation, record_json, record_of, Pg, RESYNC};
use corvid_kernel::StoreError;

/// The channel endpoint writes are announced on (payload: an `EndpointChange` as JSON).
const CHANNEL: &str = "corvid_endpoints";

pub struct PgEndpoints {
    pg: Arc<Pg>,
}

/// The notification payload of a write to `endpoint`.
fn announcement(endpoint: &Endpoint) -> String {
    serde_json::json!({
        "project_id": endpoint.project_id,
        "name": endpoint.name,
        "id": endpoint.id,
    })
    .to_string()
}

impl PgEndpoints {
    /// The store over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgEndpoints {
        PgEndpoints { pg }
    }
}

impl EndpointRecords for PgEndpoints {
    fn endpoints(&self, project_id: u64) -> Result<Vec<Endpoint>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT name, record FROM endpoints WHERE project_id = $1
                     ORDER BY name COLLATE \"C\"",
                    &[&p],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "endpoints", r.get::<_, String>(0)))
                .collect()
        })
    }

    fn all_endpoints(&self) -> Result<Vec<Endpoint>, StoreError> {
        self.pg.run(|client| async move {
            let rows = client
                .query(
                    "SELECT name, record FROM endpoints ORDER BY project_id, name COLLATE \"C\"",
                    &[],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "endpoints", r.get::<_, String>(0)))
                .collect()
        })
    }

    fn endpoint(&self, project_id: u64, name: &str) -> Result<Option<Endpoint>, StoreError> {
        let (p, name) = (bigint(project_id), name.to_string());
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM endpoints WHERE project_id = $1 AND name = $2",
                    &[&p, &name],
                )
                .await?;
            row.map(|r| record_of(&r, "endpoints", &name)).transpose()
        })
    }

    fn create(&self, endpoint: &Endpoint, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let (p, name) = (bigint(endpoint.project_id), endpoint.name.clone());
        let record = record_json("endpoint", endpoint)?;
        let news = announcement(endpoint);
        let mut tx = self.pg.begin()?;
        tx.step(move |client| async move {
            let inserted = client
                .query(
                    "WITH created AS (
                         INSERT INTO endpoints (project_id, name, record) VALUES ($1, $2, $3)
                         RETURNING 1
                     )
                     SELECT pg_notify($4, $5) FROM created",
                    &[&p, &name, &record, &CHANNEL, &news],
                )
                .await;
            let done = match inserted {
                Ok(_) => Ok(()),
                Err(e) if is_unique_violation(&e) => Err(name_taken(&name)),
                Err(e) => Err(e.into()),
            };
            (client, done)
        })?;
        insert_all(&mut tx, log)?;
        tx.commit()
    }

    fn update(
        &self,
        project_id: u64,
        name: &str,
        change: &mut EndpointEdit<'_>,
    ) -> Result<Option<Endpoint>, StoreError> {
        let (p, name) = (bigint(project_id), name.to_string());
        let mut tx = self.pg.begin()?;
        let key = name.clone();
        let row = tx.step(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM endpoints WHERE project_id = $1 AND name = $2
                     FOR UPDATE",
                    &[&p, &key],
                )
                .await;
            let found = row.map_err(StoreError::from).and_then(|r| {
                r.map(|r| record_of::<Endpoint>(&r, "endpoints", &key))
                    .transpose()
            });
            (client, found)
        })?;
        let Some(mut endpoint) = row else {
            tx.commit()?;
            return Ok(None);
        };
        let stored = endpoint.clone();
        let Some(log) = change(&mut endpoint) else {
            // Refused: what `change` touched is not written, and the record is as stored.
            tx.commit()?;
            return Ok(Some(stored));
        };
        let record = record_json("endpoint", &endpoint)?;
        let news = announcement(&endpoint);
        tx.step(move |client| async move {
            let done = client
                .query(
                    "WITH changed AS (
                         UPDATE endpoints SET record = $3
                         WHERE project_id = $1 AND name = $2 RETURNING 1
                     )
                     SELECT pg_notify($4, $5) FROM changed",
                    &[&p, &name, &record, &CHANNEL, &news],
                )
                .await;
            (client, done.map(|_| ()).map_err(StoreError::from))
        })?;
        insert_all(&mut tx, &log)?;
        tx.commit()?;
        Ok(Some(endpoint))
    }

    fn delete(
        &self,
        project_id: u64,
        name: &str,
        log: &[ActivityEntry],
    ) -> Result<Option<Endpoint>, StoreError> {
        let (p, name) = (bigint(project_id), name.to_string());
        let mut tx = self.pg.begin()?;
        let deleted = tx.step(move |client| async move {
            let moved = async {
                let Some(row) = client
                    .query_opt(
                        "DELETE FROM endpoints WHERE project_id = $1 AND name = $2 RETURNING record",
                        &[&p, &name],
                    )
                    .await?
                else {
                    return Ok(None);
                };
                let endpoint: Endpoint = record_of(&row, "endpoints", &name)?;
                let record = record_json("endpoint", &endpoint)?;
                client
                    .execute(
                        "INSERT INTO endpoints_deleted (id, record) VALUES ($1, $2)
                         ON CONFLICT (id) DO UPDATE SET record = $2",
                        &[&endpoint.id, &record],
                    )
                    .await?;
                client
                    .execute(
                        "SELECT pg_notify($1, $2)",
                        &[&CHANNEL, &announcement(&endpoint)],
                    )
                    .await?;
                Ok::<_, StoreError>(Some(endpoint))
            }
            .await;
            (client, moved)
        })?;
        if deleted.is_some() {
            insert_all(&mut tx, log)?;
        }
        tx.commit()?;
        Ok(deleted)
    }

    fn variables(&self, project_id: u64) -> Result<Vec<InsightVariable>, StoreError> {
        let p = bigint(project_id);
        let mut out: Vec<InsightVariable> = self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM insight_variables WHERE project_id = $1",
                    &[&p],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "insight_variables", r.get::<_, Uuid>(0)))
                .collect::<Result<Vec<_>, _>>()
        })?;
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    fn variable(&self, project_id: u64, id: Uuid) -> Result<Option<InsightVariable>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM insight_variables WHERE project_id = $1 AND id = $2",
                    &[&p, &id],
                )
                .await?;
            row.map(|r| record_of(&r, "insight_variables", id))
                .transpose()
        })
    }

    fn save_variable(
        &self,
        variable: &InsightVariable,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        let (p, id, code) = (
            bigint(variable.project_id),
            variable.id,
            variable.code_name.clone(),
        );
        let record = record_json("insight variable", variable)?;
        let mut tx = self.pg.begin()?;
        tx.step(move |client| async move {
            let saved = client
                .execute(
                    "INSERT INTO insight_variables (project_id, id, code_name, record)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (project_id, id) DO UPDATE SET code_name = $3, record = $4",
                    &[&p, &id, &code, &record],
                )
                .await;
            let done = match saved {
                Ok(_) => Ok(()),
                Err(e) if is_unique_violation(&e) => Err(code_name_taken(&code)),
                Err(e) => Err(e.into()),
            };
            (client, done)
        })?;
        insert_all(&mut tx, log)?;
        tx.commit()
    }

    fn watch(&self, on_change: OnEndpointChange) {
        self.pg.listen(
            CHANNEL,
            RESYNC,
            Arc::new(move |payload: Option<&str>| {
                // An unreadable payload is treated as "anything may have changed".
                on_change(payload.and_then(|p| serde_json::from_str(p).ok()));
            }),
        );
    }

    fn delete_variable(
        &self,
        project_id: u64,
        id: Uuid,
        log: &[ActivityEntry],
    ) -> Result<bool, StoreError> {
        let p = bigint(project_id);
        let mut tx = self.pg.begin()?;
        let removed = tx.step(move |client| async move {
            let n = client
                .execute(
                    "DELETE FROM insight_variables WHERE project_id = $1 AND id = $2",
                    &[&p, &id],
                )
                .await;
            (client, n.map(|n| n > 0).map_err(StoreError::from))
        })?;
        if removed {
            insert_all(&mut tx, log)?;
        }
        tx.commit()?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EndpointChange;

    #[test]
    fn a_change_announced_by_one_node_reaches_another() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[
            corvid_kernel::MIGRATIONS,
            corvid_activity::MIGRATIONS,
            crate::MIGRATIONS,
        ]);
        let node1 = PgEndpoints::new(Arc::new(db.connect()));
        let node3 = PgEndpoints::new(Arc::new(db.connect()));
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        node3.watch(Arc::new(move |change| {
            let _ = tx.lock().map(|t| t.send(change));
        }));
        // The listener reports `None` once it listens: only then can it hear a change.
        let connected = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the listener connects");
        assert_eq!(connected, None);
        let endpoint = endpoint_named("weekly");
        node1.create(&endpoint, &[]).expect("create");
        let heard = rx
            .recv_timeout(std::time::Duration::from_secs(1))
            .expect("node 3 hears of the new endpoint within 1 s");
        assert_eq!(
            heard,
            Some(EndpointChange {
                project_id: 1,
                name: "weekly".into(),
                id: endpoint.id
            })
        );
        node1.delete(1, "weekly", &[]).expect("delete");
        let heard = rx
            .recv_timeout(std::time::Duration::from_secs(1))
            .expect("and of its deletion");
        assert_eq!(heard.map(|c| c.id), Some(endpoint.id));
    }

    fn endpoint_named(name: &str) -> Endpoint {
        serde_json::from_value(serde_json::json!({
            "id": Uuid::new_v4(), "project_id": 1, "name": name, "is_active": true,
            "current_version": 0, "derived_from_insight": null,
            "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-01T00:00:00Z",
            "created_by": null, "last_executed_at": null, "versions": []
        }))
        .expect("endpoint")
    }
    use corvid_kernel::pg::migrations::migrate;
    use corvid_kernel::pg::testing::TestPostgres;

    #[test]
    fn postgres_endpoints_pass_the_contract() {
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
        super::super::store::contract::suite(
            &PgEndpoints::new(Arc::clone(&pg)),
            &corvid_activity::PgActivity::new(pg),
        );
    }

    #[test]
    fn updates_from_several_nodes_at_once_are_all_kept() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[
            corvid_kernel::MIGRATIONS,
            corvid_activity::MIGRATIONS,
            crate::MIGRATIONS,
        ]);
        let nodes: Vec<PgEndpoints> = (0..3)
            .map(|_| PgEndpoints::new(Arc::new(db.connect())))
            .collect();
        let endpoint = endpoint_named("counts");
        nodes[0].create(&endpoint, &[]).expect("create");
        std::thread::scope(|s| {
            for node in &nodes {
                s.spawn(move || {
                    for _ in 0..10 {
                        node.update(1, "counts", &mut |e| {
                            e.current_version += 1;
                            Some(Vec::new())
                        })
                        .expect("update");
                    }
                });
            }
        });
        let stored = nodes[1]
            .endpoint(1, "counts")
            .expect("read")
            .expect("found");
        assert_eq!(stored.current_version, 30, "no update was lost");
    }
}
