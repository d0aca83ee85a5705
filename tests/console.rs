//! The console at /console: its pages behind the sign-in, with a strict CSP and assets that
//! never change under their name; and the whole of it in a real browser (Debian's Chromium,
//! driven by Playwright): sign in, change a flag's rollout, see the diff, revert it (and
//! `/flags` follow), search an endpoint's logs and see a run appear in the live tail, a member
//! refused the admin page and stopped at once when deactivated. Screenshots of every page are
//! kept in the test artifacts.

mod common;

use common::TestServer;
use serde_json::{json, Value};

fn no_redirects(server: &TestServer) -> reqwest::blocking::Client {
    let _ = server;
    common::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

#[test]
fn pages_need_a_session_and_carry_a_strict_policy() {
    let server = TestServer::new();
    let http = no_redirects(&server);
    let res = http
        .get(server.url("/console/projects/1/flags?q=x"))
        .send()
        .expect("get");
    assert_eq!(res.status(), 303);
    let to = res.headers()["location"]
        .to_str()
        .expect("location")
        .to_string();
    assert_eq!(to, "/login?next=%2Fconsole%2Fprojects%2F1%2Fflags%3Fq%3Dx");

    let mut browser = common::oauth::Browser::new(&server);
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );
    let page = browser.get("/console");
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .expect("csp")
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    let html = page.text().expect("html");
    assert!(
        !html.contains("<script>") && !html.contains("style=\""),
        "no inline code"
    );
    let css = html
        .split("href=\"")
        .find_map(|s| s.split('"').next().filter(|u| u.ends_with(".css")))
        .expect("a stylesheet")
        .to_string();
    let asset = browser.get(&css);
    assert_eq!(asset.status(), 200);
    assert!(asset.headers()["cache-control"]
        .to_str()
        .expect("cc")
        .contains("immutable"));
    assert_eq!(
        browser.get("/console/assets/console.0000.css").status(),
        404
    );
    assert_eq!(browser.get("/console/projects/999/flags").status(), 404);
}

#[test]
fn the_console_in_a_real_browser() {
    let server = TestServer::new();
    let flag = server.admin_post(
        "/api/projects/1/feature_flags/",
        &json!({"key": "console-flag", "name": "Console", "filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}}),
        201,
    );
    assert!(flag["id"].is_i64());
    server.admin_post(
        "/api/projects/1/endpoints/",
        &json!({"name": "counts", "query": {"kind": "HogQLQuery", "query": "SELECT 1"}}),
        201,
    );
    let run = server.post_json(
        "/api/projects/1/endpoints/counts/run",
        Some(server.admin_key()),
        &json!({}),
    );
    assert_eq!(run.status(), 200);
    let invite = server.admin_post(
        "/api/organizations/@current/invites/",
        &json!({"target_email": "member@example.com", "level": 1}),
        201,
    );
    let artifacts = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact dir");
    let out = common::sdk::run_python(
        "console_browser.py",
        &[
            &server.base,
            &server.creds.email,
            server.creds.password.as_deref().expect("password"),
            server.admin_key(),
            &server.creds.project_token,
            invite["invite_link"].as_str().expect("link"),
            artifacts.to_str().expect("path"),
        ],
    );
    let r: Value = serde_json::from_str(out.trim().lines().last().expect("output")).expect("json");
    assert_eq!(
        r["console_errors"],
        json!([]),
        "no console errors or CSP violations: {out}"
    );
    assert_eq!(r["login_redirect"], true);
    assert_eq!(r["enabled_before"], false, "{out}");
    assert_eq!(r["rollout_cell"], "100%", "{out}");
    assert_eq!(r["enabled_after_rollout"], true, "{out}");
    let history = r["history_first"].as_str().expect("history");
    assert!(
        history.contains("updated") && history.contains("filters"),
        "{history}"
    );
    assert!(history.contains(&server.creds.email), "{history}");
    assert_eq!(r["enabled_after_revert"], false, "{out}");
    assert!(
        r["revert_notice"]
            .as_str()
            .is_some_and(|n| n.contains("Reverted")),
        "{out}"
    );
    let evaluation = r["evaluation"].as_str().expect("evaluation");
    assert!(
        evaluation.contains("Hash bucket") && evaluation.contains("of 100"),
        "{evaluation}"
    );
    assert!(r["log_rows"].as_u64() >= Some(1), "{out}");
    assert_eq!(r["run_status"], 200);
    assert!(
        r["tailed"]
            .as_str()
            .is_some_and(|t| t.contains("counts") && t.contains("INFO")),
        "{out}"
    );
    for (page, status) in r["statuses"].as_object().expect("statuses") {
        assert_eq!(status, 200, "{page}: {out}");
    }
    assert_eq!(r["team_has_member_table"], true);
    assert_eq!(r["no_js_flags"], json!([200, 1]), "{out}");
    assert_eq!(r["no_js_endpoint"], json!([200, 1]), "{out}");
    assert_eq!(r["member_flags"], 200, "{out}");
    assert_eq!(
        r["member_team"], 403,
        "a member is refused the admin page: {out}"
    );
    assert_eq!(r["deactivate_status"], 204);
    assert!(
        r["member_after_deactivation_url"]
            .as_str()
            .is_some_and(|u| u.contains("/login")),
        "{out}"
    );
    for name in [
        "overview",
        "flag",
        "endpoint-tail",
        "activity",
        "team",
        "member-refused",
    ] {
        let png = std::fs::read(artifacts.join(format!("console-{name}.png"))).expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "{name}");
    }
}

/// The overview's figures, read from its page.
fn tile(html: &str, id: &str) -> String {
    html.split(&format!("id=\"{id}\""))
        .nth(1)
        .and_then(|rest| rest.split('>').nth(1))
        .and_then(|text| text.split('<').next())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_overview_shows_the_ingest_rate_overload_answers_and_storage_per_project() {
    let (dir, mut config) = common::fresh();
    config.ingest.flush_interval = std::time::Duration::from_millis(200);
    let server = TestServer::start_in(dir, config);
    let mut browser = common::oauth::Browser::new(&server);
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );
    let first = browser.get("/console").text().expect("html");
    assert!(
        tile(&first, "ingest-rate").contains("reload"),
        "no rate before a second sample"
    );
    assert_eq!(tile(&first, "overloaded"), "0");
    assert!(first.contains("No segment written yet."));

    let events: Vec<Value> = (0..50)
        .map(|i| json!({"event": "viewed", "distinct_id": format!("u{i}")}))
        .collect();
    assert_eq!(server.capture_batch(&events).status(), 200);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(
        common::wait_until(std::time::Duration::from_secs(10), || {
            let html = browser.get("/console").text().expect("html");
            html.contains("<td>Default project</td><td>1</td><td class=\"num\">")
        }),
        "the project's segments are listed with their bytes"
    );
    let html = browser.get("/console").text().expect("html");
    let rate = tile(&html, "ingest-rate");
    assert!(
        rate.ends_with("events/s") && !rate.starts_with("0.0"),
        "{rate}"
    );
    let storage = html.split("id=\"storage\"").nth(1).expect("storage table");
    assert!(
        storage.contains("B</td>"),
        "bytes in binary units: {storage}"
    );
}
