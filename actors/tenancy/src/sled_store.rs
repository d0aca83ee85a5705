//! The embedded metadata store: sled trees beside the other embedded stores, a schema version
//! and durable id sequences.
//!
//! Every mutation is flushed (fsynced) before it returns, so what the API acknowledged survives
//! a crash. Metadata writes are rare, so the fsync per write costs nothing that matters.

use std::path::Path;

use serde::de::DeserializeOwned;
use sled::transaction::{ConflictableTransactionError, Transactional};
use uuid::Uuid;

use super::model::{Invite, Organization, PersonalApiKey, Project, User};
use super::store::{MetadataRecords, ProjectEdit, UserEdit};
use corvid_activity::{stage, ActivityEntry};
use corvid_kernel::codec::{encode, get, u64_key};
use corvid_kernel::StoreError;

/// Version of the on-disk layout. Bump it with a migration when a record changes incompatibly.
pub const SCHEMA_VERSION: u32 = 1;

const SCHEMA_KEY: &[u8] = b"schema_version";

/// The embedded metadata store. All methods block on disk I/O.
pub struct SledMetadata {
    db: sled::Db,
    meta: sled::Tree,
    organizations: sled::Tree,
    projects: sled::Tree,
    project_tokens: sled::Tree,
    /// The activity log's tree: project settings changes are logged in their transaction.
    activity: sled::Tree,
    users: sled::Tree,
    user_emails: sled::Tree,
    keys: sled::Tree,
    key_hashes: sled::Tree,
    invites: sled::Tree,
}

impl SledMetadata {
    /// Opens (or creates) the store in `dir`, checking the schema version. Waits up to
    /// [`LOCK_WAIT`] while another instance (e.g. one still shutting down, whose background
    /// threads hold the lock for a moment) releases the directory.
    pub fn open(dir: &Path) -> Result<SledMetadata, StoreError> {
        SledMetadata::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// Opens the store with a page cache of `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<SledMetadata, StoreError> {
        let db = open_db(dir, cache_bytes)?;
        let store = SledMetadata {
            meta: db.open_tree("meta")?,
            organizations: db.open_tree("organizations")?,
            projects: db.open_tree("projects")?,
            project_tokens: db.open_tree("project_tokens")?,
            activity: db.open_tree(corvid_activity::TREE)?,
            users: db.open_tree("users")?,
            user_emails: db.open_tree("user_emails")?,
            keys: db.open_tree("personal_api_keys")?,
            key_hashes: db.open_tree("personal_api_key_hashes")?,
            invites: db.open_tree("invites")?,
            db,
        };
        store.check_schema()?;
        Ok(store)
    }

    /// The underlying database, for other domains that keep their own trees beside these.
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    fn check_schema(&self) -> Result<(), StoreError> {
        match self.meta.get(SCHEMA_KEY)? {
            None => {
                self.meta
                    .insert(SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes())?;
                self.db.flush()?;
                Ok(())
            }
            Some(bytes) => {
                let found = bytes
                    .as_ref()
                    .try_into()
                    .map(u32::from_be_bytes)
                    .unwrap_or(u32::MAX);
                if found > SCHEMA_VERSION {
                    return Err(StoreError::SchemaTooNew {
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                Ok(())
            }
        }
    }

    fn durable(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// The id stored under `key` of an index tree, read back as a u64.
    fn indexed(index: &sled::Tree, key: &[u8]) -> Result<Option<u64>, StoreError> {
        Ok(index
            .get(key)?
            .and_then(|id| <[u8; 8]>::try_from(id.as_ref()).ok())
            .map(u64::from_be_bytes))
    }
}

impl MetadataRecords for SledMetadata {
    fn next_id(&self, sequence: &str) -> Result<u64, StoreError> {
        let id = corvid_kernel::sequence::next(&self.meta, &format!("seq/{sequence}"))?;
        self.durable()?;
        Ok(id)
    }

    fn put_organization(&self, org: &Organization) -> Result<(), StoreError> {
        self.organizations.insert(org.id.as_bytes(), encode(org)?)?;
        self.durable()
    }

    fn organization(&self, id: Uuid) -> Result<Option<Organization>, StoreError> {
        get(&self.organizations, "organizations", id.as_bytes())
    }

    fn organizations(&self) -> Result<Vec<Organization>, StoreError> {
        scan(&self.organizations, "organizations")
    }

    fn insert_project(&self, project: &Project) -> Result<(), StoreError> {
        let record = encode(project)?;
        (&self.projects, &self.project_tokens).transaction(|(projects, tokens)| {
            if tokens.get(project.api_token.as_bytes())?.is_some() {
                return Err(ConflictableTransactionError::Abort(StoreError::Conflict {
                    what: "project token".into(),
                }));
            }
            projects.insert(&u64_key(project.id), record.as_slice())?;
            tokens.insert(project.api_token.as_bytes(), &u64_key(project.id))?;
            Ok(())
        })?;
        self.durable()
    }

    fn put_project(&self, project: &Project) -> Result<(), StoreError> {
        self.projects
            .insert(u64_key(project.id), encode(project)?)?;
        self.durable()
    }

    fn update_project(&self, id: u64, change: &mut ProjectEdit<'_>) -> Result<Project, StoreError> {
        let key = u64_key(id);
        let change = std::cell::RefCell::new(change);
        let abort = ConflictableTransactionError::Abort;
        // sled retries the closure when another writer touched the same keys meanwhile.
        let updated = (&self.projects, &self.project_tokens, &self.activity).transaction(
            |(projects, tokens, activity)| {
                let Some(bytes) = projects.get(key)? else {
                    return Err(abort(StoreError::NotFound {
                        what: format!("project {id}"),
                    }));
                };
                let mut project: Project =
                    corvid_kernel::codec::decode("projects", &key, &bytes).map_err(abort)?;
                let old_token = project.api_token.clone();
                let log = (change.borrow_mut())(&mut project).map_err(abort)?;
                if project.api_token != old_token {
                    if tokens.get(project.api_token.as_bytes())?.is_some() {
                        return Err(abort(StoreError::Conflict {
                            what: "project token".into(),
                        }));
                    }
                    tokens.remove(old_token.as_bytes())?;
                    tokens.insert(project.api_token.as_bytes(), &key)?;
                }
                projects.insert(&key, encode(&project).map_err(abort)?)?;
                for entry in &log {
                    stage(activity, entry)?;
                }
                Ok(project)
            },
        )?;
        self.durable()?;
        Ok(updated)
    }

    fn project(&self, id: u64) -> Result<Option<Project>, StoreError> {
        get(&self.projects, "projects", &u64_key(id))
    }

    fn project_by_token(&self, token: &str) -> Result<Option<Project>, StoreError> {
        match Self::indexed(&self.project_tokens, token.as_bytes())? {
            Some(id) => self.project(id),
            None => Ok(None),
        }
    }

    fn projects(&self) -> Result<Vec<Project>, StoreError> {
        scan(&self.projects, "projects")
    }

    fn insert_user(&self, user: &User) -> Result<(), StoreError> {
        let record = encode(user)?;
        (&self.users, &self.user_emails).transaction(|(users, emails)| {
            if emails.get(user.email.as_bytes())?.is_some() {
                return Err(ConflictableTransactionError::Abort(StoreError::Conflict {
                    what: format!("user {}", user.email),
                }));
            }
            users.insert(&u64_key(user.id), record.as_slice())?;
            emails.insert(user.email.as_bytes(), &u64_key(user.id))?;
            Ok(())
        })?;
        self.durable()
    }

    fn user(&self, id: u64) -> Result<Option<User>, StoreError> {
        get(&self.users, "users", &u64_key(id))
    }

    fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        match Self::indexed(&self.user_emails, email.as_bytes())? {
            Some(id) => self.user(id),
            None => Ok(None),
        }
    }

    fn users_of_organization(&self, org: Uuid) -> Result<Vec<User>, StoreError> {
        Ok(scan::<User>(&self.users, "users")?
            .into_iter()
            .filter(|u| u.organization_id == org)
            .collect())
    }

    fn update_user(&self, id: u64, change: &mut UserEdit<'_>) -> Result<User, StoreError> {
        let key = u64_key(id);
        let change = std::cell::RefCell::new(change);
        let abort = ConflictableTransactionError::Abort;
        let updated = (&self.users, &self.activity).transaction(|(users, activity)| {
            let Some(bytes) = users.get(key)? else {
                return Err(abort(StoreError::NotFound {
                    what: format!("user {id}"),
                }));
            };
            let mut user: User =
                corvid_kernel::codec::decode("users", &key, &bytes).map_err(abort)?;
            let email = user.email.clone();
            let log = (change.borrow_mut())(&mut user).map_err(abort)?;
            user.email = email;
            users.insert(&key, encode(&user).map_err(abort)?)?;
            for entry in &log {
                stage(activity, entry)?;
            }
            Ok(user)
        })?;
        self.durable()?;
        Ok(updated)
    }

    fn put_invite(&self, invite: &Invite, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let record = encode(invite)?;
        (&self.invites, &self.activity).transaction(|(invites, activity)| {
            invites.insert(invite.id.as_bytes(), record.as_slice())?;
            for entry in log {
                stage(activity, entry)?;
            }
            Ok::<(), ConflictableTransactionError<StoreError>>(())
        })?;
        self.durable()
    }

    fn invite(&self, id: Uuid) -> Result<Option<Invite>, StoreError> {
        get(&self.invites, "invites", id.as_bytes())
    }

    fn invites_of_organization(&self, org: Uuid) -> Result<Vec<Invite>, StoreError> {
        Ok(scan::<Invite>(&self.invites, "invites")?
            .into_iter()
            .filter(|i| i.organization_id == org)
            .collect())
    }

    fn delete_invite(&self, id: Uuid, log: &[ActivityEntry]) -> Result<bool, StoreError> {
        let existed = (&self.invites, &self.activity).transaction(|(invites, activity)| {
            let existed = invites.remove(id.as_bytes())?.is_some();
            if existed {
                for entry in log {
                    stage(activity, entry)?;
                }
            }
            Ok::<bool, ConflictableTransactionError<StoreError>>(existed)
        })?;
        self.durable()?;
        Ok(existed)
    }

    fn insert_key(&self, key: &PersonalApiKey, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let record = encode(key)?;
        (&self.keys, &self.key_hashes, &self.activity).transaction(
            |(keys, hashes, activity)| {
                keys.insert(key.id.as_bytes(), record.as_slice())?;
                hashes.insert(key.secure_value_sha256.as_bytes(), key.id.as_bytes())?;
                for entry in log {
                    stage(activity, entry)?;
                }
                Ok::<(), ConflictableTransactionError<StoreError>>(())
            },
        )?;
        self.durable()
    }

    fn put_key(&self, key: &PersonalApiKey) -> Result<(), StoreError> {
        self.keys.insert(key.id.as_bytes(), encode(key)?)?;
        self.durable()
    }

    fn key(&self, id: &str) -> Result<Option<PersonalApiKey>, StoreError> {
        get(&self.keys, "personal_api_keys", id.as_bytes())
    }

    fn key_by_hash(&self, sha256_hex: &str) -> Result<Option<PersonalApiKey>, StoreError> {
        match self.key_hashes.get(sha256_hex.as_bytes())? {
            None => Ok(None),
            Some(id) => get(&self.keys, "personal_api_keys", &id),
        }
    }

    fn keys_of_user(&self, user_id: u64) -> Result<Vec<PersonalApiKey>, StoreError> {
        Ok(scan::<PersonalApiKey>(&self.keys, "personal_api_keys")?
            .into_iter()
            .filter(|k| k.user_id == user_id)
            .collect())
    }

    fn delete_key(
        &self,
        id: &str,
        log: &[ActivityEntry],
    ) -> Result<Option<PersonalApiKey>, StoreError> {
        let Some(key) = self.key(id)? else {
            return Ok(None);
        };
        (&self.keys, &self.key_hashes, &self.activity).transaction(
            |(keys, hashes, activity)| {
                keys.remove(key.id.as_bytes())?;
                hashes.remove(key.secure_value_sha256.as_bytes())?;
                for entry in log {
                    stage(activity, entry)?;
                }
                Ok::<(), ConflictableTransactionError<StoreError>>(())
            },
        )?;
        self.durable()?;
        Ok(Some(key))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.durable()
    }
}

/// How long [`SledMetadata::open`] waits for the data directory's lock.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// sled's page cache when the owner names none (256 MiB: persons flags read are kept in
/// memory of their own, so the store's cache serves the rest).
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

fn open_db(dir: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let mut logged = false;
    loop {
        match sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()
        {
            // sled reports a held lock as `ErrorKind::Other` with this text (sled 0.34).
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                if !logged {
                    tracing::info!(dir = %dir.display(), "data dir is locked; waiting for the previous instance to release it");
                    logged = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            other => return Ok(other?),
        }
    }
}

fn scan<V: DeserializeOwned>(tree: &sled::Tree, name: &'static str) -> Result<Vec<V>, StoreError> {
    corvid_kernel::codec::scan_prefix(tree, name, [])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sled_metadata_passes_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        crate::store::contract::suite(&|| {
            Box::new(SledMetadata::open(&path).expect("opens")) as Box<dyn MetadataRecords>
        });
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = SledMetadata::open(dir.path()).expect("opens");
            store
                .meta
                .insert(SCHEMA_KEY, &(SCHEMA_VERSION + 1).to_be_bytes())
                .expect("write");
            store.db.flush().expect("flush");
        }
        assert!(matches!(
            SledMetadata::open(dir.path()),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }
}
