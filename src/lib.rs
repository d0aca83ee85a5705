//! Corvid, the service: HTTP handlers, auth, config, CLI and wiring. Domain logic lives in the
//! engine's crates under `actors/` (one per domain, composed by `corvid-engine`); handlers here
//! validate input and call each domain's door.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

pub mod app;
pub mod auth;
pub mod body;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod console;
pub mod control;
pub mod error;
pub mod http;
pub mod metrics;
pub mod rate_limits;
pub mod state;
pub mod telemetry;
