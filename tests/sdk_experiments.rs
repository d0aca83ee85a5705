//! Experiments with the official server SDKs as clients: an experiment is created and launched
//! through the API, posthog-python and posthog-node users get variants (their SDKs report the
//! exposures) and buy something, and the results endpoint shows exactly that.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{sdk, wait_until, TestServer};
use serde_json::{json, Value};

/// Creates and launches an experiment on `flag` with a `purchase` amount metric.
fn launch(server: &TestServer, flag: &str, holdout: Option<&Value>) -> u64 {
    let mut body = json!({"name": format!("Exp {flag}"), "feature_flag_key": flag,
        "parameters": {"feature_flag_variants": [{"key": "control", "rollout_percentage": 50},
                                                 {"key": "test", "rollout_percentage": 50}]},
        "metrics": [{"kind": "ExperimentMetric", "metric_type": "mean",
                     "source": {"kind": "EventsNode", "event": "purchase", "math": "sum",
                                "math_property": "amount"}}]});
    if let Some(h) = holdout {
        body["holdout_id"] = h["id"].clone();
    }
    let e = server.admin_post("/api/projects/1/experiments/", &body, 201);
    let id = e["id"].as_u64().expect("id");
    server.admin_post(
        &format!("/api/projects/1/experiments/{id}/launch/"),
        &json!({}),
        200,
    );
    id
}

/// The server's variant for each user, from `/flags`.
fn server_variants(server: &TestServer, flag: &str, users: &BTreeMap<String, Value>) {
    for (user, sdk_variant) in users {
        let res = server.post_json(
            "/flags/?v=2",
            None,
            &json!({"token": server.creds.project_token, "distinct_id": user}),
        );
        let body: Value = res.json().expect("json");
        assert_eq!(&body["flags"][flag]["variant"], sdk_variant, "{user}");
    }
}

/// Waits until the results count `users` exposed people, then checks the metric sums per
/// variant against what the SDK users bought.
fn check_results(
    server: &TestServer,
    id: u64,
    users: &BTreeMap<String, Value>,
    amount: impl Fn(&str) -> f64,
) {
    let path = format!("/api/projects/1/experiments/{id}/results/");
    let mut results = Value::Null;
    let complete = wait_until(Duration::from_secs(20), || {
        results = server.admin_get(&path);
        let exposed: u64 = results["exposures"]
            .as_object()
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        exposed == users.len() as u64
    });
    assert!(complete, "every SDK user was exposed: {results}");
    let mut expected: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for (user, variant) in users {
        let entry = expected
            .entry(variant.as_str().expect("variant"))
            .or_default();
        entry.0 += 1;
        entry.1 += amount(user);
    }
    for (variant, (people, _)) in &expected {
        assert_eq!(results["exposures"][variant], *people, "{variant}");
    }
    let metric = &results["metrics"][0];
    let mut arms = vec![&metric["baseline"]];
    arms.extend(metric["variant_results"].as_array().expect("variants"));
    for arm in arms {
        let key = arm["key"].as_str().expect("key");
        let (people, total) = expected.get(key).copied().unwrap_or_default();
        assert_eq!(arm["number_of_samples"], people, "{key}");
        assert_eq!(arm["sum"].as_f64(), Some(total), "{key}");
    }
    let test = &metric["variant_results"][0];
    assert!(
        test["chance_to_win"].is_number() || test["error"].is_string(),
        "{test}"
    );
}

fn variants(out: &str) -> BTreeMap<String, Value> {
    let parsed: Value = serde_json::from_str(out.trim()).expect("script output");
    serde_json::from_value(parsed["variants"].clone()).expect("variants")
}

#[test]
fn posthog_python_takes_part_in_an_experiment_and_its_holdout() {
    let server = TestServer::new();
    let holdout = server.admin_post(
        "/api/projects/1/experiment_holdouts/",
        &json!({"name": "Everyone held", "filters": [{"properties": [], "rollout_percentage": 100}]}),
        201,
    );
    launch(&server, "held-py", Some(&holdout));
    let id = launch(&server, "checkout-py", None);
    let out = sdk::run_python(
        "experiment.py",
        &[
            &server.base,
            &server.creds.project_token,
            server.admin_key(),
            "checkout-py",
            "held-py",
            "20",
        ],
    );
    let users = variants(&out);
    assert_eq!(users.len(), 20);
    assert!(
        users.values().all(|v| v == "control" || v == "test"),
        "{users:?}"
    );
    server_variants(&server, "checkout-py", &users);
    let parsed: Value = serde_json::from_str(out.trim()).expect("output");
    let held = format!("holdout-{}", holdout["id"]);
    assert_eq!(
        parsed["held_local"],
        json!([held, held, held]),
        "local evaluation knows holdouts"
    );
    assert_eq!(parsed["held_remote"], json!([held, held, held]));
    check_results(&server, id, &users, |user| {
        10.0 + user
            .trim_start_matches("py-user-")
            .parse::<f64>()
            .expect("index")
    });
}

#[test]
fn posthog_node_takes_part_in_an_experiment() {
    let server = TestServer::new();
    let id = launch(&server, "checkout-node", None);
    let out = sdk::run_node(
        "experiment.mjs",
        &[
            &server.base,
            &server.creds.project_token,
            "checkout-node",
            "20",
        ],
    );
    let users = variants(&out);
    assert_eq!(users.len(), 20);
    server_variants(&server, "checkout-node", &users);
    check_results(&server, id, &users, |user| {
        100.0
            + user
                .trim_start_matches("node-user-")
                .parse::<f64>()
                .expect("index")
    });
}
