//! posthog-python and posthog-node as real clients of capture: events, identify, alias, group
//! identify and historical imports, checked through the read APIs.

mod common;

use common::sdk;
use common::TestServer;
use serde_json::{json, Value};

fn check_sdk_results(server: &TestServer, tag: &str, lib: &str) {
    let user = format!("user-{tag}");
    let persons = server.persons(1, &format!("alias-{tag}"));
    assert_eq!(persons.len(), 1, "{lib}: alias resolves to the person");
    let person = &persons[0];
    let ids: Vec<&str> = person["distinct_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_str().expect("id"))
        .collect();
    for id in [format!("anon-{tag}"), user.clone(), format!("alias-{tag}")] {
        assert!(
            ids.contains(&id.as_str()),
            "{lib}: {id} belongs to the person: {ids:?}"
        );
    }
    assert_eq!(
        person["properties"]["email"],
        format!("{tag}@example.com"),
        "{lib}"
    );
    assert_eq!(person["is_identified"], true, "{lib}");

    let events = server.events(1, &format!("distinct_id={user}&limit=1000"));
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().expect("name"))
        .collect();
    for name in [
        "$identify",
        "$create_alias",
        "$groupidentify",
        "purchase",
        "imported",
    ] {
        assert!(names.contains(&name), "{lib}: {name} stored: {names:?}");
    }
    let purchase = events
        .iter()
        .find(|e| e["event"] == "purchase")
        .expect("purchase");
    assert_eq!(
        purchase["properties"]["$group_0"],
        format!("acme-{tag}"),
        "{lib}"
    );
    assert_eq!(purchase["properties"]["$lib"], lib, "{lib}");
    assert_eq!(purchase["person_id"], person["id"], "{lib}");

    let imported: Vec<&Value> = events.iter().filter(|e| e["event"] == "imported").collect();
    assert_eq!(imported.len(), 3, "{lib}");
    for e in imported {
        let t: chrono::DateTime<chrono::Utc> =
            e["timestamp"].as_str().expect("ts").parse().expect("ts");
        assert!(
            chrono::Utc::now() - t > chrono::Duration::days(9),
            "{lib}: historical timestamp kept"
        );
    }
    let group: Value = server
        .get(
            &format!("/api/projects/1/groups/find?group_type_index=0&group_key=acme-{tag}"),
            Some(server.admin_key()),
        )
        .json()
        .expect("json");
    assert_eq!(
        group["group_properties"],
        json!({"name": "Acme", "employees": 42}),
        "{lib}"
    );
    let usage = server.usage(1);
    assert_eq!(
        usage[0]["historical_events"], 3,
        "{lib}: imports are counted apart"
    );
}

#[test]
fn posthog_python_sends_everything_corvid_stores() {
    let server = TestServer::new();
    sdk::run_python(
        "capture.py",
        &[&server.base, &server.creds.project_token, "py"],
    );
    check_sdk_results(&server, "py", "posthog-python");
    let person = &server.persons(1, "user-py")[0];
    assert_eq!(person["properties"]["plan"], "pro", "set()");
    assert_eq!(person["properties"]["first_seen"], "python", "set_once()");
}

#[test]
fn posthog_node_sends_everything_corvid_stores() {
    let server = TestServer::new();
    sdk::run_node(
        "capture.mjs",
        &[&server.base, &server.creds.project_token, "js"],
    );
    check_sdk_results(&server, "js", "posthog-node");
}
