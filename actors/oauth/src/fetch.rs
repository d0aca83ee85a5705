//! The SSRF-safe fetcher for client metadata documents and their logos.
//!
//! - https only; the host is resolved once, every address is checked, and the connection is
//!   pinned to the checked address (no second lookup, so no DNS rebinding);
//! - private, loopback, link-local, CGNAT, multicast, documentation and other special-use
//!   addresses (RFC 6890) are refused, IPv4-mapped/NAT64 IPv6 by the IPv4 address inside;
//! - no redirects, no proxies, no cookies; the status must be exactly 200;
//! - the body is capped (checked on `Content-Length`, then while streaming) and the whole fetch
//!   has one deadline, so a slow-drip server cannot hold a worker.

use std::time::Duration;

use url::Url;

use corvid_kernel::net::{resolve_public, Resolved, Unreachable};

/// Limits and the two development-only escape hatches.
#[derive(Debug, Clone)]
pub struct FetchSettings {
    /// Deadline for the whole fetch: DNS, connect, TLS, headers and body.
    pub timeout: Duration,
    /// DEVELOPMENT ONLY: allow loopback addresses (still refusing every other special use).
    pub allow_loopback: bool,
    /// DEVELOPMENT ONLY: an extra trusted CA certificate (PEM), e.g. a test CA.
    pub extra_ca_pem: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Refused(String),
    #[error("could not resolve {0}")]
    Dns(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("answered HTTP {0} (only 200 is accepted; redirects are not followed)")]
    Status(u16),
    #[error("is larger than {0} bytes")]
    TooLarge(usize),
    #[error("could not be fetched: {0}")]
    Http(String),
}

/// A fetched body and the headers callers use.
#[derive(Debug)]
pub struct Fetched {
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    /// `Cache-Control: max-age` in seconds, if the server sent one.
    pub max_age: Option<u64>,
}

pub struct Fetcher {
    settings: FetchSettings,
    extra_ca: Option<reqwest::Certificate>,
}

impl Fetcher {
    pub fn new(settings: FetchSettings) -> Result<Fetcher, String> {
        let extra_ca = match &settings.extra_ca_pem {
            Some(pem) => Some(
                reqwest::Certificate::from_pem(pem)
                    .map_err(|e| format!("extra CA certificate is not valid PEM: {e}"))?,
            ),
            None => None,
        };
        if settings.allow_loopback {
            tracing::warn!(
                "OAUTH DEVELOPMENT MODE: client metadata may be fetched from loopback addresses"
            );
        }
        if extra_ca.is_some() {
            tracing::warn!(
                "OAUTH DEVELOPMENT MODE: an extra CA certificate is trusted for client metadata"
            );
        }
        Ok(Fetcher { settings, extra_ca })
    }

    /// GETs `url` under every rule above, reading at most `max_bytes`. The deadline is ours
    /// alone (reqwest gets none), so running out of time always reports as a timeout.
    pub async fn get(
        &self,
        url: &Url,
        max_bytes: usize,
        accept: &str,
    ) -> Result<Fetched, FetchError> {
        let deadline = self.settings.timeout;
        match tokio::time::timeout(deadline, self.get_inner(url, max_bytes, accept)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout(deadline)),
        }
    }

    async fn get_inner(
        &self,
        url: &Url,
        max_bytes: usize,
        accept: &str,
    ) -> Result<Fetched, FetchError> {
        if url.scheme() != "https" {
            return Err(FetchError::Refused("only https URLs are fetched".into()));
        }
        let Resolved {
            domain,
            address: pinned,
        } = resolve_public(url, self.settings.allow_loopback)
            .await
            .map_err(|e| match e {
                Unreachable::Refused(why) => FetchError::Refused(why),
                Unreachable::Dns(name) => FetchError::Dns(name),
            })?;
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .https_only(true)
            .user_agent("Corvid-CIMD/1.0");
        if let Some(domain) = &domain {
            builder = builder.resolve(domain, pinned);
        }
        if let Some(ca) = &self.extra_ca {
            builder = builder.add_root_certificate(ca.clone());
        }
        let client = builder
            .build()
            .map_err(|e| FetchError::Http(e.to_string()))?;
        let mut response = client
            .get(url.clone())
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .await
            .map_err(|e| FetchError::Http(without_url(&e)))?;
        if response.status().as_u16() != 200 {
            return Err(FetchError::Status(response.status().as_u16()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > max_bytes as u64)
        {
            return Err(FetchError::TooLarge(max_bytes));
        }
        let header = |name: reqwest::header::HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_type = header(reqwest::header::CONTENT_TYPE);
        let max_age = header(reqwest::header::CACHE_CONTROL).and_then(|v| max_age(&v));
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| FetchError::Http(without_url(&e)))?
        {
            if body.len() + chunk.len() > max_bytes {
                return Err(FetchError::TooLarge(max_bytes));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            body,
            content_type,
            max_age,
        })
    }
}

/// reqwest errors name the URL; the consent error page already shows it.
fn without_url(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    if let Some(url) = err.url() {
        text = text.replace(&format!(" for url ({url})"), "");
    }
    if err.is_connect() {
        return "connection failed".into();
    }
    text
}

/// `max-age=N` from a `Cache-Control` value; `no-store` / `no-cache` mean 0.
pub fn max_age(cache_control: &str) -> Option<u64> {
    let mut result = None;
    for directive in cache_control.split(',') {
        let directive = directive.trim().to_ascii_lowercase();
        if directive == "no-store" || directive == "no-cache" {
            return Some(0);
        }
        if let Some(v) = directive.strip_prefix("max-age=") {
            result = v.trim_matches('"').parse().ok();
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_max_age() {
        assert_eq!(max_age("public, max-age=600"), Some(600));
        assert_eq!(max_age("no-store"), Some(0));
        assert_eq!(max_age("public"), None);
    }
}
