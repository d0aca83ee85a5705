//! The HTML Corvid serves for sign-in and consent: self-contained (inline CSS, no scripts, no
//! external assets), escaped everywhere, and framed by security headers that forbid embedding.

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;

/// Escapes text for HTML element content and double-quoted attributes.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
:root{color-scheme:light dark;--fg:#1d1f24;--muted:#5b6270;--bg:#f4f5f7;--card:#fff;--line:#d9dce3;--accent:#1d4aff;--warn-bg:#fff4d6;--warn-fg:#6b4b00;--err:#b3261e}
@media (prefers-color-scheme:dark){:root{--fg:#eceef2;--muted:#a5acb9;--bg:#15171c;--card:#1f2229;--line:#343844;--accent:#7c9bff;--warn-bg:#3a3115;--warn-fg:#f3d98b;--err:#ff8a80}}
*{box-sizing:border-box}body{margin:0;font:16px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;background:var(--bg);color:var(--fg)}
main{max-width:30rem;margin:3rem auto;padding:2rem;background:var(--card);border:1px solid var(--line);border-radius:12px}
h1{font-size:1.35rem;margin:0 0 1rem}p{margin:.5rem 0}.muted{color:var(--muted);font-size:.9rem}
.client{display:flex;align-items:center;gap:.75rem;margin-bottom:1rem}.client img{width:48px;height:48px;border-radius:8px;object-fit:contain;border:1px solid var(--line)}
.notice{background:var(--warn-bg);color:var(--warn-fg);border-radius:8px;padding:.75rem 1rem;margin:1rem 0}
.error{color:var(--err)}ul.scopes{padding-left:1.2rem}ul.scopes li{margin:.2rem 0}
dl{display:grid;grid-template-columns:auto 1fr;gap:.25rem 1rem;margin:1rem 0}dt{color:var(--muted)}dd{margin:0;word-break:break-all}
label{display:block;margin:.75rem 0 .25rem;font-weight:600}input[type=email],input[type=password]{width:100%;padding:.6rem;border:1px solid var(--line);border-radius:8px;background:var(--bg);color:var(--fg);font:inherit}
.actions{display:flex;gap:.75rem;margin-top:1.5rem}button{font:inherit;padding:.6rem 1.2rem;border-radius:8px;border:1px solid var(--line);background:var(--card);color:var(--fg);cursor:pointer}
button.primary{background:var(--accent);border-color:var(--accent);color:#fff}button:focus-visible,input:focus-visible{outline:3px solid var(--accent);outline-offset:2px}
";

/// A complete page with Corvid's frame and headers.
pub fn page(status: StatusCode, title: &str, body: &str) -> HttpResponse {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <meta name=\"referrer\" content=\"no-referrer\">\
         <title>{} · Corvid</title><style>{STYLE}</style></head>\
         <body><main>{body}</main></body></html>",
        esc(title)
    );
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'",
        ))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(html)
}

/// An error shown to the user instead of redirecting anywhere.
pub fn error(status: StatusCode, title: &str, detail: &str) -> HttpResponse {
    page(
        status,
        title,
        &format!(
            "<h1>{}</h1><p class=\"error\" role=\"alert\">{}</p>\
             <p class=\"muted\">You can close this window. If an application sent you here, \
             tell its developer about this error.</p>",
            esc(title),
            esc(detail)
        ),
    )
}

/// A page for a rate-limited request: 429 with the limiter's `Retry-After`.
pub fn throttled(err: &crate::error::ApiError) -> HttpResponse {
    let wait = match err {
        crate::error::ApiError::RateLimited { retry_after_secs } => *retry_after_secs,
        _ => 1,
    };
    let mut page = error(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many attempts",
        &format!("Too many requests from your address. Try again in {wait} seconds."),
    );
    if let Ok(value) = header::HeaderValue::from_str(&wait.to_string()) {
        page.headers_mut().insert(header::RETRY_AFTER, value);
    }
    page
}

pub fn hidden(name: &str, value: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
        esc(name),
        esc(value)
    )
}

/// The sign-in form. `next` is where to go afterwards (a local path).
pub fn login(csrf: &str, next: &str, email: &str, failed: bool) -> String {
    let message = if failed {
        "<p class=\"error\" role=\"alert\">Invalid email or password.</p>"
    } else {
        ""
    };
    format!(
        "<h1>Sign in to Corvid</h1>{message}\
         <form method=\"post\" action=\"/login\">{}{}\
         <label for=\"email\">Email</label>\
         <input id=\"email\" name=\"email\" type=\"email\" autocomplete=\"username\" required value=\"{}\">\
         <label for=\"password\">Password</label>\
         <input id=\"password\" name=\"password\" type=\"password\" autocomplete=\"current-password\" required>\
         <div class=\"actions\"><button class=\"primary\" type=\"submit\">Sign in</button></div></form>",
        hidden("csrf_token", csrf),
        hidden("next", next),
        esc(email),
    )
}

/// Shown at `/login` to someone already signed in.
pub fn signed_in(email: &str, csrf: &str) -> String {
    format!(
        "<h1>Signed in</h1><p>You are signed in to Corvid as <strong>{}</strong>.</p>\
         <form method=\"post\" action=\"/logout\">{}\
         <div class=\"actions\"><button type=\"submit\">Sign out</button></div></form>",
        esc(email),
        hidden("csrf_token", csrf)
    )
}

/// Everything the consent screen shows.
pub struct Consent<'a> {
    pub client_name: &'a str,
    pub client_host: &'a str,
    pub client_id: &'a str,
    pub logo_url: Option<String>,
    pub verified: bool,
    pub redirect_host: &'a str,
    pub redirect_is_loopback: bool,
    pub user_email: &'a str,
    pub scopes: Vec<String>,
    /// Hidden fields carried to the POST (all re-validated there).
    pub fields: Vec<(&'static str, String)>,
}

pub fn consent(c: &Consent<'_>) -> String {
    let logo = c
        .logo_url
        .as_ref()
        .map(|u| format!("<img src=\"{}\" alt=\"\">", esc(u)))
        .unwrap_or_default();
    let unverified = if c.verified {
        String::new()
    } else {
        "<div class=\"notice\" role=\"note\"><strong>Unverified application.</strong> \
         This application has not been verified by the operators of this Corvid server. \
         Only authorize it if you trust its developer.</div>"
            .to_string()
    };
    let loopback = if c.redirect_is_loopback {
        "<div class=\"notice\" role=\"note\">This application will send you back to a program \
         on <strong>your own computer</strong>. Any program can claim to be this application \
         this way: continue only if you just started it yourself.</div>"
    } else {
        ""
    };
    let scopes: String = c
        .scopes
        .iter()
        .map(|s| {
            format!(
                "<li>{} <span class=\"muted\">({})</span></li>",
                esc(&corvid_oauth::describe_scope(s)),
                esc(s)
            )
        })
        .collect();
    let fields: String = c.fields.iter().map(|(k, v)| hidden(k, v)).collect();
    format!(
        "<div class=\"client\">{logo}<h1>Authorize {name}</h1></div>\
         <p><strong>{name}</strong> is requesting access to your Corvid data.</p>{unverified}{loopback}\
         <dl><dt>Application</dt><dd>{host}</dd><dt>Client ID</dt><dd>{client_id}</dd>\
         <dt>Redirects to</dt><dd>{redirect}</dd><dt>Signed in as</dt><dd>{email}</dd></dl>\
         <p>It will be able to:</p><ul class=\"scopes\">{scopes}</ul>\
         <form method=\"post\" action=\"/oauth/authorize\">{fields}\
         <div class=\"actions\"><button class=\"primary\" type=\"submit\" name=\"decision\" value=\"approve\">Authorize</button>\
         <button type=\"submit\" name=\"decision\" value=\"deny\">Deny</button></div></form>",
        name = esc(c.client_name),
        host = esc(c.client_host),
        client_id = esc(c.client_id),
        redirect = esc(c.redirect_host),
        email = esc(c.user_email),
    )
}
