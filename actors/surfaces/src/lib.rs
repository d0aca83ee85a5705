//! The product surfaces that ride on feature flags: remote config, early access, surveys and
//! experiments. Each is a small domain with its own facade (one public module per surface);
//! they share one error enum ([`RecordError`]) and reach flags only through the flags crate's
//! owned-flag commands.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

pub mod early_access;
pub mod experiments;
pub mod remote_config;
mod surface;
pub mod surveys;

#[cfg(test)]
mod pg_tests;

pub use surface::RecordError;

/// The PostgreSQL schema of this crate's tables (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[corvid_kernel::Migration {
    version: 8,
    name: "experiment flags",
    sql: include_str!("../migrations/0008_experiment_flags.sql"),
}];
