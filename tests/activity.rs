//! The activity log over real HTTP: entries written with each change (flags, cohorts, a
//! survey's targeting flag) with the right diff and user, PostHog's listings and paging, the
//! scope they need, a flag's revert (and `/flags` answering the reverted flag), and expiry.

mod common;

use common::{error_body, TestServer};
use serde_json::{json, Value};

fn flags_of(server: &TestServer, distinct_id: &str) -> Value {
    let res = server
        .client
        .post(server.url("/flags?v=2"))
        .json(&json!({"token": server.creds.project_token, "distinct_id": distinct_id}))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 200);
    res.json().expect("json")
}

fn rollout(percentage: u32) -> Value {
    json!({"groups": [{"properties": [], "rollout_percentage": percentage}]})
}

/// A flag's (one condition's) rollout percentage.
fn percentage(flag: &Value) -> f64 {
    flag["filters"]["groups"][0]["rollout_percentage"]
        .as_f64()
        .expect("a rollout")
}

fn enabled(server: &TestServer, key: &str) -> bool {
    flags_of(server, "user-1")["flags"][key]["enabled"] == json!(true)
}

#[test]
fn flag_changes_are_logged_with_their_diff_and_user_and_can_be_reverted() {
    let server = TestServer::new();
    let flag = server.admin_post(
        "/api/projects/1/feature_flags/",
        &json!({"key": "checkout", "name": "New checkout", "filters": rollout(0)}),
        201,
    );
    let id = flag["id"].as_i64().expect("id");
    assert!(!enabled(&server, "checkout"));
    server.admin_patch(
        &format!("/api/projects/1/feature_flags/{id}/"),
        &json!({"filters": rollout(100)}),
        200,
    );
    assert!(enabled(&server, "checkout"));
    server.admin_patch(
        &format!("/api/projects/1/feature_flags/{id}/"),
        &json!({"name": "Checkout v2"}),
        200,
    );

    let history = server.admin_get(&format!("/api/projects/1/feature_flags/{id}/activity/"));
    assert_eq!(history["total_count"], 3, "{history}");
    let results = history["results"].as_array().expect("results");
    let activities: Vec<&str> = results
        .iter()
        .map(|e| e["activity"].as_str().expect("present"))
        .collect();
    assert_eq!(
        activities,
        vec!["updated", "updated", "created"],
        "newest first"
    );
    let rollout_change = &results[1];
    assert_eq!(rollout_change["scope"], "FeatureFlag");
    assert_eq!(rollout_change["item_id"], id.to_string());
    assert_eq!(rollout_change["detail"]["name"], "checkout");
    assert_eq!(rollout_change["user"]["email"], server.creds.email);
    assert_eq!(rollout_change["user"]["is_system"], false);
    assert_eq!(rollout_change["version"], 2);
    let changes = rollout_change["detail"]["changes"]
        .as_array()
        .expect("changes");
    assert_eq!(changes.len(), 1, "only the filters changed: {changes:?}");
    assert_eq!(changes[0]["type"], "FeatureFlag");
    assert_eq!(changes[0]["action"], "changed");
    assert_eq!(changes[0]["field"], "filters");
    assert_eq!(percentage(&json!({"filters": changes[0]["before"]})), 0.0);
    assert_eq!(percentage(&json!({"filters": changes[0]["after"]})), 100.0);
    assert!(rollout_change["created_at"]
        .as_str()
        .expect("time")
        .ends_with('Z'));

    // Reverting the rollout change by its id puts back the version before it, whole (the
    // later name change goes too).
    let rollout_entry = rollout_change["id"].as_str().expect("entry id").to_string();
    let reverted = server.admin_post(
        &format!("/api/projects/1/feature_flags/{id}/revert/"),
        &json!({"activity_log_id": rollout_entry}),
        200,
    );
    assert_eq!(reverted["restored_version"], 1);
    assert_eq!(reverted["reverted_activity_log_id"], json!(rollout_entry));
    let flag = &reverted["feature_flag"];
    assert_eq!(percentage(flag), 0.0);
    assert_eq!(flag["name"], "New checkout");
    assert_eq!(flag["version"], 4, "a revert is the next version");
    let mut applied: Vec<&str> = reverted["applied_fields"]
        .as_array()
        .expect("fields")
        .iter()
        .map(|f| f.as_str().expect("present"))
        .collect();
    applied.sort();
    assert_eq!(applied, vec!["filters", "name"]);
    assert!(
        !enabled(&server, "checkout"),
        "/flags answers the reverted flag"
    );
    let stored = server.admin_get(&format!("/api/projects/1/feature_flags/{id}/"));
    assert_eq!(percentage(&stored), 0.0);

    // The revert is logged, and undoing it (the newest revertible change) restores version 3.
    let history = server.admin_get(&format!("/api/projects/1/feature_flags/{id}/activity/"));
    let newest = &history["results"][0];
    assert_eq!(newest["activity"], "reverted");
    assert_eq!(
        newest["detail"]["context"]["reverted_activity_log_id"],
        json!(rollout_entry)
    );
    let again = server.admin_post(
        &format!("/api/projects/1/feature_flags/{id}/revert/"),
        &json!({}),
        200,
    );
    assert_eq!(again["restored_version"], 3);
    assert_eq!(percentage(&again["feature_flag"]), 100.0);
    assert_eq!(again["feature_flag"]["name"], "Checkout v2");
    assert!(enabled(&server, "checkout"));

    // A creation cannot be reverted; an entry of another flag is not this flag's.
    let created = history["results"]
        .as_array()
        .expect("present")
        .last()
        .expect("present")["id"]
        .clone();
    let res = server.post_json(
        &format!("/api/projects/1/feature_flags/{id}/revert/"),
        Some(server.admin_key()),
        &json!({"activity_log_id": created}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "activity_log_id");
    let other = server.admin_post(
        "/api/projects/1/feature_flags/",
        &json!({"key": "other", "filters": rollout(10)}),
        201,
    );
    let res = server.post_json(
        &format!("/api/projects/1/feature_flags/{}/revert/", other["id"]),
        Some(server.admin_key()),
        &json!({"activity_log_id": rollout_entry}),
    );
    assert_eq!(res.status(), 404);

    // A soft delete is logged as a deletion.
    let res = server.delete(
        &format!("/api/projects/1/feature_flags/{}/", other["id"]),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 204);
    let all = server.admin_get("/api/projects/1/feature_flags/activity/");
    assert_eq!(all["results"][0]["activity"], "deleted");
    assert_eq!(all["results"][0]["item_id"], other["id"].to_string());
}

#[test]
fn the_project_log_filters_pages_and_needs_its_scope() {
    let server = TestServer::new();
    for i in 0..5 {
        server.admin_post(
            "/api/projects/1/feature_flags/",
            &json!({"key": format!("f{i}"), "filters": rollout(10)}),
            201,
        );
    }
    let cohort = server.admin_post(
        "/api/projects/1/cohorts/",
        &json!({"name": "VIP", "is_static": true, "distinct_ids": ["a", "b"]}),
        201,
    );
    server.admin_patch(
        &format!("/api/projects/1/cohorts/{}/", cohort["id"]),
        &json!({"name": "Very VIP"}),
        200,
    );

    // Cursor paging, newest first, across scopes (the first-run key's creation is in the log
    // too, as the system's: left out here).
    let first =
        server.admin_get("/api/projects/1/activity_log/?scopes=FeatureFlag,Cohort&page_size=4");
    let results = first["results"].as_array().expect("results");
    assert_eq!(results.len(), 4);
    assert_eq!(results[0]["scope"], "Cohort");
    assert_eq!(results[0]["detail"]["changes"][0]["field"], "name");
    let next = first["next"].as_str().expect("a next page");
    let rest: Value = server
        .client
        .get(next)
        .bearer_auth(server.admin_key())
        .send()
        .expect("next")
        .json()
        .expect("json");
    assert_eq!(rest["results"].as_array().expect("present").len(), 3);
    assert!(rest["next"].is_null());
    let mut seen: Vec<String> = results
        .iter()
        .chain(rest["results"].as_array().expect("present"))
        .map(|e| e["id"].as_str().expect("present").to_string())
        .collect();
    seen.dedup();
    assert_eq!(seen.len(), 7, "no entry twice");

    // Numbered pages with a count; filters by scope, scopes, item and user.
    let page = server
        .admin_get("/api/projects/1/activity_log/?scopes=FeatureFlag,Cohort&page=2&page_size=5");
    assert_eq!(page["count"], 7);
    assert_eq!(page["results"].as_array().expect("present").len(), 2);
    assert!(page["next"].is_null() && page["previous"].is_string());
    let cohorts = server.admin_get("/api/projects/1/activity_log/?scope=Cohort");
    assert_eq!(cohorts["results"].as_array().expect("present").len(), 2);
    let both = server.admin_get("/api/projects/1/activity_log/?scopes=Cohort,FeatureFlag&page=1");
    assert_eq!(both["count"], 7);
    let item = server.admin_get(&format!(
        "/api/projects/1/activity_log/?scope=Cohort&item_id={}&page=1",
        cohort["id"]
    ));
    assert_eq!(item["count"], 2);
    let me = server.admin_get("/api/users/@me/");
    let mine = server.admin_get(&format!(
        "/api/projects/1/activity_log/?scopes=FeatureFlag,Cohort&user={}&page=1",
        me["uuid"].as_str().expect("present")
    ));
    assert_eq!(mine["count"], 7);
    let nobody = server.admin_get(
        "/api/projects/1/activity_log/?user=00000000-0000-0000-0000-000000000001&page=1",
    );
    assert_eq!(nobody["count"], 0);
    let cohort_history = server.admin_get(&format!(
        "/api/projects/1/cohorts/{}/activity/",
        cohort["id"]
    ));
    assert_eq!(cohort_history["total_count"], 2);
    // A static cohort's members are counted, not listed.
    let created = &cohort_history["results"][1]["detail"]["changes"][0]["after"];
    assert_eq!(created["count"], 2);
    assert!(created.get("static_distinct_ids").is_none());

    // An item the project does not have: 404 (in Corvid's error shape).
    let res = server.get(
        "/api/projects/1/feature_flags/999999/activity/",
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 404);
    assert_eq!(error_body(res)["code"], "not_found");

    // Without activity_log:read: 403.
    let (_, flags_only) = server.create_key(&["feature_flag:read"], None);
    let res = server.get("/api/projects/1/activity_log/", Some(&flags_only));
    assert_eq!(res.status(), 403);
    let (_, reader) = server.create_key(&["activity_log:read"], None);
    let res = server.get("/api/projects/1/activity_log/", Some(&reader));
    assert_eq!(res.status(), 200);
    // Another project's log is empty.
    let other = server.create_project("Other");
    let theirs = server.admin_get(&format!(
        "/api/projects/{}/activity_log/?page=1",
        other["id"]
    ));
    assert_eq!(theirs["count"], 0);
}

#[test]
fn entries_survive_a_restart() {
    let (_dir, config) = common::fresh();
    let server = TestServer::start(config.clone());
    let flag = server.admin_post(
        "/api/projects/1/feature_flags/",
        &json!({"key": "kept", "filters": rollout(10)}),
        201,
    );
    server.admin_patch(
        &format!("/api/projects/1/feature_flags/{}/", flag["id"]),
        &json!({"filters": rollout(20)}),
        200,
    );
    server.stop();
    let server = TestServer::start(config);
    let history = server.admin_get(&format!(
        "/api/projects/1/feature_flags/{}/activity/",
        flag["id"]
    ));
    assert_eq!(history["total_count"], 2);
    let reverted = server.admin_post(
        &format!("/api/projects/1/feature_flags/{}/revert/", flag["id"]),
        &json!({}),
        200,
    );
    assert_eq!(percentage(&reverted["feature_flag"]), 10.0);
}

#[test]
fn product_surfaces_log_their_records_and_the_flags_they_own_as_the_user() {
    let server = TestServer::new();
    let survey = server.admin_post(
        "/api/projects/1/surveys/",
        &json!({"name": "NPS", "type": "popover", "start_date": "2024-01-01T00:00:00Z",
                "questions": [{"type": "open", "question": "Why?"}]}),
        201,
    );
    let id = survey["id"].as_str().expect("id");
    server.admin_patch(
        &format!("/api/projects/1/surveys/{id}/"),
        &json!({"name": "NPS 2"}),
        200,
    );
    let history = server.admin_get(&format!("/api/projects/1/surveys/{id}/activity/"));
    let results = history["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{history}");
    assert_eq!(results[0]["activity"], "updated");
    assert_eq!(results[0]["scope"], "Survey");
    assert_eq!(results[0]["user"]["email"], server.creds.email);
    let fields: Vec<&str> = results[0]["detail"]["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert!(fields.contains(&"name"), "{fields:?}");

    let feature = server.admin_post(
        "/api/projects/1/early_access_feature/",
        &json!({"name": "New Editor", "stage": "beta"}),
        201,
    );
    // The feature's own flag was made by the same user, and is logged as theirs.
    let flag_id = feature["feature_flag"]["id"].as_i64().expect("flag");
    let flag_history = server.admin_get(&format!(
        "/api/projects/1/feature_flags/{flag_id}/activity/"
    ));
    let first = &flag_history["results"]
        .as_array()
        .expect("results")
        .last()
        .expect("created")["user"];
    assert_eq!(first["email"], server.creds.email);
    assert_eq!(first["is_system"], false);
    let res = server.delete(
        &format!(
            "/api/projects/1/early_access_feature/{}/",
            feature["id"].as_str().expect("id")
        ),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 204);
    let features =
        server.admin_get("/api/projects/1/activity_log/?scope=EarlyAccessFeature&page=1");
    let activities: Vec<&str> = features["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|e| e["activity"].as_str().expect("activity"))
        .collect();
    assert_eq!(activities, vec!["deleted", "created"]);

    let experiment = server.admin_post(
        "/api/projects/1/experiments/",
        &json!({"name": "Checkout test", "feature_flag_key": "checkout-test"}),
        201,
    );
    let logged = server.admin_get(&format!(
        "/api/projects/1/experiments/{}/activity/",
        experiment["id"]
    ));
    assert_eq!(logged["results"][0]["activity"], "created");
    assert_eq!(logged["results"][0]["detail"]["name"], "Checkout test");
}

#[test]
fn endpoints_their_versions_and_variables_are_logged() {
    let server = TestServer::new();
    let base = "/api/environments/1";
    let variable = server.admin_post(
        &format!("{base}/insight_variables/"),
        &json!({"name": "Event name", "type": "String", "default_value": "$pageview"}),
        201,
    );
    server.admin_post(
        &format!("{base}/endpoints/"),
        &json!({"name": "counts", "query": {"kind": "HogQLQuery", "query": "SELECT count() FROM events"}}),
        201,
    );
    // A new query makes version 2; deactivating changes the endpoint.
    server.admin_patch(
        &format!("{base}/endpoints/counts/"),
        &json!({"query": {"kind": "HogQLQuery", "query": "SELECT count() AS c FROM events"}}),
        200,
    );
    server.admin_patch(
        &format!("{base}/endpoints/counts/"),
        &json!({"is_active": false}),
        200,
    );
    let res = server.delete(
        &format!("{base}/endpoints/counts/"),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 204);
    let res = server.delete(
        &format!(
            "{base}/insight_variables/{}/",
            variable["id"].as_str().expect("id")
        ),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 204);

    let log = server.admin_get(
        "/api/projects/1/activity_log/?scopes=Endpoint,EndpointVersion,InsightVariable&page=1",
    );
    // (A version's own updates, such as materialization turned off by a new query, are left
    // out of this sequence.)
    let seen: Vec<(String, String, String)> = log["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|e| !(e["scope"] == "EndpointVersion" && e["activity"] == "updated"))
        .map(|e| {
            (
                e["scope"].as_str().expect("scope").to_string(),
                e["activity"].as_str().expect("activity").to_string(),
                e["detail"]["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("InsightVariable", "deleted", "Event name"),
        ("Endpoint", "deleted", "counts"),
        ("Endpoint", "updated", "counts"),
        ("EndpointVersion", "created", "counts v2"),
        ("Endpoint", "updated", "counts"),
        ("EndpointVersion", "created", "counts v1"),
        ("Endpoint", "created", "counts"),
        ("InsightVariable", "created", "Event name"),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(seen, expected, "{log}");
    let results = log["results"].as_array().expect("results");
    let deactivated = &results
        .iter()
        .find(|e| e["scope"] == "Endpoint" && e["activity"] == "updated")
        .expect("the deactivation")["detail"]["changes"];
    assert!(
        deactivated
            .as_array()
            .expect("changes")
            .iter()
            .any(|c| c["field"] == "is_active" && c["before"] == true && c["after"] == false),
        "{deactivated}"
    );
    assert!(results
        .iter()
        .all(|e| e["user"]["email"] == server.creds.email));
}

#[test]
fn a_person_deletion_is_in_the_project_log() {
    let server = TestServer::new();
    let res = server.capture_batch(&[json!({"event": "signup", "distinct_id": "gone-soon",
        "properties": {"$set": {"email": "gone@example.com"}}})]);
    assert_eq!(res.status(), 200);
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || { !server.persons(1, "gone-soon").is_empty() }
    ));
    let uuid = server.persons(1, "gone-soon")[0]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let res = server.delete(
        &format!("/api/projects/1/persons/{uuid}/?delete_events=true"),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 202);
    let log = server.admin_get("/api/projects/1/activity_log/?scope=Person&page=1");
    assert_eq!(log["count"], 1, "{log}");
    let entry = &log["results"][0];
    assert_eq!(entry["activity"], "deleted");
    assert_eq!(entry["item_id"], json!(uuid));
    assert_eq!(entry["detail"]["name"], "gone-soon");
    assert_eq!(entry["detail"]["context"]["delete_events"], true);
    assert_eq!(entry["user"]["email"], server.creds.email);
}

#[test]
fn project_settings_are_logged_with_the_token_masked() {
    let server = TestServer::new();
    server.admin_patch(
        "/api/projects/1/",
        &json!({"name": "Renamed", "heatmaps_opt_in": true}),
        200,
    );
    let res = server
        .client
        .patch(server.url("/api/projects/1/reset_token/"))
        .bearer_auth(server.admin_key())
        .send()
        .expect("reset");
    assert_eq!(res.status(), 200);
    let new_token = res.json::<Value>().expect("json")["api_token"]
        .as_str()
        .expect("token")
        .to_string();
    let log = server.admin_get("/api/projects/1/activity_log/?scope=Team&page=1");
    assert_eq!(log["count"], 2, "{log}");
    let rotation = &log["results"][0]["detail"]["changes"][0];
    assert_eq!(rotation["field"], "api_token");
    assert_eq!(rotation["before"], "masked");
    assert_eq!(rotation["after"], "masked");
    let text = log.to_string();
    assert!(!text.contains(&new_token) && !text.contains(&server.creds.project_token));
    let fields: Vec<&str> = log["results"][1]["detail"]["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert!(fields.contains(&"name"), "{fields:?}");
    assert_eq!(log["results"][1]["detail"]["name"], "Renamed");
}

#[test]
fn personal_api_keys_are_logged_in_the_projects_they_reach_never_with_their_secret() {
    let server = TestServer::new();
    let other = server.create_project("Other");
    let other_id = other["id"].as_u64().expect("id");
    let (id, secret) = server.create_key(&["feature_flag:read"], Some(&[other_id]));
    let res = server.delete(
        &format!("/api/personal_api_keys/{id}/"),
        Some(server.admin_key()),
    );
    assert_eq!(res.status(), 204);
    let log = server.admin_get(&format!(
        "/api/projects/{other_id}/activity_log/?scope=PersonalAPIKey&page=1"
    ));
    let activities: Vec<&str> = log["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|e| e["activity"].as_str().expect("activity"))
        .collect();
    assert_eq!(activities, vec!["deleted", "created"], "{log}");
    let created = &log["results"][1]["detail"]["changes"][0]["after"];
    assert_eq!(created["label"], "test");
    assert_eq!(created["secure_value_sha256"], "masked");
    assert!(!log.to_string().contains(&secret));
    // A key scoped to the other project is not in project 1's log.
    let first = server.admin_get("/api/projects/1/activity_log/?scope=PersonalAPIKey&page=1");
    assert!(first["results"]
        .as_array()
        .expect("results")
        .iter()
        .all(|e| e["item_id"] != json!(id)));
}

#[test]
fn verified_oauth_applications_are_logged_in_the_organization_projects() {
    let server = TestServer::new();
    let admin = server.admin_key().to_string();
    let client_id = "https://app.example.com/oauth/client-metadata.json";
    let res = server.post_json(
        "/api/oauth/verified_clients/",
        Some(&admin),
        &json!({ "client_id": client_id }),
    );
    assert_eq!(res.status(), 201);
    let unverify = || {
        server
            .client
            .delete(server.url("/api/oauth/verified_clients/"))
            .bearer_auth(&admin)
            .json(&json!({ "client_id": client_id }))
            .send()
            .expect("unverify")
            .status()
    };
    assert_eq!(unverify(), 204);
    let log = server.admin_get("/api/projects/1/activity_log/?scope=OAuthApplication&page=1");
    assert_eq!(log["count"], 2, "{log}");
    let seen: Vec<(&str, &str)> = log["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|e| {
            (
                e["activity"].as_str().unwrap_or_default(),
                e["item_id"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![("deleted", client_id), ("created", client_id)],
        "newest first"
    );
    assert_eq!(log["results"][1]["user"]["email"], server.creds.email);
    // Removing a mark that is not there changes nothing and logs nothing.
    assert_eq!(unverify(), 404);
    let log = server.admin_get("/api/projects/1/activity_log/?scope=OAuthApplication&page=1");
    assert_eq!(log["count"], 2);
}
