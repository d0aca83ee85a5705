//! Tenancy and credentials metadata, stored in sled.
//!
//! The store is synchronous on purpose: sled calls may block on disk, so callers run them on a
//! blocking thread (`web::block` in the service). Hot read paths go through [`MetaCache`], an
//! in-memory, invalidated-on-write view that handlers read without touching sled.

mod bootstrap;
mod cache;
mod credential;
mod model;
pub mod scopes;
mod store;

pub use crate::kernel::StoreError;
pub use bootstrap::{
    ensure_defaults, Defaults, ADMIN_EMAIL, DEFAULT_ORGANIZATION, DEFAULT_PROJECT,
};
pub use cache::MetaCache;
pub use credential::{Credential, CredentialSource};
pub use model::{
    NewPersonalApiKey, NewProject, Organization, PersonalApiKey, Project, ProjectSettings,
    ProjectUpdate, User,
};
pub use scopes::{Scope, ScopeSet};
pub use store::{MetaStore, SCHEMA_VERSION};
