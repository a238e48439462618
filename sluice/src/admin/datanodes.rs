//! `sluice admin datanode list|drain N|undrain N|remove N [--force]`.
//!
//! * `list`: every registered datanode with zone/host, state (up/down,
//!   draining, drained, full), free/used bytes and the shards committed
//!   placements put on it; `--json` prints the same as JSON.
//! * `drain N`: marks N draining: no new shards go to it and the gateways'
//!   heal workers move every shard off it. `list` shows it `drained` when
//!   no placement names it any more; then stop it and `remove` it.
//! * `remove N`: deletes N from the registry. Refused while N is running
//!   or any placement still puts a shard on it; `--force` (a node gone
//!   for good) removes it anyway when every blob it holds is still
//!   readable from k other shards, marking its shards missing for heal.

use clap::Subcommand;
use serde::Serialize;
use sluice_proto::admin::admin_client::AdminClient;
use sluice_proto::admin::{
    DatanodeStatus, DrainDatanodeRequest, ListDatanodesRequest, RemoveDatanodeRequest,
};

use super::{AdminConn, connect};

/// `sluice admin datanode ...`.
#[derive(Subcommand, Debug)]
pub enum DatanodeCommand {
    /// Every datanode: labels, state, capacity, placed shards.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Mark a datanode draining: its shards move to other nodes.
    Drain { id: u64 },
    /// Clear the draining mark.
    Undrain { id: u64 },
    /// Remove a datanode from the registry (stop it first).
    Remove {
        id: u64,
        /// The node is gone for good: remove it although placements still
        /// name it, when every blob stays readable (its shards are rebuilt
        /// by heal).
        #[arg(long)]
        force: bool,
    },
}

/// One row of `list` (also its JSON shape).
#[derive(Debug, Serialize, PartialEq)]
pub struct Row {
    pub id: u64,
    pub addr: String,
    pub zone: String,
    pub host: String,
    /// `up` or `down`.
    pub state: &'static str,
    pub draining: bool,
    /// Draining and no placement names it: removable.
    pub drained: bool,
    pub writable: bool,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub placed_shards: u64,
    pub last_heartbeat_ms: i64,
}

impl Row {
    fn from_status(s: &DatanodeStatus) -> Row {
        let d = s.info.clone().unwrap_or_default();
        Row {
            id: d.id,
            addr: d.addr,
            zone: d.zone,
            host: d.host,
            state: if d.live { "up" } else { "down" },
            draining: d.draining,
            drained: s.drained,
            writable: d.writable,
            free_bytes: d.free_bytes,
            used_bytes: d.used_bytes,
            placed_shards: s.placed_shards,
            last_heartbeat_ms: d.last_heartbeat_ms,
        }
    }

    /// The state column: up/down, then draining/drained and full.
    fn state_text(&self) -> String {
        let mut s = self.state.to_string();
        if self.drained {
            s.push_str(",drained");
        } else if self.draining {
            s.push_str(",draining");
        }
        if !self.writable {
            s.push_str(",full");
        }
        s
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The human table of `rows`.
pub fn table(rows: &[Row]) -> String {
    let mut lines = vec![[
        "ID".to_string(),
        "ZONE".into(),
        "HOST".into(),
        "STATE".into(),
        "FREE".into(),
        "USED".into(),
        "SHARDS".into(),
        "ADDR".into(),
    ]];
    for r in rows {
        lines.push([
            r.id.to_string(),
            if r.zone.is_empty() {
                "-".into()
            } else {
                r.zone.clone()
            },
            if r.host.is_empty() {
                "-".into()
            } else {
                r.host.clone()
            },
            r.state_text(),
            human_bytes(r.free_bytes),
            human_bytes(r.used_bytes),
            r.placed_shards.to_string(),
            r.addr.clone(),
        ]);
    }
    let mut widths = [0usize; 8];
    for l in &lines {
        for (w, c) in widths.iter_mut().zip(l) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Runs one `sluice admin datanode` subcommand.
pub async fn run(conn: &AdminConn, command: DatanodeCommand) -> anyhow::Result<()> {
    let meta = connect(conn)?;
    match command {
        DatanodeCommand::List { json } => {
            let resp = meta
                .call_on("ListDatanodes", |c| async move {
                    AdminClient::new(c)
                        .list_datanodes(ListDatanodesRequest {})
                        .await
                })
                .await?;
            let rows: Vec<Row> = resp.datanodes.iter().map(Row::from_status).collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", table(&rows));
            }
        }
        DatanodeCommand::Drain { id } | DatanodeCommand::Undrain { id } => {
            let undrain = matches!(command, DatanodeCommand::Undrain { .. });
            let op_id = new_op_id();
            let resp = meta
                .call_on("DrainDatanode", |c| {
                    let req = DrainDatanodeRequest {
                        id,
                        undrain,
                        op_id: op_id.clone(),
                    };
                    async move { AdminClient::new(c).drain_datanode(req).await }
                })
                .await?;
            if undrain {
                println!("datanode {id} no longer draining");
            } else {
                println!(
                    "datanode {id} draining: {} shards to move (see `sluice admin datanode list`)",
                    resp.placed_shards
                );
            }
        }
        DatanodeCommand::Remove { id, force } => {
            let op_id = new_op_id();
            let resp = meta
                .call_on("RemoveDatanode", |c| {
                    let req = RemoveDatanodeRequest {
                        id,
                        force,
                        op_id: op_id.clone(),
                    };
                    async move { AdminClient::new(c).remove_datanode(req).await }
                })
                .await?;
            if resp.marked_missing > 0 {
                println!(
                    "datanode {id} removed; {} of its shards marked missing, heal rebuilds them",
                    resp.marked_missing
                );
            } else {
                println!("datanode {id} removed");
            }
        }
    }
    Ok(())
}

/// A fresh operation id: a retry of the same call is applied once.
fn new_op_id() -> String {
    use rand::Rng;
    format!("admin-{:032x}", rand::thread_rng().r#gen::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::meta::DatanodeInfo;

    #[test]
    fn rows_and_table() {
        let s = DatanodeStatus {
            info: Some(DatanodeInfo {
                id: 3,
                addr: "http://10.0.0.3:7101".into(),
                live: true,
                zone: "a".into(),
                host: "s1".into(),
                draining: true,
                writable: true,
                free_bytes: 3 << 30,
                used_bytes: 1024,
                ..Default::default()
            }),
            placed_shards: 0,
            drained: true,
        };
        let row = Row::from_status(&s);
        assert_eq!(row.state_text(), "up,drained");
        let t = table(&[row]);
        assert!(t.starts_with("ID  ZONE  HOST  STATE"), "{t}");
        assert!(
            t.contains(
                "3   a     s1    up,drained  3.0 GiB  1.0 KiB  0       http://10.0.0.3:7101"
            ),
            "{t}"
        );
        let json = serde_json::to_value(Row::from_status(&s)).expect("json");
        assert_eq!(json["drained"], true);
        assert_eq!(json["zone"], "a");
    }
}
