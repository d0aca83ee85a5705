//! Where activity-log entries live. [`ActivityRecords`] is the storage trait (reads, expiry,
//! and appends for changes whose own store is not transactional with it); the domains whose
//! stores are (sled trees of one database, one PostgreSQL) write an entry in the very
//! transaction of the change with [`stage`] (sled) or [`insert`] (PostgreSQL).
//! [`SledActivity`] is the embedded implementation; every implementation passes
//! [`contract::suite`].

use chrono::{DateTime, Utc};
use sled::transaction::{ConflictableTransactionError, TransactionalTree};
use uuid::Uuid;

use super::entry::ActivityEntry;
use corvid_kernel::codec::{decode, encode};
use corvid_kernel::StoreError;

/// The sled tree of the log (a store that writes entries in its own transactions opens it on
/// its database).
pub const TREE: &str = "activity_log";

/// Which entries a listing wants; every filter given must match.
#[derive(Debug, Clone, Default)]
pub struct ActivityQuery {
    /// Any of these scopes (empty: every scope).
    pub scopes: Vec<String>,
    pub item_id: Option<String>,
    /// Entries of this user (by id).
    pub user: Option<u64>,
    /// Entries of this user (by uuid, PostHog's `user` filter).
    pub user_uuid: Option<Uuid>,
    /// Only entries older than this one (a cursor: the last id of the previous page).
    pub before: Option<Uuid>,
    /// Only entries newer than this one (a poll for new entries).
    pub after: Option<Uuid>,
    pub offset: usize,
    pub limit: usize,
}

impl ActivityQuery {
    pub fn matches(&self, e: &ActivityEntry) -> bool {
        (self.scopes.is_empty() || self.scopes.contains(&e.scope))
            && self.item_id.as_ref().is_none_or(|i| *i == e.item_id)
            && self.user.is_none_or(|u| e.user.id == Some(u))
            && self.user_uuid.is_none_or(|u| e.user.uuid == Some(u))
            && self.before.is_none_or(|b| e.id < b)
            && self.after.is_none_or(|a| e.id > a)
    }
}

/// A page of entries, newest first, with how many match in all.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivityPage {
    pub entries: Vec<ActivityEntry>,
    pub total: u64,
}

/// The activity log's storage.
pub trait ActivityRecords: Send + Sync {
    /// Stores an entry on its own (durable when it returns).
    fn append(&self, entry: &ActivityEntry) -> Result<(), StoreError>;
    /// The project's entries matching `query`, newest first, from `query.offset`, at most
    /// `query.limit`.
    fn query(&self, project_id: u64, query: &ActivityQuery) -> Result<ActivityPage, StoreError>;
    fn entry(&self, project_id: u64, id: Uuid) -> Result<Option<ActivityEntry>, StoreError>;
    /// The project's entries with an id above `after`, oldest first, at most `limit`: how a
    /// reader that follows the log (webhook deliveries) pages forward.
    fn since(
        &self,
        project_id: u64,
        after: Uuid,
        limit: usize,
    ) -> Result<Vec<ActivityEntry>, StoreError>;
    /// Deletes every entry made before `cutoff`; how many.
    fn expire(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError>;
}

fn key(project_id: u64, id: Uuid) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&project_id.to_be_bytes());
    k[8..].copy_from_slice(id.as_bytes());
    k
}

/// Writes `entry` within a sled transaction over the log's tree (opened as [`TREE`]), so it
/// commits with the change it records.
pub fn stage(
    tree: &TransactionalTree,
    entry: &ActivityEntry,
) -> Result<(), ConflictableTransactionError<StoreError>> {
    let value = encode(entry).map_err(ConflictableTransactionError::Abort)?;
    tree.insert(&key(entry.project_id, entry.id)[..], value)?;
    Ok(())
}

/// The embedded log: one sled tree, keyed by project and time-ordered id.
pub struct SledActivity {
    db: sled::Db,
    tree: sled::Tree,
}

impl SledActivity {
    pub fn open(db: &sled::Db) -> Result<SledActivity, StoreError> {
        Ok(SledActivity {
            tree: db.open_tree(TREE)?,
            db: db.clone(),
        })
    }
}

impl ActivityRecords for SledActivity {
    fn append(&self, entry: &ActivityEntry) -> Result<(), StoreError> {
        self.tree
            .insert(key(entry.project_id, entry.id), encode(entry)?)?;
        self.db.flush()?;
        Ok(())
    }

    fn query(&self, project_id: u64, query: &ActivityQuery) -> Result<ActivityPage, StoreError> {
        let mut entries = Vec::new();
        let mut total = 0u64;
        for item in self.tree.scan_prefix(project_id.to_be_bytes()).rev() {
            let (k, v) = item?;
            let entry: ActivityEntry = decode(TREE, &k, &v)?;
            if !query.matches(&entry) {
                continue;
            }
            if total >= query.offset as u64 && entries.len() < query.limit {
                entries.push(entry);
            }
            total += 1;
        }
        Ok(ActivityPage { entries, total })
    }

    fn entry(&self, project_id: u64, id: Uuid) -> Result<Option<ActivityEntry>, StoreError> {
        self.tree
            .get(key(project_id, id))?
            .map(|v| decode(TREE, &key(project_id, id), &v))
            .transpose()
    }

    fn since(
        &self,
        project_id: u64,
        after: Uuid,
        limit: usize,
    ) -> Result<Vec<ActivityEntry>, StoreError> {
        let start = key(project_id, after);
        let end = key(project_id, Uuid::max());
        self.tree
            .range(start..=end)
            .filter(|item| item.as_ref().map_or(true, |(k, _)| k[..] != start[..]))
            .take(limit)
            .map(|item| {
                let (k, v) = item?;
                decode(TREE, &k, &v)
            })
            .collect()
    }

    fn expire(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut gone = 0;
        for item in self.tree.iter() {
            let (k, v) = item?;
            let entry: ActivityEntry = decode(TREE, &k, &v)?;
            if entry.created_at < cutoff {
                self.tree.remove(k)?;
                gone += 1;
            }
        }
        if gone > 0 {
            self.db.flush()?;
        }
        Ok(gone)
    }
}

/// The behaviour every [`ActivityRecords`] must show, written against the trait.
#[cfg(any(test, feature = "test-support"))]
pub mod contract {
    use chrono::Duration;

    use super::*;
    use crate::entry::{Actor, Recorded};

    fn entry(project: u64, scope: &str, item: &str, user: u64) -> ActivityEntry {
        let actor = Actor::user(user, Uuid::from_u128(user.into()), "a@example.com", "A");
        Recorded {
            project_id: project,
            actor: &actor,
            scope,
            item_id: item.into(),
            name: None,
            before: None,
            after: &serde_json::json!({"name": item}),
        }
        .entry()
        .expect("a creation")
    }

    /// Runs every check against an empty store.
    pub fn suite(records: &dyn ActivityRecords) {
        let a = entry(1, "FeatureFlag", "1", 10);
        let b = entry(1, "Cohort", "2", 11);
        let c = entry(1, "FeatureFlag", "3", 10);
        let other = entry(2, "FeatureFlag", "1", 10);
        for e in [&a, &b, &c, &other] {
            records.append(e).expect("append");
        }
        let all = |q: ActivityQuery| {
            records
                .query(1, &ActivityQuery { limit: 100, ..q })
                .expect("query")
        };
        let ids = |p: ActivityPage| p.entries.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(
            ids(all(ActivityQuery::default())),
            vec![c.id, b.id, a.id],
            "newest first, one project"
        );
        let flags = all(ActivityQuery {
            scopes: vec!["FeatureFlag".into()],
            ..ActivityQuery::default()
        });
        assert_eq!(flags.total, 2);
        let item = all(ActivityQuery {
            scopes: vec!["FeatureFlag".into()],
            item_id: Some("3".into()),
            ..ActivityQuery::default()
        });
        assert_eq!(ids(item), vec![c.id]);
        let by_user = all(ActivityQuery {
            user: Some(11),
            ..ActivityQuery::default()
        });
        assert_eq!(ids(by_user), vec![b.id]);
        let by_uuid = all(ActivityQuery {
            user_uuid: Some(Uuid::from_u128(11)),
            ..ActivityQuery::default()
        });
        assert_eq!(ids(by_uuid), vec![b.id]);
        let page = records
            .query(
                1,
                &ActivityQuery {
                    offset: 1,
                    limit: 1,
                    ..ActivityQuery::default()
                },
            )
            .expect("page");
        assert_eq!((ids(page.clone()), page.total), (vec![b.id], 3));
        let older = all(ActivityQuery {
            before: Some(b.id),
            ..ActivityQuery::default()
        });
        assert_eq!(ids(older), vec![a.id]);
        let newer = all(ActivityQuery {
            after: Some(a.id),
            ..ActivityQuery::default()
        });
        assert_eq!(ids(newer), vec![c.id, b.id]);
        let following = |after: Uuid, limit| {
            records
                .since(1, after, limit)
                .expect("since")
                .iter()
                .map(|e| e.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            following(Uuid::nil(), 10),
            vec![a.id, b.id, c.id],
            "oldest first"
        );
        assert_eq!(following(a.id, 1), vec![b.id], "after, not from; limited");
        assert_eq!(following(c.id, 10), Vec::<Uuid>::new());
        assert_eq!(records.entry(1, b.id).expect("read"), Some(b.clone()));
        assert_eq!(records.entry(2, b.id).expect("read"), None, "per project");
        // Expiry removes what is older than the cutoff, in every project.
        let mut old = entry(1, "FeatureFlag", "9", 10);
        old.created_at = Utc::now() - Duration::days(400);
        records.append(&old).expect("append");
        assert_eq!(
            records
                .expire(Utc::now() - Duration::days(365))
                .expect("expire"),
            1
        );
        assert_eq!(records.entry(1, old.id).expect("read"), None);
        assert_eq!(all(ActivityQuery::default()).total, 3);
    }

    #[test]
    fn sled_activity_passes_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        suite(&SledActivity::open(&db).expect("open"));
    }
}
