//! Blocking steps shared by the operations: users, keys and the first-run setup of a data directory.

use chrono::Utc;
use uuid::Uuid;

use crate::{
    Bootstrapped, MetadataRecords, MintKey, NewPersonalApiKey, Organization, PersonalApiKey,
    Project, ProjectSettings, User, ADMIN_EMAIL, DEFAULT_ORGANIZATION, DEFAULT_PROJECT,
};
use corvid_activity::{ActivityEntry, Actor, Recorded};
use corvid_kernel::{secrets, StoreError};
pub(super) fn projects_of(
    store: &dyn MetadataRecords,
    org: Uuid,
) -> Result<Vec<Project>, StoreError> {
    Ok(store
        .projects()?
        .into_iter()
        .filter(|p| p.organization_id == org)
        .collect())
}

pub(super) fn create_user(
    store: &dyn MetadataRecords,
    organization_id: Uuid,
    email: String,
    password: &str,
    is_staff: bool,
) -> Result<User, StoreError> {
    let user = User {
        id: store.next_id("users")?,
        uuid: Uuid::now_v7(),
        first_name: email.split('@').next().unwrap_or_default().to_string(),
        email,
        password_hash: secrets::hash_password(password)?,
        organization_id,
        is_staff,
        created_at: Utc::now(),
        level: crate::model::Level::Owner,
        is_active: true,
        deactivated_at: None,
    };
    store.insert_user(&user)?;
    Ok(user)
}

/// The activity entries of a key made (`created`) or deleted: one per project the key can
/// reach (its `scoped_teams`, else every project of its user's organization), scope
/// `PersonalAPIKey`, the key's hash masked.
pub(super) fn key_entries(
    store: &dyn MetadataRecords,
    key: &PersonalApiKey,
    actor: &Actor,
    created: bool,
) -> Result<Vec<ActivityEntry>, StoreError> {
    let projects: Vec<u64> = match &key.scoped_teams {
        Some(teams) => teams.clone(),
        None => match store.user(key.user_id)? {
            Some(user) => projects_of(store, user.organization_id)?
                .iter()
                .map(|p| p.id)
                .collect(),
            None => Vec::new(),
        },
    };
    let json = serde_json::to_value(key).unwrap_or_default();
    Ok(projects
        .into_iter()
        .filter_map(|project_id| {
            let (item_id, name) = (key.id.clone(), Some(key.label.clone()));
            if created {
                Recorded {
                    project_id,
                    actor,
                    scope: "PersonalAPIKey",
                    item_id,
                    name,
                    before: None,
                    after: &json,
                }
                .entry()
            } else {
                Some(ActivityEntry::removal(
                    project_id,
                    actor,
                    "PersonalAPIKey",
                    item_id,
                    name,
                ))
            }
        })
        .collect())
}

/// Makes a key, logged as `actor`'s.
pub(super) fn mint_key(
    store: &dyn MetadataRecords,
    new: NewPersonalApiKey,
    label: String,
    actor: &Actor,
) -> Result<(PersonalApiKey, String), StoreError> {
    let secret = secrets::new_personal_api_key();
    let key = PersonalApiKey {
        id: Uuid::now_v7().simple().to_string(),
        user_id: new.user_id,
        label,
        secure_value_sha256: secrets::sha256_hex(&secret),
        mask_value: secrets::mask(&secret),
        scopes: new.scopes,
        scoped_teams: new.scoped_teams,
        scoped_organizations: new.scoped_organizations,
        created_at: Utc::now(),
        last_used_at: None,
    };
    store.insert_key(&key, &key_entries(store, &key, actor, true)?)?;
    Ok((key, secret))
}

pub(super) fn bootstrap(
    store: &dyn MetadataRecords,
    mint: MintKey,
) -> Result<Bootstrapped, StoreError> {
    let organization = match store
        .organizations()?
        .into_iter()
        .min_by_key(|o| o.created_at)
    {
        Some(org) => org,
        None => {
            let org = Organization {
                id: Uuid::now_v7(),
                name: DEFAULT_ORGANIZATION.into(),
                created_at: Utc::now(),
                feature_flag_request_quota: None,
            };
            store.put_organization(&org)?;
            org
        }
    };
    let project = match projects_of(store, organization.id)?
        .into_iter()
        .min_by_key(|p| p.id)
    {
        Some(project) => project,
        None => {
            let project = Project {
                id: store.next_id("projects")?,
                uuid: Uuid::now_v7(),
                organization_id: organization.id,
                name: DEFAULT_PROJECT.into(),
                api_token: secrets::new_project_token(),
                timezone: "UTC".into(),
                anonymize_ips: false,
                created_at: Utc::now(),
                event_retention_days: None,
                settings: ProjectSettings::default(),
            };
            store.insert_project(&project)?;
            project
        }
    };
    let (admin, admin_password) = match store.user_by_email(ADMIN_EMAIL)? {
        Some(user) => (user, None),
        None => {
            let password = secrets::new_password();
            let user = create_user(store, organization.id, ADMIN_EMAIL.into(), &password, true)?;
            (user, Some(password))
        }
    };
    let personal_api_key = if mint == MintKey::Always || admin_password.is_some() {
        let new = NewPersonalApiKey {
            user_id: admin.id,
            label: "bootstrap".into(),
            scopes: vec!["*".into()],
            scoped_teams: None,
            scoped_organizations: None,
        };
        Some(mint_key(store, new, "bootstrap".into(), &Actor::system())?.1)
    } else {
        None
    };
    Ok(Bootstrapped {
        project,
        admin,
        admin_password,
        personal_api_key,
    })
}
