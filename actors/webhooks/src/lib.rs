//! Webhooks: a project's changes, as its activity log records them, POSTed to the URLs its
//! users name, signed, at least once.
//!
//! The activity log is the outbox. Each entry is durable in the write of the change it
//! records, so the dispatcher ([`Webhooks::tick`], a job on one node of a cluster) follows
//! each project's log from a stored cursor and makes one [`Delivery`] per entry and webhook
//! that asks for its event type. A delivery's id derives from the webhook and the entry, so
//! reading an entry twice (the dispatcher re-reads a few seconds back each pass, for entries
//! that committed late) never makes a second delivery. Deliveries wait in a queue until they
//! succeed or their retries run out; every attempt is kept for `…/deliveries/`.
//!
//! While a webhook's receiver fails, the webhook is paused until the failed delivery's retry,
//! so a receiver that is down sees one request per retry, not one per queued delivery. A
//! delivery that exhausts its retries, or `max_consecutive_failures` failures in a row, turns
//! the webhook off (logged as the system's change); turning it on again resumes its queue.

mod delivery;
mod dispatch;
mod hook;
mod send;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use corvid_activity::{ActivityEntry, ActivityRecords, Actor, Recorded};
use corvid_kernel::{blocking, DefinitionRecords, JobClaims, StoreError};

pub use delivery::{event_type, Attempt, Cursor, Delivery, DeliveryState, Outcome, Queued};
pub use hook::{Webhook, WebhookInput, SCOPES};
pub use send::{signature, Sender};

/// The activity log's scope for webhooks themselves.
const SCOPE: &str = "Webhook";
/// How far back of its cursor the dispatcher reads a project's log each pass: an entry whose
/// id was taken before a later one's but committed after it is still seen.
const LOOKBACK: chrono::Duration = chrono::Duration::seconds(10);
/// Entries read from the log per page.
const PAGE: usize = 500;
/// Entries one pass reads per project at most (the rest wait for the next pass).
const PASS: usize = 20_000;
/// Deliveries one pass sends per webhook at most.
const SENDS_PER_PASS: usize = 100;
/// How often finished deliveries past `keep_deliveries` are deleted.
const PRUNE_EVERY: chrono::Duration = chrono::Duration::hours(1);
/// The cursor's record id (one per project).
const CURSOR: &str = "log";

/// How webhooks behave (`[webhooks]`).
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Deadline of one attempt.
    pub timeout: Duration,
    /// The wait before each retry of a failed delivery; when it is used up the delivery has
    /// failed and its webhook is turned off.
    pub retry_schedule: Vec<Duration>,
    /// Failed attempts in a row (across deliveries) that turn a webhook off.
    pub max_consecutive_failures: u32,
    /// DEVELOPMENT ONLY: loopback receivers are allowed.
    pub allow_loopback: bool,
    /// Delivered and failed deliveries (and their attempts) are kept this long.
    pub keep_deliveries: Duration,
    /// Webhooks one project may have.
    pub max_per_project: usize,
}

impl Default for WebhookSettings {
    fn default() -> WebhookSettings {
        let minutes = |m: u64| Duration::from_secs(60 * m);
        WebhookSettings {
            timeout: Duration::from_secs(10),
            retry_schedule: vec![
                Duration::from_secs(10),
                minutes(1),
                minutes(5),
                minutes(30),
                minutes(120),
                minutes(360),
            ],
            max_consecutive_failures: 20,
            allow_loopback: false,
            keep_deliveries: Duration::from_secs(30 * 86_400),
            max_per_project: 50,
        }
    }
}

/// Where webhooks and their deliveries are kept.
pub struct WebhookStores {
    pub hooks: Arc<dyn DefinitionRecords<Webhook>>,
    pub deliveries: Arc<dyn DefinitionRecords<Delivery>>,
    pub queue: Arc<dyn DefinitionRecords<Queued>>,
    pub cursors: Arc<dyn DefinitionRecords<Cursor>>,
}

/// The names of the stores, for the engine to open them in its backing.
pub const STORE_NAMES: [&str; 4] = [
    "webhooks",
    "webhook_deliveries",
    "webhook_queue",
    "webhook_cursors",
];

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{detail}")]
    Invalid { attr: &'static str, detail: String },
    #[error("{what} not found.")]
    NotFound { what: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A webhook just made: the record and its secret, shown this once.
#[derive(Debug, Clone)]
pub struct Created {
    pub webhook: Webhook,
    pub secret: String,
}

/// One row of `…/deliveries/`: an attempt and the delivery it belongs to.
#[derive(Debug, Clone)]
pub struct AttemptRow {
    pub attempt: Attempt,
    pub delivery: Delivery,
}

/// A page of attempts, newest first, with how many there are.
#[derive(Debug, Clone)]
pub struct AttemptPage {
    pub rows: Vec<AttemptRow>,
    pub total: usize,
}

/// What one dispatcher pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassReport {
    pub made: usize,
    pub delivered: usize,
    pub failed_attempts: usize,
}

/// Who this node is in the cluster's claims, so one node sends a webhook's deliveries.
pub struct Claims {
    pub claims: Arc<dyn JobClaims>,
    pub holder: String,
}

/// The webhooks' door. Cheap to clone.
#[derive(Clone)]
pub struct Webhooks {
    inner: Arc<Inner>,
}

struct Inner {
    stores: WebhookStores,
    activity: Arc<dyn ActivityRecords>,
    claims: Claims,
    settings: WebhookSettings,
    sender: Sender,
    last_prune: Mutex<Option<DateTime<Utc>>>,
    /// Set when the process stops: a pass sends no further delivery after its attempt under
    /// way is recorded.
    stopping: std::sync::atomic::AtomicBool,
}

impl Webhooks {
    pub fn new(
        stores: WebhookStores,
        activity: Arc<dyn ActivityRecords>,
        claims: Claims,
        settings: WebhookSettings,
    ) -> Webhooks {
        if settings.allow_loopback {
            tracing::warn!("WEBHOOK DEVELOPMENT MODE: deliveries may go to loopback addresses");
        }
        let sender = Sender {
            timeout: settings.timeout,
            allow_loopback: settings.allow_loopback,
        };
        Webhooks {
            inner: Arc::new(Inner {
                stores,
                activity,
                claims,
                settings,
                sender,
                last_prune: Mutex::new(None),
                stopping: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Inner) -> Result<T, WebhookError> + Send + 'static,
    ) -> Result<T, WebhookError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || work(&inner)).await
    }

    /// Stops sending: a pass under way records its attempt in flight and sends nothing more.
    /// Returns how long that attempt may still take (its deadline), for the caller to wait.
    pub fn stop(&self) -> Duration {
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.inner.settings.timeout
    }

    pub async fn list(&self, project: u64) -> Result<Vec<Webhook>, WebhookError> {
        self.run(move |i| Ok(i.stores.hooks.list(project)?)).await
    }

    pub async fn get(&self, project: u64, id: Uuid) -> Result<Webhook, WebhookError> {
        self.run(move |i| i.hook(project, id)).await
    }

    /// Makes a webhook from `input` (`url` and `events` required; a secret is made when none
    /// is given).
    pub async fn create(
        &self,
        project: u64,
        actor: &Actor,
        input: WebhookInput,
    ) -> Result<Created, WebhookError> {
        let actor = actor.clone();
        self.run(move |i| {
            if input.url.is_none() {
                return Err(required("url"));
            }
            if input.events.is_none() {
                return Err(required("events"));
            }
            if i.stores.hooks.list(project)?.len() >= i.settings.max_per_project {
                return Err(WebhookError::Invalid {
                    attr: "url",
                    detail: format!(
                        "A project has at most {} webhooks.",
                        i.settings.max_per_project
                    ),
                });
            }
            let now = Utc::now();
            let mut hook = Webhook {
                id: Uuid::now_v7(),
                project_id: project,
                url: String::new(),
                events: Vec::new(),
                secret: hook::new_secret(),
                enabled: true,
                created_at: now,
                updated_at: now,
                consecutive_failures: 0,
                disabled_reason: None,
                paused_until: None,
                last_success_at: None,
                last_failure_at: None,
            };
            input.apply(&mut hook, i.settings.allow_loopback)?;
            i.stores.hooks.put(project, &hook.id.to_string(), &hook)?;
            i.log(&actor, None, &hook);
            Ok(Created {
                secret: hook.secret.clone(),
                webhook: hook,
            })
        })
        .await
    }

    /// Changes the fields `input` names. Turning a webhook on clears what turned it off.
    pub async fn update(
        &self,
        project: u64,
        actor: &Actor,
        id: Uuid,
        input: WebhookInput,
    ) -> Result<Webhook, WebhookError> {
        let actor = actor.clone();
        self.run(move |i| {
            let before = i.hook(project, id)?;
            let mut hook = before.clone();
            input.apply(&mut hook, i.settings.allow_loopback)?;
            hook.updated_at = Utc::now();
            i.stores.hooks.put(project, &id.to_string(), &hook)?;
            i.log(&actor, Some(&before), &hook);
            Ok(hook)
        })
        .await
    }

    /// Deletes a webhook with its deliveries (queued ones are not sent).
    pub async fn delete(&self, project: u64, actor: &Actor, id: Uuid) -> Result<(), WebhookError> {
        let actor = actor.clone();
        self.run(move |i| {
            let hook = i.hook(project, id)?;
            i.stores.hooks.delete(project, &id.to_string())?;
            for d in i.deliveries_of(project, id)? {
                i.stores.queue.delete(project, &d.key())?;
                i.stores.deliveries.delete(project, &d.key())?;
            }
            let entry = ActivityEntry::removal(project, &actor, SCOPE, id.to_string(), None);
            i.append(&entry.with_context(serde_json::json!({"url": hook.url})));
            Ok(())
        })
        .await
    }

    /// The webhook's attempts, newest first.
    pub async fn attempts(
        &self,
        project: u64,
        id: Uuid,
        offset: usize,
        limit: usize,
    ) -> Result<AttemptPage, WebhookError> {
        self.run(move |i| {
            i.hook(project, id)?;
            let mut rows: Vec<AttemptRow> = i
                .deliveries_of(project, id)?
                .into_iter()
                .flat_map(|d| {
                    d.attempts
                        .iter()
                        .map(|a| AttemptRow {
                            attempt: a.clone(),
                            delivery: d.clone(),
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            rows.sort_by(|a, b| {
                (b.attempt.attempted_at, b.attempt.number)
                    .cmp(&(a.attempt.attempted_at, a.attempt.number))
            });
            let total = rows.len();
            let rows = rows.into_iter().skip(offset).take(limit).collect();
            Ok(AttemptPage { rows, total })
        })
        .await
    }

    /// Queues a delivery (named by its id or one of its attempts' ids) to be sent again at
    /// once, even if the webhook is off or paused.
    pub async fn redeliver(
        &self,
        project: u64,
        id: Uuid,
        delivery: Uuid,
    ) -> Result<Delivery, WebhookError> {
        self.run(move |i| {
            i.hook(project, id)?;
            let mut found = i
                .deliveries_of(project, id)?
                .into_iter()
                .find(|d| d.id == delivery || d.attempts.iter().any(|a| a.id == delivery))
                .ok_or(WebhookError::NotFound { what: "Delivery" })?;
            found.redeliver(Utc::now());
            i.save(project, &found)?;
            Ok(found)
        })
        .await
    }

    /// One dispatcher pass: new entries become deliveries, and what is due is sent. Each
    /// webhook's deliveries are sent by the node that holds its claim, in entry order.
    pub async fn tick(&self) -> Result<PassReport, WebhookError> {
        let (due, made) = self
            .run(|i| {
                let now = Utc::now();
                let made = i.follow_logs(now)?;
                i.prune(now)?;
                Ok((i.due(now)?, made))
            })
            .await?;
        let passes = due
            .into_iter()
            .map(|(hook, deliveries)| self.send_all(hook, deliveries));
        let mut report = PassReport {
            made,
            ..PassReport::default()
        };
        for (delivered, failed) in futures_util::future::join_all(passes).await {
            report.delivered += delivered;
            report.failed_attempts += failed;
        }
        Ok(report)
    }

    /// Sends one webhook's due deliveries in order, stopping at the first failure (the
    /// webhook is then paused until that delivery's retry). `(delivered, failed)`.
    async fn send_all(&self, hook: Webhook, deliveries: Vec<Delivery>) -> (usize, usize) {
        let lease = self.inner.settings.timeout.saturating_mul(3) + Duration::from_secs(30);
        let name = format!("webhook/{}", hook.id);
        let (claims, holder) = (&self.inner.claims.claims, &self.inner.claims.holder);
        let (c, n, h) = (Arc::clone(claims), name.clone(), holder.clone());
        let claimed = blocking(move || c.claim(&n, &h, Utc::now(), lease)).await;
        match claimed {
            Ok(true) => {}
            Ok(false) => return (0, 0),
            Err(err) => {
                let err: StoreError = err;
                tracing::warn!(webhook = %hook.id, error = %err, "could not claim a webhook's deliveries");
                return (0, 0);
            }
        }
        let started = Instant::now();
        let (mut delivered, mut failed) = (0, 0);
        for delivery in deliveries {
            // Stop well before the claim runs out, so another node never sends alongside.
            if started.elapsed() + self.inner.settings.timeout * 2 > lease
                || self
                    .inner
                    .stopping
                    .load(std::sync::atomic::Ordering::SeqCst)
            {
                break;
            }
            // Another pass (or node) may have settled it since it was read.
            let (project, key) = (hook.project_id, delivery.key());
            let current = self
                .run(move |i| Ok(i.stores.deliveries.get(project, &key)?))
                .await;
            if !matches!(current, Ok(Some(d)) if d.state == DeliveryState::Pending && d.attempts.len() == delivery.attempts.len())
            {
                continue;
            }
            let outcome = self
                .inner
                .sender
                .send(&hook.url, &hook.secret, &delivery)
                .await;
            let success = outcome.success();
            let project = hook.project_id;
            let hook_id = hook.id;
            let saved = self
                .run(move |i| i.settle(project, hook_id, delivery, outcome))
                .await;
            if let Err(err) = saved {
                tracing::warn!(webhook = %hook_id, error = %err, "could not record a delivery attempt");
                break;
            }
            if success {
                delivered += 1;
            } else {
                failed += 1;
                break;
            }
        }
        // Done sending: the next pass may be another node's (the dispatch job's lease moves
        // between nodes), and it must not wait for this claim to run out.
        let (c, h) = (Arc::clone(claims), holder.clone());
        let released: Result<(), StoreError> = blocking(move || c.release(&name, &h)).await;
        if let Err(err) = released {
            tracing::warn!(webhook = %hook.id, error = %err, "could not release a webhook's claim");
        }
        (delivered, failed)
    }
}

fn required(attr: &'static str) -> WebhookError {
    WebhookError::Invalid {
        attr,
        detail: "This field is required.".into(),
    }
}

impl Inner {
    fn hook(&self, project: u64, id: Uuid) -> Result<Webhook, WebhookError> {
        self.stores
            .hooks
            .get(project, &id.to_string())?
            .ok_or(WebhookError::NotFound { what: "Webhook" })
    }

    fn deliveries_of(&self, project: u64, id: Uuid) -> Result<Vec<Delivery>, StoreError> {
        Ok(self
            .stores
            .deliveries
            .list(project)?
            .into_iter()
            .filter(|d| d.webhook_id == id)
            .collect())
    }

    /// Writes a delivery and its place in the queue (the delivery first: a queue entry whose
    /// delivery is finished is dropped when read).
    fn save(&self, project: u64, d: &Delivery) -> Result<(), StoreError> {
        let key = d.key();
        self.stores.deliveries.put(project, &key, d)?;
        match d.queued() {
            Some(q) => self.stores.queue.put(project, &key, &q),
            None => self.stores.queue.delete(project, &key).map(|_| ()),
        }
    }

    fn append(&self, entry: &ActivityEntry) {
        if let Err(err) = self.activity.append(entry) {
            tracing::warn!(project_id = entry.project_id, error = %err, "a webhook change could not be logged");
        }
    }

    /// Logs a webhook's creation or change (the secret masked by the log).
    fn log(&self, actor: &Actor, before: Option<&Webhook>, after: &Webhook) {
        let json = |h: &Webhook| serde_json::to_value(h).unwrap_or_default();
        let before = before.map(json);
        let after_json = json(after);
        let entry = Recorded {
            project_id: after.project_id,
            actor,
            scope: SCOPE,
            item_id: after.id.to_string(),
            name: Some(after.url.clone()),
            before: before.as_ref(),
            after: &after_json,
        }
        .entry();
        if let Some(entry) = entry {
            self.append(&entry);
        }
    }
}

#[cfg(test)]
mod tests;
