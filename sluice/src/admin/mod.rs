//! `sluice admin`: operate a running cluster.
//!
//! Every subcommand except `certs` talks to the meta cluster's
//! `sluice.admin.Admin` service through [`connect`], which follows the
//! leader like every other meta client.
//!
//! # Layout
//! * `mod.rs`: the subcommand tree, [`AdminConn`] and [`connect`].
//! * [`datanodes`]: `sluice admin datanode list|drain|undrain|remove`.

mod datanodes;

use clap::{Args, Subcommand};
use sluice_meta::MetaClient;

/// How `sluice admin` reaches the meta cluster.
#[allow(dead_code)] // used by the admin subcommands as they are added
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
    /// Datanodes: list, drain, remove.
    Datanode {
        #[command(flatten)]
        conn: AdminConn,
        #[command(subcommand)]
        command: datanodes::DatanodeCommand,
    },
}

/// A leader-following client for the admin service on `conn.meta`.
#[allow(dead_code)] // used by the admin subcommands as they are added
pub fn connect(conn: &AdminConn) -> anyhow::Result<MetaClient> {
    anyhow::ensure!(!conn.meta.is_empty(), "no meta endpoint given (--meta)");
    Ok(MetaClient::new(conn.meta.clone()))
}

/// Runs one `sluice admin` subcommand.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Datanode { conn, command } => datanodes::run(&conn, command).await,
    }
}
