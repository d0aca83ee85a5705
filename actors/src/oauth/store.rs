//! OAuth state in sled: authorization codes, tokens and their grant families, login sessions,
//! and the clients an administrator marked verified.
//!
//! Secrets (codes, tokens, session ids) are stored only as SHA-256 hex keys. The two races that
//! break OAuth servers are settled here with sled compare-and-swap, before any token exists:
//! a code is marked used, and a refresh token marked rotated, by exactly one request.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::kernel::codec::{decode, encode};
use crate::kernel::StoreError;

const CODES: &str = "oauth_codes";
const TOKENS: &str = "oauth_tokens";
const FAMILIES: &str = "oauth_families";
const SESSIONS: &str = "oauth_sessions";
const VERIFIED: &str = "oauth_verified_clients";

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
    /// A new, live grant of `user_id` to `client_id`.
    pub fn new(user_id: u64, client_id: &str) -> FamilyRecord {
        FamilyRecord {
            user_id,
            client_id: client_id.to_string(),
            revoked_at: None,
            created_at: Some(Utc::now()),
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

pub struct OAuthStore {
    db: sled::Db,
    codes: sled::Tree,
    tokens: sled::Tree,
    families: sled::Tree,
    sessions: sled::Tree,
    verified: sled::Tree,
}

impl OAuthStore {
    pub fn open(db: &sled::Db) -> Result<OAuthStore, StoreError> {
        Ok(OAuthStore {
            db: db.clone(),
            codes: db.open_tree(CODES)?,
            tokens: db.open_tree(TOKENS)?,
            families: db.open_tree(FAMILIES)?,
            sessions: db.open_tree(SESSIONS)?,
            verified: db.open_tree(VERIFIED)?,
        })
    }

    /// Makes everything written so far durable (one fsync shared by concurrent callers).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    pub fn put_code(&self, hash: &str, code: &CodeRecord) -> Result<(), StoreError> {
        self.codes.insert(hash, encode(code))?;
        Ok(())
    }

    /// Marks a code used, atomically: of two concurrent redemptions exactly one is `Fresh`.
    pub fn redeem_code(&self, hash: &str) -> Result<Redeemed<CodeRecord>, StoreError> {
        redeem(&self.codes, CODES, hash, |c: &mut CodeRecord| {
            std::mem::replace(&mut c.used, true)
        })
    }

    /// Marks a refresh token rotated, atomically, like [`OAuthStore::redeem_code`].
    pub fn redeem_refresh(&self, hash: &str) -> Result<Redeemed<TokenRecord>, StoreError> {
        redeem(&self.tokens, TOKENS, hash, |t: &mut TokenRecord| {
            std::mem::replace(&mut t.revoked, true)
        })
    }

    /// Stores new tokens in `family`, creating the family on first use. Fails with `Conflict`
    /// when the family was revoked first (a replayed code won the race): no token survives.
    pub fn issue(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        tokens: &[(String, TokenRecord)],
    ) -> Result<(), StoreError> {
        self.update_family(family_id, template, |family| {
            if family.revoked_at.is_some() {
                return Err(StoreError::Conflict {
                    what: "the grant was revoked".into(),
                });
            }
            Ok(())
        })?;
        for (hash, token) in tokens {
            self.tokens.insert(hash.as_bytes(), encode(token))?;
        }
        Ok(())
    }

    /// Revokes a whole grant (one write: a token is active only while its family is).
    pub fn revoke_family(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
    ) -> Result<(), StoreError> {
        self.update_family(family_id, template, |family| {
            family.revoked_at.get_or_insert_with(Utc::now);
            Ok(())
        })?;
        Ok(())
    }

    /// Read-modify-write of a family with compare-and-swap (`template` when it does not exist
    /// yet), retried until no concurrent writer got in between. Returns what was written.
    fn update_family(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        mut change: impl FnMut(&mut FamilyRecord) -> Result<(), StoreError>,
    ) -> Result<FamilyRecord, StoreError> {
        let key = family_id.as_bytes();
        loop {
            let old = self.families.get(key)?;
            let mut family = match &old {
                Some(bytes) => decode::<FamilyRecord>(FAMILIES, key, bytes)?,
                None => template.clone(),
            };
            change(&mut family)?;
            if self
                .families
                .compare_and_swap(key, old.as_ref(), Some(encode(&family)))?
                .is_ok()
            {
                return Ok(family);
            }
        }
    }

    /// Revokes one token; returns whether it was active.
    pub fn revoke_token(&self, hash: &str) -> Result<bool, StoreError> {
        let Some(state) = self.token(hash)? else {
            return Ok(false);
        };
        let active = state.is_active(Utc::now());
        if !state.token.revoked {
            let mut token = state.token;
            token.revoked = true;
            self.tokens.insert(hash, encode(&token))?;
        }
        Ok(active)
    }

    pub fn token(&self, hash: &str) -> Result<Option<TokenState>, StoreError> {
        let Some(bytes) = self.tokens.get(hash)? else {
            return Ok(None);
        };
        let token: TokenRecord = decode(TOKENS, hash.as_bytes(), &bytes)?;
        let key = token.family_id.as_bytes();
        let family_revoked = match self.families.get(key)? {
            Some(f) => decode::<FamilyRecord>(FAMILIES, key, &f)?
                .revoked_at
                .is_some(),
            None => true,
        };
        Ok(Some(TokenState {
            token,
            family_revoked,
        }))
    }

    /// Deletes what can no longer be used: codes a day past expiry (kept that long so a late
    /// replay still revokes what the code issued), expired tokens and sessions, and grant
    /// families without tokens. Returns how many records went.
    pub fn prune(&self, now: DateTime<Utc>) -> Result<usize, StoreError> {
        let mut removed = 0;
        let code_grace = chrono::Duration::days(1);
        for item in self.codes.iter() {
            let (k, v) = item?;
            let code: CodeRecord = decode(CODES, &k, &v)?;
            if code.expires_at + code_grace < now {
                self.codes.remove(k)?;
                removed += 1;
            }
        }
        let mut live_families = std::collections::HashSet::new();
        for item in self.tokens.iter() {
            let (k, v) = item?;
            let token: TokenRecord = decode(TOKENS, &k, &v)?;
            if token.expires_at < now {
                self.tokens.remove(k)?;
                removed += 1;
            } else {
                live_families.insert(token.family_id);
            }
        }
        for item in self.families.iter() {
            let (k, v) = item?;
            let id = Uuid::from_slice(&k).unwrap_or_default();
            let family: FamilyRecord = decode(FAMILIES, &k, &v)?;
            let old = family.created_at.is_none_or(|at| at + code_grace < now);
            if old && !live_families.contains(&id) {
                self.families.remove(k)?;
                removed += 1;
            }
        }
        for item in self.sessions.iter() {
            let (k, v) = item?;
            let session: SessionRecord = decode(SESSIONS, &k, &v)?;
            if session.expires_at < now {
                self.sessions.remove(k)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    pub fn put_session(&self, hash: &str, session: &SessionRecord) -> Result<(), StoreError> {
        self.sessions.insert(hash, encode(session))?;
        Ok(())
    }

    /// A live session; expired ones are deleted on sight.
    pub fn session(&self, hash: &str) -> Result<Option<SessionRecord>, StoreError> {
        let Some(bytes) = self.sessions.get(hash)? else {
            return Ok(None);
        };
        let session: SessionRecord = decode(SESSIONS, hash.as_bytes(), &bytes)?;
        if session.expires_at <= Utc::now() {
            self.sessions.remove(hash)?;
            return Ok(None);
        }
        Ok(Some(session))
    }

    pub fn delete_session(&self, hash: &str) -> Result<(), StoreError> {
        self.sessions.remove(hash)?;
        Ok(())
    }

    pub fn set_verified(&self, client: &VerifiedClient) -> Result<(), StoreError> {
        self.verified
            .insert(client.client_id.as_bytes(), encode(client))?;
        Ok(())
    }

    pub fn unset_verified(&self, client_id: &str) -> Result<bool, StoreError> {
        Ok(self.verified.remove(client_id.as_bytes())?.is_some())
    }

    pub fn is_verified(&self, client_id: &str) -> Result<bool, StoreError> {
        Ok(self.verified.contains_key(client_id.as_bytes())?)
    }

    pub fn verified_clients(&self) -> Result<Vec<VerifiedClient>, StoreError> {
        self.verified
            .iter()
            .map(|item| {
                let (k, v) = item?;
                decode(VERIFIED, &k, &v)
            })
            .collect()
    }
}

/// Redeems a one-time record with compare-and-swap: `mark` sets its used flag and returns the
/// flag's previous value. Exactly one of any number of concurrent callers gets `Fresh`.
fn redeem<T: Serialize + DeserializeOwned>(
    tree: &sled::Tree,
    name: &'static str,
    hash: &str,
    mark: impl Fn(&mut T) -> bool,
) -> Result<Redeemed<T>, StoreError> {
    loop {
        let Some(old) = tree.get(hash)? else {
            return Ok(Redeemed::Missing);
        };
        let mut record: T = decode(name, hash.as_bytes(), &old)?;
        if mark(&mut record) {
            return Ok(Redeemed::Replayed(record));
        }
        if tree
            .compare_and_swap(hash, Some(&old), Some(encode(&record)))?
            .is_ok()
        {
            return Ok(Redeemed::Fresh(record));
        }
    }
}

impl TokenRecord {
    /// The credential this access token grants: its scopes, for its user, with no project
    /// restriction beyond the user's own organization. `None` when its stored scopes no longer
    /// parse (a token from a newer build is treated as invalid, never as `*`).
    pub fn credential(
        &self,
        sha256_hex: String,
        user: crate::meta::User,
    ) -> Option<crate::meta::Credential> {
        Some(crate::meta::Credential {
            user,
            scopes: crate::meta::ScopeSet::parse(&self.scopes).ok()?,
            scoped_teams: None,
            scoped_organizations: None,
            source: crate::meta::CredentialSource::OAuthAccessToken {
                sha256_hex,
                client_id: self.client_id.clone(),
                family_id: self.family_id,
                expires_at: self.expires_at,
            },
        })
    }
}
