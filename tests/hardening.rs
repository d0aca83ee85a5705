//! What a stranger can send does not take the server down: decoding bombs, hostile
//! timestamps and dates, floods of sign-ins and OAuth clients, heavy queries, poison background
//! work; and the credential rules that keep one leaked token from becoming more.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::oauth::{approve, authorize_query, pkce, post_token, Browser, CimdServer};
use common::{error_body, fresh, peak_rss, wait_until, TestServer};
use corvid_kernel::wire::lz64::bomb;
use serde_json::{json, Value};

#[test]
fn decoding_bombs_without_a_token_are_refused_within_a_second_and_barely_grow_the_process() {
    let server = TestServer::new();
    let limit = 100u64 << 20; // capture.max_decompressed_bytes
    let seventy_kb = bomb(30_000, b'[');
    assert!(seventy_kb.len() < 80_000);
    let big = bomb(100_000, b'[');
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b' '; 300 << 20]).expect("gzip");
    let gzip_bomb = gz.finish().expect("gzip");
    let before = peak_rss();
    for (route, body, ct) in [
        (
            "/batch/?compression=lz64",
            seventy_kb.clone().into_bytes(),
            "text/plain",
        ),
        (
            "/flags?compression=lz64",
            seventy_kb.clone().into_bytes(),
            "text/plain",
        ),
        (
            "/decide?compression=lz64",
            seventy_kb.into_bytes(),
            "text/plain",
        ),
        ("/e/?compression=lz64", big.into_bytes(), "text/plain"),
        ("/batch/", gzip_bomb.clone(), "application/json"),
        ("/flags?compression=gzip", gzip_bomb, "application/json"),
    ] {
        let started = Instant::now();
        let res = server
            .client
            .post(server.url(route))
            .header("content-type", ct)
            .body(body)
            .send()
            .expect("answered");
        let took = started.elapsed();
        assert_eq!(res.status(), 413, "{route}");
        let err = error_body(res);
        assert_eq!(err["code"], "payload_too_large", "{route}");
        assert!(took < Duration::from_secs(1), "{route} took {took:?}");
    }
    let grew = peak_rss().saturating_sub(before);
    assert!(grew < limit, "the process grew by {grew} bytes");
    assert_eq!(server.health().status(), 200);
}

#[test]
fn hostile_timestamps_offsets_and_dates_get_answers_not_dropped_connections() {
    let server = TestServer::new();
    let token = server.creds.project_token.clone();
    for (timestamp, offset, sent_at) in [
        (json!("1é23"), json!(null), json!(null)),
        (json!("2024-01-01T00:00:00Z"), json!(i64::MAX), json!(null)),
        (json!("2024-01-01T00:00:00Z"), json!(i64::MIN), json!(null)),
        (
            json!("9999-12-31T23:59:59Z"),
            json!(null),
            json!("0001-01-01T00:00:00Z"),
        ),
        (
            json!("0001-01-01T00:00:00Z"),
            json!(null),
            json!("9999-12-31T23:59:59Z"),
        ),
        (json!("1é23"), json!(null), json!("1é23")),
    ] {
        let res = server.post_json(
            "/batch/",
            None,
            &json!({"api_key": token, "sent_at": sent_at, "batch": [
                {"event": "odd", "distinct_id": "t", "timestamp": timestamp, "offset": offset}]}),
        );
        assert_eq!(res.status(), 200, "{timestamp} {offset} {sent_at}");
    }
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let res = server.get(
        &format!("/api/projects/{project}/events/?after=1%C3%A923"),
        Some(&key),
    );
    assert!(
        res.status() == 200 || res.status() == 400,
        "{}",
        res.status()
    );
    // An insight date far past chrono's range: a 400, on a query and on an endpoint's save.
    let trends = json!({"kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "odd"}],
                        "dateRange": {"date_from": "-200000000d"}});
    let res = server.post_json(
        &format!("/api/projects/{project}/query/"),
        Some(&key),
        &json!({"query": trends}),
    );
    assert_eq!(res.status(), 400);
    let res = server.post_json(
        &format!("/api/projects/{project}/endpoints/"),
        Some(&key),
        &json!({"name": "far", "query": trends, "is_materialized": true}),
    );
    assert_eq!(res.status(), 400);
    // A flag whose date filter is a multi-byte-ended relative date still evaluates.
    server.admin_post(
        &format!("/api/projects/{project}/feature_flags/"),
        &json!({"key": "dated", "filters": {"groups": [{"properties": [
            {"key": "joined", "operator": "is_date_before", "value": "1é", "type": "person"}]}]}}),
        201,
    );
    let res = server.post_json(
        "/flags?v=2",
        None,
        &json!({"token": token, "distinct_id": "t", "person_properties": {"joined": "1é23"}}),
    );
    assert_eq!(res.status(), 200);
    assert_eq!(server.health().status(), 200);
}

#[test]
fn a_login_flood_gets_429_while_the_api_keeps_answering() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    let statuses = Arc::new(std::sync::Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let statuses = Arc::clone(&statuses);
            let server = &server;
            scope.spawn(move || {
                let mut browser = Browser::new(server);
                for _ in 0..15 {
                    let page = browser.get("/login").text().expect("page");
                    let fields =
                        common::oauth::sign_in_fields(&page, "nobody@example.com", "wrong");
                    let res = browser.post_form("/login", &fields);
                    let retry = res.headers().get("retry-after").is_some();
                    statuses
                        .lock()
                        .expect("lock")
                        .push((res.status().as_u16(), retry));
                }
            });
        }
        scope.spawn(|| {
            for _ in 0..20 {
                assert_eq!(server.list_projects(&key).status(), 200);
            }
        });
    });
    let statuses = statuses.lock().expect("lock");
    assert!(
        statuses.iter().any(|(s, retry)| *s == 429 && *retry),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|(s, _)| [401, 429].contains(s)),
        "{statuses:?}"
    );
    // The right password is refused too while the address is over its limit.
    let mut browser = Browser::new(&server);
    let page = browser.get("/login").text().expect("page");
    let password = server.creds.password.clone().expect("password");
    let fields = common::oauth::sign_in_fields(&page, &server.creds.email, &password);
    assert_eq!(browser.post_form("/login", &fields).status(), 429);
}

/// A loopback listener that counts connections and closes them.
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, count)
}

fn client_cache(server: &TestServer) -> (f64, f64) {
    let metrics = server.metrics();
    let read = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    };
    (
        read("corvid_oauth_client_cache_entries "),
        read("corvid_oauth_client_cache_bytes "),
    )
}

#[test]
fn a_thousand_oauth_clients_leave_the_cache_at_its_bound_and_failures_are_remembered() {
    let (dir, mut config) = fresh();
    config.oauth.cimd_cache_bytes = 64 * 1024;
    config.oauth.dev_allow_loopback_fetch = true;
    config.rate_limits.authorize_per_ip = NonZeroU32::new(100_000).expect("nonzero");
    let server = TestServer::start_in(dir, config);
    let (port, connections) = counting_listener();
    let (_, challenge) = pkce();
    let authorize = |client_id: &str| {
        server
            .client
            .get(server.url(&format!(
                "/oauth/authorize?{}",
                authorize_query(client_id, "http://127.0.0.1:9/cb", &challenge, &[])
            )))
            .send()
            .expect("answered")
    };
    // A client whose document cannot be fetched: the failure is answered from memory after.
    let failing = format!("https://127.0.0.1:{port}/client.json");
    assert_eq!(authorize(&failing).status(), 400);
    let fetched = connections.load(Ordering::SeqCst);
    assert!(fetched >= 1);
    assert_eq!(authorize(&failing).status(), 400);
    assert_eq!(connections.load(Ordering::SeqCst), fetched, "remembered");
    // A thousand new clients (refused: private addresses) stay within the cache's bytes.
    for i in 0..1000 {
        let res = authorize(&format!("https://10.1.{}.{}/c{i}.json", i / 250, i % 250));
        assert_eq!(res.status(), 400);
    }
    let (entries, bytes) = client_cache(&server);
    assert!(
        bytes <= 64.0 * 1024.0,
        "{entries} entries weigh {bytes} bytes"
    );
    assert!(entries < 1000.0, "{entries} entries");
}

#[test]
fn heavy_queries_are_bounded_per_credential() {
    let (dir, mut config) = fresh();
    config.query.max_concurrent_per_credential = NonZeroUsize::new(1).expect("nonzero");
    let server = TestServer::start_in(dir, config);
    let project = server.creds.project_id;
    let key = server.admin_key().to_string();
    let events: Vec<Value> = (0..200)
        .map(|i| json!({"event": "e", "distinct_id": format!("u{i}")}))
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    // 200³ rows to count: seconds of work.
    let slow = json!({"query": {"kind": "HogQLQuery",
        "query": "SELECT count() FROM events a CROSS JOIN events b CROSS JOIN events c WHERE length(a.distinct_id) + length(c.distinct_id) > 1"}});
    let busy = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            // The probe below may hold the key's one place for a moment: a 429 is retried.
            let mut status = 429;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while status == 429 && std::time::Instant::now() < deadline {
                status = server
                    .post_json(
                        &format!("/api/projects/{project}/query/"),
                        Some(&key),
                        &slow,
                    )
                    .status()
                    .as_u16();
            }
            status
        });
        let seen = Arc::clone(&busy);
        let server = &server;
        let key = &key;
        scope.spawn(move || {
            // While the first runs, a second query of the same key is turned away.
            let saw = wait_until(Duration::from_secs(10), || {
                let res = server.post_json(
                    &format!("/api/projects/{project}/query/"),
                    Some(key),
                    &json!({"query": {"kind": "HogQLQuery", "query": "SELECT 1"}}),
                );
                res.status() == 429 && res.headers().contains_key("retry-after")
            });
            if saw {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        let status = first.join().expect("first query");
        assert!([200, 400, 504].contains(&status), "{status}");
    });
    assert_eq!(
        busy.load(Ordering::SeqCst),
        1,
        "a second concurrent query got 429"
    );
}

/// Signs in, approves `scope` for `client`, exchanges the code: the token response.
fn token_for(server: &TestServer, client: &str, scope: &str) -> Value {
    let redirect = "http://127.0.0.1:5000/cb";
    let mut browser = Browser::new(server);
    let password = server.creds.password.clone().expect("first-run password");
    browser.login(&server.creds.email, &password);
    let (verifier, challenge) = pkce();
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.append_pair("response_type", "code")
        .append_pair("client_id", client)
        .append_pair("redirect_uri", redirect)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256")
        .append_pair("state", "st")
        .append_pair("scope", scope);
    let approved = approve(&mut browser, &q.finish());
    let (status, body, _) = post_token(
        server,
        "/oauth/token",
        &[
            ("grant_type", "authorization_code"),
            ("code", &approved["code"]),
            ("client_id", client),
            ("redirect_uri", redirect),
            ("code_verifier", &verifier),
        ],
    );
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn an_oauth_token_cannot_mint_a_key_and_an_empty_scope_gets_the_minimal_default() {
    let cimd = CimdServer::start();
    let (_dir, server) = common::oauth::oauth_server(&cimd, true, |_| {});
    let client = cimd.client("app.json", "App", &["http://127.0.0.1:5000/cb"]);
    // Nothing grantable asked for: who the user is, and nothing more.
    let minimal = token_for(&server, &client, "openid bogus:read");
    assert_eq!(minimal["scope"], "user:read", "{minimal}");
    let access = minimal["access_token"].as_str().expect("access token");
    assert_eq!(server.me(access).status(), 200);
    assert_eq!(server.list_projects(access).status(), 403);
    // Even with the key-writing scope, a token does not mint a key that would outlive it.
    let writer = token_for(&server, &client, "personal_api_key:write user:read");
    let access = writer["access_token"].as_str().expect("access token");
    let res = server.create_key_with(
        access,
        &json!({"label": "forever", "scopes": ["user:read"]}),
    );
    assert_eq!(res.status(), 403);
    assert_eq!(error_body(res)["code"], "permission_denied");
    // A personal API key still can.
    let res = server.create_key_with(
        server.admin_key(),
        &json!({"label": "fine", "scopes": ["user:read"]}),
    );
    assert_eq!(res.status(), 201);
}

#[test]
fn a_rotated_project_token_is_refused_at_once() {
    let server = TestServer::new();
    let project = server.creds.project_id;
    let old = server.creds.project_token.clone();
    let event =
        |token: &str| json!({"api_key": token, "batch": [{"event": "e", "distinct_id": "d"}]});
    assert_eq!(
        server.post_json("/batch/", None, &event(&old)).status(),
        200
    );
    let rotated = server.admin_patch(
        &format!("/api/projects/{project}/reset_token/"),
        &json!({}),
        200,
    );
    let new = rotated["api_token"]
        .as_str()
        .expect("new token")
        .to_string();
    assert_ne!(new, old);
    assert_eq!(
        server.post_json("/batch/", None, &event(&old)).status(),
        401
    );
    let flags = |token: &str| {
        server
            .post_json(
                "/flags?v=2",
                None,
                &json!({"token": token, "distinct_id": "d"}),
            )
            .status()
    };
    assert_eq!(flags(&old), 401);
    assert_eq!(
        server.post_json("/batch/", None, &event(&new)).status(),
        200
    );
    assert_eq!(flags(&new), 200);
    assert_eq!(
        server.get(&format!("/array/{old}/config"), None).status(),
        404
    );
    let project_json = server.admin_get(&format!("/api/projects/{project}/"));
    assert_eq!(project_json["api_token"], new);
}

#[test]
fn concurrent_project_updates_lose_no_field() {
    let server = TestServer::new();
    let project = server.creds.project_id;
    let fields = [
        ("heatmaps_opt_in", json!(true)),
        ("capture_dead_clicks", json!(true)),
        ("autocapture_exceptions_opt_in", json!(true)),
        ("capture_performance_opt_in", json!(true)),
        ("anonymize_ips", json!(true)),
        ("timezone", json!("Europe/Paris")),
        ("name", json!("Renamed")),
    ];
    std::thread::scope(|scope| {
        for (field, value) in &fields {
            let server = &server;
            scope.spawn(move || {
                for _ in 0..5 {
                    server.admin_patch(
                        &format!("/api/projects/{project}/"),
                        &json!({ *field: value }),
                        200,
                    );
                }
            });
        }
    });
    let stored = server.admin_get(&format!("/api/projects/{project}/"));
    for (field, value) in &fields {
        assert_eq!(&stored[*field], value, "{field} in {stored}");
    }
}

#[test]
fn metrics_can_require_a_key_and_readiness_names_no_backend_text() {
    let (dir, mut config) = fresh();
    config.metrics.require_key = true;
    let server = TestServer::start_in(dir, config);
    assert_eq!(server.get("/metrics", None).status(), 401);
    let res = server.get("/metrics", Some(server.admin_key()));
    assert_eq!(res.status(), 200);
    assert!(res
        .text()
        .expect("text")
        .contains("corvid_http_requests_total"));
    let res = server.readiness();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().expect("json")["status"], "ready");
}

#[test]
fn forwarded_addresses_are_believed_only_from_trusted_proxies() {
    let ip_of = |server: &TestServer, distinct_id: &str| -> Value {
        let res = server
            .client
            .post(server.url("/batch/"))
            .header("x-forwarded-for", "203.0.113.7")
            .json(&json!({"api_key": server.creds.project_token, "batch": [
                {"event": "e", "distinct_id": distinct_id}]}))
            .send()
            .expect("capture");
        assert_eq!(res.status(), 200);
        let events = server.events(
            server.creds.project_id,
            &format!("distinct_id={distinct_id}"),
        );
        events[0]["properties"]["$ip"].clone()
    };
    // The default trusts a proxy on this machine.
    let server = TestServer::new();
    assert_eq!(ip_of(&server, "via-proxy"), "203.0.113.7");
    drop(server);
    let (dir, mut config) = fresh();
    config.server.trusted_proxies = Vec::new();
    let server = TestServer::start_in(dir, config);
    assert_eq!(ip_of(&server, "direct"), "127.0.0.1");
}

#[test]
fn framework_errors_are_json_on_every_route_family() {
    let server = TestServer::new();
    let key = server.admin_key().to_string();
    // A method a route does not allow.
    let res = server
        .client
        .put(server.url("/api/projects/"))
        .bearer_auth(&key)
        .send()
        .expect("sent");
    assert!(
        [404, 405].contains(&res.status().as_u16()),
        "{}",
        res.status()
    );
    error_body(res);
    let res = server
        .client
        .put(server.url("/flags"))
        .send()
        .expect("sent");
    assert_eq!(res.status(), 405);
    assert_eq!(error_body(res)["code"], "method_not_allowed");
    // A form the sign-in route cannot read.
    let res = server
        .client
        .post(server.url("/login"))
        .header("content-type", "application/json")
        .body("{\"email\": 1}")
        .send()
        .expect("sent");
    assert!(res.status().is_client_error());
    error_body(res);
    // Malformed JSON on an API route, a path that is not an id, an unknown route.
    let res = server.post_raw("/api/projects/", Some(&key), "{not json");
    assert_eq!(res.status(), 400);
    error_body(res);
    let res = server.get("/api/projects/not-a-number/", Some(&key));
    assert_eq!(res.status(), 404);
    error_body(res);
    let res = server.get("/no/such/route", None);
    assert_eq!(res.status(), 404);
    error_body(res);
    let res = server.get("/oauth/logo/unknown", None);
    assert_eq!(res.status(), 404);
    error_body(res);
}

#[test]
fn a_flags_body_over_its_decoded_limit_is_refused() {
    let server = TestServer::new();
    let big = json!({"token": server.creds.project_token, "distinct_id": "d",
                     "person_properties": {"pad": "x".repeat(2 << 20)}});
    let res = server.post_json("/flags?v=2", None, &big);
    assert_eq!(res.status(), 413);
    assert_eq!(error_body(res)["code"], "payload_too_large");
}

/// The endpoint's stored query, edited in place (as a record of an older build or a bad
/// migration could be): the API would refuse it.
fn poison_stored_query(data_dir: &std::path::Path, name: &str) {
    // A stopped server's sled threads let go of the directory a moment after it stops.
    let mut db = None;
    assert!(wait_until(Duration::from_secs(10), || {
        db = sled::open(data_dir.join("meta")).ok();
        db.is_some()
    }));
    let db = db.expect("sled");
    let tree = db.open_tree("endpoints").expect("tree");
    let key = tree
        .iter()
        .keys()
        .filter_map(Result::ok)
        .find(|k| k.ends_with(name.as_bytes()))
        .expect("stored endpoint");
    let mut record: Value =
        serde_json::from_slice(&tree.get(&key).expect("read").expect("value")).expect("json");
    for version in record["versions"].as_array_mut().expect("versions") {
        version["query"]["dateRange"] = json!({"date_from": "-200000000d"});
        version["materialization"] = json!({"status": "Running"});
    }
    tree.insert(key, serde_json::to_vec(&record).expect("encode"))
        .expect("write");
    db.flush().expect("flush");
}

#[test]
fn a_poison_endpoint_is_marked_failed_and_the_server_stays_up_across_restarts() {
    let (dir, mut config) = fresh();
    config.endpoints.materialize_check_interval = Duration::from_millis(200);
    // A run the stop cut short counts as a failure: retried after this.
    config.endpoints.materialize_retry = Duration::from_secs(1);
    let data_dir = config.data_dir.clone();
    let server = TestServer::start(config.clone());
    let project = server.creds.project_id;
    let base = format!("/api/projects/{project}/endpoints");
    let trends = json!({"kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "e"}],
                        "dateRange": {"date_from": "-7d"}});
    server.admin_post(
        &base,
        &json!({"name": "poison", "query": trends, "is_materialized": true}),
        201,
    );
    server.admin_post(
        &base,
        &json!({"name": "good", "is_materialized": true,
        "query": {"kind": "HogQLQuery", "query": "SELECT count() AS c FROM events"}}),
        201,
    );
    server.stop();
    poison_stored_query(&data_dir, "poison");

    for _ in 0..2 {
        let server = TestServer::start(config.clone());
        let status =
            |name: &str| server.admin_get(&format!("{base}/{name}/"))["materialization"].clone();
        assert!(
            wait_until(Duration::from_secs(30), || status("poison")["status"]
                == "Failed"),
            "the poison version is marked failed: {}",
            status("poison")
        );
        assert!(status("poison")["error"]
            .as_str()
            .is_some_and(|e| e.contains("out of range")));
        assert!(
            wait_until(Duration::from_secs(30), || status("good")["status"]
                == "Completed"),
            "the others go on: {}",
            status("good")
        );
        assert_eq!(server.health().status(), 200);
        assert_eq!(server.readiness().status(), 200);
        server.stop();
    }
    drop(dir);
}
