//! Early-access features, surveys and experiments over real HTTP: their admin APIs and 4xx
//! cases, the public lists the browser SDK reads, and how `/flags` serves them.

mod common;

use std::time::Duration;

use common::{error_body, wait_until, TestServer};
use serde_json::{json, Value};

fn flags_for(server: &TestServer, distinct_id: &str, extra: Value) -> Value {
    let mut body = json!({"token": server.creds.project_token, "distinct_id": distinct_id});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let res = server.post_json("/flags/?v=2", None, &body);
    assert_eq!(res.status(), 200);
    res.json().expect("json")
}

fn capture(server: &TestServer, events: &[Value]) {
    let res = server.capture_batch(events);
    assert_eq!(res.status(), 200, "capture");
}

fn expect_error(res: reqwest::blocking::Response, status: u16) -> Value {
    assert_eq!(res.status(), status);
    error_body(res)
}

#[test]
fn early_access_features_enroll_people_through_their_flag() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let feature = server.admin_post(
        "/api/projects/1/early_access_feature/",
        &json!({"name": "New Editor", "description": "Try it", "stage": "beta",
                "documentation_url": "https://docs.example.com/editor", "payload": {"tier": 2}}),
        201,
    );
    let id = feature["id"].as_str().expect("id").to_string();
    assert_eq!(feature["feature_flag"]["key"], "new-editor");
    assert_eq!(
        feature["feature_flag"]["filters"]["feature_enrollment"],
        true
    );

    // The public list: beta by default, stages repeatable.
    let token = server.creds.project_token.clone();
    let public: Value = server
        .get(&format!("/api/early_access_features/?token={token}"), None)
        .json()
        .expect("json");
    let f = &public["earlyAccessFeatures"][0];
    assert_eq!(f["flagKey"], "new-editor");
    assert_eq!(f["documentationUrl"], "https://docs.example.com/editor");
    assert_eq!(f["payload"], json!({"tier": 2}));
    let none: Value = server
        .get(
            &format!("/api/early_access_features/?token={token}&stage=alpha&stage=concept"),
            None,
        )
        .json()
        .expect("json");
    assert_eq!(none["earlyAccessFeatures"], json!([]));

    // Not enrolled: the flag's own release conditions (0 %) apply.
    assert_eq!(
        flags_for(&server, "ann", json!({}))["flags"]["new-editor"]["enabled"],
        false
    );
    // The SDK's opt-in event sets the person property; the next /flags call reflects it.
    capture(
        &server,
        &[
            json!({"event": "$identify", "distinct_id": "ann", "properties": {"$set": {"email": "ann@example.com"}}}),
            json!({"event": "$feature_enrollment_update", "distinct_id": "ann", "properties": {
            "$feature_flag": "new-editor", "$feature_enrollment": true,
            "$set": {"$feature_enrollment/new-editor": true}}}),
        ],
    );
    let answer = flags_for(&server, "ann", json!({}));
    assert_eq!(answer["flags"]["new-editor"]["enabled"], true, "{answer}");
    assert_eq!(
        answer["flags"]["new-editor"]["reason"]["code"],
        "super_condition_value"
    );
    // A client that sends no `$set` enrolls through the event's own fields.
    capture(
        &server,
        &[
            json!({"event": "$feature_enrollment_update", "distinct_id": "dan",
        "properties": {"$feature_flag": "new-editor", "$feature_enrollment": true}}),
        ],
    );
    assert_eq!(
        flags_for(&server, "dan", json!({}))["flags"]["new-editor"]["enabled"],
        true
    );
    // Request overrides (what posthog-js sends before the event lands) work too.
    let answer = flags_for(
        &server,
        "bob",
        json!({"person_properties": {"$feature_enrollment/new-editor": true}}),
    );
    assert_eq!(answer["flags"]["new-editor"]["enabled"], true);

    // Admin API round trip and 4xx cases.
    let path = format!("/api/projects/1/early_access_feature/{id}/");
    let updated = server.admin_patch(
        &path,
        &json!({"stage": "general-availability", "rollout_to_all": true}),
        200,
    );
    assert_eq!(
        updated["feature_flag"]["filters"]["groups"][0]["rollout_percentage"],
        100.0
    );
    assert_eq!(
        flags_for(&server, "carl", json!({}))["flags"]["new-editor"]["enabled"],
        true
    );
    let body = expect_error(
        server.patch_json(&path, Some(&key), &json!({"stage": "gamma"})),
        400,
    );
    assert_eq!(body["attr"], "stage");
    let res = server.get(
        &format!("/api/early_access_features/?token={token}&stage=omega"),
        None,
    );
    expect_error(res, 400);
    let body = expect_error(
        server.post_json(
            "/api/projects/1/early_access_feature/",
            Some(&key),
            &json!({"name": "X", "stage": "beta", "feature_flag_id": 9999}),
        ),
        400,
    );
    assert_eq!(body["detail"], "Feature Flag with this ID does not exist");
    expect_error(
        server.get(
            "/api/projects/1/early_access_feature/not-a-uuid/",
            Some(&key),
        ),
        404,
    );
    expect_error(
        server.get(
            &format!(
                "/api/projects/1/early_access_feature/{}/",
                uuid::Uuid::nil()
            ),
            Some(&key),
        ),
        404,
    );
    let body = expect_error(server.get("/api/early_access_features/", None), 401);
    assert_eq!(body["code"], "missing_api_key");
    let body = expect_error(
        server.get("/api/early_access_features/?token=phc_nope", None),
        401,
    );
    assert_eq!(body["code"], "invalid_api_key");
    let (_, narrow) = server.create_key(&["feature_flag:read"], None);
    expect_error(
        server.get("/api/projects/1/early_access_feature/", Some(&narrow)),
        403,
    );

    assert_eq!(server.delete(&path, Some(&key)).status(), 204);
    expect_error(server.get(&path, Some(&key)), 404);
}

fn survey_body(name: &str, extra: Value) -> Value {
    let mut body = json!({"name": name, "type": "popover",
        "questions": [{"type": "rating", "question": "How likely are you to recommend us?", "scale": 10},
                      {"type": "single_choice", "question": "Plan?", "choices": ["free", "pro"]}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

#[test]
fn surveys_are_served_hidden_after_an_answer_counted_and_stopped_at_their_limit() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let token = server.creds.project_token.clone();
    let survey = server.admin_post(
        "/api/projects/1/surveys/",
        &survey_body(
            "NPS",
            json!({"start_date": "2024-01-01T00:00:00Z", "responses_limit": 2,
                                   "appearance": {"backgroundColor": "#eee"},
                                   "conditions": {"url": "/pricing"}}),
        ),
        201,
    );
    let id = survey["id"].as_str().expect("id").to_string();
    let internal = survey["internal_targeting_flag"]["key"]
        .as_str()
        .expect("flag")
        .to_string();
    assert!(internal.starts_with("survey-targeting-") && internal.ends_with("-custom"));
    assert_eq!(survey["created_by"]["email"], server.creds.email);

    let public: Value = server
        .get(&format!("/api/surveys/?token={token}"), None)
        .json()
        .expect("json");
    let s = &public["surveys"][0];
    assert_eq!(s["id"], id.as_str());
    assert_eq!(s["internal_targeting_flag_key"], internal.as_str());
    assert_eq!(s["questions"][1]["choices"], json!(["free", "pro"]));
    assert_eq!(s["conditions"]["url"], "/pricing");
    assert!(s.get("responses_limit").is_none() && s.get("description").is_none());
    assert!(public.get("survey_config").is_some());

    // The internal flag shows the survey until the person answers (the SDK's `$set`).
    assert_eq!(
        flags_for(&server, "ann", json!({}))["flags"][&internal]["enabled"],
        true
    );
    let answer = |who: &str, submission: &str| {
        json!({"event": "survey sent", "distinct_id": who, "properties": {
            "$survey_id": id, "$survey_submission_id": submission, "$survey_response": "9",
            "$set": {format!("$survey_responded/{id}"): true}}})
    };
    capture(
        &server,
        &[
            json!({"event": "$identify", "distinct_id": "ann", "properties": {"$set": {"email": "a@x.com"}}}),
            json!({"event": "survey shown", "distinct_id": "ann", "properties": {"$survey_id": id}}),
            json!({"event": "survey shown", "distinct_id": "bob", "properties": {"$survey_id": id}}),
            json!({"event": "survey dismissed", "distinct_id": "bob", "properties": {"$survey_id": id}}),
            answer("ann", "s1"),
        ],
    );
    assert_eq!(
        flags_for(&server, "ann", json!({}))["flags"][&internal]["enabled"],
        false
    );

    let stats = server.admin_get(&format!("/api/projects/1/surveys/{id}/stats/"));
    assert_eq!(stats["stats"]["survey shown"]["total_count"], 2);
    assert_eq!(stats["stats"]["survey dismissed"]["unique_persons"], 1);
    assert_eq!(stats["stats"]["survey sent"]["total_count"], 1);
    assert_eq!(stats["stats"]["survey sent"]["unique_persons"], 1);
    assert_eq!(stats["rates"]["response_rate"], 50.0);

    // A second response reaches the limit: the survey stops on its own.
    capture(&server, &[answer("carl", "s2")]);
    let stopped = wait_until(Duration::from_secs(20), || {
        !server.admin_get(&format!("/api/projects/1/surveys/{id}/"))["end_date"].is_null()
    });
    assert!(stopped, "the survey stopped at its response limit");
    let config: Value = server
        .get(&format!("/array/{token}/config"), None)
        .json()
        .expect("json");
    assert_eq!(config["surveys"], false, "no running survey left");
    assert_eq!(
        flags_for(&server, "dan", json!({}))["flags"].get(&internal),
        None
    );

    // DELETE archives.
    let path = format!("/api/projects/1/surveys/{id}/");
    assert_eq!(server.delete(&path, Some(&key)).status(), 204);
    assert_eq!(server.admin_get(&path)["archived"], true);
    let public: Value = server
        .get(&format!("/api/surveys/?token={token}"), None)
        .json()
        .expect("json");
    assert_eq!(public["surveys"], json!([]));
}

#[test]
fn survey_validation_errors() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let post = |body: Value| server.post_json("/api/projects/1/surveys/", Some(&key), &body);
    let cases = [
        (
            json!({"name": "A", "type": "popover", "questions": [{"type": "essay", "question": "?"}]}),
            "Question type must be one of",
        ),
        (
            json!({"name": "A", "type": "modal", "questions": []}),
            "is not a valid choice",
        ),
        (
            json!({"name": "A", "type": "api", "questions": [{"type": "open"}]}),
            "Question text is required",
        ),
        (
            json!({"name": "A", "type": "api", "questions": [], "linked_flag_id": 4242}),
            "Feature Flag with this ID does not exist",
        ),
        (
            json!({"name": "A", "type": "api", "questions": [], "schedule": "hourly"}),
            "Schedule must be one of",
        ),
        (
            json!({"name": "A", "type": "api", "questions": [], "appearance": [1]}),
            "Appearance must be an object",
        ),
        (
            json!({"name": "A", "type": "api", "questions": [],
                "targeting_flag_filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}),
            "rolls out to everyone",
        ),
        (
            json!({"type": "api", "questions": []}),
            "This field is required.",
        ),
    ];
    for (body, expected) in cases {
        let error = expect_error(post(body.clone()), 400);
        assert!(
            error["detail"]
                .as_str()
                .is_some_and(|d| d.contains(expected)),
            "{body} → {error}"
        );
    }
    expect_error(server.get("/api/projects/1/surveys/123/", Some(&key)), 404);
    expect_error(
        server.get(
            &format!("/api/projects/1/surveys/{}/", uuid::Uuid::nil()),
            Some(&key),
        ),
        404,
    );
    let body = expect_error(server.get("/api/surveys/", None), 401);
    assert_eq!(body["code"], "missing_api_key");
    let body = expect_error(server.get("/api/surveys/?token=phc_nope", None), 401);
    assert_eq!(body["code"], "invalid_api_key");
    let res = server.get(
        &format!(
            "/api/projects/1/surveys/{}/stats/?date_from=yesterday-ish",
            uuid::Uuid::nil()
        ),
        Some(&key),
    );
    expect_error(res, 400);
}

#[test]
fn experiments_assign_variants_respect_holdouts_and_report_results() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let token = server.creds.project_token.clone();
    let holdout = server.admin_post(
        "/api/projects/1/experiment_holdouts/",
        &json!({"name": "Hold 100", "filters": [{"properties": [], "rollout_percentage": 100}]}),
        201,
    );
    let held = server.admin_post(
        "/api/projects/1/experiments/",
        &json!({"name": "Held", "feature_flag_key": "held-exp", "holdout_id": holdout["id"]}),
        201,
    );
    let experiment = server.admin_post(
        "/api/projects/1/experiments/",
        &json!({"name": "Pricing", "feature_flag_key": "pricing-exp",
                "parameters": {"feature_flag_variants": [
                    {"key": "control", "rollout_percentage": 50}, {"key": "test", "rollout_percentage": 50}]},
                "metrics": [{"kind": "ExperimentMetric", "metric_type": "mean",
                             "source": {"kind": "EventsNode", "event": "purchase", "math": "sum",
                                        "math_property": "amount"}}]}),
        201,
    );
    let id = experiment["id"].as_u64().expect("id");
    assert_eq!(experiment["status"], "draft");
    assert_eq!(experiment["feature_flag"]["active"], false);
    assert_eq!(
        flags_for(&server, "u1", json!({}))["flags"].get("pricing-exp"),
        None
    );

    let base = format!("/api/projects/1/experiments/{id}");
    let launched = server.admin_post(&format!("{base}/launch/"), &json!({}), 200);
    assert_eq!(launched["status"], "running");
    server.admin_post(
        &format!("/api/projects/1/experiments/{}/launch/", held["id"]),
        &json!({}),
        200,
    );

    // People get variants; everyone is held out of the held experiment.
    let mut exposures = Vec::new();
    for i in 0..40 {
        let who = format!("user-{i}");
        let answer = flags_for(&server, &who, json!({}));
        let variant = answer["flags"]["pricing-exp"]["variant"]
            .as_str()
            .expect("variant")
            .to_string();
        assert!(variant == "control" || variant == "test");
        assert_eq!(
            answer["flags"]["held-exp"]["variant"],
            format!("holdout-{}", holdout["id"])
        );
        exposures.push(json!({"event": "$feature_flag_called", "distinct_id": who,
            "properties": {"$feature_flag": "pricing-exp", "$feature_flag_response": variant}}));
        if i % 2 == 0 {
            exposures.push(json!({"event": "purchase", "distinct_id": who,
                "properties": {"amount": 10 + i, format!("$feature/pricing-exp"): variant}}));
        }
    }
    capture(&server, &exposures);
    // Local evaluation definitions carry the holdout.
    let definitions =
        server.admin_get(&format!("/api/feature_flag/local_evaluation?token={token}"));
    let held_flag = definitions["flags"]
        .as_array()
        .expect("flags")
        .iter()
        .find(|f| f["key"] == "held-exp")
        .expect("held flag");
    assert_eq!(held_flag["filters"]["holdout"]["id"], holdout["id"]);
    assert_eq!(
        held_flag["filters"]["holdout"]["exclusion_percentage"],
        100.0
    );

    let results = server.admin_get(&format!("{base}/results/"));
    let total: u64 = results["exposures"]
        .as_object()
        .expect("exposures")
        .values()
        .map(|v| v.as_u64().unwrap_or(0))
        .sum();
    assert_eq!(total, 40);
    let metric = &results["metrics"][0];
    assert_eq!(metric["metric_type"], "mean");
    let sum = metric["baseline"]["sum"].as_f64().unwrap_or(0.0)
        + metric["variant_results"][0]["sum"].as_f64().unwrap_or(0.0);
    assert_eq!(
        sum,
        (0..40).filter(|i| i % 2 == 0).map(|i| 10 + i).sum::<i64>() as f64
    );
    let test = &metric["variant_results"][0];
    assert_eq!(test["key"], "test");
    assert!(
        test["chance_to_win"]
            .as_f64()
            .is_some_and(|p| (0.0..=1.0).contains(&p)),
        "{test}"
    );
    assert_eq!(test["credible_interval"].as_array().map(Vec::len), Some(2));

    // Lifecycle rules and 4xx cases.
    let body = expect_error(
        server.post_json(&format!("{base}/resume/"), Some(&key), &json!({})),
        400,
    );
    assert!(body["detail"]
        .as_str()
        .is_some_and(|d| d.contains("paused")));
    server.admin_post(&format!("{base}/pause/"), &json!({}), 200);
    assert_eq!(
        flags_for(&server, "user-1", json!({}))["flags"].get("pricing-exp"),
        None
    );
    server.admin_post(&format!("{base}/resume/"), &json!({}), 200);
    expect_error(
        server.post_json(
            &format!("{base}/ship_variant/"),
            Some(&key),
            &json!({"variant_key": "gold"}),
        ),
        400,
    );
    let ended = server.admin_post(&format!("{base}/end/"), &json!({"conclusion": "won"}), 200);
    assert_eq!(ended["status"], "stopped");
    server.admin_post(
        &format!("{base}/ship_variant/"),
        &json!({"variant_key": "test"}),
        200,
    );
    assert_eq!(
        flags_for(&server, "user-1", json!({}))["flags"]["pricing-exp"]["variant"],
        "test"
    );
    let archived = server.admin_post(&format!("{base}/archive/"), &json!({}), 200);
    assert_eq!(archived["archived"], true);
    let listed = server.admin_get("/api/projects/1/experiments/?status=running");
    assert_eq!(listed["count"], 1, "only the held experiment runs");
    expect_error(
        server.get("/api/projects/1/experiments/?status=sideways", Some(&key)),
        400,
    );
    expect_error(server.delete(&format!("{base}/"), Some(&key)), 405);
    expect_error(
        server.get("/api/projects/1/experiments/abc/", Some(&key)),
        404,
    );
    expect_error(
        server.get("/api/projects/1/experiments/9999/results/", Some(&key)),
        404,
    );
    let body = expect_error(
        server.post_json(
            "/api/projects/1/experiments/",
            Some(&key),
            &json!({
        "name": "Bad", "feature_flag_key": "bad",
        "parameters": {"feature_flag_variants": [{"key": "a", "rollout_percentage": 50},
                                                  {"key": "b", "rollout_percentage": 50}]}}),
        ),
        400,
    );
    assert!(body["detail"]
        .as_str()
        .is_some_and(|d| d.contains("control")));
    let (_, narrow) = server.create_key(&["feature_flag:read"], None);
    expect_error(
        server.get("/api/projects/1/experiments/", Some(&narrow)),
        403,
    );
    expect_error(
        server.get("/api/projects/1/experiment_holdouts/77/", Some(&key)),
        404,
    );
}

#[test]
fn events_api_pages_with_a_cursor_while_events_arrive() {
    let server = TestServer::new();
    let base = chrono::Utc::now() - chrono::Duration::hours(1);
    // 2,500 events, many sharing a timestamp, so the cursor needs its tie-breaker.
    let batch: Vec<Value> = (0..2500)
        .map(|i| {
            json!({"event": "paged", "distinct_id": format!("p{}", i % 7),
                        "timestamp": (base + chrono::Duration::seconds(i / 10)).to_rfc3339(),
                        "properties": {"i": i}})
        })
        .collect();
    capture(&server, &batch);
    let mut seen = std::collections::BTreeSet::new();
    let mut url = server.url("/api/projects/1/events/?event=paged&limit=1000");
    let mut pages = 0;
    loop {
        let body: Value = server
            .client
            .get(&url)
            .bearer_auth(server.admin_key())
            .send()
            .expect("page")
            .json()
            .expect("json");
        pages += 1;
        for e in body["results"].as_array().expect("results") {
            assert!(
                seen.insert(e["properties"]["i"].as_i64().expect("i")),
                "no repeats"
            );
        }
        // New events arriving meanwhile are newer than the cursor: they never shift pages.
        capture(
            &server,
            &[json!({"event": "paged", "distinct_id": "late",
                                  "properties": {"i": 100_000 + pages}})],
        );
        match body["next"].as_str() {
            Some(next) => url = next.to_string(),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 2500, "every event exactly once");
    let res = server.get(
        "/api/projects/1/events/?before_uuid=nope",
        Some(server.admin_key()),
    );
    expect_error(res, 400);
}
