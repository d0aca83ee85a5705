//! The query engine: PostHog-style SQL (HogQL) and insight queries over a project's events,
//! persons and groups, planned and run by DataFusion on a runtime of its own.
//!
//! Flow: [`hogql`] turns text (or SQL we generate for insights) into one rewritten `SELECT`;
//! [`engine`] registers the project's [`tables`] in a fresh session and runs it under the
//! configured deadline and memory limit; [`results`] turns Arrow batches into JSON rows.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod engine;
mod erased;
mod error;
mod export;
mod functions;
mod gate;
mod hogql;
mod insights;
mod materialization;
mod memory;
mod page_runs;
mod response;
mod results;
mod run_count;
mod runs;
mod tables;
mod time_bounds;
mod uniq;

pub use engine::{ArrowOutput, QueryEngine, QueryOutput, QuerySettings, Sources};
pub use error::QueryError;
pub use export::{ExportScan, ExportSink};
pub use gate::QueryTicket;
pub use hogql::{
    parse_with_variable_markers, prepare_user_sql, variable_names, Bindings, Generated, Page,
    RowLimits, VARIABLE_MARKER,
};
pub use insights::dates::utc_text;
pub use insights::trends::BreakdownFilter;
pub use insights::{QueryAnswer, QueryKind, BREAKDOWN_NULL, BREAKDOWN_OTHER};
pub use materialization::{
    insight_breakdowns, plan as materialization_plan, Aggregate, Op, Plan as MaterializationPlan,
    Reaggregate, Refusal, SqlPlan, VariableFilter, VARIABLE_COLUMN,
};
pub use response::{QueryResponse, Timing};
pub use results::{rows as result_rows, types as result_types};

/// The fixture the tests of this crate and of the crates that run queries share.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
#[cfg(test)]
mod tests;
