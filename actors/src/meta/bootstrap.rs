//! First-run setup: the default organization, project and admin user.

use super::model::{NewProject, Organization, Project, User};
use super::MetaStore;
use crate::kernel::{secrets, StoreError};

pub const DEFAULT_ORGANIZATION: &str = "Default";
pub const DEFAULT_PROJECT: &str = "Default project";
pub const ADMIN_EMAIL: &str = "admin@localhost";

/// The default tenancy, and the admin password when this call created the admin.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub organization: Organization,
    pub project: Project,
    pub admin: User,
    /// Set only when the admin user was created by this call; it cannot be recovered later.
    pub admin_password: Option<String>,
}

impl Defaults {
    /// True when this call created the admin, i.e. the data directory was new.
    pub fn created(&self) -> bool {
        self.admin_password.is_some()
    }
}

/// Creates whatever part of the default tenancy is missing; idempotent.
pub fn ensure_defaults(store: &MetaStore) -> Result<Defaults, StoreError> {
    let organization = match store
        .organizations()?
        .into_iter()
        .min_by_key(|o| o.created_at)
    {
        Some(org) => org,
        None => store.create_organization(DEFAULT_ORGANIZATION)?,
    };
    let project = match store.project(1)? {
        Some(project) => project,
        None => store.create_project(NewProject {
            organization_id: organization.id,
            name: DEFAULT_PROJECT.into(),
            timezone: "UTC".into(),
            anonymize_ips: false,
        })?,
    };
    let (admin, admin_password) = match store.user_by_email(ADMIN_EMAIL)? {
        Some(user) => (user, None),
        None => {
            let password = secrets::new_password();
            let user = store.create_user(organization.id, ADMIN_EMAIL, &password, true)?;
            (user, Some(password))
        }
    };
    Ok(Defaults {
        organization,
        project,
        admin,
        admin_password,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_call_reuses_everything_and_reveals_no_password() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("opens");
        let first = ensure_defaults(&store).expect("bootstraps");
        assert!(first.created());
        assert_eq!(first.project.id, 1);
        assert_eq!(first.project.name, DEFAULT_PROJECT);
        assert_eq!(first.project.timezone, "UTC");
        let password = first.admin_password.clone().expect("new password");
        assert!(secrets::verify_password(
            &password,
            &first.admin.password_hash
        ));

        let second = ensure_defaults(&store).expect("bootstraps again");
        assert!(!second.created());
        assert_eq!(second.project, first.project);
        assert_eq!(second.admin.id, first.admin.id);
        assert_eq!(store.project_count(), 1);
    }
}
