//! In-memory, read-mostly view of the metadata that every request needs (credentials and
//! projects), so authentication does not touch sled on the hot path.
//!
//! The cache is exact for this process: every write through the service invalidates or
//! refreshes the entries it touches. A TTL bounds staleness should another writer ever share the
//! data directory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::model::Project;
use super::Credential;

struct Entry<V> {
    value: V,
    loaded: Instant,
}

pub struct MetaCache {
    ttl: Duration,
    credentials_by_hash: DashMap<String, Entry<Arc<Credential>>>,
    projects: DashMap<u64, Entry<Arc<Project>>>,
    project_ids_by_token: DashMap<String, u64>,
    /// Organizations' flag-request quotas (`None` = unlimited).
    org_quotas: DashMap<uuid::Uuid, Option<u64>>,
}

impl MetaCache {
    pub fn new(ttl: Duration) -> MetaCache {
        MetaCache {
            ttl,
            credentials_by_hash: DashMap::new(),
            projects: DashMap::new(),
            project_ids_by_token: DashMap::new(),
            org_quotas: DashMap::new(),
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

    pub fn put_credential(&self, sha256_hex: String, credential: Arc<Credential>) {
        self.credentials_by_hash.insert(
            sha256_hex,
            Entry {
                value: credential,
                loaded: Instant::now(),
            },
        );
    }

    /// Drops a revoked credential so the next request re-reads (and fails) at once.
    pub fn forget_credential(&self, sha256_hex: &str) {
        self.credentials_by_hash.remove(sha256_hex);
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

    pub fn project_by_token(&self, token: &str) -> Option<Arc<Project>> {
        let id = *self.project_ids_by_token.get(token)?;
        self.project(id)
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
