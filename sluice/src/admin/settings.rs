//! `sluice admin settings show|set`: the replicated cluster settings (see
//! `sluice_meta::sm::settings`). A node's config `epoch_lease` only seeds
//! a new cluster; later changes go through `set`, as one Raft log entry
//! that every meta voter applies alike.

use std::time::Duration;

use clap::Subcommand;
use sluice_meta_client::new_op_id;
use sluice_proto::admin::{self as apb, admin_client::AdminClient};

use super::meta::humantime_arg;
use super::{AdminConn, connect};

/// `sluice admin settings <command>`.
#[derive(Subcommand, Debug)]
pub enum SettingsCommand {
    /// Show the settings in force (defaults where none was set).
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Change settings; the ones not given are kept.
    Set {
        /// The write epoch lease OpenEpoch grants from now on (humantime,
        /// 1ms ..= 1h; must stay below (session_expiry -
        /// client_retry_deadline) / 2 of the leader's config). Epochs
        /// already open keep the lease they were granted.
        #[arg(long, value_parser = humantime_arg)]
        epoch_lease: Option<Duration>,
        #[arg(long)]
        json: bool,
    },
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The settings as JSON (the `--json` output).
pub fn settings_json(s: &apb::ClusterSettingsResponse) -> serde_json::Value {
    serde_json::json!({
        "epoch_lease_ms": s.epoch_lease_ms,
        "defaults": s.defaults,
    })
}

/// The settings for humans.
pub fn settings_text(s: &apb::ClusterSettingsResponse) -> String {
    format!(
        "epoch_lease  {}{}\n",
        humantime::format_duration(Duration::from_millis(s.epoch_lease_ms)),
        if s.defaults {
            "  (default: no settings stored yet)"
        } else {
            ""
        }
    )
}

/// Runs one `sluice admin settings` subcommand against the meta cluster.
pub async fn run(conn: &AdminConn, command: SettingsCommand) -> anyhow::Result<()> {
    let meta = connect(conn)?;
    let (resp, json) = match command {
        SettingsCommand::Show { json } => {
            let resp = meta
                .call_on("GetClusterSettings", |ch| async move {
                    AdminClient::new(ch)
                        .get_cluster_settings(apb::GetClusterSettingsRequest {})
                        .await
                })
                .await?;
            (resp, json)
        }
        SettingsCommand::Set { epoch_lease, json } => {
            anyhow::ensure!(epoch_lease.is_some(), "nothing to set: give --epoch-lease");
            let req = apb::SetClusterSettingsRequest {
                epoch_lease_ms: epoch_lease.map(ms),
                op_id: new_op_id(),
            };
            let resp = meta
                .call_on("SetClusterSettings", |ch| {
                    let req = req.clone();
                    async move { AdminClient::new(ch).set_cluster_settings(req).await }
                })
                .await?;
            (resp, json)
        }
    };
    if json {
        println!("{}", settings_json(&resp));
    } else {
        print!("{}", settings_text(&resp));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_print_in_both_forms() {
        let s = apb::ClusterSettingsResponse {
            epoch_lease_ms: 30_000,
            defaults: true,
        };
        assert_eq!(
            settings_text(&s),
            "epoch_lease  30s  (default: no settings stored yet)\n"
        );
        let j = settings_json(&apb::ClusterSettingsResponse {
            epoch_lease_ms: 1_500,
            defaults: false,
        });
        assert_eq!(j["epoch_lease_ms"], 1_500);
        assert_eq!(j["defaults"], false);
    }
}
