//! Reverting a flag change (PostHog's `POST …/feature_flags/{id}/revert/`): every flag
//! change's activity entry keeps the whole flag after it with its version, so undoing a change
//! puts back the version the entry before it kept.

use std::sync::Arc;

use corvid_activity::{changes_between, ActivityEntry, ActivityQuery, Actor};
use corvid_kernel::{blocking, StoreError};
use uuid::Uuid;

use super::model::FlagDefinition;
use super::store::FlagRecord;
use super::validate::validate_flag;
use super::Flags;

/// How far back a revert without an entry id looks for the newest revertible change
/// (PostHog's window).
const NEWEST_WINDOW: usize = 50;

/// What a revert did.
#[derive(Debug, Clone)]
pub struct Reverted {
    pub flag: FlagRecord,
    /// The entry whose change was undone.
    pub reverted: Uuid,
    /// The version the flag's definition was put back to.
    pub restored_version: i64,
    /// The fields that changed back.
    pub applied_fields: Vec<String>,
}

fn not_found(what: &str) -> StoreError {
    StoreError::NotFound { what: what.into() }
}

/// Whether an entry's change can be undone: an update or an earlier revert (a creation has
/// no version before it; a deleted flag is not live).
fn revertible(entry: &ActivityEntry) -> bool {
    matches!(entry.activity.as_str(), "updated" | "reverted") && entry.snapshot.is_some()
}

impl Flags {
    /// Undoes the change of activity entry `entry_id` of this flag (`None`: the newest
    /// revertible change among its last 50 entries) by putting back the version before it, as
    /// the flag's next version; the revert is itself logged (`reverted`).
    pub async fn revert_flag(
        &self,
        project: u64,
        id: i64,
        actor: &Actor,
        entry_id: Option<Uuid>,
    ) -> Result<Reverted, StoreError> {
        let (store, persons, log) = (
            Arc::clone(&self.store),
            Arc::clone(&self.persons),
            Arc::clone(&self.activity),
        );
        let actor = actor.clone();
        blocking(move || {
            let current = store
                .live_flag(project, id)?
                .ok_or_else(|| not_found("Feature flag"))?;
            let of_flag = ActivityQuery {
                scopes: vec!["FeatureFlag".into()],
                item_id: Some(id.to_string()),
                ..ActivityQuery::default()
            };
            let target = match entry_id {
                Some(entry_id) => log
                    .entry(project, entry_id)?
                    .filter(|e| e.scope == "FeatureFlag" && e.item_id == id.to_string())
                    .ok_or_else(|| not_found("Activity log entry"))?,
                None => log
                    .query(
                        project,
                        &ActivityQuery {
                            limit: NEWEST_WINDOW,
                            ..of_flag.clone()
                        },
                    )?
                    .entries
                    .into_iter()
                    .find(revertible)
                    .ok_or_else(|| {
                        StoreError::invalid(
                            "This flag has no change that can be reverted.",
                            "activity_log_id",
                        )
                    })?,
            };
            if !revertible(&target) {
                return Err(StoreError::invalid(
                    format!(
                        "A change of activity `{}` cannot be reverted.",
                        target.activity
                    ),
                    "activity_log_id",
                ));
            }
            let earlier = log
                .query(
                    project,
                    &ActivityQuery {
                        before: Some(target.id),
                        limit: 1,
                        ..of_flag
                    },
                )?
                .entries
                .into_iter()
                .next();
            let (restored, version) = earlier
                .and_then(|e| {
                    let definition: FlagDefinition = serde_json::from_value(e.snapshot?).ok()?;
                    Some((definition, e.version.unwrap_or_default()))
                })
                .ok_or_else(|| {
                    StoreError::invalid(
                        "The version before this change is not in the activity log.",
                        "activity_log_id",
                    )
                })?;
            let json = |d: &FlagDefinition| serde_json::to_value(d).unwrap_or_default();
            let mut restored = restored;
            restored.deleted = false;
            let applied_fields =
                changes_between("FeatureFlag", &json(&current.definition), &json(&restored))
                    .into_iter()
                    .filter_map(|c| c.field)
                    .collect();
            let group_types = persons.group_type_count(project)?;
            let context = serde_json::json!({
                "reverted_activity_log_id": target.id,
                "restored_version": version,
            });
            let flag = store
                .restore_flag(project, id, &actor, restored, context, |d| {
                    validate_flag(d, group_types)
                })?
                .ok_or_else(|| not_found("Feature flag"))?;
            Ok(Reverted {
                flag,
                reverted: target.id,
                restored_version: version,
                applied_fields,
            })
        })
        .await
    }
}
