//! Loading (embedded defaults, then a file, then the environment and flags) and turning the configuration into the engine's settings.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{default_shards, ClusterMode, Config, ConfigError, Overrides, DEFAULT_TOML};
use corvid_endpoints::{EndpointSettings, Rates, ResultStorage, S3Settings};
use corvid_engine::{
    ClusterSettings, EngineSettings, JobSettings, MemorySettings, PgSettings, Storage,
    RESULTS_PREFIX,
};
use corvid_events::{CompactionConfig, ErasureConfig, IngestConfig, Limits};
use corvid_flags::FlagsSettings;
use corvid_oauth::{ClientSettings, FetchSettings, Lifetimes, OAuthSettings};
use corvid_query::QuerySettings;
use corvid_tenancy::TenancySettings;
use corvid_webhooks::WebhookSettings;

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
        // Two shards, whatever the machine, so tests cross shards.
        config.ingest.shards = NonZeroUsize::new(2);
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
        if let Some(url) = o.postgres_url {
            self.cluster.postgres.url = Some(url);
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_cluster()?;
        if self.limits.max_body_bytes == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_body_bytes must be > 0".into(),
            ));
        }
        if self.flags.max_decoded_bytes == 0 || self.capture.max_decompressed_bytes == 0 {
            return Err(ConfigError::Invalid(
                "flags.max_decoded_bytes and capture.max_decompressed_bytes must be > 0".into(),
            ));
        }
        if self.query.node_memory_bytes < self.query.memory_limit_bytes {
            return Err(ConfigError::Invalid(
                "query.node_memory_bytes must be at least query.memory_limit_bytes".into(),
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
        if self.webhooks.dispatch_interval.is_zero() || self.webhooks.timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "webhooks.dispatch_interval and webhooks.timeout must be > 0".into(),
            ));
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
            cache_bytes: o.cimd_cache_bytes,
            failure_ttl: o.cimd_failure_ttl,
            max_concurrent_fetches: o.cimd_max_concurrent_fetches.get(),
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

    /// The wire limit of a `/flags` or `/decide` body: room for its decoded limit in base64
    /// (four bytes per three), within `limits.max_body_bytes`.
    pub fn flags_body_limit(&self) -> usize {
        (self.flags.max_decoded_bytes / 3 * 4 + 4096).min(self.limits.max_body_bytes)
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
            shards: i.shards.map_or_else(default_shards, NonZeroUsize::get),
            flush_max_rows: i.flush_max_rows.get(),
            flush_max_bytes: i.flush_max_bytes.get(),
            flush_interval: i.flush_interval,
            max_buffered_events: i.max_buffered_events.get(),
            admission_wait: i.admission_wait,
            max_queued_requests: i.max_queued_requests.get(),
            wal_segment_bytes: i.wal_segment_bytes.max(1024),
            dedup_window: i.dedup_window,
            disk: self.disk(),
        }
    }

    /// What durable event files are written through: the real disk, unless a test put its
    /// model of a power cut in `disk_override`.
    fn disk(&self) -> std::sync::Arc<dyn corvid_kernel::Disk> {
        #[cfg(any(test, feature = "test-support"))]
        if let Some(disk) = &self.disk_override {
            return std::sync::Arc::clone(disk);
        }
        corvid_kernel::real_disk()
    }

    /// The property-column compactor's settings.
    pub fn compaction_config(&self) -> CompactionConfig {
        CompactionConfig {
            auto_keys: self.ingest.auto_materialized_keys,
            min_share: 0.2,
            sample_rows: 100_000,
            grace: self.ingest.compaction_grace,
            erasure: ErasureConfig {
                interval: self.lifecycle.erasure_interval,
                settle: self.lifecycle.erasure_settle,
                grace: self.lifecycle.erasure_grace,
                record_ttl: self.lifecycle.deletion_record_ttl,
            },
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
            node_memory_bytes: q.node_memory_bytes.get(),
            max_concurrent: q.max_concurrent.get(),
            max_concurrent_per_credential: q.max_concurrent_per_credential.get(),
            default_rows: q.default_rows.get().min(q.max_rows.get()),
            max_rows: q.max_rows.get(),
            threads,
            metadata_cache_bytes: q.metadata_cache_bytes,
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

    /// The object store for materialized results: the cluster's bucket when distributed, the
    /// `[endpoints.s3]` bucket when set, else the local directory.
    pub fn result_storage(&self) -> anyhow::Result<ResultStorage> {
        if let (ClusterMode::Distributed, Some(bucket)) = (self.cluster.mode, self.cluster_bucket())
        {
            return ResultStorage::s3_under(&bucket, RESULTS_PREFIX)
                .map_err(|e| anyhow::anyhow!(e));
        }
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
    /// `[cluster]` names what distributed mode needs whenever it is chosen.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if c.mode == ClusterMode::Embedded {
            return Ok(());
        }
        if c.node_id.as_deref().is_none_or(str::is_empty) {
            return Err(ConfigError::Invalid(
                "cluster.node_id is required when cluster.mode = \"distributed\"".into(),
            ));
        }
        if c.postgres.url.is_none() {
            return Err(ConfigError::Invalid(
                "cluster.postgres.url (or CORVID_POSTGRES_URL) is required when cluster.mode = \"distributed\""
                    .into(),
            ));
        }
        if c.object_store.is_none() {
            return Err(ConfigError::Invalid(
                "[cluster.object_store] is required when cluster.mode = \"distributed\"".into(),
            ));
        }
        Ok(())
    }

    /// How to reach the metastore, when `cluster.postgres.url` is set.
    pub fn postgres_settings(&self) -> Option<PgSettings> {
        let p = &self.cluster.postgres;
        Some(PgSettings {
            ca_file: p.ca_file.clone(),
            url: p.url.clone()?,
            pool_size: p.pool_size.get(),
            connect_timeout: p.connect_timeout,
        })
    }

    /// The bucket of distributed mode, when configured.
    fn cluster_bucket(&self) -> Option<S3Settings> {
        let o = self.cluster.object_store.as_ref()?;
        Some(S3Settings {
            bucket: o.bucket.clone(),
            region: o.region.clone(),
            endpoint: o.endpoint.clone(),
            access_key_id: o.access_key_id.clone(),
            secret_access_key: o.secret_access_key.clone(),
            prefix: Some(o.prefix.clone()).filter(|p| !p.is_empty()),
            allow_http: o.allow_http,
        })
    }

    /// Where the engine keeps its state (validated: distributed mode has every key it needs).
    fn storage(&self) -> anyhow::Result<Storage> {
        if self.cluster.mode == ClusterMode::Embedded {
            return Ok(Storage::Embedded);
        }
        let missing = |key: &str| anyhow::anyhow!("{key} is required when distributed");
        Ok(Storage::Cluster(Box::new(ClusterSettings {
            node_id: self
                .cluster
                .node_id
                .clone()
                .ok_or_else(|| missing("cluster.node_id"))?,
            postgres: self
                .postgres_settings()
                .ok_or_else(|| missing("cluster.postgres.url"))?,
            bucket: self
                .cluster_bucket()
                .ok_or_else(|| missing("[cluster.object_store]"))?,
            segment_cache_bytes: self.cluster.segment_cache_bytes,
        })))
    }

    pub fn engine_settings(&self, public_url: &str) -> anyhow::Result<EngineSettings> {
        let storage = self.storage()?;
        let mut ingest = self.ingest_config();
        if let Storage::Cluster(_) = storage {
            ingest.flush_interval = self.cluster.flush_interval;
        }
        Ok(EngineSettings {
            storage,
            data_dir: self.data_dir.clone(),
            tenancy: TenancySettings {
                cache_ttl: self.auth.credential_cache_ttl,
                last_used_resolution: self.auth.last_used_resolution,
                password_threads: self.auth.password_threads.get(),
                password_queue: self.auth.password_queue,
                invite_ttl: self.auth.invite_ttl,
            },
            ingest,
            materialized_properties: self.ingest.materialized_properties.clone(),
            compaction: self.compaction_config(),
            compaction_interval: self.ingest.compaction_interval,
            default_event_retention_days: self.lifecycle.event_retention_days.map(|d| d.get()),
            retention_interval: self.lifecycle.retention_interval,
            export_timeout: self.lifecycle.export_timeout,
            batch_exports: corvid_lifecycle::BatchSettings {
                settle: self.lifecycle.batch_export_settle,
                retry_after: self.lifecycle.batch_export_retry,
                max_attempts: self.lifecycle.batch_export_attempts.get(),
                deadline: self.lifecycle.export_timeout,
                run_ttl: self.lifecycle.batch_export_run_ttl,
                allow_private_endpoints: self.lifecycle.dev_allow_private_export_endpoints,
            },
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
            memory: MemorySettings {
                persons_bytes: self.memory.persons_bytes,
                storage_cache_bytes: self.memory.storage_cache_bytes,
                person_cache_bytes: self.memory.person_cache_bytes,
            },
            geoip: self.geoip.database_path.clone(),
            webhooks: WebhookSettings {
                timeout: self.webhooks.timeout,
                retry_schedule: self.webhooks.retry_schedule.iter().map(|d| d.0).collect(),
                max_consecutive_failures: self.webhooks.max_consecutive_failures,
                allow_loopback: self.webhooks.dev_allow_loopback,
                keep_deliveries: self.webhooks.keep_deliveries,
                max_per_project: self.webhooks.max_per_project,
            },
            jobs: JobSettings {
                usage_flush: Duration::from_secs(1),
                oauth_prune: Duration::from_secs(3600),
                survey_upkeep: self.surveys.maintenance_interval,
                export_expiry: self.lifecycle.retention_interval,
                export_run_ttl: self.lifecycle.export_run_ttl,
                batch_export_tick: self.lifecycle.batch_export_tick,
                activity_expiry: self.activity.expiry_interval,
                activity_ttl: self.activity.ttl,
                webhook_dispatch: self.webhooks.dispatch_interval,
            },
        })
    }

    /// Where first-run credentials are written.
    pub fn credentials_path(&self) -> PathBuf {
        self.data_dir.join("credentials.json")
    }
}

/// Deep-merges `over` into `base`: tables merge key by key, everything else is replaced.
pub(super) fn merge(base: &mut toml::Table, over: toml::Table) {
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
    use crate::config::LogFormat;

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
    fn ingest_shards_follow_the_cores_unless_set() {
        let unset = Config::defaults();
        assert_eq!(unset.ingest.shards, None);
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert_eq!(unset.ingest_config().shards, (cores / 2).max(1));

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[ingest]\nshards = 3\n").expect("write");
        let set = Config::load(Some(&path), Overrides::default()).expect("loads");
        assert_eq!(set.ingest_config().shards, 3);
    }

    #[test]
    fn a_zero_write_buffer_is_refused_at_load() {
        let unset = Config::defaults();
        assert_eq!(unset.server.write_buffer_bytes.get(), 256 * 1024);
        // actix-web panics on a zero buffer when the server starts: refused with the
        // configuration's other errors instead.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[server]\nwrite_buffer_bytes = 0\n").expect("write");
        let err = Config::load(Some(&path), Overrides::default()).expect_err("zero");
        assert!(err.to_string().contains("write_buffer_bytes"), "{err}");
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
                postgres_url: Some("postgres://corvid@db.internal/corvid".into()),
            },
        )
        .expect("loads");
        assert_eq!(c.server.bind.port(), 9000);
        assert_eq!(
            c.postgres_settings().map(|p| p.url),
            Some("postgres://corvid@db.internal/corvid".into())
        );
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.public_url_for(c.server.bind), "https://a.example");
        assert_eq!(c.log.format, LogFormat::Json);
    }
}
