//! A verified credential: who is calling and what they may touch. Personal API keys produce one
//! and OAuth access tokens produce the same type, so every route checks both alike.

use chrono::{DateTime, Utc};

use super::model::{NewPersonalApiKey, PersonalApiKey, Project, User};
use super::{Scope, ScopeSet};
use corvid_kernel::StoreError;

#[derive(Debug, Clone, PartialEq)]
pub enum CredentialSource {
    PersonalApiKey {
        id: String,
        sha256_hex: String,
        last_used_at: Option<DateTime<Utc>>,
    },
    /// An OAuth access token (`pha_…`) issued to `client_id`.
    OAuthAccessToken {
        sha256_hex: String,
        client_id: String,
        /// The grant it belongs to: revoking the grant revokes the token.
        family_id: uuid::Uuid,
        expires_at: DateTime<Utc>,
    },
    /// A signed-in browser session (the console, an invitee just signed up): the user's own
    /// reach, every scope, until the session ends.
    Session { expires_at: DateTime<Utc> },
}

#[derive(Debug, Clone)]
pub struct Credential {
    pub user: User,
    pub scopes: ScopeSet,
    pub scoped_teams: Option<Vec<u64>>,
    pub scoped_organizations: Option<Vec<uuid::Uuid>>,
    pub source: CredentialSource,
}

impl Credential {
    /// What a signed-in browser session of an active user grants: everything the user can
    /// reach, except that a member's session cannot manage the organization
    /// (`organization:write`: its team, invites and settings).
    pub fn from_session(user: User, expires_at: DateTime<Utc>) -> Option<Credential> {
        if !user.is_active {
            return None;
        }
        let scopes = if user.level >= crate::model::Level::Admin {
            ScopeSet::parse(&["*"]).ok()?
        } else {
            let names: Vec<String> = ScopeSet::all_scope_names()
                .into_iter()
                .filter(|s| s != "organization:write")
                .collect();
            ScopeSet::parse(&names).ok()?
        };
        Some(Credential {
            user,
            scopes,
            scoped_teams: None,
            scoped_organizations: None,
            source: CredentialSource::Session { expires_at },
        })
    }

    /// The credential a personal API key grants, or `None` when its stored scopes no longer
    /// parse (a key from a newer build): such a key is treated as invalid, never as `*`. A
    /// deactivated user's keys grant nothing.
    pub fn from_personal_api_key(key: PersonalApiKey, user: User) -> Option<Credential> {
        if !user.is_active {
            return None;
        }
        let scopes = ScopeSet::parse(&key.scopes).ok()?;
        Some(Credential {
            user,
            scopes,
            scoped_teams: key.scoped_teams,
            scoped_organizations: key.scoped_organizations,
            source: CredentialSource::PersonalApiKey {
                id: key.id,
                sha256_hex: key.secure_value_sha256,
                last_used_at: key.last_used_at,
            },
        })
    }

    /// What per-credential limits count against: the key, or for OAuth the user and the
    /// application (so refreshing a token does not reset a budget).
    pub fn limit_key(&self) -> String {
        match &self.source {
            CredentialSource::PersonalApiKey { id, .. } => format!("key:{id}"),
            CredentialSource::OAuthAccessToken { client_id, .. } => {
                format!("oauth:{}:{client_id}", self.user.id)
            }
            CredentialSource::Session { .. } => format!("session:{}", self.user.id),
        }
    }

    /// Whether the credential has run out (only OAuth access tokens expire).
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        match &self.source {
            CredentialSource::OAuthAccessToken { expires_at, .. }
            | CredentialSource::Session { expires_at } => *expires_at <= now,
            CredentialSource::PersonalApiKey { .. } => false,
        }
    }

    pub fn grants(&self, scope: &Scope) -> bool {
        self.scopes.grants(scope)
    }

    /// Whether the user belongs to the project's organization at all.
    pub fn can_see_project(&self, project: &Project) -> bool {
        self.user.organization_id == project.organization_id
    }

    /// Whether the credential's own restrictions (scoped teams / organizations) allow `project`.
    pub fn allows_project(&self, project: &Project) -> bool {
        let team_ok = self
            .scoped_teams
            .as_ref()
            .is_none_or(|teams| teams.contains(&project.id));
        let org_ok = self
            .scoped_organizations
            .as_ref()
            .is_none_or(|orgs| orgs.contains(&project.organization_id));
        self.can_see_project(project) && team_ok && org_ok
    }
}

impl Credential {
    /// Checks that a key this credential creates grants nothing the credential itself lacks:
    /// no wider scopes, no project or organization outside its own reach.
    pub fn check_delegation(
        &self,
        new: &NewPersonalApiKey,
        org_projects: &[Project],
    ) -> Result<(), StoreError> {
        if let CredentialSource::OAuthAccessToken { .. } = self.source {
            // A key outlives the token: it would survive the grant's expiry and revocation.
            return Err(StoreError::Forbidden {
                detail: "OAuth access tokens cannot create personal API keys.",
            });
        }
        let wanted = ScopeSet::parse(&new.scopes)
            .map_err(|bad| StoreError::invalid(format!("invalid scope `{bad}`"), "scopes"))?;
        if !self.scopes.covers(&wanted) {
            return Err(StoreError::invalid(
                "a key cannot be given scopes its creator does not have",
                "scopes",
            ));
        }
        match (&self.scoped_teams, &new.scoped_teams) {
            (Some(_), None) => {
                return Err(StoreError::invalid(
                    "a key limited to projects can only create keys limited to those projects",
                    "scoped_teams",
                ))
            }
            (_, Some(teams)) => {
                for id in teams {
                    let reachable = org_projects
                        .iter()
                        .any(|p| p.id == *id && self.allows_project(p));
                    if !reachable {
                        return Err(StoreError::invalid(
                            format!("project {id} does not exist or is not accessible"),
                            "scoped_teams",
                        ));
                    }
                }
            }
            (None, None) => {}
        }
        if let Some(orgs) = &new.scoped_organizations {
            let own = self.user.organization_id;
            let allowed = |o: &uuid::Uuid| {
                *o == own
                    && self
                        .scoped_organizations
                        .as_ref()
                        .is_none_or(|mine| mine.contains(o))
            };
            if let Some(bad) = orgs.iter().find(|o| !allowed(o)) {
                return Err(StoreError::invalid(
                    format!("organization {bad} is not accessible"),
                    "scoped_organizations",
                ));
            }
        } else if self.scoped_organizations.is_some() {
            return Err(StoreError::invalid(
                "a key limited to organizations can only create keys limited to them",
                "scoped_organizations",
            ));
        }
        Ok(())
    }
}
