//! The SSRF-safe fetcher for client metadata documents and their logos.
//!
//! - https only; the host is resolved once, every address is checked, and the connection is
//!   pinned to the checked address (no second lookup, so no DNS rebinding);
//! - private, loopback, link-local, CGNAT, multicast, documentation and other special-use
//!   addresses (RFC 6890) are refused, IPv4-mapped/NAT64 IPv6 by the IPv4 address inside;
//! - no redirects, no proxies, no cookies; the status must be exactly 200;
//! - the body is capped (checked on `Content-Length`, then while streaming) and the whole fetch
//!   has one deadline, so a slow-drip server cannot hold a worker.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use url::{Host, Url};

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

/// Name suffixes that only make sense inside a private network.
const INTERNAL_SUFFIXES: &[&str] = &[
    ".local",
    ".internal",
    ".localdomain",
    ".lan",
    ".corp",
    ".intranet",
    ".consul",
    ".home.arpa",
];

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
        let port = url.port_or_known_default().unwrap_or(443);
        let host = url
            .host()
            .ok_or_else(|| FetchError::Refused("URL has no host".into()))?;
        let (domain, addrs) = match host {
            Host::Ipv4(ip) => (None, vec![IpAddr::V4(ip)]),
            Host::Ipv6(ip) => (None, vec![IpAddr::V6(ip)]),
            Host::Domain(name) => {
                let name = name.to_ascii_lowercase();
                self.check_name(&name)?;
                let addrs: Vec<IpAddr> = tokio::net::lookup_host((name.as_str(), port))
                    .await
                    .map_err(|_| FetchError::Dns(name.clone()))?
                    .map(|a| a.ip())
                    .collect();
                if addrs.is_empty() {
                    return Err(FetchError::Dns(name));
                }
                (Some(name), addrs)
            }
        };
        if let Some(bad) = addrs.iter().find(|ip| !self.allowed(**ip)) {
            return Err(FetchError::Refused(format!(
                "{} resolves to {bad}, a private or special-use address",
                url.host_str().unwrap_or("")
            )));
        }
        let pinned = SocketAddr::new(addrs[0], port);
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

    /// Names that only exist inside private networks are refused before any lookup; every
    /// other name (`localhost` included) is judged by the addresses it resolves to.
    fn check_name(&self, name: &str) -> Result<(), FetchError> {
        let name = name.trim_end_matches('.');
        if INTERNAL_SUFFIXES.iter().any(|s| name.ends_with(s)) {
            return Err(FetchError::Refused(format!(
                "{name} is an internal host name"
            )));
        }
        Ok(())
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        if self.settings.allow_loopback
            && embedded_v4(ip).map_or(ip.is_loopback(), |v4| v4.is_loopback())
        {
            return true;
        }
        !is_special_use(ip)
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

/// The IPv4 address inside an IPv4-mapped, IPv4-compatible-looking or NAT64 IPv6 address.
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return Some(v4);
            }
            let s = v6.segments();
            // 64:ff9b::/96, the well-known NAT64 prefix.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            None
        }
    }
}

/// Whether `ip` is anything but a globally routable unicast address (RFC 6890 and friends).
pub fn is_special_use(ip: IpAddr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return v4_special(v4);
    }
    match ip {
        IpAddr::V6(v6) => v6_special(v6),
        IpAddr::V4(v4) => v4_special(v4),
    }
}

fn v4_special(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240 // reserved
}

fn v6_special(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x2001 && s[1] < 0x0200) // IETF protocol assignments, Teredo
        || s[0] == 0x2002 // 6to4 (embeds an IPv4 address of any kind)
        || s[..5] == [0, 0, 0, 0, 0] // IPv4-compatible and other ::/80 forms
        || s[..6] == [0, 0, 0, 0, 0xffff, 0] // IPv4-translated ::ffff:0:0/96 (SIIT)
        || s[..3] == [0x64, 0xff9b, 0x0001] // NAT64 local-use 64:ff9b:1::/48 (RFC 8215)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_use_addresses_are_refused() {
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.5",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2001:db8::1",
            "2002:7f00:1::",
            "ff02::1",
            "::ffff:0:a00:1",
            "::ffff:0:7f00:1",
            "::ffff:0:5db8:d822",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff::5db8:d822",
        ] {
            let ip: IpAddr = bad.parse().expect("test address parses");
            assert!(is_special_use(ip), "{bad} should be special-use");
        }
        for ok in [
            "93.184.216.34",
            "2606:2800:220:1:248:1893:25c8:1946",
            "::ffff:93.184.216.34",
        ] {
            let ip: IpAddr = ok.parse().expect("test address parses");
            assert!(!is_special_use(ip), "{ok} is public");
        }
    }

    #[test]
    fn cache_control_max_age() {
        assert_eq!(max_age("public, max-age=600"), Some(600));
        assert_eq!(max_age("no-store"), Some(0));
        assert_eq!(max_age("public"), None);
    }
}
