//! The tenancy facade: organizations, projects, users and personal API keys, with their rules
//! (names, time zones, emails, labels and scopes, ids, tokens, secrets), the in-memory cache
//! every request reads, and credential lookup. The one door to [`MetadataRecords`].

use std::sync::Arc;
use std::time::Duration;

use super::cache::MetaCache;
use super::model::{Project, User};
use super::store::{MetadataRecords, ROTATED_PROJECT};
use corvid_kernel::{blocking, StoreError};

/// Blocking store work off the async threads.
async fn run<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    blocking(work).await
}

pub const DEFAULT_ORGANIZATION: &str = "Default";
pub const DEFAULT_PROJECT: &str = "Default project";
pub const ADMIN_EMAIL: &str = "admin@localhost";

/// How tenancy caches and records credential use.
#[derive(Debug, Clone, Copy)]
pub struct TenancySettings {
    /// How long a verified credential or a project stays cached before it is re-read.
    pub cache_ttl: Duration,
    /// `last_used_at` of a personal API key is written at most this often.
    pub last_used_resolution: Duration,
    /// Threads verifying passwords, apart from the shared blocking pool…
    pub password_threads: usize,
    /// …and sign-ins that may wait for one (past it, [`StoreError::Busy`]).
    pub password_queue: usize,
    /// How long an invitation's link can be used.
    pub invite_ttl: Duration,
}

/// A partial update of an organization.
#[derive(Debug, Clone, Default)]
pub struct OrganizationUpdate {
    pub name: Option<String>,
    /// `Some(None)` removes the quota.
    pub feature_flag_request_quota: Option<Option<u64>>,
}

/// What a first-run setup created or found, and the key it minted.
#[derive(Debug, Clone)]
pub struct Bootstrapped {
    pub project: Project,
    pub admin: User,
    /// Only when this call created the admin (it cannot be recovered later).
    pub admin_password: Option<String>,
    /// The minted key's secret, when one was minted.
    pub personal_api_key: Option<String>,
}

/// When [`Tenancy::bootstrap`] mints a personal API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MintKey {
    /// Only when the tenancy was new (server start).
    OnFirstRun,
    /// Every call (`corvid bootstrap`).
    Always,
}

/// The tenancy facade. Cheap to clone.
#[derive(Clone)]
pub struct Tenancy {
    store: Arc<dyn MetadataRecords>,
    cache: Arc<MetaCache>,
    settings: TenancySettings,
    /// Password verification's own threads, started on the first sign-in.
    passwords: Arc<std::sync::OnceLock<Option<corvid_kernel::pool::BoundedPool>>>,
}

mod operations;
mod rules;
mod setup;
mod team;

pub use team::{MemberUpdate, NewInvite};

use rules::*;
use setup::*;

#[cfg(test)]
mod tests;
