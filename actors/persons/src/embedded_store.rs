//! The embedded person records: persons and distinct ids in their own keyspaces
//! ([`PersonFiles`]), groups, group types, usage and erasures in sled trees beside the
//! metadata (erasures commit with their activity entries).

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sled::transaction::ConflictableTransactionError;
use sled::Transactional;
use uuid::Uuid;

use super::erasure::Erasure;
use super::files::PersonFiles;
use super::model::{usage_rows, Group, Person, UsageKind, UsageRow};
use super::records::{NewIds, PersonRecords, PersonWrite};
use corvid_activity::{stage, ActivityEntry};
use corvid_kernel::codec::{decode, encode, get, scan_prefix};
use corvid_kernel::StoreError;

pub struct EmbeddedPersons {
    db: sled::Db,
    files: PersonFiles,
    group_types: sled::Tree,
    groups: sled::Tree,
    usage: sled::Tree,
    /// Key project ‖ record id.
    erasures: sled::Tree,
    /// The activity log's tree: erasure requests commit with their entries.
    activity: sled::Tree,
}

fn key(project_id: u64, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + rest.len());
    k.extend_from_slice(&project_id.to_be_bytes());
    k.extend_from_slice(rest);
    k
}

fn group_key(project_id: u64, index: u8, group_key: &str) -> Vec<u8> {
    let mut rest = vec![index];
    rest.extend_from_slice(group_key.as_bytes());
    key(project_id, &rest)
}

/// The project a key starts with.
fn project_of(key: &[u8]) -> u64 {
    key.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or_default()
}

impl EmbeddedPersons {
    /// Over the metadata store `db` and the person keyspaces `files`, first moving into
    /// `files` any persons `db` still holds ([`PersonFiles::take_over`]). Blocking.
    pub fn open(db: &sled::Db, files: PersonFiles) -> Result<EmbeddedPersons, StoreError> {
        files.take_over(db)?;
        Ok(EmbeddedPersons {
            files,
            group_types: db.open_tree("group_type_mappings")?,
            groups: db.open_tree("groups")?,
            usage: db.open_tree("usage")?,
            erasures: db.open_tree("person_erasures")?,
            activity: db.open_tree(corvid_activity::TREE)?,
            db: db.clone(),
        })
    }

    fn group_type_index(
        &self,
        project_id: u64,
        group_type: &str,
    ) -> Result<Option<u8>, StoreError> {
        Ok(self
            .group_types
            .get(key(project_id, group_type.as_bytes()))?
            .and_then(|v| v.first().copied()))
    }
}

impl PersonRecords for EmbeddedPersons {
    fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError> {
        let k = key(project_id, id.as_bytes());
        match self.files.persons.get(&k)? {
            Some(v) => Ok(Some(decode("persons", &k, &v)?)),
            None => Ok(None),
        }
    }

    fn person_id_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(self
            .files
            .distinct_ids
            .get(key(project_id, distinct_id.as_bytes()))?
            .and_then(|v| Uuid::from_slice(&v).ok()))
    }

    fn put_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        self.write_persons(&[PersonWrite::Put {
            project: project_id,
            person: Arc::new(person.clone()),
            new_ids: NewIds::Any,
        }])
    }

    fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError> {
        self.files.persons.remove(key(project_id, id.as_bytes()))?;
        Ok(())
    }

    /// One batch over both keyspaces. A key the writes name twice is written once, as the
    /// last write leaves it (a batch's entries share one sequence number, so two of one key
    /// would leave either). A distinct id a write may have moved ([`NewIds`]) is written only
    /// when its stored mapping differs: most writes change the properties of a person whose
    /// ids already point at it, and a point read costs less than writing (and later
    /// compacting) the mapping again.
    fn write_persons(&self, writes: &[PersonWrite]) -> Result<(), StoreError> {
        // Both maps hold at most an entry per person and distinct id `writes` names (the
        // write-behind commits at most 1,024 writes at a time).
        let mut persons: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
        // Key → (person, whether the mapping is known to be new: written without a read).
        let mut distinct_ids: HashMap<Vec<u8>, (Uuid, bool)> = HashMap::new();
        for write in writes {
            match write {
                PersonWrite::Put {
                    project,
                    person,
                    new_ids,
                } => {
                    persons.insert(
                        key(*project, person.id.as_bytes()),
                        Some(encode(person.as_ref())?),
                    );
                    match new_ids {
                        NewIds::Any => {
                            for did in &person.distinct_ids {
                                distinct_ids
                                    .entry(key(*project, did.as_bytes()))
                                    .and_modify(|(id, _)| *id = person.id)
                                    .or_insert((person.id, false));
                            }
                        }
                        NewIds::Only(ids) => {
                            for did in ids {
                                distinct_ids
                                    .insert(key(*project, did.as_bytes()), (person.id, true));
                            }
                        }
                    }
                }
                PersonWrite::Delete { project, id } => {
                    persons.insert(key(*project, id.as_bytes()), None);
                }
            }
        }
        let mut batch = self.files.batch();
        for (k, value) in persons {
            match value {
                Some(v) => batch.insert(&self.files.persons, k, v),
                None => batch.remove(&self.files.persons, k),
            }
        }
        for (k, (id, known_new)) in distinct_ids {
            if known_new
                || self.files.distinct_ids.get(&k)?.as_deref() != Some(id.as_bytes().as_slice())
            {
                batch.insert(&self.files.distinct_ids, k, id.as_bytes().as_slice());
            }
        }
        batch.commit()?;
        Ok(())
    }

    fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError> {
        let mut out = Vec::new();
        for entry in self.files.persons.prefix(project_id.to_be_bytes()) {
            let (k, v) = entry.into_inner()?;
            out.push(decode("persons", &k, &v)?);
        }
        Ok(out)
    }

    fn scan_persons(
        &self,
        after: Option<(u64, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(u64, Person)>, StoreError> {
        let from = match after {
            Some((project, id)) => std::ops::Bound::Excluded(key(project, id.as_bytes())),
            None => std::ops::Bound::Unbounded,
        };
        let mut out = Vec::new();
        for entry in self
            .files
            .persons
            .range::<Vec<u8>, _>((from, std::ops::Bound::Unbounded))
        {
            if out.len() >= limit {
                break;
            }
            let (k, v) = entry.into_inner()?;
            out.push((project_of(&k), decode("persons", &k, &v)?));
        }
        Ok(out)
    }

    /// Runs under the domain's writer lock ([`super::PersonStore`]), which is what keeps the
    /// read of each mapping and its removal together.
    fn remove_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        let mut batch = self.files.batch();
        for did in &person.distinct_ids {
            // Only while it still points at this person: a merge may have moved it.
            let k = key(project_id, did.as_bytes());
            if self.files.distinct_ids.get(&k)?.as_deref() == Some(person.id.as_bytes().as_slice())
            {
                batch.remove(&self.files.distinct_ids, k);
            }
        }
        batch.remove(&self.files.persons, key(project_id, person.id.as_bytes()));
        batch.commit()?;
        Ok(())
    }

    fn put_erasures(
        &self,
        project_id: u64,
        erasures: &[Erasure],
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        let rows = erasures
            .iter()
            .map(|e| Ok((key(project_id, e.id.as_bytes()), encode(e)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        (&self.erasures, &self.activity)
            .transaction(|(erasures, activity)| {
                for (k, v) in &rows {
                    erasures.insert(&k[..], v.clone())?;
                }
                for entry in log {
                    stage(activity, entry)?;
                }
                Ok::<(), ConflictableTransactionError<StoreError>>(())
            })
            .map_err(StoreError::from)?;
        self.db.flush()?;
        Ok(())
    }

    fn erasures(&self, project_id: Option<u64>) -> Result<Vec<Erasure>, StoreError> {
        let prefix = project_id.map(u64::to_be_bytes).unwrap_or_default();
        let prefix: &[u8] = if project_id.is_some() { &prefix } else { &[] };
        scan_prefix(&self.erasures, "person_erasures", prefix)
    }

    fn expire_erasures(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        let mut expired = 0;
        for erasure in self.erasures(None)? {
            if erasure.requested_at < before && !erasure.pending() {
                self.erasures
                    .remove(key(erasure.project_id, erasure.id.as_bytes()))?;
                expired += 1;
            }
        }
        Ok(expired)
    }

    fn group_types(&self, project_id: u64) -> Result<Vec<(String, u8)>, StoreError> {
        let mut out: Vec<(String, u8)> = Vec::new();
        for item in self.group_types.scan_prefix(project_id.to_be_bytes()) {
            let (k, v) = item?;
            if let (Ok(name), Some(index)) = (String::from_utf8(k[8..].to_vec()), v.first()) {
                out.push((name, *index));
            }
        }
        out.sort_by_key(|(_, i)| *i);
        Ok(out)
    }

    fn ensure_group_type(
        &self,
        project_id: u64,
        group_type: &str,
        max: u8,
    ) -> Result<Option<u8>, StoreError> {
        if let Some(i) = self.group_type_index(project_id, group_type)? {
            return Ok(Some(i));
        }
        let next = self.group_types(project_id)?.len() as u8;
        if next >= max {
            return Ok(None);
        }
        self.group_types
            .insert(key(project_id, group_type.as_bytes()), &[next])?;
        Ok(Some(next))
    }

    fn group(&self, project_id: u64, index: u8, key: &str) -> Result<Option<Group>, StoreError> {
        get(&self.groups, "groups", &group_key(project_id, index, key))
    }

    fn groups(&self, project_id: u64, index: Option<u8>) -> Result<Vec<Group>, StoreError> {
        let prefix = match index {
            Some(i) => key(project_id, &[i]),
            None => project_id.to_be_bytes().to_vec(),
        };
        scan_prefix(&self.groups, "groups", prefix)
    }

    fn put_group(&self, project_id: u64, group: &Group) -> Result<(), StoreError> {
        self.groups.insert(
            group_key(project_id, group.group_type_index, &group.group_key),
            encode(group)?,
        )?;
        Ok(())
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
        let month = at.format("%Y-%m").to_string();
        let mut rest = month.into_bytes();
        rest.push(kind.tag());
        self.usage.fetch_and_update(key(project_id, &rest), |old| {
            let current = old
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            Some((current + n).to_be_bytes().to_vec())
        })?;
        Ok(())
    }

    fn usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError> {
        let mut counters = Vec::new();
        for item in self.usage.scan_prefix(project_id.to_be_bytes()) {
            let (k, v) = item?;
            if k.len() < 8 + 7 + 1 {
                continue;
            }
            let month = String::from_utf8_lossy(&k[8..15]).into_owned();
            let count = v.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0);
            counters.push((month, k[15], count));
        }
        Ok(usage_rows(counters))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.files.flush()?;
        self.db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{DISTINCT_IDS, PERSONS};
    use crate::records::contract::person;

    /// The persons over `db` and the keyspaces under `dir`, opened again after an earlier
    /// handle was dropped: its background threads may hold the directory's lock a moment
    /// longer, so the open is retried for a while.
    fn opened(db: &sled::Db, dir: &std::path::Path) -> EmbeddedPersons {
        let mut attempts = 0;
        let files = loop {
            match PersonFiles::open(&dir.join("persons"), 8 << 20) {
                Ok(files) => break files,
                Err(_) if attempts < 100 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(err) => panic!("the keyspaces do not open: {err}"),
            }
        };
        EmbeddedPersons::open(db, files).expect("open")
    }

    fn metadata() -> sled::Db {
        sled::Config::new().temporary(true).open().expect("sled")
    }

    #[test]
    fn embedded_persons_pass_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        crate::records::contract::suite(&opened(&metadata(), dir.path()));
    }

    #[test]
    fn persons_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = metadata();
        let alice = person(&["a1", "a2"]);
        {
            let persons = opened(&db, dir.path());
            persons.put_person(3, &alice).expect("put");
            persons.flush().expect("flush");
        }
        let persons = opened(&db, dir.path());
        assert_eq!(
            persons.person(3, alice.id).expect("read"),
            Some(alice.clone())
        );
        assert_eq!(
            persons.person_id_by_distinct_id(3, "a2").expect("read"),
            Some(alice.id)
        );
    }

    #[test]
    fn persons_left_in_the_metadata_store_move_into_their_keyspaces_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = person(&["o1", "o2"]);
        let db = metadata();
        {
            // What a build that kept persons in sled, or a restored snapshot, leaves behind.
            db.open_tree(PERSONS)
                .expect("tree")
                .insert(key(5, old.id.as_bytes()), encode(&old).expect("encode"))
                .expect("insert");
            let ids = db.open_tree(DISTINCT_IDS).expect("tree");
            for did in &old.distinct_ids {
                ids.insert(key(5, did.as_bytes()), old.id.as_bytes().as_slice())
                    .expect("insert");
            }
            db.flush().expect("flush");
        }
        let newer = person(&["n1"]);
        {
            let persons = opened(&db, dir.path());
            assert_eq!(persons.person(5, old.id).expect("read"), Some(old.clone()));
            assert_eq!(
                persons.person_id_by_distinct_id(5, "o2").expect("read"),
                Some(old.id)
            );
            let names = db.tree_names();
            assert!(!names.iter().any(|n| n.as_ref() == PERSONS.as_bytes()));
            assert!(!names.iter().any(|n| n.as_ref() == DISTINCT_IDS.as_bytes()));
            persons.put_person(5, &newer).expect("put");
            persons.flush().expect("flush");
        }
        // A second open moves nothing and loses nothing.
        let persons = opened(&db, dir.path());
        let mut all = persons.persons(5).expect("persons");
        all.sort_by_key(|p| p.distinct_ids[0].clone());
        assert_eq!(all, vec![newer, old]);
    }

    #[test]
    fn an_export_lists_every_entry_under_its_keyspace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path().join("meta")).expect("sled");
        let files = PersonFiles::open(&dir.path().join("persons"), 8 << 20).expect("files");
        let persons = EmbeddedPersons::open(&db, files.clone()).expect("open");
        let p = person(&["e1", "e2"]);
        persons.put_person(8, &p).expect("put");
        let mut seen: Vec<(String, Vec<u8>)> = Vec::new();
        files
            .export(|name, k, _| {
                seen.push((name.to_string(), k.to_vec()));
                Ok::<(), StoreError>(())
            })
            .expect("export");
        assert_eq!(
            seen,
            vec![
                (PERSONS.to_string(), key(8, p.id.as_bytes())),
                (DISTINCT_IDS.to_string(), key(8, b"e1")),
                (DISTINCT_IDS.to_string(), key(8, b"e2")),
            ]
        );
    }
}
