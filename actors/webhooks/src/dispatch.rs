//! The dispatcher's pass: following each project's activity log into deliveries, picking
//! what is due, and recording what each attempt came to (see the crate's documentation).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use corvid_activity::{ActivityEntry, Actor};
use corvid_kernel::StoreError;

use super::delivery::{self, event_type, Cursor, Delivery, DeliveryState, Outcome};
use super::hook::Webhook;
use super::{Inner, WebhookError, CURSOR, LOOKBACK, PAGE, PASS, PRUNE_EVERY, SENDS_PER_PASS};

/// The smallest time-ordered id of the millisecond `t` (a lower bound for reading the log).
pub(super) fn floor_id(t: DateTime<Utc>) -> Uuid {
    let ms = u64::try_from(t.timestamp_millis()).unwrap_or(0);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

/// When a time-ordered id was taken.
pub(super) fn id_time(id: Uuid) -> Option<DateTime<Utc>> {
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    DateTime::from_timestamp(i64::try_from(secs).ok()?, nanos)
}

impl Inner {
    /// Reads every project's new entries and makes their deliveries; how many were made.
    pub(super) fn follow_logs(&self, now: DateTime<Utc>) -> Result<usize, WebhookError> {
        let mut by_project: HashMap<u64, Vec<Webhook>> = HashMap::new();
        for (project, hook) in self.stores.hooks.list_all()? {
            if hook.enabled {
                by_project.entry(project).or_default().push(hook);
            }
        }
        let mut made = 0;
        for (project, hooks) in by_project {
            made += self.follow(project, &hooks, now)?;
        }
        Ok(made)
    }

    pub(super) fn follow(
        &self,
        project: u64,
        hooks: &[Webhook],
        now: DateTime<Utc>,
    ) -> Result<usize, WebhookError> {
        let cursor = self
            .stores
            .cursors
            .get(project, CURSOR)?
            .map(|c| c.entry_id);
        let earliest = hooks.iter().map(|h| h.created_at).min().unwrap_or(now);
        let from = cursor
            .and_then(id_time)
            .map_or(earliest, |c| c.max(earliest));
        let mut after = floor_id(from - LOOKBACK);
        let (mut read, mut made) = (0, 0);
        let mut newest = cursor;
        loop {
            let page = self.activity.since(project, after, PAGE)?;
            for entry in &page {
                let kind = event_type(entry);
                for hook in hooks {
                    if entry.created_at >= hook.created_at && hook.wants(&kind) {
                        made += usize::from(self.ensure(project, hook, entry, now)?);
                    }
                }
            }
            read += page.len();
            let Some(last) = page.last() else { break };
            after = last.id;
            newest = newest.max(Some(last.id));
            if page.len() < PAGE || read >= PASS {
                break;
            }
        }
        if newest != cursor {
            if let Some(entry_id) = newest {
                self.stores
                    .cursors
                    .put(project, CURSOR, &Cursor { entry_id })?;
            }
        }
        Ok(made)
    }

    /// Makes the delivery of `entry` to `hook` unless it exists; requeues one still pending
    /// whose queue entry was lost (a crash between the two writes). Whether one was made.
    pub(super) fn ensure(
        &self,
        project: u64,
        hook: &Webhook,
        entry: &ActivityEntry,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let key = delivery::key(hook.id, entry.id);
        match self.stores.deliveries.get(project, &key)? {
            None => {
                self.save(project, &Delivery::of(hook.id, entry, now))?;
                Ok(true)
            }
            Some(d) if d.state == DeliveryState::Pending => {
                if self.stores.queue.get(project, &key)?.is_none() {
                    self.save(project, &d)?;
                }
                Ok(false)
            }
            Some(_) => Ok(false),
        }
    }

    /// The deliveries due now, by webhook, oldest entry first.
    pub(super) fn due(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<(Webhook, Vec<Delivery>)>, StoreError> {
        let hooks: HashMap<Uuid, Webhook> = self
            .stores
            .hooks
            .list_all()?
            .into_iter()
            .map(|(_, h)| (h.id, h))
            .collect();
        let mut due: HashMap<Uuid, Vec<Delivery>> = HashMap::new();
        for (project, queued) in self.stores.queue.list_all()? {
            let key = delivery::key(queued.webhook_id, queued.entry_id);
            let Some(hook) = hooks.get(&queued.webhook_id) else {
                self.stores.queue.delete(project, &key)?;
                continue;
            };
            let held = !hook.enabled || hook.paused_until.is_some_and(|t| t > now);
            if queued.next_attempt_at > now || (held && !queued.redelivery) {
                continue;
            }
            let waiting = due.entry(hook.id).or_default();
            if waiting.len() >= SENDS_PER_PASS {
                continue;
            }
            match self.stores.deliveries.get(project, &key)? {
                Some(d) if d.state == DeliveryState::Pending => waiting.push(d),
                _ => {
                    self.stores.queue.delete(project, &key)?;
                }
            }
        }
        Ok(due
            .into_iter()
            .filter_map(|(id, mut ds)| {
                ds.sort_by_key(|d| (!d.redelivery, d.entry_id));
                Some((hooks.get(&id)?.clone(), ds))
            })
            .collect())
    }

    /// Records an attempt, and what it means for the webhook: a success clears its failures;
    /// a failure pauses it until the retry, and turns it off when the delivery has failed for
    /// good or the failures in a row reach the limit.
    ///
    /// The webhook is written before the attempt, so whoever sees the attempt listed sees the
    /// webhook it left behind.
    pub(super) fn settle(
        &self,
        project: u64,
        hook_id: Uuid,
        mut delivery: Delivery,
        outcome: Outcome,
    ) -> Result<(), WebhookError> {
        let now = Utc::now();
        let success = outcome.success();
        delivery.settle(outcome, now, &self.settings.retry_schedule);
        if let Some(before) = self.stores.hooks.get(project, &hook_id.to_string())? {
            let hook = self.after_attempt(&before, &delivery, success, now);
            self.stores
                .hooks
                .put(project, &hook_id.to_string(), &hook)?;
            if hook.enabled != before.enabled {
                self.log(&Actor::system(), Some(&before), &hook);
            }
        }
        self.save(project, &delivery)?;
        Ok(())
    }

    /// The webhook as one settled attempt of `delivery` leaves it.
    fn after_attempt(
        &self,
        before: &Webhook,
        delivery: &Delivery,
        success: bool,
        now: DateTime<Utc>,
    ) -> Webhook {
        let mut hook = before.clone();
        if success {
            hook.consecutive_failures = 0;
            hook.paused_until = None;
            hook.last_success_at = Some(now);
            return hook;
        }
        hook.consecutive_failures = hook.consecutive_failures.saturating_add(1);
        hook.last_failure_at = Some(now);
        hook.paused_until = delivery.next_attempt_at;
        let reason = if delivery.state == DeliveryState::Failed {
            Some(format!(
                "delivery {} failed {} times",
                delivery.id, delivery.failures
            ))
        } else if hook.consecutive_failures >= self.settings.max_consecutive_failures {
            Some(format!(
                "{} deliveries failed in a row",
                hook.consecutive_failures
            ))
        } else {
            None
        };
        if let (Some(reason), true) = (reason, hook.enabled) {
            tracing::warn!(webhook = %hook.id, %reason, "webhook turned off");
            hook.enabled = false;
            hook.disabled_reason = Some(reason);
            hook.updated_at = now;
        }
        hook
    }

    /// Deletes finished deliveries older than `keep_deliveries`, once an hour.
    pub(super) fn prune(&self, now: DateTime<Utc>) -> Result<(), StoreError> {
        {
            let mut last = self.last_prune.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| now - t < PRUNE_EVERY) {
                return Ok(());
            }
            *last = Some(now);
        }
        let Some(cutoff) = chrono::Duration::from_std(self.settings.keep_deliveries)
            .ok()
            .and_then(|keep| now.checked_sub_signed(keep))
        else {
            return Ok(());
        };
        for (project, d) in self.stores.deliveries.list_all()? {
            if d.state != DeliveryState::Pending && d.created_at < cutoff {
                self.stores.deliveries.delete(project, &d.key())?;
            }
        }
        Ok(())
    }
}
