//! The embedded person records (sled trees beside the metadata).

use chrono::{DateTime, Utc};
use sled::transaction::ConflictableTransactionError;
use sled::Transactional;
use uuid::Uuid;

use super::erasure::Erasure;
use super::model::{usage_rows, Group, Person, UsageKind, UsageRow};
use super::records::PersonRecords;
use corvid_activity::{stage, ActivityEntry};
use corvid_kernel::codec::{decode, encode, get, scan_prefix};
use corvid_kernel::StoreError;

pub struct SledPersons {
    db: sled::Db,
    persons: sled::Tree,
    distinct_ids: sled::Tree,
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

impl SledPersons {
    pub fn open(db: &sled::Db) -> Result<SledPersons, StoreError> {
        Ok(SledPersons {
            persons: db.open_tree("persons")?,
            distinct_ids: db.open_tree("person_distinct_ids")?,
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

impl PersonRecords for SledPersons {
    fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError> {
        get(&self.persons, "persons", &key(project_id, id.as_bytes()))
    }

    fn person_id_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(self
            .distinct_ids
            .get(key(project_id, distinct_id.as_bytes()))?
            .and_then(|v| Uuid::from_slice(&v).ok()))
    }

    fn put_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        self.persons
            .insert(key(project_id, person.id.as_bytes()), encode(person)?)?;
        for did in &person.distinct_ids {
            // Most writes change the properties of a person whose ids already point at it:
            // reading a mapping costs less than rewriting it (an insert logs a new version).
            let k = key(project_id, did.as_bytes());
            if self.distinct_ids.get(&k)?.as_deref() != Some(person.id.as_bytes().as_slice()) {
                self.distinct_ids
                    .insert(k, person.id.as_bytes().as_slice())?;
            }
        }
        Ok(())
    }

    fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError> {
        self.persons.remove(key(project_id, id.as_bytes()))?;
        Ok(())
    }

    fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError> {
        scan_prefix(&self.persons, "persons", project_id.to_be_bytes())
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
        for item in self.persons.range((from, std::ops::Bound::Unbounded)) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            let project = k
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .unwrap_or_default();
            out.push((project, decode("persons", &k, &v)?));
        }
        Ok(out)
    }

    fn remove_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        for did in &person.distinct_ids {
            // Only while it still points at this person: a merge may have moved it.
            let _ = self.distinct_ids.compare_and_swap(
                key(project_id, did.as_bytes()),
                Some(person.id.as_bytes().as_slice()),
                None::<&[u8]>,
            )?;
        }
        self.persons.remove(key(project_id, person.id.as_bytes()))?;
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
        self.db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sled_persons_pass_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        crate::records::contract::suite(&SledPersons::open(&db).expect("open"));
    }
}
