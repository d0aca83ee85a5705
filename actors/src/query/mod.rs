//! The query engine: PostHog-style SQL (HogQL) and insight queries over a project's events,
//! persons and groups, planned and run by DataFusion on a runtime of its own.
//!
//! Flow: [`hogql`] turns text (or SQL we generate for insights) into one rewritten `SELECT`;
//! [`engine`] registers the project's [`tables`] in a fresh session and runs it under the
//! configured deadline and memory limit; [`results`] turns Arrow batches into JSON rows.

pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod functions;
pub(crate) mod gate;
pub(crate) mod hogql;
pub(crate) mod insights;
pub(crate) mod memory;
pub(crate) mod results;
pub(crate) mod run_count;
pub(crate) mod tables;
pub(crate) mod uniq;

pub use engine::{ArrowOutput, QueryEngine, QueryOutput, QuerySettings, Sources};
pub use error::QueryError;
pub use gate::QueryTicket;
pub use insights::{QueryAnswer, QueryKind};
#[cfg(test)]
pub(crate) mod tests;
