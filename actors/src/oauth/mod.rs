//! OAuth 2.0 authorization server for clients identified by Client ID Metadata Documents.
//!
//! The service layer handles HTTP (pages, forms, cookies); this module holds the rules: which
//! clients and redirect URIs are acceptable ([`cimd`], [`client_id`], [`redirect`]), PKCE
//! ([`pkce`]), scope policy ([`scopes`]), and the grant logic below, which turns codes into
//! tokens and refresh tokens into new tokens exactly once ([`store`]).
//!
//! Grant operations are synchronous (sled); callers run them on a blocking thread.

pub mod cimd;
pub mod client_id;
pub mod fetch;
pub mod pkce;
pub mod redirect;
pub mod scopes;
pub mod secret_scanning;
pub mod store;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use uuid::Uuid;

use crate::kernel::secrets::{random_base62, sha256_hex};
use crate::kernel::StoreError;
use cimd::{ClientSettings, Registry};
use store::{CodeRecord, FamilyRecord, OAuthStore, Redeemed, TokenKind, TokenRecord, TokenState};

pub const ACCESS_TOKEN_PREFIX: &str = "pha_";
pub const REFRESH_TOKEN_PREFIX: &str = "phr_";

/// Lifetimes of what the server issues.
#[derive(Debug, Clone)]
pub struct Lifetimes {
    pub code: Duration,
    pub access_token: Duration,
    pub refresh_token: Duration,
    pub session: Duration,
}

/// RFC 6749 §5.2 token-endpoint errors (and RFC 8707's `invalid_target`).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
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

impl TokenError {
    /// The RFC 6749 error code.
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::InvalidRequest(_) => "invalid_request",
            TokenError::InvalidGrant(_) => "invalid_grant",
            TokenError::InvalidScope(_) => "invalid_scope",
            TokenError::InvalidTarget(_) => "invalid_target",
            TokenError::UnsupportedGrantType => "unsupported_grant_type",
            TokenError::Store(_) => "server_error",
        }
    }
}

/// A freshly issued token pair.
#[derive(Debug, Clone)]
pub struct Issued {
    pub access_token: String,
    pub refresh_token: String,
    pub expires_in: u64,
    pub scopes: Vec<String>,
}

/// What a consented authorization request carries into its code.
#[derive(Debug, Clone)]
pub struct Approval {
    pub user_id: u64,
    pub client_id: String,
    pub redirect_uri: String,
    pub scopes: Vec<String>,
    pub code_challenge: String,
    pub resource: Option<String>,
}

/// A token-endpoint `authorization_code` request.
#[derive(Debug, Clone, Default)]
pub struct CodeExchange {
    pub code: String,
    pub client_id: Option<String>,
    pub redirect_uri: Option<String>,
    pub code_verifier: Option<String>,
    pub resource: Option<String>,
}

/// The OAuth engine shared by the service's handlers.
pub struct OAuth {
    pub store: OAuthStore,
    pub clients: Registry,
    pub lifetimes: Lifetimes,
    /// Grants revoked recently, checked on every use of a cached access token so a family
    /// revocation (code replay, refresh reuse) takes effect at once without tracking every
    /// token of the family. Kept a day: far longer than any credential stays cached.
    revoked_families: DashMap<Uuid, Instant>,
}

const CODE_INVALID: &str = "Authorization code is invalid or has already been used";

impl OAuth {
    pub fn new(
        db: &sled::Db,
        clients: ClientSettings,
        lifetimes: Lifetimes,
    ) -> Result<OAuth, String> {
        Ok(OAuth {
            store: OAuthStore::open(db).map_err(|e| e.to_string())?,
            clients: Registry::new(clients)?,
            lifetimes,
            revoked_families: DashMap::new(),
        })
    }

    /// Issues a one-time authorization code for a consented request (only its hash is kept).
    pub fn create_code(&self, approval: Approval) -> Result<String, StoreError> {
        let code = random_base62(43);
        let record = CodeRecord {
            user_id: approval.user_id,
            client_id: approval.client_id,
            redirect_uri: approval.redirect_uri,
            scopes: approval.scopes,
            code_challenge: approval.code_challenge,
            resource: approval.resource,
            expires_at: Utc::now() + chrono_duration(self.lifetimes.code),
            used: false,
            family_id: Uuid::new_v4(),
        };
        self.store.put_code(&sha256_hex(&code), &record)?;
        self.store.flush()?;
        Ok(code)
    }

    /// `grant_type=authorization_code`. The code is burned before anything else is checked,
    /// so a failed attempt cannot be retried; a replay revokes what the code issued.
    pub fn exchange_code(&self, req: CodeExchange) -> Result<Issued, TokenError> {
        if req.code.is_empty() {
            return Err(TokenError::InvalidRequest("code is required".into()));
        }
        let code = match self.store.redeem_code(&sha256_hex(&req.code))? {
            Redeemed::Fresh(code) => code,
            Redeemed::Missing => return Err(TokenError::InvalidGrant(CODE_INVALID.into())),
            Redeemed::Replayed(code) => {
                tracing::warn!(client_id = %code.client_id, "authorization code replayed; revoking its grant");
                self.revoke_family(code.family_id, code.user_id, &code.client_id)?;
                return Err(TokenError::InvalidGrant(CODE_INVALID.into()));
            }
        };
        self.check_exchange(&code, &req)?;
        match self.issue_pair(
            code.family_id,
            code.user_id,
            &code.client_id,
            code.scopes.clone(),
            code.resource.clone(),
        ) {
            Ok(issued) => Ok(issued),
            Err(StoreError::Conflict { .. }) => Err(TokenError::InvalidGrant(CODE_INVALID.into())),
            Err(e) => Err(e.into()),
        }
    }

    fn check_exchange(&self, code: &CodeRecord, req: &CodeExchange) -> Result<(), TokenError> {
        if code.expires_at <= Utc::now() {
            return Err(TokenError::InvalidGrant(
                "Authorization code has expired".into(),
            ));
        }
        match req.client_id.as_deref() {
            Some(id) if id == code.client_id => {}
            Some(_) => {
                return Err(TokenError::InvalidGrant(
                    "client_id does not match the authorization request".into(),
                ))
            }
            None => return Err(TokenError::InvalidRequest("client_id is required".into())),
        }
        if req.redirect_uri.as_deref() != Some(code.redirect_uri.as_str()) {
            return Err(TokenError::InvalidGrant(
                "redirect_uri does not match the authorization request".into(),
            ));
        }
        let Some(verifier) = req.code_verifier.as_deref() else {
            return Err(TokenError::InvalidRequest(
                "code_verifier is required (PKCE)".into(),
            ));
        };
        if !pkce::verifier_well_formed(verifier) {
            return Err(TokenError::InvalidRequest(
                "code_verifier must be 43-128 characters of A-Z a-z 0-9 - . _ ~".into(),
            ));
        }
        if !pkce::verify(verifier, &code.code_challenge) {
            return Err(TokenError::InvalidGrant("PKCE verification failed".into()));
        }
        if let Some(resource) = &req.resource {
            if code.resource.as_deref().is_some_and(|r| r != resource) {
                return Err(TokenError::InvalidTarget(
                    "resource differs from the one approved at authorization".into(),
                ));
            }
        }
        Ok(())
    }

    /// `grant_type=refresh_token` with rotation: the presented token is used up; presenting it
    /// again revokes its whole grant.
    pub fn refresh(
        &self,
        refresh_token: &str,
        client_id: Option<&str>,
        scope: Option<&str>,
        resource: Option<&str>,
    ) -> Result<Issued, TokenError> {
        let invalid =
            || TokenError::InvalidGrant("Refresh token is invalid, expired or revoked".into());
        if refresh_token.is_empty() {
            return Err(TokenError::InvalidRequest(
                "refresh_token is required".into(),
            ));
        }
        let hash = sha256_hex(refresh_token);
        // Check before redeeming, so a wrong client cannot burn someone else's token.
        let Some(state) = self.store.token(&hash)? else {
            return Err(invalid());
        };
        if state.token.kind != TokenKind::Refresh {
            return Err(invalid());
        }
        if client_id.is_some_and(|id| id != state.token.client_id) {
            return Err(TokenError::InvalidGrant(
                "refresh token was issued to another client".into(),
            ));
        }
        if state.family_revoked || state.token.expires_at <= Utc::now() {
            return Err(invalid());
        }
        let held = state.token.resource.as_deref();
        if resource.is_some_and(|r| held.is_some_and(|held| held != r)) {
            return Err(TokenError::InvalidTarget(
                "resource differs from the grant's".into(),
            ));
        }
        let scopes = scopes::narrow(&state.token.scopes, scope).ok_or_else(|| {
            TokenError::InvalidScope("a refresh can only narrow the granted scopes".into())
        })?;
        let token = match self.store.redeem_refresh(&hash)? {
            Redeemed::Fresh(token) => token,
            Redeemed::Missing => return Err(invalid()),
            Redeemed::Replayed(token) => {
                tracing::warn!(client_id = %token.client_id, "rotated refresh token reused; revoking its grant");
                self.revoke_family(token.family_id, token.user_id, &token.client_id)?;
                return Err(TokenError::InvalidGrant(
                    "Refresh token has already been used; the grant has been revoked".into(),
                ));
            }
        };
        match self.issue_pair(
            token.family_id,
            token.user_id,
            &token.client_id,
            scopes,
            token.resource.clone(),
        ) {
            Ok(issued) => Ok(issued),
            Err(StoreError::Conflict { .. }) => Err(invalid()),
            Err(e) => Err(e.into()),
        }
    }

    /// Revokes a grant durably and remembers it for cached credentials.
    fn revoke_family(
        &self,
        family_id: Uuid,
        user_id: u64,
        client_id: &str,
    ) -> Result<(), StoreError> {
        self.store
            .revoke_family(family_id, &FamilyRecord::new(user_id, client_id))?;
        self.store.flush()?;
        self.revoked_families.insert(family_id, Instant::now());
        Ok(())
    }

    /// Whether a grant was revoked since its tokens may have been cached.
    pub fn family_revoked(&self, family_id: &Uuid) -> bool {
        self.revoked_families.contains_key(family_id)
    }

    fn issue_pair(
        &self,
        family_id: Uuid,
        user_id: u64,
        client_id: &str,
        scopes: Vec<String>,
        resource: Option<String>,
    ) -> Result<Issued, StoreError> {
        let now = Utc::now();
        let access = format!("{ACCESS_TOKEN_PREFIX}{}", random_base62(43));
        let refresh = format!("{REFRESH_TOKEN_PREFIX}{}", random_base62(43));
        let record = |kind, ttl| TokenRecord {
            kind,
            family_id,
            user_id,
            client_id: client_id.to_string(),
            scopes: scopes.clone(),
            resource: resource.clone(),
            issued_at: now,
            expires_at: now + chrono_duration(ttl),
            revoked: false,
        };
        let tokens = vec![
            (
                sha256_hex(&access),
                record(TokenKind::Access, self.lifetimes.access_token),
            ),
            (
                sha256_hex(&refresh),
                record(TokenKind::Refresh, self.lifetimes.refresh_token),
            ),
        ];
        self.store
            .issue(family_id, &FamilyRecord::new(user_id, client_id), &tokens)?;
        self.store.flush()?;
        Ok(Issued {
            access_token: access,
            refresh_token: refresh,
            expires_in: self.lifetimes.access_token.as_secs(),
            scopes,
        })
    }

    /// RFC 7009: revokes `token` unless it belongs to another client than `client_id`.
    /// A refresh token takes its whole grant with it. Returns whether it was active, and its
    /// hash (for evicting a cached credential).
    pub fn revoke(
        &self,
        token: &str,
        client_id: Option<&str>,
    ) -> Result<(bool, String), StoreError> {
        let hash = sha256_hex(token);
        let Some(state) = self.store.token(&hash)? else {
            return Ok((false, hash));
        };
        if client_id.is_some_and(|id| id != state.token.client_id) {
            return Ok((false, hash));
        }
        let active = state.is_active(Utc::now());
        self.store.revoke_token(&hash)?;
        if state.token.kind == TokenKind::Refresh {
            self.revoke_family(
                state.token.family_id,
                state.token.user_id,
                &state.token.client_id,
            )?;
        } else {
            self.store.flush()?;
        }
        Ok((active, hash))
    }

    /// Deletes expired codes, tokens and sessions (see [`OAuthStore::prune`]).
    pub fn prune(&self) -> Result<usize, StoreError> {
        let day = Duration::from_secs(86_400);
        self.revoked_families.retain(|_, at| at.elapsed() < day);
        let removed = self.store.prune(Utc::now())?;
        self.store.flush()?;
        Ok(removed)
    }

    /// A token's state by its secret, active or not (for introspection and bearer checks).
    pub fn lookup(&self, token: &str) -> Result<Option<TokenState>, StoreError> {
        self.store.token(&sha256_hex(token))
    }
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    // Config bounds lifetimes; a century stands in for "forever" without overflowing.
    chrono::Duration::from_std(d).unwrap_or_else(|_| chrono::Duration::days(36_500))
}

/// Seconds since the epoch, for `exp` / `iat`.
pub fn epoch(at: DateTime<Utc>) -> i64 {
    at.timestamp()
}

#[cfg(test)]
mod tests;
