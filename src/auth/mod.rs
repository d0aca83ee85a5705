//! Authentication and authorization extractors.
//!
//! - [`Authed<S>`]: a bearer credential (`Authorization: Bearer phx_…`) holding scope `S`.
//! - [`ProjectAccess<S>`]: the same, plus the `{project_id}` of the path resolved and checked
//!   against the credential, so a key of project A can never reach project B.
//! - [`Staff<S>`]: the same, from a user who is instance staff.
//! - [`ProjectToken`]: a public project token (`phc_…`) from the body or query, resolved.

mod bearer;
mod project;
mod project_token;
pub mod scope;
mod staff;

pub use bearer::Authed;
pub use project::ProjectAccess;
pub use project_token::{public_project, resolve_project_token, ProjectToken};
pub use staff::Staff;

/// The user a credential acts for, as the activity log names them.
pub fn actor(credential: &corvid_tenancy::Credential) -> corvid_activity::Actor {
    let u = &credential.user;
    corvid_activity::Actor::user(u.id, u.uuid, &u.email, &u.first_name)
}
