//! The command line: `corvid serve`, `bootstrap`, `migrate`, `snapshot` and `restore`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use corvid_engine::{migrate_metastore, Engine};
use corvid_tenancy::MintKey;

use crate::bootstrap;
use crate::config::{Config, LogFormat, Overrides};
use crate::{app, telemetry};

#[derive(Debug, Parser)]
#[command(
    name = "corvid",
    version,
    about = "Corvid: a self-hostable, PostHog-compatible product-analytics backend",
    long_about = "Corvid: a self-hostable, PostHog-compatible product-analytics backend.\n\n\
        Configuration layers, later wins: embedded defaults (config/default.toml) -> --config FILE \
        -> CORVID_* environment variables -> command-line flags."
)]
pub struct Cli {
    /// Log output format.
    #[arg(long, global = true, value_enum, env = "CORVID_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP server. On an empty data dir, first creates the default organization,
    /// project, admin user and a personal API key, prints them once and saves them to
    /// <data-dir>/credentials.json (mode 0600).
    Serve(ServeArgs),
    /// Create the default organization, project and admin user if missing, and mint a fresh
    /// personal API key (all scopes), without serving. Idempotent; safe to run repeatedly.
    Bootstrap(BootstrapArgs),
    /// Apply the cluster metastore's schema (PostgreSQL, `cluster.postgres.url`). Idempotent
    /// and safe to run from several nodes at once; refuses a schema newer than this build.
    Migrate(MigrateArgs),
    /// Copy an embedded node's whole state (metadata, persons, flags, endpoints, OAuth,
    /// segments, the WAL) to a directory or an s3://bucket/prefix URL, consistently, while it
    /// serves (through the node's control socket) or while it is stopped. S3 credentials,
    /// region and endpoint come from this command's AWS_* environment variables
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP).
    Snapshot(SnapshotArgs),
    /// Bring a new, empty data dir to the state of a snapshot; then `corvid serve` it.
    Restore(RestoreArgs),
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The data dir of the node to snapshot.
    #[arg(long, env = "CORVID_DATA_DIR", value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Where the snapshot goes: a directory, or s3://bucket/prefix.
    #[arg(long, value_name = "DIR|URL")]
    pub to: String,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The snapshot: a directory, or s3://bucket/prefix.
    #[arg(long, value_name = "DIR|URL")]
    pub from: String,
    /// The new data dir (must not exist, or be empty).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// TOML file layered over the embedded defaults.
    #[arg(long, env = "CORVID_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory for all state [default: ./data].
    #[arg(long, env = "CORVID_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The cluster metastore (cluster.postgres.url), e.g. postgres://user:pass@host:5432/corvid.
    #[arg(long, env = "CORVID_POSTGRES_URL", value_name = "URL")]
    pub postgres_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Address to listen on [default: 127.0.0.1:8000].
    #[arg(long, env = "CORVID_BIND", value_name = "ADDR")]
    pub bind: Option<SocketAddr>,
    /// Base URL clients reach this server on [default: http://<bind>].
    #[arg(long, env = "CORVID_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct BootstrapArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print {"project_id", "project_token", "personal_api_key", "email", "password"?} as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Entry point used by `main`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args, cli.log_format),
        Command::Bootstrap(args) => run_bootstrap(args, cli.log_format),
        Command::Migrate(args) => run_migrate(args, cli.log_format),
        Command::Snapshot(args) => run_snapshot(args),
        Command::Restore(args) => run_restore(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("corvid: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn load(common: &CommonArgs, overrides: Overrides) -> anyhow::Result<Config> {
    let overrides = Overrides {
        data_dir: common.data_dir.clone(),
        postgres_url: common.postgres_url.clone(),
        ..overrides
    };
    Ok(Config::load(common.config.as_deref(), overrides)?)
}

fn serve(args: ServeArgs, log_format: Option<LogFormat>) -> anyhow::Result<()> {
    let config = load(
        &args.common,
        Overrides {
            bind: args.bind,
            public_url: args.public_url,
            log_format,
            ..Overrides::default()
        },
    )?;
    telemetry::init_tracing(&config.log);
    actix_web::rt::System::new().block_on(async move {
        // Handlers go in before anything is printed or bound, so an early SIGTERM is a clean
        // stop rather than the default abrupt exit.
        let signal = shutdown_signal()?;
        let running = app::start(config).await?;
        if running.first_run.is_none() {
            tracing::info!("existing data dir; first-run credentials are in credentials.json");
        }
        running.run_until(signal).await
    })
}

fn run_migrate(args: MigrateArgs, log_format: Option<LogFormat>) -> anyhow::Result<()> {
    let config = load(
        &args.common,
        Overrides {
            log_format,
            ..Overrides::default()
        },
    )?;
    telemetry::init_tracing(&config.log);
    let Some(settings) = config.postgres_settings() else {
        anyhow::bail!(
            "no metastore: set cluster.postgres.url, CORVID_POSTGRES_URL or --postgres-url"
        );
    };
    let migrated = migrate_metastore(&settings)?;
    if migrated.applied.is_empty() {
        println!("metastore schema is current (version {})", migrated.version);
    } else {
        println!(
            "metastore schema migrated to version {} (applied {:?})",
            migrated.version, migrated.applied
        );
    }
    Ok(())
}

fn run_bootstrap(args: BootstrapArgs, log_format: Option<LogFormat>) -> anyhow::Result<()> {
    let config = load(
        &args.common,
        Overrides {
            log_format,
            ..Overrides::default()
        },
    )?;
    let settings = config.engine_settings(&config.public_url_for(config.server.bind))?;
    let credentials = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let tenancy = Engine::open_tenancy(&settings).await?;
            let outcome = tenancy.bootstrap(MintKey::Always).await?;
            tenancy.flush().await?;
            Ok::<_, anyhow::Error>(outcome)
        })?;
    let credentials = bootstrap::credentials(credentials)
        .ok_or_else(|| anyhow::anyhow!("bootstrap minted no key"))?;
    let path = config.credentials_path();
    if credentials.password.is_some() {
        bootstrap::write_credentials(&path, &credentials)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&credentials)?);
    } else {
        println!("{}", bootstrap::banner(&credentials, &path));
    }
    Ok(())
}

/// A directory argument as an absolute path (a serving node resolves it, from its own working
/// directory); an `s3://` URL as given.
fn absolute(location: &str) -> anyhow::Result<String> {
    if location.starts_with("s3://") {
        return Ok(location.to_string());
    }
    Ok(std::path::absolute(location)?
        .to_string_lossy()
        .into_owned())
}

fn run_snapshot(args: SnapshotArgs) -> anyhow::Result<()> {
    let to = absolute(&args.to)?;
    let request = crate::control::Request::Snapshot {
        to: to.clone(),
        aws: corvid_engine::aws_environment(),
    };
    let report = match crate::control::ask(&args.data_dir, &request) {
        Some(reply) => {
            let reply = reply?;
            if reply["ok"] != true {
                anyhow::bail!(
                    "the node refused the snapshot: {}",
                    reply["error"].as_str().unwrap_or("no reason given")
                );
            }
            serde_json::from_value(reply["report"].clone())?
        }
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(corvid_engine::snapshot_offline(&args.data_dir, &to))?,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn run_restore(args: RestoreArgs) -> anyhow::Result<()> {
    let from = absolute(&args.from)?;
    let report = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(corvid_engine::restore_snapshot(&from, &args.data_dir))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Registers SIGINT and SIGTERM handlers now; the returned future completes on either.
#[cfg(unix)]
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
