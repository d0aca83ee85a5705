//! The dispatcher's rules over the embedded stores, against a receiver that refuses every
//! connection (successful deliveries are tested through the server, in `tests/webhooks.rs`).

use std::sync::Arc;

use corvid_activity::{ActivityRecords, Actor, Recorded, SledActivity};
use corvid_kernel::{LocalClaims, SledRecords};

use super::dispatch::{floor_id, id_time};
use super::*;

struct Fixture {
    _dir: tempfile::TempDir,
    hooks: Webhooks,
    activity: Arc<dyn ActivityRecords>,
    /// Another node over the same stores and claims.
    other_node: Webhooks,
}

fn fixture(settings: WebhookSettings) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("sled");
    let activity: Arc<dyn ActivityRecords> = Arc::new(SledActivity::open(&db).expect("log"));
    let claims: Arc<dyn JobClaims> = Arc::new(LocalClaims::default());
    let node = |holder: &str| {
        let stores = WebhookStores {
            hooks: Arc::new(SledRecords::open(&db, STORE_NAMES[0]).expect("open")),
            deliveries: Arc::new(SledRecords::open(&db, STORE_NAMES[1]).expect("open")),
            queue: Arc::new(SledRecords::open(&db, STORE_NAMES[2]).expect("open")),
            cursors: Arc::new(SledRecords::open(&db, STORE_NAMES[3]).expect("open")),
        };
        let claims = Claims {
            claims: Arc::clone(&claims),
            holder: holder.into(),
        };
        Webhooks::new(stores, Arc::clone(&activity), claims, settings.clone())
    };
    Fixture {
        hooks: node("node-1"),
        other_node: node("node-2"),
        _dir: dir,
        activity,
    }
}

fn flag_change(activity: &dyn ActivityRecords, item: &str) {
    let entry = Recorded {
        project_id: 1,
        actor: &Actor::system(),
        scope: "FeatureFlag",
        item_id: item.into(),
        name: None,
        before: Some(&serde_json::json!({"active": false})),
        after: &serde_json::json!({"active": true}),
    }
    .entry()
    .expect("a change");
    activity.append(&entry).expect("append");
}

fn refusing() -> WebhookInput {
    WebhookInput {
        // Port 1 on loopback: nothing listens, every attempt fails at once.
        url: Some("http://127.0.0.1:1/hook".into()),
        events: Some(vec!["FeatureFlag.updated".into()]),
        secret: Some("s3cret".into()),
        enabled: None,
    }
}

fn fast(schedule_ms: &[u64]) -> WebhookSettings {
    WebhookSettings {
        allow_loopback: true,
        timeout: Duration::from_secs(2),
        retry_schedule: schedule_ms
            .iter()
            .map(|ms| Duration::from_millis(*ms))
            .collect(),
        ..WebhookSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_entry_is_delivered_once_per_webhook_and_failures_follow_the_schedule() {
    let f = fixture(fast(&[200, 200]));
    let created = f
        .hooks
        .create(1, &Actor::system(), refusing())
        .await
        .expect("create");
    let id = created.webhook.id;
    assert_eq!(created.secret, "s3cret");
    flag_change(&*f.activity, "1");

    let first = f.hooks.tick().await.expect("pass");
    assert_eq!((first.made, first.failed_attempts), (1, 1));
    // The same entries read again make nothing new; the webhook is paused until the retry.
    let again = f.hooks.tick().await.expect("pass");
    assert_eq!((again.made, again.failed_attempts), (0, 0));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(f.hooks.tick().await.expect("pass").failed_attempts, 1);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(f.hooks.tick().await.expect("pass").failed_attempts, 1);

    // Three attempts, each with no status (nothing answered); the delivery has failed for good
    // and the webhook turned itself off, as the system.
    let page = f.hooks.attempts(1, id, 0, 100).await.expect("attempts");
    assert_eq!(page.total, 3);
    assert!(page.rows.iter().all(|r| r.attempt.status_code.is_none()));
    assert_eq!(page.rows[0].delivery.state, DeliveryState::Failed);
    let hook = f.hooks.get(1, id).await.expect("get");
    assert!(!hook.enabled);
    assert!(hook.disabled_reason.is_some());
    let log = f
        .activity
        .query(
            1,
            &corvid_activity::ActivityQuery {
                scopes: vec![SCOPE.into()],
                limit: 10,
                ..Default::default()
            },
        )
        .expect("log");
    assert!(log.entries[0].user.is_system, "turned off by the system");

    // Redelivery is sent though the webhook is off, and marked as such.
    let delivery = page.rows[0].delivery.id;
    f.hooks.redeliver(1, id, delivery).await.expect("redeliver");
    assert_eq!(f.hooks.tick().await.expect("pass").failed_attempts, 1);
    let page = f.hooks.attempts(1, id, 0, 100).await.expect("attempts");
    assert_eq!(page.total, 4);
    assert!(page.rows[0].attempt.redelivery);
    assert_eq!(page.rows[0].attempt.number, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_before_a_webhook_and_events_it_does_not_ask_for_are_not_sent() {
    let f = fixture(fast(&[60_000]));
    flag_change(&*f.activity, "old");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let hook = f
        .hooks
        .create(1, &Actor::system(), refusing())
        .await
        .expect("create");
    let created_only = Recorded {
        project_id: 1,
        actor: &Actor::system(),
        scope: "FeatureFlag",
        item_id: "new".into(),
        name: None,
        before: None,
        after: &serde_json::json!({"active": true}),
    }
    .entry()
    .expect("a creation");
    f.activity.append(&created_only).expect("append");
    assert_eq!(f.hooks.tick().await.expect("pass").made, 0);
    flag_change(&*f.activity, "new");
    assert_eq!(f.hooks.tick().await.expect("pass").made, 1);
    // Deleting the webhook drops its queue: nothing more is tried.
    f.hooks
        .delete(1, &Actor::system(), hook.webhook.id)
        .await
        .expect("delete");
    assert_eq!(f.hooks.tick().await.expect("pass"), PassReport::default());
}

/// The dispatch job moves between nodes; the next node sends at once, without waiting for
/// the previous one's claim on the webhook to run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_sent_by_one_node_is_sent_by_the_next_node_at_once() {
    let f = fixture(fast(&[1, 1, 1, 1]));
    f.hooks
        .create(1, &Actor::system(), refusing())
        .await
        .expect("create");
    flag_change(&*f.activity, "1");
    assert_eq!(f.hooks.tick().await.expect("pass").failed_attempts, 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let next = f.other_node.tick().await.expect("pass");
    assert_eq!(
        next.failed_attempts, 1,
        "the other node retried the delivery"
    );
}

#[test]
fn floor_ids_sort_before_every_id_of_their_millisecond() {
    let id = Uuid::now_v7();
    let t = id_time(id).expect("v7");
    assert!(floor_id(t) <= id);
    assert!(floor_id(t + chrono::Duration::milliseconds(1)) > id);
}
