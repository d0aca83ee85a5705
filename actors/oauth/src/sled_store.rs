//! The embedded grant store (sled), settling the OAuth races with compare-and-swap.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::Transactional;
use uuid::Uuid;

use super::records::{
    CodeRecord, FamilyRecord, Redeemed, SessionRecord, TokenRecord, TokenState, VerifiedClient,
};
use super::store::{grant_revoked, GrantRecords};
use corvid_activity::{stage, ActivityEntry};
use corvid_kernel::codec::{decode, encode};
use corvid_kernel::StoreError;

const CODES: &str = "oauth_codes";
const TOKENS: &str = "oauth_tokens";
const FAMILIES: &str = "oauth_families";
const SESSIONS: &str = "oauth_sessions";
const VERIFIED: &str = "oauth_verified_clients";

/// The embedded grant store: sled trees beside the other embedded stores. Every write is
/// flushed before it returns; compare-and-swap settles the races.
pub struct SledGrants {
    db: sled::Db,
    codes: sled::Tree,
    tokens: sled::Tree,
    families: sled::Tree,
    sessions: sled::Tree,
    verified: sled::Tree,
    /// The activity log's tree: verified-client marks commit with their entries.
    activity: sled::Tree,
}

impl SledGrants {
    pub fn open(db: &sled::Db) -> Result<SledGrants, StoreError> {
        Ok(SledGrants {
            db: db.clone(),
            codes: db.open_tree(CODES)?,
            tokens: db.open_tree(TOKENS)?,
            families: db.open_tree(FAMILIES)?,
            sessions: db.open_tree(SESSIONS)?,
            verified: db.open_tree(VERIFIED)?,
            activity: db.open_tree(corvid_activity::TREE)?,
        })
    }

    /// Makes everything written so far durable (one fsync shared by concurrent callers).
    fn durable(&self) -> Result<(), StoreError> {
        self.db.flush()?;
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
                .compare_and_swap(key, old.as_ref(), Some(encode(&family)?))?
                .is_ok()
            {
                return Ok(family);
            }
        }
    }
}

impl GrantRecords for SledGrants {
    fn put_code(&self, hash: &str, code: &CodeRecord) -> Result<(), StoreError> {
        self.codes.insert(hash, encode(code)?)?;
        self.durable()
    }

    /// Marks a code used, atomically: of two concurrent redemptions exactly one is `Fresh`.
    fn redeem_code(&self, hash: &str) -> Result<Redeemed<CodeRecord>, StoreError> {
        let redeemed = redeem(&self.codes, CODES, hash, |c: &mut CodeRecord| {
            std::mem::replace(&mut c.used, true)
        })?;
        self.durable()?;
        Ok(redeemed)
    }

    /// Marks a refresh token rotated, atomically, like [`OAuthStore::redeem_code`].
    fn redeem_refresh(&self, hash: &str) -> Result<Redeemed<TokenRecord>, StoreError> {
        let redeemed = redeem(&self.tokens, TOKENS, hash, |t: &mut TokenRecord| {
            std::mem::replace(&mut t.revoked, true)
        })?;
        self.durable()?;
        Ok(redeemed)
    }

    /// Stores new tokens in `family`, creating the family on first use. Fails with `Conflict`
    /// when the family was revoked first (a replayed code won the race): no token survives.
    fn issue(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        tokens: &[(String, TokenRecord)],
    ) -> Result<(), StoreError> {
        self.update_family(family_id, template, |family| {
            if family.revoked_at.is_some() {
                return Err(grant_revoked());
            }
            Ok(())
        })?;
        for (hash, token) in tokens {
            self.tokens.insert(hash.as_bytes(), encode(token)?)?;
        }
        self.durable()
    }

    /// Revokes a whole grant (one write: a token is active only while its family is).
    fn revoke_family(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.update_family(family_id, template, |family| {
            family.revoked_at.get_or_insert(now);
            Ok(())
        })?;
        self.durable()
    }

    /// Revokes one token; returns whether it was active.
    fn revoke_token(&self, hash: &str, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let Some(state) = self.token(hash)? else {
            return Ok(false);
        };
        let active = state.is_active(now);
        if !state.token.revoked {
            let mut token = state.token;
            token.revoked = true;
            self.tokens.insert(hash, encode(&token)?)?;
            self.durable()?;
        }
        Ok(active)
    }

    fn token(&self, hash: &str) -> Result<Option<TokenState>, StoreError> {
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
    fn prune(&self, now: DateTime<Utc>) -> Result<usize, StoreError> {
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
        self.durable()?;
        Ok(removed)
    }

    fn put_session(&self, hash: &str, session: &SessionRecord) -> Result<(), StoreError> {
        self.sessions.insert(hash, encode(session)?)?;
        self.durable()
    }

    fn session(&self, hash: &str, now: DateTime<Utc>) -> Result<Option<SessionRecord>, StoreError> {
        let Some(bytes) = self.sessions.get(hash)? else {
            return Ok(None);
        };
        let session: SessionRecord = decode(SESSIONS, hash.as_bytes(), &bytes)?;
        if session.expires_at <= now {
            self.sessions.remove(hash)?;
            return Ok(None);
        }
        Ok(Some(session))
    }

    fn delete_session(&self, hash: &str) -> Result<(), StoreError> {
        self.sessions.remove(hash)?;
        self.durable()
    }

    fn set_verified(
        &self,
        client: &VerifiedClient,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        let value = encode(client)?;
        (&self.verified, &self.activity)
            .transaction(|(verified, activity)| {
                verified.insert(client.client_id.as_bytes(), value.clone())?;
                for entry in log {
                    stage(activity, entry)?;
                }
                Ok(())
            })
            .map_err(StoreError::from)?;
        self.durable()
    }

    fn unset_verified(&self, client_id: &str, log: &[ActivityEntry]) -> Result<bool, StoreError> {
        let existed = (&self.verified, &self.activity)
            .transaction(|(verified, activity)| {
                let existed = verified.remove(client_id.as_bytes())?.is_some();
                if existed {
                    for entry in log {
                        stage(activity, entry)?;
                    }
                }
                Ok(existed)
            })
            .map_err(StoreError::from)?;
        self.durable()?;
        Ok(existed)
    }

    fn is_verified(&self, client_id: &str) -> Result<bool, StoreError> {
        Ok(self.verified.contains_key(client_id.as_bytes())?)
    }

    fn verified_clients(&self) -> Result<Vec<VerifiedClient>, StoreError> {
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
            .compare_and_swap(hash, Some(&old), Some(encode(&record)?))?
            .is_ok()
        {
            return Ok(Redeemed::Fresh(record));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn sled_grants_pass_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        crate::store::contract::suite(Arc::new(SledGrants::open(&db).expect("open")));
    }
}
