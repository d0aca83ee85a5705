//! Flag and cohort definitions in PostHog's JSON shape (`PostHog/posthog:rust/feature-flags/src/flags/flag_models.rs` and
//! `src/cohorts/cohort_operations.rs`).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::properties::PropertyFilter;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlagDefinition {
    pub id: i64,
    pub key: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub filters: FlagFilters,
    #[serde(default = "yes")]
    pub active: bool,
    #[serde(default)]
    pub deleted: bool,
    #[serde(default)]
    pub ensure_experience_continuity: bool,
    #[serde(default)]
    pub version: i64,
    /// `client`, `server`, `all`, or none (no restriction).
    #[serde(default)]
    pub evaluation_runtime: Option<String>,
    /// Tags; a flag with tags is evaluated only for requests sharing one of them.
    #[serde(default)]
    pub evaluation_contexts: Vec<String>,
    /// `distinct_id` (default) or `device_id`.
    #[serde(default)]
    pub bucketing_identifier: Option<String>,
}

fn yes() -> bool {
    true
}

impl FlagDefinition {
    /// A new flag as the product surfaces create them (experiments, early access, surveys):
    /// the store assigns its id and version.
    pub fn new(key: String, name: String, filters: FlagFilters, active: bool) -> FlagDefinition {
        FlagDefinition {
            id: 0,
            key,
            name,
            filters,
            active,
            deleted: false,
            ensure_experience_continuity: false,
            version: 0,
            evaluation_runtime: None,
            evaluation_contexts: Vec::new(),
            bucketing_identifier: None,
        }
    }
}

impl Condition {
    /// A condition with these property filters and rollout (`None`: everyone matching).
    pub fn new(properties: Vec<PropertyFilter>, rollout_percentage: Option<f64>) -> Condition {
        Condition {
            properties,
            rollout_percentage,
            variant: None,
            aggregation_group_type_index: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlagFilters {
    #[serde(default)]
    pub groups: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multivariate: Option<Multivariate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregation_group_type_index: Option<u8>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub payloads: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub super_groups: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_enrollment: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holdout: Option<Holdout>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub properties: Vec<PropertyFilter>,
    /// `None` means 100 %.
    #[serde(default)]
    pub rollout_percentage: Option<f64>,
    #[serde(default)]
    pub variant: Option<String>,
    /// Absent: inherit the flag's aggregation; `null`: persons; a number: that group type.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub aggregation_group_type_index: Option<Option<u8>>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PropertyFilter>, D::Error> {
    Ok(Option::<Vec<PropertyFilter>>::deserialize(d)?.unwrap_or_default())
}

/// Distinguishes an explicit `null` (`Some(None)`) from an absent field (`None`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<u8>>, D::Error> {
    Ok(Some(Option::<u8>::deserialize(d)?))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Multivariate {
    pub variants: Vec<Variant>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub rollout_percentage: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holdout {
    pub id: i64,
    pub exclusion_percentage: f64,
}

/// A project's cohorts by id. Every cohort filter a request evaluates looks its cohort up
/// here: aHash with keys drawn per process, a fraction of SipHash's cost.
pub type Cohorts = std::collections::HashMap<i64, CohortDefinition, ahash::RandomState>;

/// The static cohorts each distinct id is listed in; looked up once a request, with the
/// request's distinct ids (aHash with keys drawn per process, as [`Cohorts`]).
pub type StaticMembers = std::collections::HashMap<String, Vec<i64>, ahash::RandomState>;

/// Builds the hashers of the maps one request makes, keyed by the flag set's own ids (flags,
/// cohorts): aHash with fixed keys. The keys come from the definitions, not from the request,
/// so nothing a caller sends can crowd them; and drawing keys for each map was a measurable
/// part of every request (three maps a request).
pub type RequestIdHasher = std::hash::BuildHasherDefault<ahash::AHasher>;

/// The static cohorts one subject is listed in.
pub type CohortIds = std::collections::HashSet<i64, RequestIdHasher>;

/// A cohort: dynamic (a property tree) or static (a list of distinct ids).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortDefinition {
    pub id: i64,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub is_static: bool,
    /// `{properties: {type: AND|OR, values: [{type: AND|OR|property, values: [filters]}]}}`.
    #[serde(default)]
    pub filters: Option<CohortFilters>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortFilters {
    pub properties: CohortGroup,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CohortNode {
    Group(CohortGroup),
    Filter(PropertyFilter),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortGroup {
    #[serde(rename = "type")]
    pub kind: String,
    pub values: Vec<CohortNode>,
}
