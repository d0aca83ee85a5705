//! Where OAuth grants live. The two races that break OAuth servers are settled by the store,
//! before any token exists: a code is marked used, and a refresh token marked rotated, by
//! exactly one of any number of concurrent requests ([`GrantRecords::redeem_code`],
//! [`GrantRecords::redeem_refresh`]); and no token is issued into a grant a replay revoked
//! ([`GrantRecords::issue`]). Every write is durable when it returns.
//!
//! [`super::SledGrants`] is the embedded implementation; every implementation passes
//! [`contract::suite`].

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::records::{
    CodeRecord, FamilyRecord, Redeemed, SessionRecord, TokenRecord, TokenState, VerifiedClient,
};
use corvid_activity::ActivityEntry;
use corvid_kernel::StoreError;

/// `issue`'s refusal when the grant was revoked first: no token is stored.
pub(crate) fn grant_revoked() -> StoreError {
    StoreError::Conflict {
        what: "the grant was revoked".into(),
    }
}

pub trait GrantRecords: Send + Sync {
    fn put_code(&self, hash: &str, code: &CodeRecord) -> Result<(), StoreError>;
    /// Marks a code used, atomically: of concurrent redemptions exactly one is `Fresh`.
    fn redeem_code(&self, hash: &str) -> Result<Redeemed<CodeRecord>, StoreError>;
    /// Marks a refresh token rotated, atomically, like [`GrantRecords::redeem_code`].
    fn redeem_refresh(&self, hash: &str) -> Result<Redeemed<TokenRecord>, StoreError>;
    /// Stores new tokens in `family`, creating the family from `template` on first use.
    /// `Conflict` when the family was revoked first: then no token is stored.
    fn issue(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        tokens: &[(String, TokenRecord)],
    ) -> Result<(), StoreError>;
    /// Revokes a whole grant at `now` (creating it revoked from `template` if it is new).
    fn revoke_family(
        &self,
        family_id: Uuid,
        template: &FamilyRecord,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Revokes one token; whether it was active at `now`.
    fn revoke_token(&self, hash: &str, now: DateTime<Utc>) -> Result<bool, StoreError>;
    /// A token with its family's state.
    fn token(&self, hash: &str) -> Result<Option<TokenState>, StoreError>;
    /// Deletes what can no longer be used at `now`: codes a day past expiry, expired tokens
    /// and sessions, and day-old families without tokens. How many records went.
    fn prune(&self, now: DateTime<Utc>) -> Result<usize, StoreError>;

    fn put_session(&self, hash: &str, session: &SessionRecord) -> Result<(), StoreError>;
    /// A session live at `now` (an expired one is deleted on sight).
    fn session(&self, hash: &str, now: DateTime<Utc>) -> Result<Option<SessionRecord>, StoreError>;
    fn delete_session(&self, hash: &str) -> Result<(), StoreError>;

    /// Marks a client verified, committing `log` (its activity entries) with the mark.
    fn set_verified(
        &self,
        client: &VerifiedClient,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError>;
    /// Removes the mark, committing `log` with the removal when there was one. Whether it was
    /// verified.
    fn unset_verified(&self, client_id: &str, log: &[ActivityEntry]) -> Result<bool, StoreError>;
    fn is_verified(&self, client_id: &str) -> Result<bool, StoreError>;
    fn verified_clients(&self) -> Result<Vec<VerifiedClient>, StoreError>;
}

/// The behaviour every [`GrantRecords`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use std::sync::Arc;

    use chrono::Duration;

    use super::*;
    use crate::records::TokenKind;

    fn code(family_id: Uuid, now: DateTime<Utc>) -> CodeRecord {
        CodeRecord {
            user_id: 7,
            client_id: "https://app.example/c.json".into(),
            redirect_uri: "http://127.0.0.1/cb".into(),
            scopes: vec!["user:read".into()],
            code_challenge: "c".into(),
            resource: None,
            expires_at: now + Duration::minutes(5),
            used: false,
            family_id,
        }
    }

    fn token(kind: TokenKind, family_id: Uuid, expires_at: DateTime<Utc>) -> TokenRecord {
        TokenRecord {
            kind,
            family_id,
            user_id: 7,
            client_id: "https://app.example/c.json".into(),
            scopes: vec!["user:read".into()],
            resource: None,
            issued_at: expires_at - Duration::hours(1),
            expires_at,
            revoked: false,
        }
    }

    /// Runs every check against an empty store.
    pub fn suite(store: Arc<dyn GrantRecords>) {
        codes_are_redeemed_exactly_once(Arc::clone(&store));
        refresh_tokens_rotate_once_and_families_revoke_everything(store.as_ref());
        sessions_expire_and_clients_are_verified(store.as_ref());
        pruning_keeps_what_can_still_be_used(store.as_ref());
    }

    fn codes_are_redeemed_exactly_once(store: Arc<dyn GrantRecords>) {
        let now = Utc::now();
        store
            .put_code("c1", &code(Uuid::new_v4(), now))
            .expect("put");
        // Eight racing redemptions: exactly one is fresh.
        let racers: Vec<_> = (0..8)
            .map(|_| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || store.redeem_code("c1").expect("redeem"))
            })
            .collect();
        let fresh = racers
            .into_iter()
            .map(|r| r.join().expect("thread"))
            .filter(|r| matches!(r, Redeemed::Fresh(_)))
            .count();
        assert_eq!(fresh, 1);
        assert!(matches!(store.redeem_code("c1").expect("again"), Redeemed::Replayed(c) if c.used));
        assert!(matches!(
            store.redeem_code("nope").expect("missing"),
            Redeemed::Missing
        ));
    }

    fn refresh_tokens_rotate_once_and_families_revoke_everything(store: &dyn GrantRecords) {
        let now = Utc::now();
        let family = Uuid::new_v4();
        let template = FamilyRecord::new(7, "https://app.example/c.json", now);
        let later = now + Duration::hours(1);
        store
            .issue(
                family,
                &template,
                &[
                    ("a1".into(), token(TokenKind::Access, family, later)),
                    ("r1".into(), token(TokenKind::Refresh, family, later)),
                ],
            )
            .expect("issue");
        assert!(store
            .token("a1")
            .expect("read")
            .expect("token")
            .is_active(now));
        assert!(matches!(
            store.redeem_refresh("r1").expect("rotate"),
            Redeemed::Fresh(_)
        ));
        assert!(matches!(
            store.redeem_refresh("r1").expect("reuse"),
            Redeemed::Replayed(_)
        ));
        assert!(
            !store
                .token("r1")
                .expect("read")
                .expect("token")
                .is_active(now),
            "rotated"
        );

        store.revoke_family(family, &template, now).expect("revoke");
        let state = store.token("a1").expect("read").expect("token");
        assert!(state.family_revoked && !state.is_active(now));
        let refused = store.issue(
            family,
            &template,
            &[("a2".into(), token(TokenKind::Access, family, later))],
        );
        assert!(matches!(refused, Err(StoreError::Conflict { .. })));
        assert!(
            store.token("a2").expect("read").is_none(),
            "no token in a revoked grant"
        );

        let other = Uuid::new_v4();
        store
            .issue(
                other,
                &template,
                &[("a3".into(), token(TokenKind::Access, other, later))],
            )
            .expect("issue");
        assert!(store.revoke_token("a3", now).expect("revoke"));
        assert!(
            !store.revoke_token("a3", now).expect("again"),
            "no longer active"
        );
        assert!(!store.revoke_token("zz", now).expect("unknown"));
    }

    fn sessions_expire_and_clients_are_verified(store: &dyn GrantRecords) {
        let now = Utc::now();
        let session = SessionRecord {
            user_id: 7,
            csrf: "x".into(),
            expires_at: now + Duration::minutes(10),
        };
        store.put_session("s1", &session).expect("put");
        assert_eq!(
            store.session("s1", now).expect("read"),
            Some(session.clone())
        );
        assert_eq!(
            store.session("s1", now + Duration::hours(1)).expect("read"),
            None
        );
        assert_eq!(
            store.session("s1", now).expect("read"),
            None,
            "deleted on sight"
        );
        store.put_session("s2", &session).expect("put");
        store.delete_session("s2").expect("delete");
        assert_eq!(store.session("s2", now).expect("read"), None);

        let client = VerifiedClient {
            client_id: "https://app.example/c.json".into(),
            verified_by: 1,
            verified_at: now,
        };
        store.set_verified(&client, &[]).expect("verify");
        assert!(store.is_verified(&client.client_id).expect("read"));
        assert_eq!(
            store.verified_clients().expect("list"),
            vec![client.clone()]
        );
        assert!(store.unset_verified(&client.client_id, &[]).expect("unset"));
        assert!(!store.unset_verified(&client.client_id, &[]).expect("again"));
        assert!(!store.is_verified(&client.client_id).expect("read"));
    }

    fn pruning_keeps_what_can_still_be_used(store: &dyn GrantRecords) {
        let now = Utc::now();
        let family = Uuid::new_v4();
        let template = FamilyRecord::new(7, "c", now - Duration::days(3));
        store
            .issue(
                family,
                &template,
                &[
                    (
                        "old".into(),
                        token(TokenKind::Access, family, now - Duration::hours(1)),
                    ),
                    (
                        "new".into(),
                        token(TokenKind::Refresh, family, now + Duration::hours(1)),
                    ),
                ],
            )
            .expect("issue");
        let mut stale = code(Uuid::new_v4(), now - Duration::days(2));
        stale.expires_at = now - Duration::days(2);
        store.put_code("stale", &stale).expect("put");
        let removed = store.prune(now).expect("prune");
        assert!(removed >= 2, "{removed}");
        assert!(store.token("old").expect("read").is_none());
        assert!(
            store.token("new").expect("read").is_some(),
            "a live token keeps its family"
        );
        assert!(matches!(
            store.redeem_code("stale").expect("read"),
            Redeemed::Missing
        ));
    }
}
