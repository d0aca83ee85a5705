//! The definitions API's rules: flag and cohort changes, their validation, and static cohort
//! members from CSV.

use std::sync::Arc;

use chrono::Utc;
use serde::Deserialize;

use super::model::{CohortDefinition, CohortFilters, FlagDefinition, FlagFilters};
use super::store::{CohortRecord, FlagRecord};
use super::validate::{validate_cohort, validate_flag};
use super::Flags;
use corvid_activity::Actor;
use corvid_kernel::{blocking, StoreError};

/// A flag create or update body in PostHog's shape; on update every field is optional.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FlagChanges {
    pub key: Option<String>,
    pub name: Option<String>,
    pub filters: Option<FlagFilters>,
    pub active: Option<bool>,
    pub deleted: Option<bool>,
    pub ensure_experience_continuity: Option<bool>,
    pub evaluation_runtime: Option<String>,
    #[serde(alias = "tags", alias = "evaluation_tags")]
    pub evaluation_contexts: Option<Vec<String>>,
    pub bucketing_identifier: Option<String>,
}

impl FlagChanges {
    fn apply(self, mut d: FlagDefinition) -> FlagDefinition {
        if let Some(v) = self.key {
            d.key = v;
        }
        if let Some(v) = self.name {
            d.name = v;
        }
        if let Some(v) = self.filters {
            d.filters = v;
        }
        if let Some(v) = self.active {
            d.active = v;
        }
        if let Some(v) = self.deleted {
            d.deleted = v;
        }
        if let Some(v) = self.ensure_experience_continuity {
            d.ensure_experience_continuity = v;
        }
        if let Some(v) = self.evaluation_runtime {
            d.evaluation_runtime = Some(v);
        }
        if let Some(v) = self.evaluation_contexts {
            d.evaluation_contexts = v;
        }
        if let Some(v) = self.bucketing_identifier {
            d.bucketing_identifier = Some(v);
        }
        d
    }
}

/// A cohort create or update: JSON, or static members from CSV (see [`CohortChanges::from_csv`]).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CohortChanges {
    pub name: Option<String>,
    /// Accepted for PostHog compatibility; not stored.
    pub description: Option<String>,
    pub filters: Option<CohortFilters>,
    pub is_static: Option<bool>,
    pub distinct_ids: Option<Vec<String>>,
}

impl CohortChanges {
    /// A static cohort's members from CSV: the first column of each line, a `distinct_id`
    /// header row skipped.
    pub fn from_csv(bytes: &[u8], name: Option<String>) -> Result<CohortChanges, StoreError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| StoreError::invalid("CSV must be UTF-8.", "distinct_ids"))?;
        let ids: Vec<String> = text
            .lines()
            .filter_map(|l| l.split(',').next())
            .map(|c| c.trim().trim_matches('"').to_string())
            .filter(|c| !c.is_empty())
            .enumerate()
            .filter(|(i, c)| !(*i == 0 && c.eq_ignore_ascii_case("distinct_id")))
            .map(|(_, c)| c)
            .collect();
        Ok(CohortChanges {
            name,
            is_static: Some(true),
            distinct_ids: Some(ids),
            ..CohortChanges::default()
        })
    }

    /// Applies the changes; a cohort is either static (members) or dynamic (filters).
    fn apply(self, mut record: CohortRecord) -> Result<CohortRecord, StoreError> {
        if let Some(name) = self.name {
            record.definition.name = name;
        }
        if let Some(is_static) = self.is_static {
            record.definition.is_static = is_static;
        }
        if let Some(filters) = self.filters {
            record.definition.filters = Some(filters);
        }
        if let Some(ids) = self.distinct_ids {
            record.static_distinct_ids = ids;
        }
        if record.definition.is_static && record.definition.filters.is_some() {
            return Err(StoreError::invalid(
                "A static cohort has members, not filters.",
                "filters",
            ));
        }
        if !record.definition.is_static && record.definition.filters.is_none() {
            return Err(StoreError::invalid(
                "A cohort needs filters or is_static with distinct_ids.",
                "filters",
            ));
        }
        Ok(record)
    }
}

fn not_found(what: &str) -> StoreError {
    StoreError::NotFound { what: what.into() }
}

impl Flags {
    /// The project's live flags.
    pub async fn list_flags(&self, project: u64) -> Result<Vec<FlagRecord>, StoreError> {
        let store = Arc::clone(&self.store);
        let mut flags = blocking(move || store.flags(project)).await?;
        flags.retain(|f| !f.definition.deleted);
        Ok(flags)
    }

    pub async fn flag(&self, project: u64, id: i64) -> Result<FlagRecord, StoreError> {
        let store = Arc::clone(&self.store);
        blocking(move || store.live_flag(project, id))
            .await?
            .ok_or_else(|| not_found("Feature flag"))
    }

    /// Creates a flag (a key is required); its version starts at 1.
    pub async fn create_flag(
        &self,
        project: u64,
        actor: &Actor,
        changes: FlagChanges,
    ) -> Result<FlagRecord, StoreError> {
        if changes.key.as_deref().is_none_or(str::is_empty) {
            return Err(StoreError::invalid("This field is required.", "key"));
        }
        let definition = changes.apply(FlagDefinition::new(
            String::new(),
            String::new(),
            FlagFilters::default(),
            true,
        ));
        let (store, persons) = (Arc::clone(&self.store), Arc::clone(&self.persons));
        let actor = actor.clone();
        blocking(move || {
            validate_flag(&definition, persons.group_type_count(project)?)?;
            store.create_flag(project, &actor, definition)
        })
        .await
    }

    /// Updates a live flag; its version goes up.
    pub async fn update_flag(
        &self,
        project: u64,
        id: i64,
        actor: &Actor,
        changes: FlagChanges,
    ) -> Result<FlagRecord, StoreError> {
        let (store, persons) = (Arc::clone(&self.store), Arc::clone(&self.persons));
        let actor = actor.clone();
        blocking(move || {
            let group_types = persons.group_type_count(project)?;
            store
                .update_flag(project, id, &actor, |definition| {
                    let changed = changes.clone().apply(definition.clone());
                    validate_flag(&changed, group_types)?;
                    *definition = changed;
                    Ok(())
                })?
                .ok_or_else(|| not_found("Feature flag"))
        })
        .await
    }

    /// Deletes a flag softly (it keeps its id and history).
    pub async fn delete_flag(
        &self,
        project: u64,
        id: i64,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let store = Arc::clone(&self.store);
        let actor = actor.clone();
        blocking(move || {
            store
                .modify_flag(project, id, &actor, |f| f.deleted = true, |_| Ok(()))?
                .ok_or_else(|| not_found("Feature flag"))
                .map(|_| ())
        })
        .await
    }

    /// The project's live cohorts.
    pub async fn list_cohorts(&self, project: u64) -> Result<Vec<CohortRecord>, StoreError> {
        let store = Arc::clone(&self.store);
        let mut cohorts = blocking(move || store.cohorts(project)).await?;
        cohorts.retain(|c| !c.deleted);
        Ok(cohorts)
    }

    pub async fn cohort(&self, project: u64, id: i64) -> Result<CohortRecord, StoreError> {
        let store = Arc::clone(&self.store);
        blocking(move || store.cohort(project, id))
            .await?
            .filter(|c| !c.deleted)
            .ok_or_else(|| not_found("Cohort"))
    }

    pub async fn create_cohort(
        &self,
        project: u64,
        actor: &Actor,
        changes: CohortChanges,
    ) -> Result<CohortRecord, StoreError> {
        let blank = CohortRecord {
            definition: CohortDefinition {
                id: 0,
                name: String::new(),
                is_static: false,
                filters: None,
            },
            project_id: project,
            static_distinct_ids: Vec::new(),
            deleted: false,
            created_at: Utc::now(),
        };
        let record = changes.apply(blank)?;
        self.save_cohort(project, actor, record).await
    }

    pub async fn update_cohort(
        &self,
        project: u64,
        id: i64,
        actor: &Actor,
        changes: CohortChanges,
    ) -> Result<CohortRecord, StoreError> {
        let old = self.cohort(project, id).await?;
        let record = changes.apply(old)?;
        self.save_cohort(project, actor, record).await
    }

    pub async fn delete_cohort(
        &self,
        project: u64,
        id: i64,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let mut record = self.cohort(project, id).await?;
        record.deleted = true;
        let store = Arc::clone(&self.store);
        let actor = actor.clone();
        blocking(move || store.save_cohort(project, &actor, record).map(|_| ())).await
    }

    async fn save_cohort(
        &self,
        project: u64,
        actor: &Actor,
        record: CohortRecord,
    ) -> Result<CohortRecord, StoreError> {
        let store = Arc::clone(&self.store);
        let actor = actor.clone();
        blocking(move || {
            validate_cohort(&record.definition, &store.cohorts(project)?)?;
            store.save_cohort(project, &actor, record)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_members_skip_the_header_and_blank_cells() {
        let changes = CohortChanges::from_csv(
            b"distinct_id,email\n\"ann\",a@x\n\nbob\n ,x\n",
            Some("VIP".into()),
        )
        .expect("csv");
        assert_eq!(changes.distinct_ids, Some(vec!["ann".into(), "bob".into()]));
        assert_eq!(changes.is_static, Some(true));
        assert!(CohortChanges::from_csv(b"\xff\xfe", None).is_err());
    }

    #[test]
    fn a_cohort_is_static_or_dynamic_never_both() {
        let blank = CohortRecord {
            definition: CohortDefinition {
                id: 1,
                name: "c".into(),
                is_static: false,
                filters: None,
            },
            project_id: 1,
            static_distinct_ids: Vec::new(),
            deleted: false,
            created_at: Utc::now(),
        };
        let filters: CohortFilters = serde_json::from_value(serde_json::json!({
            "properties": {"type": "AND", "values": []}}))
        .expect("filters");
        let both = CohortChanges {
            is_static: Some(true),
            filters: Some(filters),
            ..CohortChanges::default()
        };
        assert!(matches!(
            both.apply(blank.clone()),
            Err(StoreError::Invalid {
                attr: Some("filters"),
                ..
            })
        ));
        assert!(
            CohortChanges::default().apply(blank.clone()).is_err(),
            "neither"
        );
        let members = CohortChanges {
            is_static: Some(true),
            distinct_ids: Some(vec!["a".into()]),
            ..CohortChanges::default()
        };
        assert_eq!(
            members.apply(blank).expect("static").static_distinct_ids,
            vec!["a"]
        );
    }
}
