//! The one shared application state handed to every handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use corvid_engine::Engine;
use corvid_oauth::VerifyingKey;
use tokio::sync::Notify;

use crate::config::Config;
use crate::http::decoding::DecodePermits;
use crate::metrics::Metrics;
use crate::rate_limits::RateLimits;

pub struct AppState {
    pub config: Arc<Config>,
    /// Base URL clients reach us on, without a trailing slash.
    pub public_url: Arc<str>,
    /// `<public_url>/.well-known/oauth-protected-resource`, for 401 answers.
    pub resource_metadata_url: Arc<str>,
    /// The engine's facades, one per domain.
    pub engine: Engine,
    /// Keys that sign secret-scanning reports.
    pub secret_scanning_keys: Arc<[VerifyingKey]>,
    pub lifecycle: Arc<Lifecycle>,
    pub metrics: Arc<Metrics>,
    /// The bound on payloads decoded off the event loop at once.
    pub decodes: DecodePermits,
    /// Per-address and per-credential rate limits.
    pub rate_limits: Arc<RateLimits>,
}

impl AppState {
    /// The pieces of state built from the config alone.
    pub fn limits(config: &Config) -> (DecodePermits, Arc<RateLimits>) {
        (
            DecodePermits::new(config.limits.max_concurrent_decodes.get()),
            Arc::new(RateLimits::new(&config.rate_limits)),
        )
    }
}

/// The keys that sign secret-scanning reports, from the config.
pub fn secret_scanning_keys(config: &Config) -> anyhow::Result<Arc<[VerifyingKey]>> {
    let keys = config
        .oauth
        .secret_scanning_keys
        .iter()
        .map(|k| VerifyingKey::from_pem(&k.id, &k.pem))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok(keys.into())
}

/// Process lifecycle shared by the server, the actors and the health routes.
#[derive(Default)]
pub struct Lifecycle {
    shutting_down: AtomicBool,
    requested: Notify,
}

impl Lifecycle {
    /// Readiness: false from the moment shutdown begins.
    pub fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::SeqCst)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Asks the process to shut down cleanly (e.g. a critical actor died).
    pub fn request_shutdown(&self, reason: &str) {
        tracing::warn!(reason, "shutdown requested");
        self.requested.notify_one();
    }

    /// Completes when someone called [`Lifecycle::request_shutdown`].
    pub async fn shutdown_requested(&self) {
        self.requested.notified().await;
    }
}

#[cfg(test)]
impl AppState {
    /// A real state over a real store in `dir`, for in-crate handler tests.
    /// Must run inside an actix system (it starts the engine's actors).
    pub async fn for_test(dir: &std::path::Path) -> AppState {
        let config = Config::for_test(dir);
        let engine = Engine::start_embedded(
            config
                .engine_settings("http://127.0.0.1:0")
                .expect("settings"),
        )
        .await
        .expect("engine starts");
        let (decodes, rate_limits) = AppState::limits(&config);
        AppState {
            engine,
            decodes,
            rate_limits,
            secret_scanning_keys: secret_scanning_keys(&config).expect("keys"),
            public_url: "http://127.0.0.1:0".into(),
            resource_metadata_url: "http://127.0.0.1:0/.well-known/oauth-protected-resource".into(),
            config: Arc::new(config),
            lifecycle: Arc::new(Lifecycle::default()),
            metrics: Arc::new(Metrics::new()),
        }
    }
}
