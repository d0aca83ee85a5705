//! OAuth 2.0 authorization server for clients identified by Client ID Metadata Documents.
//!
//! [`OAuth`] is the one door. The service layer handles HTTP (pages, forms, cookies); this
//! module holds the rules: which clients and redirect URIs are acceptable ([`cimd`],
//! [`client_id`], [`redirect`]), what an authorization request must carry
//! ([`authorization`]), PKCE ([`pkce`]), scope policy ([`scopes`]), the grants that turn codes
//! into tokens and refresh tokens into new tokens exactly once ([`grants`]), who may introspect
//! what and how leaked tokens are revoked ([`introspection`]). Grants live behind
//! [`GrantRecords`] ([`SledGrants`] in the embedded default).
//!
//! Time is an input: every method that judges expiry takes `now`.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod authorization;
pub(crate) mod cimd;
pub(crate) mod client_id;
pub(crate) mod fetch;
mod grants;
mod introspection;
mod pg_store;
pub(crate) mod pkce;
mod records;
pub(crate) mod redirect;
pub(crate) mod scopes;
mod secret_scanning;
mod sled_store;
mod store;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use uuid::Uuid;

use cimd::{Client, Registry};
use corvid_activity::{ActivityEntry, Actor, Recorded};
use corvid_kernel::secrets::{random_base62, sha256_hex};
use corvid_kernel::{blocking, StoreError};
use corvid_tenancy::{Credential, CredentialSource, Tenancy, User};

/// The activity log's scope of the verified-client marks.
pub const CLIENT_SCOPE: &str = "OAuthApplication";

pub use authorization::{AuthorizationProblem, AuthorizationRequest, Authorized, ClientProblem};
pub use cimd::{ClientError, ClientSettings, Logo};
pub use fetch::FetchSettings;
pub use grants::{Approval, CodeExchange, Issued, RefreshRequest, TokenRequest};
pub use introspection::{Introspection, LeakOutcome};
pub use pg_store::PgGrants;
pub use records::{SessionRecord, TokenKind, VerifiedClient};
pub use redirect::{display_host, is_loopback_uri};
pub use scopes::{describe as describe_scope, supported as supported_scopes};
pub use secret_scanning::{verify as verify_report_signature, Report, VerifyingKey};
pub use sled_store::SledGrants;
pub use store::GrantRecords;

pub const ACCESS_TOKEN_PREFIX: &str = "pha_";
pub const REFRESH_TOKEN_PREFIX: &str = "phr_";

/// Lifetimes of what the server issues.
#[derive(Debug, Clone, Copy)]
pub struct Lifetimes {
    pub code: Duration,
    pub access_token: Duration,
    pub refresh_token: Duration,
    pub session: Duration,
}

/// How the OAuth server is set up.
#[derive(Debug, Clone)]
pub struct OAuthSettings {
    pub clients: ClientSettings,
    pub lifetimes: Lifetimes,
    /// Base URLs of what this server serves (its public URL and any region URLs): the only
    /// RFC 8707 resources tokens are issued for.
    pub resources: Vec<String>,
}

/// The OAuth facade's error: RFC 6749 §5.2 errors (and RFC 8707's `invalid_target`), or a
/// storage failure.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidGrant(String),
    #[error("{0}")]
    InvalidScope(String),
    #[error("{0}")]
    InvalidTarget(String),
    #[error("grant_type must be authorization_code or refresh_token")]
    UnsupportedGrantType,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OAuthError {
    /// The RFC 6749 error code.
    pub fn code(&self) -> &'static str {
        match self {
            OAuthError::InvalidRequest(_) => "invalid_request",
            OAuthError::InvalidGrant(_) => "invalid_grant",
            OAuthError::InvalidScope(_) => "invalid_scope",
            OAuthError::InvalidTarget(_) => "invalid_target",
            OAuthError::UnsupportedGrantType => "unsupported_grant_type",
            OAuthError::Store(_) => "server_error",
        }
    }
}

/// A signed-in browser session.
#[derive(Debug, Clone)]
pub struct Session {
    /// What the session cookie's value hashes to (the session's key).
    pub hash: String,
    pub record: SessionRecord,
    pub user: User,
}

/// The OAuth facade. Cheap to clone.
#[derive(Clone)]
pub struct OAuth {
    inner: Arc<Inner>,
}

struct Inner {
    grants: Arc<dyn GrantRecords>,
    clients: Registry,
    lifetimes: Lifetimes,
    resources: Vec<url::Url>,
    tenancy: Tenancy,
    /// Grants revoked recently, checked on every use of a cached access token so a family
    /// revocation (code replay, refresh reuse) takes effect at once without tracking every
    /// token of the family. Kept a day: far longer than any credential stays cached.
    revoked_families: DashMap<Uuid, DateTime<Utc>>,
}

impl OAuth {
    pub fn new(
        grants: Arc<dyn GrantRecords>,
        tenancy: Tenancy,
        settings: OAuthSettings,
    ) -> Result<OAuth, String> {
        let resources = settings
            .resources
            .iter()
            .map(|r| url::Url::parse(r).map_err(|e| format!("resource URL {r}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(OAuth {
            inner: Arc::new(Inner {
                grants,
                clients: Registry::new(settings.clients)?,
                lifetimes: settings.lifetimes,
                resources,
                tenancy,
                revoked_families: DashMap::new(),
            }),
        })
    }

    /// Runs grant-store work on the blocking pool.
    async fn grants<T: Send + 'static, E: From<StoreError> + Send + 'static>(
        &self,
        work: impl FnOnce(&dyn GrantRecords) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let grants = Arc::clone(&self.inner.grants);
        blocking(move || work(grants.as_ref())).await
    }

    // ---- clients ----

    /// A client by its `client_id` (its metadata document, fetched and cached).
    pub async fn client(
        &self,
        client_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Arc<Client>, ClientError> {
        self.inner.clients.resolve(client_id, now).await
    }

    /// A cached client logo.
    pub fn logo(&self, key: &str) -> Option<Logo> {
        self.inner.clients.logo(key)
    }

    /// Resolved clients, logos and remembered failures kept in memory, and their weight in
    /// bytes (bounded by the `cache_bytes` setting).
    pub fn client_cache_usage(&self) -> (usize, u64) {
        self.inner.clients.usage()
    }

    pub async fn is_verified(&self, client_id: &str) -> Result<bool, StoreError> {
        let id = client_id.to_string();
        self.grants(move |g| g.is_verified(&id)).await
    }

    pub async fn verified_clients(&self) -> Result<Vec<VerifiedClient>, StoreError> {
        self.grants(|g| g.verified_clients()).await
    }

    /// Marks a client verified (it loses the unverified-application notice on the consent
    /// screen, nothing else), as `actor`. The mark commits with its activity entry (scope
    /// `OAuthApplication`, item the client id) in each project of the actor's organization:
    /// clients are the instance's, and each project's log shows what its people may meet.
    pub async fn verify_client(
        &self,
        client_id: &str,
        actor: &Actor,
        now: DateTime<Utc>,
    ) -> Result<VerifiedClient, OAuthError> {
        client_id::validate(client_id).map_err(OAuthError::InvalidRequest)?;
        let record = VerifiedClient {
            client_id: client_id.to_string(),
            verified_by: actor.id.unwrap_or_default(),
            verified_at: now,
        };
        let after = serde_json::to_value(&record).unwrap_or_default();
        let log: Vec<ActivityEntry> = self
            .projects_of(actor)
            .await?
            .into_iter()
            .filter_map(|project_id| {
                Recorded {
                    project_id,
                    actor,
                    scope: CLIENT_SCOPE,
                    item_id: record.client_id.clone(),
                    name: Some(record.client_id.clone()),
                    before: None,
                    after: &after,
                }
                .entry()
            })
            .collect();
        let stored = record.clone();
        self.grants(move |g| g.set_verified(&stored, &log)).await?;
        Ok(record)
    }

    /// The projects of `actor`'s organization (none for the system).
    async fn projects_of(&self, actor: &Actor) -> Result<Vec<u64>, StoreError> {
        let tenancy = &self.inner.tenancy;
        let Some(user) = actor.id else {
            return Ok(Vec::new());
        };
        let Some(user) = tenancy.active_user(user).await? else {
            return Ok(Vec::new());
        };
        Ok(tenancy
            .projects_of_organization(user.organization_id)
            .await?
            .into_iter()
            .map(|p| p.id)
            .collect())
    }

    /// Removes the verified mark, as `actor` (logged as the mark's removal in each project of
    /// the actor's organization, in the same commit). Whether the client was verified.
    pub async fn unverify_client(
        &self,
        client_id: &str,
        actor: &Actor,
    ) -> Result<bool, StoreError> {
        let id = client_id.to_string();
        let log: Vec<ActivityEntry> = self
            .projects_of(actor)
            .await?
            .into_iter()
            .map(|project_id| {
                ActivityEntry::removal(
                    project_id,
                    actor,
                    CLIENT_SCOPE,
                    id.clone(),
                    Some(id.clone()),
                )
            })
            .collect();
        self.grants(move |g| g.unset_verified(&id, &log)).await
    }

    // ---- sessions of the sign-in and consent pages ----

    /// A fresh CSRF token for a form that has no session yet (the sign-in form).
    pub fn new_csrf_token() -> String {
        random_base62(32)
    }

    /// Starts a session for `user_id`; returns the cookie value (only its hash is stored).
    pub async fn start_session(
        &self,
        user_id: u64,
        now: DateTime<Utc>,
    ) -> Result<String, StoreError> {
        let id = random_base62(43);
        let record = SessionRecord {
            user_id,
            csrf: random_base62(32),
            expires_at: now + chrono_duration(self.inner.lifetimes.session),
        };
        let hash = sha256_hex(&id);
        self.grants(move |g| g.put_session(&hash, &record)).await?;
        Ok(id)
    }

    /// The live session a cookie value names, with its user.
    pub async fn session(
        &self,
        cookie: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Session>, StoreError> {
        let hash = sha256_hex(cookie);
        let lookup = hash.clone();
        let Some(record) = self.grants(move |g| g.session(&lookup, now)).await? else {
            return Ok(None);
        };
        let Some(user) = self.inner.tenancy.active_user(record.user_id).await? else {
            return Ok(None);
        };
        Ok(Some(Session { hash, record, user }))
    }

    pub async fn end_session(&self, hash: &str) -> Result<(), StoreError> {
        let hash = hash.to_string();
        self.grants(move |g| g.delete_session(&hash)).await
    }

    // ---- credentials ----

    /// The credential an access token grants (memory first), or `None` when the token is
    /// unknown, not an access token, expired, revoked, or its user is gone.
    pub async fn authenticate(
        &self,
        secret: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Arc<Credential>>, StoreError> {
        let tenancy = &self.inner.tenancy;
        let hash = sha256_hex(secret);
        if let Some(cached) = tenancy.cached_credential(&hash, now) {
            let revoked = matches!(&cached.source,
                CredentialSource::OAuthAccessToken { family_id, .. } if self.family_revoked(family_id));
            if !revoked {
                return Ok(Some(cached));
            }
            tenancy.forget_credential(&hash);
        }
        let epoch = tenancy.credential_epoch();
        let lookup = hash.clone();
        let found = self.grants(move |g| g.token(&lookup)).await?;
        let Some(found) = found.filter(|s| s.token.kind == TokenKind::Access && s.is_active(now))
        else {
            return Ok(None);
        };
        let Some(user) = tenancy.active_user(found.token.user_id).await? else {
            return Ok(None);
        };
        let Some(credential) = found.token.credential(hash.clone(), user) else {
            return Ok(None);
        };
        let credential = Arc::new(credential);
        tenancy.remember_credential(hash, Arc::clone(&credential), epoch);
        Ok(Some(credential))
    }

    /// Whether a grant was revoked since its tokens may have been cached.
    fn family_revoked(&self, family_id: &Uuid) -> bool {
        self.inner.revoked_families.contains_key(family_id)
    }

    /// Deletes expired codes, tokens and sessions (see [`GrantRecords::prune`]). How many
    /// records went.
    pub async fn prune(&self, now: DateTime<Utc>) -> Result<usize, StoreError> {
        let day = chrono::Duration::days(1);
        self.inner
            .revoked_families
            .retain(|_, at| now.signed_duration_since(*at) < day);
        self.inner.clients.prune(now);
        self.grants(move |g| g.prune(now)).await
    }
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    // Config bounds lifetimes; a century stands in for "forever" without overflowing.
    chrono::Duration::from_std(d).unwrap_or_else(|_| chrono::Duration::days(36_500))
}

#[cfg(test)]
mod tests;

/// The PostgreSQL schema of this crate's tables (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[corvid_kernel::Migration {
    version: 2,
    name: "oauth",
    sql: include_str!("../migrations/0002_oauth.sql"),
}];
