//! Person records in PostgreSQL (cluster mode), shared by every node. Usage counters are added
//! with one upsert (`count = count + n`), so counts from every node add up; group type indexes
//! are assigned under a per-project advisory lock, so two nodes never give one index to two
//! types. A read-modify-write of persons runs under one advisory lock per distinct id, person
//! and group it touches ([`PersonRecords::exclusively`]), so a merge or `$set` on one node never
//! overwrites another node's, while writes of other persons go on at once; every write announces itself on [`CHANNEL`] in its own
//! transaction, for the other nodes' read caches.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::erasure::Erasure;
use super::model::{usage_rows, Group, Person, UsageKind, UsageRow};
use super::records::{OnPersonChange, PersonChange, PersonRecords, Touched};
use corvid_activity::ActivityEntry;
use corvid_kernel::pg::{bigint, record_json, record_of, Pg, RESYNC};
use corvid_kernel::StoreError;

/// Advisory-lock namespace of group-type assignment (the project id is the second key).
const GROUP_TYPE_LOCK: i32 = 0x6770; // "gp"

/// The channel person and group writes are announced on (payload: a [`PersonChange`]).
const CHANNEL: &str = "corvid_persons";

/// Longest payload PostgreSQL takes is 8000 bytes; a longer change is announced as its
/// whole project.
const MAX_PAYLOAD: usize = 7_900;

/// The notification payload of `change`.
fn payload(change: &PersonChange) -> String {
    let text = serde_json::to_string(change).unwrap_or_default();
    let project = match change {
        PersonChange::Persons { project, .. }
        | PersonChange::Group { project, .. }
        | PersonChange::Project { project } => *project,
    };
    if text.is_empty() || text.len() > MAX_PAYLOAD {
        return serde_json::to_string(&PersonChange::Project { project }).unwrap_or_default();
    }
    text
}

pub struct PgPersons {
    pg: Arc<Pg>,
}

impl PgPersons {
    /// The store over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgPersons {
        PgPersons { pg }
    }
}

impl PersonRecords for PgPersons {
    fn exclusively(
        &self,
        project_id: u64,
        touched: &[Touched],
        work: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let keys = touched.iter().map(|t| t.lock_key(project_id)).collect();
        self.pg.exclusive_all(keys, work)
    }

    fn shared(&self) -> bool {
        true
    }

    fn watch(&self, on_change: OnPersonChange) {
        self.pg.listen(
            CHANNEL,
            RESYNC,
            Arc::new(move |payload: Option<&str>| {
                // A payload that does not parse is treated as a missed change: drop all.
                on_change(payload.and_then(|p| serde_json::from_str(p).ok()))
            }),
        );
    }

    fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM persons WHERE project_id = $1 AND id = $2",
                    &[&p, &id],
                )
                .await?;
            row.map(|r| record_of(&r, "persons", id)).transpose()
        })
    }

    fn person_id_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        let (p, did) = (bigint(project_id), distinct_id.to_string());
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT person_id FROM person_distinct_ids
                     WHERE project_id = $1 AND distinct_id = $2",
                    &[&p, &did],
                )
                .await?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn put_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        let (p, id) = (bigint(project_id), person.id);
        let record = record_json("person", person)?;
        let distinct_ids = person.distinct_ids.clone();
        let changed = payload(&PersonChange::Persons {
            project: project_id,
            distinct_ids: distinct_ids.clone(),
        });
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            tx.execute(
                "INSERT INTO persons (project_id, id, record) VALUES ($1, $2, $3)
                 ON CONFLICT (project_id, id) DO UPDATE SET record = $3",
                &[&p, &id, &record],
            )
            .await?;
            tx.execute(
                "INSERT INTO person_distinct_ids (project_id, distinct_id, person_id)
                 SELECT $1, unnest($2::text[]), $3
                 ON CONFLICT (project_id, distinct_id) DO UPDATE SET person_id = $3",
                &[&p, &distinct_ids, &id],
            )
            .await?;
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &changed])
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError> {
        let p = bigint(project_id);
        let changed = payload(&PersonChange::Project {
            project: project_id,
        });
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            tx.execute(
                "DELETE FROM persons WHERE project_id = $1 AND id = $2",
                &[&p, &id],
            )
            .await?;
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &changed])
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM persons WHERE project_id = $1 ORDER BY id",
                    &[&p],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "persons", r.get::<_, Uuid>(0)))
                .collect()
        })
    }

    fn scan_persons(
        &self,
        after: Option<(u64, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(u64, Person)>, StoreError> {
        let (project, id) = after.unwrap_or((0, Uuid::nil()));
        let (p, limit) = (bigint(project), i64::try_from(limit).unwrap_or(i64::MAX));
        let first = after.is_none();
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT project_id, id, record FROM persons
                     WHERE $4 OR (project_id, id) > ($1, $2)
                     ORDER BY project_id, id LIMIT $3",
                    &[&p, &id, &limit, &first],
                )
                .await?;
            rows.iter()
                .map(|r| {
                    let person = record_of(r, "persons", r.get::<_, Uuid>(1))?;
                    Ok((r.get::<_, i64>(0) as u64, person))
                })
                .collect()
        })
    }

    fn remove_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        let (p, id) = (bigint(project_id), person.id);
        let changed = payload(&PersonChange::Persons {
            project: project_id,
            distinct_ids: person.distinct_ids.clone(),
        });
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            tx.execute(
                "DELETE FROM person_distinct_ids WHERE project_id = $1 AND person_id = $2",
                &[&p, &id],
            )
            .await?;
            tx.execute(
                "DELETE FROM persons WHERE project_id = $1 AND id = $2",
                &[&p, &id],
            )
            .await?;
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &changed])
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn put_erasures(
        &self,
        project_id: u64,
        erasures: &[Erasure],
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        let log = log.to_vec();
        let p = bigint(project_id);
        let rows = erasures
            .iter()
            .map(|e| Ok((e.id, e.requested_at, record_json("person erasure", e)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let changed = payload(&PersonChange::Project {
            project: project_id,
        });
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            for (id, at, record) in &rows {
                tx.execute(
                    "INSERT INTO person_erasures (project_id, id, requested_at, record)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (project_id, id) DO UPDATE SET record = $4",
                    &[&p, id, at, record],
                )
                .await?;
            }
            let in_tx: &tokio_postgres::Transaction<'_> = &tx;
            for entry in &log {
                corvid_activity::insert(in_tx, entry).await?;
            }
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &changed])
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn erasures(&self, project_id: Option<u64>) -> Result<Vec<Erasure>, StoreError> {
        let p = project_id.map(bigint);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM person_erasures
                     WHERE $1::bigint IS NULL OR project_id = $1
                     ORDER BY requested_at, id",
                    &[&p],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "person_erasures", r.get::<_, Uuid>(0)))
                .collect()
        })
    }

    fn expire_erasures(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        self.pg.run(move |client| async move {
            let n = client
                .execute(
                    "DELETE FROM person_erasures WHERE requested_at < $1
                     AND (record->>'verified_at' IS NOT NULL OR record->>'events' = 'false')",
                    &[&before],
                )
                .await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    fn group_types(&self, project_id: u64) -> Result<Vec<(String, u8)>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT group_type, group_type_index FROM group_type_mappings
                     WHERE project_id = $1 ORDER BY group_type_index",
                    &[&p],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, i16>(1) as u8))
                .collect())
        })
    }

    fn ensure_group_type(
        &self,
        project_id: u64,
        group_type: &str,
        max: u8,
    ) -> Result<Option<u8>, StoreError> {
        let (p, name) = (bigint(project_id), group_type.to_string());
        let changed = payload(&PersonChange::Project {
            project: project_id,
        });
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            // Lock keys are two int4s: the namespace and the project id (truncated; a shared
            // lock between two projects only serializes them).
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, $2)",
                &[&GROUP_TYPE_LOCK, &(p as i32)],
            )
            .await?;
            let known = tx
                .query_opt(
                    "SELECT group_type_index FROM group_type_mappings
                     WHERE project_id = $1 AND group_type = $2",
                    &[&p, &name],
                )
                .await?;
            if let Some(row) = known {
                return Ok(Some(row.get::<_, i16>(0) as u8));
            }
            let count: i64 = tx
                .query_one(
                    "SELECT count(*) FROM group_type_mappings WHERE project_id = $1",
                    &[&p],
                )
                .await?
                .get(0);
            if count >= i64::from(max) {
                return Ok(None);
            }
            let index = count as i16;
            tx.execute(
                "INSERT INTO group_type_mappings (project_id, group_type, group_type_index)
                 VALUES ($1, $2, $3)",
                &[&p, &name, &index],
            )
            .await?;
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &changed])
                .await?;
            tx.commit().await?;
            Ok(Some(index as u8))
        })
    }

    fn group(&self, project_id: u64, index: u8, key: &str) -> Result<Option<Group>, StoreError> {
        let (p, i, key) = (bigint(project_id), i16::from(index), key.to_string());
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM groups
                     WHERE project_id = $1 AND group_type_index = $2 AND group_key = $3",
                    &[&p, &i, &key],
                )
                .await?;
            row.map(|r| record_of(&r, "groups", &key)).transpose()
        })
    }

    fn groups(&self, project_id: u64, index: Option<u8>) -> Result<Vec<Group>, StoreError> {
        let (p, i) = (bigint(project_id), index.map(i16::from));
        self.pg.run(move |client| async move {
            // Byte order of keys, as the embedded store lists them.
            let rows = client
                .query(
                    "SELECT group_key, record FROM groups
                     WHERE project_id = $1 AND ($2::smallint IS NULL OR group_type_index = $2)
                     ORDER BY group_type_index, group_key COLLATE \"C\"",
                    &[&p, &i],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, "groups", r.get::<_, String>(0)))
                .collect()
        })
    }

    fn put_group(&self, project_id: u64, group: &Group) -> Result<(), StoreError> {
        let (p, i, key) = (
            bigint(project_id),
            i16::from(group.group_type_index),
            group.group_key.clone(),
        );
        let record = record_json("group", group)?;
        let changed = payload(&PersonChange::Group {
            project: project_id,
            index: group.group_type_index,
            key: group.group_key.clone(),
        });
        self.pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            tx.execute(
                "INSERT INTO groups (project_id, group_type_index, group_key, record)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (project_id, group_type_index, group_key)
                 DO UPDATE SET record = $4",
                &[&p, &i, &key, &record],
            )
            .await?;
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &changed])
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn add_usage(
        &self,
        project_id: u64,
        at: DateTime<Utc>,
        kind: UsageKind,
        n: u64,
    ) -> Result<(), StoreError> {
        if n == 0 {
            return Ok(());
        }
        let p = bigint(project_id);
        let month = at.format("%Y-%m").to_string();
        let (kind, n) = (i16::from(kind.tag()), i64::try_from(n).unwrap_or(i64::MAX));
        self.pg.run(move |client| async move {
            client
                .execute(
                    "INSERT INTO usage_counters (project_id, month, kind, count)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (project_id, month, kind)
                     DO UPDATE SET count = usage_counters.count + $4",
                    &[&p, &month, &kind, &n],
                )
                .await?;
            Ok(())
        })
    }

    fn usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT month, kind, count FROM usage_counters
                     WHERE project_id = $1 ORDER BY month, kind",
                    &[&p],
                )
                .await?;
            Ok(usage_rows(rows.iter().map(|r| {
                (
                    r.get::<_, String>(0),
                    u8::try_from(r.get::<_, i16>(1)).unwrap_or(u8::MAX),
                    u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
                )
            })))
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Every write above is a committed statement: durable already.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::pg::migrations::migrate;
    use corvid_kernel::pg::testing::TestPostgres;

    #[test]
    fn postgres_persons_pass_the_contract() {
        let server = TestPostgres::start();
        let db = server.database();
        let pg = Arc::new(db.connect());
        migrate(&pg, &[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]).expect("migrate");
        super::super::records::contract::suite(&PgPersons::new(pg));
    }

    #[test]
    fn usage_and_group_types_agree_across_nodes() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]);
        let nodes: Vec<PgPersons> = (0..3)
            .map(|_| PgPersons::new(Arc::new(db.connect())))
            .collect();
        let at = Utc::now();
        std::thread::scope(|s| {
            for (n, node) in nodes.iter().enumerate() {
                s.spawn(move || {
                    for _ in 0..20 {
                        node.add_usage(1, at, UsageKind::FlagRequests, 1)
                            .expect("usage");
                    }
                    for t in 0..4 {
                        node.ensure_group_type(1, &format!("type{}", (t + n) % 4), 5)
                            .expect("group type");
                    }
                });
            }
        });
        let usage = nodes[0].usage(1).expect("usage");
        assert_eq!(usage[0].flag_requests, 60, "every node's counts add up");
        let types = nodes[1].group_types(1).expect("types");
        let indexes: Vec<u8> = types.iter().map(|(_, i)| *i).collect();
        assert_eq!(indexes, vec![0, 1, 2, 3], "{types:?}");
    }

    /// Two nodes updating one person through its two distinct ids at once, while a third
    /// writes another person: every update counts (none reads a value the other overwrote).
    #[test]
    fn writes_of_one_person_from_two_nodes_take_turns_and_lose_nothing() {
        use crate::{Person, PersonStore, Touched};
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]);
        let nodes: Vec<PersonStore> = (0..3)
            .map(|_| PersonStore::new(Arc::new(PgPersons::new(Arc::new(db.connect())))))
            .collect();
        let person = |id: &str, ids: &[&str]| Person {
            id: Uuid::new_v5(&Uuid::NAMESPACE_OID, id.as_bytes()),
            created_at: Utc::now(),
            properties: serde_json::Map::new(),
            is_identified: true,
            version: 1,
            distinct_ids: ids.iter().map(|d| d.to_string()).collect(),
        };
        nodes[0]
            .put_person(1, person("shared", &["anon", "user"]))
            .expect("person");
        nodes[0]
            .put_person(1, person("other", &["other"]))
            .expect("person");
        let bump = |node: &PersonStore, distinct_id: &str| {
            let _writer = node.lock();
            node.exclusively(1, vec![Touched::DistinctId(distinct_id.into())], || {
                let mut p = node
                    .person_for_update(1, distinct_id)?
                    .expect("person exists");
                let n = p.properties.get("n").and_then(|v| v.as_u64()).unwrap_or(0);
                p.properties.insert("n".into(), (n + 1).into());
                node.put_person(1, p).map(|_| ())
            })
            .expect("write");
        };
        std::thread::scope(|s| {
            for (node, distinct_id) in nodes.iter().zip(["anon", "user", "other"]) {
                s.spawn(move || {
                    for _ in 0..25 {
                        bump(node, distinct_id);
                    }
                });
            }
        });
        let n = |distinct_id: &str| {
            nodes[2]
                .person_for_update(1, distinct_id)
                .expect("read")
                .expect("person")
                .properties["n"]
                .clone()
        };
        assert_eq!(
            n("user"),
            serde_json::json!(50),
            "both nodes' updates count"
        );
        assert_eq!(n("other"), serde_json::json!(25));
    }
}
