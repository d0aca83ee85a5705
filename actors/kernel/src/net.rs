//! Telling public addresses from everything else, for every outbound request a user can aim
//! (OAuth client metadata documents, export buckets): private, loopback, link-local, CGNAT,
//! multicast, documentation and other special-use addresses (RFC 6890) are not public, nor
//! names that only exist inside private networks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use url::{Host, Url};

/// Name suffixes that only make sense inside a private network.
pub const INTERNAL_SUFFIXES: &[&str] = &[
    ".local",
    ".internal",
    ".localdomain",
    ".lan",
    ".corp",
    ".intranet",
    ".consul",
    ".home.arpa",
];

/// The IPv4 address inside an IPv4-mapped, IPv4-compatible-looking or NAT64 IPv6 address.
pub fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
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

/// Whether `name` (a host name, a trailing dot allowed) only exists inside private networks.
pub fn is_internal_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || INTERNAL_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// Where an outbound request may go: the URL's host name (for TLS and the `Host` header; `None`
/// for an address literal) and the one checked address to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub domain: Option<String>,
    pub address: SocketAddr,
}

/// Why an outbound request may not go where its URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// The URL names a private or special-use address, or an internal name.
    Refused(String),
    /// The name does not resolve.
    Dns(String),
}

/// Resolves `url`'s host once and checks every address it has: all must be public, so the
/// caller connects to [`Resolved::address`] and never looks the name up again (no DNS
/// rebinding between the check and the connection). `allow_loopback` (development only) lets
/// loopback addresses through, still refusing every other special use.
pub async fn resolve_public(url: &Url, allow_loopback: bool) -> Result<Resolved, Unreachable> {
    let port = url
        .port_or_known_default()
        .ok_or_else(|| Unreachable::Refused("URL has no port".into()))?;
    let host = url
        .host()
        .ok_or_else(|| Unreachable::Refused("URL has no host".into()))?;
    let (domain, addrs) = match host {
        Host::Ipv4(ip) => (None, vec![IpAddr::V4(ip)]),
        Host::Ipv6(ip) => (None, vec![IpAddr::V6(ip)]),
        Host::Domain(name) => {
            let name = name.to_ascii_lowercase();
            let bare = name.trim_end_matches('.');
            if INTERNAL_SUFFIXES.iter().any(|s| bare.ends_with(s)) {
                return Err(Unreachable::Refused(format!(
                    "{bare} is an internal host name"
                )));
            }
            let addrs: Vec<IpAddr> = tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(|_| Unreachable::Dns(name.clone()))?
                .map(|a| a.ip())
                .collect();
            if addrs.is_empty() {
                return Err(Unreachable::Dns(name));
            }
            (Some(name), addrs)
        }
    };
    let allowed = |ip: IpAddr| {
        (allow_loopback && embedded_v4(ip).map_or(ip.is_loopback(), |v4| v4.is_loopback()))
            || !is_special_use(ip)
    };
    if let Some(bad) = addrs.iter().find(|ip| !allowed(**ip)) {
        return Err(Unreachable::Refused(format!(
            "{} resolves to {bad}, a private or special-use address",
            url.host_str().unwrap_or("")
        )));
    }
    Ok(Resolved {
        domain,
        address: SocketAddr::new(addrs[0], port),
    })
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

    #[tokio::test]
    async fn loopback_is_refused_unless_allowed_and_internal_names_always() {
        let url = |s: &str| Url::parse(s).expect("test URL parses");
        let loopback = url("http://127.0.0.1:9/hook");
        assert!(matches!(
            resolve_public(&loopback, false).await,
            Err(Unreachable::Refused(_))
        ));
        let resolved = resolve_public(&loopback, true).await.expect("allowed");
        assert_eq!(resolved.address, "127.0.0.1:9".parse().expect("address"));
        assert_eq!(resolved.domain, None);
        assert!(matches!(
            resolve_public(&url("http://10.0.0.1/"), true).await,
            Err(Unreachable::Refused(_))
        ));
        assert!(matches!(
            resolve_public(&url("https://metadata.internal/"), true).await,
            Err(Unreachable::Refused(_))
        ));
    }
}
