//! `sluice admin`: operate a running cluster.
//!
//! Every subcommand except `certs` talks to the meta cluster's
//! `sluice.admin.Admin` service through [`connect`], which follows the
//! leader like every other meta client, with the admin certificate
//! (`--ca/--cert/--key`) under mutual TLS.
//!
//! # Layout
//! * `mod.rs`: the subcommand tree, [`AdminConn`] and [`connect`].
//! * `keys.rs`: `sluice admin key ...` (S3 access keys).
//! * `meta.rs`: `sluice admin meta list|add|remove|replace|digest` (meta
//!   voters, their state digests).
//! * `settings.rs`: `sluice admin settings show|set` (replicated cluster
//!   settings).
//! * [`datanodes`]: `sluice admin datanode list|drain|undrain|remove`.
//! * `certs.rs`: `sluice admin certs init|issue`.
//! * `status.rs`: `sluice admin status [--json]`.
//! * [`serve`]: `sluice admin serve` (the HTML status page).
//! * [`version`]: `sluice admin version [show|finalize]` (cluster version).

mod certs;
mod datanodes;
mod keys;
pub mod meta;
pub mod serve;
mod settings;
pub mod status;
pub mod version;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use sluice_meta_client::MetaClient;

/// How `sluice admin` reaches the meta cluster.
#[derive(Args, Debug, Clone)]
pub struct AdminConn {
    /// Meta gRPC endpoints, comma-separated (any node; the leader is
    /// followed), e.g. `https://127.0.0.1:7000`.
    #[arg(
        long,
        global = true,
        env = "SLUICE_META",
        value_delimiter = ',',
        default_value = "https://127.0.0.1:7000"
    )]
    pub meta: Vec<String>,
    /// Cluster CA certificate (PEM). With --cert and --key: mutual TLS;
    /// with none of the three: plaintext (an `insecure_cluster`).
    #[arg(long, env = "SLUICE_ADMIN_CA")]
    pub ca: Option<PathBuf>,
    /// Admin certificate (PEM, SAN URI spiffe://sluice/admin/<name>).
    #[arg(long, env = "SLUICE_ADMIN_CERT")]
    pub cert: Option<PathBuf>,
    /// Admin certificate's private key (PEM).
    #[arg(long, env = "SLUICE_ADMIN_KEY")]
    pub key: Option<PathBuf>,
}

/// `sluice admin <area> ...`.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// S3 access keys: create, list, delete, allow, deny.
    Key {
        #[command(flatten)]
        conn: AdminConn,
        #[command(subcommand)]
        command: keys::KeyCommand,
    },
    /// Meta cluster membership: list, add, remove or replace voters.
    Meta {
        #[command(flatten)]
        conn: AdminConn,
        #[command(subcommand)]
        command: meta::MetaCommand,
    },
    /// Datanodes: list, drain, remove.
    Datanode {
        #[command(flatten)]
        conn: AdminConn,
        #[command(subcommand)]
        command: datanodes::DatanodeCommand,
    },
    /// Replicated cluster settings (the write epoch lease): show, set.
    Settings {
        #[command(flatten)]
        conn: AdminConn,
        #[command(subcommand)]
        command: settings::SettingsCommand,
    },
    // ---- ops
    /// The cluster at a glance: meta voters, datanodes, gateways, degraded
    /// blobs and heal progress, memory against budgets.
    Status(status::StatusArgs),
    /// Serve a read-only HTML status page of the cluster (polls Status).
    Serve(serve::ServeArgs),
    /// The cluster version and each meta node's binary and replicated
    /// format; `finalize` completes an upgrade.
    Version {
        #[command(flatten)]
        conn: AdminConn,
        #[command(subcommand)]
        command: Option<version::VersionCommand>,
    },
    /// Cluster CA and node certificates.
    Certs {
        #[command(subcommand)]
        command: certs::CertsCommand,
    },
}

/// Total time a `sluice admin` call keeps retrying across meta nodes
/// (leader changes, unreachable nodes).
const ADMIN_RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// Timeout of one admin RPC attempt: longer than the longest server-side
/// wait (`sluice admin meta add --catch-up-timeout`, at most 10 min).
const ADMIN_RPC_TIMEOUT: Duration = Duration::from_secs(660);

/// The transport `conn` asks for: mutual TLS with the admin certificate,
/// or plaintext when no TLS file is given.
pub fn transport(conn: &AdminConn) -> anyhow::Result<sluice_net::Transport> {
    match (&conn.ca, &conn.cert, &conn.key) {
        (Some(ca), Some(cert), Some(key)) => {
            let tls = sluice_net::ClusterTls {
                ca_file: ca.clone(),
                cert_file: cert.clone(),
                key_file: key.clone(),
            };
            Ok(sluice_net::Transport::from_config(
                Some(&tls),
                false,
                sluice_net::Role::Admin,
            )?)
        }
        (None, None, None) => {
            tracing::warn!("no --ca/--cert/--key: talking to meta in plaintext");
            Ok(sluice_net::Transport::Insecure)
        }
        _ => anyhow::bail!("give all of --ca, --cert and --key (or none, for a plaintext cluster)"),
    }
}

/// A leader-following client for the admin service on `conn.meta`.
pub fn connect(conn: &AdminConn) -> anyhow::Result<MetaClient> {
    connect_with(conn, ADMIN_RETRY_DEADLINE, ADMIN_RPC_TIMEOUT)
}

/// [`connect`] with its own retry deadline and per-call timeout.
pub fn connect_with(
    conn: &AdminConn,
    retry_deadline: Duration,
    rpc_timeout: Duration,
) -> anyhow::Result<MetaClient> {
    anyhow::ensure!(!conn.meta.is_empty(), "no meta endpoint given (--meta)");
    Ok(
        MetaClient::with_timeouts(conn.meta.clone(), retry_deadline, rpc_timeout)
            .with_transport(transport(conn)?),
    )
}

/// Runs one `sluice admin` subcommand.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Key { conn, command } => keys::run(&conn, command).await,
        AdminCommand::Meta { conn, command } => meta::run(&conn, command).await,
        AdminCommand::Datanode { conn, command } => datanodes::run(&conn, command).await,
        AdminCommand::Settings { conn, command } => settings::run(&conn, command).await,
        AdminCommand::Status(args) => status::run(args).await,
        AdminCommand::Serve(args) => serve::run(args).await,
        AdminCommand::Version { conn, command } => version::run(&conn, command).await,
        AdminCommand::Certs { command } => certs::run(command),
    }
}
