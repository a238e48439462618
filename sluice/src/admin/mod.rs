//! `sluice admin`: operate a running cluster.
//!
//! Every subcommand except `certs` talks to the meta cluster's
//! `sluice.admin.Admin` service through [`connect`], which follows the
//! leader like every other meta client, with the admin certificate
//! (`--ca/--cert/--key`) under mutual TLS.
//!
//! # Layout
//! * `mod.rs`: the subcommand tree, [`AdminConn`] and [`connect`].
//! * `certs.rs`: `sluice admin certs init|issue`.

mod certs;

use std::path::PathBuf;

use clap::{Args, Subcommand};
use sluice_meta::MetaClient;

/// How `sluice admin` reaches the meta cluster.
#[allow(dead_code)] // used by the admin subcommands as they are added
#[derive(Args, Debug, Clone)]
pub struct AdminConn {
    /// Meta gRPC endpoints, comma-separated (any node; the leader is
    /// followed), e.g. `https://127.0.0.1:7000`.
    #[arg(
        long,
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
    /// Cluster CA and node certificates.
    Certs {
        #[command(subcommand)]
        command: certs::CertsCommand,
    },
}

/// The transport `conn` asks for: mutual TLS with the admin certificate,
/// or plaintext when no TLS file is given.
pub fn transport(conn: &AdminConn) -> anyhow::Result<sluice_auth::Transport> {
    match (&conn.ca, &conn.cert, &conn.key) {
        (Some(ca), Some(cert), Some(key)) => {
            let tls = sluice_auth::ClusterTls {
                ca_file: ca.clone(),
                cert_file: cert.clone(),
                key_file: key.clone(),
            };
            Ok(sluice_auth::Transport::from_config(
                Some(&tls),
                false,
                sluice_auth::Role::Admin,
            )?)
        }
        (None, None, None) => {
            tracing::warn!("no --ca/--cert/--key: talking to meta in plaintext");
            Ok(sluice_auth::Transport::Insecure)
        }
        _ => anyhow::bail!("give all of --ca, --cert and --key (or none, for a plaintext cluster)"),
    }
}

/// A leader-following client for the admin service on `conn.meta`.
#[allow(dead_code)] // used by the admin subcommands as they are added
pub fn connect(conn: &AdminConn) -> anyhow::Result<MetaClient> {
    anyhow::ensure!(!conn.meta.is_empty(), "no meta endpoint given (--meta)");
    Ok(MetaClient::new(conn.meta.clone()).with_transport(transport(conn)?))
}

/// Runs one `sluice admin` subcommand.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Certs { command } => certs::run(command),
    }
}
