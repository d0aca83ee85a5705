//! Corvid, the service: HTTP handlers, auth, config, CLI and wiring. Domain logic lives in the
//! `corvid-actors` engine crate; handlers here validate input and call into it.

pub mod app;
pub mod auth;
pub mod body;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod error;
pub mod http;
pub mod metrics;
pub mod state;
pub mod telemetry;
