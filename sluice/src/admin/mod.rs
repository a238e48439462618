//! `sluice admin`: operate a running cluster.
//!
//! Every subcommand except `certs` talks to the meta cluster's
//! `sluice.admin.Admin` service through [`connect`], which follows the
//! leader like every other meta client.
//!
//! # Layout
//! * `mod.rs`: the subcommand tree, [`AdminConn`] and [`connect`].
//! * `keys.rs`: `sluice admin key ...` (S3 access keys).
//! * `meta.rs`: `sluice admin meta list|add|remove|replace` (meta voters).
//! * [`datanodes`]: `sluice admin datanode list|drain|undrain|remove`.
//! * `status.rs`: `sluice admin status [--json]`.

mod datanodes;
mod keys;
pub mod meta;
pub mod status;

use std::time::Duration;

use clap::{Args, Subcommand};
use sluice_meta::MetaClient;

/// How `sluice admin` reaches the meta cluster.
#[derive(Args, Debug, Clone)]
pub struct AdminConn {
    /// Meta gRPC endpoints, comma-separated (any node; the leader is
    /// followed), e.g. `http://127.0.0.1:7000`.
    #[arg(
        long,
        global = true,
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
    // ---- ops
    /// The cluster at a glance: meta voters, datanodes, gateways, degraded
    /// blobs and heal progress, memory against budgets.
    Status(status::StatusArgs),
}

/// Total time a `sluice admin` call keeps retrying across meta nodes
/// (leader changes, unreachable nodes).
const ADMIN_RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// Timeout of one admin RPC attempt: longer than the longest server-side
/// wait (`sluice admin meta add --catch-up-timeout`, at most 10 min).
const ADMIN_RPC_TIMEOUT: Duration = Duration::from_secs(660);

/// A leader-following client for the admin service on `conn.meta`.
pub fn connect(conn: &AdminConn) -> anyhow::Result<MetaClient> {
    anyhow::ensure!(!conn.meta.is_empty(), "no meta endpoint given (--meta)");
    Ok(MetaClient::with_timeouts(
        conn.meta.clone(),
        ADMIN_RETRY_DEADLINE,
        ADMIN_RPC_TIMEOUT,
    ))
}

/// Runs one `sluice admin` subcommand.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Key { conn, command } => keys::run(&conn, command).await,
        AdminCommand::Meta { conn, command } => meta::run(&conn, command).await,
        AdminCommand::Datanode { conn, command } => datanodes::run(&conn, command).await,
        AdminCommand::Status(args) => status::run(args).await,
    }
}
