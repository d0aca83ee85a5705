//! The rules a CIMD `client_id` URL must satisfy before Corvid fetches anything from it
//! (CIMD draft §"Client Identifier", tightened as PostHog and Auth0 do).
//!
//! The `url` crate normalises away dot segments and percent-encodings, so the checks that
//! matter for confusion attacks look at the raw string as well as at the parsed URL.

use url::Url;

/// Longest client_id we accept (PostHog widened its column to 2048 for CIMD URLs).
pub const MAX_LEN: usize = 2048;

/// Parses and checks a client_id; the error text is shown on the error page.
pub fn validate(raw: &str) -> Result<Url, String> {
    if raw.is_empty() {
        return Err("client_id is required".into());
    }
    if raw.len() > MAX_LEN {
        return Err(format!("client_id is longer than {MAX_LEN} characters"));
    }
    if raw.trim() != raw || raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("client_id must not contain whitespace".into());
    }
    let Some(rest) = raw.strip_prefix("https://") else {
        return Err("client_id must be an https URL (a Client ID Metadata Document)".into());
    };
    let lower = raw.to_ascii_lowercase();
    if raw.contains('\\') || lower.contains("%5c") {
        return Err("client_id must not contain backslashes".into());
    }
    if raw.contains('#') {
        return Err("client_id must not contain a fragment".into());
    }
    if raw.contains('?') {
        return Err("client_id must not contain a query string".into());
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err("client_id must not contain a username or password".into());
    }
    if path.is_empty() || path == "/" {
        return Err("client_id must have a path, e.g. https://example.com/client.json".into());
    }
    let dot_segment = path.split('/').any(|segment| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    });
    if dot_segment {
        return Err("client_id must not contain `.` or `..` path segments".into());
    }
    let url = Url::parse(raw).map_err(|e| format!("client_id is not a valid URL: {e}"))?;
    if url.host().is_none() {
        return Err("client_id must name a host".into());
    }
    if url.port() == Some(0) {
        return Err("client_id must not use port 0".into());
    }
    Ok(url)
}

/// The host shown to users on the consent screen: what they should recognise.
pub fn display_host(url: &Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::validate;

    #[test]
    fn accepts_plain_https_urls_with_a_path() {
        for ok in [
            "https://app.example.com/client.json",
            "https://app.example.com:8443/oauth/metadata.json",
            "https://127.0.0.1:9000/c.json",
        ] {
            assert!(validate(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_what_the_draft_forbids() {
        for bad in [
            "",
            "http://app.example.com/client.json",
            "HTTPS://app.example.com/client.json",
            "https://app.example.com",
            "https://app.example.com/",
            "https://app.example.com/client.json#frag",
            "https://app.example.com/client.json?x=1",
            "https://user:pw@app.example.com/client.json",
            "https://user@app.example.com/client.json",
            "https://app.example.com/a/../client.json",
            "https://app.example.com/./client.json",
            "https://app.example.com/a/%2E%2e/client.json",
            "https://app.example.com\\@evil.com/client.json",
            "https://app.example.com%5c@evil.com/client.json",
            " https://app.example.com/client.json",
            "https://app.example.com:0/client.json",
            "urn:example:client",
        ] {
            assert!(validate(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
