//! The tenancy rules, over the embedded store.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::{
    Credential, CredentialSource, NewPersonalApiKey, NewProject, ProjectUpdate, ScopeSet,
    SledMetadata,
};
use corvid_kernel::secrets;

fn tenancy(dir: &std::path::Path) -> Tenancy {
    let store = SledMetadata::open(dir).expect("opens");
    Tenancy::new(
        Arc::new(store),
        TenancySettings {
            cache_ttl: Duration::from_secs(60),
            last_used_resolution: Duration::from_secs(3600),
            password_threads: 1,
            password_queue: 8,
            invite_ttl: Duration::from_secs(3 * 86_400),
        },
    )
}

fn admin_credential(user: User) -> Credential {
    Credential {
        user,
        scopes: ScopeSet::All,
        scoped_teams: None,
        scoped_organizations: None,
        source: CredentialSource::PersonalApiKey {
            id: "bootstrap".into(),
            sha256_hex: String::new(),
            last_used_at: None,
        },
    }
}

#[tokio::test]
async fn bootstrap_is_idempotent_and_mints_keys_as_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = tenancy(dir.path());
    let first = t.bootstrap(MintKey::OnFirstRun).await.expect("bootstraps");
    assert_eq!(first.project.id, 1);
    assert_eq!(first.project.name, DEFAULT_PROJECT);
    let password = first.admin_password.clone().expect("new password");
    assert!(secrets::verify_password(
        &password,
        &first.admin.password_hash
    ));
    let key = first
        .personal_api_key
        .clone()
        .expect("first run mints a key");
    assert!(t.authenticate_key(&key).await.expect("auth").is_some());

    let second = t.bootstrap(MintKey::OnFirstRun).await.expect("again");
    assert!(second.admin_password.is_none() && second.personal_api_key.is_none());
    assert_eq!(second.project, first.project);
    let third = t.bootstrap(MintKey::Always).await.expect("again");
    assert!(third.personal_api_key.is_some());
    assert_eq!(
        t.projects_of_organization(first.project.organization_id)
            .await
            .expect("list")
            .len(),
        1
    );
}

#[tokio::test]
async fn projects_are_validated_numbered_and_found_by_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let org = {
        let t = tenancy(dir.path());
        let boot = t.bootstrap(MintKey::OnFirstRun).await.expect("bootstraps");
        let err = t
            .create_project(NewProject {
                organization_id: boot.project.organization_id,
                name: "x".into(),
                timezone: "Mars/Olympus".into(),
                anonymize_ips: false,
            })
            .await
            .expect_err("bad tz");
        assert!(matches!(
            err,
            StoreError::Invalid {
                attr: Some("timezone"),
                ..
            }
        ));
        let err = t
            .create_project(NewProject {
                organization_id: boot.project.organization_id,
                name: " ".into(),
                timezone: "UTC".into(),
                anonymize_ips: false,
            })
            .await
            .expect_err("blank name");
        assert!(matches!(
            err,
            StoreError::Invalid {
                attr: Some("name"),
                ..
            }
        ));
        boot.project.organization_id
    };
    // Ids continue after a restart.
    let t = tenancy(dir.path());
    let p = t
        .create_project(NewProject {
            organization_id: org,
            name: "Two".into(),
            timezone: "Europe/Paris".into(),
            anonymize_ips: true,
        })
        .await
        .expect("project");
    assert_eq!(p.id, 2);
    let found = t.project_by_token(&p.api_token).await.expect("read");
    assert_eq!(found.as_deref(), Some(&p));

    let updated = t
        .update_project(
            2,
            &corvid_activity::Actor::system(),
            ProjectUpdate {
                heatmaps_opt_in: Some(true),
                name: Some("Renamed".into()),
                ..ProjectUpdate::default()
            },
        )
        .await
        .expect("update");
    assert!(updated.settings.heatmaps_opt_in);
    assert_eq!(
        t.project(2).await.expect("read").map(|p| p.name.clone()),
        Some("Renamed".into())
    );
    let err = t
        .update_project(
            2,
            &corvid_activity::Actor::system(),
            ProjectUpdate {
                session_recording_opt_in: Some(true),
                ..ProjectUpdate::default()
            },
        )
        .await
        .expect_err("recordings");
    assert!(matches!(
        err,
        StoreError::Invalid {
            attr: Some("session_recording_opt_in"),
            ..
        }
    ));
}

#[tokio::test]
async fn keys_never_outgrow_their_creator_and_stop_working_when_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = tenancy(dir.path());
    let boot = t.bootstrap(MintKey::OnFirstRun).await.expect("bootstraps");
    let admin = admin_credential(boot.admin.clone());
    let new = |scopes: &[&str]| NewPersonalApiKey {
        user_id: boot.admin.id,
        label: "ci".into(),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        scoped_teams: None,
        scoped_organizations: None,
    };
    let (key, secret) = t
        .create_personal_api_key(&admin, new(&["query:read"]))
        .await
        .expect("creates");
    assert!(
        !key.mask_value.contains(&secret[8..]),
        "the mask hides the secret"
    );
    let credential = t
        .authenticate_key(&secret)
        .await
        .expect("auth")
        .expect("valid");
    // A narrow key cannot mint a broader one.
    let err = t
        .create_personal_api_key(&credential, new(&["query:write"]))
        .await
        .expect_err("broader");
    assert!(matches!(
        err,
        StoreError::Invalid {
            attr: Some("scopes"),
            ..
        }
    ));
    let err = t
        .create_personal_api_key(&admin, new(&["nonsense:read"]))
        .await
        .expect_err("bad scope");
    assert!(matches!(
        err,
        StoreError::Invalid {
            attr: Some("scopes"),
            ..
        }
    ));

    assert!(t
        .delete_personal_api_key(boot.admin.id, &key.id, &corvid_activity::Actor::system())
        .await
        .expect("delete"));
    assert!(t.authenticate_key(&secret).await.expect("auth").is_none());
    assert!(!t
        .delete_personal_api_key(boot.admin.id, &key.id, &corvid_activity::Actor::system())
        .await
        .expect("again"));
}

#[tokio::test]
async fn logins_check_the_password_and_emails_are_unique() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = tenancy(dir.path());
    let boot = t.bootstrap(MintKey::OnFirstRun).await.expect("bootstraps");
    let org = boot.project.organization_id;
    t.create_user(org, "Ann@Example.com", "secret-pw", false)
        .await
        .expect("user");
    let err = t
        .create_user(org, "ann@example.com", "x", false)
        .await
        .expect_err("duplicate");
    assert!(matches!(err, StoreError::Conflict { .. }));
    assert!(t
        .verify_login("ann@example.com", "secret-pw")
        .await
        .expect("login")
        .is_some());
    assert!(t
        .verify_login("ann@example.com", "wrong")
        .await
        .expect("login")
        .is_none());
    assert!(t
        .verify_login("nobody@example.com", "x")
        .await
        .expect("login")
        .is_none());
    let err = t
        .create_user(org, "not-an-email", "x", false)
        .await
        .expect_err("email");
    assert!(matches!(
        err,
        StoreError::Invalid {
            attr: Some("email"),
            ..
        }
    ));
}
