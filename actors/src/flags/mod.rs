//! Feature flags: definitions and cohorts in sled with per-project in-memory snapshots
//! (`store`), request decoding (`request`), the pure evaluation engine (`engine`: hashing,
//! property matching, cohorts, dependencies) and its orchestration (`evaluate`, `serve`).
//!
//! [`Flags`] is the one door: serving `/flags` ([`Flags::serve`]), the definitions API
//! ([`admin`]) and the local-evaluation definitions ([`local_eval`]).

mod admin;
mod coverage;
pub(crate) mod engine;
#[cfg(test)]
mod engine_tests;
pub(crate) mod evaluate;
pub(crate) mod geoip;
pub(crate) mod hash;
mod local_eval;
pub(crate) mod model;
mod pg_records;
pub(crate) mod properties;
pub(crate) mod records;
pub(crate) mod request;
mod serve;
pub(crate) mod store;
pub(crate) mod validate;

use std::sync::Arc;
use std::time::Duration;

pub use admin::{CohortChanges, FlagChanges};
pub use engine::{Evaluation, Reason};
pub use evaluate::FlagsOutcome;
pub use local_eval::LocalEvaluation;
pub use model::FlagDefinition;
pub use pg_records::PgFlags;
pub use properties::PROPERTY_OPERATORS;
pub use records::{FlagRecords, SledFlags};
pub use request::FlagRequestError;
pub use serve::{Caller, Served};
pub use store::{CohortRecord, FlagRecord, ProjectFlags};

use crate::meta::Tenancy;
use crate::persons::PersonStore;
use crate::wire::WireInput;
use geoip::GeoIp;
use request::{decode_body, parse_request, FlagRequest};
use store::FlagStore;

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
    ) -> Flags {
        Flags {
            store,
            persons,
            tenancy,
            geoip,
            settings,
        }
    }

    /// Decodes a `/flags` body (any encoding the SDKs send) into a request.
    pub fn decode_request(
        input: WireInput<'_>,
        max_decompressed: usize,
    ) -> Result<FlagRequest, FlagRequestError> {
        parse_request(&decode_body(input, max_decompressed)?)
    }
}
