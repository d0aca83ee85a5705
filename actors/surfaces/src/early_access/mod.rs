//! Early-access features (as in PostHog): a feature in a release stage, linked
//! to a boolean person flag. While the feature is in an active stage (alpha, beta, general
//! availability) its flag carries `filters.feature_enrollment = true`, so a person's
//! `$feature_enrollment/<flag key>` property (set by the SDK's opt-in event) decides the flag
//! for them before any release condition. Going to general availability with `rollout_to_all`
//! turns the flag on for everyone instead.
//!
//! [`EarlyAccess`] is the one door.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::surface::RecordError;
use corvid_activity::{acting_as, Actor};
use corvid_flags::{Condition, FlagDefinition, FlagFilters};
use corvid_flags::{FlagRecord, OwnedFlags};
use corvid_kernel::{blocking, DefinitionRecords};

/// A feature's release stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    Draft,
    Concept,
    Alpha,
    Beta,
    GeneralAvailability,
    Archived,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Draft,
        Stage::Concept,
        Stage::Alpha,
        Stage::Beta,
        Stage::GeneralAvailability,
        Stage::Archived,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Draft => "draft",
            Stage::Concept => "concept",
            Stage::Alpha => "alpha",
            Stage::Beta => "beta",
            Stage::GeneralAvailability => "general-availability",
            Stage::Archived => "archived",
        }
    }

    /// Parses a stage name; the error is the 400 the APIs answer.
    pub fn parse(text: &str) -> Result<Stage, RecordError> {
        Stage::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                RecordError::invalid(
                    format!(
                        "\"{text}\" is not a valid stage. Use one of: {}.",
                        Stage::ALL.map(Stage::as_str).join(", ")
                    ),
                    "stage",
                )
            })
    }

    /// Stages in which people can opt in (the flag honours enrollment).
    fn enrolls(self) -> bool {
        matches!(
            self,
            Stage::Alpha | Stage::Beta | Stage::GeneralAvailability
        )
    }
}

/// A stored early-access feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Feature {
    pub id: Uuid,
    pub project_id: u64,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub stage: Stage,
    #[serde(default)]
    pub documentation_url: String,
    #[serde(default)]
    pub feature_flag_id: Option<i64>,
    /// Free JSON the site shows with the feature (e.g. screenshots, copy).
    #[serde(default)]
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

/// A create or update body; on create `name` and `stage` are required.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureChanges {
    pub name: Option<String>,
    pub description: Option<String>,
    pub stage: Option<String>,
    pub documentation_url: Option<String>,
    pub feature_flag_id: Option<i64>,
    pub payload: Option<Value>,
    /// With `stage: general-availability`: release the flag to everyone.
    pub rollout_to_all: Option<bool>,
    /// Accepted for PostHog compatibility; Corvid has no folders.
    #[serde(rename = "_create_in_folder")]
    pub create_in_folder: Option<Value>,
}

/// A feature with its flag, ready to render.
#[derive(Debug, Clone)]
pub struct FeatureView {
    pub feature: Feature,
    pub flag: Option<FlagRecord>,
}

impl FeatureView {
    /// The admin API's shape.
    pub fn admin_json(&self) -> Value {
        let f = &self.feature;
        json!({
            "id": f.id,
            "feature_flag": self.flag.as_ref().map(FlagRecord::summary),
            "name": f.name,
            "description": f.description,
            "stage": f.stage,
            "documentation_url": f.documentation_url,
            "payload": f.payload,
            "created_at": f.created_at,
        })
    }

    /// The public shape posthog-js reads.
    pub fn public_json(&self) -> Value {
        let f = &self.feature;
        json!({
            "id": f.id,
            "name": f.name,
            "description": f.description,
            "stage": f.stage,
            "documentationUrl": f.documentation_url,
            "flagKey": self.flag.as_ref().map(|r| r.definition.key.clone()),
            "payload": f.payload,
        })
    }
}

/// The early-access facade. Cheap to clone.
#[derive(Clone)]
pub struct EarlyAccess {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn DefinitionRecords<Feature>>,
    flags: Arc<OwnedFlags>,
    writes: Mutex<()>,
}

/// Django's `slugify`, which PostHog uses for the key of a feature's new flag.
pub fn slugify(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().to_lowercase().chars() {
        if c.is_alphanumeric() || c == '_' {
            out.push(c);
        } else if (c.is_whitespace() || c == '-') && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches(|c| c == '-' || c == '_').to_string()
}

impl EarlyAccess {
    pub fn new(store: Arc<dyn DefinitionRecords<Feature>>, flags: Arc<OwnedFlags>) -> EarlyAccess {
        EarlyAccess {
            inner: Arc::new(Inner {
                store,
                flags,
                writes: Mutex::new(()),
            }),
        }
    }

    pub async fn list(&self, project: u64) -> Result<Vec<FeatureView>, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.views(project, None)).await
    }

    pub async fn get(&self, project: u64, id: Uuid) -> Result<FeatureView, RecordError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let feature = inner.feature(project, id)?;
            inner.view(project, feature)
        })
        .await
    }

    pub async fn create(
        &self,
        project: u64,
        actor: &Actor,
        changes: FeatureChanges,
    ) -> Result<FeatureView, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let feature = inner.create(project, changes)?;
                inner.view(project, feature)
            })
        })
        .await
    }

    pub async fn update(
        &self,
        project: u64,
        actor: &Actor,
        id: Uuid,
        changes: FeatureChanges,
    ) -> Result<FeatureView, RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let feature = inner.update(project, id, changes)?;
                inner.view(project, feature)
            })
        })
        .await
    }

    /// Deletes the feature; its flag stays, without the enrollment marker.
    pub async fn delete(&self, project: u64, actor: &Actor, id: Uuid) -> Result<(), RecordError> {
        let inner = Arc::clone(&self.inner);
        let actor = actor.clone();
        blocking(move || {
            acting_as(&actor, || {
                let _guard = inner.lock();
                let feature = inner.feature(project, id)?;
                if let Some(flag) = feature.feature_flag_id {
                    inner
                        .flags
                        .modify(project, flag, |f| f.filters.feature_enrollment = None)?;
                }
                inner.store.delete(project, &id.to_string())?;
                Ok(())
            })
        })
        .await
    }

    /// The public list: features in `stages` (`beta` when empty).
    pub async fn public(
        &self,
        project: u64,
        stages: Vec<Stage>,
    ) -> Result<Vec<Value>, RecordError> {
        let stages = if stages.is_empty() {
            vec![Stage::Beta]
        } else {
            stages
        };
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            Ok(inner
                .views(project, Some(&stages))?
                .iter()
                .map(FeatureView::public_json)
                .collect())
        })
        .await
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn feature(&self, project: u64, id: Uuid) -> Result<Feature, RecordError> {
        self.store
            .get(project, &id.to_string())?
            .ok_or(RecordError::NotFound {
                what: "Early access feature",
            })
    }

    fn view(&self, project: u64, feature: Feature) -> Result<FeatureView, RecordError> {
        let flag = match feature.feature_flag_id {
            Some(id) => self.flags.flag(project, id)?,
            None => None,
        };
        Ok(FeatureView { feature, flag })
    }

    fn views(
        &self,
        project: u64,
        stages: Option<&[Stage]>,
    ) -> Result<Vec<FeatureView>, RecordError> {
        let flags = self.flags.flags(project)?;
        let mut features = self.store.list(project)?;
        features.retain(|f| stages.is_none_or(|s| s.contains(&f.stage)));
        features.sort_by_key(|f| f.created_at);
        Ok(features
            .into_iter()
            .map(|feature| FeatureView {
                flag: feature
                    .feature_flag_id
                    .and_then(|id| flags.iter().find(|f| f.definition.id == id).cloned()),
                feature,
            })
            .collect())
    }

    fn create(&self, project: u64, c: FeatureChanges) -> Result<Feature, RecordError> {
        let name = c.name.clone().unwrap_or_default();
        let stage = c
            .stage
            .as_deref()
            .ok_or_else(|| RecordError::invalid("This field is required.", "stage"))
            .and_then(Stage::parse)?;
        let mut feature = Feature {
            id: Uuid::now_v7(),
            project_id: project,
            name,
            description: String::new(),
            stage,
            documentation_url: String::new(),
            feature_flag_id: None,
            payload: Value::Object(Map::new()),
            created_at: Utc::now(),
        };
        self.change_fields(&mut feature, &c)?;
        let (flag, created) = match c.feature_flag_id {
            Some(id) => (self.linkable_flag(project, id, None)?, false),
            None => {
                if self
                    .flags
                    .live_flag_by_key(project, &slugify(&feature.name))?
                    .is_some()
                {
                    return Err(RecordError::invalid(
                        "There is already a feature flag with this key.",
                        "name",
                    ));
                }
                let filters = FlagFilters {
                    groups: vec![Condition::new(Vec::new(), Some(0.0))],
                    ..FlagFilters::default()
                };
                let flag = self.flags.create(
                    project,
                    FlagDefinition::new(
                        slugify(&feature.name),
                        format!("Feature Flag for Feature {}", feature.name),
                        filters,
                        true,
                    ),
                )?;
                (flag, true)
            }
        };
        feature.feature_flag_id = Some(flag.definition.id);
        let saved = self
            .sync_flag(project, &feature, false)
            .and_then(|()| Ok(self.store.put(project, &feature.id.to_string(), &feature)?));
        if let Err(e) = saved {
            if created {
                self.flags.withdraw(project, flag.definition.id);
            }
            return Err(e);
        }
        Ok(feature)
    }

    fn update(&self, project: u64, id: Uuid, c: FeatureChanges) -> Result<Feature, RecordError> {
        let mut feature = self.feature(project, id)?;
        if let Some(stage) = c.stage.as_deref() {
            feature.stage = Stage::parse(stage)?;
        }
        self.change_fields(&mut feature, &c)?;
        if let Some(flag_id) = c.feature_flag_id {
            if Some(flag_id) != feature.feature_flag_id {
                self.linkable_flag(project, flag_id, Some(feature.id))?;
                if let Some(old) = feature.feature_flag_id {
                    self.flags
                        .modify(project, old, |f| f.filters.feature_enrollment = None)?;
                }
                feature.feature_flag_id = Some(flag_id);
            }
        }
        let rollout_to_all = c.rollout_to_all == Some(true);
        if rollout_to_all && feature.stage != Stage::GeneralAvailability {
            return Err(RecordError::invalid(
                "rollout_to_all can only be used with the general-availability stage.",
                "rollout_to_all",
            ));
        }
        self.sync_flag(project, &feature, rollout_to_all)?;
        self.store.put(project, &feature.id.to_string(), &feature)?;
        Ok(feature)
    }

    fn change_fields(&self, feature: &mut Feature, c: &FeatureChanges) -> Result<(), RecordError> {
        if let Some(name) = &c.name {
            if name.trim().is_empty() {
                return Err(RecordError::invalid("This field may not be blank.", "name"));
            }
            if name.chars().count() > 200 {
                return Err(RecordError::invalid(
                    "Ensure this field has no more than 200 characters.",
                    "name",
                ));
            }
            feature.name = name.clone();
        }
        if feature.name.trim().is_empty() {
            return Err(RecordError::invalid("This field is required.", "name"));
        }
        if let Some(description) = &c.description {
            feature.description = description.clone();
        }
        if let Some(url) = &c.documentation_url {
            let valid = url.is_empty()
                || (url.len() <= 800
                    && url::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https")));
            if !valid {
                return Err(RecordError::invalid(
                    "Enter a valid URL.",
                    "documentation_url",
                ));
            }
            feature.documentation_url = url.clone();
        }
        if let Some(payload) = &c.payload {
            feature.payload = payload.clone();
        }
        Ok(())
    }

    /// A flag a feature may link: live, boolean, for persons, and not linked already.
    fn linkable_flag(
        &self,
        project: u64,
        id: i64,
        feature: Option<Uuid>,
    ) -> Result<FlagRecord, RecordError> {
        let flag = self.flags.live_flag(project, id)?.ok_or_else(|| {
            RecordError::invalid(
                "Feature Flag with this ID does not exist",
                "feature_flag_id",
            )
        })?;
        let filters = &flag.definition.filters;
        let grouped = filters.aggregation_group_type_index.is_some()
            || filters
                .groups
                .iter()
                .any(|g| g.aggregation_group_type_index.flatten().is_some());
        if grouped {
            return Err(RecordError::invalid(
                "Group-based feature flags are not supported for Early Access Features.",
                "feature_flag_id",
            ));
        }
        if filters
            .multivariate
            .as_ref()
            .is_some_and(|m| !m.variants.is_empty())
        {
            return Err(RecordError::invalid(
                "Multivariate feature flags are not supported for Early Access Features.",
                "feature_flag_id",
            ));
        }
        let taken = self
            .store
            .list(project)?
            .iter()
            .any(|f| f.feature_flag_id == Some(id) && Some(f.id) != feature);
        if taken {
            return Err(RecordError::invalid(
                format!(
                    "Linked feature flag {} already has a feature attached to it.",
                    flag.definition.key
                ),
                "feature_flag_id",
            ));
        }
        Ok(flag)
    }

    /// Puts the flag in line with the feature's stage.
    fn sync_flag(
        &self,
        project: u64,
        feature: &Feature,
        rollout_to_all: bool,
    ) -> Result<(), RecordError> {
        let Some(id) = feature.feature_flag_id else {
            return Ok(());
        };
        let enrolls = feature.stage.enrolls() && !rollout_to_all;
        self.flags.modify(project, id, |f| {
            f.filters.super_groups.clear();
            f.filters.feature_enrollment = enrolls.then_some(true);
            if rollout_to_all {
                f.filters.groups = vec![Condition {
                    aggregation_group_type_index: Some(None),
                    ..Condition::new(Vec::new(), Some(100.0))
                }];
                f.active = true;
            }
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
