//! Feature flags: the pure evaluation engine (hashing, property matching) that definitions,
//! the flag actors and `/flags` build on. Work in progress (issue 4): definitions, cohorts,
//! condition evaluation and the HTTP surface are not built yet.

pub mod engine;
#[cfg(test)]
mod engine_tests;
pub mod evaluate;
pub mod geoip;
pub mod hash;
pub mod model;
pub mod properties;
pub mod request;
pub mod store;
pub mod validate;
