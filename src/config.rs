//! Corvid's one typed configuration.
//!
//! Layers, later wins: the embedded `config/default.toml` → an optional file → `CORVID_*`
//! environment variables → command-line flags (the last two applied by the CLI through
//! [`Overrides`]). Unknown keys are rejected so a typo never silently falls back to a default.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corvid_actors::endpoints::{EndpointSettings, Rates, ResultStorage, S3Settings};
use corvid_actors::engine::EngineSettings;
use corvid_actors::flags::FlagsSettings;
use corvid_actors::ingest::{CompactionConfig, Durability, IngestConfig, Limits};
use corvid_actors::meta::TenancySettings;
use corvid_actors::oauth::{ClientSettings, FetchSettings, Lifetimes, OAuthSettings};
use corvid_actors::query::QuerySettings;
use serde::Deserialize;

/// The embedded defaults; also the documentation of every key.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config in {origin}: {source}")]
    Parse {
        origin: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Root of all on-disk state.
    pub data_dir: PathBuf,
    /// Base URL clients reach us on; `http://<bind>` when unset.
    #[serde(default)]
    pub public_url: Option<String>,
    pub server: ServerConfig,
    pub limits: LimitsConfig,
    pub capture: CaptureConfig,
    pub ingest: IngestSection,
    pub flags: FlagsConfig,
    pub browser: BrowserConfig,
    pub surveys: SurveysConfig,
    pub query: QueryConfig,
    pub endpoints: EndpointsConfig,
    #[serde(default)]
    pub geoip: GeoIpConfig,
    pub auth: AuthConfig,
    pub oauth: OAuthConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub bind: SocketAddr,
    #[serde(default)]
    pub workers: Option<NonZeroUsize>,
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_body_bytes: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    pub max_decompressed_bytes: usize,
    pub max_event_bytes: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestSection {
    pub durability: Durability,
    pub shards: NonZeroUsize,
    pub flush_max_rows: NonZeroUsize,
    pub flush_max_bytes: NonZeroUsize,
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    pub max_buffered_events: NonZeroUsize,
    pub max_queued_requests: NonZeroUsize,
    pub wal_segment_bytes: u64,
    pub dedup_window: usize,
    /// Event properties stored as their own columns in segments (fast to filter and group).
    pub materialized_properties: Vec<String>,
    pub auto_materialized_keys: usize,
    #[serde(with = "humantime_serde")]
    pub compaction_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub compaction_grace: Duration,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeoIpConfig {
    #[serde(default)]
    pub database_path: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlagsConfig {
    #[serde(with = "humantime_serde")]
    pub stored_read_deadline: Duration,
}

/// `[browser]`: what browser SDKs are served besides capture and flags.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserConfig {
    /// `Cache-Control: max-age` of `/array/{token}/config(.js)`.
    #[serde(with = "humantime_serde")]
    pub remote_config_max_age: Duration,
    /// Where `/static/*` (the SDK's lazily loaded scripts: surveys, recorder, toolbar…) is
    /// redirected; empty answers 404.
    pub assets_url: String,
}

/// `[surveys]`: upkeep of running surveys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurveysConfig {
    /// How often surveys are checked against their response limits and iteration dates.
    #[serde(with = "humantime_serde")]
    pub maintenance_interval: Duration,
}

/// `[query]`: limits of SQL and insight queries.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryConfig {
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub memory_limit_bytes: NonZeroUsize,
    pub default_rows: NonZeroUsize,
    pub max_rows: NonZeroUsize,
    /// Query runtime threads; 0 means one per core.
    pub threads: usize,
    /// DataFusion session options for every query (`[query.datafusion]`), e.g.
    /// `"datafusion.execution.batch_size" = "16384"`; an unknown key or bad value stops startup.
    #[serde(default)]
    pub datafusion: std::collections::BTreeMap<String, String>,
}

/// `[endpoints]`: results cache, materializer, execution logs and run rate limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointsConfig {
    pub cache_entries: NonZeroUsize,
    pub materialized_dir: PathBuf,
    /// When set, materialized results go to this S3-compatible bucket instead.
    #[serde(default)]
    pub s3: Option<S3Config>,
    #[serde(with = "humantime_serde")]
    pub materialize_check_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub materialize_retry: Duration,
    pub materialize_max_rows: NonZeroUsize,
    #[serde(with = "humantime_serde")]
    pub log_retention: Duration,
    pub inline_per_minute: u64,
    pub inline_per_hour: u64,
    pub materialized_per_minute: u64,
    pub materialized_per_hour: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(with = "humantime_serde")]
    pub credential_cache_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub last_used_resolution: Duration,
}

/// `[endpoints.s3]`: an S3-compatible bucket for materialized results.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    pub bucket: String,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key: Option<String>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub allow_http: bool,
}

/// `[oauth]`: the authorization server, its client-metadata fetcher and secret scanning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// Other base URLs this server answers on (e.g. US, EU, region-agnostic hosts).
    pub region_urls: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub access_token_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub refresh_token_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub code_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub cimd_fetch_timeout: Duration,
    pub cimd_max_document_bytes: usize,
    pub cimd_max_logo_bytes: usize,
    #[serde(with = "humantime_serde")]
    pub cimd_cache_default: Duration,
    #[serde(with = "humantime_serde")]
    pub cimd_cache_min: Duration,
    #[serde(with = "humantime_serde")]
    pub cimd_cache_max: Duration,
    /// DEVELOPMENT ONLY: fetch client metadata from loopback addresses.
    pub dev_allow_loopback_fetch: bool,
    /// DEVELOPMENT ONLY: a PEM CA certificate trusted for client metadata, beside the public roots.
    #[serde(default)]
    pub dev_extra_ca_file: Option<PathBuf>,
    /// Public keys that sign secret-scanning reports.
    #[serde(default)]
    pub secret_scanning_keys: Vec<SecretScanningKey>,
}

/// One secret-scanning signing key: its identifier (sent in the report's key-id header) and
/// the PEM ECDSA P-256 public key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretScanningKey {
    pub id: String,
    pub pem: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    pub filter: String,
}

/// Values from the environment and the command line, applied over the files.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub bind: Option<SocketAddr>,
    pub public_url: Option<String>,
    pub log_format: Option<LogFormat>,
}

impl Config {
    /// The embedded defaults alone.
    pub fn defaults() -> Config {
        // The embedded file is checked by a unit test; failing here would be a build defect.
        Self::from_layers(&[("embedded defaults", DEFAULT_TOML)])
            .expect("embedded config/default.toml is valid")
    }

    /// Defaults, then the optional file, then overrides.
    pub fn load(file: Option<&Path>, overrides: Overrides) -> Result<Config, ConfigError> {
        let mut layers = vec![("embedded defaults".to_string(), DEFAULT_TOML.to_string())];
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            layers.push((path.display().to_string(), text));
        }
        let borrowed: Vec<(&str, &str)> = layers
            .iter()
            .map(|(o, t)| (o.as_str(), t.as_str()))
            .collect();
        let mut config = Self::from_layers(&borrowed)?;
        config.apply(overrides);
        config.validate()?;
        Ok(config)
    }

    /// A config for tests: port 0 on loopback, state under `data_dir`, fast shutdown.
    #[cfg(any(test, feature = "test-support"))]
    pub fn for_test(data_dir: &Path) -> Config {
        let mut config = Config::defaults();
        config.data_dir = data_dir.to_path_buf();
        config.server.bind = SocketAddr::from(([127, 0, 0, 1], 0));
        config.server.workers = NonZeroUsize::new(2);
        config.server.shutdown_timeout = Duration::from_secs(5);
        config.surveys.maintenance_interval = Duration::from_millis(200);
        // Test traffic stays on loopback: no redirects to a public CDN.
        config.browser.assets_url = String::new();
        config
    }

    fn from_layers(layers: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut merged = toml::Table::new();
        for (origin, text) in layers {
            let table: toml::Table = toml::from_str(text).map_err(|source| ConfigError::Parse {
                origin: origin.to_string(),
                source,
            })?;
            merge(&mut merged, table);
        }
        toml::Value::Table(merged)
            .try_into()
            .map_err(|source| ConfigError::Parse {
                origin: "merged configuration".into(),
                source,
            })
    }

    fn apply(&mut self, o: Overrides) {
        if let Some(dir) = o.data_dir {
            self.data_dir = dir;
        }
        if let Some(bind) = o.bind {
            self.server.bind = bind;
        }
        if let Some(url) = o.public_url {
            self.public_url = Some(url);
        }
        if let Some(format) = o.log_format {
            self.log.format = format;
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.limits.max_body_bytes == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_body_bytes must be > 0".into(),
            ));
        }
        if let Some(url) = &self.public_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with('/') {
                return Err(ConfigError::Invalid(
                    "public_url must start with http:// or https:// and have no trailing slash"
                        .into(),
                ));
            }
        }
        for url in &self.oauth.region_urls {
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with('/') {
                return Err(ConfigError::Invalid(format!(
                    "oauth.region_urls entry `{url}` must be an http(s) URL without a trailing slash"
                )));
            }
        }
        if self.surveys.maintenance_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "surveys.maintenance_interval must be > 0".into(),
            ));
        }
        let assets = &self.browser.assets_url;
        if !assets.is_empty()
            && (!(assets.starts_with("http://") || assets.starts_with("https://"))
                || assets.ends_with('/'))
        {
            return Err(ConfigError::Invalid(
                "browser.assets_url must be empty or an http(s) URL without a trailing slash"
                    .into(),
            ));
        }
        let o = &self.oauth;
        if o.cimd_cache_min > o.cimd_cache_max {
            return Err(ConfigError::Invalid(
                "oauth.cimd_cache_min must not exceed oauth.cimd_cache_max".into(),
            ));
        }
        if o.access_token_ttl.is_zero() || o.refresh_token_ttl.is_zero() || o.code_ttl.is_zero() {
            return Err(ConfigError::Invalid(
                "oauth token and code lifetimes must be > 0".into(),
            ));
        }
        Ok(())
    }

    /// The OAuth engine's client-resolution settings (reads the dev CA file, if any).
    pub fn oauth_client_settings(&self) -> Result<ClientSettings, ConfigError> {
        let o = &self.oauth;
        let extra_ca_pem = match &o.dev_extra_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        Ok(ClientSettings {
            fetch: FetchSettings {
                timeout: o.cimd_fetch_timeout,
                allow_loopback: o.dev_allow_loopback_fetch,
                extra_ca_pem,
            },
            max_document_bytes: o.cimd_max_document_bytes,
            max_logo_bytes: o.cimd_max_logo_bytes,
            cache_default: o.cimd_cache_default,
            cache_min: o.cimd_cache_min,
            cache_max: o.cimd_cache_max,
        })
    }

    /// Lifetimes of OAuth codes, tokens and login sessions.
    pub fn oauth_lifetimes(&self) -> Lifetimes {
        let o = &self.oauth;
        Lifetimes {
            code: o.code_ttl,
            access_token: o.access_token_ttl,
            refresh_token: o.refresh_token_ttl,
            session: o.session_ttl,
        }
    }

    /// The public base URL for a server bound to `bound` (the real port when bind used port 0).
    pub fn public_url_for(&self, bound: SocketAddr) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| format!("http://{bound}"))
    }

    /// The capture decoder's limits.
    pub fn capture_limits(&self) -> Limits {
        Limits {
            max_decompressed_bytes: self.capture.max_decompressed_bytes,
            max_event_bytes: self.capture.max_event_bytes,
        }
    }

    /// The ingest pipeline's configuration.
    pub fn ingest_config(&self) -> IngestConfig {
        let i = &self.ingest;
        IngestConfig {
            data_dir: self.data_dir.clone(),
            durability: i.durability,
            shards: i.shards.get(),
            flush_max_rows: i.flush_max_rows.get(),
            flush_max_bytes: i.flush_max_bytes.get(),
            flush_interval: i.flush_interval,
            max_buffered_events: i.max_buffered_events.get(),
            max_queued_requests: i.max_queued_requests.get(),
            wal_segment_bytes: i.wal_segment_bytes.max(1024),
            dedup_window: i.dedup_window,
        }
    }

    /// The property-column compactor's settings.
    pub fn compaction_config(&self) -> CompactionConfig {
        CompactionConfig {
            auto_keys: self.ingest.auto_materialized_keys,
            min_share: 0.2,
            sample_rows: 100_000,
            grace: self.ingest.compaction_grace,
        }
    }

    /// The query engine's limits and sizing.
    pub fn query_settings(&self) -> QuerySettings {
        let q = &self.query;
        let threads = match q.threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        QuerySettings {
            timeout: q.timeout,
            memory_limit_bytes: q.memory_limit_bytes.get(),
            default_rows: q.default_rows.get().min(q.max_rows.get()),
            max_rows: q.max_rows.get(),
            threads,
            datafusion_options: q
                .datafusion
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The endpoints engine's settings.
    pub fn endpoint_settings(&self) -> EndpointSettings {
        let e = &self.endpoints;
        EndpointSettings {
            cache_entries: e.cache_entries.get(),
            materialize_interval: e.materialize_check_interval.max(Duration::from_millis(100)),
            materialize_retry: e.materialize_retry,
            materialize_max_rows: e.materialize_max_rows.get(),
            log_retention: e.log_retention,
            inline_rates: Rates {
                per_minute: e.inline_per_minute,
                per_hour: e.inline_per_hour,
            },
            materialized_rates: Rates {
                per_minute: e.materialized_per_minute,
                per_hour: e.materialized_per_hour,
            },
        }
    }

    /// Where materialized endpoint results are stored (when no bucket is configured).
    pub fn materialized_dir(&self) -> PathBuf {
        self.data_dir.join(&self.endpoints.materialized_dir)
    }

    /// The object store for materialized results: the `[endpoints.s3]` bucket when set, else
    /// the local directory.
    pub fn result_storage(&self) -> anyhow::Result<ResultStorage> {
        match &self.endpoints.s3 {
            Some(s3) => Ok(ResultStorage::s3(&S3Settings {
                bucket: s3.bucket.clone(),
                region: s3.region.clone(),
                endpoint: s3.endpoint.clone(),
                access_key_id: s3.access_key_id.clone(),
                secret_access_key: s3.secret_access_key.clone(),
                prefix: s3.prefix.clone(),
                allow_http: s3.allow_http,
            })
            .map_err(|e| anyhow::anyhow!(e))?),
            None => Ok(ResultStorage::local(&self.materialized_dir())?),
        }
    }

    /// Everything the engine is started with.
    /// The engine's settings; `public_url` is where clients reach this server (OAuth issues
    /// tokens for it and the region URLs only).
    pub fn engine_settings(&self, public_url: &str) -> anyhow::Result<EngineSettings> {
        Ok(EngineSettings {
            data_dir: self.data_dir.clone(),
            tenancy: TenancySettings {
                cache_ttl: self.auth.credential_cache_ttl,
                last_used_resolution: self.auth.last_used_resolution,
            },
            ingest: self.ingest_config(),
            materialized_properties: self.ingest.materialized_properties.clone(),
            compaction: self.compaction_config(),
            compaction_interval: self.ingest.compaction_interval,
            query: self.query_settings(),
            endpoints: self.endpoint_settings(),
            results: self.result_storage()?,
            oauth: OAuthSettings {
                clients: self.oauth_client_settings()?,
                lifetimes: self.oauth_lifetimes(),
                resources: std::iter::once(public_url.to_string())
                    .chain(self.oauth.region_urls.iter().cloned())
                    .collect(),
            },
            flags: FlagsSettings {
                stored_read_deadline: self.flags.stored_read_deadline,
            },
            geoip: self.geoip.database_path.clone(),
        })
    }

    /// Where first-run credentials are written.
    pub fn credentials_path(&self) -> PathBuf {
        self.data_dir.join("credentials.json")
    }
}

/// Deep-merges `over` into `base`: tables merge key by key, everything else is replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_defaults_parse_and_match_the_documented_values() {
        let c = Config::defaults();
        assert_eq!(c.data_dir, PathBuf::from("./data"));
        assert_eq!(c.server.bind, "127.0.0.1:8000".parse().expect("addr"));
        assert_eq!(c.limits.max_body_bytes, 20 * 1024 * 1024);
        assert_eq!(c.log.format, LogFormat::Human);
        assert_eq!(c.public_url_for(c.server.bind), "http://127.0.0.1:8000");
    }

    #[test]
    fn every_example_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        for entry in std::fs::read_dir(dir).expect("config dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                Config::load(Some(&path), Overrides::default())
                    .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
            }
        }
    }

    #[test]
    fn file_layer_overrides_and_unknown_keys_are_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[limits]\nmax_body_bytes = 1024\n").expect("write");
        let c = Config::load(Some(&path), Overrides::default()).expect("loads");
        assert_eq!(c.limits.max_body_bytes, 1024);
        assert_eq!(c.server.bind.port(), 8000, "untouched keys keep defaults");

        std::fs::write(&path, "[limits]\nmax_body_byte = 1024\n").expect("write");
        let err = Config::load(Some(&path), Overrides::default()).expect_err("typo");
        assert!(err.to_string().contains("max_body_byte"), "{err}");
    }

    #[test]
    fn overrides_win_over_files() {
        let c = Config::load(
            None,
            Overrides {
                bind: Some("0.0.0.0:9000".parse().expect("addr")),
                data_dir: Some("/tmp/x".into()),
                public_url: Some("https://a.example".into()),
                log_format: Some(LogFormat::Json),
            },
        )
        .expect("loads");
        assert_eq!(c.server.bind.port(), 9000);
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.public_url_for(c.server.bind), "https://a.example");
        assert_eq!(c.log.format, LogFormat::Json);
    }
}
