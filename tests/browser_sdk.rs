//! posthog-js from npm in headless Chromium (Debian's) against the real server: flags of every
//! kind arrive, early-access enrollment and surveys work through the SDK, events are stored,
//! and the browser reports no CORS or network error.

mod common;

use std::time::Duration;

use common::{sdk, wait_until, TestServer};
use serde_json::{json, Value};

fn setup(server: &TestServer) -> String {
    let flag = |body: Value| {
        server.admin_post("/api/projects/1/feature_flags/", &body, 201);
    };
    flag(
        json!({"key": "bool-flag", "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}),
    );
    flag(
        json!({"key": "multi-flag", "filters": {"groups": [{"properties": [], "rollout_percentage": 100}],
        "multivariate": {"variants": [{"key": "red", "rollout_percentage": 50},
                                      {"key": "blue", "rollout_percentage": 50}]}}}),
    );
    flag(
        json!({"key": "payload-flag", "filters": {"groups": [{"properties": [], "rollout_percentage": 100}],
        "payloads": {"true": "{\"banner\": \"Hello\"}"}}}),
    );
    server.admin_post(
        "/api/projects/1/early_access_feature/",
        &json!({"name": "Beta Feature", "stage": "beta", "description": "New things"}),
        201,
    );
    let survey = server.admin_post(
        "/api/projects/1/surveys/",
        &json!({"name": "Browser NPS", "type": "popover", "start_date": "2024-01-01T00:00:00Z",
                "questions": [{"type": "open", "question": "What could be better?"}]}),
        201,
    );
    survey["id"].as_str().expect("survey id").to_string()
}

#[test]
fn posthog_js_in_chromium_gets_flags_surveys_and_early_access_and_sends_events() {
    let server = TestServer::new();
    let survey = setup(&server);
    let token = server.creds.project_token.clone();
    let bundle = sdk::node_dir().join("node_modules/posthog-js/dist/array.full.js");
    let out = sdk::run_python(
        "browser_sdk.py",
        &[&server.base, &token, bundle.to_str().expect("utf-8 path")],
    );
    let page: Value = serde_json::from_str(out.trim()).expect("script output");
    assert_eq!(
        page["problems"],
        json!([]),
        "the browser saw no error: {page}"
    );

    assert_eq!(page["bool"], true);
    assert!(
        page["variant"] == "red" || page["variant"] == "blue",
        "{page}"
    );
    assert_eq!(page["payload"], json!({"banner": "Hello"}));
    assert_eq!(
        page["config"]["config"]["hasFeatureFlags"], true,
        "config.js was loaded"
    );

    let features = page["earlyAccess"].as_array().expect("features");
    assert!(
        features.iter().any(|f| f["flagKey"] == "beta-feature"),
        "{features:?}"
    );
    assert_eq!(page["enabledBeforeEnrollment"], false);
    assert_eq!(page["enabledAfterEnrollment"], true);
    assert_eq!(page["serverSaysEnrolled"], true, "the server agrees");
    assert_eq!(page["enabledAfterReload"], true);

    let has_survey = |list: &Value| {
        list.as_array()
            .is_some_and(|l| l.iter().any(|s| s["id"] == survey.as_str()))
    };
    assert!(has_survey(&page["surveys"]), "{}", page["surveys"]);
    assert!(
        has_survey(&page["activeSurveys"]),
        "{}",
        page["activeSurveys"]
    );

    let requests: Vec<String> = serde_json::from_value(page["requests"].clone()).expect("requests");
    assert!(
        requests.iter().any(|r| r.contains("/flags/?v=2")),
        "{requests:?}"
    );
    assert!(requests
        .iter()
        .any(|r| r.contains(&format!("/array/{token}/config.js"))));

    // Everything the page captured is stored.
    for event in [
        "$pageview",
        "custom_event",
        "$identify",
        "$groupidentify",
        "$feature_enrollment_update",
    ] {
        let stored = wait_until(Duration::from_secs(20), || {
            !server
                .events(1, &format!("event={}", urlencode(event)))
                .is_empty()
        });
        assert!(stored, "{event} was stored");
    }
    let custom = &server.events(1, "event=custom_event")[0];
    assert_eq!(custom["properties"]["plan"], "pro");
    assert_eq!(custom["properties"]["$lib"], "web");
    // The enrollment reached the person: server-side evaluation sees it without overrides.
    let enrolled = wait_until(Duration::from_secs(20), || {
        let res = server.post_json(
            "/flags/?v=2",
            None,
            &json!({"token": token, "distinct_id": "browser-user"}),
        );
        let body: Value = res.json().expect("json");
        body["flags"]["beta-feature"]["enabled"] == true
    });
    assert!(enrolled, "the person's enrollment is stored");
}

fn urlencode(text: &str) -> String {
    text.replace('$', "%24")
}
