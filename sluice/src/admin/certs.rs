//! `sluice admin certs`: the cluster CA and node certificates (see
//! `sluice_net` for the identity format and how to use an existing CA).

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use sluice_net::{Identity, Role, pki};

/// `sluice admin certs ...`.
#[derive(Subcommand, Debug)]
pub enum CertsCommand {
    /// Make a new cluster CA: DIR/ca.pem and DIR/ca.key (mode 0600).
    /// Refuses to replace an existing CA.
    Init {
        /// Certificate directory (created if missing).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue a node certificate with the CA in DIR: DIR/<role>-<id>.pem and
    /// .key (mode 0600), SAN URI spiffe://sluice/<role>/<id> and DNS
    /// <role>.sluice.internal.
    Issue {
        /// Certificate directory holding ca.pem and ca.key.
        #[arg(long)]
        dir: PathBuf,
        /// meta, datanode, gateway or admin.
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// The node id (a meta or datanode node id; a name for a gateway or
        /// an operator).
        #[arg(long)]
        id: String,
        /// Extra DNS name SAN (repeatable).
        #[arg(long)]
        dns: Vec<String>,
        /// Extra IP address SAN (repeatable).
        #[arg(long)]
        ip: Vec<IpAddr>,
    },
}

fn parse_role(s: &str) -> Result<Role, String> {
    s.parse().map_err(|e: sluice_net::AuthError| e.to_string())
}

/// Runs one `sluice admin certs` subcommand.
pub fn run(command: CertsCommand) -> anyhow::Result<()> {
    match command {
        CertsCommand::Init { dir } => {
            pki::init_dir(&dir).with_context(|| format!("making a CA in {}", dir.display()))?;
            println!("CA certificate: {}", dir.join(pki::CA_CERT_FILE).display());
            println!(
                "CA key:         {} (keep it secret)",
                dir.join(pki::CA_KEY_FILE).display()
            );
        }
        CertsCommand::Issue {
            dir,
            role,
            id,
            dns,
            ip,
        } => {
            let identity = Identity::new(role, id)?;
            let files = pki::issue_to_dir(&dir, &identity, &dns, &ip).with_context(|| {
                format!("issuing {} with the CA in {}", identity, dir.display())
            })?;
            println!("issued {}", identity.spiffe_id());
            println!("[cluster_tls]");
            println!("ca_file = {:?}", files.ca_file.display().to_string());
            println!("cert_file = {:?}", files.cert_file.display().to_string());
            println!("key_file = {:?}", files.key_file.display().to_string());
        }
    }
    Ok(())
}
