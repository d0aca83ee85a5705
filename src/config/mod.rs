//! Corvid's one typed configuration.
//!
//! Layers, later wins: the embedded `config/default.toml` → an optional file → `CORVID_*`
//! environment variables → command-line flags (the last two applied by the CLI through
//! [`Overrides`]). Unknown keys are rejected so a typo never silently falls back to a default.

use std::path::PathBuf;

use serde::Deserialize;

/// The embedded defaults; also the documentation of every key.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

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
    pub lifecycle: LifecycleConfig,
    pub activity: ActivityConfig,
    pub webhooks: WebhooksConfig,
    pub flags: FlagsConfig,
    pub memory: MemoryConfig,
    pub browser: BrowserConfig,
    pub surveys: SurveysConfig,
    pub query: QueryConfig,
    pub endpoints: EndpointsConfig,
    #[serde(default)]
    pub geoip: GeoIpConfig,
    pub auth: AuthConfig,
    pub oauth: OAuthConfig,
    pub metrics: MetricsConfig,
    pub rate_limits: RateLimitsConfig,
    /// Tests only: the disk the WAL and segment files are written through.
    #[cfg(any(test, feature = "test-support"))]
    #[serde(skip)]
    pub disk_override: Option<std::sync::Arc<dyn corvid_kernel::Disk>>,
    pub log: LogConfig,
    pub cluster: ClusterConfig,
}

mod load;
mod sections;

pub use sections::*;

/// Ingest shards when `ingest.shards` is unset: one per two CPU cores, at least one. Each shard
/// is a thread every capture request hands off to (beside the HTTP workers, the WAL writer and
/// the shard's flusher), so on two cores one shard is faster than two.
pub fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}
