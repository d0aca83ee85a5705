//! In-memory, read-mostly view of the metadata that every request needs (credentials and
//! projects), so authentication does not touch sled on the hot path.
//!
//! The cache is exact for this process: every write through the service invalidates or
//! refreshes the entries it touches. A TTL bounds staleness should another writer ever share the
//! data directory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::model::Project;
use super::Credential;

/// The cache's maps. Every request looks a token up here (capture and `/flags` alike), and
/// aHash with keys drawn per process (`runtime-rng`) hashes one in a fraction of SipHash's
/// time while still keeping keys a client chooses from being made to collide.
type DashMap<K, V> = dashmap::DashMap<K, V, ahash::RandomState>;

struct Entry<V> {
    value: V,
    loaded: Instant,
}

pub struct MetaCache {
    ttl: Duration,
    credentials_by_hash: DashMap<String, Entry<Arc<Credential>>>,
    /// Counts credentials forgotten: a fill that read storage before a revocation sees it
    /// moved and drops what it put, so a revoked key is never served from memory.
    forgotten: AtomicU64,
    projects: DashMap<u64, Entry<Arc<Project>>>,
    project_ids_by_token: DashMap<String, u64>,
    /// Organizations' flag-request quotas (`None` = unlimited).
    org_quotas: DashMap<uuid::Uuid, Option<u64>>,
}

impl MetaCache {
    pub fn new(ttl: Duration) -> MetaCache {
        MetaCache {
            ttl,
            credentials_by_hash: DashMap::default(),
            forgotten: AtomicU64::new(0),
            projects: DashMap::default(),
            project_ids_by_token: DashMap::default(),
            org_quotas: DashMap::default(),
        }
    }

    fn fresh<V: Clone>(&self, entry: &Entry<V>) -> Option<V> {
        (entry.loaded.elapsed() < self.ttl).then(|| entry.value.clone())
    }

    /// A verified credential by the SHA-256 hex of its secret.
    pub fn credential(&self, sha256_hex: &str) -> Option<Arc<Credential>> {
        self.credentials_by_hash
            .get(sha256_hex)
            .and_then(|e| self.fresh(&e))
    }

    /// Where the revocation count stands: take it before reading a credential from storage
    /// and hand it to [`MetaCache::put_credential`].
    pub fn credential_epoch(&self) -> u64 {
        self.forgotten.load(Ordering::SeqCst)
    }

    /// Remembers a credential read from storage after `epoch` was taken, unless a credential
    /// was forgotten since (then the read may predate a revocation, and nothing is kept).
    pub fn put_credential(&self, sha256_hex: String, credential: Arc<Credential>, epoch: u64) {
        if self.credential_epoch() != epoch {
            return;
        }
        self.credentials_by_hash.insert(
            sha256_hex.clone(),
            Entry {
                value: credential,
                loaded: Instant::now(),
            },
        );
        // A revocation between the check and the insert removed nothing; undo the insert.
        if self.credential_epoch() != epoch {
            self.credentials_by_hash.remove(&sha256_hex);
        }
    }

    /// Replaces a credential that is still remembered (never brings back a forgotten one).
    pub fn refresh_credential(&self, sha256_hex: &str, credential: Arc<Credential>) {
        if let Some(mut entry) = self.credentials_by_hash.get_mut(sha256_hex) {
            entry.value = credential;
        }
    }

    /// Drops a revoked credential so the next request re-reads (and fails) at once.
    pub fn forget_credential(&self, sha256_hex: &str) {
        self.forgotten.fetch_add(1, Ordering::SeqCst);
        self.credentials_by_hash.remove(sha256_hex);
    }

    /// Drops every remembered credential (another node revoked one this node cannot name).
    pub fn forget_all_credentials(&self) {
        self.forgotten.fetch_add(1, Ordering::SeqCst);
        self.credentials_by_hash.clear();
    }

    /// An organization's flag-request quota, if known: `Some(None)` means unlimited.
    pub fn org_quota(&self, org: uuid::Uuid) -> Option<Option<u64>> {
        self.org_quotas.get(&org).map(|q| *q)
    }

    pub fn put_org_quota(&self, org: uuid::Uuid, quota: Option<u64>) {
        self.org_quotas.insert(org, quota);
    }

    pub fn project(&self, id: u64) -> Option<Arc<Project>> {
        self.projects.get(&id).and_then(|e| self.fresh(&e))
    }

    /// The project whose token is `token` now (a rotated-away token finds nothing).
    pub fn project_by_token(&self, token: &str) -> Option<Arc<Project>> {
        let id = *self.project_ids_by_token.get(token)?;
        self.project(id).filter(|p| p.api_token == token)
    }

    /// Drops a project and every token that led to it (its token was rotated).
    pub fn forget_project(&self, id: u64) {
        self.projects.remove(&id);
        self.project_ids_by_token.retain(|_, p| *p != id);
    }

    /// Drops every project (another node changed one this node cannot name).
    pub fn forget_all_projects(&self) {
        self.projects.clear();
        self.project_ids_by_token.clear();
    }

    pub fn put_project(&self, project: Arc<Project>) {
        self.project_ids_by_token
            .insert(project.api_token.clone(), project.id);
        self.projects.insert(
            project.id,
            Entry {
                value: project,
                loaded: Instant::now(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;
    use crate::model::{PersonalApiKey, User};

    fn credential() -> Arc<Credential> {
        let user = User {
            id: 1,
            uuid: Uuid::now_v7(),
            email: "a@example.com".into(),
            first_name: "a".into(),
            password_hash: "hash".into(),
            organization_id: Uuid::now_v7(),
            is_staff: false,
            created_at: Utc::now(),
            level: crate::model::Level::Owner,
            is_active: true,
            deactivated_at: None,
        };
        let key = PersonalApiKey {
            id: "k1".into(),
            user_id: 1,
            label: "k".into(),
            secure_value_sha256: "h".into(),
            mask_value: "phx_...x".into(),
            scopes: vec!["*".into()],
            scoped_teams: None,
            scoped_organizations: None,
            created_at: Utc::now(),
            last_used_at: None,
        };
        Arc::new(Credential::from_personal_api_key(key, user).expect("credential"))
    }

    #[test]
    fn a_fill_that_read_before_a_revocation_is_not_kept() {
        let cache = MetaCache::new(Duration::from_secs(60));
        let epoch = cache.credential_epoch();
        // The key is read from storage here, then revoked before the fill lands.
        cache.forget_credential("h");
        cache.put_credential("h".into(), credential(), epoch);
        assert!(cache.credential("h").is_none());

        let epoch = cache.credential_epoch();
        cache.put_credential("h".into(), credential(), epoch);
        assert!(
            cache.credential("h").is_some(),
            "an undisturbed fill is kept"
        );
    }

    #[test]
    fn a_refresh_never_brings_back_a_forgotten_credential() {
        let cache = MetaCache::new(Duration::from_secs(60));
        cache.refresh_credential("h", credential());
        assert!(cache.credential("h").is_none());
        let epoch = cache.credential_epoch();
        cache.put_credential("h".into(), credential(), epoch);
        cache.forget_credential("h");
        cache.refresh_credential("h", credential());
        assert!(cache.credential("h").is_none());
    }
}
