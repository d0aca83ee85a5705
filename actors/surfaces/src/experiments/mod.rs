//! Experiments and holdouts (as in PostHog): an experiment owns a multivariate
//! flag (first variant `control`) that `/flags` evaluates like any other; its lifecycle
//! (launch, pause, resume, end, ship a variant, archive) drives that flag; its results compare
//! each variant with control from captured exposures and metric events
//! ([`metrics`], [`bayes`]). A holdout keeps a share of people out of every experiment using
//! it: their flags carry `filters.holdout`, and held-out people get `holdout-{id}`.
//!
//! [`Experiments`] is the one door.

pub(crate) mod bayes;
mod metrics;
mod model;
mod results;

use std::sync::{Arc, Mutex};

use corvid_flags::Holdout as FlagHoldout;
use corvid_flags::OwnedFlags;
use corvid_kernel::DefinitionRecords;
use corvid_query::QueryEngine;

pub use model::{Action, Experiment, ExperimentChanges, Holdout, HoldoutChanges, Status};
pub use results::ExperimentResults;

/// The experiments facade. Cheap to clone.
#[derive(Clone)]
pub struct Experiments {
    inner: Arc<Inner>,
}

struct Inner {
    experiments: Arc<dyn DefinitionRecords<Experiment>>,
    holdouts: Arc<dyn DefinitionRecords<Holdout>>,
    flags: Arc<OwnedFlags>,
    query: Arc<QueryEngine>,
    writes: Mutex<()>,
}

/// List filters.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// `None`: every status.
    pub status: Option<Status>,
    /// Archived experiments are listed only when asked for (default false).
    pub archived: bool,
    pub feature_flag_id: Option<i64>,
    /// Case-insensitive substring of the name.
    pub search: Option<String>,
}

mod operations;
mod rules;
mod view;
mod writes;

use rules::*;
use view::*;
use writes::*;

#[cfg(test)]
mod tests;
