//! Client ID Metadata Documents: validation and the cache of resolved clients.
//!
//! A client is resolved by fetching its `client_id` URL (see [`fetch`](super::fetch)), checking
//! the document, and fetching its logo once through the same fetcher so the consent screen never
//! hot-links it. Resolved clients are cached for the document's `Cache-Control: max-age`,
//! clamped to the configured bounds; failures are never cached, and a changed document (say, a
//! new redirect URI) takes effect only when the cached copy expires.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use dashmap::DashMap;
use serde_json::Value;
use url::Url;

use super::fetch::{FetchError, FetchSettings, Fetcher};
use super::{client_id, redirect};
use crate::kernel::secrets::sha256_hex;

/// Cache and size bounds for client documents and logos.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub fetch: FetchSettings,
    pub max_document_bytes: usize,
    pub max_logo_bytes: usize,
    pub cache_default: Duration,
    pub cache_min: Duration,
    pub cache_max: Duration,
}

/// The fields Corvid uses from a metadata document.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientMetadata {
    pub client_id: String,
    pub client_name: String,
    pub logo_uri: Option<String>,
    pub redirect_uris: Vec<String>,
    /// `com.posthog.scopes`: the most this client may ever be granted.
    pub scope_ceiling: Option<Vec<String>>,
}

/// A cached logo, served from `/oauth/logo/{key}`.
#[derive(Debug, Clone)]
pub struct Logo {
    pub content_type: String,
    pub bytes: Arc<[u8]>,
}

/// A resolved client.
#[derive(Debug)]
pub struct Client {
    pub metadata: ClientMetadata,
    /// The client_id's host (and port), shown on the consent screen.
    pub host: String,
    /// Key of the cached logo, when there is one.
    pub logo_key: Option<String>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    InvalidClientId(String),
    #[error("The client metadata document at {url} {source}")]
    Fetch {
        url: String,
        #[source]
        source: FetchError,
    },
    #[error("The client metadata document is invalid: {0}")]
    Invalid(String),
}

pub struct Registry {
    settings: ClientSettings,
    fetcher: Fetcher,
    clients: DashMap<String, Arc<Client>>,
    logos: DashMap<String, Logo>,
}

#[cfg(test)]
impl ClientSettings {
    /// Settings for engine tests: no loopback fetches, short timeouts, a one-minute cache.
    pub(crate) fn for_test() -> ClientSettings {
        ClientSettings {
            fetch: FetchSettings {
                timeout: Duration::from_secs(1),
                allow_loopback: false,
                extra_ca_pem: None,
            },
            max_document_bytes: 5120,
            max_logo_bytes: 65536,
            cache_default: Duration::from_secs(60),
            cache_min: Duration::from_secs(1),
            cache_max: Duration::from_secs(600),
        }
    }
}

impl Registry {
    pub fn new(settings: ClientSettings) -> Result<Registry, String> {
        Ok(Registry {
            fetcher: Fetcher::new(settings.fetch.clone())?,
            settings,
            clients: DashMap::new(),
            logos: DashMap::new(),
        })
    }

    /// The client named by `client_id`: from the cache while fresh at `now`, else fetched and
    /// checked.
    pub async fn resolve(&self, raw: &str, now: DateTime<Utc>) -> Result<Arc<Client>, ClientError> {
        let url = client_id::validate(raw).map_err(ClientError::InvalidClientId)?;
        if let Some(client) = self.cached(raw, now) {
            return Ok(client);
        }
        let fetched = self
            .fetcher
            .get(&url, self.settings.max_document_bytes, "application/json")
            .await
            .map_err(|source| ClientError::Fetch {
                url: raw.to_string(),
                source,
            })?;
        let metadata = parse_document(raw, &fetched.body)?;
        let ttl = fetched
            .max_age
            .map(Duration::from_secs)
            .unwrap_or(self.settings.cache_default)
            .clamp(self.settings.cache_min, self.settings.cache_max);
        let logo_key = match &metadata.logo_uri {
            Some(uri) => self.fetch_logo(raw, uri).await,
            None => None,
        };
        let client = Arc::new(Client {
            host: client_id::display_host(&url),
            metadata,
            logo_key,
            expires_at: now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX),
        });
        self.clients.insert(raw.to_string(), Arc::clone(&client));
        Ok(client)
    }

    /// The cached client, while its copy is fresh at `now`: a changed document (say, a new
    /// redirect URI) takes effect only when the cached copy expires.
    fn cached(&self, raw: &str, now: DateTime<Utc>) -> Option<Arc<Client>> {
        let client = self.clients.get(raw)?;
        (client.expires_at > now).then(|| Arc::clone(&client))
    }

    /// A cached logo by key.
    pub fn logo(&self, key: &str) -> Option<Logo> {
        self.logos.get(key).map(|l| l.clone())
    }

    /// Fetches and keeps the logo; any failure just means no logo (never a hot link).
    async fn fetch_logo(&self, client_id: &str, uri: &str) -> Option<String> {
        let url = Url::parse(uri).ok()?;
        let fetched = match self
            .fetcher
            .get(
                &url,
                self.settings.max_logo_bytes,
                "image/png, image/jpeg, image/gif, image/webp",
            )
            .await
        {
            Ok(f) => f,
            Err(err) => {
                tracing::info!(client_id, error = %err, "client logo not fetched");
                return None;
            }
        };
        let content_type = fetched
            .content_type
            .as_deref()
            .and_then(|c| c.split(';').next())
            .map(|c| c.trim().to_ascii_lowercase())?;
        // Raster images only: an SVG can carry script.
        if !["image/png", "image/jpeg", "image/gif", "image/webp"].contains(&content_type.as_str())
        {
            return None;
        }
        let key = sha256_hex(client_id);
        self.logos.insert(
            key.clone(),
            Logo {
                content_type,
                bytes: fetched.body.into(),
            },
        );
        Some(key)
    }
}

/// Checks a fetched document against the URL it came from.
pub fn parse_document(url: &str, body: &[u8]) -> Result<ClientMetadata, ClientError> {
    let invalid = |m: &str| ClientError::Invalid(m.to_string());
    let doc: Value = serde_json::from_slice(body).map_err(|_| invalid("it is not valid JSON"))?;
    let obj = doc
        .as_object()
        .ok_or_else(|| invalid("it is not a JSON object"))?;
    match obj.get("client_id").and_then(Value::as_str) {
        Some(id) if id == url => {}
        Some(_) => {
            return Err(invalid(
                "its client_id does not equal the URL it was fetched from",
            ))
        }
        None => return Err(invalid("client_id is missing")),
    }
    let client_name = obj
        .get("client_name")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("client_name is required"))?;
    if client_name.chars().count() > 200 {
        return Err(invalid("client_name is longer than 200 characters"));
    }
    let redirect_uris: Vec<String> = match obj.get("redirect_uris") {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("redirect_uris must be strings"))?,
        _ => return Err(invalid("redirect_uris must be a non-empty array")),
    };
    for uri in &redirect_uris {
        redirect::check_registered(uri).map_err(ClientError::Invalid)?;
    }
    if obj.contains_key("client_secret") || obj.contains_key("client_secret_expires_at") {
        return Err(invalid(
            "a client metadata document must not contain a client secret",
        ));
    }
    match obj.get("token_endpoint_auth_method") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == "none" => {}
        Some(_) => {
            return Err(invalid(
                "token_endpoint_auth_method must be \"none\" (public clients with PKCE)",
            ))
        }
    }
    let logo_uri = obj
        .get("logo_uri")
        .and_then(Value::as_str)
        .filter(|u| Url::parse(u).is_ok_and(|u| u.scheme() == "https"))
        .map(str::to_string);
    let scope_ceiling = match obj.get("com.posthog.scopes") {
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        ),
        Some(Value::String(s)) => Some(s.split_ascii_whitespace().map(str::to_string).collect()),
        _ => None,
    };
    Ok(ClientMetadata {
        client_id: url.to_string(),
        client_name: client_name.to_string(),
        logo_uri,
        redirect_uris,
        scope_ceiling,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "https://app.example.com/client.json";

    fn doc(extra: Value) -> Vec<u8> {
        let mut base = serde_json::json!({
            "client_id": URL,
            "client_name": "Example",
            "redirect_uris": ["https://app.example.com/cb", "http://localhost/cb"],
        });
        for (k, v) in extra.as_object().expect("object").clone() {
            base[k] = v;
        }
        serde_json::to_vec(&base).expect("serializes")
    }

    #[test]
    fn a_cached_client_is_used_until_its_copy_expires() {
        let registry = Registry::new(ClientSettings::for_test()).expect("registry");
        let now = Utc::now();
        let metadata = parse_document(URL, &doc(serde_json::json!({}))).expect("valid");
        registry.clients.insert(
            URL.into(),
            Arc::new(Client {
                metadata,
                host: "app.example.com".into(),
                logo_key: None,
                expires_at: now + chrono::Duration::seconds(3),
            }),
        );
        assert!(registry
            .cached(URL, now + chrono::Duration::seconds(2))
            .is_some());
        assert!(registry
            .cached(URL, now + chrono::Duration::seconds(3))
            .is_none());
        assert!(registry
            .cached("https://other.example/c.json", now)
            .is_none());
    }

    #[test]
    fn a_minimal_document_parses() {
        let m = parse_document(
            URL,
            &doc(serde_json::json!({"logo_uri": "http://x.com/l.png"})),
        )
        .expect("valid");
        assert_eq!(m.client_name, "Example");
        assert_eq!(m.redirect_uris.len(), 2);
        assert_eq!(m.logo_uri, None, "non-https logos are dropped");
    }

    #[test]
    fn documents_breaking_the_rules_are_refused() {
        for (extra, why) in [
            (
                serde_json::json!({"client_id": "https://app.example.com/client.json/"}),
                "mismatch",
            ),
            (
                serde_json::json!({"client_id": "https://APP.example.com/client.json"}),
                "case",
            ),
            (serde_json::json!({"client_name": ""}), "name"),
            (serde_json::json!({"redirect_uris": []}), "no redirects"),
            (
                serde_json::json!({"redirect_uris": ["http://evil.com/cb"]}),
                "cleartext",
            ),
            (
                serde_json::json!({"token_endpoint_auth_method": "client_secret_post"}),
                "secret",
            ),
            (serde_json::json!({"client_secret": "s"}), "secret field"),
        ] {
            assert!(parse_document(URL, &doc(extra)).is_err(), "{why}");
        }
        assert!(parse_document(URL, b"[1]").is_err());
        assert!(parse_document(URL, b"not json").is_err());
    }
}
