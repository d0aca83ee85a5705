//! OAuth test kit: an HTTPS server for client metadata documents (a Python helper with a
//! throwaway CA), a cookie-keeping "browser" that does not follow redirects, and PKCE helpers.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use corvid::config::Config;
use reqwest::blocking::{Client, Response};
use reqwest::header;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use super::{fresh, sdk, TestServer};

/// The CIMD document server. Killed on drop.
pub struct CimdServer {
    child: Child,
    pub port: u16,
    dir: TempDir,
}

impl CimdServer {
    pub fn start() -> CimdServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(sdk::python())
            .arg(sdk::python_script("cimd_server.py"))
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cimd server starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("READY line");
        let port = line
            .trim()
            .strip_prefix("READY ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("cimd server said {line:?}"));
        CimdServer { child, port, dir }
    }

    /// `https://localhost:<port>/<name>`
    pub fn url(&self, name: &str) -> String {
        format!("https://localhost:{}/{name}", self.port)
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn put_bytes(&self, name: &str, body: &[u8], cache_control: Option<&str>) {
        let path = self.dir.path().join("docs").join(name);
        std::fs::write(&path, body).expect("write doc");
        let cc = self
            .dir
            .path()
            .join("docs")
            .join(format!("{name}.cache-control"));
        match cache_control {
            Some(v) => std::fs::write(cc, v).expect("write cache-control"),
            None => {
                let _ = std::fs::remove_file(cc);
            }
        }
    }

    /// Hosts a valid client document at `name` with these redirect URIs; returns its client_id.
    pub fn client(&self, name: &str, client_name: &str, redirect_uris: &[&str]) -> String {
        let id = self.url(name);
        let doc = json!({
            "client_id": id,
            "client_name": client_name,
            "redirect_uris": redirect_uris,
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        });
        self.put_bytes(name, doc.to_string().as_bytes(), Some("max-age=600"));
        id
    }
}

impl Drop for CimdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server that trusts the CIMD server's CA; `allow_loopback` as the dev switch says.
pub fn oauth_server(
    cimd: &CimdServer,
    allow_loopback: bool,
    tune: impl FnOnce(&mut Config),
) -> (TempDir, TestServer) {
    let (dir, mut config) = fresh();
    config.oauth.dev_allow_loopback_fetch = allow_loopback;
    config.oauth.dev_extra_ca_file = Some(cimd.ca());
    // Generous: a loaded CI machine (or a VM whose host steals most of the CPU) can take
    // seconds for a loopback TLS fetch; the slow-document test still ends at this deadline.
    config.oauth.cimd_fetch_timeout = Duration::from_secs(10);
    config.oauth.cimd_cache_min = Duration::from_secs(1);
    tune(&mut config);
    (dir, TestServer::start(config))
}

/// A PKCE pair (verifier, S256 challenge).
pub fn pkce() -> (String, String) {
    let verifier = format!(
        "{}-{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// A user agent with a cookie jar that never follows redirects, so tests see every Location.
pub struct Browser {
    http: Client,
    base: String,
    cookies: HashMap<String, String>,
}

impl Browser {
    pub fn new(server: &TestServer) -> Browser {
        Browser {
            http: super::client_builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            base: server.base.clone(),
            cookies: HashMap::new(),
        }
    }

    fn absolute(&self, path: &str) -> String {
        if path.starts_with("http") {
            path.to_string()
        } else {
            format!("{}{path}", self.base)
        }
    }

    fn jar(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn keep(&mut self, res: &Response) {
        for v in res.headers().get_all(header::SET_COOKIE) {
            let text = v.to_str().expect("cookie text");
            let pair = text.split(';').next().unwrap_or("");
            if let Some((k, v)) = pair.split_once('=') {
                if v.is_empty() {
                    self.cookies.remove(k);
                } else {
                    self.cookies.insert(k.to_string(), v.to_string());
                }
            }
        }
    }

    pub fn get(&mut self, path: &str) -> Response {
        let res = self
            .http
            .get(self.absolute(path))
            .header(header::COOKIE, self.jar())
            .send()
            .expect("GET");
        self.keep(&res);
        res
    }

    pub fn post_form(&mut self, path: &str, fields: &[(String, String)]) -> Response {
        let res = self
            .http
            .post(self.absolute(path))
            .header(header::COOKIE, self.jar())
            .form(fields)
            .send()
            .expect("POST");
        self.keep(&res);
        res
    }

    pub fn login(&mut self, email: &str, password: &str) {
        let page = self.get("/login").text().expect("login page");
        let res = self.post_form("/login", &sign_in_fields(&page, email, password));
        assert_eq!(res.status(), 303, "sign-in succeeds");
        assert!(self.cookies.contains_key("corvid_session"));
    }

    pub fn has_cookie(&self, name: &str) -> bool {
        self.cookies.contains_key(name)
    }

    /// An API call as the signed-in browser: its cookies, and the session's CSRF token (from
    /// the `corvid_csrftoken` cookie) in `X-CSRFToken` unless `csrf` is false.
    pub fn api(
        &mut self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        csrf: bool,
    ) -> Response {
        let mut req = self
            .http
            .request(method, self.absolute(path))
            .header(header::COOKIE, self.jar());
        if let (true, Some(token)) = (csrf, self.cookies.get("corvid_csrftoken")) {
            req = req.header("X-CSRFToken", token);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let res = req.send().expect("API call");
        self.keep(&res);
        res
    }
}

/// The sign-in form of `page` (its hidden fields) filled with `email` and `password`.
pub fn sign_in_fields(page: &str, email: &str, password: &str) -> Vec<(String, String)> {
    let mut fields = hidden_fields(page);
    fields.push(("email".into(), email.into()));
    fields.push(("password".into(), password.into()));
    fields
}

/// The `Set-Cookie` header of `res` that sets cookie `name`.
pub fn set_cookie(res: &Response, name: &str) -> String {
    res.headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().expect("cookie text").to_string())
        .find(|c| c.starts_with(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} cookie set"))
}

/// `(name, value)` of every hidden input of a page.
pub fn hidden_fields(html: &str) -> Vec<(String, String)> {
    html.split("<input type=\"hidden\" name=\"")
        .skip(1)
        .filter_map(|rest| {
            let (name, rest) = rest.split_once("\" value=\"")?;
            let (value, _) = rest.split_once('"')?;
            Some((unescape(name), unescape(value)))
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The query string of an authorization request.
pub fn authorize_query(
    client_id: &str,
    redirect_uri: &str,
    challenge: &str,
    extra: &[(&str, &str)],
) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.append_pair("response_type", "code")
        .append_pair("client_id", client_id)
        .append_pair("redirect_uri", redirect_uri)
        .append_pair("code_challenge", challenge)
        .append_pair("code_challenge_method", "S256")
        .append_pair("state", "st-123")
        .append_pair("scope", "user:read endpoint:read");
    for (k, v) in extra {
        q.append_pair(k, v);
    }
    q.finish()
}

/// The Location of a redirect, parsed, with its query as a map.
pub fn location(res: &Response) -> (url::Url, HashMap<String, String>) {
    let loc = res
        .headers()
        .get(header::LOCATION)
        .unwrap_or_else(|| panic!("no Location on a {} answer", res.status()))
        .to_str()
        .expect("location text");
    let url = url::Url::parse(loc).expect("absolute Location");
    let query = url.query_pairs().into_owned().collect();
    (url, query)
}

/// Shows the consent page for `query` and approves it; returns the redirect's query.
pub fn approve(browser: &mut Browser, query: &str) -> HashMap<String, String> {
    let page = browser.get(&format!("/oauth/authorize?{query}"));
    assert_eq!(page.status(), 200, "consent page");
    let html = page.text().expect("html");
    let mut fields = hidden_fields(&html);
    fields.push(("decision".into(), "approve".into()));
    let res = browser.post_form("/oauth/authorize", &fields);
    assert_eq!(res.status(), 303);
    location(&res).1
}

/// POSTs a form to a token-style endpoint; returns (status, JSON body, headers).
pub fn post_token(
    server: &TestServer,
    path: &str,
    fields: &[(&str, &str)],
) -> (u16, Value, header::HeaderMap) {
    let res = server
        .client
        .post(server.url(path))
        .form(fields)
        .send()
        .expect("token request");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.json().unwrap_or(Value::Null);
    (status, body, headers)
}

/// The whole flow for `client_id`: sign in, approve, exchange. Returns the token response.
pub fn full_flow(server: &TestServer, client_id: &str, redirect_uri: &str) -> Value {
    let mut browser = Browser::new(server);
    browser.login(
        &server.creds.email,
        server
            .creds
            .password
            .as_deref()
            .expect("first-run password"),
    );
    let (verifier, challenge) = pkce();
    let q = approve(
        &mut browser,
        &authorize_query(client_id, redirect_uri, &challenge, &[]),
    );
    let (status, body, _) = post_token(
        server,
        "/oauth/token",
        &[
            ("grant_type", "authorization_code"),
            ("code", &q["code"]),
            ("client_id", client_id),
            ("redirect_uri", redirect_uri),
            ("code_verifier", &verifier),
        ],
    );
    assert_eq!(status, 200, "{body}");
    body
}
