//! A team: an organization's members and their levels, invitations, password changes and
//! deactivation. Each change is written with its entries in the activity log of every
//! project of the organization (scopes `OrganizationMembership`, `OrganizationInvite` and
//! `User`).
//!
//! Who may do what: any member reads the team; admins invite, cancel invites and change
//! members; only owners make, change or deactivate owners; an organization always keeps an
//! active owner. A deactivated user cannot sign in, their keys are deleted, and their OAuth
//! tokens and browser sessions are refused from the next request on (every node drops its
//! cached credentials).

use chrono::Utc;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{run, Tenancy};
use crate::model::{Invite, Level, Organization, User};
use crate::store::MetadataRecords;
use corvid_activity::{ActivityEntry, Actor, Recorded};
use corvid_kernel::{secrets, StoreError};

const MEMBERSHIP: &str = "OrganizationMembership";
const INVITE: &str = "OrganizationInvite";
const USER: &str = "User";
/// Shortest and longest password accepted.
const PASSWORD_LENGTH: std::ops::RangeInclusive<usize> = 8..=256;
const MAX_MESSAGE: usize = 1000;
const MAX_NAME: usize = 150;

/// An invitation to make.
#[derive(Debug, Clone)]
pub struct NewInvite {
    pub target_email: String,
    pub first_name: Option<String>,
    pub level: Level,
    pub message: Option<String>,
}

/// A change to a member: their level, or whether they are active.
#[derive(Debug, Clone, Default)]
pub struct MemberUpdate {
    pub level: Option<Level>,
    pub is_active: Option<bool>,
}

/// The user as the activity log records a membership.
fn member_json(u: &User) -> Value {
    json!({"email": u.email, "first_name": u.first_name, "level": u8::from(u.level),
           "is_active": u.is_active})
}

fn actor_of(u: &User) -> Actor {
    Actor::user(u.id, u.uuid, &u.email, &u.first_name)
}

fn forbidden(detail: &'static str) -> StoreError {
    StoreError::Forbidden { detail }
}

/// `by` may manage the organization's team: an active admin or owner of it.
fn check_manager(by: &User, org: Uuid) -> Result<(), StoreError> {
    if by.organization_id != org || !by.is_active {
        return Err(StoreError::NotFound {
            what: "organization".into(),
        });
    }
    if by.level < Level::Admin {
        return Err(forbidden(
            "Only an organization admin or owner can manage its members and invites.",
        ));
    }
    Ok(())
}

fn check_password(password: &str) -> Result<(), StoreError> {
    if !PASSWORD_LENGTH.contains(&password.chars().count()) {
        return Err(StoreError::invalid(
            "The password must be 8 to 256 characters.",
            "password",
        ));
    }
    Ok(())
}

/// The ids of the organization's projects, whose logs a team change goes in. Read before a
/// store transaction starts (the embedded store takes no other reads inside one).
fn project_ids(store: &dyn MetadataRecords, org: Uuid) -> Result<Vec<u64>, StoreError> {
    Ok(super::projects_of(store, org)?
        .iter()
        .map(|p| p.id)
        .collect())
}

/// One entry per project for a change of `scope`'s item.
fn entries(
    projects: &[u64],
    actor: &Actor,
    (scope, item_id, name): (&str, String, Option<String>),
    before: Option<&Value>,
    after: &Value,
) -> Vec<ActivityEntry> {
    projects
        .iter()
        .filter_map(|&project_id| {
            Recorded {
                project_id,
                actor,
                scope,
                item_id: item_id.clone(),
                name: name.clone(),
                before,
                after,
            }
            .entry()
        })
        .collect()
}

impl Tenancy {
    /// Every user of the organization, deactivated ones included.
    pub async fn members(&self, org: Uuid) -> Result<Vec<User>, StoreError> {
        let store = self.store.clone();
        run(move || store.users_of_organization(org)).await
    }

    /// The user, unless they were deactivated (what sessions and tokens are checked against).
    pub async fn active_user(&self, id: u64) -> Result<Option<User>, StoreError> {
        Ok(self.user(id).await?.filter(|u| u.is_active))
    }

    /// Changes a member's level or deactivates (or reactivates) them, as `by`. Deactivation
    /// deletes the member's personal API keys.
    pub async fn update_member(
        &self,
        by: &User,
        org: Uuid,
        member: Uuid,
        update: MemberUpdate,
    ) -> Result<User, StoreError> {
        let (store, by) = (self.store.clone(), by.clone());
        let updated = run(move || {
            check_manager(&by, org)?;
            let members = store.users_of_organization(org)?;
            let target =
                members
                    .iter()
                    .find(|u| u.uuid == member)
                    .ok_or_else(|| StoreError::NotFound {
                        what: "member".into(),
                    })?;
            let touches_owner = target.level == Level::Owner || update.level == Some(Level::Owner);
            if touches_owner && by.level < Level::Owner {
                return Err(forbidden(
                    "Only an owner can make, change or deactivate owners.",
                ));
            }
            let actor = actor_of(&by);
            let now = Utc::now();
            let projects = project_ids(store.as_ref(), org)?;
            let updated = store.update_user(target.id, &mut |u| {
                let before = member_json(u);
                if let Some(level) = update.level {
                    u.level = level;
                }
                match update.is_active {
                    Some(false) if u.is_active => {
                        u.is_active = false;
                        u.deactivated_at = Some(now);
                    }
                    Some(true) => {
                        u.is_active = true;
                        u.deactivated_at = None;
                    }
                    _ => {}
                }
                let owners_left = members
                    .iter()
                    .filter(|m| m.id != u.id && m.is_active && m.level == Level::Owner)
                    .count()
                    + usize::from(u.is_active && u.level == Level::Owner);
                if owners_left == 0 {
                    return Err(StoreError::invalid(
                        "The organization must keep an active owner.",
                        "level",
                    ));
                }
                let activity = (MEMBERSHIP, u.uuid.to_string(), Some(u.email.clone()));
                Ok(entries(
                    &projects,
                    &actor,
                    activity,
                    Some(&before),
                    &member_json(u),
                ))
            })?;
            if !updated.is_active {
                for key in store.keys_of_user(updated.id)? {
                    let log = super::key_entries(store.as_ref(), &key, &actor, false)?;
                    store.delete_key(&key.id, &log)?;
                }
            }
            Ok(updated)
        })
        .await?;
        self.cache.forget_all_credentials();
        Ok(updated)
    }

    /// The organization's invites, expired ones included.
    pub async fn invites(&self, org: Uuid) -> Result<Vec<Invite>, StoreError> {
        let store = self.store.clone();
        run(move || store.invites_of_organization(org)).await
    }

    /// Invites someone by email, as `by` (who cannot grant a level above their own). An
    /// earlier invite of the same email is replaced.
    pub async fn create_invite(
        &self,
        by: &User,
        org: Uuid,
        new: NewInvite,
    ) -> Result<Invite, StoreError> {
        let (store, by) = (self.store.clone(), by.clone());
        let ttl = chrono::Duration::from_std(self.settings.invite_ttl)
            .unwrap_or(chrono::Duration::days(3));
        run(move || {
            check_manager(&by, org)?;
            let email = super::normalize_email(&new.target_email)
                .map_err(|_| StoreError::invalid("Enter a valid email address.", "target_email"))?;
            if new.level > by.level {
                return Err(forbidden("You cannot invite someone above your own level."));
            }
            if store.user_by_email(&email)?.is_some() {
                return Err(StoreError::invalid(
                    "A user with this email address already exists.",
                    "target_email",
                ));
            }
            if new
                .message
                .as_ref()
                .is_some_and(|m| m.chars().count() > MAX_MESSAGE)
            {
                return Err(StoreError::invalid(
                    "The message must be at most 1000 characters.",
                    "message",
                ));
            }
            let first_name = match new.first_name.filter(|n| !n.trim().is_empty()) {
                Some(name) if name.chars().count() > MAX_NAME => {
                    return Err(StoreError::invalid(
                        "first_name must be at most 150 characters.",
                        "first_name",
                    ))
                }
                Some(name) => name.trim().to_string(),
                None => email.split('@').next().unwrap_or_default().to_string(),
            };
            let actor = actor_of(&by);
            for earlier in store.invites_of_organization(org)? {
                if earlier.target_email == email {
                    store.delete_invite(earlier.id, &[])?;
                }
            }
            let now = Utc::now();
            let invite = Invite {
                id: Uuid::new_v4(),
                organization_id: org,
                target_email: email.clone(),
                first_name,
                level: new.level,
                message: new.message,
                created_by: by.id,
                created_at: now,
                expires_at: now + ttl,
            };
            let shown = json!({"target_email": email, "level": u8::from(invite.level),
                               "expires_at": invite.expires_at});
            let activity = (INVITE, invite.id.to_string(), Some(email));
            let log = entries(
                &project_ids(store.as_ref(), org)?,
                &actor,
                activity,
                None,
                &shown,
            );
            store.put_invite(&invite, &log)?;
            Ok(invite)
        })
        .await
    }

    /// Cancels an invite, as `by`.
    pub async fn delete_invite(&self, by: &User, org: Uuid, id: Uuid) -> Result<(), StoreError> {
        let (store, by) = (self.store.clone(), by.clone());
        run(move || {
            check_manager(&by, org)?;
            let invite = store
                .invite(id)?
                .filter(|i| i.organization_id == org)
                .ok_or_else(|| StoreError::NotFound {
                    what: "invite".into(),
                })?;
            let log: Vec<ActivityEntry> = super::projects_of(store.as_ref(), org)?
                .iter()
                .map(|p| {
                    ActivityEntry::removal(
                        p.id,
                        &actor_of(&by),
                        INVITE,
                        id.to_string(),
                        Some(invite.target_email.clone()),
                    )
                })
                .collect();
            store.delete_invite(id, &log)?;
            Ok(())
        })
        .await
    }

    /// An invite that can still be accepted, with its organization.
    pub async fn open_invite(
        &self,
        id: Uuid,
    ) -> Result<Option<(Invite, Organization)>, StoreError> {
        let store = self.store.clone();
        run(move || {
            let Some(invite) = store.invite(id)?.filter(|i| i.expires_at > Utc::now()) else {
                return Ok(None);
            };
            Ok(store
                .organization(invite.organization_id)?
                .map(|org| (invite, org)))
        })
        .await
    }

    /// Accepts an open invite: the invitee becomes a user of the organization at the invite's
    /// level, with `password`. The invite is used up.
    pub async fn accept_invite(
        &self,
        id: Uuid,
        first_name: Option<String>,
        password: String,
    ) -> Result<User, StoreError> {
        check_password(&password)?;
        let Some((invite, _)) = self.open_invite(id).await? else {
            return Err(StoreError::NotFound {
                what: "invite".into(),
            });
        };
        let store = self.store.clone();
        run(move || {
            let first_name = first_name
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty() && n.chars().count() <= MAX_NAME)
                .unwrap_or_else(|| invite.first_name.clone());
            let user = User {
                id: store.next_id("users")?,
                uuid: Uuid::now_v7(),
                email: invite.target_email.clone(),
                first_name,
                password_hash: secrets::hash_password(&password)?,
                organization_id: invite.organization_id,
                is_staff: false,
                created_at: Utc::now(),
                level: invite.level,
                is_active: true,
                deactivated_at: None,
            };
            store.insert_user(&user)?;
            let actor = actor_of(&user);
            let activity = (MEMBERSHIP, user.uuid.to_string(), Some(user.email.clone()));
            let projects = project_ids(store.as_ref(), user.organization_id)?;
            let mut log = entries(&projects, &actor, activity, None, &member_json(&user));
            log.extend(projects.iter().map(|&p| {
                ActivityEntry::removal(p, &actor, INVITE, id.to_string(), Some(user.email.clone()))
                    .with_context(json!({"accepted": true}))
            }));
            store.delete_invite(id, &log)?;
            Ok(user)
        })
        .await
    }

    /// Changes `user`'s password after checking the current one. A wrong current password
    /// is an error on `current_password`.
    pub async fn change_password(
        &self,
        user: &User,
        current: String,
        new: String,
    ) -> Result<User, StoreError> {
        check_password(&new)?;
        let (store, user) = (self.store.clone(), user.clone());
        let updated = run(move || {
            let stored = store.user(user.id)?.ok_or_else(|| StoreError::NotFound {
                what: "user".into(),
            })?;
            if !secrets::verify_password(&current, &stored.password_hash) {
                return Err(StoreError::invalid(
                    "The current password is not correct.",
                    "current_password",
                ));
            }
            let hash = secrets::hash_password(&new)?;
            let actor = actor_of(&stored);
            let projects = project_ids(store.as_ref(), stored.organization_id)?;
            store.update_user(user.id, &mut |u| {
                let before = json!({"password": u.password_hash});
                u.password_hash = hash.clone();
                let activity = (USER, u.uuid.to_string(), Some(u.email.clone()));
                let after = json!({"password": u.password_hash});
                Ok(entries(&projects, &actor, activity, Some(&before), &after))
            })
        })
        .await?;
        self.cache.forget_all_credentials();
        Ok(updated)
    }
}
