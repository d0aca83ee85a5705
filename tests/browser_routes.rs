//! The public routes a browser calls: CORS and preflights on every answer, every query form and
//! body encoding posthog-js sends to `/flags` and `/decide`, and remote config.

mod common;

use std::io::Write;

use base64::Engine;
use common::{error_body, TestServer};
use corvid_kernel::wire::uri_component;
use reqwest::Method;
use serde_json::{json, Value};

const ORIGIN: &str = "http://shop.test:5173";

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

fn create_flag(server: &TestServer, key: &str, rollout: u32) {
    server.admin_post(
        "/api/projects/1/feature_flags/",
        &json!({"key": key, "filters": {"groups": [{"properties": [], "rollout_percentage": rollout}]}}),
        201,
    );
}

#[test]
fn every_public_route_answers_preflights_and_carries_cors_headers() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let routes = [
        "/flags/".to_string(),
        "/flags".into(),
        "/decide/".into(),
        format!("/array/{token}/config"),
        format!("/array/{token}/config.js"),
        "/api/surveys/".into(),
        "/api/early_access_features/".into(),
        "/i/v0/e/".into(),
    ];
    for route in &routes {
        let res = server
            .client
            .request(Method::OPTIONS, server.url(route))
            .header("origin", ORIGIN)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type,x-site-header",
            )
            .send()
            .expect("preflight");
        assert!(res.status().is_success(), "{route}: {}", res.status());
        let h = res.headers();
        assert_eq!(h["access-control-allow-origin"], ORIGIN, "{route}");
        assert_eq!(h["access-control-allow-credentials"], "true", "{route}");
        assert_eq!(
            h["access-control-allow-headers"], "content-type,x-site-header",
            "{route}"
        );
    }
    // Errors carry CORS too, so a page can read them.
    let res = server
        .client
        .post(server.url("/flags/?v=2"))
        .header("origin", ORIGIN)
        .body("{broken")
        .send()
        .expect("sent");
    assert_eq!(res.status(), 400);
    assert_eq!(res.headers()["access-control-allow-origin"], ORIGIN);
    error_body(res);
    let res = server
        .client
        .get(server.url("/api/surveys/?token=phc_nope"))
        .header("origin", ORIGIN)
        .send()
        .expect("sent");
    assert_eq!(res.status(), 401);
    assert_eq!(res.headers()["access-control-allow-origin"], ORIGIN);
}

#[test]
fn flags_accepts_every_encoding_and_query_form_the_sdks_send() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    create_flag(&server, "everyone", 100);
    // `+` and `/` in the base64 text, `&` and `=` in values: what a naive form decoder breaks.
    let body = json!({"token": token, "distinct_id": "a+b/c?d=e&f>>>", "person_properties": {"k": "ü~~~"}})
        .to_string();
    let lz = lz_str::compress_to_base64(&body);
    let cases: Vec<(&str, String, Vec<u8>, &str)> = vec![
        (
            "base64 form",
            "/flags/?v=2&compression=base64".into(),
            format!("data={}", uri_component(&b64(&body))).into_bytes(),
            "application/x-www-form-urlencoded",
        ),
        (
            "base64 form, + unescaped",
            "/flags/?v=2&compression=base64&ip=1&_=1732400000000&ver=1.449.2".into(),
            format!("data={}", b64(&body)).into_bytes(),
            "application/x-www-form-urlencoded",
        ),
        (
            "gzip-js",
            "/flags/?v=2&compression=gzip-js".into(),
            gzip(body.as_bytes()),
            "text/plain",
        ),
        (
            "gzip by magic bytes",
            "/flags/?v=2".into(),
            gzip(body.as_bytes()),
            "text/plain",
        ),
        (
            "lz64 form",
            "/flags/?v=2&compression=lz64".into(),
            format!("data={}", uri_component(&lz)).into_bytes(),
            "application/x-www-form-urlencoded",
        ),
        (
            "plain JSON",
            "/flags?v=2".into(),
            body.clone().into_bytes(),
            "application/json",
        ),
        (
            "decide v4",
            "/decide/?v=4&compression=base64".into(),
            format!("data={}", uri_component(&b64(&body))).into_bytes(),
            "application/x-www-form-urlencoded",
        ),
    ];
    for (what, path, bytes, content_type) in cases {
        let res = server
            .client
            .post(server.url(&path))
            .header("content-type", content_type)
            .header("origin", ORIGIN)
            .body(bytes)
            .send()
            .expect("sent");
        assert_eq!(res.status(), 200, "{what}");
        assert_eq!(
            res.headers()["access-control-allow-origin"],
            ORIGIN,
            "{what}"
        );
        let answer: Value = res.json().expect("json");
        assert_eq!(
            answer["flags"]["everyone"]["enabled"], true,
            "{what}: {answer}"
        );
    }
    // Capture decodes the very same bodies (one wire decoder).
    let event = json!({"api_key": token, "event": "same-decoder", "distinct_id": "a+b/c?d=e&f>>>",
                       "properties": {"k": "ü~~~"}})
    .to_string();
    let res = server
        .client
        .post(server.url("/e/?compression=base64"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("data={}", b64(&event)))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 200);
    let stored = server.events(1, "event=same-decoder");
    assert_eq!(stored[0]["distinct_id"], "a+b/c?d=e&f>>>");
    assert_eq!(stored[0]["properties"]["k"], "ü~~~");
}

#[test]
fn flags_get_head_and_other_methods() {
    let server = TestServer::new();
    let res = server.get("/flags/?v=2", None);
    assert_eq!(res.status(), 200);
    let body: Value = res.json().expect("json");
    assert_eq!(body["flags"], json!({}));
    assert_eq!(body["config"]["enable_collect_everything"], true);
    let res = server
        .client
        .head(server.url("/flags/"))
        .send()
        .expect("head");
    assert_eq!(res.status(), 200);
    let res = server
        .client
        .put(server.url("/flags/"))
        .body("{}")
        .send()
        .expect("put");
    assert_eq!(res.status(), 405);
    assert_eq!(error_body(res)["code"], "method_not_allowed");
}

#[test]
fn only_survey_flags_are_evaluated_when_asked() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    create_flag(&server, "plain", 100);
    server.admin_post(
        "/api/projects/1/surveys/",
        &json!({"name": "S", "type": "popover", "start_date": "2024-01-01T00:00:00Z",
                "questions": [{"type": "open", "question": "Why?"}]}),
        201,
    );
    let res = server.post_json(
        "/flags/?v=2&only_evaluate_survey_feature_flags=true",
        None,
        &json!({"token": token, "distinct_id": "x"}),
    );
    let body: Value = res.json().expect("json");
    let keys: Vec<&String> = body["flags"].as_object().expect("flags").keys().collect();
    assert_eq!(keys.len(), 1, "{body}");
    assert!(keys[0].starts_with("survey-targeting-"));
    // Survey-only requests are not billed; others are.
    let billed = || -> u64 {
        server
            .usage(1)
            .iter()
            .map(|r| r["flag_requests"].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(billed(), 0);
    server.post_json(
        "/flags/?v=2",
        None,
        &json!({"token": token, "distinct_id": "x"}),
    );
    assert_eq!(billed(), 1);
}

fn remote_config(server: &TestServer) -> Value {
    let token = &server.creds.project_token;
    let res = server.get(&format!("/array/{token}/config"), None);
    assert_eq!(res.status(), 200);
    let cache = res.headers()["cache-control"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(cache.contains("max-age=60"), "{cache}");
    res.json().expect("json")
}

#[test]
fn remote_config_follows_project_settings_flags_and_surveys() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let config = remote_config(&server);
    assert_eq!(config["supportedCompression"], json!(["gzip", "gzip-js"]));
    assert_eq!(config["hasFeatureFlags"], false);
    assert_eq!(config["analytics"]["endpoint"], "/i/v0/e/");
    assert_eq!(config["autocapture_opt_out"], false);
    assert_eq!(config["sessionRecording"], false);
    assert_eq!(config["surveys"], false);
    assert_eq!(config["heatmaps"], false);
    assert_eq!(config["capturePerformance"], false);
    assert_eq!(config["autocaptureExceptions"], false);
    assert_eq!(config["defaultIdentifiedOnly"], true);
    assert_eq!(config["elementsChainAsString"], true);

    let project = server.admin_patch(
        "/api/projects/1/",
        &json!({"autocapture_opt_out": true, "heatmaps_opt_in": true,
                "capture_performance_opt_in": true, "autocapture_exceptions_opt_in": true,
                "default_identified_only": false}),
        200,
    );
    assert_eq!(project["autocapture_opt_out"], true);
    create_flag(&server, "f", 50);
    server.admin_post(
        "/api/projects/1/surveys/",
        &json!({"name": "Running", "type": "popover", "start_date": "2024-01-01T00:00:00Z",
                "questions": [{"type": "open", "question": "Why?"}]}),
        201,
    );
    let config = remote_config(&server);
    assert_eq!(config["autocapture_opt_out"], true);
    assert_eq!(config["heatmaps"], true);
    assert_eq!(config["capturePerformance"]["network_timing"], true);
    assert_eq!(config["autocaptureExceptions"], true);
    assert_eq!(config["defaultIdentifiedOnly"], false);
    assert_eq!(config["hasFeatureFlags"], true);
    assert_eq!(config["surveys"], true);

    // `/flags?config=true` reports the same values.
    let res = server.post_json(
        "/flags/?v=2&config=true",
        None,
        &json!({"token": token, "distinct_id": "d"}),
    );
    let flags: Value = res.json().expect("json");
    for key in [
        "autocapture_opt_out",
        "heatmaps",
        "capturePerformance",
        "hasFeatureFlags",
        "surveys",
        "analytics",
        "autocaptureExceptions",
        "defaultIdentifiedOnly",
    ] {
        assert_eq!(flags[key], config[key], "{key}");
    }
    assert_eq!(flags["config"]["enable_collect_everything"], false);

    // The script fills window._POSTHOG_REMOTE_CONFIG[token].
    let res = server.get(&format!("/array/{token}/config.js"), None);
    assert_eq!(res.status(), 200);
    assert!(res.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("application/javascript"));
    let script = res.text().expect("text");
    assert!(script.contains(&format!("window._POSTHOG_REMOTE_CONFIG['{token}'] = {{")));
    assert!(script.contains("\"heatmaps\":true"));

    // Session recordings cannot be switched on: Corvid does not store them.
    let res = server.patch_json(
        "/api/projects/1/",
        Some(server.admin_key()),
        &json!({"session_recording_opt_in": true}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "session_recording_opt_in");
    let res = server.patch_json(
        "/api/projects/1/",
        Some(server.admin_key()),
        &json!({"not_a_setting": true}),
    );
    assert_eq!(res.status(), 400);
}

#[test]
fn remote_config_rejects_bad_and_unknown_tokens() {
    let server = TestServer::new();
    for path in ["/array/phc_unknown/config", "/array/phc_unknown/config.js"] {
        let res = server.get(path, None);
        assert_eq!(res.status(), 404, "{path}");
        error_body(res);
    }
    let long = "a".repeat(201);
    for token in ["bad%20token", "phc_<x>", long.as_str()] {
        let res = server.get(&format!("/array/{token}/config"), None);
        assert_eq!(res.status(), 400, "{token}");
        assert_eq!(error_body(res)["attr"], "token");
    }
    // `/static/*` is not served without an asset host.
    assert_eq!(server.get("/static/surveys.js", None).status(), 404);
}

#[test]
fn sdk_scripts_are_redirected_to_the_asset_host() {
    let (_dir, mut config) = common::fresh();
    config.browser.assets_url = "http://127.0.0.1:9/cdn".into();
    let server = TestServer::start(config);
    let client = common::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let res = client
        .get(server.url("/static/surveys.js?v=1.449.2"))
        .header("origin", ORIGIN)
        .send()
        .expect("sent");
    assert_eq!(res.status(), 302);
    assert_eq!(
        res.headers()["location"],
        "http://127.0.0.1:9/cdn/static/surveys.js?v=1.449.2"
    );
    assert_eq!(res.headers()["access-control-allow-origin"], ORIGIN);
}
