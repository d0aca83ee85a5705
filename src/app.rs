//! Wiring: open the stores, start the actors, build [`AppState`], run the HTTP server, and shut
//! everything down in order.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::middleware::{from_fn, NormalizePath, TrailingSlash};
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use corvid_engine::Engine;
use corvid_tenancy::MintKey;

use crate::bootstrap::{self, Credentials};
use crate::config::{ClusterMode, Config};
use crate::http;
use crate::http::starting;
use crate::metrics::Metrics;
use crate::state::{self, AppState, Lifecycle};
use crate::telemetry;

/// A started server.
pub struct Running {
    addr: SocketAddr,
    state: web::Data<AppState>,
    handle: ServerHandle,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Set when this start created the data directory's default tenancy.
    pub first_run: Option<Credentials>,
}

/// Opens state under `config.data_dir`, bootstraps it if new, and starts serving.
/// Must be called inside an actix system (e.g. `actix_web::rt::System`).
pub async fn start(config: Config) -> anyhow::Result<Running> {
    // Bind first so the public URL can name the real port when port 0 was asked for (OAuth
    // issues tokens for that URL).
    let listener = std::net::TcpListener::bind(config.server.bind)
        .with_context(|| format!("cannot bind {}", config.server.bind))?;
    let addr = listener.local_addr()?;
    let public_url: Arc<str> = config.public_url_for(addr).into();
    let settings = config.engine_settings(&public_url)?;
    // Before the engine starts the threads that read it.
    corvid_kernel::sched::set_enabled(config.server.batch_scheduling);
    let engine = if config.cluster.mode == ClusterMode::Distributed {
        // A cluster node may start before its metastore: until the engine is up, the port
        // answers `/_readiness` with 503 (and `/_health` with 200), so orchestrators wait.
        let starting = starting::serve(&listener)?;
        let engine = start_when_reachable(settings, config.cluster.start_timeout).await;
        starting.stop(true).await;
        engine?
    } else {
        Engine::start(settings).await?
    };
    let outcome = engine.tenancy.bootstrap(MintKey::OnFirstRun).await?;
    let first_run = bootstrap::credentials(outcome);
    if let Some(credentials) = &first_run {
        let path = config.credentials_path();
        bootstrap::write_credentials(&path, credentials)
            .with_context(|| format!("cannot write {}", path.display()))?;
        // Never fatal: a closed stdout must not take the server down. The file has them too.
        let mut out = std::io::stdout().lock();
        if let Err(err) =
            writeln!(out, "{}", bootstrap::banner(credentials, &path)).and_then(|_| out.flush())
        {
            tracing::warn!(error = %err, "could not print first-run credentials to stdout");
        }
    }
    let secret_scanning_keys = state::secret_scanning_keys(&config)?;
    let lifecycle = Arc::new(Lifecycle::default());
    let metrics = Arc::new(Metrics::new());
    let config = Arc::new(config);

    let (decodes, rate_limits) = AppState::limits(&config);
    let state = web::Data::new(AppState {
        decodes,
        rate_limits,
        resource_metadata_url: format!("{public_url}/.well-known/oauth-protected-resource").into(),
        public_url,
        config: Arc::clone(&config),
        engine,
        secret_scanning_keys,
        lifecycle,
        metrics,
    });
    watch_critical_components(&state);
    if config.cluster.mode != ClusterMode::Distributed {
        crate::control::spawn(state.clone(), &config.data_dir);
    }

    let app_state = state.clone();
    let mut server = HttpServer::new(move || {
        // Called on each worker thread as it starts.
        corvid_kernel::sched::join_batch();
        // Outermost last: the request log sees every answer, including the JSON 500 of a
        // panicking handler and the re-shaped framework errors.
        App::new()
            .app_data(app_state.clone())
            .wrap(NormalizePath::new(TrailingSlash::Trim))
            .wrap(from_fn(http::recover::catch_panics))
            .wrap(from_fn(http::recover::json_errors))
            .wrap(from_fn(telemetry::observe))
            .configure(http::recover::extractor_errors)
            .configure(http::configure)
            .configure(crate::console::configure)
            .default_service(web::to(http::not_found))
    })
    .disable_signals()
    .h1_write_buffer_size(config.server.write_buffer_bytes.get())
    .shutdown_timeout(config.server.shutdown_timeout.as_secs())
    .listen(listener)?;
    if let Some(workers) = config.server.workers {
        server = server.workers(workers.get());
    }
    let server = server.run();
    let handle = server.handle();
    let server = actix_web::rt::spawn(server);
    tracing::info!(%addr, public_url = %state.public_url, data_dir = %config.data_dir.display(), "corvid listening");
    Ok(Running {
        addr,
        state,
        handle,
        server,
        first_run,
    })
}

/// Starts the engine, retrying while the cluster's metastore cannot be reached, for at most
/// `timeout`; the last failure is returned when it runs out.
async fn start_when_reachable(
    settings: corvid_engine::EngineSettings,
    timeout: Duration,
) -> anyhow::Result<Engine> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match Engine::start(settings.clone()).await {
            Ok(engine) => return Ok(engine),
            Err(err)
                if err.is_unreachable_metastore() && tokio::time::Instant::now() < deadline =>
            {
                tracing::warn!(error = %anyhow::Error::from(err), "metastore not reachable yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Runs `tick` once a second until shutdown begins or `tick` answers `false`.
fn every_second<F, Fut>(state: &web::Data<AppState>, tick: F)
where
    F: Fn(web::Data<AppState>) -> Fut + 'static,
    Fut: Future<Output = bool>,
{
    let state = state.clone();
    actix_web::rt::spawn(async move {
        let mut interval = actix_web::rt::time::interval(std::time::Duration::from_secs(1));
        loop {
            interval.tick().await;
            if !state.lifecycle.is_ready() || !tick(state.clone()).await {
                return;
            }
        }
    });
}

/// Asks for a clean shutdown when a critical component fails (the WAL cannot be written, the
/// materializer or the execution-log writer stopped).
fn watch_critical_components(state: &web::Data<AppState>) {
    every_second(state, |state| async move {
        if let Some(reason) = state.engine.failed_component() {
            state.lifecycle.request_shutdown(reason);
            return false;
        }
        true
    });
}

impl Running {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn lifecycle(&self) -> Arc<Lifecycle> {
        Arc::clone(&self.state.lifecycle)
    }

    /// Serves until `signal` completes or a component requests shutdown, then shuts down.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> anyhow::Result<()> {
        let lifecycle = self.lifecycle();
        tokio::select! {
            _ = signal => tracing::info!("shutdown signal received"),
            _ = lifecycle.shutdown_requested() => {},
        }
        self.shutdown().await
    }

    /// Clean stop: readiness turns 503, a grace period lets load balancers notice, HTTP stops
    /// accepting and drains in-flight requests, then every store is flushed.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.state.lifecycle.begin_shutdown();
        let grace = self.state.config.server.shutdown_grace;
        if !grace.is_zero() {
            tracing::info!(?grace, "readiness is 503; waiting before closing listeners");
            tokio::time::sleep(grace).await;
        }
        self.handle.stop(true).await;
        let served = self.server.await;
        self.state.engine.shutdown().await?;
        tracing::info!("corvid stopped cleanly");
        served?.context("HTTP server failed")
    }
}
