//! What the OAuth server stores: authorization codes, tokens and their grant families, login
//! sessions, and the clients an administrator marked verified. Secrets (codes, tokens, session
//! ids) are stored only as SHA-256 hex keys.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeRecord {
    pub user_id: u64,
    pub client_id: String,
    pub redirect_uri: String,
    pub scopes: Vec<String>,
    pub code_challenge: String,
    pub resource: Option<String>,
    pub expires_at: DateTime<Utc>,
    pub used: bool,
    /// The grant family the code's tokens belong to, chosen up front so a replay can revoke
    /// whatever the first redemption issued (even if it is still being issued).
    pub family_id: Uuid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    Access,
    Refresh,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub kind: TokenKind,
    pub family_id: Uuid,
    pub user_id: u64,
    pub client_id: String,
    pub scopes: Vec<String>,
    pub resource: Option<String>,
    pub issued_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Revoked on its own (RFC 7009) or, for refresh tokens, rotated (used once).
    pub revoked: bool,
}

/// One authorization grant: every token descending from one code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyRecord {
    pub user_id: u64,
    pub client_id: String,
    pub revoked_at: Option<DateTime<Utc>>,
    /// When the family was created; pruning leaves young families alone, since a family is
    /// written just before its first tokens.
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
}

impl FamilyRecord {
    /// A new, live grant of `user_id` to `client_id`, created at `now`.
    pub fn new(user_id: u64, client_id: &str, now: DateTime<Utc>) -> FamilyRecord {
        FamilyRecord {
            user_id,
            client_id: client_id.to_string(),
            revoked_at: None,
            created_at: Some(now),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub user_id: u64,
    /// The session's CSRF token, required on every form it submits.
    pub csrf: String,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifiedClient {
    pub client_id: String,
    pub verified_by: u64,
    pub verified_at: DateTime<Utc>,
}

/// What redeeming a one-time secret (code or refresh token) found.
#[derive(Debug)]
pub enum Redeemed<T> {
    /// This request redeemed it; nobody else can.
    Fresh(T),
    /// It had been redeemed before: a replay.
    Replayed(T),
    Missing,
}

/// A token together with its family, for validity checks.
#[derive(Debug, Clone)]
pub struct TokenState {
    pub token: TokenRecord,
    pub family_revoked: bool,
}

impl TokenState {
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        !self.token.revoked && !self.family_revoked && self.token.expires_at > now
    }
}

impl TokenRecord {
    /// The credential this access token grants: its scopes, for its user, with no project
    /// restriction beyond the user's own organization. `None` when its stored scopes no longer
    /// parse (a token from a newer build is treated as invalid, never as `*`).
    pub fn credential(
        &self,
        sha256_hex: String,
        user: corvid_tenancy::User,
    ) -> Option<corvid_tenancy::Credential> {
        Some(corvid_tenancy::Credential {
            user,
            scopes: corvid_tenancy::ScopeSet::parse(&self.scopes).ok()?,
            scoped_teams: None,
            scoped_organizations: None,
            source: corvid_tenancy::CredentialSource::OAuthAccessToken {
                sha256_hex,
                client_id: self.client_id.clone(),
                family_id: self.family_id,
                expires_at: self.expires_at,
            },
        })
    }
}
