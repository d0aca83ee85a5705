//! The sled-backed metadata store: typed trees, a schema version and durable id sequences.
//!
//! Every mutation is flushed (fsynced) before it returns, so what the API acknowledged survives
//! a crash. Metadata writes are rare, so the fsync per write costs nothing that matters.

use std::path::Path;

use chrono::Utc;
use serde::de::DeserializeOwned;
use sled::transaction::{ConflictableTransactionError, Transactional};
use uuid::Uuid;

use super::model::{
    NewPersonalApiKey, NewProject, Organization, PersonalApiKey, Project, ProjectSettings,
    ProjectUpdate, User,
};
use super::{Credential, ScopeSet};
use crate::kernel::codec::{encode, get, u64_key};
use crate::kernel::{secrets, StoreError};

/// Version of the on-disk layout. Bump it with a migration when a record changes incompatibly.
pub const SCHEMA_VERSION: u32 = 1;

const SCHEMA_KEY: &[u8] = b"schema_version";

/// The metadata store. Cheap to share behind an `Arc`; all methods block on disk I/O.
pub struct MetaStore {
    db: sled::Db,
    meta: sled::Tree,
    organizations: sled::Tree,
    projects: sled::Tree,
    project_tokens: sled::Tree,
    users: sled::Tree,
    user_emails: sled::Tree,
    keys: sled::Tree,
    key_hashes: sled::Tree,
}

impl MetaStore {
    /// Opens (or creates) the store in `dir`, checking the schema version. Waits up to
    /// [`LOCK_WAIT`] while another instance (e.g. one still shutting down, whose background
    /// threads hold the lock for a moment) releases the directory.
    pub fn open(dir: &Path) -> Result<MetaStore, StoreError> {
        let db = open_db(dir)?;
        let store = MetaStore {
            meta: db.open_tree("meta")?,
            organizations: db.open_tree("organizations")?,
            projects: db.open_tree("projects")?,
            project_tokens: db.open_tree("project_tokens")?,
            users: db.open_tree("users")?,
            user_emails: db.open_tree("user_emails")?,
            keys: db.open_tree("personal_api_keys")?,
            key_hashes: db.open_tree("personal_api_key_hashes")?,
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

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// Allocates the next id of a sequence (1, 2, 3, …). Durable once the caller flushes.
    fn next_id(&self, sequence: &str) -> Result<u64, StoreError> {
        crate::kernel::sequence::next(&self.meta, &format!("seq/{sequence}"))
    }

    // ---- organizations ----

    pub fn create_organization(&self, name: &str) -> Result<Organization, StoreError> {
        let org = Organization {
            id: Uuid::now_v7(),
            name: name.to_string(),
            created_at: Utc::now(),
            feature_flag_request_quota: None,
        };
        self.organizations.insert(org.id.as_bytes(), encode(&org))?;
        self.flush()?;
        Ok(org)
    }

    pub fn organization(&self, id: Uuid) -> Result<Option<Organization>, StoreError> {
        get(&self.organizations, "organizations", id.as_bytes())
    }

    /// Replaces an organization record.
    pub fn update_organization(&self, org: &Organization) -> Result<(), StoreError> {
        if self.organization(org.id)?.is_none() {
            return Err(StoreError::NotFound {
                what: format!("organization {}", org.id),
            });
        }
        self.organizations.insert(org.id.as_bytes(), encode(org))?;
        self.flush()?;
        Ok(())
    }

    pub fn organizations(&self) -> Result<Vec<Organization>, StoreError> {
        scan(&self.organizations, "organizations")
    }

    // ---- projects ----

    pub fn create_project(&self, new: NewProject) -> Result<Project, StoreError> {
        validate_project_name(&new.name)?;
        validate_timezone(&new.timezone)?;
        if self.organization(new.organization_id)?.is_none() {
            return Err(StoreError::NotFound {
                what: format!("organization {}", new.organization_id),
            });
        }
        let project = Project {
            id: self.next_id("projects")?,
            uuid: Uuid::now_v7(),
            organization_id: new.organization_id,
            name: new.name,
            api_token: secrets::new_project_token(),
            timezone: new.timezone,
            anonymize_ips: new.anonymize_ips,
            created_at: Utc::now(),
            settings: ProjectSettings::default(),
        };
        let record = encode(&project);
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
        self.flush()?;
        Ok(project)
    }

    pub fn project(&self, id: u64) -> Result<Option<Project>, StoreError> {
        get(&self.projects, "projects", &u64_key(id))
    }

    /// Applies a partial update to a project and returns the new record.
    pub fn update_project(&self, id: u64, update: ProjectUpdate) -> Result<Project, StoreError> {
        let mut project = self.project(id)?.ok_or_else(|| StoreError::NotFound {
            what: format!("project {id}"),
        })?;
        if let Some(name) = update.name {
            validate_project_name(&name)?;
            project.name = name;
        }
        if let Some(timezone) = update.timezone {
            validate_timezone(&timezone)?;
            project.timezone = timezone;
        }
        if update.session_recording_opt_in == Some(true) {
            return Err(StoreError::invalid(
                "Session recordings are not stored by Corvid, so they cannot be turned on.",
                "session_recording_opt_in",
            ));
        }
        let s = &mut project.settings;
        let flags = [
            (update.anonymize_ips, &mut project.anonymize_ips),
            (update.autocapture_opt_out, &mut s.autocapture_opt_out),
            (
                update.autocapture_exceptions_opt_in,
                &mut s.autocapture_exceptions_opt_in,
            ),
            (
                update.capture_performance_opt_in,
                &mut s.capture_performance_opt_in,
            ),
            (
                update.autocapture_web_vitals_opt_in,
                &mut s.autocapture_web_vitals_opt_in,
            ),
            (update.heatmaps_opt_in, &mut s.heatmaps_opt_in),
            (update.capture_dead_clicks, &mut s.capture_dead_clicks),
            (update.surveys_opt_in, &mut s.surveys_opt_in),
            (
                update.session_recording_opt_in,
                &mut s.session_recording_opt_in,
            ),
            (
                update.default_identified_only,
                &mut s.default_identified_only,
            ),
        ];
        for (new, field) in flags {
            if let Some(value) = new {
                *field = value;
            }
        }
        self.projects.insert(u64_key(id), encode(&project))?;
        self.flush()?;
        Ok(project)
    }

    pub fn project_by_token(&self, token: &str) -> Result<Option<Project>, StoreError> {
        match self.project_tokens.get(token.as_bytes())? {
            None => Ok(None),
            Some(id) => match id.as_ref().try_into().map(u64::from_be_bytes) {
                Ok(id) => self.project(id),
                Err(_) => Ok(None),
            },
        }
    }

    pub fn projects_of_organization(&self, org: Uuid) -> Result<Vec<Project>, StoreError> {
        Ok(scan::<Project>(&self.projects, "projects")?
            .into_iter()
            .filter(|p| p.organization_id == org)
            .collect())
    }

    pub fn project_count(&self) -> usize {
        self.projects.len()
    }

    // ---- users ----

    pub fn create_user(
        &self,
        organization_id: Uuid,
        email: &str,
        password: &str,
        is_staff: bool,
    ) -> Result<User, StoreError> {
        let email = normalize_email(email)?;
        let user = User {
            id: self.next_id("users")?,
            uuid: Uuid::now_v7(),
            first_name: email.split('@').next().unwrap_or_default().to_string(),
            email,
            password_hash: secrets::hash_password(password)?,
            organization_id,
            is_staff,
            created_at: Utc::now(),
        };
        let record = encode(&user);
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
        self.flush()?;
        Ok(user)
    }

    pub fn user(&self, id: u64) -> Result<Option<User>, StoreError> {
        get(&self.users, "users", &u64_key(id))
    }

    pub fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        let email = email.trim().to_ascii_lowercase();
        match self.user_emails.get(email.as_bytes())? {
            None => Ok(None),
            Some(id) => match id.as_ref().try_into().map(u64::from_be_bytes) {
                Ok(id) => self.user(id),
                Err(_) => Ok(None),
            },
        }
    }

    // ---- personal API keys ----

    /// Creates a key and returns it with its secret, which is not stored and cannot be shown
    /// again.
    pub fn create_personal_api_key(
        &self,
        new: NewPersonalApiKey,
    ) -> Result<(PersonalApiKey, String), StoreError> {
        let label = new.label.trim().to_string();
        if label.is_empty() || label.chars().count() > 40 {
            return Err(StoreError::invalid(
                "label must be between 1 and 40 characters",
                "label",
            ));
        }
        if new.scopes.is_empty() {
            return Err(StoreError::invalid(
                "at least one scope is required",
                "scopes",
            ));
        }
        ScopeSet::parse(&new.scopes)
            .map_err(|bad| StoreError::invalid(format!("invalid scope `{bad}`"), "scopes"))?;
        let secret = secrets::new_personal_api_key();
        let key = PersonalApiKey {
            id: Uuid::now_v7().simple().to_string(),
            user_id: new.user_id,
            label,
            secure_value_sha256: secrets::sha256_hex(&secret),
            mask_value: secrets::mask(&secret),
            scopes: new.scopes,
            scoped_teams: new.scoped_teams,
            scoped_organizations: new.scoped_organizations,
            created_at: Utc::now(),
            last_used_at: None,
        };
        let record = encode(&key);
        (&self.keys, &self.key_hashes).transaction(|(keys, hashes)| {
            keys.insert(key.id.as_bytes(), record.as_slice())?;
            hashes.insert(key.secure_value_sha256.as_bytes(), key.id.as_bytes())?;
            Ok::<(), ConflictableTransactionError<StoreError>>(())
        })?;
        self.flush()?;
        Ok((key, secret))
    }

    /// Looks a key up by the SHA-256 hex of its secret.
    pub fn personal_api_key_by_hash(
        &self,
        sha256_hex: &str,
    ) -> Result<Option<PersonalApiKey>, StoreError> {
        match self.key_hashes.get(sha256_hex.as_bytes())? {
            None => Ok(None),
            Some(id) => get(&self.keys, "personal_api_keys", &id),
        }
    }

    pub fn personal_api_key(&self, id: &str) -> Result<Option<PersonalApiKey>, StoreError> {
        get(&self.keys, "personal_api_keys", id.as_bytes())
    }

    pub fn personal_api_keys_of_user(
        &self,
        user_id: u64,
    ) -> Result<Vec<PersonalApiKey>, StoreError> {
        Ok(scan::<PersonalApiKey>(&self.keys, "personal_api_keys")?
            .into_iter()
            .filter(|k| k.user_id == user_id)
            .collect())
    }

    /// Deletes a key; returns the deleted record (for cache invalidation) if it existed.
    pub fn delete_personal_api_key(&self, id: &str) -> Result<Option<PersonalApiKey>, StoreError> {
        let Some(key) = self.personal_api_key(id)? else {
            return Ok(None);
        };
        (&self.keys, &self.key_hashes).transaction(|(keys, hashes)| {
            keys.remove(key.id.as_bytes())?;
            hashes.remove(key.secure_value_sha256.as_bytes())?;
            Ok::<(), ConflictableTransactionError<StoreError>>(())
        })?;
        self.flush()?;
        Ok(Some(key))
    }

    /// The credential a personal API key secret grants, if the key and its user exist.
    pub fn credential_for_key_hash(
        &self,
        sha256_hex: &str,
    ) -> Result<Option<Credential>, StoreError> {
        let Some(key) = self.personal_api_key_by_hash(sha256_hex)? else {
            return Ok(None);
        };
        let Some(user) = self.user(key.user_id)? else {
            return Ok(None);
        };
        Ok(Credential::from_personal_api_key(key, user))
    }

    /// Records that a key was used. Callers throttle this (it is not needed per request).
    pub fn touch_personal_api_key(&self, id: &str) -> Result<(), StoreError> {
        if let Some(mut key) = self.personal_api_key(id)? {
            key.last_used_at = Some(Utc::now());
            self.keys.insert(key.id.as_bytes(), encode(&key))?;
            self.flush()?;
        }
        Ok(())
    }
}

/// How long [`MetaStore::open`] waits for the data directory's lock.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn open_db(dir: &Path) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let mut logged = false;
    loop {
        match sled::Config::new().path(dir).open() {
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
    crate::kernel::codec::scan_prefix(tree, name, [])
}

fn validate_project_name(name: &str) -> Result<(), StoreError> {
    let len = name.trim().chars().count();
    if len == 0 || len > 200 {
        return Err(StoreError::invalid(
            "name must be between 1 and 200 characters",
            "name",
        ));
    }
    Ok(())
}

fn validate_timezone(tz: &str) -> Result<(), StoreError> {
    tz.parse::<chrono_tz::Tz>()
        .map(|_| ())
        .map_err(|_| StoreError::invalid(format!("unknown time zone `{tz}`"), "timezone"))
}

fn normalize_email(email: &str) -> Result<String, StoreError> {
    let email = email.trim().to_ascii_lowercase();
    match email.split_once('@') {
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() => Ok(email),
        _ => Err(StoreError::invalid(
            "email must look like name@host",
            "email",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, MetaStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("opens");
        (dir, store)
    }

    #[test]
    fn ids_continue_after_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let org_id = {
            let store = MetaStore::open(dir.path()).expect("opens");
            let org = store.create_organization("Acme").expect("org");
            let p = store
                .create_project(NewProject {
                    organization_id: org.id,
                    name: "One".into(),
                    timezone: "UTC".into(),
                    anonymize_ips: false,
                })
                .expect("project");
            assert_eq!(p.id, 1);
            org.id
        };
        let store = MetaStore::open(dir.path()).expect("reopens");
        let p = store
            .create_project(NewProject {
                organization_id: org_id,
                name: "Two".into(),
                timezone: "Europe/Paris".into(),
                anonymize_ips: true,
            })
            .expect("project");
        assert_eq!(p.id, 2);
        assert_eq!(
            store.project_by_token(&p.api_token).expect("reads"),
            Some(p)
        );
    }

    #[test]
    fn keys_are_found_by_hash_only_and_never_store_the_secret() {
        let (_dir, store) = store();
        let (key, secret) = store
            .create_personal_api_key(NewPersonalApiKey {
                user_id: 1,
                label: "ci".into(),
                scopes: vec!["query:read".into()],
                scoped_teams: None,
                scoped_organizations: None,
            })
            .expect("creates");
        let found = store
            .personal_api_key_by_hash(&secrets::sha256_hex(&secret))
            .expect("reads");
        assert_eq!(found.as_ref(), Some(&key));
        let raw = store
            .keys
            .get(key.id.as_bytes())
            .expect("reads")
            .expect("exists");
        let raw = String::from_utf8_lossy(&raw);
        assert!(!raw.contains(&secret[4..]), "secret must not be stored");
        store.delete_personal_api_key(&key.id).expect("deletes");
        assert_eq!(
            store
                .personal_api_key_by_hash(&secrets::sha256_hex(&secret))
                .expect("reads"),
            None
        );
    }

    #[test]
    fn invalid_input_is_rejected_with_the_field() {
        let (_dir, store) = store();
        let org = store.create_organization("Acme").expect("org");
        let err = store
            .create_project(NewProject {
                organization_id: org.id,
                name: "x".into(),
                timezone: "Mars/Olympus".into(),
                anonymize_ips: false,
            })
            .expect_err("bad tz");
        assert!(matches!(
            err,
            StoreError::Invalid {
                attr: Some("timezone"),
                ..
            }
        ));
        let err = store
            .create_personal_api_key(NewPersonalApiKey {
                user_id: 1,
                label: "x".into(),
                scopes: vec!["nope:read".into()],
                scoped_teams: None,
                scoped_organizations: None,
            })
            .expect_err("bad scope");
        assert!(matches!(
            err,
            StoreError::Invalid {
                attr: Some("scopes"),
                ..
            }
        ));
        store
            .create_user(org.id, "a@b.c", "pw", false)
            .expect("user");
        let err = store
            .create_user(org.id, "A@B.C", "pw", false)
            .expect_err("dup");
        assert!(matches!(err, StoreError::Conflict { .. }));
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = MetaStore::open(dir.path()).expect("opens");
            store
                .meta
                .insert(SCHEMA_KEY, &(SCHEMA_VERSION + 1).to_be_bytes())
                .expect("writes");
            store.flush().expect("flushes");
        }
        assert!(matches!(
            MetaStore::open(dir.path()),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }
}
