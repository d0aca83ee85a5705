//! Redirect URI rules (service interface §5.2–5.3, RFC 8252 §7.3, PostHog's `localhost` rule).
//!
//! - A requested URI must match a registered one exactly (scheme, host, port, path, query).
//! - `https` is required unless the host is a loopback address (`localhost`, `127.x.x.x`, `::1`).
//! - A registered loopback URI without a port matches a request on any port; a registered
//!   `localhost` URI with a port requires that port; `127.0.0.1` and `::1` allow any port.
//! - Ambiguous authorities (backslashes, userinfo, encoded separators) never match.

use std::net::IpAddr;

use url::{Host, Url};

/// Checks one `redirect_uris` entry of a client metadata document.
pub fn check_registered(uri: &str) -> Result<(), String> {
    let url = parse_strict(uri)?;
    match url.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(&url) => Ok(()),
        _ => Err(format!(
            "redirect URI `{uri}` must use https unless its host is a loopback address"
        )),
    }
}

/// Whether `requested` may receive the authorization response for a client that registered
/// `registered`.
pub fn matches(registered: &[String], requested: &str) -> bool {
    let Ok(req) = parse_strict(requested) else {
        return false;
    };
    if !is_loopback(&req) {
        // Not loopback: https only, byte-for-byte equal to a registered entry.
        return req.scheme() == "https" && registered.iter().any(|r| r == requested);
    }
    registered.iter().any(|r| {
        let Ok(reg) = parse_strict(r) else {
            return false;
        };
        let same_target = reg.scheme() == req.scheme()
            && reg.host_str() == req.host_str()
            && reg.path() == req.path()
            && reg.query() == req.query();
        if !same_target {
            return false;
        }
        let any_port =
            matches!(reg.host(), Some(Host::Ipv4(_) | Host::Ipv6(_))) || reg.port().is_none();
        any_port || reg.port() == req.port()
    })
}

/// The host a user is sent to, for the consent screen.
pub fn display_host(uri: &str) -> String {
    Url::parse(uri)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_default()
}

/// Whether a redirect URI points at the user's own machine (the consent screen warns: anyone
/// can present a well-known client's metadata URL with a localhost redirect).
pub fn is_loopback_uri(uri: &str) -> bool {
    Url::parse(uri).map(|u| is_loopback(&u)).unwrap_or(false)
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

/// Parses a redirect URI, refusing the shapes used to confuse parsers and validators.
fn parse_strict(uri: &str) -> Result<Url, String> {
    let lower = uri.to_ascii_lowercase();
    if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("redirect URI `{uri}` must not contain whitespace"));
    }
    if uri.contains('\\') || lower.contains("%5c") {
        return Err(format!("redirect URI `{uri}` must not contain backslashes"));
    }
    if uri.contains('#') {
        return Err(format!("redirect URI `{uri}` must not contain a fragment"));
    }
    let url = Url::parse(uri).map_err(|e| format!("redirect URI `{uri}` is not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("redirect URI `{uri}` must not contain credentials"));
    }
    if url.host().is_none() {
        return Err(format!("redirect URI `{uri}` must name a host"));
    }
    // The authority as written must be what the parser saw: no encoded separators in it.
    let authority = uri
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?']).next().unwrap_or(""))
        .unwrap_or("");
    let a = authority.to_ascii_lowercase();
    if ["%2f", "%3f", "%23", "%40", "@"]
        .iter()
        .any(|s| a.contains(s))
    {
        return Err(format!("redirect URI `{uri}` has an ambiguous authority"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn https_must_match_exactly() {
        let r = reg(&["https://app.example.com/callback"]);
        assert!(matches(&r, "https://app.example.com/callback"));
        for bad in [
            "https://app.example.com/callback/",
            "https://app.example.com/callback?x=1",
            "https://app.example.com:444/callback",
            "https://app.example.com.evil.com/callback",
            "http://app.example.com/callback",
            "https://app.example.com/callback#x",
            "https://evil.com\\@app.example.com/callback",
            "https:app.example.com/callback",
        ] {
            assert!(!matches(&r, bad), "{bad}");
        }
    }

    #[test]
    fn loopback_port_rules_follow_the_spec() {
        let no_port = reg(&["http://localhost/cb", "http://127.0.0.1/cb"]);
        assert!(matches(&no_port, "http://localhost:53682/cb"));
        assert!(matches(&no_port, "http://localhost/cb"));
        assert!(matches(&no_port, "http://127.0.0.1:9/cb"));
        assert!(!matches(&no_port, "http://localhost:53682/other"));
        assert!(!matches(&no_port, "https://localhost:53682/cb"));

        let with_port = reg(&["http://localhost:3000/cb"]);
        assert!(matches(&with_port, "http://localhost:3000/cb"));
        assert!(!matches(&with_port, "http://localhost:3001/cb"));
        assert!(!matches(&with_port, "http://localhost/cb"));

        let ip_with_port = reg(&["http://127.0.0.1:3000/cb", "http://[::1]:4000/cb"]);
        assert!(matches(&ip_with_port, "http://127.0.0.1:61000/cb"));
        assert!(matches(&ip_with_port, "http://[::1]:5/cb"));
        assert!(!matches(&ip_with_port, "http://localhost:3000/cb"));
    }

    #[test]
    fn registration_requires_https_unless_loopback() {
        assert!(check_registered("https://app.example.com/cb").is_ok());
        assert!(check_registered("http://localhost/cb").is_ok());
        assert!(check_registered("http://127.0.0.1:8080/cb").is_ok());
        for bad in [
            "http://app.example.com/cb",
            "javascript:alert(1)",
            "com.example.app:/cb",
            "https://app.example.com/cb#f",
            "https://a b.com/cb",
            "https://user@app.example.com/cb",
        ] {
            assert!(check_registered(bad).is_err(), "{bad}");
        }
    }
}
