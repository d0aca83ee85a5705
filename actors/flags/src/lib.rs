//! Feature flags: definitions and cohorts behind [`FlagRecords`] with per-project in-memory
//! snapshots ([`FlagStore`]), request decoding (`request`), the pure evaluation engine (`evaluation`: hashing,
//! property matching, cohorts, dependencies) and its orchestration (`evaluate`, `serve`).
//!
//! [`Flags`] is the service's door: serving `/flags` ([`Flags::serve`]), the definitions API
//! (`definitions`) and the local-evaluation definitions (`local_eval`). [`OwnedFlags`] is the door of
//! the domains that own flags (early access, surveys, experiments).

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod coverage;
mod definitions;
mod evaluate;
mod evaluation;
#[cfg(test)]
mod evaluation_tests;
mod geoip;
mod hash;
mod local_eval;
mod matcher;
mod model;
mod owned;
mod pg_records;
mod properties;
mod records;
mod request;
mod revert;
mod serve;
mod store;
mod v2_entry;
mod validate;
mod values;

use std::sync::Arc;
use std::time::Duration;

pub use definitions::{CohortChanges, FlagChanges};
// The pure evaluation engine, for callers that hold definitions and a subject themselves
// (the in-process benchmarks measure it alone).
pub use evaluate::FlagsOutcome;
pub use evaluation::{
    evaluate_all, evaluate_slots, Evaluation, EvaluationPlan, PersonProperties, Reason, ReasonCode,
    Subject,
};
pub use geoip::{GeoIp, GeoIpError};
pub use hash::rollout_hash;
pub use local_eval::LocalEvaluation;
pub use model::{
    CohortDefinition, CohortIds, Cohorts, Condition, FlagDefinition, FlagFilters, Holdout,
    Multivariate, StaticMembers, Variant,
};
pub use owned::OwnedFlags;
pub use pg_records::PgFlags;
pub use properties::{MatchContext, PropertyFilter, PROPERTY_OPERATORS};
pub use records::{FlagRecords, SledFlags};
pub use request::FlagRequestError;
pub use revert::Reverted;
pub use serve::{Caller, Served};
pub use store::{CohortRecord, FlagRecord, FlagStore, ProjectFlags};
pub use v2_entry::V2Entry;

use corvid_activity::ActivityRecords;
use corvid_kernel::wire::WireInput;
use corvid_persons::PersonStore;
use corvid_tenancy::Tenancy;
use request::FlagRequest;

/// Keys of the flags surveys own start with this (PostHog's `SURVEY_TARGETING_FLAG_PREFIX`):
/// `/flags?only_evaluate_survey_feature_flags=true` evaluates only these, and requests that
/// evaluate nothing else are not billed.
pub const SURVEY_FLAG_PREFIX: &str = "survey-targeting-";

/// How `/flags` treats slow storage.
#[derive(Debug, Clone, Copy)]
pub struct FlagsSettings {
    /// How long a request waits for stored person and group properties before it is answered
    /// without them (the flags that needed them come back failed).
    pub stored_read_deadline: Duration,
}

/// The flags facade. Cheap to clone.
#[derive(Clone)]
pub struct Flags {
    store: Arc<FlagStore>,
    persons: Arc<PersonStore>,
    tenancy: Tenancy,
    geoip: Option<Arc<GeoIp>>,
    settings: FlagsSettings,
    /// The activity log flag changes are written to (read here for reverts).
    activity: Arc<dyn ActivityRecords>,
}

impl Flags {
    /// `(project, snapshot version)` of every project whose flags are in memory: the version
    /// goes up by one each time an edit rebuilds the project's snapshot.
    pub fn snapshot_versions(&self) -> Vec<(u64, u64)> {
        self.store.snapshot_versions()
    }

    pub fn new(
        store: Arc<FlagStore>,
        persons: Arc<PersonStore>,
        tenancy: Tenancy,
        geoip: Option<Arc<GeoIp>>,
        settings: FlagsSettings,
        activity: Arc<dyn ActivityRecords>,
    ) -> Flags {
        Flags {
            store,
            persons,
            tenancy,
            geoip,
            settings,
            activity,
        }
    }

    /// Decodes a `/flags` body (any encoding the SDKs send) into a request.
    pub fn decode_request(
        input: WireInput<'_>,
        max_decompressed: usize,
    ) -> Result<FlagRequest, FlagRequestError> {
        request::decode_request(input, max_decompressed)
    }
}

/// The PostgreSQL schema of this crate's tables (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[
    corvid_kernel::Migration {
        version: 4,
        name: "flags",
        sql: include_str!("../migrations/0004_flags.sql"),
    },
    corvid_kernel::Migration {
        version: 8,
        name: "flag keys",
        sql: include_str!("../migrations/0008_flag_keys.sql"),
    },
];
