//! `sluice admin`: operate a running cluster.
//!
//! Every subcommand except `certs` talks to the meta cluster's
//! `sluice.admin.Admin` service through [`connect`], which follows the
//! leader like every other meta client.
//!
//! # Layout
//! * `mod.rs`: the subcommand tree, [`AdminConn`] and [`connect`].
//! * `keys.rs`: `sluice admin key ...` (S3 access keys).

mod keys;

use clap::{Args, Subcommand};
use sluice_meta::MetaClient;

/// How `sluice admin` reaches the meta cluster.
#[derive(Args, Debug, Clone)]
pub struct AdminConn {
    /// Meta gRPC endpoints, comma-separated (any node; the leader is
    /// followed), e.g. `http://127.0.0.1:7000`.
    #[arg(
        long,
        env = "SLUICE_META",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7000"
    )]
    pub meta: Vec<String>,
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
}

/// A leader-following client for the admin service on `conn.meta`.
pub fn connect(conn: &AdminConn) -> anyhow::Result<MetaClient> {
    anyhow::ensure!(!conn.meta.is_empty(), "no meta endpoint given (--meta)");
    Ok(MetaClient::new(conn.meta.clone()))
}

/// Runs one `sluice admin` subcommand.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Key { conn, command } => keys::run(&conn, command).await,
    }
}
