//! Feature flags: definitions and cohorts in sled with per-project in-memory snapshots
//! (`store`), request decoding (`request`), and the pure evaluation engine (`engine`: hashing,
//! property matching, cohorts, dependencies) that `/flags` and `/decide` run (`evaluate`).

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
