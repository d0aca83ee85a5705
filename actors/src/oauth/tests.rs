//! Grant logic against a real sled store.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::cimd::ClientSettings;
use super::fetch::FetchSettings;
use super::*;

const CLIENT: &str = "https://app.example.com/client.json";
const REDIRECT: &str = "http://127.0.0.1:5000/cb";
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

fn oauth() -> (tempfile::TempDir, OAuth) {
    oauth_with(Duration::from_secs(300), Duration::from_secs(3600))
}

fn oauth_with(code_ttl: Duration, access_ttl: Duration) -> (tempfile::TempDir, OAuth) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("sled opens");
    let clients = ClientSettings {
        fetch: FetchSettings {
            timeout: Duration::from_secs(1),
            allow_loopback: false,
            extra_ca_pem: None,
        },
        max_document_bytes: 5120,
        max_logo_bytes: 65536,
        cache_default: Duration::from_secs(60),
        cache_min: Duration::from_secs(1),
        cache_max: Duration::from_secs(600),
    };
    let lifetimes = Lifetimes {
        code: code_ttl,
        access_token: access_ttl,
        refresh_token: Duration::from_secs(86400),
        session: Duration::from_secs(3600),
    };
    let oauth = OAuth::new(&db, clients, lifetimes).expect("oauth opens");
    (dir, oauth)
}

fn code(oauth: &OAuth) -> String {
    oauth
        .create_code(Approval {
            user_id: 1,
            client_id: CLIENT.into(),
            redirect_uri: REDIRECT.into(),
            scopes: vec!["endpoint:read".into()],
            code_challenge: CHALLENGE.into(),
            resource: Some("http://127.0.0.1:8000".into()),
        })
        .expect("code")
}

fn exchange(code: &str, verifier: &str) -> CodeExchange {
    CodeExchange {
        code: code.into(),
        client_id: Some(CLIENT.into()),
        redirect_uri: Some(REDIRECT.into()),
        code_verifier: Some(verifier.into()),
        resource: None,
    }
}

fn active(oauth: &OAuth, token: &str) -> bool {
    oauth
        .lookup(token)
        .expect("lookup")
        .is_some_and(|s| s.is_active(Utc::now()))
}

#[test]
fn a_code_is_exchanged_once_and_a_replay_revokes_the_grant() {
    let (_dir, oauth) = oauth();
    let c = code(&oauth);
    let issued = oauth
        .exchange_code(exchange(&c, VERIFIER))
        .expect("exchanged");
    assert!(issued.access_token.starts_with("pha_"));
    assert!(issued.refresh_token.starts_with("phr_"));
    assert!(active(&oauth, &issued.access_token));
    let family = oauth
        .lookup(&issued.access_token)
        .expect("lookup")
        .expect("token")
        .token
        .family_id;
    let err = oauth
        .exchange_code(exchange(&c, VERIFIER))
        .expect_err("replay");
    assert_eq!(err.code(), "invalid_grant");
    assert!(
        oauth.family_revoked(&family),
        "cached credentials are told at once"
    );
    assert!(!active(&oauth, &issued.access_token));
    assert!(!active(&oauth, &issued.refresh_token));
}

#[test]
fn concurrent_redemptions_issue_at_most_one_grant() {
    let (_dir, oauth) = oauth();
    let oauth = Arc::new(oauth);
    for _ in 0..20 {
        let c = code(&oauth);
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let oauth = Arc::clone(&oauth);
                let c = c.clone();
                std::thread::spawn(move || oauth.exchange_code(exchange(&c, VERIFIER)).ok())
            })
            .collect();
        let winners: Vec<Issued> = handles
            .into_iter()
            .filter_map(|h| h.join().expect("thread"))
            .collect();
        assert!(
            winners.len() <= 1,
            "two redemptions of one code both succeeded"
        );
        // Whoever lost replayed the code, so even the winner's tokens are revoked.
        for w in winners {
            assert!(!active(&oauth, &w.access_token));
        }
    }
}

#[test]
fn pkce_failures_burn_the_code() {
    let (_dir, oauth) = oauth();
    let c = code(&oauth);
    let wrong = "x".repeat(43);
    let err = oauth
        .exchange_code(exchange(&c, &wrong))
        .expect_err("wrong verifier");
    assert_eq!(err.code(), "invalid_grant");
    let err = oauth
        .exchange_code(exchange(&c, VERIFIER))
        .expect_err("code burned");
    assert_eq!(err.code(), "invalid_grant");

    let c = code(&oauth);
    let mut no_verifier = exchange(&c, VERIFIER);
    no_verifier.code_verifier = None;
    assert_eq!(
        oauth
            .exchange_code(no_verifier)
            .expect_err("missing")
            .code(),
        "invalid_request"
    );

    let c = code(&oauth);
    let mut other_redirect = exchange(&c, VERIFIER);
    other_redirect.redirect_uri = Some("http://127.0.0.1:5000/other".into());
    assert_eq!(
        oauth
            .exchange_code(other_redirect)
            .expect_err("redirect")
            .code(),
        "invalid_grant"
    );
}

#[test]
fn refresh_rotates_and_reuse_revokes_the_family() {
    let (_dir, oauth) = oauth();
    let first = oauth
        .exchange_code(exchange(&code(&oauth), VERIFIER))
        .expect("exchanged");
    let second = oauth
        .refresh(&first.refresh_token, Some(CLIENT), None, None)
        .expect("refreshed");
    assert_ne!(second.refresh_token, first.refresh_token);
    assert!(active(&oauth, &second.access_token));
    assert!(
        !active(&oauth, &first.refresh_token),
        "the old refresh token is used up"
    );

    let err = oauth
        .refresh(&first.refresh_token, Some(CLIENT), None, None)
        .expect_err("reuse");
    assert_eq!(err.code(), "invalid_grant");
    assert!(
        !active(&oauth, &second.access_token),
        "reuse revokes the whole family"
    );
    assert!(oauth
        .refresh(&second.refresh_token, Some(CLIENT), None, None)
        .is_err());
}

#[test]
fn refresh_checks_client_and_scope() {
    let (_dir, oauth) = oauth();
    let issued = oauth
        .exchange_code(exchange(&code(&oauth), VERIFIER))
        .expect("exchanged");
    let err = oauth
        .refresh(
            &issued.refresh_token,
            Some("https://evil.example/c.json"),
            None,
            None,
        )
        .expect_err("other client");
    assert_eq!(err.code(), "invalid_grant");
    let err = oauth
        .refresh(
            &issued.refresh_token,
            Some(CLIENT),
            Some("endpoint:write"),
            None,
        )
        .expect_err("wider scope");
    assert_eq!(err.code(), "invalid_scope");
    // Neither failure used the token up.
    assert!(oauth
        .refresh(&issued.refresh_token, Some(CLIENT), None, None)
        .is_ok());
}

#[test]
fn revoking_a_refresh_token_ends_the_grant() {
    let (_dir, oauth) = oauth();
    let issued = oauth
        .exchange_code(exchange(&code(&oauth), VERIFIER))
        .expect("exchanged");
    let (was_active, _) = oauth
        .revoke(&issued.refresh_token, Some("https://other.example/c.json"))
        .expect("revoke");
    assert!(!was_active, "another client's revocation is ignored");
    assert!(active(&oauth, &issued.access_token));
    let (was_active, hash) = oauth
        .revoke(&issued.refresh_token, Some(CLIENT))
        .expect("revoke");
    assert!(was_active);
    assert_eq!(hash, sha256_hex(&issued.refresh_token));
    assert!(!active(&oauth, &issued.access_token));
    assert!(!oauth.revoke("pha_unknown", None).expect("revoke").0);
}

#[test]
fn codes_expire() {
    let (_dir, oauth) = oauth_with(Duration::from_millis(1), Duration::from_secs(3600));
    let c = code(&oauth);
    std::thread::sleep(Duration::from_millis(20));
    let err = oauth
        .exchange_code(exchange(&c, VERIFIER))
        .expect_err("expired");
    assert_eq!(err.code(), "invalid_grant");
    assert!(err.to_string().contains("expired"));
}

#[test]
fn pruning_removes_only_what_is_dead() {
    let (_dir, oauth) = oauth_with(Duration::from_secs(300), Duration::from_millis(1));
    let issued = oauth
        .exchange_code(exchange(&code(&oauth), VERIFIER))
        .expect("exchanged");
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !active(&oauth, &issued.access_token),
        "the access token expired"
    );
    let removed = oauth.prune().expect("prune");
    assert_eq!(removed, 1, "only the expired access token goes");
    assert!(oauth
        .lookup(&issued.access_token)
        .expect("lookup")
        .is_none());
    // The family and its refresh token live on.
    let refreshed = oauth
        .refresh(&issued.refresh_token, Some(CLIENT), None, None)
        .expect("refresh still works");
    assert!(oauth
        .lookup(&refreshed.refresh_token)
        .expect("lookup")
        .is_some());
}
