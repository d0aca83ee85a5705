//! A team over real HTTP: the admin invites someone, who opens the link in a browser, sets a
//! password and is signed in; a member reads what members may and is refused what admins do;
//! levels are guarded; a password change needs the current password; deactivation stops the
//! user's key, session and sign-in at once; every change is in the activity log.

mod common;

use common::oauth::{hidden_fields, Browser};
use common::{error_body, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

const INVITES: &str = "/api/organizations/@current/invites/";

fn invite(server: &TestServer, email: &str, level: u8) -> Value {
    server.admin_post(
        INVITES,
        &json!({"target_email": email, "first_name": "Mia", "level": level}),
        201,
    )
}

/// Opens the invite's link in `browser` and sets `password`: the browser is signed in.
fn join(browser: &mut Browser, link: &str, password: &str) {
    let page = browser.get(link);
    assert_eq!(page.status(), 200);
    let html = page.text().expect("page");
    let mut fields = hidden_fields(&html);
    fields.push(("password".into(), password.into()));
    let path = link
        .split_once("/signup/")
        .map(|(_, id)| format!("/signup/{id}"))
        .expect("path");
    let res = browser.post_form(&path, &fields);
    assert_eq!(res.status(), 303, "joined");
    assert_eq!(res.headers()["location"], "/console");
    assert!(browser.has_cookie("corvid_session"));
}

#[test]
fn an_invitee_joins_sees_what_a_member_may_and_stops_at_once_when_deactivated() {
    let server = TestServer::new();
    let made = invite(&server, "Member@Example.com", 1);
    assert_eq!(made["target_email"], "member@example.com");
    assert_eq!(made["level"], 1);
    assert_eq!(made["is_expired"], false);
    let link = made["invite_link"].as_str().expect("a link").to_string();
    assert!(link.starts_with(&server.base), "{link}");
    let id = made["id"].as_str().expect("id").to_string();
    let info = server.get(&format!("/api/signup/{id}/"), None);
    assert_eq!(info.status(), 200);
    assert_eq!(
        info.json::<Value>().expect("json")["target_email"],
        "member@example.com"
    );

    // A short password is refused on the page; a good one signs the invitee in.
    let mut browser = Browser::new(&server);
    let html = browser.get(&link).text().expect("page");
    assert!(html.contains("member@example.com"));
    let mut fields = hidden_fields(&html);
    fields.push(("password".into(), "short".into()));
    assert_eq!(
        browser
            .post_form(&format!("/signup/{id}"), &fields)
            .status(),
        400
    );
    join(&mut browser, &link, "a-long-member-password");
    assert_eq!(
        server.get(&format!("/api/signup/{id}/"), None).status(),
        404,
        "used up"
    );

    // A member reads the projects' data and the team, through the session…
    let me: Value = browser
        .api(Method::GET, "/api/users/@me/", None, true)
        .json()
        .expect("me");
    assert_eq!(me["email"], "member@example.com");
    let flags = browser.api(Method::GET, "/api/projects/1/feature_flags/", None, true);
    assert_eq!(flags.status(), 200);
    let team: Value = browser
        .api(
            Method::GET,
            "/api/organizations/@current/members/",
            None,
            true,
        )
        .json()
        .expect("members");
    let levels: Vec<(String, i64)> = team["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|m| {
            (
                m["user"]["email"].as_str().expect("email").to_string(),
                m["level"].as_i64().expect("level"),
            )
        })
        .collect();
    assert!(
        levels.contains(&("member@example.com".into(), 1)),
        "{levels:?}"
    );
    assert!(
        levels.contains(&(server.creds.email.clone(), 15)),
        "{levels:?}"
    );
    // …is refused what admins do, and a write without the CSRF token is refused.
    let body = json!({"target_email": "x@example.com"});
    let refused = browser.api(Method::POST, INVITES, Some(&body), true);
    assert_eq!(refused.status(), 403);
    let no_csrf = browser.api(
        Method::POST,
        "/api/personal_api_keys/",
        Some(&json!({"label": "k", "scopes": ["*"]})),
        false,
    );
    assert_eq!(no_csrf.status(), 403);
    // A member's key cannot grant what their session lacks (managing the organization).
    let too_wide = browser.api(
        Method::POST,
        "/api/personal_api_keys/",
        Some(&json!({"label": "k", "scopes": ["*"]})),
        true,
    );
    assert_eq!(too_wide.status(), 400);
    let key = browser.api(
        Method::POST,
        "/api/personal_api_keys/",
        Some(&json!({"label": "k", "scopes": ["feature_flag:read", "user:read"]})),
        true,
    );
    assert_eq!(key.status(), 201);
    let key = key.json::<Value>().expect("key")["value"]
        .as_str()
        .expect("secret")
        .to_string();
    assert_eq!(server.me(&key).status(), 200);

    // Deactivated by the admin: the key, the session and signing in stop at once.
    let member_uuid = me["uuid"].as_str().expect("uuid");
    let gone = server.delete(
        &format!("/api/organizations/@current/members/{member_uuid}/"),
        Some(server.admin_key()),
    );
    assert_eq!(gone.status(), 204);
    assert_eq!(server.me(&key).status(), 401);
    assert_eq!(
        browser
            .api(Method::GET, "/api/users/@me/", None, true)
            .status(),
        401
    );
    let mut again = Browser::new(&server);
    let page = again.get("/login").text().expect("login page");
    let fields =
        common::oauth::sign_in_fields(&page, "member@example.com", "a-long-member-password");
    assert_eq!(again.post_form("/login", &fields).status(), 401);
    let listed = server.admin_get("/api/organizations/@current/members/");
    let member = listed["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|m| m["id"] == member_uuid)
        .expect("still listed")
        .clone();
    assert_eq!(member["is_active"], false);

    // Every step is in the project's activity log.
    let log = server.admin_get("/api/projects/1/activity_log/?scopes=OrganizationMembership,OrganizationInvite,PersonalAPIKey&limit=50");
    let seen: Vec<(String, String)> = log["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|e| {
            (
                e["scope"].as_str().expect("scope").to_string(),
                e["activity"].as_str().expect("activity").to_string(),
            )
        })
        .collect();
    for wanted in [
        ("OrganizationInvite", "created"),
        ("OrganizationInvite", "deleted"),
        ("OrganizationMembership", "created"),
        ("OrganizationMembership", "updated"),
        ("PersonalAPIKey", "deleted"),
    ] {
        assert!(
            seen.contains(&(wanted.0.to_string(), wanted.1.to_string())),
            "{wanted:?} in {seen:?}"
        );
    }
}

#[test]
fn levels_are_guarded_and_the_organization_keeps_an_owner() {
    let server = TestServer::new();
    let made = invite(&server, "admin2@example.com", 8);
    let id = made["id"].as_str().expect("id");
    let res = server.post_json(
        &format!("/api/signup/{id}/"),
        None,
        &json!({"password": "admin-two-password", "first_name": "Ada"}),
    );
    assert_eq!(res.status(), 201);
    let mut admin2 = Browser::new(&server);
    let joined = admin2.api(Method::GET, "/api/users/@me/", None, true);
    assert_eq!(joined.status(), 401, "a fresh browser has no session");
    // Sign in as the new admin.
    let page = admin2.get("/login").text().expect("login page");
    let fields = common::oauth::sign_in_fields(&page, "admin2@example.com", "admin-two-password");
    assert_eq!(admin2.post_form("/login", &fields).status(), 303);

    let owner_uuid = server.me(server.admin_key()).json::<Value>().expect("me")["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let member_path = format!("/api/organizations/@current/members/{owner_uuid}/");
    // An admin cannot touch an owner, nor invite above their level.
    let res = admin2.api(
        Method::PATCH,
        &member_path,
        Some(&json!({"is_active": false})),
        true,
    );
    assert_eq!(res.status(), 403);
    let res = admin2.api(
        Method::POST,
        INVITES,
        Some(&json!({"target_email": "o@example.com", "level": 15})),
        true,
    );
    assert_eq!(res.status(), 403);
    // An admin can invite a member.
    let res = admin2.api(
        Method::POST,
        INVITES,
        Some(&json!({"target_email": "m@example.com"})),
        true,
    );
    assert_eq!(res.status(), 201);
    // The last owner cannot step down; bad levels and existing emails are refused.
    let res = server.patch_json(&member_path, Some(server.admin_key()), &json!({"level": 8}));
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "level");
    let res = server.post_json(
        INVITES,
        Some(server.admin_key()),
        &json!({"target_email": "z@example.com", "level": 5}),
    );
    assert_eq!(res.status(), 400);
    let res = server.post_json(
        INVITES,
        Some(server.admin_key()),
        &json!({"target_email": "admin2@example.com"}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "target_email");
    // The owner can make the admin an owner; then stepping down is allowed.
    let listed = server.admin_get("/api/organizations/@current/members/");
    let admin2_uuid = listed["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|m| m["user"]["email"] == "admin2@example.com")
        .expect("listed")["id"]
        .as_str()
        .expect("uuid")
        .to_string();
    let promoted = server.admin_patch(
        &format!("/api/organizations/@current/members/{admin2_uuid}/"),
        &json!({"level": 15}),
        200,
    );
    assert_eq!(promoted["level"], 15);
    server.admin_patch(&member_path, &json!({"level": 8}), 200);
    // Invites can be listed and cancelled.
    let invites = server.admin_get(INVITES);
    assert_eq!(invites["count"], 1);
    let pending = invites["results"][0]["id"].as_str().expect("id");
    let gone = server.delete(&format!("{INVITES}{pending}/"), Some(server.admin_key()));
    assert_eq!(gone.status(), 204);
    assert_eq!(server.admin_get(INVITES)["count"], 0);
}

#[test]
fn a_password_change_needs_the_current_password() {
    let server = TestServer::new();
    let old = server.creds.password.clone().expect("first-run password");
    let res = server.patch_json(
        "/api/users/@me/",
        Some(server.admin_key()),
        &json!({"current_password": "wrong", "password": "a-brand-new-password"}),
    );
    assert_eq!(res.status(), 400);
    assert_eq!(error_body(res)["attr"], "current_password");
    let res = server.patch_json(
        "/api/users/@me/",
        Some(server.admin_key()),
        &json!({"current_password": old, "password": "short"}),
    );
    assert_eq!(res.status(), 400);
    let res = server.patch_json(
        "/api/users/@me/",
        Some(server.admin_key()),
        &json!({"current_password": old, "password": "a-brand-new-password"}),
    );
    assert_eq!(res.status(), 200);
    let mut browser = Browser::new(&server);
    let page = browser.get("/login").text().expect("login page");
    let fields = common::oauth::sign_in_fields(&page, &server.creds.email, &old);
    assert_eq!(
        browser.post_form("/login", &fields).status(),
        401,
        "the old one is gone"
    );
    browser.login(&server.creds.email, "a-brand-new-password");
    let log = server.admin_get("/api/projects/1/activity_log/?scope=User");
    let entry = &log["results"][0];
    assert_eq!(entry["activity"], "updated");
    assert_eq!(entry["detail"]["changes"][0]["after"], "masked");
}

/// The member row of `email` in the organization's member list.
fn member_of(server: &TestServer, email: &str) -> Value {
    server.admin_get("/api/organizations/@current/members/")["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|m| m["user"]["email"] == email || m["email"] == email)
        .cloned()
        .unwrap_or_else(|| panic!("{email} is listed"))
}

#[test]
fn the_console_team_page_sets_levels_deactivates_and_reactivates() {
    let server = TestServer::new();
    let made = invite(&server, "ops@example.com", 1);
    let mut invitee = Browser::new(&server);
    join(
        &mut invitee,
        made["invite_link"].as_str().expect("link"),
        "a-long-ops-password",
    );
    let uuid = member_of(&server, "ops@example.com")["id"]
        .as_str()
        .expect("id")
        .to_string();
    let mut admin = Browser::new(&server);
    admin.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );
    let page = admin.get("/console/team").text().expect("team page");
    assert!(page.contains("Set level") && page.contains(&uuid), "{page}");
    let csrf = hidden_fields(&page)
        .into_iter()
        .find(|(k, _)| k == "csrf_token")
        .expect("a csrf token")
        .1;
    let post = |admin: &mut Browser, fields: &[(&str, &str)]| {
        let mut all: Vec<(String, String)> = vec![
            ("csrf_token".into(), csrf.clone()),
            ("member".into(), uuid.clone()),
        ];
        all.extend(fields.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        admin.post_form("/console/team/member", &all).status()
    };
    assert_eq!(post(&mut admin, &[("level", "8")]), 303);
    assert_eq!(member_of(&server, "ops@example.com")["level"], 8);
    assert_eq!(post(&mut admin, &[("level", "3")]), 400, "no such level");
    let res = admin.post_form(
        "/console/team/deactivate",
        &[
            ("csrf_token".into(), csrf.clone()),
            ("member".into(), uuid.clone()),
        ],
    );
    assert_eq!(res.status(), 303);
    assert_eq!(member_of(&server, "ops@example.com")["is_active"], false);
    assert_eq!(
        invitee.get("/console/projects/1/flags").status(),
        303,
        "signed out at once"
    );
    assert_eq!(post(&mut admin, &[("is_active", "true")]), 303);
    assert_eq!(member_of(&server, "ops@example.com")["is_active"], true);
    // A form without the session's token changes nothing.
    let res = admin.post_form(
        "/console/team/member",
        &[
            ("member".into(), uuid.clone()),
            ("level".into(), "1".into()),
        ],
    );
    assert_eq!(res.status(), 403);
    assert_eq!(member_of(&server, "ops@example.com")["level"], 8);
}
