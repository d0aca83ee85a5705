//! The client's address: the peer's, unless the peer is a trusted proxy
//! (`server.trusted_proxies`), in which case the forwarding headers say who it forwarded for.
//!
//! The chain (`Forwarded: for=…`, else `X-Forwarded-For`) is read from the right, the end the
//! trusted proxies wrote: each hop that is itself a trusted proxy is skipped, and the first
//! that is not is the client. Anything a client writes further left is never believed, so a
//! client cannot choose the address GeoIP, `$ip` and the per-address rate limits see.

use std::net::{IpAddr, SocketAddr};

use actix_web::http::header::{HeaderMap, HeaderName, FORWARDED};
use ipnetwork::IpNetwork;

/// `X-Forwarded-For`, named once rather than parsed from text on every request.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client address of a request from `peer` carrying `headers`.
pub fn resolve(peer: Option<IpAddr>, headers: &HeaderMap, trusted: &[IpNetwork]) -> Option<IpAddr> {
    let peer = peer?;
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(*ip));
    if !is_trusted(&peer) {
        return Some(peer);
    }
    let chain = forwarded_chain(headers);
    let mut client = peer;
    for hop in chain.iter().rev() {
        let Some(ip) = hop else {
            // An entry we cannot read (`unknown`, an obfuscated name): stop at what we know.
            break;
        };
        client = *ip;
        if !is_trusted(ip) {
            break;
        }
    }
    Some(client)
}

/// The hops of `Forwarded` (RFC 7239 `for=`), else of `X-Forwarded-For`, leftmost first;
/// `None` for an entry that is not an address.
fn forwarded_chain(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let forwarded: Vec<Option<IpAddr>> = headers
        .get_all(FORWARDED)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                key.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_hop(value))
            })
        })
        .collect();
    if !forwarded.is_empty() {
        return forwarded;
    }
    headers
        .get_all(X_FORWARDED_FOR)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(parse_hop)
        .collect()
}

/// `1.2.3.4`, `1.2.3.4:80`, `"[2001:db8::1]:443"`, `2001:db8::1`.
fn parse_hop(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    text.strip_prefix('[')
        .and_then(|t| t.split_once(']'))
        .and_then(|(ip, _)| ip.parse().ok())
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        map
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    #[test]
    fn only_trusted_peers_are_believed_and_only_from_the_right() {
        let trusted: Vec<IpNetwork> = vec![
            "127.0.0.0/8".parse().expect("net"),
            "10.0.0.0/8".parse().expect("net"),
        ];
        let spoofed = headers(&[("x-forwarded-for", "6.6.6.6")]);
        assert_eq!(
            resolve(Some(ip("8.8.8.8")), &spoofed, &trusted),
            Some(ip("8.8.8.8")),
            "an untrusted peer is taken at its word: its own address"
        );
        assert_eq!(
            resolve(Some(ip("127.0.0.1")), &spoofed, &trusted),
            Some(ip("6.6.6.6"))
        );
        let chain = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.1.1.1")]);
        assert_eq!(
            resolve(Some(ip("127.0.0.1")), &chain, &trusted),
            Some(ip("1.2.3.4")),
            "what the client wrote on the left is not believed"
        );
        let forwarded = headers(&[("forwarded", "for=\"[2001:db8::1]:4711\";proto=https")]);
        assert_eq!(
            resolve(Some(ip("10.0.0.2")), &forwarded, &trusted),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(
            resolve(Some(ip("127.0.0.1")), &headers(&[]), &trusted),
            Some(ip("127.0.0.1"))
        );
        assert_eq!(
            resolve(Some(ip("127.0.0.1")), &spoofed, &[]),
            Some(ip("127.0.0.1")),
            "no trusted proxies: the header is ignored"
        );
    }
}
