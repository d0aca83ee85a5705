//! Client ID Metadata Documents: validation and the cache of resolved clients.
//!
//! A client is resolved by fetching its `client_id` URL (see [`fetch`](super::fetch)), checking
//! the document, and fetching its logo once through the same fetcher so the consent screen never
//! hot-links it. Resolved clients are cached for the document's `Cache-Control: max-age`,
//! clamped to the configured bounds, and a changed document (say, a new redirect URI) takes
//! effect only when the cached copy expires.
//!
//! Anyone can name a new `client_id`, so what is kept is bounded: one cache of clients, logos
//! and recent failures, weighed in bytes (`cache_bytes`), evicting the least used first;
//! expired entries are dropped when met and by [`Registry::prune`]. A failed resolution is
//! remembered for `failure_ttl`, so a bad client cannot make us fetch on every request, and at
//! most `max_concurrent_fetches` fetches run at once.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use serde_json::Value;
use url::Url;

use super::fetch::{FetchError, FetchSettings, Fetcher};
use super::{client_id, redirect};
use corvid_kernel::secrets::sha256_hex;

/// Cache and size bounds for client documents and logos.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub fetch: FetchSettings,
    pub max_document_bytes: usize,
    pub max_logo_bytes: usize,
    pub cache_default: Duration,
    pub cache_min: Duration,
    pub cache_max: Duration,
    /// Bytes of clients, logos and remembered failures kept.
    pub cache_bytes: usize,
    /// How long a failed resolution is answered from memory.
    pub failure_ttl: Duration,
    /// Document and logo fetches in flight at once.
    pub max_concurrent_fetches: usize,
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
    /// Size of the fetched document: what the client weighs in the cache.
    pub document_bytes: usize,
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
    /// A resolution of this client failed a moment ago; its message is answered again.
    #[error("{0}")]
    Remembered(Arc<str>),
    /// Too many client fetches are running on this server.
    #[error("Too many applications are being looked up right now. Try again in a moment.")]
    Busy,
}

/// What the registry keeps, all in one cache bounded by weight.
#[derive(Clone)]
enum Kept {
    Client(Arc<Client>),
    Logo(Logo),
    /// A failed resolution, answered from memory until `until`.
    Failure {
        message: Arc<str>,
        until: DateTime<Utc>,
    },
}

impl Kept {
    fn expired(&self, now: DateTime<Utc>) -> bool {
        match self {
            Kept::Client(client) => client.expires_at <= now,
            Kept::Logo(_) => false,
            Kept::Failure { until, .. } => *until <= now,
        }
    }
}

/// Bytes an entry holds, roughly: its key, its payload and a fixed overhead.
#[derive(Clone)]
struct KeptWeight;

/// What every entry costs beyond its payload (the entry, the map slot, small fields).
const ENTRY_OVERHEAD: u64 = 256;

impl quick_cache::Weighter<String, Kept> for KeptWeight {
    fn weight(&self, key: &String, kept: &Kept) -> u64 {
        let payload = match kept {
            Kept::Client(client) => client.document_bytes,
            Kept::Logo(logo) => logo.bytes.len(),
            Kept::Failure { message, .. } => message.len(),
        };
        ENTRY_OVERHEAD + key.len() as u64 + payload as u64
    }
}

fn client_key(client_id: &str) -> String {
    format!("client {client_id}")
}

fn failure_key(client_id: &str) -> String {
    format!("failure {client_id}")
}

fn logo_key(key: &str) -> String {
    format!("logo {key}")
}

pub struct Registry {
    settings: ClientSettings,
    fetcher: Fetcher,
    kept: quick_cache::sync::Cache<String, Kept, KeptWeight>,
    fetches: tokio::sync::Semaphore,
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
            cache_bytes: 1 << 20,
            failure_ttl: Duration::from_secs(30),
            max_concurrent_fetches: 4,
        }
    }
}

impl Registry {
    pub fn new(settings: ClientSettings) -> Result<Registry, String> {
        let bytes = settings.cache_bytes.max(1) as u64;
        // quick_cache sizes its table from an item estimate: documents are small, logos large.
        let estimated_items = (settings.cache_bytes / 2048).clamp(16, 1 << 20);
        Ok(Registry {
            fetcher: Fetcher::new(settings.fetch.clone())?,
            kept: quick_cache::sync::Cache::with_weighter(estimated_items, bytes, KeptWeight),
            fetches: tokio::sync::Semaphore::new(settings.max_concurrent_fetches.max(1)),
            settings,
        })
    }

    /// The client named by `client_id`: from the cache while fresh at `now`, else fetched and
    /// checked. A failure is remembered for `failure_ttl`.
    pub async fn resolve(&self, raw: &str, now: DateTime<Utc>) -> Result<Arc<Client>, ClientError> {
        let url = client_id::validate(raw).map_err(ClientError::InvalidClientId)?;
        if let Some(client) = self.cached(raw, now) {
            return Ok(client);
        }
        if let Some(Kept::Failure { message, .. }) = self.fresh(&failure_key(raw), now) {
            return Err(ClientError::Remembered(message));
        }
        let permit = self.fetches.try_acquire().map_err(|_| ClientError::Busy)?;
        let fetched = self.fetch_client(raw, &url, now).await;
        drop(permit);
        match fetched {
            Ok(client) => {
                self.kept.remove(&failure_key(raw));
                self.kept
                    .insert(client_key(raw), Kept::Client(Arc::clone(&client)));
                Ok(client)
            }
            Err(err) => {
                let until = corvid_kernel::time::add_or_max(
                    now,
                    corvid_kernel::time::from_std(self.settings.failure_ttl),
                );
                let message: Arc<str> = err.to_string().into();
                self.kept
                    .insert(failure_key(raw), Kept::Failure { message, until });
                Err(err)
            }
        }
    }

    async fn fetch_client(
        &self,
        raw: &str,
        url: &Url,
        now: DateTime<Utc>,
    ) -> Result<Arc<Client>, ClientError> {
        let fetched = self
            .fetcher
            .get(url, self.settings.max_document_bytes, "application/json")
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
        Ok(Arc::new(Client {
            host: client_id::display_host(url),
            metadata,
            logo_key,
            expires_at: corvid_kernel::time::add_or_max(now, corvid_kernel::time::from_std(ttl)),
            document_bytes: fetched.body.len(),
        }))
    }

    /// The entry at `key` unless it expired at `now` (an expired one is dropped).
    fn fresh(&self, key: &str, now: DateTime<Utc>) -> Option<Kept> {
        let kept = self.kept.get(key)?;
        if kept.expired(now) {
            self.kept.remove(key);
            return None;
        }
        Some(kept)
    }

    /// The cached client, while its copy is fresh at `now`: a changed document (say, a new
    /// redirect URI) takes effect only when the cached copy expires.
    fn cached(&self, raw: &str, now: DateTime<Utc>) -> Option<Arc<Client>> {
        match self.fresh(&client_key(raw), now)? {
            Kept::Client(client) => Some(client),
            Kept::Logo(_) | Kept::Failure { .. } => None,
        }
    }

    /// A cached logo by key.
    pub fn logo(&self, key: &str) -> Option<Logo> {
        match self.kept.get(&logo_key(key))? {
            Kept::Logo(logo) => Some(logo),
            Kept::Client(_) | Kept::Failure { .. } => None,
        }
    }

    /// Drops every expired client and failure; returns how many entries are left.
    pub fn prune(&self, now: DateTime<Utc>) -> usize {
        self.kept.retain(|_, kept| !kept.expired(now));
        self.kept.len()
    }

    /// Entries kept and the bytes they weigh.
    pub fn usage(&self) -> (usize, u64) {
        (self.kept.len(), self.kept.weight())
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
        self.kept.insert(
            logo_key(&key),
            Kept::Logo(Logo {
                content_type,
                bytes: fetched.body.into(),
            }),
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
        registry.kept.insert(
            client_key(URL),
            Kept::Client(Arc::new(Client {
                metadata,
                host: "app.example.com".into(),
                logo_key: None,
                expires_at: now + chrono::Duration::seconds(3),
                document_bytes: 100,
            })),
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
    fn the_cache_stays_within_its_bytes_and_prunes_expired_entries() {
        let settings = ClientSettings {
            cache_bytes: 64 * 1024,
            ..ClientSettings::for_test()
        };
        let registry = Registry::new(settings).expect("registry");
        let now = Utc::now();
        for i in 0..2000 {
            let id = format!("https://app{i}.example.com/client.json");
            registry.kept.insert(
                failure_key(&id),
                Kept::Failure {
                    message: "The client metadata document could not be fetched".into(),
                    until: now + chrono::Duration::seconds(if i % 2 == 0 { 1 } else { 60 }),
                },
            );
        }
        let (entries, bytes) = registry.usage();
        assert!(bytes <= 64 * 1024, "{entries} entries weigh {bytes} bytes");
        assert!(entries < 2000);
        let left = registry.prune(now + chrono::Duration::seconds(2));
        assert!(left <= entries);
        assert!(registry
            .fresh(&failure_key("https://app0.example.com/client.json"), now)
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
