//! `sluice admin version [show|finalize]`: the cluster version and what
//! each meta node understands (see `sluice_meta::version`).
//!
//! `show` (the default) prints the cluster version, the leader's
//! replicated format and, for every meta node (voters and learners), its
//! binary version, replicated format, the cluster version it has applied
//! and the entry its apply stopped at, if any. `finalize` raises the
//! cluster version once every node understands the leader's format; it is
//! refused, naming the nodes that lag or did not answer, before that.
//! After a finalize the previous release can no longer run this cluster.

use clap::{Args, Subcommand};
use sluice_meta_client::MetaClient;
use sluice_proto::admin as apb;
use sluice_proto::admin::admin_client::AdminClient;

use super::{AdminConn, connect};

/// `sluice admin version ...`.
#[derive(Subcommand, Debug)]
pub enum VersionCommand {
    /// The cluster version and each meta node's binary version and
    /// replicated format (the default).
    Show(Output),
    /// Raise the cluster version to the leader's replicated format: new
    /// command kinds and formats become usable, and rolling back to the
    /// previous release is no longer possible. Refused while a meta node
    /// runs an older binary or does not answer.
    Finalize(Output),
}

/// Output format flags.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct Output {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs one `sluice admin version` subcommand (`show` when none).
pub async fn run(conn: &AdminConn, command: Option<VersionCommand>) -> anyhow::Result<()> {
    let client = connect(conn)?;
    match command.unwrap_or(VersionCommand::Show(Output::default())) {
        VersionCommand::Show(output) => print(&show(&client).await?, output),
        VersionCommand::Finalize(output) => {
            let resp = finalize(&client).await?;
            if !output.json {
                if resp.finalized {
                    println!("finalized: the cluster version is {}", resp.cluster_version);
                } else {
                    println!(
                        "nothing to finalize: the cluster version is {}",
                        resp.cluster_version
                    );
                }
            }
            print(&resp, output);
        }
    }
    Ok(())
}

/// ShowVersion on the leader.
pub async fn show(client: &MetaClient) -> anyhow::Result<apb::VersionResponse> {
    Ok(client
        .call_on("ShowVersion", |channel| async move {
            AdminClient::new(channel)
                .show_version(apb::ShowVersionRequest {})
                .await
        })
        .await?)
}

/// FinalizeVersion on the leader.
pub async fn finalize(client: &MetaClient) -> anyhow::Result<apb::VersionResponse> {
    Ok(client
        .call_on("FinalizeVersion", |channel| async move {
            AdminClient::new(channel)
                .finalize_version(apb::FinalizeVersionRequest {})
                .await
        })
        .await?)
}

/// The answer as JSON (the `--json` output).
pub fn version_json(v: &apb::VersionResponse) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = v
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "id": n.id,
                "addr": n.addr,
                "role": if n.voter { "voter" } else { "learner" },
                "reachable": n.reachable,
                "error": if n.reachable { None } else { Some(&n.error) },
                "binary_version": n.binary_version,
                "replicated_format": n.replicated_format,
                "cluster_version": n.cluster_version,
                "apply_blocked_index": if n.apply_blocked_index == 0 { None } else { Some(n.apply_blocked_index) },
            })
        })
        .collect();
    serde_json::json!({
        "cluster_version": v.cluster_version,
        "leader_format": v.leader_format,
        "finalized": v.finalized,
        "nodes": nodes,
    })
}

/// The answer as a human table.
pub fn version_table(v: &apb::VersionResponse) -> String {
    let mut out = format!(
        "cluster version {}  leader's replicated format {}{}\n",
        v.cluster_version,
        v.leader_format,
        if v.leader_format > v.cluster_version {
            "  (not finalized: sluice admin version finalize)"
        } else {
            ""
        }
    );
    let addr_w = v
        .nodes
        .iter()
        .map(|n| n.addr.len())
        .max()
        .unwrap_or(0)
        .max("ADDR".len());
    out.push_str(&format!(
        "{:>4}  {:<addr_w$}  {:<7}  {:<10}  {:>6}  {:>7}  {}\n",
        "ID", "ADDR", "ROLE", "BINARY", "FORMAT", "APPLIED", "STATE"
    ));
    for n in &v.nodes {
        let role = if n.voter { "voter" } else { "learner" };
        let (binary, format, applied, state) = if n.reachable {
            let state = if n.apply_blocked_index != 0 {
                format!(
                    "apply stopped at entry {}: needs a newer sluice",
                    n.apply_blocked_index
                )
            } else if n.replicated_format < v.leader_format {
                "older binary".to_string()
            } else {
                "ok".to_string()
            };
            (
                n.binary_version.clone(),
                n.replicated_format.to_string(),
                n.cluster_version.to_string(),
                state,
            )
        } else {
            (
                "-".into(),
                "-".into(),
                "-".into(),
                format!("unreachable: {}", n.error),
            )
        };
        out.push_str(&format!(
            "{:>4}  {:<addr_w$}  {:<7}  {:<10}  {:>6}  {:>7}  {}\n",
            n.id, n.addr, role, binary, format, applied, state
        ));
    }
    out
}

fn print(v: &apb::VersionResponse, output: Output) {
    if output.json {
        println!("{}", version_json(v));
    } else {
        print!("{}", version_table(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_lagging_and_blocked_nodes() {
        let v = apb::VersionResponse {
            cluster_version: 1,
            leader_format: 2,
            finalized: false,
            nodes: vec![
                apb::MetaNodeVersion {
                    id: 1,
                    addr: "http://a:7001".into(),
                    voter: true,
                    reachable: true,
                    replicated_format: 2,
                    binary_version: "0.2.0".into(),
                    cluster_version: 1,
                    ..Default::default()
                },
                apb::MetaNodeVersion {
                    id: 2,
                    addr: "http://b:7001".into(),
                    voter: true,
                    reachable: true,
                    replicated_format: 1,
                    binary_version: "0.1.0".into(),
                    cluster_version: 1,
                    apply_blocked_index: 42,
                    ..Default::default()
                },
                apb::MetaNodeVersion {
                    id: 3,
                    addr: "http://c:7001".into(),
                    voter: false,
                    reachable: false,
                    error: "connection refused".into(),
                    ..Default::default()
                },
            ],
        };
        let table = version_table(&v);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "cluster version 1  leader's replicated format 2  (not finalized: sluice admin version finalize)"
        );
        assert!(lines[2].ends_with("  ok"), "{}", lines[2]);
        assert!(lines[2].contains("0.2.0"), "{}", lines[2]);
        assert!(
            lines[3].ends_with("apply stopped at entry 42: needs a newer sluice"),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].contains("learner") && lines[4].ends_with("unreachable: connection refused"),
            "{}",
            lines[4]
        );
        let json = version_json(&v);
        assert_eq!(json["nodes"][1]["apply_blocked_index"], 42);
        assert_eq!(
            json["nodes"][0]["apply_blocked_index"],
            serde_json::Value::Null
        );
        assert_eq!(json["nodes"][2]["error"], "connection refused");
    }
}
