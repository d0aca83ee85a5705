//! OAuth 2.0 with Client ID Metadata Documents, end to end over real HTTP: discovery, sign-in,
//! consent, code exchange, refresh rotation, revocation, introspection, and one test per attack
//! in the reference's list. Client documents are served over real TLS by a helper with a
//! throwaway CA that the server is configured (dev switch) to trust.

mod common;

use std::time::Duration;

use common::oauth::*;
use common::TestServer;
use serde_json::Value;

const CALLBACK: &str = "http://127.0.0.1:53682/callback";

fn user_me(server: &TestServer, token: &str) -> reqwest::blocking::Response {
    server.get("/api/users/@me/", Some(token))
}

#[test]
fn discovery_documents_are_complete_and_the_same_on_every_host() {
    let server = TestServer::new();
    let as_meta: Value = server
        .get("/.well-known/oauth-authorization-server", None)
        .json()
        .expect("json");
    assert_eq!(as_meta["issuer"], server.base.as_str());
    for (field, path) in [
        ("authorization_endpoint", "/oauth/authorize/"),
        ("token_endpoint", "/oauth/token/"),
        ("revocation_endpoint", "/oauth/revoke/"),
        ("introspection_endpoint", "/oauth/introspect/"),
    ] {
        assert_eq!(as_meta[field], format!("{}{path}", server.base), "{field}");
    }
    assert_eq!(
        as_meta["response_types_supported"],
        serde_json::json!(["code"])
    );
    assert_eq!(
        as_meta["grant_types_supported"],
        serde_json::json!(["authorization_code", "refresh_token"])
    );
    assert_eq!(
        as_meta["code_challenge_methods_supported"],
        serde_json::json!(["S256"])
    );
    assert_eq!(
        as_meta["token_endpoint_auth_methods_supported"],
        serde_json::json!(["none"])
    );
    assert_eq!(as_meta["client_id_metadata_document_supported"], true);
    let scopes = as_meta["scopes_supported"].as_array().expect("scopes");
    assert!(scopes.contains(&Value::from("endpoint:read")));
    assert!(scopes.contains(&Value::from("feature_flag:write")));

    let prm: Value = server
        .get("/.well-known/oauth-protected-resource", None)
        .json()
        .expect("json");
    assert_eq!(prm["resource"], server.base.as_str());
    assert_eq!(
        prm["authorization_servers"],
        serde_json::json!([server.base])
    );
    assert_eq!(
        prm["bearer_methods_supported"],
        serde_json::json!(["header"])
    );
    assert_eq!(prm["scopes_supported"], as_meta["scopes_supported"]);
    let suffixed: Value = server
        .get("/.well-known/oauth-protected-resource/api/projects", None)
        .json()
        .expect("json");
    assert_eq!(
        suffixed["resource"],
        format!("{}/api/projects", server.base)
    );

    // Asked through another host name (a region host), the documents do not change.
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-protected-resource",
    ] {
        let plain = server.get(path, None).text().expect("text");
        let eu = server
            .client
            .get(server.url(path))
            .header("Host", "eu.corvid.example")
            .send()
            .expect("GET")
            .text()
            .expect("text");
        assert_eq!(plain, eu, "{path}");
    }
}

#[test]
fn bearer_401_points_at_the_protected_resource_metadata() {
    let server = TestServer::new();
    for token in [None, Some("pha_notatoken"), Some("phx_nope")] {
        let res = server.get("/api/users/@me/", token);
        assert_eq!(res.status(), 401);
        let header = res.headers()["www-authenticate"].to_str().expect("header");
        assert_eq!(
            header,
            format!(
                "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource\"",
                server.base
            )
        );
    }
}

#[test]
fn the_whole_flow_issues_tokens_that_work_as_bearer_credentials() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client(
        "client.json",
        "Example Analytics CLI",
        &["http://127.0.0.1/callback"],
    );

    let mut browser = Browser::new(&server);
    let (verifier, challenge) = pkce();
    let query = authorize_query(
        &client_id,
        CALLBACK,
        &challenge,
        &[("resource", &server.base)],
    );
    // Not signed in: off to the sign-in page, which comes back here afterwards.
    let res = browser.get(&format!("/oauth/authorize?{query}"));
    assert_eq!(res.status(), 303);
    let loc = res.headers()["location"]
        .to_str()
        .expect("location")
        .to_string();
    assert!(loc.starts_with("/login?next=%2Foauth%2Fauthorize"), "{loc}");
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );

    let page = browser.get(&format!("/oauth/authorize?{query}"));
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .expect("csp")
        .to_string();
    assert!(csp.contains("frame-ancestors 'none'"));
    let html = page.text().expect("html");
    assert!(html.contains("Authorize Example Analytics CLI"));
    assert!(
        html.contains(&format!("localhost:{}", cimd.port)),
        "client_id host shown"
    );
    assert!(html.contains("127.0.0.1"), "redirect host shown");
    assert!(html.contains("Unverified application"));
    assert!(html.contains("Read your user profile") && html.contains("Read endpoints"));
    assert!(!html.contains("<script"), "no scripts");

    let mut fields = hidden_fields(&html);
    fields.push(("decision".into(), "approve".into()));
    let res = browser.post_form("/oauth/authorize", &fields);
    assert_eq!(res.status(), 303);
    let (to, q) = location(&res);
    assert_eq!(
        format!(
            "{}://{}:{}{}",
            to.scheme(),
            to.host_str().unwrap_or(""),
            to.port().unwrap_or(0),
            to.path()
        ),
        CALLBACK
    );
    assert_eq!(q["state"], "st-123");
    assert_eq!(q["iss"], server.base);

    let (status, body, headers) = post_token(
        &server,
        "/oauth/token",
        &[
            ("grant_type", "authorization_code"),
            ("code", &q["code"]),
            ("client_id", &client_id),
            ("redirect_uri", CALLBACK),
            ("code_verifier", &verifier),
            ("resource", &server.base),
        ],
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 3600);
    assert_eq!(body["scope"], "endpoint:read user:read");
    let access = body["access_token"].as_str().expect("access token");
    assert!(
        access.starts_with("pha_")
            && body["refresh_token"]
                .as_str()
                .expect("refresh")
                .starts_with("phr_")
    );

    // The access token is a bearer credential with exactly its scopes.
    let me = user_me(&server, access);
    assert_eq!(me.status(), 200);
    assert_eq!(
        me.json::<Value>().expect("json")["email"],
        server.creds.email.as_str()
    );
    let project = server.creds.project_id;
    assert_eq!(
        server
            .get(&format!("/api/projects/{project}/endpoints/"), Some(access))
            .status(),
        200
    );
    // Endpoints run with an OAuth token exactly as with a personal API key.
    let created = server.post_json(
        &format!("/api/environments/{project}/endpoints/"),
        Some(server.admin_key()),
        &serde_json::json!({"name": "one", "is_materialized": false,
            "query": {"kind": "HogQLQuery", "query": "SELECT 1 AS one"}}),
    );
    assert_eq!(created.status(), 201);
    let ran = server.post_json(
        &format!("/api/environments/{project}/endpoints/one/run"),
        Some(access),
        &serde_json::json!({}),
    );
    assert_eq!(ran.status(), 200);
    assert_eq!(
        ran.json::<Value>().expect("json")["results"],
        serde_json::json!([[1]])
    );
    let denied = server.get(
        &format!("/api/projects/{project}/feature_flags/"),
        Some(access),
    );
    assert_eq!(denied.status(), 403);
    let challenge = denied.headers()["www-authenticate"]
        .to_str()
        .expect("header")
        .to_string();
    assert!(
        challenge.starts_with("Bearer error=\"insufficient_scope\", scope=\"feature_flag:read\""),
        "{challenge}"
    );

    // Introspection: the token may look at itself; an anonymous caller may not look at all.
    let res = server
        .client
        .post(server.url("/oauth/introspect"))
        .bearer_auth(access)
        .form(&[("token", access)])
        .send()
        .expect("introspect");
    let info: Value = res.json().expect("json");
    assert_eq!(info["active"], true);
    assert_eq!(info["client_id"], client_id.as_str());
    assert_eq!(info["scope"], "endpoint:read user:read");
    let (status, _, _) = post_token(&server, "/oauth/introspect", &[("token", access)]);
    assert_eq!(status, 401);

    // Revocation (RFC 7009) takes effect at once, cache or no cache.
    let (status, _, _) = post_token(
        &server,
        "/oauth/revoke",
        &[("token", access), ("client_id", &client_id)],
    );
    assert_eq!(status, 200);
    assert_eq!(user_me(&server, access).status(), 401);
    let (status, _, _) = post_token(&server, "/oauth/revoke", &[("token", "pha_unknown")]);
    assert_eq!(status, 200, "unknown tokens are still a 200");
}

#[test]
fn refresh_rotates_and_a_reused_refresh_token_revokes_the_grant() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client("client.json", "Refresher", &["http://127.0.0.1/callback"]);
    let first = full_flow(&server, &client_id, CALLBACK);
    let refresh = |token: &str| {
        post_token(
            &server,
            "/oauth/token",
            &[
                ("grant_type", "refresh_token"),
                ("refresh_token", token),
                ("client_id", &client_id),
            ],
        )
    };
    let (status, second, _) = refresh(first["refresh_token"].as_str().expect("rt"));
    assert_eq!(status, 200, "{second}");
    assert_ne!(second["refresh_token"], first["refresh_token"]);
    let new_access = second["access_token"].as_str().expect("at");
    assert_eq!(user_me(&server, new_access).status(), 200);

    // The rotated token comes back: someone copied it. The whole grant dies.
    let (status, err, _) = refresh(first["refresh_token"].as_str().expect("rt"));
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    assert_eq!(user_me(&server, new_access).status(), 401);
    let (status, _, _) = refresh(second["refresh_token"].as_str().expect("rt"));
    assert_eq!(status, 400, "the newest refresh token is revoked too");
}

#[test]
fn pkce_is_required_and_only_s256_with_the_right_verifier_works() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client("client.json", "PKCE", &["http://127.0.0.1/callback"]);
    let mut browser = Browser::new(&server);
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );

    let (verifier, challenge) = pkce();
    for (what, query) in [
        ("missing", {
            let q = authorize_query(&client_id, CALLBACK, &challenge, &[]);
            q.replace(&format!("&code_challenge={challenge}"), "")
        }),
        (
            "plain",
            authorize_query(&client_id, CALLBACK, &verifier, &[]).replace("S256", "plain"),
        ),
    ] {
        let res = browser.get(&format!("/oauth/authorize?{query}"));
        assert_eq!(res.status(), 303, "{what}");
        let (_, q) = location(&res);
        assert_eq!(q["error"], "invalid_request", "{what}");
        assert_eq!(q["state"], "st-123");
    }

    let q = approve(
        &mut browser,
        &authorize_query(&client_id, CALLBACK, &challenge, &[]),
    );
    let exchange = |code: &str, verifier: Option<&str>| {
        let mut f = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("client_id", client_id.as_str()),
            ("redirect_uri", CALLBACK),
        ];
        if let Some(v) = verifier {
            f.push(("code_verifier", v));
        }
        post_token(&server, "/oauth/token", &f)
    };
    let (_, other) = pkce();
    let (status, err, _) = exchange(&q["code"], Some(&other));
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_grant")),
        "wrong verifier"
    );
    let (status, _, _) = exchange(&q["code"], Some(&verifier));
    assert_eq!(status, 400, "a failed PKCE check burns the code");

    let q = approve(
        &mut browser,
        &authorize_query(&client_id, CALLBACK, &challenge, &[]),
    );
    let (status, err, _) = exchange(&q["code"], None);
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_request")),
        "no verifier"
    );
}

#[test]
fn a_code_works_once_and_a_replay_without_its_verifier_revokes_what_it_issued() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client("client.json", "Replay", &["http://127.0.0.1/callback"]);
    let mut browser = Browser::new(&server);
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );
    let (verifier, challenge) = pkce();
    let fields_with = |code: &str, verifier: &str| {
        vec![
            ("grant_type".to_string(), "authorization_code".to_string()),
            ("code".into(), code.to_string()),
            ("client_id".into(), client_id.clone()),
            ("redirect_uri".into(), CALLBACK.into()),
            ("code_verifier".into(), verifier.to_string()),
        ]
    };
    let fields = |code: &str| fields_with(code, &verifier);
    let send = |f: &Vec<(String, String)>| {
        let res = server
            .client
            .post(server.url("/oauth/token"))
            .form(f)
            .send()
            .expect("token");
        (res.status().as_u16(), res.json::<Value>().expect("json"))
    };

    // Sequential replay.
    let q = approve(
        &mut browser,
        &authorize_query(&client_id, CALLBACK, &challenge, &[]),
    );
    let (status, tokens) = send(&fields(&q["code"]));
    assert_eq!(status, 200);
    let access = tokens["access_token"].as_str().expect("at").to_string();
    assert_eq!(user_me(&server, &access).status(), 200);
    // The client presenting it again (a retry: it holds the verifier) is refused; its grant
    // stands.
    let (status, err) = send(&fields(&q["code"]));
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    assert_eq!(user_me(&server, &access).status(), 200);
    // Anyone else presenting it is refused, and what the code issued is revoked.
    let (status, err) = send(&fields_with(&q["code"], &"z".repeat(43)));
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    assert_eq!(
        user_me(&server, &access).status(),
        401,
        "the replay revoked the first tokens"
    );

    // Concurrent redemption by the client: exactly one wins, with working tokens.
    let q = approve(
        &mut browser,
        &authorize_query(&client_id, CALLBACK, &challenge, &[]),
    );
    let body = fields(&q["code"]);
    let results: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6).map(|_| s.spawn(|| send(&body))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let winners: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| b)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert_eq!(
        user_me(&server, winners[0]["access_token"].as_str().expect("at")).status(),
        200
    );
}

#[test]
fn bad_clients_and_redirects_get_an_error_page_never_a_redirect() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client(
        "client.json",
        "Honest",
        &["https://app.example.com/cb", "http://localhost:3000/cb"],
    );
    let mut browser = Browser::new(&server);
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );
    let (_, challenge) = pkce();
    let evil = "https://evil.example.com/steal";

    // Unknown client (no document there), a client_id with a fragment, and a mismatched document.
    cimd.put_bytes(
        "liar.json",
        serde_json::json!({"client_id": cimd.url("someone-else.json"), "client_name": "Liar", "redirect_uris": [evil]})
            .to_string()
            .as_bytes(),
        None,
    );
    for bad_client in [
        cimd.url("missing.json"),
        format!("{}#x", cimd.url("client.json")),
        cimd.url("liar.json"),
    ] {
        let res = browser.get(&format!(
            "/oauth/authorize?{}",
            authorize_query(&bad_client, evil, &challenge, &[])
        ));
        assert_eq!(res.status(), 400, "{bad_client}");
        assert!(res.headers().get("location").is_none());
        assert!(
            res.text().expect("html").contains("<h1>"),
            "an HTML page explains"
        );
    }

    // Redirect URIs not registered, or bent to look registered.
    for bad_redirect in [
        evil,
        "https://app.example.com/cb/../../evil",
        "https://app.example.com/cb?next=evil",
        "http://localhost:3001/cb",
        "https://app.example.com\\@evil.example.com/cb",
    ] {
        let res = browser.get(&format!(
            "/oauth/authorize?{}",
            authorize_query(&client_id, bad_redirect, &challenge, &[])
        ));
        assert_eq!(res.status(), 400, "{bad_redirect}");
        assert!(res.headers().get("location").is_none());
    }

    // The consent POST with its redirect_uri swapped: still a page, no code anywhere.
    let page = browser.get(&format!(
        "/oauth/authorize?{}",
        authorize_query(&client_id, "http://localhost:3000/cb", &challenge, &[])
    ));
    assert_eq!(page.status(), 200);
    let mut fields: Vec<(String, String)> = hidden_fields(&page.text().expect("html"))
        .into_iter()
        .map(|(k, v)| {
            if k == "redirect_uri" {
                (k, evil.to_string())
            } else {
                (k, v)
            }
        })
        .collect();
    fields.push(("decision".into(), "approve".into()));
    let res = browser.post_form("/oauth/authorize", &fields);
    assert_eq!(res.status(), 400);
    assert!(res.headers().get("location").is_none());

    // Other errors do redirect, to the registered URI, with state.
    let res = browser.get(&format!(
        "/oauth/authorize?{}",
        authorize_query(&client_id, "http://localhost:3000/cb", &challenge, &[])
            .replace("response_type=code", "response_type=token")
    ));
    assert_eq!(res.status(), 303);
    let (to, q) = location(&res);
    assert_eq!(to.host_str(), Some("localhost"));
    assert_eq!(q["error"], "unsupported_response_type");
    // Denying consent redirects with access_denied.
    let page = browser.get(&format!(
        "/oauth/authorize?{}",
        authorize_query(&client_id, "http://localhost:3000/cb", &challenge, &[])
    ));
    let mut fields = hidden_fields(&page.text().expect("html"));
    fields.push(("decision".into(), "deny".into()));
    let (_, q) = location(&browser.post_form("/oauth/authorize", &fields));
    assert_eq!(q["error"], "access_denied");
    assert!(!q.contains_key("code"));
}

#[test]
fn consent_without_the_sessions_csrf_token_is_refused() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client("client.json", "CSRF", &["http://127.0.0.1/callback"]);
    let mut browser = Browser::new(&server);
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );
    let (_, challenge) = pkce();
    let page = browser.get(&format!(
        "/oauth/authorize?{}",
        authorize_query(&client_id, CALLBACK, &challenge, &[])
    ));
    let fields = hidden_fields(&page.text().expect("html"));
    for forged in [
        fields
            .iter()
            .filter(|(k, _)| k != "csrf_token")
            .cloned()
            .collect::<Vec<_>>(),
        fields
            .iter()
            .map(|(k, v)| {
                if k == "csrf_token" {
                    (k.clone(), "forged".to_string())
                } else {
                    (k.clone(), v.clone())
                }
            })
            .collect(),
    ] {
        let mut forged = forged;
        forged.push(("decision".into(), "approve".into()));
        let res = browser.post_form("/oauth/authorize", &forged);
        assert_eq!(res.status(), 403);
        assert!(res.headers().get("location").is_none());
    }
    // A cross-site POST arrives without the session cookie: not signed in, no code.
    let mut stranger = Browser::new(&server);
    let mut with_token = fields.clone();
    with_token.push(("decision".into(), "approve".into()));
    let res = stranger.post_form("/oauth/authorize", &with_token);
    assert_eq!(res.status(), 401);
    assert!(res.headers().get("location").is_none());
}

#[test]
fn sign_in_checks_password_csrf_and_never_redirects_off_site() {
    let server = TestServer::new();
    let mut browser = Browser::new(&server);
    let html = browser
        .get("/login?next=//evil.example.com/x")
        .text()
        .expect("html");
    let mut fields = hidden_fields(&html);
    assert!(
        fields.iter().any(|(k, v)| k == "next" && v == "/login"),
        "{fields:?}"
    );
    fields.push(("email".into(), server.creds.email.clone()));
    fields.push(("password".into(), "wrong".into()));
    assert_eq!(browser.post_form("/login", &fields).status(), 401);
    assert!(!browser.has_cookie("corvid_session"));

    let no_csrf = vec![
        ("email".to_string(), server.creds.email.clone()),
        (
            "password".to_string(),
            server.creds.password.clone().expect("password"),
        ),
    ];
    assert_eq!(
        Browser::new(&server).post_form("/login", &no_csrf).status(),
        403
    );

    let html = browser.get("/login").text().expect("html");
    let password = server.creds.password.clone().expect("password");
    let res = browser.post_form(
        "/login",
        &sign_in_fields(&html, &server.creds.email, &password),
    );
    assert_eq!(res.status(), 303);
    let cookie = set_cookie(&res, "corvid_session");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    assert!(browser
        .get("/login")
        .text()
        .expect("html")
        .contains("Signed in"));

    // Sign out needs the session's CSRF token too.
    let html = browser.get("/login").text().expect("html");
    let res = browser.post_form("/logout", &hidden_fields(&html));
    assert_eq!(res.status(), 303);
    assert!(!browser
        .get("/login")
        .text()
        .expect("html")
        .contains("Signed in"));
}

#[test]
fn the_fetcher_refuses_ssrf_targets() {
    let cimd = CimdServer::start();
    // Loopback NOT allowed: the production setting.
    let (_dir, server) = oauth_server(&cimd, false, |_| {});
    cimd.client("client.json", "Local", &["https://app.example.com/cb"]);
    let mut browser = Browser::new(&server);
    let (_, challenge) = pkce();
    for target in [
        format!("https://127.0.0.1:{}/client.json", cimd.port),
        // A DNS name that resolves to loopback.
        cimd.url("client.json"),
        "https://10.0.0.1/client.json".to_string(),
        "https://169.254.169.254/latest/meta-data.json".to_string(),
        "https://[::ffff:127.0.0.1]/client.json".to_string(),
        "https://metadata.google.internal/client.json".to_string(),
    ] {
        let res = browser.get(&format!(
            "/oauth/authorize?{}",
            authorize_query(&target, "https://app.example.com/cb", &challenge, &[])
        ));
        assert_eq!(res.status(), 400, "{target}");
        // The refusal names the address check, so no connection was attempted.
        let html = res.text().expect("html");
        assert!(
            html.contains("private or special-use address") || html.contains("internal host name"),
            "{target}: {html}"
        );
    }
}

#[test]
fn the_fetcher_refuses_redirects_oversize_and_slow_documents() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let mut browser = Browser::new(&server);
    let (_, challenge) = pkce();
    let good = cimd.client("client.json", "Fine", &["https://app.example.com/cb"]);
    let big = serde_json::json!({
        "client_id": cimd.url("big.json"),
        "client_name": "x".repeat(10),
        "redirect_uris": ["https://app.example.com/cb"],
        "padding": "y".repeat(6000),
    });
    cimd.put_bytes("big.json", big.to_string().as_bytes(), None);
    let try_client = |browser: &mut Browser, id: &str| {
        let res = browser.get(&format!(
            "/oauth/authorize?{}",
            authorize_query(id, "https://app.example.com/cb", &challenge, &[])
        ));
        (res.status().as_u16(), res.text().expect("html"))
    };
    let (status, _) = try_client(&mut browser, &good);
    assert_eq!(status, 303, "the well-behaved client goes on to sign-in");

    let (status, html) = try_client(
        &mut browser,
        &format!("https://localhost:{}/redirect/client.json", cimd.port),
    );
    assert_eq!(status, 400);
    assert!(html.contains("HTTP 302"), "{html}");
    let (status, html) = try_client(&mut browser, &cimd.url("big.json"));
    assert_eq!(status, 400);
    assert!(html.contains("larger than 5120 bytes"), "{html}");
    // The slow server drips one byte a second (~100 s); the fetch deadline (10 s here) ends it.
    let (status, html) = try_client(
        &mut browser,
        &format!("https://localhost:{}/slow/client.json", cimd.port),
    );
    assert_eq!(status, 400);
    assert!(html.contains("timed out after 10s"), "{html}");
}

#[test]
fn a_changed_document_is_not_used_while_the_cached_copy_is_fresh() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let id = cimd.url("client.json");
    let doc = |redirects: &[&str]| {
        serde_json::json!({"client_id": id, "client_name": "Changing", "redirect_uris": redirects})
            .to_string()
    };
    cimd.put_bytes(
        "client.json",
        doc(&["https://one.example.com/cb"]).as_bytes(),
        Some("max-age=3"),
    );
    let mut browser = Browser::new(&server);
    let (_, challenge) = pkce();
    let status_for = |browser: &mut Browser, redirect: &str| {
        browser
            .get(&format!(
                "/oauth/authorize?{}",
                authorize_query(&id, redirect, &challenge, &[])
            ))
            .status()
            .as_u16()
    };
    assert_eq!(status_for(&mut browser, "https://one.example.com/cb"), 303);
    cimd.put_bytes(
        "client.json",
        doc(&["https://one.example.com/cb", "https://two.example.com/cb"]).as_bytes(),
        Some("max-age=3"),
    );
    assert_eq!(
        status_for(&mut browser, "https://two.example.com/cb"),
        400,
        "still the cached copy"
    );
    // When the copy expires the document is fetched again: the engine's registry tests pass
    // a later clock instead of waiting here.
}

#[test]
fn logos_are_served_from_our_cache_and_staff_can_verify_a_client() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    // A 1x1 PNG.
    let png: &[u8] = &[
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, 0x49, 0x48, 0x44, 0x52, 0,
        0, 0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0, 0x1f, 0x15, 0xc4, 0x89, 0, 0, 0, 0x0d, 0x49, 0x44,
        0x41, 0x54, 0x78, 0x9c, 0x63, 0, 1, 0, 0, 5, 0, 1, 0x0d, 0x0a, 0x2d, 0xb4, 0, 0, 0, 0,
        0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ];
    cimd.put_bytes("logo.png", png, None);
    let id = cimd.url("client.json");
    let doc = serde_json::json!({
        "client_id": id, "client_name": "Logo & <Co>", "logo_uri": cimd.url("logo.png"),
        "redirect_uris": ["http://127.0.0.1/callback"],
    });
    cimd.put_bytes("client.json", doc.to_string().as_bytes(), None);
    let mut browser = Browser::new(&server);
    browser.login(
        &server.creds.email,
        server.creds.password.as_deref().expect("password"),
    );
    let (_, challenge) = pkce();
    let query = authorize_query(&id, CALLBACK, &challenge, &[]);
    let html = browser
        .get(&format!("/oauth/authorize?{query}"))
        .text()
        .expect("html");
    assert!(
        html.contains("Logo &amp; &lt;Co&gt;"),
        "the name is escaped"
    );
    let src = html
        .split("<img src=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a logo")
        .to_string();
    assert!(src.starts_with("/oauth/logo/"), "never hot-linked: {src}");
    let logo = browser.get(&src);
    assert_eq!(logo.headers()["content-type"], "image/png");
    assert_eq!(logo.bytes().expect("bytes").as_ref(), png);
    assert!(html.contains("Unverified application"));

    let admin = server.admin_key().to_string();
    let res = server.post_json(
        "/api/oauth/verified_clients/",
        Some(&admin),
        &serde_json::json!({"client_id": id}),
    );
    assert_eq!(res.status(), 201);
    let listed: Value = server
        .get("/api/oauth/verified_clients/", Some(&admin))
        .json()
        .expect("json");
    assert_eq!(listed["results"][0]["client_id"], id.as_str());
    let html = browser
        .get(&format!("/oauth/authorize?{query}"))
        .text()
        .expect("html");
    assert!(!html.contains("Unverified application"));
    let res = server.post_json(
        "/api/oauth/verified_clients/",
        Some(&admin),
        &serde_json::json!({"client_id": "http://x/y"}),
    );
    assert_eq!(res.status(), 400);
}

#[test]
fn secret_scanning_revokes_reported_tokens_and_says_which_were_live() {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};

    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("key");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
        .expect("pair");
    let mut spki = hex_decode("3059301306072a8648ce3d020106082a8648ce3d030107034200");
    spki.extend_from_slice(pair.public_key().as_ref());
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        STANDARD.encode(&spki)
    );

    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |c| {
        c.oauth.secret_scanning_keys = vec![corvid::config::SecretScanningKey {
            id: "key-1".into(),
            pem,
        }];
    });
    let client_id = cimd.client("client.json", "Leaky", &["http://127.0.0.1/callback"]);
    let tokens = full_flow(&server, &client_id, CALLBACK);
    let access = tokens["access_token"].as_str().expect("at");
    let (_, key) = server.create_key(&["user:read"], None);
    assert_eq!(user_me(&server, access).status(), 200);
    assert_eq!(user_me(&server, &key).status(), 200);

    let body = serde_json::json!([
        {"token": access, "type": "posthog_oauth_access_token", "url": "https://github.com/a/b/blob/x", "source": "content"},
        {"token": key, "type": "posthog_personal_api_key", "url": "https://github.com/a/b/blob/y", "source": "content"},
        {"token": "pha_neverissued", "type": "posthog_oauth_access_token", "url": null, "source": "content"},
    ])
    .to_string();
    let sign = |b: &str| STANDARD.encode(pair.sign(&rng, b.as_bytes()).expect("sign").as_ref());
    let send = |key_id: &str, sig: &str, b: &str| {
        server
            .client
            .post(server.url("/api/secret-scanning/github"))
            .header("Github-Public-Key-Identifier", key_id)
            .header("Github-Public-Key-Signature", sig)
            .header("content-type", "application/json")
            .body(b.to_string())
            .send()
            .expect("report")
    };
    assert_eq!(
        send("key-1", &sign("[]"), &body).status(),
        403,
        "signature over another body"
    );
    assert_eq!(
        send("key-2", &sign(&body), &body).status(),
        403,
        "unknown key id"
    );
    let res = send("key-1", &sign(&body), &body);
    assert_eq!(res.status(), 200);
    let answer: Value = res.json().expect("json");
    let labels: Vec<&str> = answer
        .as_array()
        .expect("list")
        .iter()
        .map(|a| a["label"].as_str().expect("label"))
        .collect();
    assert_eq!(labels, ["true_positive", "true_positive", "false_positive"]);
    assert_eq!(answer[0]["token_raw"], access);
    assert_eq!(user_me(&server, access).status(), 401);
    assert_eq!(user_me(&server, &key).status(), 401);
    // Reported again: nothing live any more.
    let answer: Value = send("key-1", &sign(&body), &body).json().expect("json");
    assert!(answer
        .as_array()
        .expect("list")
        .iter()
        .all(|a| a["label"] == "false_positive"));
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn the_mcp_python_sdk_completes_the_flow_with_a_client_metadata_url() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client(
        "mcp-client.json",
        "MCP test client",
        &["http://127.0.0.1/callback"],
    );
    let out = common::sdk::run_python(
        "oauth_mcp.py",
        &[
            &server.base,
            &client_id,
            &server.creds.email,
            server.creds.password.as_deref().expect("password"),
        ],
    );
    let result: Value =
        serde_json::from_str(out.trim().lines().last().expect("output")).expect("json line");
    assert_eq!(result["status"], 200, "{out}");
    assert_eq!(result["email"], server.creds.email.as_str());
    assert!(result["access_token_prefix"] == "pha_", "{out}");
    assert_eq!(
        result["client_id"],
        client_id.as_str(),
        "the SDK used its metadata URL as client_id"
    );
}

#[test]
fn a_real_browser_signs_in_consents_and_the_code_is_exchanged() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |_| {});
    let client_id = cimd.client(
        "browser.json",
        "Browser test app",
        &["http://127.0.0.1/callback"],
    );
    let artifacts = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact dir");
    let screenshot = artifacts.join("oauth-consent.png");
    let _ = std::fs::remove_file(&screenshot);
    let out = common::sdk::run_python(
        "oauth_browser.py",
        &[
            &server.base,
            &client_id,
            &server.creds.email,
            server.creds.password.as_deref().expect("password"),
            screenshot.to_str().expect("path"),
        ],
    );
    let result: Value =
        serde_json::from_str(out.trim().lines().last().expect("output")).expect("json line");
    assert_eq!(
        result["consent_title"], "Authorize Browser test app",
        "{out}"
    );
    assert_eq!(result["state"], "browser-state");
    assert_eq!(result["token_status"], 200, "{out}");
    assert_eq!(result["me_status"], 200, "{out}");
    let png = std::fs::read(&screenshot).expect("screenshot saved");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
}

#[test]
fn access_token_lifetimes_come_from_the_config_and_refresh_renews_them() {
    let cimd = CimdServer::start();
    let (_dir, server) = oauth_server(&cimd, true, |c| {
        c.oauth.access_token_ttl = Duration::from_secs(1);
    });
    let client_id = cimd.client("client.json", "Short-lived", &["http://127.0.0.1/callback"]);
    let tokens = full_flow(&server, &client_id, CALLBACK);
    assert_eq!(tokens["expires_in"], 1);
    let access = tokens["access_token"].as_str().expect("at");
    assert_eq!(user_me(&server, access).status(), 200, "now cached");
    // Expiry of the cached credential is checked by the engine's tests with a later clock.
    // The refresh token gets a new access token.
    let (status, body, _) = post_token(
        &server,
        "/oauth/token",
        &[
            ("grant_type", "refresh_token"),
            (
                "refresh_token",
                tokens["refresh_token"].as_str().expect("rt"),
            ),
            ("client_id", &client_id),
        ],
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        user_me(&server, body["access_token"].as_str().expect("at")).status(),
        200
    );
}

#[test]
fn session_cookies_are_secure_when_the_public_url_is_https() {
    let (_dir, mut config) = common::fresh();
    config.public_url = Some("https://corvid.example".into());
    let server = TestServer::start(config);
    let mut browser = Browser::new(&server);
    let res = browser.get("/login");
    let csrf_cookie = set_cookie(&res, "corvid_login_csrf");
    assert!(csrf_cookie.contains("; Secure"), "{csrf_cookie}");
    let password = server.creds.password.clone().expect("password");
    let page = res.text().expect("html");
    let res = browser.post_form(
        "/login",
        &sign_in_fields(&page, &server.creds.email, &password),
    );
    assert_eq!(res.status(), 303);
    let session = set_cookie(&res, "corvid_session");
    assert!(
        session.contains("; Secure") && session.contains("HttpOnly"),
        "{session}"
    );
    // The discovery documents name the public URL, not the address we happen to listen on.
    let meta: Value = server
        .get("/.well-known/oauth-authorization-server", None)
        .json()
        .expect("json");
    assert_eq!(meta["issuer"], "https://corvid.example");
}
