//! One activity entry on its way to one webhook: the exact body sent each time, its state,
//! when it is next tried and every attempt made.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use corvid_activity::ActivityEntry;

/// Attempts kept per delivery (the newest); older ones are dropped.
const KEPT_ATTEMPTS: usize = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for its first attempt or a retry.
    Pending,
    /// A receiver answered 2xx.
    Delivered,
    /// Every scheduled retry failed.
    Failed,
}

/// One POST to the receiver and what came of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub id: Uuid,
    /// 1 for the first attempt of the delivery, counting redeliveries on.
    pub number: u32,
    pub attempted_at: DateTime<Utc>,
    /// The receiver's status; `None` when no answer came (refused, timed out, unreachable).
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub duration_ms: u64,
    pub success: bool,
    /// Asked for by a user (redeliver), not by the schedule.
    pub redelivery: bool,
}

/// A delivery: its id is the same on every attempt, so receivers can drop duplicates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: Uuid,
    pub webhook_id: Uuid,
    pub entry_id: Uuid,
    pub event_type: String,
    pub created_at: DateTime<Utc>,
    /// The JSON body, byte for byte what each attempt sends.
    pub body: String,
    pub state: DeliveryState,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Failed attempts since the delivery was made or last redelivered.
    pub failures: u32,
    /// The next attempt is a user's redelivery (sent even while the webhook is off).
    #[serde(default)]
    pub redelivery: bool,
    pub attempts: Vec<Attempt>,
}

/// A delivery waiting to be tried, in the queue the dispatcher reads (kept apart from the
/// deliveries so reading what is due does not read every delivery ever made).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Queued {
    pub webhook_id: Uuid,
    pub entry_id: Uuid,
    pub next_attempt_at: DateTime<Utc>,
    /// Sent even while the webhook is off (a user's redelivery).
    #[serde(default)]
    pub redelivery: bool,
}

/// How far the dispatcher has read a project's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    pub entry_id: Uuid,
}

/// A delivery's key among the project's deliveries: webhook, then entry (time-ordered).
pub fn key(webhook_id: Uuid, entry_id: Uuid) -> String {
    format!("{webhook_id}/{entry_id}")
}

/// The event type of an entry: `<scope>.<activity>`.
pub fn event_type(entry: &ActivityEntry) -> String {
    format!("{}.{}", entry.scope, entry.activity)
}

impl Delivery {
    /// The delivery of `entry` to the webhook `webhook_id`. Its id is derived from both, so
    /// making it twice (two passes over the same entries) yields the same delivery.
    pub fn of(webhook_id: Uuid, entry: &ActivityEntry, now: DateTime<Utc>) -> Delivery {
        let id = Uuid::new_v5(&webhook_id, entry.id.as_bytes());
        let event_type = event_type(entry);
        let body = serde_json::json!({
            "id": id,
            "event_type": event_type,
            "created_at": entry.created_at,
            "data": entry.api_json(),
        })
        .to_string();
        Delivery {
            id,
            webhook_id,
            entry_id: entry.id,
            event_type,
            created_at: now,
            body,
            state: DeliveryState::Pending,
            next_attempt_at: Some(now),
            failures: 0,
            redelivery: false,
            attempts: Vec::new(),
        }
    }

    pub fn key(&self) -> String {
        key(self.webhook_id, self.entry_id)
    }

    pub fn queued(&self) -> Option<Queued> {
        Some(Queued {
            webhook_id: self.webhook_id,
            entry_id: self.entry_id,
            next_attempt_at: self.next_attempt_at?,
            redelivery: self.redelivery,
        })
    }

    /// Records an attempt's outcome and schedules what follows: nothing after a success, the
    /// next retry after a failure, or nothing more once `schedule` is used up (`Failed`).
    pub fn settle(&mut self, outcome: Outcome, now: DateTime<Utc>, schedule: &[Duration]) {
        let number = self
            .attempts
            .last()
            .map_or(1, |a| a.number.saturating_add(1));
        let success = outcome.success();
        self.attempts.push(Attempt {
            id: Uuid::new_v5(&self.id, &number.to_be_bytes()),
            number,
            attempted_at: now,
            status_code: outcome.status_code,
            error: outcome.error,
            duration_ms: outcome.duration_ms,
            success,
            redelivery: self.redelivery,
        });
        if self.attempts.len() > KEPT_ATTEMPTS {
            let extra = self.attempts.len() - KEPT_ATTEMPTS;
            self.attempts.drain(..extra);
        }
        self.redelivery = false;
        if success {
            self.state = DeliveryState::Delivered;
            self.next_attempt_at = None;
            return;
        }
        self.failures = self.failures.saturating_add(1);
        let wait = usize::try_from(self.failures - 1)
            .ok()
            .and_then(|i| schedule.get(i));
        let retry_at = wait
            .and_then(|w| chrono::Duration::from_std(*w).ok())
            .and_then(|w| now.checked_add_signed(w));
        match retry_at {
            Some(at) => {
                self.state = DeliveryState::Pending;
                self.next_attempt_at = Some(at);
            }
            None => {
                self.state = DeliveryState::Failed;
                self.next_attempt_at = None;
            }
        }
    }

    /// Queues the delivery again at once, as a user's redelivery.
    pub fn redeliver(&mut self, now: DateTime<Utc>) {
        self.state = DeliveryState::Pending;
        self.failures = 0;
        self.redelivery = true;
        self.next_attempt_at = Some(now);
    }
}

/// What one POST came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub duration_ms: u64,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.status_code.is_some_and(|s| (200..300).contains(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_activity::{Actor, Recorded};

    fn entry() -> ActivityEntry {
        Recorded {
            project_id: 1,
            actor: &Actor::system(),
            scope: "FeatureFlag",
            item_id: "7".into(),
            name: Some("beta".into()),
            before: None,
            after: &serde_json::json!({"key": "beta"}),
        }
        .entry()
        .expect("a creation")
    }

    fn failed(code: u16) -> Outcome {
        Outcome {
            status_code: Some(code),
            error: None,
            duration_ms: 3,
        }
    }

    #[test]
    fn the_same_entry_and_webhook_make_the_same_delivery() {
        let (hook, e, now) = (Uuid::now_v7(), entry(), Utc::now());
        assert_eq!(
            Delivery::of(hook, &e, now).id,
            Delivery::of(hook, &e, now).id
        );
        assert_ne!(
            Delivery::of(hook, &e, now).id,
            Delivery::of(Uuid::now_v7(), &e, now).id
        );
        let body: serde_json::Value =
            serde_json::from_str(&Delivery::of(hook, &e, now).body).expect("json");
        assert_eq!(body["event_type"], "FeatureFlag.created");
        assert_eq!(body["data"]["item_id"], "7");
    }

    #[test]
    fn failures_follow_the_schedule_then_give_up() {
        let schedule = [Duration::from_secs(10), Duration::from_secs(60)];
        let now = Utc::now();
        let mut d = Delivery::of(Uuid::now_v7(), &entry(), now);
        d.settle(failed(500), now, &schedule);
        assert_eq!(d.state, DeliveryState::Pending);
        assert_eq!(d.next_attempt_at, Some(now + chrono::Duration::seconds(10)));
        d.settle(failed(502), now, &schedule);
        assert_eq!(d.next_attempt_at, Some(now + chrono::Duration::seconds(60)));
        d.settle(failed(503), now, &schedule);
        assert_eq!((d.state, d.next_attempt_at), (DeliveryState::Failed, None));
        d.redeliver(now);
        d.settle(failed(200), now, &schedule);
        assert_eq!(d.state, DeliveryState::Delivered);
        let numbers: Vec<_> = d
            .attempts
            .iter()
            .map(|a| (a.number, a.redelivery))
            .collect();
        assert_eq!(numbers, vec![(1, false), (2, false), (3, false), (4, true)]);
    }
}
