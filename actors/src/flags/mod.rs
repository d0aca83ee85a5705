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

/// Keys of the flags surveys own start with this (PostHog's `SURVEY_TARGETING_FLAG_PREFIX`):
/// `/flags?only_evaluate_survey_feature_flags=true` evaluates only these, and requests that
/// evaluate nothing else are not billed.
pub const SURVEY_FLAG_PREFIX: &str = "survey-targeting-";
