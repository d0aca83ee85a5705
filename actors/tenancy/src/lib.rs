//! Tenancy: organizations, projects, users, personal API keys and the credentials they grant.
//!
//! [`Tenancy`] is the one door: it holds the rules and the in-memory cache every request reads
//! (credentials and projects, invalidated on write). Records live behind [`MetadataRecords`]
//! ([`SledMetadata`] in the embedded default).

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod cache;
mod credential;
mod model;
mod pg_store;
pub(crate) mod scopes;
mod sled_store;
mod store;
mod tenancy;

pub use corvid_kernel::secrets::PERSONAL_API_KEY_PREFIX;
pub use corvid_kernel::StoreError;
pub use credential::{Credential, CredentialSource};
pub use model::{
    Invite, Level, NewPersonalApiKey, NewProject, Organization, PersonalApiKey, Project,
    ProjectSettings, ProjectUpdate, User,
};
pub use pg_store::PgMetadata;
pub use scopes::{Access, Scope, ScopeSet, OBJECTS as SCOPE_OBJECTS};
pub use sled_store::{SledMetadata, DEFAULT_CACHE_BYTES, SCHEMA_VERSION};
pub use store::MetadataRecords;
pub use tenancy::{
    Bootstrapped, MemberUpdate, MintKey, NewInvite, OrganizationUpdate, Tenancy, TenancySettings,
    ADMIN_EMAIL, DEFAULT_ORGANIZATION, DEFAULT_PROJECT,
};

/// The PostgreSQL schema of this crate's tables (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[
    corvid_kernel::Migration {
        version: 1,
        name: "metadata",
        sql: include_str!("../migrations/0001_metadata.sql"),
    },
    corvid_kernel::Migration {
        version: 12,
        name: "organization invites",
        sql: include_str!("../migrations/0012_invites.sql"),
    },
];
