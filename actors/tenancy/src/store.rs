//! Where tenancy metadata lives: organizations, projects, users and personal API keys.
//!
//! The trait holds records only; every rule (validation, ids, tokens, secrets) is in the
//! [`super::Tenancy`] facade, so each implementation stores what it is given. Every write is
//! durable when it returns. [`super::SledMetadata`] is the embedded implementation; every
//! implementation passes [`contract::suite`].

use std::sync::Arc;

use uuid::Uuid;

use super::model::{Invite, Organization, PersonalApiKey, Project, User};
use corvid_activity::ActivityEntry;
use corvid_kernel::StoreError;

/// Told the SHA-256 hex of a credential another process revoked (`None`: any may have been),
/// or [`ROTATED_PROJECT`] followed by the id of a project whose token another process rotated.
pub type OnRevoked = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// The prefix of a revocation notice that names a project whose token was rotated.
pub const ROTATED_PROJECT: &str = "project:";

/// A read-modify-write of one project: the activity-log entries to write with it (an error
/// aborts the update).
pub type ProjectEdit<'a> = dyn FnMut(&mut Project) -> Result<Vec<ActivityEntry>, StoreError> + 'a;

/// A read-modify-write of one user: the activity-log entries to write with it (an error aborts
/// the update).
pub type UserEdit<'a> = dyn FnMut(&mut User) -> Result<Vec<ActivityEntry>, StoreError> + 'a;

pub trait MetadataRecords: Send + Sync {
    /// Runs `work` while no other node sharing this store runs work through here: for
    /// check-then-create sequences such as bootstrapping the default tenancy. A store one
    /// process owns (the embedded one) just runs it; the process serializes its callers.
    fn exclusively(
        &self,
        work: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        work()
    }

    /// The next value (1, 2, …) of a named id sequence, unique across restarts.
    fn next_id(&self, sequence: &str) -> Result<u64, StoreError>;

    fn put_organization(&self, org: &Organization) -> Result<(), StoreError>;
    fn organization(&self, id: Uuid) -> Result<Option<Organization>, StoreError>;
    fn organizations(&self) -> Result<Vec<Organization>, StoreError>;

    /// Inserts a new project; `Conflict` when its token is taken.
    fn insert_project(&self, project: &Project) -> Result<(), StoreError>;
    /// Replaces an existing project (its token does not change).
    fn put_project(&self, project: &Project) -> Result<(), StoreError>;
    /// Applies `change` to project `id` as stored now and stores the result, atomically: of
    /// concurrent updates (on any node) none is lost. When `change` gives the project a new
    /// token, the old one stops resolving at once, on every node (`Conflict` when the new one
    /// is taken). `NotFound` when there is no such project; an error from `change` writes
    /// nothing. Returns the stored project.
    fn update_project(&self, id: u64, change: &mut ProjectEdit<'_>) -> Result<Project, StoreError>;
    fn project(&self, id: u64) -> Result<Option<Project>, StoreError>;
    fn project_by_token(&self, token: &str) -> Result<Option<Project>, StoreError>;
    fn projects(&self) -> Result<Vec<Project>, StoreError>;

    /// Inserts a new user; `Conflict` when the (normalized) email is taken.
    fn insert_user(&self, user: &User) -> Result<(), StoreError>;
    fn user(&self, id: u64) -> Result<Option<User>, StoreError>;
    fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError>;
    /// Every user of the organization, by id.
    fn users_of_organization(&self, org: Uuid) -> Result<Vec<User>, StoreError>;
    /// Changes one user (its email stays) with its activity-log entries in the same
    /// transaction. `change` must not call the store (the embedded one would deadlock). Every process drops the credentials it cached (a user's level and whether
    /// they are active are part of each credential).
    fn update_user(&self, id: u64, change: &mut UserEdit<'_>) -> Result<User, StoreError>;

    /// Inserts or replaces an invite, with its activity-log entries in the same transaction.
    fn put_invite(&self, invite: &Invite, log: &[ActivityEntry]) -> Result<(), StoreError>;
    fn invite(&self, id: Uuid) -> Result<Option<Invite>, StoreError>;
    fn invites_of_organization(&self, org: Uuid) -> Result<Vec<Invite>, StoreError>;
    /// Deletes an invite; whether it existed (`log` is written only then, in the same
    /// transaction).
    fn delete_invite(&self, id: Uuid, log: &[ActivityEntry]) -> Result<bool, StoreError>;

    /// Inserts a key (findable by its id and by its secret's hash), with its activity-log
    /// entries in the same transaction.
    fn insert_key(&self, key: &PersonalApiKey, log: &[ActivityEntry]) -> Result<(), StoreError>;
    /// Replaces an existing key (its hash does not change).
    fn put_key(&self, key: &PersonalApiKey) -> Result<(), StoreError>;
    fn key(&self, id: &str) -> Result<Option<PersonalApiKey>, StoreError>;
    fn key_by_hash(&self, sha256_hex: &str) -> Result<Option<PersonalApiKey>, StoreError>;
    fn keys_of_user(&self, user_id: u64) -> Result<Vec<PersonalApiKey>, StoreError>;
    /// Deletes a key; the deleted record, if it existed (`log` is written only then, in the
    /// same transaction).
    fn delete_key(
        &self,
        id: &str,
        log: &[ActivityEntry],
    ) -> Result<Option<PersonalApiKey>, StoreError>;

    /// Makes everything written so far durable (shutdown).
    fn flush(&self) -> Result<(), StoreError>;

    /// Calls `on_revoked` with the SHA-256 hex of a credential another process revoked
    /// (`None`: any may have been), so cached credentials can be dropped. A store only this
    /// process writes (the embedded one) never calls it: the facade that revoked already
    /// forgot the credential.
    fn watch_credentials(&self, on_revoked: OnRevoked) {
        let _ = on_revoked;
    }
}

/// The behaviour every [`MetadataRecords`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use chrono::Utc;

    use super::*;
    use crate::model::ProjectSettings;

    fn org(name: &str) -> Organization {
        Organization {
            id: Uuid::now_v7(),
            name: name.into(),
            created_at: Utc::now(),
            feature_flag_request_quota: None,
        }
    }

    fn project(id: u64, org: Uuid, token: &str) -> Project {
        Project {
            id,
            uuid: Uuid::now_v7(),
            organization_id: org,
            name: format!("p{id}"),
            api_token: token.into(),
            timezone: "UTC".into(),
            anonymize_ips: false,
            created_at: Utc::now(),
            event_retention_days: None,
            settings: ProjectSettings::default(),
        }
    }

    fn user(id: u64, email: &str, org: Uuid) -> User {
        User {
            id,
            uuid: Uuid::now_v7(),
            email: email.into(),
            first_name: "x".into(),
            password_hash: "hash".into(),
            organization_id: org,
            is_staff: false,
            created_at: Utc::now(),
            level: crate::model::Level::Owner,
            is_active: true,
            deactivated_at: None,
        }
    }

    fn key(id: &str, user_id: u64, hash: &str) -> PersonalApiKey {
        PersonalApiKey {
            id: id.into(),
            user_id,
            label: "k".into(),
            secure_value_sha256: hash.into(),
            mask_value: "phx_...x".into(),
            scopes: vec!["*".into()],
            scoped_teams: None,
            scoped_organizations: None,
            created_at: Utc::now(),
            last_used_at: None,
        }
    }

    /// Runs every check; `open` gives a store over the same storage each time (empty at the
    /// first call), so a reopen shows what is durable.
    pub fn suite(open: &dyn Fn() -> Box<dyn MetadataRecords>) {
        let store = open();
        let acme = org("Acme");
        store.put_organization(&acme).expect("org");
        let mut renamed = acme.clone();
        renamed.feature_flag_request_quota = Some(5);
        store.put_organization(&renamed).expect("update org");
        assert_eq!(
            store.organization(acme.id).expect("read"),
            Some(renamed.clone())
        );
        assert_eq!(store.organizations().expect("list"), vec![renamed]);

        // Projects: by id, by token, listed; a taken token conflicts.
        let one = project(1, acme.id, "phc_one");
        store.insert_project(&one).expect("project");
        assert!(matches!(
            store.insert_project(&project(2, acme.id, "phc_one")),
            Err(StoreError::Conflict { .. })
        ));
        let mut changed = one.clone();
        changed.name = "renamed".into();
        changed.settings.heatmaps_opt_in = true;
        store.put_project(&changed).expect("update project");
        assert_eq!(store.project(1).expect("read"), Some(changed.clone()));
        assert_eq!(
            store.project_by_token("phc_one").expect("read"),
            Some(changed)
        );
        assert_eq!(store.project_by_token("phc_two").expect("read"), None);
        assert_eq!(store.projects().expect("list").len(), 1);

        // Updates are atomic: concurrent read-modify-writes lose nothing.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10 {
                        store
                            .update_project(1, &mut |p| {
                                p.name.push('+');
                                Ok(Vec::new())
                            })
                            .expect("update");
                    }
                });
            }
        });
        let counted = store.project(1).expect("read").expect("exists");
        assert_eq!(counted.name, format!("renamed{}", "+".repeat(40)));
        // A rotated token: the old one no longer resolves, a taken one conflicts and writes
        // nothing, a refused change writes nothing, a missing project is not found.
        store
            .insert_project(&project(2, acme.id, "phc_two"))
            .expect("second project");
        let rotated = store
            .update_project(1, &mut |p| {
                p.api_token = "phc_new".into();
                Ok(Vec::new())
            })
            .expect("rotate");
        assert_eq!(rotated.api_token, "phc_new");
        assert_eq!(store.project_by_token("phc_one").expect("read"), None);
        assert_eq!(
            store.project_by_token("phc_new").expect("read"),
            Some(rotated.clone())
        );
        assert!(matches!(
            store.update_project(1, &mut |p| {
                p.api_token = "phc_two".into();
                Ok(Vec::new())
            }),
            Err(StoreError::Conflict { .. })
        ));
        assert!(matches!(
            store.update_project(1, &mut |_| Err(StoreError::invalid("no", "name"))),
            Err(StoreError::Invalid { .. })
        ));
        assert_eq!(store.project(1).expect("read"), Some(rotated));
        assert!(matches!(
            store.update_project(99, &mut |_| Ok(Vec::new())),
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(store.projects().expect("list").len(), 2);

        // Users: by id and email; a taken email conflicts.
        let ann = user(1, "ann@example.com", acme.id);
        store.insert_user(&ann).expect("user");
        assert!(matches!(
            store.insert_user(&user(2, "ann@example.com", acme.id)),
            Err(StoreError::Conflict { .. })
        ));
        assert_eq!(
            store.user_by_email("ann@example.com").expect("read"),
            Some(ann.clone())
        );
        assert_eq!(store.user(1).expect("read"), Some(ann.clone()));
        assert_eq!(store.user(2).expect("read"), None);
        let other_org = org("Other");
        store.put_organization(&other_org).expect("org");
        store
            .insert_user(&user(3, "bob@example.com", other_org.id))
            .expect("user");
        assert_eq!(
            store.users_of_organization(acme.id).expect("list"),
            vec![ann.clone()]
        );
        // A user's change keeps its email; a refused change writes nothing.
        let demoted = store
            .update_user(1, &mut |u| {
                u.level = crate::model::Level::Member;
                u.is_active = false;
                u.email = "changed@example.com".into();
                Ok(Vec::new())
            })
            .expect("update user");
        assert_eq!(
            (demoted.level, demoted.is_active),
            (crate::model::Level::Member, false)
        );
        assert_eq!(demoted.email, "ann@example.com");
        assert_eq!(store.user(1).expect("read"), Some(demoted.clone()));
        assert!(store
            .update_user(1, &mut |_| Err(StoreError::invalid("no", "level")))
            .is_err());
        assert_eq!(store.user(1).expect("read"), Some(demoted));
        assert!(matches!(
            store.update_user(99, &mut |_| Ok(Vec::new())),
            Err(StoreError::NotFound { .. })
        ));

        // Invites: by id and per organization; deletion.
        let invite = crate::model::Invite {
            id: Uuid::new_v4(),
            organization_id: acme.id,
            target_email: "cy@example.com".into(),
            first_name: "Cy".into(),
            level: crate::model::Level::Admin,
            message: None,
            created_by: 1,
            created_at: Utc::now(),
            expires_at: Utc::now(),
        };
        store.put_invite(&invite, &[]).expect("invite");
        assert_eq!(store.invite(invite.id).expect("read"), Some(invite.clone()));
        assert_eq!(
            store.invites_of_organization(acme.id).expect("list"),
            vec![invite.clone()]
        );
        assert!(store
            .invites_of_organization(other_org.id)
            .expect("list")
            .is_empty());
        assert!(store.delete_invite(invite.id, &[]).expect("delete"));
        assert!(!store.delete_invite(invite.id, &[]).expect("delete again"));

        // Keys: by id, by hash, per user; deletion forgets both.
        let k = key("k1", 1, "abc");
        store.insert_key(&k, &[]).expect("key");
        store.insert_key(&key("k2", 2, "def"), &[]).expect("key");
        assert_eq!(store.key_by_hash("abc").expect("read"), Some(k.clone()));
        assert_eq!(store.keys_of_user(1).expect("list"), vec![k.clone()]);
        let mut used = k.clone();
        used.last_used_at = Some(Utc::now());
        store.put_key(&used).expect("touch");
        assert_eq!(store.key("k1").expect("read"), Some(used.clone()));
        assert_eq!(store.delete_key("k1", &[]).expect("delete"), Some(used));
        assert_eq!(store.delete_key("k1", &[]).expect("delete again"), None);
        assert_eq!(store.key_by_hash("abc").expect("read"), None);

        // Sequences are per name, increasing, and survive a reopen.
        let a1 = store.next_id("a").expect("id");
        let a2 = store.next_id("a").expect("id");
        assert!(a2 > a1);
        assert_eq!(store.next_id("b").expect("id"), 1);
        store.flush().expect("flush");
        drop(store);
        let again = open();
        assert!(again.next_id("a").expect("id") > a2);
        assert_eq!(
            again.project(1).expect("read").map(|p| p.name),
            Some(format!("renamed{}", "+".repeat(40)))
        );
    }
}
