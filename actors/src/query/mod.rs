//! The query engine: PostHog-style SQL (HogQL) and insight queries over a project's events,
//! persons and groups, planned and run by DataFusion on a runtime of its own.
//!
//! Flow: [`hogql`] turns text (or SQL we generate for insights) into one rewritten `SELECT`;
//! [`engine`] registers the project's [`tables`] in a fresh session and runs it under the
//! configured deadline and memory limit; [`results`] turns Arrow batches into JSON rows.

pub mod engine;
pub mod error;
pub mod functions;
pub mod hogql;
pub mod insights;
pub mod results;
pub mod run_count;
pub mod tables;
pub mod uniq;

pub use engine::{ArrowOutput, QueryEngine, QueryOutput, QuerySettings, Sources};
pub use error::QueryError;
#[cfg(test)]
pub(crate) mod tests;
