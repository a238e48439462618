//! `sluice`: one binary for every role.
//!
//! * `sluice meta --config meta.toml` — a meta node (Raft voter).
//! * `sluice datanode --config datanode.toml` — a datanode.
//! * `sluice gateway --config gateway.toml` — an S3 gateway.
//! * `sluice <role> --print-config [toml|json]` — every key the role's
//!   config accepts, with its default (see [`print_config`]).
//! * `sluice admin ...` — operate a running cluster (see [`admin`]).
//! * `sluice health --config role.toml` — exit 0 when the role is ready
//!   (container and systemd health checks; see [`probe`]).
//! * `sluice dev [--data-dir DIR]` — a whole cluster in one process: one
//!   meta node, six datanodes and a gateway, erasure layout 4+2.
//!
//! The roles are libraries (`sluice_meta`, `sluice_datanode`,
//! `sluice_gateway`); this file only parses the command line and config,
//! starts tracing, fills unset memory budgets from the memory limit, serves
//! Prometheus `/metrics` where the config's `metrics_listen` asks for it,
//! binds listeners and calls each role's `run`.
//!
//! Allocator: the system allocator, or jemalloc / mimalloc with the cargo
//! feature of that name (at most one).
//!
//! # Layout
//!
//! * `main.rs`: command line, the single-role subcommands, the allocator.
//! * [`admin`]: `sluice admin` (operate a running cluster).
//! * [`dev`]: `sluice dev`.
//! * [`budget`]: the memory limit and the budget defaults derived from it.
//! * [`telemetry`]: the Prometheus recorder, process gauges, `/metrics`
//!   and `/health/live|ready`.
//! * [`health`]: each role's readiness probe.
//! * [`print_config`] renders `--print-config`.

mod admin;
mod budget;
mod dev;
mod health;
mod http;
mod malloc;
mod print_config;
mod probe;
mod telemetry;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde::de::DeserializeOwned;
use sluice_net::Role;

#[cfg(all(feature = "jemalloc", feature = "mimalloc"))]
compile_error!("enable at most one of the `jemalloc` and `mimalloc` features");

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The global allocator this binary was built with (logged, printed by
/// `sluice dev`, exported in `sluice_build_info`).
pub const ALLOCATOR: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system"
};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Sluice: a distributed S3-compatible object store with bounded memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a meta node (metadata, replicated with Raft).
    Meta(RoleArgs),
    /// Run a datanode (stores erasure-coded shards).
    Datanode(RoleArgs),
    /// Run an S3 gateway.
    Gateway(RoleArgs),
    /// Run a whole development cluster on this machine.
    Dev(dev::DevArgs),
    /// Ask a running role whether it is ready: exit 0 on 200 from its
    /// /health/ready, 1 otherwise (container and systemd health checks).
    Health(probe::HealthArgs),
    /// Operate a running cluster (certificates, keys, membership, status).
    Admin {
        #[command(subcommand)]
        command: admin::AdminCommand,
    },
}

/// What `sluice meta|datanode|gateway` take.
#[derive(clap::Args)]
struct RoleArgs {
    /// TOML configuration file (examples: deploy/meta.toml,
    /// deploy/datanode.toml, deploy/gateway.toml).
    #[arg(long, required_unless_present = "print_config")]
    config: Option<PathBuf>,
    /// Print every key this role's config accepts, with its default, and
    /// exit: `toml` (the default; keys without a default commented out) or
    /// `json` (those as null).
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "toml")]
    print_config: Option<print_config::ConfigFormat>,
}

impl RoleArgs {
    /// The config file; clap requires it unless `--print-config` was given,
    /// which is handled before this is called.
    fn config(&self) -> anyhow::Result<&Path> {
        self.config
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--config is required"))
    }
}

/// Prints the role's defaults (`--print-config`); false when not asked.
fn print_defaults(command: &Command) -> anyhow::Result<bool> {
    use print_config::render;
    let text = match command {
        Command::Meta(RoleArgs {
            print_config: Some(f),
            ..
        }) => render(&sluice_meta::Config::default(), *f)?,
        Command::Datanode(RoleArgs {
            print_config: Some(f),
            ..
        }) => render(&sluice_datanode::Config::default(), *f)?,
        Command::Gateway(RoleArgs {
            print_config: Some(f),
            ..
        }) => render(&sluice_gateway::Config::default(), *f)?,
        _ => return Ok(false),
    };
    print!("{text}");
    Ok(true)
}

fn main() -> anyhow::Result<()> {
    // Before any thread exists (see malloc.rs).
    let malloc = malloc::tune();
    let cli = Cli::parse();
    let command = match cli.command {
        // No runtime, no log lines: one request, one answer, an exit code.
        Command::Health(args) => std::process::exit(if probe::run(args)? { 0 } else { 1 }),
        command => command,
    };
    if print_defaults(&command)? {
        return Ok(());
    }
    // `sluice admin` is a command-line tool: warnings only, unless RUST_LOG
    // says otherwise; the roles log at info.
    let default_filter = match command {
        Command::Admin { .. } | Command::Health(_) => "warn",
        _ => "info,openraft=warn,sled=warn,s3s=off",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    tracing::info!(
        allocator = ALLOCATOR,
        mmap_threshold = ?malloc.mmap_threshold,
        arena_max = ?malloc.arena_max,
        "malloc tuning"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match command {
            Command::Meta(args) => {
                let config: sluice_meta::Config = load_config(args.config()?)?;
                let limit = budget::detect_memory_limit();
                let budgets = budget::meta_budgets(&config);
                let ready = health::meta(
                    config.listen,
                    config.node_id,
                    transport_of(
                        config.cluster_tls.as_ref(),
                        config.insecure_cluster,
                        Role::Meta,
                    )?,
                );
                let _metrics =
                    start_process(config.metrics_listen, &limit, &budgets, ready).await?;
                let listener = bind(config.listen).await?;
                sluice_meta::run(config, listener, shutdown_signal()).await?;
            }
            Command::Datanode(args) => {
                let mut config: sluice_datanode::Config = load_config(args.config()?)?;
                let limit = budget::detect_memory_limit();
                let budgets =
                    budget::apply_datanode(&mut config, budget::DATANODE_WRITE, limit.bytes);
                let ready = health::datanode(
                    config.meta_endpoints.clone(),
                    config.node_id,
                    transport_of(
                        config.cluster_tls.as_ref(),
                        config.insecure_cluster,
                        Role::Datanode,
                    )?,
                );
                let _metrics =
                    start_process(config.metrics_listen, &limit, &budgets, ready).await?;
                let listener = bind(config.listen).await?;
                sluice_datanode::run(config, listener, shutdown_signal()).await?;
            }
            Command::Gateway(args) => {
                let mut config: sluice_gateway::Config = load_config(args.config()?)?;
                let limit = budget::detect_memory_limit();
                let budgets =
                    budget::apply_gateway(&mut config, budget::GATEWAY_BUFFER, limit.bytes);
                let ready = health::gateway(
                    config.meta_endpoints.clone(),
                    config.effective_write_quorum() as usize,
                    transport_of(
                        config.cluster_tls.as_ref(),
                        config.insecure_cluster,
                        Role::Gateway,
                    )?,
                );
                let _metrics =
                    start_process(config.metrics_listen, &limit, &budgets, ready).await?;
                let listener = bind(config.listen).await?;
                sluice_gateway::run(config, listener, shutdown_signal()).await?;
            }
            Command::Dev(args) => dev::run(args, shutdown_signal()).await?,
            Command::Admin { command } => admin::run(command).await?,
            Command::Health(_) => unreachable!("answered before the runtime starts"),
        }
        Ok(())
    })
}

/// Logs the allocator, memory limit and every effective budget, then, if
/// `metrics_listen` is set, installs the Prometheus recorder and serves
/// `/metrics` and `/health/live|ready` (readiness from `ready`) there
/// (until the returned server is dropped). Call it before starting any role.
async fn start_process(
    metrics_listen: Option<std::net::SocketAddr>,
    limit: &budget::MemoryLimit,
    budgets: &[budget::Budget],
    ready: telemetry::ReadyProbe,
) -> anyhow::Result<Option<telemetry::MetricsServer>> {
    log_memory(limit, budgets);
    let Some(addr) = metrics_listen else {
        return Ok(None);
    };
    let handle = telemetry::install()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding metrics on {addr}"))?;
    let server =
        telemetry::MetricsServer::start(listener, handle, ALLOCATOR, limit, budgets, ready)?;
    tracing::info!(addr = %server.local_addr(), "serving /metrics, /health/live and /health/ready");
    Ok(Some(server))
}

/// Logs (info) the allocator, the memory limit, every budget and their sum.
fn log_memory(limit: &budget::MemoryLimit, budgets: &[budget::Budget]) {
    tracing::info!(allocator = ALLOCATOR, %limit, "memory limit");
    for b in budgets {
        tracing::info!(
            node = %b.node,
            budget = b.budget,
            bytes = b.bytes,
            origin = %b.origin,
            "memory budget: {}",
            budget::mib(b.bytes)
        );
    }
    let total: u64 = budgets.iter().map(|b| b.bytes).sum();
    tracing::info!(
        bytes = total,
        "memory budgets total {}: RSS stays within base + this",
        budget::mib(total)
    );
}

/// The cluster transport a role's config asks for (its probes dial meta
/// with it). Errors like the role's own start would: neither or both of
/// `[cluster_tls]` and `insecure_cluster`, or unreadable certificate files.
fn transport_of(
    tls: Option<&sluice_net::ClusterTls>,
    insecure: bool,
    role: Role,
) -> anyhow::Result<sluice_net::Transport> {
    sluice_net::Transport::from_config(tls, insecure, role).context("cluster TLS")
}

/// Reads and parses a TOML config file.
fn load_config<T: DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))
}

/// Binds a role's listener and tells systemd the role is up (`READY=1`
/// for `Type=notify` units: the port accepts connections from now on).
async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    probe::sd_notify("READY=1");
    Ok(listener)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
                        let _ = ctrl_c.await;
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
        tracing::info!("shutdown requested");
        probe::sd_notify("STOPPING=1");
    }
}
