//! One activity-log entry in PostHog's shape: who (`Actor`), what (`scope`, `item_id`,
//! `activity`) and how (`Detail` with its field `changes`), plus, for scopes that keep
//! versions, the whole item after the change.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::diff::{changes_between, mask, Change};

/// Who made a change: a signed-in user (through a key, an OAuth token or a session) or
/// Corvid itself (background work such as retention or a scheduled job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Actor {
    /// The user's id; `None` for the system.
    pub id: Option<u64>,
    pub uuid: Option<Uuid>,
    pub email: Option<String>,
    pub first_name: String,
    pub is_system: bool,
}

impl Actor {
    pub fn user(id: u64, uuid: Uuid, email: &str, first_name: &str) -> Actor {
        Actor {
            id: Some(id),
            uuid: Some(uuid),
            email: Some(email.to_string()),
            first_name: first_name.to_string(),
            is_system: false,
        }
    }

    /// Corvid's own work (PostHog serializes it as the user "System").
    pub fn system() -> Actor {
        Actor {
            id: None,
            uuid: None,
            email: None,
            first_name: "System".into(),
            is_system: true,
        }
    }
}

/// What an entry says about the change (PostHog's `Detail`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Detail {
    pub name: Option<String>,
    pub short_id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub changes: Vec<Change>,
    /// What set the change off when it was not a person (a job, a revert).
    pub trigger: Option<Value>,
    /// Extra facts about the change (a revert names the entry it undid).
    pub context: Option<Value>,
}

/// A recorded change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivityEntry {
    /// Time-ordered (UUID v7): entries sort by id as they sort by time.
    pub id: Uuid,
    pub project_id: u64,
    pub user: Actor,
    /// `created`, `updated`, `deleted`, `reverted`, or a scope's own verb.
    pub activity: String,
    /// The kind of item, in PostHog's names: `FeatureFlag`, `Cohort`, `Endpoint`, …
    pub scope: String,
    pub item_id: String,
    pub detail: Detail,
    pub created_at: DateTime<Utc>,
    /// The whole item after the change (masked), for scopes that keep versions.
    #[serde(default)]
    pub snapshot: Option<Value>,
    /// The item's version after the change, for scopes that keep versions.
    #[serde(default)]
    pub version: Option<i64>,
}

impl Actor {
    /// The user as the API shows it, in PostHog's basic shape (the system as "System").
    pub fn api_json(&self) -> Value {
        if self.is_system {
            return serde_json::json!({"first_name": "System", "email": null, "is_system": true});
        }
        serde_json::json!({
            "id": self.id,
            "uuid": self.uuid,
            "first_name": self.first_name,
            "email": self.email,
            "is_system": false,
        })
    }
}

impl ActivityEntry {
    /// The entry as the API shows it (and a webhook delivery carries it).
    pub fn api_json(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "user": self.user.api_json(),
            "activity": self.activity,
            "scope": self.scope,
            "item_id": self.item_id,
            "detail": self.detail,
            "created_at": self.created_at,
            "is_system": self.user.is_system,
            "was_impersonated": false,
            "version": self.version,
        })
    }
}

/// The change an entry is made from: an item's JSON before (`None`: it was created) and after.
pub struct Recorded<'a> {
    pub project_id: u64,
    pub actor: &'a Actor,
    pub scope: &'a str,
    pub item_id: String,
    pub name: Option<String>,
    pub before: Option<&'a Value>,
    pub after: &'a Value,
}

impl Recorded<'_> {
    /// The entry for this change, or `None` when no recorded field changed. The activity is
    /// `created` without a before, `deleted` when the item's `deleted` flag turned on, and
    /// `updated` otherwise.
    pub fn entry(self) -> Option<ActivityEntry> {
        let turned_on = |v: Option<&Value>, field: &str| {
            v.and_then(|v| v.get(field)).and_then(Value::as_bool) == Some(true)
        };
        let (activity, changes) = match self.before {
            None => (
                "created",
                vec![Change {
                    kind: self.scope.to_string(),
                    action: "created".into(),
                    field: None,
                    before: Value::Null,
                    after: mask(self.scope, self.after),
                }],
            ),
            Some(before) => {
                let changes = changes_between(self.scope, before, self.after);
                if changes.is_empty() {
                    return None;
                }
                let deleted =
                    turned_on(Some(self.after), "deleted") && !turned_on(Some(before), "deleted");
                (if deleted { "deleted" } else { "updated" }, changes)
            }
        };
        Some(self.with(activity, changes))
    }

    /// An entry with the activity and changes given (a deletion of a whole item, a revert).
    pub fn with(self, activity: &str, changes: Vec<Change>) -> ActivityEntry {
        ActivityEntry {
            id: Uuid::now_v7(),
            project_id: self.project_id,
            user: self.actor.clone(),
            activity: activity.to_string(),
            scope: self.scope.to_string(),
            item_id: self.item_id,
            detail: Detail {
                name: self.name,
                changes,
                ..Detail::default()
            },
            created_at: Utc::now(),
            snapshot: None,
            version: None,
        }
    }
}

impl ActivityEntry {
    /// Keeps the whole item after the change and its version (flags keep every version, so a
    /// change can be reverted to the one before it).
    pub fn keeping(mut self, snapshot: Value, version: i64) -> ActivityEntry {
        self.snapshot = Some(snapshot);
        self.version = Some(version);
        self
    }

    /// Adds facts about the change to `detail.context`.
    pub fn with_context(mut self, context: Value) -> ActivityEntry {
        self.detail.context = Some(context);
        self
    }

    /// The entry for an item's removal (a hard delete, a person's erasure).
    pub fn removal(
        project_id: u64,
        actor: &Actor,
        scope: &str,
        item_id: String,
        name: Option<String>,
    ) -> ActivityEntry {
        Recorded {
            project_id,
            actor,
            scope,
            item_id,
            name,
            before: None,
            after: &Value::Null,
        }
        .with(
            "deleted",
            vec![Change {
                kind: scope.to_string(),
                action: "deleted".into(),
                field: None,
                before: Value::Null,
                after: Value::Null,
            }],
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ada() -> Actor {
        Actor::user(1, Uuid::nil(), "ada@example.com", "Ada")
    }

    #[test]
    fn an_update_records_each_changed_field_with_before_and_after() {
        let before = json!({"key": "k", "active": true, "filters": {"groups": [{"rollout_percentage": 10}]}, "version": 1});
        let after = json!({"key": "k", "active": true, "filters": {"groups": [{"rollout_percentage": 50}]}, "version": 2});
        let entry = Recorded {
            project_id: 3,
            actor: &ada(),
            scope: "FeatureFlag",
            item_id: "7".into(),
            name: Some("k".into()),
            before: Some(&before),
            after: &after,
        }
        .entry()
        .expect("a change");
        assert_eq!(entry.activity, "updated");
        assert_eq!(entry.detail.changes.len(), 1, "the version is bookkeeping");
        let change = &entry.detail.changes[0];
        assert_eq!(change.field.as_deref(), Some("filters"));
        assert_eq!(change.action, "changed");
        assert_eq!(change.before["groups"][0]["rollout_percentage"], 10);
        assert_eq!(change.after["groups"][0]["rollout_percentage"], 50);
    }

    #[test]
    fn nothing_changed_is_no_entry_and_a_soft_delete_is_a_deletion() {
        let v = json!({"key": "k", "deleted": false});
        let same = Recorded {
            project_id: 3,
            actor: &ada(),
            scope: "FeatureFlag",
            item_id: "7".into(),
            name: None,
            before: Some(&v),
            after: &v,
        };
        assert!(same.entry().is_none());
        let gone = json!({"key": "k", "deleted": true});
        let deleted = Recorded {
            project_id: 3,
            actor: &Actor::system(),
            scope: "FeatureFlag",
            item_id: "7".into(),
            name: None,
            before: Some(&v),
            after: &gone,
        }
        .entry()
        .expect("a change");
        assert_eq!(deleted.activity, "deleted");
        assert!(deleted.user.is_system);
    }

    #[test]
    fn a_creation_keeps_the_item_with_its_secrets_masked() {
        let after =
            json!({"name": "app", "client_secret": "s3cret", "redirect_uris": ["https://a"]});
        let entry = Recorded {
            project_id: 3,
            actor: &ada(),
            scope: "OAuthApplication",
            item_id: "x".into(),
            name: None,
            before: None,
            after: &after,
        }
        .entry()
        .expect("a creation");
        assert_eq!(entry.activity, "created");
        let text = serde_json::to_string(&entry).expect("json");
        assert!(!text.contains("s3cret"), "{text}");
        assert_eq!(entry.detail.changes[0].after["client_secret"], "masked");
    }
}
