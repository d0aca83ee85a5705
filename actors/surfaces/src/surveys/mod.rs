//! Surveys: definitions, the flags that decide who sees them, the public list the browser SDK
//! fetches, statistics from captured events, and the upkeep that stops a survey at its
//! response limit and moves iterating surveys to their next iteration.
//!
//! [`Surveys`] is the one door. Writes are serialised (one lock) because a survey and its flags
//! change together; reads of a project's surveys come from memory after the first.

mod model;
pub(crate) mod stats;
mod targeting;
mod validate;

use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use serde_json::Value;
use uuid::Uuid;

use corvid_flags::{FlagRecord, OwnedFlags};
use corvid_kernel::DefinitionRecords;
use corvid_query::QueryEngine;

pub use model::{EventStats, Survey, SurveyChanges, SurveyStats, SurveyType};
pub use stats::Period;
pub use targeting::FLAG_PREFIX;
pub use validate::QUESTION_TYPES;

/// The largest `iteration_count` accepted (PostHog's `MAX_ITERATION_COUNT`).
pub const MAX_ITERATIONS: u64 = 500;

/// The longest `iteration_frequency_days` accepted: ten years between iterations.
pub const MAX_ITERATION_DAYS: u64 = 3650;

/// The surveys facade. Cheap to clone.
#[derive(Clone)]
pub struct Surveys {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn DefinitionRecords<Survey>>,
    flags: Arc<OwnedFlags>,
    query: Arc<QueryEngine>,
    /// Each project's surveys, loaded on first use and replaced on every write.
    cache: DashMap<u64, Arc<Vec<Survey>>>,
    writes: Mutex<()>,
    /// Surveys whose upkeep failed, and until when they wait (the others go on).
    upkeep: Mutex<corvid_kernel::Backoff<Uuid>>,
}

/// A survey whose upkeep fails is retried after this long, doubled per failure in a row up to
/// the max.
const UPKEEP_RETRY: std::time::Duration = std::time::Duration::from_secs(60);
const UPKEEP_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// A survey with the flags it names, ready to render.
#[derive(Debug, Clone)]
pub struct SurveyView {
    pub survey: Survey,
    pub linked_flag: Option<FlagRecord>,
    pub targeting_flag: Option<FlagRecord>,
    pub internal_targeting_flag: Option<FlagRecord>,
}

/// Who created a survey (the user summary shown as `created_by`).
pub type Creator = Option<Value>;

mod operations;
mod view;
mod writes;

use operations::*;

#[cfg(test)]
mod tests;
