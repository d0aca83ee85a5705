//! The facade's operations: records through the store on the blocking pool, credentials and projects through the cache.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    apply_update, bootstrap, create_user, key_entries, mint_key, normalize_email, projects_of, run,
    validate_key, validate_project_name, validate_timezone, Arc, MetaCache, ROTATED_PROJECT,
};
use crate::{
    Bootstrapped, Credential, CredentialSource, MetadataRecords, MintKey, NewPersonalApiKey,
    NewProject, Organization, OrganizationUpdate, PersonalApiKey, Project, ProjectSettings,
    ProjectUpdate, Tenancy, TenancySettings, User,
};
use corvid_activity::{ActivityEntry, Actor, Recorded};
use corvid_kernel::{secrets, StoreError};
impl Tenancy {
    pub fn new(store: Arc<dyn MetadataRecords>, settings: TenancySettings) -> Tenancy {
        let cache = Arc::new(MetaCache::new(settings.cache_ttl));
        let revoked = Arc::clone(&cache);
        store.watch_credentials(Arc::new(move |notice| match notice {
            Some(notice) => match notice.strip_prefix(ROTATED_PROJECT) {
                Some(id) => match id.parse() {
                    Ok(id) => revoked.forget_project(id),
                    Err(_) => revoked.forget_all_projects(),
                },
                None => revoked.forget_credential(notice),
            },
            None => {
                revoked.forget_all_credentials();
                revoked.forget_all_projects();
            }
        }));
        Tenancy {
            store,
            cache,
            settings,
            passwords: Arc::default(),
        }
    }

    // ---- organizations ----

    pub async fn organization(&self, id: Uuid) -> Result<Option<Organization>, StoreError> {
        let store = Arc::clone(&self.store);
        run(move || store.organization(id)).await
    }

    pub async fn update_organization(
        &self,
        id: Uuid,
        update: OrganizationUpdate,
    ) -> Result<Organization, StoreError> {
        let store = Arc::clone(&self.store);
        let org = run(move || {
            let mut org = store
                .organization(id)?
                .ok_or_else(|| StoreError::NotFound {
                    what: format!("organization {id}"),
                })?;
            if let Some(name) = update.name {
                if name.trim().is_empty() {
                    return Err(StoreError::invalid("name must not be empty", "name"));
                }
                org.name = name;
            }
            if let Some(quota) = update.feature_flag_request_quota {
                org.feature_flag_request_quota = quota;
            }
            store.put_organization(&org)?;
            Ok(org)
        })
        .await?;
        self.cache
            .put_org_quota(org.id, org.feature_flag_request_quota);
        Ok(org)
    }

    /// An organization's flag-request quota from memory: `Some(None)` means unlimited,
    /// `None` that it is not cached yet.
    pub fn cached_flag_quota(&self, org: Uuid) -> Option<Option<u64>> {
        self.cache.org_quota(org)
    }

    /// An organization's flag-request quota (`None` = unlimited), read and cached. Blocking:
    /// call it off the async threads.
    pub fn flag_quota_blocking(&self, org: Uuid) -> Result<Option<u64>, StoreError> {
        let quota = self
            .store
            .organization(org)?
            .and_then(|o| o.feature_flag_request_quota);
        self.cache.put_org_quota(org, quota);
        Ok(quota)
    }

    // ---- projects ----

    pub async fn create_project(&self, new: NewProject) -> Result<Project, StoreError> {
        validate_project_name(&new.name)?;
        validate_timezone(&new.timezone)?;
        let store = Arc::clone(&self.store);
        let project = run(move || {
            if store.organization(new.organization_id)?.is_none() {
                return Err(StoreError::NotFound {
                    what: format!("organization {}", new.organization_id),
                });
            }
            let project = Project {
                id: store.next_id("projects")?,
                uuid: Uuid::now_v7(),
                organization_id: new.organization_id,
                name: new.name,
                api_token: secrets::new_project_token(),
                timezone: new.timezone,
                anonymize_ips: new.anonymize_ips,
                created_at: Utc::now(),
                event_retention_days: None,
                settings: ProjectSettings::default(),
            };
            store.insert_project(&project)?;
            Ok(project)
        })
        .await?;
        self.cache.put_project(Arc::new(project.clone()));
        Ok(project)
    }

    /// A project by id (memory first).
    pub async fn project(&self, id: u64) -> Result<Option<Arc<Project>>, StoreError> {
        if let Some(project) = self.cache.project(id) {
            return Ok(Some(project));
        }
        let store = Arc::clone(&self.store);
        let found = run(move || store.project(id)).await?;
        Ok(found.map(|p| self.remember(p)))
    }

    /// A project as stored now (not the cache: another node may have changed it). Blocking:
    /// call it off the async threads.
    pub fn project_blocking(&self, id: u64) -> Result<Option<Project>, StoreError> {
        self.store.project(id)
    }

    /// A project by its public token (memory first).
    pub async fn project_by_token(&self, token: &str) -> Result<Option<Arc<Project>>, StoreError> {
        if let Some(project) = self.cache.project_by_token(token) {
            return Ok(Some(project));
        }
        let (store, token) = (Arc::clone(&self.store), token.to_string());
        let found = run(move || store.project_by_token(&token)).await?;
        Ok(found.map(|p| self.remember(p)))
    }

    pub(super) fn remember(&self, project: Project) -> Arc<Project> {
        let project = Arc::new(project);
        self.cache.put_project(Arc::clone(&project));
        project
    }

    /// Changes a project's settings, logged as `actor`'s (scope `Team`) in the same write.
    pub async fn update_project(
        &self,
        id: u64,
        actor: &Actor,
        update: ProjectUpdate,
    ) -> Result<Project, StoreError> {
        let store = Arc::clone(&self.store);
        let actor = actor.clone();
        let project = run(move || {
            // Atomic in the store: concurrent updates of other fields are not lost.
            store.update_project(id, &mut |project| {
                logged_change(project, &actor, |p| apply_update(p, update.clone()))
            })
        })
        .await?;
        self.cache.put_project(Arc::new(project.clone()));
        Ok(project)
    }

    /// Gives project `id` a new token (PostHog's `reset_token`): the old one is refused at
    /// once, on every node; the new project is returned.
    pub async fn rotate_project_token(
        &self,
        id: u64,
        actor: &Actor,
    ) -> Result<Project, StoreError> {
        let store = Arc::clone(&self.store);
        let actor = actor.clone();
        let project = run(move || {
            store.update_project(id, &mut |project| {
                logged_change(project, &actor, |p| {
                    p.api_token = secrets::new_project_token();
                    Ok(())
                })
            })
        })
        .await?;
        self.cache.forget_project(id);
        self.cache.put_project(Arc::new(project.clone()));
        Ok(project)
    }

    /// The projects of an organization. Blocking: call it off the async threads.
    pub fn projects_of_organization_blocking(&self, org: Uuid) -> Result<Vec<Project>, StoreError> {
        projects_of(self.store.as_ref(), org)
    }

    pub async fn projects_of_organization(&self, org: Uuid) -> Result<Vec<Project>, StoreError> {
        let store = Arc::clone(&self.store);
        run(move || projects_of(store.as_ref(), org)).await
    }

    // ---- users ----

    /// Creates a user with a password (hashed here; argon2 is slow on purpose).
    pub async fn create_user(
        &self,
        organization_id: Uuid,
        email: &str,
        password: &str,
        is_staff: bool,
    ) -> Result<User, StoreError> {
        let store = Arc::clone(&self.store);
        let (email, password) = (normalize_email(email)?, password.to_string());
        run(move || create_user(store.as_ref(), organization_id, email, &password, is_staff)).await
    }

    /// The user whose email and password match (the same work is done for an unknown email,
    /// so timing does not tell which emails exist). Runs on the password threads: when all are
    /// busy and their queue is full, [`StoreError::Busy`] at once.
    pub async fn verify_login(
        &self,
        email: &str,
        password: &str,
    ) -> Result<Option<User>, StoreError> {
        let store = Arc::clone(&self.store);
        let (email, password) = (email.trim().to_ascii_lowercase(), password.to_string());
        let pool = self.passwords.get_or_init(|| {
            let s = &self.settings;
            corvid_kernel::pool::BoundedPool::new("password", s.password_threads, s.password_queue)
                .inspect_err(
                    |err| tracing::error!(error = %err, "cannot start the password threads"),
                )
                .ok()
        });
        let busy = StoreError::Busy {
            what: "password verification",
        };
        let verified = pool
            .as_ref()
            .ok_or(StoreError::Busy {
                what: "password verification",
            })?
            .submit(move || -> Result<Option<User>, StoreError> {
                let user = store.user_by_email(&email)?;
                let hash = user
                    .as_ref()
                    .map(|u| u.password_hash.clone())
                    .unwrap_or_else(secrets::dummy_password_hash);
                let ok = secrets::verify_password(&password, &hash);
                Ok(user.filter(|u| ok && u.is_active))
            })
            .map_err(|_| busy)?
            .await;
        verified.unwrap_or_else(|| {
            Err(StoreError::TaskFailed(
                "password verification panicked".into(),
            ))
        })
    }

    pub async fn user(&self, id: u64) -> Result<Option<User>, StoreError> {
        let store = Arc::clone(&self.store);
        run(move || store.user(id)).await
    }

    // ---- personal API keys ----

    /// Creates a key for `creator`'s user. A key never grants more than the credential that
    /// creates it (scopes, projects, organizations). Returns the key and its secret, which is
    /// not stored and cannot be shown again.
    pub async fn create_personal_api_key(
        &self,
        creator: &Credential,
        new: NewPersonalApiKey,
    ) -> Result<(PersonalApiKey, String), StoreError> {
        let label = validate_key(&new)?;
        let store = Arc::clone(&self.store);
        let creator = creator.clone();
        run(move || {
            let projects = projects_of(store.as_ref(), creator.user.organization_id)?;
            creator.check_delegation(&new, &projects)?;
            let u = &creator.user;
            let actor = Actor::user(u.id, u.uuid, &u.email, &u.first_name);
            mint_key(store.as_ref(), new, label, &actor)
        })
        .await
    }

    pub async fn personal_api_keys_of_user(
        &self,
        user_id: u64,
    ) -> Result<Vec<PersonalApiKey>, StoreError> {
        let store = Arc::clone(&self.store);
        run(move || store.keys_of_user(user_id)).await
    }

    /// A key of `user_id` (another user's key is reported as missing).
    pub async fn personal_api_key(
        &self,
        user_id: u64,
        id: &str,
    ) -> Result<Option<PersonalApiKey>, StoreError> {
        let (store, id) = (Arc::clone(&self.store), id.to_string());
        Ok(run(move || store.key(&id))
            .await?
            .filter(|k| k.user_id == user_id))
    }

    /// Deletes a key of `user_id`; it stops working at once. Whether it existed. Logged as
    /// `actor`'s in the same write.
    pub async fn delete_personal_api_key(
        &self,
        user_id: u64,
        id: &str,
        actor: &Actor,
    ) -> Result<bool, StoreError> {
        let Some(key) = self.personal_api_key(user_id, id).await? else {
            return Ok(false);
        };
        let store = Arc::clone(&self.store);
        let (stored, actor) = (key.clone(), actor.clone());
        run(move || {
            let log = key_entries(store.as_ref(), &stored, &actor, false)?;
            store.delete_key(&stored.id, &log)
        })
        .await?;
        self.cache.forget_credential(&key.secure_value_sha256);
        Ok(true)
    }

    /// Deletes the key whose secret leaked, whoever owns it. Whether it existed.
    pub async fn revoke_leaked_key(&self, secret: &str) -> Result<bool, StoreError> {
        let hash = secrets::sha256_hex(secret);
        let (store, lookup) = (Arc::clone(&self.store), hash.clone());
        let deleted = run(move || match store.key_by_hash(&lookup)? {
            Some(key) => {
                // Revoked by Corvid on a leak report: the system's change.
                let log = key_entries(store.as_ref(), &key, &Actor::system(), false)?;
                store.delete_key(&key.id, &log).map(|k| k.is_some())
            }
            None => Ok(false),
        })
        .await?;
        self.cache.forget_credential(&hash);
        Ok(deleted)
    }

    /// The credential a personal API key secret grants (memory first), or `None` when the key
    /// is unknown. Records the key's use at most once per `last_used_resolution`.
    pub async fn authenticate_key(
        &self,
        secret: &str,
    ) -> Result<Option<Arc<Credential>>, StoreError> {
        let hash = secrets::sha256_hex(secret);
        let credential = match self.cached_credential(&hash, Utc::now()) {
            Some(credential) => credential,
            None => {
                let epoch = self.cache.credential_epoch();
                let (store, lookup) = (Arc::clone(&self.store), hash.clone());
                let found = run(move || {
                    let Some(key) = store.key_by_hash(&lookup)? else {
                        return Ok(None);
                    };
                    let Some(user) = store.user(key.user_id)? else {
                        return Ok(None);
                    };
                    Ok::<_, StoreError>(Credential::from_personal_api_key(key, user))
                })
                .await?;
                let Some(credential) = found else {
                    return Ok(None);
                };
                let credential = Arc::new(credential);
                self.cache
                    .put_credential(hash, Arc::clone(&credential), epoch);
                credential
            }
        };
        self.note_use(&credential);
        Ok(Some(credential))
    }

    /// A cached credential that has not run out (an expired one is evicted).
    pub fn cached_credential(
        &self,
        sha256_hex: &str,
        now: DateTime<Utc>,
    ) -> Option<Arc<Credential>> {
        let cached = self.cache.credential(sha256_hex)?;
        if cached.expired(now) {
            self.cache.forget_credential(sha256_hex);
            return None;
        }
        Some(cached)
    }

    /// Where revocations stand: take it before verifying a credential elsewhere and pass it
    /// to [`Tenancy::remember_credential`].
    pub fn credential_epoch(&self) -> u64 {
        self.cache.credential_epoch()
    }

    /// Caches a credential verified elsewhere (OAuth access tokens) after `epoch` was taken;
    /// nothing is kept if a credential was revoked in between.
    pub fn remember_credential(&self, sha256_hex: String, credential: Arc<Credential>, epoch: u64) {
        self.cache.put_credential(sha256_hex, credential, epoch);
    }

    /// Drops a revoked credential so the next request re-reads (and fails) at once.
    pub fn forget_credential(&self, sha256_hex: &str) {
        self.cache.forget_credential(sha256_hex);
    }

    /// Writes `last_used_at` off the request path, at most once per the configured resolution.
    pub(super) fn note_use(&self, credential: &Arc<Credential>) {
        let CredentialSource::PersonalApiKey {
            id,
            sha256_hex,
            last_used_at,
        } = &credential.source
        else {
            return;
        };
        let resolution = chrono::Duration::from_std(self.settings.last_used_resolution)
            .unwrap_or(chrono::Duration::hours(1));
        let now = Utc::now();
        if last_used_at.is_some_and(|at| now - at < resolution) {
            return;
        }
        // Refresh the cached copy first so concurrent requests do not all write.
        let mut updated = (**credential).clone();
        updated.source = CredentialSource::PersonalApiKey {
            id: id.clone(),
            sha256_hex: sha256_hex.clone(),
            last_used_at: Some(now),
        };
        self.cache.refresh_credential(sha256_hex, Arc::new(updated));
        let (store, id) = (Arc::clone(&self.store), id.clone());
        tokio::task::spawn_blocking(move || {
            let touched = store.key(&id).and_then(|key| match key {
                Some(mut key) => {
                    key.last_used_at = Some(now);
                    store.put_key(&key)
                }
                None => Ok(()),
            });
            if let Err(err) = touched {
                tracing::warn!(error = %err, "could not record personal API key use");
            }
        });
    }

    // ---- bootstrap ----

    /// Creates whatever part of the default tenancy is missing (idempotent) and mints a
    /// personal API key for the admin as `mint` says.
    pub async fn bootstrap(&self, mint: MintKey) -> Result<Bootstrapped, StoreError> {
        let store = Arc::clone(&self.store);
        run(move || {
            // Nodes of a cluster starting together must not each create a tenancy.
            let mut done = None;
            store.exclusively(&mut || {
                done = Some(bootstrap(store.as_ref(), mint)?);
                Ok(())
            })?;
            done.ok_or_else(|| StoreError::TaskFailed("bootstrap did not run".into()))
        })
        .await
    }

    /// Makes everything written so far durable (shutdown).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let store = Arc::clone(&self.store);
        run(move || store.flush()).await
    }
}

/// Applies `change` to a project and answers its activity entry (scope `Team`, PostHog's
/// name for a project's settings; the token is masked).
fn logged_change(
    project: &mut Project,
    actor: &Actor,
    change: impl FnOnce(&mut Project) -> Result<(), StoreError>,
) -> Result<Vec<ActivityEntry>, StoreError> {
    let json = |p: &Project| serde_json::to_value(p).unwrap_or_default();
    let before = json(project);
    change(project)?;
    Ok(Recorded {
        project_id: project.id,
        actor,
        scope: "Team",
        item_id: project.id.to_string(),
        name: Some(project.name.clone()),
        before: Some(&before),
        after: &json(project),
    }
    .entry()
    .into_iter()
    .collect())
}
