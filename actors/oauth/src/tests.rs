//! Grant logic against the embedded stores. Time is an input: expiry is tested by passing a
//! later `now`, never by sleeping.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::records::TokenState;
use super::*;
use corvid_tenancy::{SledMetadata, TenancySettings};

const CLIENT: &str = "https://app.example.com/client.json";
const REDIRECT: &str = "http://127.0.0.1:5000/cb";
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
const RESOURCE: &str = "http://127.0.0.1:8000";

struct Fixture {
    _dir: tempfile::TempDir,
    oauth: OAuth,
    tenancy: Tenancy,
}

fn oauth() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let meta = SledMetadata::open(dir.path()).expect("sled opens");
    let grants = SledGrants::open(meta.db()).expect("grants open");
    let tenancy = Tenancy::new(
        Arc::new(meta),
        TenancySettings {
            cache_ttl: Duration::from_secs(60),
            last_used_resolution: Duration::from_secs(3600),
            password_threads: 1,
            password_queue: 8,
            invite_ttl: Duration::from_secs(3 * 86_400),
        },
    );
    let settings = OAuthSettings {
        clients: ClientSettings::for_test(),
        lifetimes: Lifetimes {
            code: Duration::from_secs(300),
            access_token: Duration::from_secs(3600),
            refresh_token: Duration::from_secs(86400),
            session: Duration::from_secs(3600),
        },
        resources: vec![RESOURCE.into()],
    };
    let oauth = OAuth::new(Arc::new(grants), tenancy.clone(), settings).expect("oauth opens");
    Fixture {
        _dir: dir,
        oauth,
        tenancy,
    }
}

impl Fixture {
    /// A fresh grant: a code for user 1, exchanged.
    async fn grant(&self, now: DateTime<Utc>) -> Issued {
        let c = code(&self.oauth, now).await;
        self.oauth
            .token_from(&exchange(&c, VERIFIER), now)
            .await
            .expect("exchanged")
    }

    /// The data dir's admin user (set up on first use).
    async fn admin(&self) -> corvid_tenancy::User {
        self.tenancy
            .bootstrap(corvid_tenancy::MintKey::OnFirstRun)
            .await
            .expect("bootstrap")
            .admin
    }
}

impl OAuth {
    async fn state_of(&self, token: &str) -> Option<TokenState> {
        let hash = sha256_hex(token);
        self.grants(move |g| g.token(&hash)).await.expect("lookup")
    }
}

async fn code(oauth: &OAuth, now: DateTime<Utc>) -> String {
    code_for(oauth, 1, now).await
}

async fn code_for(oauth: &OAuth, user_id: u64, now: DateTime<Utc>) -> String {
    oauth
        .create_code(
            Approval {
                user_id,
                client_id: CLIENT.into(),
                redirect_uri: REDIRECT.into(),
                scopes: vec!["endpoint:read".into()],
                code_challenge: CHALLENGE.into(),
                resource: Some(RESOURCE.into()),
            },
            now,
        )
        .await
        .expect("code")
}

impl OAuth {
    /// The token endpoint as the service calls it: the form's parameters decoded first.
    async fn token_from(
        &self,
        params: &HashMap<String, String>,
        now: DateTime<Utc>,
    ) -> Result<Issued, OAuthError> {
        self.token(TokenRequest::from_params(params)?, now).await
    }
}

fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn exchange(code: &str, verifier: &str) -> HashMap<String, String> {
    params(&[
        ("grant_type", "authorization_code"),
        ("code", code),
        ("client_id", CLIENT),
        ("redirect_uri", REDIRECT),
        ("code_verifier", verifier),
    ])
}

fn refresh(token: &str, client: &str, scope: Option<&str>) -> HashMap<String, String> {
    let mut p = params(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", token),
        ("client_id", client),
    ]);
    if let Some(scope) = scope {
        p.insert("scope".into(), scope.into());
    }
    p
}

async fn active(oauth: &OAuth, token: &str, now: DateTime<Utc>) -> bool {
    oauth
        .state_of(token)
        .await
        .is_some_and(|s| s.is_active(now))
}

#[tokio::test]
async fn a_code_is_exchanged_once_and_a_replay_without_its_verifier_revokes_the_grant() {
    let f = oauth();
    let now = Utc::now();
    let c = code(&f.oauth, now).await;
    let issued = f
        .oauth
        .token_from(&exchange(&c, VERIFIER), now)
        .await
        .expect("exchanged");
    assert!(issued.access_token.starts_with("pha_"));
    assert!(issued.refresh_token.starts_with("phr_"));
    assert!(active(&f.oauth, &issued.access_token, now).await);
    let family = f
        .oauth
        .state_of(&issued.access_token)
        .await
        .expect("token")
        .token
        .family_id;
    // The client itself presenting it again (it holds the verifier): refused, grant kept.
    let err = f
        .oauth
        .token_from(&exchange(&c, VERIFIER), now)
        .await
        .expect_err("retry");
    assert_eq!(err.code(), "invalid_grant");
    assert!(active(&f.oauth, &issued.access_token, now).await);
    // Anyone else: refused, and the grant goes.
    let err = f
        .oauth
        .token_from(&exchange(&c, &"y".repeat(43)), now)
        .await
        .expect_err("replay");
    assert_eq!(err.code(), "invalid_grant");
    assert!(
        f.oauth.family_revoked(&family),
        "cached credentials are told at once"
    );
    assert!(!active(&f.oauth, &issued.access_token, now).await);
    assert!(!active(&f.oauth, &issued.refresh_token, now).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_redemptions_by_the_client_issue_exactly_one_grant() {
    let f = oauth();
    let now = Utc::now();
    for _ in 0..20 {
        let c = code(&f.oauth, now).await;
        let racers: Vec<_> = (0..4)
            .map(|_| {
                let (oauth, p) = (f.oauth.clone(), exchange(&c, VERIFIER));
                tokio::spawn(async move { oauth.token_from(&p, now).await.ok() })
            })
            .collect();
        let mut winners = Vec::new();
        for racer in racers {
            winners.extend(racer.await.expect("task"));
        }
        assert_eq!(
            winners.len(),
            1,
            "exactly one redemption of a code succeeds"
        );
        // The losers hold the verifier: the same client racing itself, so the winner's
        // tokens stand.
        assert!(active(&f.oauth, &winners[0].access_token, now).await);
    }
}

#[tokio::test]
async fn pkce_failures_burn_the_code() {
    let f = oauth();
    let now = Utc::now();
    let c = code(&f.oauth, now).await;
    let wrong = "x".repeat(43);
    let err = f
        .oauth
        .token_from(&exchange(&c, &wrong), now)
        .await
        .expect_err("wrong verifier");
    assert_eq!(err.code(), "invalid_grant");
    let err = f
        .oauth
        .token_from(&exchange(&c, VERIFIER), now)
        .await
        .expect_err("code burned");
    assert_eq!(err.code(), "invalid_grant");

    let c = code(&f.oauth, now).await;
    let mut no_verifier = exchange(&c, VERIFIER);
    no_verifier.remove("code_verifier");
    let err = f
        .oauth
        .token_from(&no_verifier, now)
        .await
        .expect_err("missing");
    assert_eq!(err.code(), "invalid_request");

    let c = code(&f.oauth, now).await;
    let mut other_redirect = exchange(&c, VERIFIER);
    other_redirect.insert("redirect_uri".into(), "http://127.0.0.1:5000/other".into());
    let err = f
        .oauth
        .token_from(&other_redirect, now)
        .await
        .expect_err("redirect");
    assert_eq!(err.code(), "invalid_grant");
}

#[tokio::test]
async fn the_token_endpoint_checks_grant_type_and_resource() {
    let f = oauth();
    let now = Utc::now();
    let err = f
        .oauth
        .token_from(&params(&[]), now)
        .await
        .expect_err("no grant");
    assert_eq!(err.code(), "invalid_request");
    let err = f
        .oauth
        .token_from(&params(&[("grant_type", "password")]), now)
        .await
        .expect_err("unsupported");
    assert_eq!(err.code(), "unsupported_grant_type");
    let c = code(&f.oauth, now).await;
    let mut elsewhere = exchange(&c, VERIFIER);
    elsewhere.insert("resource".into(), "https://other.example".into());
    let err = f
        .oauth
        .token_from(&elsewhere, now)
        .await
        .expect_err("not ours");
    assert_eq!(err.code(), "invalid_target");
}

#[tokio::test]
async fn refresh_rotates_and_reuse_revokes_the_family() {
    let f = oauth();
    let now = Utc::now();
    let first = f.grant(now).await;
    let second = f
        .oauth
        .token_from(&refresh(&first.refresh_token, CLIENT, None), now)
        .await
        .expect("refreshed");
    assert_ne!(second.refresh_token, first.refresh_token);
    assert!(active(&f.oauth, &second.access_token, now).await);
    assert!(
        !active(&f.oauth, &first.refresh_token, now).await,
        "the old refresh token is used up"
    );
    let err = f
        .oauth
        .token_from(&refresh(&first.refresh_token, CLIENT, None), now)
        .await
        .expect_err("reuse");
    assert_eq!(err.code(), "invalid_grant");
    assert!(
        !active(&f.oauth, &second.access_token, now).await,
        "reuse revokes the whole family"
    );
    assert!(f
        .oauth
        .token_from(&refresh(&second.refresh_token, CLIENT, None), now)
        .await
        .is_err());
}

#[tokio::test]
async fn refresh_checks_client_and_scope() {
    let f = oauth();
    let now = Utc::now();
    let issued = f.grant(now).await;
    let err = f
        .oauth
        .token_from(
            &refresh(&issued.refresh_token, "https://evil.example/c.json", None),
            now,
        )
        .await
        .expect_err("other client");
    assert_eq!(err.code(), "invalid_grant");
    let err = f
        .oauth
        .token_from(
            &refresh(&issued.refresh_token, CLIENT, Some("endpoint:write")),
            now,
        )
        .await
        .expect_err("wider scope");
    assert_eq!(err.code(), "invalid_scope");
    // Neither failure used the token up.
    assert!(f
        .oauth
        .token_from(&refresh(&issued.refresh_token, CLIENT, None), now)
        .await
        .is_ok());
}

#[tokio::test]
async fn revoking_a_refresh_token_ends_the_grant() {
    let f = oauth();
    let now = Utc::now();
    let issued = f.grant(now).await;
    let was_active = f
        .oauth
        .revoke(
            &issued.refresh_token,
            Some("https://other.example/c.json"),
            now,
        )
        .await
        .expect("revoke");
    assert!(!was_active, "another client's revocation is ignored");
    assert!(active(&f.oauth, &issued.access_token, now).await);
    let was_active = f
        .oauth
        .revoke(&issued.refresh_token, Some(CLIENT), now)
        .await
        .expect("revoke");
    assert!(was_active);
    assert!(!active(&f.oauth, &issued.access_token, now).await);
    assert!(!f
        .oauth
        .revoke("pha_unknown", None, now)
        .await
        .expect("revoke"));
}

#[tokio::test]
async fn codes_expire() {
    let f = oauth();
    let now = Utc::now();
    let c = code(&f.oauth, now).await;
    let later = now + chrono::Duration::seconds(301);
    let err = f
        .oauth
        .token_from(&exchange(&c, VERIFIER), later)
        .await
        .expect_err("expired");
    assert_eq!(err.code(), "invalid_grant");
    assert!(err.to_string().contains("expired"));
}

#[tokio::test]
async fn pruning_removes_only_what_is_dead() {
    let f = oauth();
    let now = Utc::now();
    let issued = f.grant(now).await;
    let later = now + chrono::Duration::seconds(3601);
    assert!(
        !active(&f.oauth, &issued.access_token, later).await,
        "the access token expired"
    );
    let removed = f.oauth.prune(later).await.expect("prune");
    assert_eq!(removed, 1, "only the expired access token goes");
    assert!(f.oauth.state_of(&issued.access_token).await.is_none());
    // The family and its refresh token live on.
    let refreshed = f
        .oauth
        .token_from(&refresh(&issued.refresh_token, CLIENT, None), later)
        .await
        .expect("refresh still works");
    assert!(f.oauth.state_of(&refreshed.refresh_token).await.is_some());
}

#[tokio::test]
async fn access_tokens_authenticate_until_they_expire_or_their_user_is_gone() {
    let f = oauth();
    let admin = f.admin().await;
    let now = Utc::now();
    let approval_code = code_for(&f.oauth, admin.id, now).await;
    let issued = f
        .oauth
        .token_from(&exchange(&approval_code, VERIFIER), now)
        .await
        .expect("exchanged");
    let credential = f
        .oauth
        .authenticate(&issued.access_token, now)
        .await
        .expect("lookup")
        .expect("valid");
    assert_eq!(credential.user.id, admin.id);
    let later = now + chrono::Duration::seconds(3601);
    assert!(f
        .oauth
        .authenticate(&issued.access_token, later)
        .await
        .expect("lookup")
        .is_none());
    assert!(f
        .oauth
        .authenticate("pha_nope", now)
        .await
        .expect("lookup")
        .is_none());
    // The refresh token still gets a new access token, which works.
    let renewed = f
        .oauth
        .token_from(&refresh(&issued.refresh_token, CLIENT, None), later)
        .await
        .expect("refreshed");
    assert!(f
        .oauth
        .authenticate(&renewed.access_token, later)
        .await
        .expect("lookup")
        .is_some());
}

#[tokio::test]
async fn introspection_shows_a_client_only_its_own_tokens() {
    let f = oauth();
    let now = Utc::now();
    let issued = f.grant(now).await;
    let seen = f
        .oauth
        .introspect(Some(&issued.access_token), &issued.refresh_token, now)
        .await
        .expect("introspect")
        .expect("allowed");
    assert!(matches!(
        seen,
        Introspection::Active {
            kind: TokenKind::Refresh,
            ..
        }
    ));
    assert_eq!(
        f.oauth
            .introspect(None, &issued.access_token, now)
            .await
            .expect("introspect"),
        None,
        "an anonymous caller may not introspect"
    );
    assert_eq!(
        f.oauth
            .introspect(Some("pha_unknown"), &issued.access_token, now)
            .await
            .expect("introspect"),
        None
    );
    f.oauth
        .revoke(&issued.refresh_token, None, now)
        .await
        .expect("revoke");
    let other = f.grant(now).await;
    assert_eq!(
        f.oauth
            .introspect(Some(&other.access_token), &issued.access_token, now)
            .await
            .expect("introspect"),
        Some(Introspection::Inactive)
    );
}

#[tokio::test]
async fn leaked_tokens_and_keys_are_revoked() {
    let f = oauth();
    let boot = f
        .tenancy
        .bootstrap(corvid_tenancy::MintKey::Always)
        .await
        .expect("bootstrap");
    let key = boot.personal_api_key.expect("key minted");
    let now = Utc::now();
    let issued = f.grant(now).await;
    let report = |token: &str| Report {
        token: token.to_string(),
        token_type: "t".into(),
        url: None,
        source: None,
    };
    let outcomes = f
        .oauth
        .report_leaks(
            vec![
                report(&issued.refresh_token),
                report(&key),
                report("phx_unknown"),
                report("hello"),
            ],
            now,
        )
        .await
        .expect("report");
    let live: Vec<bool> = outcomes.iter().map(|o| o.was_active).collect();
    assert_eq!(live, vec![true, true, false, false]);
    assert!(
        !active(&f.oauth, &issued.access_token, now).await,
        "the grant went with it"
    );
    assert!(f
        .tenancy
        .authenticate_key(&key)
        .await
        .expect("lookup")
        .is_none());
}

#[tokio::test]
async fn sessions_end_and_expire() {
    let f = oauth();
    let admin = f.admin().await;
    let now = Utc::now();
    let cookie = f.oauth.start_session(admin.id, now).await.expect("start");
    let session = f
        .oauth
        .session(&cookie, now)
        .await
        .expect("read")
        .expect("live");
    assert_eq!(session.user.id, admin.id);
    let later = now + chrono::Duration::seconds(3601);
    assert!(f
        .oauth
        .session(&cookie, later)
        .await
        .expect("read")
        .is_none());
    let cookie = f.oauth.start_session(admin.id, now).await.expect("start");
    let session = f
        .oauth
        .session(&cookie, now)
        .await
        .expect("read")
        .expect("live");
    f.oauth.end_session(&session.hash).await.expect("end");
    assert!(f.oauth.session(&cookie, now).await.expect("read").is_none());
}

#[tokio::test]
async fn verified_clients_need_a_valid_client_id() {
    let f = oauth();
    let now = Utc::now();
    let err = f
        .oauth
        .verify_client("not a url", &corvid_activity::Actor::system(), now)
        .await
        .expect_err("invalid");
    assert_eq!(err.code(), "invalid_request");
    f.oauth
        .verify_client(CLIENT, &corvid_activity::Actor::system(), now)
        .await
        .expect("verified");
    assert!(f.oauth.is_verified(CLIENT).await.expect("read"));
    assert_eq!(f.oauth.verified_clients().await.expect("list").len(), 1);
    assert!(f
        .oauth
        .unverify_client(CLIENT, &corvid_activity::Actor::system())
        .await
        .expect("unset"));
    assert!(!f.oauth.is_verified(CLIENT).await.expect("read"));
}
