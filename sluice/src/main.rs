//! `sluice`: one binary for every role.
//!
//! * `sluice meta --config meta.toml` — a meta node (Raft voter).
//! * `sluice datanode --config datanode.toml` — a datanode.
//! * `sluice gateway --config gateway.toml` — an S3 gateway.
//! * `sluice dev [--data-dir DIR]` — a whole cluster in one process: one
//!   meta node, six datanodes and a gateway, erasure layout 4+2.
//!
//! The roles are libraries (`sluice_meta`, `sluice_datanode`,
//! `sluice_gateway`); this file only parses the command line and config,
//! starts tracing, binds listeners and calls each role's `run`.

mod dev;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde::de::DeserializeOwned;

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
    Meta {
        /// TOML configuration file (see deploy/meta.toml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a datanode (stores erasure-coded shards).
    Datanode {
        /// TOML configuration file (see deploy/datanode.toml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run an S3 gateway.
    Gateway {
        /// TOML configuration file (see deploy/gateway.toml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a whole development cluster on this machine.
    Dev(dev::DevArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,openraft=warn,sled=warn,s3s=off")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Meta { config } => {
                let config: sluice_meta::Config = load_config(&config)?;
                let listener = bind(config.listen).await?;
                sluice_meta::run(config, listener, shutdown_signal()).await?;
            }
            Command::Datanode { config } => {
                let config: sluice_datanode::Config = load_config(&config)?;
                let listener = bind(config.listen).await?;
                sluice_datanode::run(config, listener, shutdown_signal()).await?;
            }
            Command::Gateway { config } => {
                let config: sluice_gateway::Config = load_config(&config)?;
                let listener = bind(config.listen).await?;
                sluice_gateway::run(config, listener, shutdown_signal()).await?;
            }
            Command::Dev(args) => dev::run(args, shutdown_signal()).await?,
        }
        Ok(())
    })
}

/// Reads and parses a TOML config file.
fn load_config<T: DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))
}

async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
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
    }
}
