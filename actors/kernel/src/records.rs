//! Project-scoped definition records: early-access features, surveys, experiments and
//! holdouts. Each domain keeps its records behind [`DefinitionRecords`], named by what the domain
//! stores (`DefinitionRecords<Survey>`, …); [`SledRecords`] is the embedded implementation, and every
//! implementation must pass [`contract::suite`].
//!
//! These are small configuration documents edited by people, read far more often than written:
//! one JSON value per record, keyed by project and id.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::codec::{decode, encode, get, scan_prefix};
use super::StoreError;

/// Where one kind of project-scoped record lives.
pub trait DefinitionRecords<T>: Send + Sync {
    /// Every record of the project, in key order.
    fn list(&self, project: u64) -> Result<Vec<T>, StoreError>;
    /// Every record of every project, as (project, record), for background upkeep.
    fn list_all(&self) -> Result<Vec<(u64, T)>, StoreError>;
    fn get(&self, project: u64, id: &str) -> Result<Option<T>, StoreError>;
    /// Inserts or replaces a record; durable when it returns. Where the store enforces a
    /// uniqueness across records for concurrent writers on every node (in PostgreSQL: one
    /// live experiment per feature flag), a record that breaks it gets `Conflict`.
    fn put(&self, project: u64, id: &str, record: &T) -> Result<(), StoreError>;
    /// Removes a record; whether it existed.
    fn delete(&self, project: u64, id: &str) -> Result<bool, StoreError>;
    /// A new integer id, unique within this store across projects and restarts.
    fn next_id(&self) -> Result<u64, StoreError>;
}

/// Records of one kind in a sled tree (key: project id ‖ record id), with an id sequence.
pub struct SledRecords<T> {
    db: sled::Db,
    tree: sled::Tree,
    sequences: sled::Tree,
    name: &'static str,
    _records: PhantomData<fn() -> T>,
}

impl<T> SledRecords<T> {
    /// Opens the tree `name` of `db`.
    pub fn open(db: &sled::Db, name: &'static str) -> Result<SledRecords<T>, StoreError> {
        Ok(SledRecords {
            tree: db.open_tree(name)?,
            sequences: db.open_tree("record_sequences")?,
            db: db.clone(),
            name,
            _records: PhantomData,
        })
    }

    /// The tree the records live in, and the database it is in: for a writer that commits a
    /// record with rows of another tree in one sled transaction ([`record_key`] names it,
    /// [`super::codec::encode`] makes its value).
    pub fn tree(&self) -> (&sled::Tree, &sled::Db) {
        (&self.tree, &self.db)
    }
}

/// The key of record `id` of `project` in a [`SledRecords`] tree.
pub fn record_key(project: u64, id: &str) -> Vec<u8> {
    key(project, id)
}

fn key(project: u64, id: &str) -> Vec<u8> {
    let mut k = project.to_be_bytes().to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

impl<T: Serialize + DeserializeOwned> DefinitionRecords<T> for SledRecords<T> {
    fn list(&self, project: u64) -> Result<Vec<T>, StoreError> {
        scan_prefix(&self.tree, self.name, project.to_be_bytes())
    }

    fn list_all(&self) -> Result<Vec<(u64, T)>, StoreError> {
        self.tree
            .iter()
            .map(|item| {
                let (k, v) = item?;
                let project = k
                    .get(..8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| StoreError::Corrupt {
                        tree: self.name,
                        key: String::from_utf8_lossy(&k).into_owned(),
                        source: serde::de::Error::custom("key shorter than a project id"),
                    })?;
                Ok((project, decode(self.name, &k, &v)?))
            })
            .collect()
    }

    fn get(&self, project: u64, id: &str) -> Result<Option<T>, StoreError> {
        get(&self.tree, self.name, &key(project, id))
    }

    fn put(&self, project: u64, id: &str, record: &T) -> Result<(), StoreError> {
        self.tree.insert(key(project, id), encode(record)?)?;
        self.db.flush()?;
        Ok(())
    }

    fn delete(&self, project: u64, id: &str) -> Result<bool, StoreError> {
        let existed = self.tree.remove(key(project, id))?.is_some();
        self.db.flush()?;
        Ok(existed)
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        let next = super::sequence::next(&self.sequences, self.name)?;
        self.db.flush()?;
        Ok(next)
    }
}

/// The behaviour every [`DefinitionRecords`] implementation must show, written against the trait.
#[cfg(test)]
pub mod contract {
    use serde::{Deserialize, Serialize};

    use super::DefinitionRecords;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Note {
        pub id: String,
        pub text: String,
    }

    fn note(id: &str, text: &str) -> Note {
        Note {
            id: id.into(),
            text: text.into(),
        }
    }

    /// Runs every contract check against a fresh, empty store.
    pub fn suite(store: &dyn DefinitionRecords<Note>) {
        projects_are_isolated(store);
        put_replaces_and_delete_removes(store);
        ids_are_unique_and_increasing(store);
    }

    fn projects_are_isolated(store: &dyn DefinitionRecords<Note>) {
        store.put(1, "a", &note("a", "one")).expect("put");
        store.put(2, "a", &note("a", "two")).expect("put");
        store.put(1, "b", &note("b", "three")).expect("put");
        assert_eq!(store.get(1, "a").expect("get"), Some(note("a", "one")));
        assert_eq!(store.get(2, "a").expect("get"), Some(note("a", "two")));
        assert_eq!(store.get(2, "b").expect("get"), None);
        let one: Vec<String> = store
            .list(1)
            .expect("list")
            .into_iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(one, vec!["a", "b"]);
        assert_eq!(store.list(3).expect("list"), vec![]);
        // A project id that is a byte prefix of another's key never leaks into its listing.
        store.put(256, "x", &note("x", "far")).expect("put");
        assert_eq!(store.list(1).expect("list").len(), 2);
        let mut all: Vec<(u64, String)> = store
            .list_all()
            .expect("all")
            .into_iter()
            .map(|(p, n)| (p, n.id))
            .collect();
        all.sort();
        assert_eq!(
            all,
            vec![
                (1, "a".into()),
                (1, "b".into()),
                (2, "a".into()),
                (256, "x".into())
            ]
        );
    }

    fn put_replaces_and_delete_removes(store: &dyn DefinitionRecords<Note>) {
        store.put(5, "r", &note("r", "old")).expect("put");
        store.put(5, "r", &note("r", "new")).expect("put");
        assert_eq!(store.list(5).expect("list"), vec![note("r", "new")]);
        assert!(store.delete(5, "r").expect("delete"));
        assert!(!store.delete(5, "r").expect("delete again"));
        assert_eq!(store.get(5, "r").expect("get"), None);
    }

    fn ids_are_unique_and_increasing(store: &dyn DefinitionRecords<Note>) {
        let ids: Vec<u64> = (0..50).map(|_| store.next_id().expect("id")).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        assert!(ids[0] >= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sled_records_pass_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let store: SledRecords<contract::Note> = SledRecords::open(&db, "notes").expect("open");
        contract::suite(&store);
    }

    #[test]
    fn sled_ids_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let last = {
            let db = sled::open(dir.path()).expect("sled");
            let store: SledRecords<contract::Note> = SledRecords::open(&db, "notes").expect("open");
            store.next_id().expect("id");
            store.next_id().expect("id")
        };
        // sled's flusher thread lets go of the directory's lock a moment after the last handle
        // is dropped: retry the reopen briefly, as a restarted process would find it free.
        let db = (0..100)
            .find_map(|_| {
                sled::open(dir.path()).ok().or_else(|| {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    None
                })
            })
            .expect("sled reopens");
        let store: SledRecords<contract::Note> = SledRecords::open(&db, "notes").expect("open");
        assert!(store.next_id().expect("id") > last);
    }
}
