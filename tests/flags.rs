//! Feature flags over real HTTP: definitions, `/flags` rules, local-evaluation definitions, and
//! posthog-python agreeing with both the server and the reference hash vectors.

mod common;

use common::{error_body, sdk, TestServer};
use serde_json::{json, Value};

fn create_flag(server: &TestServer, project: u64, body: Value) -> Value {
    let res = server.post_json(
        &format!("/api/projects/{project}/feature_flags/"),
        Some(server.admin_key()),
        &body,
    );
    assert_eq!(res.status(), 201, "create flag {body}");
    res.json().expect("json")
}

fn evaluate(server: &TestServer, body: Value, headers: &[(&str, &str)]) -> Value {
    let mut req = server.client.post(server.url("/flags?v=2")).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().expect("sent");
    assert_eq!(res.status(), 200);
    res.json().expect("json")
}

fn reference_flags(server: &TestServer) {
    // Group type "company" must exist for group flags: a $groupidentify creates it.
    let res = server.capture_batch(&[json!({"event": "$groupidentify", "distinct_id": "setup", "properties": {"$group_type": "company", "$group_key": "acme-inc", "$group_set": {"plan": "enterprise"}}})]);
    assert_eq!(res.status(), 200);
    create_flag(
        server,
        1,
        json!({"key": "simple-flag", "filters": {"groups": [{"properties": [], "rollout_percentage": 45}]}}),
    );
    create_flag(
        server,
        1,
        json!({"key": "multivariate-flag", "filters": {
        "groups": [{"properties": [], "rollout_percentage": 55}],
        "multivariate": {"variants": [{"key": "first", "rollout_percentage": 50}, {"key": "second", "rollout_percentage": 20}, {"key": "third", "rollout_percentage": 20}, {"key": "fourth", "rollout_percentage": 5}, {"key": "fifth", "rollout_percentage": 5}]},
        "payloads": {"first": "{\"color\": \"red\"}", "second": "{\"color\": \"blue\"}"}}}),
    );
    create_flag(
        server,
        1,
        json!({"key": "email-flag", "filters": {"groups": [{"properties": [{"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person"}], "rollout_percentage": 100}]}}),
    );
    create_flag(
        server,
        1,
        json!({"key": "group-flag", "filters": {"aggregation_group_type_index": 0, "groups": [{"properties": [], "rollout_percentage": 50}]}}),
    );
}

/// The expected value of each reference flag for distinct_id_i (reference §11 vectors 5, 7, 8).
fn expected(i: usize, flag: &str) -> Value {
    let simple = [1, 2, 4, 7, 9, 11, 12, 14, 18, 19];
    let variants = [
        "second", "second", "first", "", "", "second", "first", "", "", "", "first", "third", "",
        "first", "second", "first", "", "", "fourth", "first",
    ];
    match flag {
        "simple-flag" => json!(simple.contains(&i)),
        "multivariate-flag" if variants[i].is_empty() => json!(false),
        "multivariate-flag" => json!(variants[i]),
        "email-flag" => json!(i % 3 == 0),
        // acme-inc hashes to 0.443 for group-flag: inside 50 % whenever the group is sent.
        _ => json!(i % 2 == 0),
    }
}

#[test]
fn posthog_python_remote_and_local_evaluation_agree_with_the_reference() {
    let server = TestServer::new();
    reference_flags(&server);
    let out = sdk::run_python(
        "flags.py",
        &[
            &server.base,
            &server.creds.project_token,
            server.admin_key(),
        ],
    );
    let out: Value = serde_json::from_str(out.lines().last().expect("output")).expect("json");
    for i in 0..20 {
        for flag in [
            "simple-flag",
            "multivariate-flag",
            "email-flag",
            "group-flag",
        ] {
            let key = format!("distinct_id_{i}/{flag}");
            assert_eq!(out["remote"][&key], expected(i, flag), "remote {key}");
            assert_eq!(out["local"][&key], expected(i, flag), "local {key}");
        }
    }
    assert_eq!(
        out["payload"],
        json!({"color": "blue"}),
        "payload of distinct_id_0's variant"
    );
    assert_eq!(out["all"]["multivariate-flag"], "second");
}

#[test]
fn definitions_api_validates_versions_and_soft_deletes() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let flag = create_flag(
        &server,
        1,
        json!({"key": "beta", "name": "Beta", "filters": {"groups": [{"rollout_percentage": 10}]}}),
    );
    assert_eq!(flag["version"], 1);
    let id = flag["id"].as_i64().expect("id");
    let path = format!("/api/projects/1/feature_flags/{id}/");
    let res = server
        .client
        .patch(server.url(&path))
        .bearer_auth(&key)
        .json(&json!({"active": false}))
        .send()
        .expect("patch");
    assert_eq!(res.status(), 200);
    let patched: Value = res.json().expect("json");
    assert_eq!(patched["version"], 2);
    assert_eq!(patched["active"], false);
    assert_eq!(patched["name"], "Beta");

    let bad = [
        (json!({"key": "has space"}), "key"),
        (json!({"key": "beta"}), "key"),
        (
            json!({"key": "v", "filters": {"groups": [], "multivariate": {"variants": [{"key": "a", "rollout_percentage": 60}, {"key": "b", "rollout_percentage": 30}]}}}),
            "filters",
        ),
        (
            json!({"key": "p", "filters": {"groups": [], "payloads": {"true": "{not json"}}}),
            "filters",
        ),
        (
            json!({"key": "o", "filters": {"groups": [{"properties": [{"key": "x", "value": 1, "operator": "sort_of_equals"}]}]}}),
            "filters",
        ),
        (
            json!({"key": "g", "filters": {"aggregation_group_type_index": 3, "groups": []}}),
            "filters",
        ),
        (json!({"key": "u", "surprise": 1}), "surprise"),
    ];
    for (body, attr) in bad {
        let res = server.post_json("/api/projects/1/feature_flags/", Some(&key), &body);
        assert_eq!(res.status(), 400, "{body}");
        assert_eq!(error_body(res)["attr"], attr, "{body}");
    }

    assert_eq!(server.delete(&path, Some(&key)).status(), 204);
    assert_eq!(server.get(&path, Some(&key)).status(), 404);
    let listed: Value = server
        .get("/api/projects/1/feature_flags/", Some(&key))
        .json()
        .expect("json");
    assert_eq!(listed["count"], 0);
    // The key is free again after a soft delete.
    create_flag(&server, 1, json!({"key": "beta"}));

    // Scopes and project isolation.
    let other = server.create_project("Other");
    let (_, read_only) = server.create_key(&["feature_flag:read"], Some(&[1]));
    assert_eq!(
        server
            .post_json(
                "/api/projects/1/feature_flags/",
                Some(&read_only),
                &json!({"key": "nope"})
            )
            .status(),
        403
    );
    assert_eq!(
        server
            .get("/api/projects/1/feature_flags/", Some(&read_only))
            .status(),
        200
    );
    assert_eq!(
        server
            .get(
                &format!("/api/projects/{}/feature_flags/", other["id"]),
                Some(&read_only)
            )
            .status(),
        403
    );
}

#[test]
fn flags_endpoint_rules() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    reference_flags(&server);
    create_flag(
        &server,
        1,
        json!({"key": "server-only", "evaluation_runtime": "server", "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "client-only", "evaluation_runtime": "client", "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "docs-only", "evaluation_contexts": ["docs"], "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "experiment", "filters": {"holdout": {"id": 7, "exclusion_percentage": 100}, "groups": [{"rollout_percentage": 100}]}}),
    );

    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v["flags"]
            .as_object()
            .expect("flags")
            .keys()
            .cloned()
            .collect();
        k.sort();
        k
    };
    let body = json!({"token": token, "distinct_id": "distinct_id_0"});
    let as_server = evaluate(
        &server,
        body.clone(),
        &[("user-agent", "posthog-python/7.91.1")],
    );
    assert!(keys(&as_server).contains(&"server-only".to_string()));
    assert!(!keys(&as_server).contains(&"client-only".to_string()));
    let as_browser = evaluate(
        &server,
        body.clone(),
        &[("user-agent", "Mozilla/5.0 Chrome/131")],
    );
    assert!(keys(&as_browser).contains(&"client-only".to_string()));
    assert!(!keys(&as_browser).contains(&"server-only".to_string()));
    let by_origin = evaluate(
        &server,
        body.clone(),
        &[("user-agent", "custom"), ("origin", "https://x.example")],
    );
    assert!(keys(&by_origin).contains(&"client-only".to_string()));
    let unknown = evaluate(&server, body.clone(), &[("user-agent", "custom")]);
    assert!(
        !keys(&unknown).contains(&"client-only".to_string())
            && !keys(&unknown).contains(&"server-only".to_string())
    );

    assert!(
        keys(&unknown).contains(&"docs-only".to_string()),
        "no contexts in the request: no filtering"
    );
    let web = evaluate(
        &server,
        json!({"token": token, "distinct_id": "d", "evaluation_contexts": ["web"]}),
        &[],
    );
    assert!(!keys(&web).contains(&"docs-only".to_string()));
    let docs = evaluate(
        &server,
        json!({"token": token, "distinct_id": "d", "evaluation_environments": ["docs"]}),
        &[],
    );
    assert!(
        keys(&docs).contains(&"docs-only".to_string()),
        "legacy alias"
    );

    let r = evaluate(&server, body.clone(), &[]);
    let exp = &r["flags"]["experiment"];
    assert_eq!(exp["variant"], "holdout-7");
    assert!(exp["variant"]
        .as_str()
        .expect("variant")
        .starts_with("holdout-"));
    assert_eq!(exp["reason"]["code"], "holdout_condition_value");
    assert_eq!(
        r["flags"]["multivariate-flag"]["metadata"]["payload"],
        "{\"color\": \"blue\"}"
    );
    assert!(r["requestId"]
        .as_str()
        .is_some_and(|id| uuid::Uuid::parse_str(id).is_ok()));
    assert_eq!(r["errorsWhileComputingFlags"], false);
    assert!(r.get("quotaLimited").is_none());

    // Person properties: stored ones are used, the request's override them.
    let res = server.capture_batch(&[json!({"event": "$set", "distinct_id": "stored", "properties": {"$set": {"email": "boss@corp.com"}}})]);
    assert_eq!(res.status(), 200);
    let stored = evaluate(
        &server,
        json!({"token": token, "distinct_id": "stored"}),
        &[],
    );
    assert_eq!(stored["flags"]["email-flag"]["enabled"], true);
    let overridden = evaluate(
        &server,
        json!({"token": token, "distinct_id": "stored", "person_properties": {"email": "x@gmail.com"}}),
        &[],
    );
    assert_eq!(overridden["flags"]["email-flag"]["enabled"], false);

    // Groups: without the group the flag cannot match.
    let no_group = evaluate(&server, json!({"token": token, "distinct_id": "d"}), &[]);
    assert_eq!(
        no_group["flags"]["group-flag"]["reason"]["code"],
        "no_group_type"
    );
    let with_group = evaluate(
        &server,
        json!({"token": token, "distinct_id": "d", "groups": {"company": "acme-inc"}}),
        &[],
    );
    assert_eq!(with_group["flags"]["group-flag"]["enabled"], true);

    let only = evaluate(
        &server,
        json!({"token": token, "distinct_id": "d", "flag_keys_to_evaluate": ["simple-flag"]}),
        &[],
    );
    assert_eq!(keys(&only), vec!["simple-flag".to_string()]);

    // config=true extras; legacy v1 shape.
    let res = server
        .client
        .post(server.url("/flags/?v=2&config=true"))
        .json(&body)
        .send()
        .expect("sent");
    let with_config: Value = res.json().expect("json");
    assert_eq!(with_config["config"]["enable_collect_everything"], true);
    assert_eq!(
        with_config["supportedCompression"],
        json!(["gzip", "gzip-js", "lz64"])
    );
    assert_eq!(with_config["isAuthenticated"], false);
    let res = server
        .client
        .post(server.url("/flags?v=1"))
        .json(&body)
        .send()
        .expect("sent");
    let legacy: Value = res.json().expect("json");
    assert_eq!(legacy["featureFlags"]["multivariate-flag"], "second");

    // Errors.
    let res = server
        .client
        .post(server.url("/flags?v=2"))
        .json(&json!({"distinct_id": "d"}))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 401);
    let res = server
        .client
        .post(server.url("/flags?v=2"))
        .json(&json!({"token": "phc_unknown", "distinct_id": "d"}))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 401);
    let res = server
        .client
        .post(server.url("/flags?v=2"))
        .json(&json!({"token": token}))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "distinct_id");

    // Usage counts flag requests.
    assert!(server.usage(1)[0]["flag_requests"].as_u64().expect("count") >= 5);
}

#[test]
fn local_evaluation_definitions_need_a_key_and_support_etags() {
    let server = TestServer::new();
    reference_flags(&server);
    let token = server.creds.project_token.clone();
    for path in ["/api/feature_flag/local_evaluation/", "/flags/definitions"] {
        let url = format!("{path}?token={token}&send_cohorts");
        assert_eq!(server.get(&url, None).status(), 401, "{path}");
        let res = server.get(&url, Some(server.admin_key()));
        assert_eq!(res.status(), 200, "{path}");
        let etag = res.headers()["etag"].to_str().expect("etag").to_string();
        let body: Value = res.json().expect("json");
        assert_eq!(body["flags"].as_array().expect("flags").len(), 4);
        assert_eq!(body["group_type_mapping"], json!({"0": "company"}));
        assert!(body["cohorts"].is_object());
        let res = server
            .client
            .get(server.url(&url))
            .bearer_auth(server.admin_key())
            .header("if-none-match", &etag)
            .send()
            .expect("sent");
        assert_eq!(res.status(), 304, "{path}");
    }
    // A change gives a new ETag at once.
    let before = server
        .get(
            &format!("/flags/definitions?token={token}"),
            Some(server.admin_key()),
        )
        .headers()["etag"]
        .clone();
    create_flag(&server, 1, json!({"key": "fresh"}));
    let after = server
        .get(
            &format!("/flags/definitions?token={token}"),
            Some(server.admin_key()),
        )
        .headers()["etag"]
        .clone();
    assert_ne!(before, after);
    // A key limited to another project cannot read this one's definitions.
    let other = server.create_project("Other");
    let (_, other_key) = server.create_key(
        &["feature_flag:read"],
        Some(&[other["id"].as_u64().expect("id")]),
    );
    assert_eq!(
        server
            .get(
                &format!("/flags/definitions?token={token}"),
                Some(&other_key)
            )
            .status(),
        403
    );
}

#[test]
fn cohorts_property_nested_and_static_drive_flags() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let token = server.creds.project_token.clone();
    let create = |body: Value| -> Value {
        let res = server.post_json("/api/projects/1/cohorts/", Some(&key), &body);
        assert_eq!(res.status(), 201, "{body}");
        res.json().expect("json")
    };
    let pros = create(
        json!({"name": "Pros", "filters": {"properties": {"type": "OR", "values": [{"type": "AND", "values": [
        {"key": "plan", "value": "pro", "type": "person"}, {"key": "country", "value": "FR", "type": "person", "negation": true}]}]}}}),
    );
    let nested = create(
        json!({"name": "Nested", "filters": {"properties": {"type": "AND", "values": [{"type": "AND", "values": [{"key": "id", "value": pros["id"], "type": "cohort"}]}]}}}),
    );
    let vips = create(json!({"name": "VIPs", "is_static": true, "distinct_ids": ["vip-1"]}));
    assert_eq!(vips["count"], 1);
    let res = server
        .client
        .post(server.url("/api/projects/1/cohorts/?name=Uploaded"))
        .bearer_auth(&key)
        .header("content-type", "text/csv")
        .body("distinct_id\nvip-2\n\"vip-3\"\n")
        .send()
        .expect("csv");
    assert_eq!(res.status(), 201);
    let uploaded: Value = res.json().expect("json");
    assert_eq!(uploaded["count"], 2);
    assert_eq!(uploaded["name"], "Uploaded");

    let res = server.post_json("/api/projects/1/cohorts/", Some(&key), &json!({"name": "Broken", "filters": {"properties": {"type": "AND", "values": [{"type": "AND", "values": [{"key": "id", "value": 999, "type": "cohort"}]}]}}}));
    assert_eq!(res.status(), 400, "a nested cohort must exist");
    let res = server.post_json(
        "/api/projects/1/cohorts/",
        Some(&key),
        &json!({"name": "Odd", "colour": "red"}),
    );
    assert_eq!(res.status(), 400);

    let flag_for = |cohort: &Value, flag_key: &str| {
        let body = json!({"key": flag_key, "filters": {"groups": [{"properties": [{"key": "id", "value": cohort["id"], "type": "cohort", "operator": "in"}], "rollout_percentage": 100}]}});
        let res = server.post_json("/api/projects/1/feature_flags/", Some(&key), &body);
        assert_eq!(res.status(), 201);
    };
    flag_for(&nested, "for-pros");
    flag_for(&vips, "for-vips");
    flag_for(&uploaded, "for-uploaded");
    let check = |body: Value| evaluate(&server, body, &[]);
    let pro = check(
        json!({"token": token, "distinct_id": "p", "person_properties": {"plan": "pro", "country": "DE"}}),
    );
    assert_eq!(pro["flags"]["for-pros"]["enabled"], true);
    let pro_fr = check(
        json!({"token": token, "distinct_id": "p", "person_properties": {"plan": "pro", "country": "FR"}}),
    );
    assert_eq!(pro_fr["flags"]["for-pros"]["enabled"], false);
    let vip = check(json!({"token": token, "distinct_id": "vip-1"}));
    assert_eq!(vip["flags"]["for-vips"]["enabled"], true);
    assert_eq!(vip["flags"]["for-uploaded"]["enabled"], false);
    assert_eq!(
        check(json!({"token": token, "distinct_id": "vip-3"}))["flags"]["for-uploaded"]["enabled"],
        true
    );

    // Local evaluation ships dynamic cohorts, never static ones.
    let defs: Value = server
        .get(
            &format!("/flags/definitions?token={token}&send_cohorts"),
            Some(&key),
        )
        .json()
        .expect("json");
    let ids: Vec<String> = defs["cohorts"]
        .as_object()
        .expect("cohorts")
        .keys()
        .cloned()
        .collect();
    assert!(ids.contains(&pros["id"].to_string()) && !ids.contains(&vips["id"].to_string()));
}

#[test]
fn a_stored_person_with_many_properties_decides_each_kind_of_flag_that_reads_it() {
    // A person as apps store them: dozens of properties, of which the flags read a few (the
    // person is decoded for /flags with those only).
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let token = server.creds.project_token.clone();
    let mut set = serde_json::Map::new();
    for i in 0..40 {
        set.insert(format!("$initial_prop_{i}"), json!(format!("value {i}")));
    }
    for (k, v) in [
        ("plan", json!("pro")),
        ("country", json!("DE")),
        ("age", json!(41)),
        ("signed_up_at", json!("2024-03-01T10:00:00Z")),
        ("$feature_enrollment/beta", json!(true)),
        ("tags", json!(["a", "b"])),
    ] {
        set.insert(k.to_string(), v);
    }
    let res = server.capture_batch(&[
        json!({"event": "$identify", "distinct_id": "rich", "properties": {"$set": set}}),
    ]);
    assert_eq!(res.status(), 200);
    let res = server.post_json(
        "/api/projects/1/cohorts/",
        Some(&key),
        &json!({"name": "Germans", "filters": {"properties": {"type": "AND", "values": [
            {"key": "country", "value": ["DE"], "operator": "exact", "type": "person"}]}}}),
    );
    assert_eq!(res.status(), 201);
    let germans: Value = res.json().expect("json");
    let vips = server.post_json(
        "/api/projects/1/cohorts/",
        Some(&key),
        &json!({"name": "VIPs", "is_static": true, "distinct_ids": ["someone-else"]}),
    );
    assert_eq!(vips.status(), 201);
    let vips: Value = vips.json().expect("json");
    let condition = |properties: Value| json!({"groups": [{"properties": properties, "rollout_percentage": 100}]});
    for (flag_key, filters) in [
        (
            "pro",
            condition(
                json!([{"key": "plan", "value": ["pro"], "operator": "exact", "type": "person"}]),
            ),
        ),
        (
            "german",
            condition(json!([{"key": "id", "value": germans["id"], "type": "cohort"}])),
        ),
        (
            "vip",
            condition(json!([{"key": "id", "value": vips["id"], "type": "cohort"}])),
        ),
        (
            "adult",
            condition(json!([{"key": "age", "value": 18, "operator": "gt", "type": "person"}])),
        ),
        (
            "early",
            condition(
                json!([{"key": "signed_up_at", "value": "2024-06-01", "operator": "is_date_before", "type": "person"}]),
            ),
        ),
        (
            "untagged",
            condition(json!([{"key": "nickname", "operator": "is_not_set", "type": "person"}])),
        ),
        (
            "by-id",
            condition(
                json!([{"key": "distinct_id", "value": ["rich"], "operator": "exact", "type": "person"}]),
            ),
        ),
        (
            "beta",
            json!({"feature_enrollment": true, "groups": [{"properties": [], "rollout_percentage": 0}]}),
        ),
    ] {
        create_flag(&server, 1, json!({"key": flag_key, "filters": filters}));
    }
    let body = json!({"token": token, "distinct_id": "rich"});
    // Twice: the second answer reads the person from memory.
    for _ in 0..2 {
        let flags = &evaluate(&server, body.clone(), &[])["flags"];
        for (flag_key, enabled) in [
            ("pro", true),
            ("german", true),
            ("vip", false),
            ("adult", true),
            ("early", true),
            ("untagged", true),
            ("by-id", true),
            ("beta", true),
        ] {
            assert_eq!(
                flags[flag_key]["enabled"], enabled,
                "{flag_key}: {}",
                flags[flag_key]
            );
        }
    }
    // A flag added later reads a property no flag read before.
    create_flag(
        &server,
        1,
        json!({"key": "initial", "filters": condition(json!([{"key": "$initial_prop_7", "value": "value 7", "operator": "exact", "type": "person"}]))}),
    );
    let flags = &evaluate(&server, body, &[])["flags"];
    assert_eq!(flags["initial"]["enabled"], true, "{}", flags["initial"]);
    assert_eq!(flags["pro"]["enabled"], true);
}

#[test]
fn quota_empties_flags_until_raised() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let token = server.creds.project_token.clone();
    create_flag(
        &server,
        1,
        json!({"key": "on", "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    let body = json!({"token": token, "distinct_id": "q"});
    let set_quota = |quota: Value| {
        let res = server
            .client
            .patch(server.url("/api/organizations/@current/"))
            .bearer_auth(&key)
            .json(&json!({"feature_flag_request_quota": quota}))
            .send()
            .expect("patch");
        assert_eq!(res.status(), 200);
        let org: Value = res.json().expect("json");
        assert_eq!(org["feature_flag_request_quota"], quota);
    };
    set_quota(json!(2));
    assert_eq!(
        evaluate(&server, body.clone(), &[])["flags"]["on"]["enabled"],
        true
    );
    assert_eq!(
        evaluate(&server, body.clone(), &[])["flags"]["on"]["enabled"],
        true
    );
    let limited = evaluate(&server, body.clone(), &[]);
    assert_eq!(limited["flags"], json!({}));
    assert_eq!(limited["quotaLimited"], json!(["feature_flags"]));
    assert_eq!(limited["errorsWhileComputingFlags"], false);
    set_quota(Value::Null);
    let unlimited = evaluate(&server, body, &[]);
    assert_eq!(unlimited["flags"]["on"]["enabled"], true);
    assert!(unlimited.get("quotaLimited").is_none());
    let (_, plain) = server.create_key(&["organization:read"], None);
    let res = server
        .client
        .patch(server.url("/api/organizations/@current/"))
        .bearer_auth(&plain)
        .json(&json!({"feature_flag_request_quota": 1}))
        .send()
        .expect("patch");
    assert_eq!(res.status(), 403);
}

#[test]
fn legacy_decide_shapes() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    create_flag(
        &server,
        1,
        json!({"key": "on", "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "off", "filters": {"groups": [{"rollout_percentage": 0}]}}),
    );
    let decide = |v: &str| -> Value {
        let res = server
            .client
            .post(server.url(&format!("/decide/?v={v}")))
            .json(&json!({"token": token, "distinct_id": "d"}))
            .send()
            .expect("sent");
        assert_eq!(res.status(), 200);
        res.json().expect("json")
    };
    assert_eq!(decide("1")["featureFlags"], json!(["on"]));
    assert_eq!(decide("2")["featureFlags"], json!({"on": true}));
    assert_eq!(
        decide("3")["featureFlags"],
        json!({"on": true, "off": false})
    );
    assert_eq!(decide("4")["flags"]["off"]["enabled"], false);
    assert_eq!(decide("3")["config"]["enable_collect_everything"], true);
    // `/decide` includes the config unless `config=false`, in the v2 shape too.
    let v4 = decide("4");
    assert_eq!(v4["config"]["enable_collect_everything"], true);
    assert_eq!(
        v4["supportedCompression"],
        json!(["gzip", "gzip-js", "lz64"])
    );
    assert_eq!(v4["flags"]["on"]["reason"]["code"], "condition_match");
}

#[test]
fn unreadable_stored_data_fails_only_the_flags_that_need_it() {
    let (_dir, mut config) = common::fresh();
    config.flags.stored_read_deadline = std::time::Duration::ZERO;
    let server = TestServer::start(config);
    let token = server.creds.project_token.clone();
    create_flag(
        &server,
        1,
        json!({"key": "rollout-only", "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "needs-plan", "filters": {"groups": [{"properties": [{"key": "plan", "value": "pro", "type": "person"}]}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "overridden", "filters": {"groups": [{"properties": [{"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person"}]}]}}),
    );
    let r = evaluate(
        &server,
        json!({"token": token, "distinct_id": "d", "person_properties": {"email": "a@corp.com"}}),
        &[],
    );
    assert_eq!(r["errorsWhileComputingFlags"], true);
    assert_eq!(r["flags"]["needs-plan"]["failed"], true);
    assert_eq!(r["flags"]["needs-plan"]["enabled"], false);
    assert_eq!(r["flags"]["rollout-only"]["enabled"], true);
    assert!(
        r["flags"]["rollout-only"].get("failed").is_none(),
        "`failed` only appears when true"
    );
    assert_eq!(
        r["flags"]["overridden"]["enabled"], true,
        "the request supplied what it needs"
    );
}

#[test]
fn geoip_fills_person_properties_from_the_client_ip() {
    let (dir, mut config) = common::fresh();
    let db = dir.path().join("city.mmdb");
    sdk::run_python("make_geoip.py", &[db.to_str().expect("utf-8 path")]);
    config.geoip.database_path = Some(db);
    let server = TestServer::start(config);
    let token = server.creds.project_token.clone();
    create_flag(
        &server,
        1,
        json!({"key": "france", "filters": {"groups": [{"properties": [{"key": "$geoip_country_code", "value": "FR", "type": "person"}]}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "paris-tz", "filters": {"groups": [{"properties": [
        {"key": "$geoip_city_name", "value": "Paris", "type": "person"},
        {"key": "$geoip_country_name", "value": "France", "type": "person"},
        {"key": "$geoip_continent_code", "value": "EU", "type": "person"},
        {"key": "$geoip_continent_name", "value": "Europe", "type": "person"},
        {"key": "$geoip_postal_code", "value": "75001", "type": "person"},
        {"key": "$geoip_time_zone", "value": "Europe/Paris", "type": "person"}]}]}}),
    );
    let body = json!({"token": token, "distinct_id": "traveller"});
    let paris = evaluate(
        &server,
        body.clone(),
        &[("x-forwarded-for", "203.0.113.7, 10.0.0.1")],
    );
    assert_eq!(paris["flags"]["france"]["enabled"], true);
    assert_eq!(
        paris["flags"]["paris-tz"]["enabled"], true,
        "all seven properties are filled"
    );
    let austin = evaluate(
        &server,
        body.clone(),
        &[("x-forwarded-for", "198.51.100.20")],
    );
    assert_eq!(austin["flags"]["france"]["enabled"], false);
    let disabled = evaluate(
        &server,
        json!({"token": token, "distinct_id": "traveller", "geoip_disable": true}),
        &[("x-forwarded-for", "203.0.113.7")],
    );
    assert_eq!(
        disabled["flags"]["france"]["enabled"], false,
        "geoip_disable skips the lookup"
    );
    let sent = evaluate(
        &server,
        json!({"token": token, "distinct_id": "traveller", "person_properties": {"$geoip_country_code": "US"}}),
        &[("x-forwarded-for", "203.0.113.7")],
    );
    assert_eq!(
        sent["flags"]["france"]["enabled"], false,
        "values the client sends win"
    );
    let local = evaluate(&server, body, &[]);
    assert_eq!(
        local["flags"]["france"]["enabled"], false,
        "loopback has no location"
    );
}

#[test]
fn cached_person_and_group_data_follow_ingest_writes() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let res = server.capture_batch(&[json!({"event": "$groupidentify", "distinct_id": "setup", "properties": {"$group_type": "company", "$group_key": "other", "$group_set": {}}})]);
    assert_eq!(res.status(), 200);
    create_flag(
        &server,
        1,
        json!({"key": "pro-person", "filters": {"groups": [{"properties": [{"key": "plan", "value": "pro", "type": "person"}]}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "big-company", "filters": {"aggregation_group_type_index": 0, "groups": [{"properties": [{"key": "size", "value": 100, "operator": "gte", "type": "group", "group_type_index": 0}]}]}}),
    );
    let body = json!({"token": token, "distinct_id": "later", "groups": {"company": "acme"}});
    // Twice: the second answer comes from the cache (no person, no group yet).
    for _ in 0..2 {
        let before = evaluate(&server, body.clone(), &[]);
        assert_eq!(before["flags"]["pro-person"]["enabled"], false);
        assert_eq!(before["flags"]["big-company"]["enabled"], false);
    }
    let res = server.capture_batch(&[
        json!({"event": "$set", "distinct_id": "later", "properties": {"$set": {"plan": "pro"}}}),
        json!({"event": "$groupidentify", "distinct_id": "later", "properties": {"$group_type": "company", "$group_key": "acme", "$group_set": {"size": 250}}}),
    ]);
    assert_eq!(res.status(), 200);
    let after = evaluate(&server, body.clone(), &[]);
    assert_eq!(
        after["flags"]["pro-person"]["enabled"], true,
        "person written by ingest is seen"
    );
    assert_eq!(
        after["flags"]["big-company"]["enabled"], true,
        "group written by ingest is seen"
    );
    let res = server.capture_batch(&[
        json!({"event": "$set", "distinct_id": "later", "properties": {"$unset": ["plan"]}}),
    ]);
    assert_eq!(res.status(), 200);
    assert_eq!(
        evaluate(&server, body, &[])["flags"]["pro-person"]["enabled"],
        false,
        "and unset"
    );
}

#[test]
fn group_properties_sent_with_the_request_decide_group_flags_with_or_without_a_stored_group() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    let res = server.capture_batch(&[json!({"event": "$groupidentify", "distinct_id": "setup", "properties": {"$group_type": "company", "$group_key": "small-co", "$group_set": {"size": 5, "industry": "saas"}}})]);
    assert_eq!(res.status(), 200);
    create_flag(
        &server,
        1,
        json!({"key": "big-company", "filters": {"aggregation_group_type_index": 0, "groups": [{"properties": [{"key": "size", "value": 100, "operator": "gte", "type": "group", "group_type_index": 0}]}]}}),
    );
    create_flag(
        &server,
        1,
        json!({"key": "saas", "filters": {"aggregation_group_type_index": 0, "groups": [{"properties": [{"key": "industry", "value": "saas", "type": "group", "group_type_index": 0}]}]}}),
    );
    let ask = |company: &str, group_properties: Value| {
        evaluate(
            &server,
            json!({"token": token, "distinct_id": "someone", "person_properties": {},
                   "groups": {"company": company}, "group_properties": {"company": group_properties}}),
            &[],
        )["flags"]
            .clone()
    };
    // A company never stored, described by the request alone.
    let flags = ask("new-co", json!({"size": 500, "industry": "saas"}));
    assert_eq!(flags["big-company"]["enabled"], true);
    assert_eq!(flags["saas"]["enabled"], true);
    let flags = ask("new-co", json!({"size": 50, "industry": "retail"}));
    assert_eq!(flags["big-company"]["enabled"], false);
    assert_eq!(flags["saas"]["enabled"], false);
    // A stored company: what the request sends wins; what it leaves out is read from storage.
    let flags = ask("small-co", json!({"size": 500, "industry": "retail"}));
    assert_eq!(flags["big-company"]["enabled"], true);
    assert_eq!(flags["saas"]["enabled"], false);
    let flags = ask("small-co", json!({"size": 500}));
    assert_eq!(flags["big-company"]["enabled"], true);
    assert_eq!(
        flags["saas"]["enabled"], true,
        "industry comes from the stored company"
    );
    let flags = ask("small-co", json!({}));
    assert_eq!(flags["big-company"]["enabled"], false, "size 5 is stored");
}

#[test]
fn flag_request_counts_survive_a_clean_restart() {
    let (dir, config) = common::fresh();
    let server = TestServer::start(config.clone());
    let token = server.creds.project_token.clone();
    create_flag(
        &server,
        1,
        json!({"key": "on", "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    for _ in 0..3 {
        evaluate(
            &server,
            json!({"token": token, "distinct_id": "counted"}),
            &[],
        );
    }
    assert_eq!(server.usage(1)[0]["flag_requests"], 3);
    server.stop();
    let server = TestServer::start(config);
    assert_eq!(server.usage(1)[0]["flag_requests"], 3);
    drop(server);
    drop(dir);
}

/// Persons past `memory.persons_bytes` stay on disk; `/flags` reads each in a batch with the
/// other such requests of its worker's turn, and every request still gets its own person.
#[test]
fn persons_past_the_memory_budget_are_read_from_disk_for_flags() {
    let (dir, mut config) = common::fresh();
    // The smallest budget (a floor per shard): about 14,000 of these persons fit.
    config.memory.persons_bytes = 0;
    let server = TestServer::start_in(dir, config);
    let token = server.creds.project_token.clone();
    create_flag(
        &server,
        1,
        json!({"key": "pro-person", "filters": {"groups": [{"properties": [{"key": "plan", "value": "pro", "type": "person"}]}]}}),
    );
    const PERSONS: usize = 30_000;
    let padding = "x".repeat(200);
    for first in (0..PERSONS).step_by(1_000) {
        let events: Vec<Value> = (first..first + 1_000)
            .map(|n| {
                let plan = if n % 2 == 1 { "pro" } else { "free" };
                json!({"event": "$identify", "distinct_id": format!("p{n}"),
                       "properties": {"$set": {"plan": plan, "bio": padding}}})
            })
            .collect();
        assert_eq!(server.capture_batch(&events).status(), 200);
    }
    let on_disk = metric(&server, "corvid_persons_memory_on_disk");
    assert!(on_disk > 1_000.0, "persons moved to disk: {on_disk}");

    // Eight clients at once, each asking for persons spread over every one stored.
    std::thread::scope(|scope| {
        for client in 0..8 {
            let (server, token) = (&server, &token);
            scope.spawn(move || {
                for n in (client..PERSONS).step_by(PERSONS / 64 + 7) {
                    let body = json!({"token": token, "distinct_id": format!("p{n}")});
                    let flags = evaluate(server, body, &[]);
                    assert_eq!(
                        flags["flags"]["pro-person"]["enabled"],
                        n % 2 == 1,
                        "person p{n}: {flags}"
                    );
                    assert_eq!(flags["errorsWhileComputingFlags"], false);
                }
            });
        }
    });
    let reads = metric(&server, "corvid_persons_disk_reads_total");
    let batches = metric(&server, "corvid_persons_disk_read_batches_total");
    assert!(reads > 0.0, "some persons were read from disk");
    assert!(
        batches >= 1.0 && batches <= reads,
        "{reads} reads in {batches} batches"
    );
}

/// A value of `/metrics`.
fn metric(server: &TestServer, name: &str) -> f64 {
    let metrics = server.metrics();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}
