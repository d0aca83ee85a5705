//! The configuration's sections, one struct per TOML table, with their documented defaults in `config/default.toml`.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use corvid_events::Durability;

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
    /// Peers (addresses or CIDR ranges) whose `X-Forwarded-For` / `Forwarded` headers are
    /// believed; any other peer is taken at its own address.
    pub trusted_proxies: Vec<ipnetwork::IpNetwork>,
    /// Whether the HTTP workers and the background writers run under Linux's `SCHED_BATCH`
    /// (`corvid_kernel::sched`), so that waking one does not take the core from the WAL
    /// writer or an ingest shard.
    pub batch_scheduling: bool,
    /// What a connection keeps of its response buffer between responses, in bytes (actix's
    /// `h1_write_buffer_size`; past 128 KiB it is also the retention limit). A buffer grown
    /// past it is dropped after its response and grown again by the next.
    pub write_buffer_bytes: NonZeroUsize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_body_bytes: usize,
    /// Payloads decoded off the event loop at once on this node (each may reach its route's
    /// decoded limit); past it, 503 with `Retry-After`.
    pub max_concurrent_decodes: NonZeroUsize,
}

/// `[memory]`: what the server keeps in memory beside what requests bring.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Bytes of persons kept in memory for `/flags` and ingest (compactly: about 115 bytes
    /// per person with a handful of properties, index included). Persons past it are read
    /// from disk when asked for.
    pub persons_bytes: usize,
    /// Bytes of the embedded store's page cache (sled).
    pub storage_cache_bytes: u64,
    /// Bytes of the block cache of the embedded person keyspaces (`<data dir>/persons/`):
    /// persons past `persons_bytes` are read through it.
    pub person_cache_bytes: u64,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// When true, `/metrics` needs `Authorization: Bearer <personal API key>` of an instance
    /// administrator.
    pub require_key: bool,
}

/// `[rate_limits]`: requests per minute (each with a burst of the same size) on the routes
/// that do expensive work for whoever asks. Past a limit: 429 with `Retry-After`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitsConfig {
    pub login_per_ip: NonZeroU32,
    pub login_per_account: NonZeroU32,
    pub authorize_per_ip: NonZeroU32,
    pub token_per_ip: NonZeroU32,
    pub query_per_key: NonZeroU32,
    pub key_minting_per_key: NonZeroU32,
    /// Addresses or keys each limiter remembers; the least recently seen are forgotten first.
    pub tracked: NonZeroUsize,
}

/// `[activity]`: how long the activity log keeps its entries.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivityConfig {
    /// Entries older than this are deleted.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How often expired entries are deleted.
    #[serde(with = "humantime_serde")]
    pub expiry_interval: Duration,
}

/// `[webhooks]`: how change notifications are sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// How often new activity entries become deliveries and due deliveries are sent.
    #[serde(with = "humantime_serde")]
    pub dispatch_interval: Duration,
    /// Deadline of one delivery attempt.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The wait before each retry of a failed delivery; after the last the delivery has
    /// failed and its webhook is turned off.
    pub retry_schedule: Vec<HumanDuration>,
    /// Failed attempts in a row that turn a webhook off.
    pub max_consecutive_failures: u32,
    /// DEVELOPMENT ONLY: deliver to loopback addresses (private ones stay refused).
    pub dev_allow_loopback: bool,
    /// Finished deliveries and their attempts are kept this long.
    #[serde(with = "humantime_serde")]
    pub keep_deliveries: Duration,
    /// Webhooks one project may have.
    pub max_per_project: usize,
}

/// A duration written as text (`"10s"`, `"2h"`), inside a list.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(transparent)]
pub struct HumanDuration(#[serde(with = "humantime_serde")] pub Duration);

/// `[lifecycle]`: how erasure requests are carried out and how long their records stay.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleConfig {
    /// How often the compactor works on pending person erasures.
    #[serde(with = "humantime_serde")]
    pub erasure_interval: Duration,
    /// A request waits this long before segments are rewritten (flushes under way commit).
    #[serde(with = "humantime_serde")]
    pub erasure_settle: Duration,
    /// A version superseded by an erasure's rewrite is deleted once the new one is this old.
    #[serde(with = "humantime_serde")]
    pub erasure_grace: Duration,
    /// Finished erasure records (`deletion_status`, the deletions' activity) are kept this
    /// long after their request.
    #[serde(with = "humantime_serde")]
    pub deletion_record_ttl: Duration,
    /// Days of events a project keeps when it sets no `event_retention_days` of its own;
    /// absent: every event is kept.
    #[serde(default)]
    pub event_retention_days: Option<std::num::NonZeroU32>,
    /// How often days past a project's retention are dropped.
    #[serde(with = "humantime_serde")]
    pub retention_interval: Duration,
    /// How long one file export may run before it fails.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
    /// Finished file exports (their runs and files) are deleted this long after they ended.
    #[serde(with = "humantime_serde")]
    pub export_run_ttl: Duration,
    /// How often scheduled exports make and start their runs.
    #[serde(with = "humantime_serde")]
    pub batch_export_tick: Duration,
    /// A scheduled run starts this long after its interval ended.
    #[serde(with = "humantime_serde")]
    pub batch_export_settle: Duration,
    /// Wait before a failed run's first retry (doubling for each further one).
    #[serde(with = "humantime_serde")]
    pub batch_export_retry: Duration,
    /// Attempts a scheduled run makes before it fails for good.
    pub batch_export_attempts: std::num::NonZeroU32,
    /// Finished scheduled runs and backfills are deleted this long after they ended.
    #[serde(with = "humantime_serde")]
    pub batch_export_run_ttl: Duration,
    /// DEVELOPMENT ONLY: scheduled exports may write to loopback and private endpoints.
    #[serde(default)]
    pub dev_allow_private_export_endpoints: bool,
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
    /// Ingest shard threads; `None`: [`default_shards`](super::default_shards).
    pub shards: Option<NonZeroUsize>,
    pub flush_max_rows: NonZeroUsize,
    pub flush_max_bytes: NonZeroUsize,
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    pub max_buffered_events: NonZeroUsize,
    #[serde(with = "humantime_serde")]
    pub admission_wait: Duration,
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
    /// Largest `/flags` or `/decide` payload after decoding; larger gets 413.
    pub max_decoded_bytes: usize,
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
    /// Memory all queries running on this node may use together.
    pub node_memory_bytes: NonZeroUsize,
    /// Queries running at once on this node; past it, 503 with `Retry-After`.
    pub max_concurrent: NonZeroUsize,
    /// Queries one credential may run at once; past it, 429 with `Retry-After`.
    pub max_concurrent_per_credential: NonZeroUsize,
    pub default_rows: NonZeroUsize,
    pub max_rows: NonZeroUsize,
    /// Query runtime threads; 0 means one per core.
    pub threads: usize,
    /// Segment-file metadata (footers, page indexes) kept in memory between queries.
    pub metadata_cache_bytes: usize,
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
    /// Threads that verify passwords (argon2id, 19 MiB each), apart from every other work.
    pub password_threads: NonZeroUsize,
    /// Sign-ins waiting for a password thread; past it, 503 with `Retry-After`.
    pub password_queue: usize,
    /// How long an invitation's link can be used.
    #[serde(with = "humantime_serde")]
    pub invite_ttl: Duration,
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
    /// Bytes of resolved clients (documents and logos) kept; the least used are evicted.
    pub cimd_cache_bytes: usize,
    /// How long a failed resolution is remembered (and answered from memory).
    #[serde(with = "humantime_serde")]
    pub cimd_failure_ttl: Duration,
    /// Client metadata and logo fetches in flight at once; past it, the authorization page
    /// says to retry.
    pub cimd_max_concurrent_fetches: NonZeroUsize,
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

/// `[cluster]`: one embedded node, or many sharing PostgreSQL and a bucket.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub mode: ClusterMode,
    #[serde(default)]
    pub node_id: Option<String>,
    /// Replaces `ingest.flush_interval` when distributed: the bound on how long an event
    /// acknowledged on one node takes to be queryable on the others.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Bytes of segment files read from the bucket kept in memory (distributed mode).
    pub segment_cache_bytes: usize,
    /// How long a distributed node waits at start for its metastore (answering `/_readiness`
    /// with 503 meanwhile) before it gives up.
    #[serde(with = "humantime_serde")]
    pub start_timeout: Duration,
    pub postgres: PostgresConfig,
    #[serde(default)]
    pub object_store: Option<ClusterObjectStore>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMode {
    Embedded,
    Distributed,
}

/// `[cluster.postgres]`: the metastore.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    #[serde(default)]
    pub url: Option<String>,
    pub pool_size: NonZeroUsize,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Certificates (PEM) trusted besides Mozilla's roots with `sslmode=require`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// `[cluster.object_store]`: the bucket of distributed mode.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterObjectStore {
    pub bucket: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key: Option<String>,
    #[serde(default)]
    pub allow_http: bool,
    #[serde(default)]
    pub prefix: String,
}

/// Values from the environment and the command line, applied over the files.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub bind: Option<SocketAddr>,
    pub public_url: Option<String>,
    pub log_format: Option<LogFormat>,
    /// `cluster.postgres.url`.
    pub postgres_url: Option<String>,
}
