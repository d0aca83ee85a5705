//! Webhooks over real HTTP, delivered to a receiver on loopback (`dev_allow_loopback`): each
//! change a webhook asks for arrives signed (checked here with an HMAC of our own), failures
//! are retried on the schedule and listed with their status codes, a delivery can be sent
//! again, a webhook whose receiver keeps failing turns itself off, and nothing is lost or sent
//! twice across a restart.

mod common;

use std::time::Duration;

use common::receiver::{Received, Receiver};
use common::{error_body, fresh, wait_until, TestServer};
use corvid::config::{Config, HumanDuration};
use ring::hmac;
use serde_json::{json, Value};

/// Checks `X-Corvid-Signature: t=<unix>,v1=<hex>` against HMAC-SHA256(secret, "<t>.<body>"),
/// computed here, and that `t` is now.
fn assert_signed(r: &Received, secret: &str) {
    let header = r.headers.get("x-corvid-signature").expect("signed");
    let (t, v1) = header
        .split_once(',')
        .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v.strip_prefix("v1=")?)))
        .unwrap_or_else(|| panic!("signature header shape: {header}"));
    let unix: i64 = t.parse().expect("a unix time");
    assert!(
        (chrono::Utc::now().timestamp() - unix).abs() < 300,
        "t is now"
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let expected = hmac::sign(&key, format!("{t}.{}", r.body).as_bytes());
    assert_eq!(v1, hex_of(expected.as_ref()), "HMAC of t.body");
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn config(retries_ms: &[u64]) -> (tempfile::TempDir, Config) {
    let (dir, mut config) = fresh();
    config.webhooks.dev_allow_loopback = true;
    config.webhooks.dispatch_interval = Duration::from_millis(100);
    config.webhooks.retry_schedule = retries_ms
        .iter()
        .map(|ms| HumanDuration(Duration::from_millis(*ms)))
        .collect();
    (dir, config)
}

fn webhook(server: &TestServer, url: &str, events: &[&str], secret: &str) -> Value {
    server.admin_post(
        "/api/projects/1/webhooks/",
        &json!({"url": url, "events": events, "secret": secret}),
        201,
    )
}

fn flag(server: &TestServer, key: &str) -> i64 {
    let flag = server.admin_post(
        "/api/projects/1/feature_flags/",
        &json!({"key": key, "filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}}),
        201,
    );
    flag["id"].as_i64().expect("id")
}

fn roll_out(server: &TestServer, id: i64, percentage: u32) {
    server.admin_patch(
        &format!("/api/projects/1/feature_flags/{id}/"),
        &json!({"filters": {"groups": [{"properties": [], "rollout_percentage": percentage}]}}),
        200,
    );
}

fn attempts(server: &TestServer, hook: &str) -> Vec<Value> {
    server.admin_get(&format!("/api/projects/1/webhooks/{hook}/deliveries/"))["results"]
        .as_array()
        .expect("results")
        .clone()
}

#[test]
fn changes_arrive_signed_with_the_entry_and_each_attempt_is_listed() {
    let (dir, config) = config(&[10_000]);
    let server = TestServer::start_in(dir, config);
    let receiver = Receiver::start(&[]);
    let hook = webhook(&server, &receiver.url, &["FeatureFlag.*"], "topsecret");
    assert_eq!(hook["secret"], "topsecret", "shown when set");
    assert_eq!(hook["enabled"], true);
    let hook_id = hook["id"].as_str().expect("id").to_string();
    let read = server.admin_get(&format!("/api/projects/1/webhooks/{hook_id}/"));
    assert_eq!(read["secret"], Value::Null, "never shown again");
    assert_eq!(read["events"], json!(["FeatureFlag.*"]));

    let id = flag(&server, "checkout");
    roll_out(&server, id, 50);
    // A change the webhook does not ask for is not sent.
    server.admin_post(
        "/api/projects/1/cohorts/",
        &json!({"name": "c", "is_static": true, "distinct_ids": ["a"]}),
        201,
    );
    let got = receiver.wait_for(2);
    for r in &got {
        assert_signed(r, "topsecret");
        assert_eq!(r.headers["content-type"], "application/json");
        let body = r.json();
        assert_eq!(
            r.headers["x-corvid-delivery"],
            body["id"].as_str().expect("id")
        );
        assert_eq!(body["data"]["scope"], "FeatureFlag");
        assert_eq!(body["data"]["item_id"], id.to_string());
        assert!(body["created_at"].is_string());
    }
    let (created, updated) = (got[0].json(), got[1].json());
    assert_eq!(created["event_type"], "FeatureFlag.created");
    assert_eq!(updated["event_type"], "FeatureFlag.updated");
    assert_eq!(updated["data"]["user"]["email"], server.creds.email);
    let change = &updated["data"]["detail"]["changes"][0];
    assert_eq!(change["field"], "filters");
    assert_eq!(
        change["after"]["groups"][0]["rollout_percentage"].as_f64(),
        Some(50.0)
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        receiver.received().len(),
        2,
        "no cohort delivery, no duplicate"
    );

    let listed = attempts(&server, &hook_id);
    assert_eq!(listed.len(), 2);
    for a in &listed {
        assert_eq!(a["status_code"], 200);
        assert_eq!(a["success"], true);
        assert_eq!(a["state"], "delivered");
    }
    assert_eq!(
        listed[0]["event_type"], "FeatureFlag.updated",
        "newest first"
    );

    // The webhook's own changes are logged, its secret masked.
    let log = server.admin_get("/api/projects/1/activity_log/?scope=Webhook");
    let entry = &log["results"][0];
    assert_eq!(entry["activity"], "created");
    assert!(!entry.to_string().contains("topsecret"), "{entry}");
}

#[test]
fn a_failing_receiver_is_retried_on_schedule_and_a_delivery_can_be_sent_again() {
    let (dir, config) = config(&[300, 300, 300]);
    let server = TestServer::start_in(dir, config);
    let receiver = Receiver::start(&[500, 503]);
    let hook = webhook(&server, &receiver.url, &["FeatureFlag.updated"], "k");
    let hook_id = hook["id"].as_str().expect("id").to_string();
    let id = flag(&server, "retried");
    roll_out(&server, id, 100);

    let got = receiver.wait_for(3);
    let ids: Vec<String> = got
        .iter()
        .map(|r| r.headers["x-corvid-delivery"].clone())
        .collect();
    assert!(
        ids.iter().all(|i| *i == ids[0]),
        "one delivery, three attempts"
    );
    assert_eq!(got[0].body, got[2].body, "the same body each time");
    // The receiver has answered; the attempt is listed once the dispatcher has read it.
    assert!(wait_until(Duration::from_secs(10), || attempts(
        &server, &hook_id
    )
    .len()
        == 3));
    let listed = attempts(&server, &hook_id);
    let statuses: Vec<&Value> = listed.iter().map(|a| &a["status_code"]).collect();
    assert_eq!(statuses, vec![&json!(200), &json!(503), &json!(500)]);
    assert_eq!(listed[0]["attempt"], 3);
    assert_eq!(
        server.admin_get(&format!("/api/projects/1/webhooks/{hook_id}/"))["consecutive_failures"],
        0
    );

    let redelivered = server.admin_post(
        &format!(
            "/api/projects/1/webhooks/{hook_id}/deliveries/{}/redeliver/",
            listed[0]["delivery_id"].as_str().expect("id")
        ),
        &json!({}),
        202,
    );
    assert_eq!(redelivered["id"], listed[0]["delivery_id"]);
    let got = receiver.wait_for(4);
    assert_eq!(got[3].headers["x-corvid-delivery"], ids[0]);
    assert!(wait_until(Duration::from_secs(10), || attempts(
        &server, &hook_id
    )
    .len()
        == 4));
    let listed = attempts(&server, &hook_id);
    assert_eq!(listed[0]["redelivery"], true);
    assert_eq!(listed[0]["status_code"], 200);

    let missing = server.post_json(
        &format!(
            "/api/projects/1/webhooks/{hook_id}/deliveries/{}/redeliver/",
            uuid::Uuid::nil()
        ),
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(missing.status(), 404);
}

#[test]
fn a_webhook_whose_deliveries_keep_failing_turns_itself_off() {
    let (dir, config) = config(&[100, 100]);
    let server = TestServer::start_in(dir, config);
    let receiver = Receiver::start(&[500; 100]);
    let hook = webhook(&server, &receiver.url, &["*"], "k");
    let hook_id = hook["id"].as_str().expect("id").to_string();
    let id = flag(&server, "doomed");
    receiver.wait_for(3);
    let path = format!("/api/projects/1/webhooks/{hook_id}/");
    assert!(wait_until(Duration::from_secs(10), || {
        server.admin_get(&path)["enabled"] == json!(false)
    }));
    let off = server.admin_get(&path);
    assert!(
        off["disabled_reason"]
            .as_str()
            .is_some_and(|r| r.contains("failed")),
        "{off}"
    );
    // The webhook is written before the attempt that turned it off.
    assert!(wait_until(Duration::from_secs(10), || attempts(
        &server, &hook_id
    )[0]["state"]
        == "failed"));
    let log = server.admin_get(&format!(
        "/api/projects/1/activity_log/?scope=Webhook&item_id={hook_id}"
    ));
    assert_eq!(
        log["results"][0]["user"]["is_system"], true,
        "turned off by Corvid"
    );

    // Off, it sends nothing; on again, it picks up new changes.
    roll_out(&server, id, 10);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(receiver.received().len(), 3);
    let on = server.admin_patch(&path, &json!({"enabled": true}), 200);
    assert_eq!(
        (on["enabled"].clone(), on["disabled_reason"].clone()),
        (json!(true), Value::Null)
    );
    roll_out(&server, id, 20);
    receiver.wait_for(4);
}

#[test]
fn nothing_is_lost_or_sent_twice_across_a_restart() {
    let (dir, config) = config(&[200]);
    let receiver = Receiver::start(&[]);
    let server = TestServer::start(config.clone());
    webhook(&server, &receiver.url, &["FeatureFlag.created"], "k");
    for i in 0..5 {
        flag(&server, &format!("before-{i}"));
    }
    // Stopped at once: some of these are delivered, some still queued or not yet read.
    server.stop();
    let server = TestServer::start(config);
    for i in 0..5 {
        flag(&server, &format!("after-{i}"));
    }
    receiver.wait_for(10);
    std::thread::sleep(Duration::from_millis(800));
    let got = receiver.received();
    let mut ids: Vec<String> = got
        .iter()
        .map(|r| r.headers["x-corvid-delivery"].clone())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!((got.len(), ids.len()), (10, 10), "each once");
    let mut keys: Vec<String> = got
        .iter()
        .map(|r| {
            r.json()["data"]["detail"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    keys.sort();
    assert_eq!(keys.len(), 10);
    drop(dir);
}

#[test]
fn bad_webhooks_are_refused_and_the_routes_need_their_scope() {
    let server = TestServer::new();
    let post = |body: &Value| {
        server.post_json("/api/projects/1/webhooks/", Some(server.admin_key()), body)
    };
    // Loopback is refused unless dev_allow_loopback is on (it is off by default).
    for (body, attr) in [
        (
            json!({"url": "http://127.0.0.1:9/x", "events": ["*"]}),
            "url",
        ),
        (json!({"url": "http://10.1.2.3/x", "events": ["*"]}), "url"),
        (
            json!({"url": "ftp://example.com/x", "events": ["*"]}),
            "url",
        ),
        (
            json!({"url": "https://example.com/x", "events": ["Flag.updated"]}),
            "events",
        ),
        (
            json!({"url": "https://example.com/x", "events": []}),
            "events",
        ),
        (json!({"events": ["*"]}), "url"),
    ] {
        let res = post(&body);
        assert_eq!(res.status(), 400, "{body}");
        assert_eq!(error_body(res)["attr"], attr, "{body}");
    }
    let made = post(&json!({"url": "https://hooks.example.com/x", "events": ["Person.deleted"]}));
    assert_eq!(made.status(), 201);
    let made: Value = made.json().expect("json");
    assert!(
        made["secret"].as_str().is_some_and(|s| s.len() > 32),
        "a secret is made"
    );
    let id = made["id"].as_str().expect("id");

    let (_, reader) = server.create_key(&["feature_flag:read"], None);
    let res = server.get("/api/projects/1/webhooks/", Some(&reader));
    assert_eq!(res.status(), 403);
    let (_, viewer) = server.create_key(&["webhook:read"], None);
    let listed: Value = server
        .get("/api/projects/1/webhooks/", Some(&viewer))
        .json()
        .expect("json");
    assert_eq!(listed["count"], 1);
    let res = server.patch_json(
        &format!("/api/projects/1/webhooks/{id}/"),
        Some(&viewer),
        &json!({"enabled": false}),
    );
    assert_eq!(res.status(), 403, "writing needs webhook:write");
    let gone = server.delete(
        &format!("/api/projects/1/webhooks/{id}/"),
        Some(server.admin_key()),
    );
    assert_eq!(gone.status(), 204);
    let res = server.get(
        &format!("/api/projects/1/webhooks/{id}/"),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 404);
}
