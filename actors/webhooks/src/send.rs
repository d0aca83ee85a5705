//! Sending one delivery: the signature and the POST, under the same address rules as every
//! request Corvid makes where a user points it (the host resolved once, every address public,
//! the connection pinned to the checked one; no redirects, no proxies; one deadline).

use std::time::{Duration, Instant};

use ring::hmac;
use url::Url;

use corvid_kernel::net::{resolve_public, Resolved, Unreachable};

use super::delivery::{Delivery, Outcome};

/// `X-Corvid-Signature`'s value: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
/// The time inside the signed text lets a receiver refuse old replays.
pub fn signature(secret: &str, unix: i64, body: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let tag = hmac::sign(&key, format!("{unix}.{body}").as_bytes());
    format!("t={unix},v1={}", hex::encode(tag.as_ref()))
}

/// Posts deliveries.
#[derive(Debug, Clone)]
pub struct Sender {
    /// Deadline of one attempt: lookup, connect, TLS, request and the answer's head.
    pub timeout: Duration,
    /// DEVELOPMENT ONLY (`[webhooks] dev_allow_loopback`): loopback receivers are reached.
    pub allow_loopback: bool,
}

impl Sender {
    /// Posts `delivery` to `url`, signed with `secret`; never fails, the outcome says how it went.
    pub async fn send(&self, url: &str, secret: &str, delivery: &Delivery) -> Outcome {
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.post(url, secret, delivery)).await;
        let (status_code, error) = match result {
            Ok(Ok(status)) => (
                Some(status),
                (!(200..300).contains(&status)).then(|| format!("the receiver answered {status}")),
            ),
            Ok(Err(error)) => (None, Some(error)),
            Err(_) => (None, Some(format!("timed out after {:?}", self.timeout))),
        };
        Outcome {
            status_code,
            error,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }

    async fn post(&self, url: &str, secret: &str, delivery: &Delivery) -> Result<u16, String> {
        let url = Url::parse(url).map_err(|e| format!("invalid URL: {e}"))?;
        let Resolved { domain, address } = resolve_public(&url, self.allow_loopback)
            .await
            .map_err(|e| match e {
                Unreachable::Refused(why) => format!("refused: {why}"),
                Unreachable::Dns(name) => format!("could not resolve {name}"),
            })?;
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent("Corvid-Webhooks/1.0");
        if let Some(domain) = &domain {
            builder = builder.resolve(domain, address);
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        let now = chrono::Utc::now().timestamp();
        let response = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("X-Corvid-Delivery", delivery.id.to_string())
            .header("X-Corvid-Event", &delivery.event_type)
            .header("X-Corvid-Signature", signature(secret, now, &delivery.body))
            .body(delivery.body.clone())
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    "connection failed".to_string()
                } else {
                    e.without_url().to_string()
                }
            })?;
        Ok(response.status().as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2, over the signed text `"<t>.<body>"`.
    #[test]
    fn the_signature_is_hmac_sha256_of_time_dot_body() {
        let sig = signature("Jefe", 1, "what do ya want for nothing?");
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"Jefe");
        let expected = hex::encode(hmac::sign(&key, b"1.what do ya want for nothing?").as_ref());
        assert_eq!(sig, format!("t=1,v1={expected}"));
        // RFC 4231's own vector, to tie the HMAC to the standard.
        let rfc = hmac::sign(&key, b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(rfc.as_ref()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
