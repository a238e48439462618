//! `sluice admin status [--json]`: the cluster at a glance, from the
//! leader's `sluice.admin.Admin/Status` (see `proto/proto/admin.proto`):
//! meta voters (leader, term, commit and applied index), datanodes (zone,
//! host, state, space, credit in use, memory), gateways (open write epochs,
//! memory), degraded blobs and heals in progress, the leader's memory, and
//! every node's background workers (state, passes, last error).
//!
//! `--json` prints one JSON object ([`StatusJson`]); the field names are
//! stable for scripts.

use clap::Args;
use serde::Serialize;
use sluice_meta_client::MetaClient;
use sluice_proto::admin::admin_client::AdminClient;
use sluice_proto::admin::{MetaVoterStatus, ProcessMemory, StatusRequest, StatusResponse};
use sluice_proto::meta::WorkerStatus;

use super::AdminConn;

/// `sluice admin status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub conn: AdminConn,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Asks the leader for the cluster status.
pub async fn fetch(meta: &MetaClient) -> anyhow::Result<StatusResponse> {
    Ok(meta
        .call_on("Status", |channel| async move {
            AdminClient::new(channel).status(StatusRequest {}).await
        })
        .await?)
}

/// Runs `sluice admin status`.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let meta = super::connect(&args.conn)?;
    let status = fetch(&meta).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&StatusJson::from(&status))?
        );
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

/// Process memory in the JSON output.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct MemoryJson {
    pub rss_bytes: u64,
    pub budget_bytes: u64,
    pub reported_ms: i64,
}

impl MemoryJson {
    fn from(m: Option<&ProcessMemory>) -> Option<MemoryJson> {
        m.filter(|m| m.reported_ms != 0).map(|m| MemoryJson {
            rss_bytes: m.rss_bytes,
            budget_bytes: m.budget_bytes,
            reported_ms: m.reported_ms,
        })
    }
}

/// A background worker in the JSON output.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct WorkerJson {
    pub name: String,
    /// `running`, `idle`, `failed` or `stopped`.
    pub state: String,
    pub iterations: u64,
    pub last_error: Option<String>,
    /// When `last_error` was reported (the node's clock, ms since the Unix epoch).
    pub last_error_at_ms: Option<i64>,
}

impl WorkerJson {
    fn list(workers: &[WorkerStatus]) -> Vec<WorkerJson> {
        workers
            .iter()
            .map(|w| WorkerJson {
                name: w.name.clone(),
                state: w.state.clone(),
                iterations: w.iterations,
                last_error: non_empty(&w.last_error),
                last_error_at_ms: (w.last_error_at_ms != 0).then_some(w.last_error_at_ms),
            })
            .collect()
    }
}

/// A meta voter in the JSON output.
#[derive(Debug, Serialize)]
pub struct VoterJson {
    pub id: u64,
    pub addr: String,
    pub leader: bool,
    pub reachable: bool,
    pub term: u64,
    pub applied_index: u64,
    pub matched_index: Option<u64>,
}

/// A datanode in the JSON output.
#[derive(Debug, Serialize)]
pub struct DatanodeJson {
    pub id: u64,
    pub addr: String,
    pub zone: Option<String>,
    pub host: Option<String>,
    /// `up`, `down` or `full`.
    pub state: String,
    /// Last heartbeat (ms since the Unix epoch) when down; `None` if never seen by this leader.
    pub down_since_ms: Option<i64>,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub credit_in_use_bytes: u64,
    pub write_budget_bytes: u64,
    pub disk_generation: u64,
    pub memory: Option<MemoryJson>,
    pub workers: Vec<WorkerJson>,
}

/// A gateway in the JSON output.
#[derive(Debug, Serialize)]
pub struct GatewayJson {
    pub id: String,
    pub open_epochs: Vec<u64>,
    pub last_renewed_ms: i64,
    pub memory: Option<MemoryJson>,
    /// S3 requests answered and `503 SlowDown` answers since the gateway
    /// process started (as of its last renewal).
    pub requests_total: u64,
    pub slowdowns_total: u64,
    pub workers: Vec<WorkerJson>,
}

/// `sluice admin status --json`.
#[derive(Debug, Serialize)]
pub struct StatusJson {
    pub leader_id: u64,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub voters: Vec<VoterJson>,
    pub datanodes: Vec<DatanodeJson>,
    pub gateways: Vec<GatewayJson>,
    pub degraded_blobs: u64,
    /// `true` when there are more degraded blobs than were counted.
    pub degraded_blobs_at_least: bool,
    pub heals_in_progress: u64,
    pub leader_memory: Option<MemoryJson>,
    /// The answering meta node's (the leader's) own workers.
    pub leader_workers: Vec<WorkerJson>,
    pub now_ms: i64,
}

pub(crate) fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl From<&StatusResponse> for StatusJson {
    fn from(s: &StatusResponse) -> Self {
        StatusJson {
            leader_id: s.leader_id,
            term: s.term,
            commit_index: s.commit_index,
            applied_index: s.applied_index,
            voters: s
                .voters
                .iter()
                .map(|v| VoterJson {
                    id: v.id,
                    addr: v.addr.clone(),
                    leader: v.leader,
                    reachable: v.reachable,
                    term: v.term,
                    applied_index: v.applied_index,
                    matched_index: v.matched_index,
                })
                .collect(),
            datanodes: s
                .datanodes
                .iter()
                .map(|d| DatanodeJson {
                    id: d.id,
                    addr: d.addr.clone(),
                    zone: non_empty(&d.zone),
                    host: non_empty(&d.host),
                    state: d.state.clone(),
                    down_since_ms: (!d.live && d.last_heartbeat_ms != 0)
                        .then_some(d.last_heartbeat_ms),
                    free_bytes: d.free_bytes,
                    used_bytes: d.used_bytes,
                    credit_in_use_bytes: d.credit_in_use_bytes,
                    write_budget_bytes: d.write_budget_bytes,
                    disk_generation: d.disk_generation,
                    memory: MemoryJson::from(d.memory.as_ref()),
                    workers: WorkerJson::list(&d.workers),
                })
                .collect(),
            gateways: s
                .gateways
                .iter()
                .map(|g| GatewayJson {
                    id: g.gateway_id.clone(),
                    open_epochs: g.open_epochs.clone(),
                    last_renewed_ms: g.last_renewed_ms,
                    memory: MemoryJson::from(g.memory.as_ref()),
                    requests_total: g.requests_total,
                    slowdowns_total: g.slowdowns_total,
                    workers: WorkerJson::list(&g.workers),
                })
                .collect(),
            degraded_blobs: s.degraded_blobs,
            degraded_blobs_at_least: s.degraded_capped,
            heals_in_progress: s.heals_in_progress,
            leader_memory: MemoryJson::from(s.leader_memory.as_ref()),
            leader_workers: WorkerJson::list(&s.leader_workers),
            now_ms: s.now_ms,
        }
    }
}

/// `1.5 GiB`-style sizes.
pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `rss / budget`, or `-` when not reported.
fn memory(m: Option<&ProcessMemory>) -> String {
    match m.filter(|m| m.reported_ms != 0) {
        Some(m) => format!("{} / {}", size(m.rss_bytes), size(m.budget_bytes)),
        None => "-".to_string(),
    }
}

/// How long ago `ms` was, relative to `now_ms`.
pub(crate) fn ago(now_ms: i64, ms: i64) -> String {
    let secs = (now_ms - ms).max(0) / 1000;
    match secs {
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s => format!("{}h ago", s / 3600),
    }
}

/// Left-aligned columns separated by two spaces.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(header.iter().map(|h| h.to_string()).collect(), &mut out);
    for row in rows {
        line(row, &mut out);
    }
    out
}

/// A voter's role (`leader`, `follower`, `unreachable`), term, applied
/// index and matched index as table cells (`-` where unknown).
pub(crate) fn voter_cells(v: &MetaVoterStatus) -> [String; 4] {
    let role = if v.leader {
        "leader"
    } else if v.reachable {
        "follower"
    } else {
        "unreachable"
    };
    let known = |n: u64| {
        if v.reachable {
            n.to_string()
        } else {
            "-".into()
        }
    };
    [
        role.to_string(),
        known(v.term),
        known(v.applied_index),
        v.matched_index.map_or("-".into(), |m| m.to_string()),
    ]
}

/// The human-readable status.
pub fn render(s: &StatusResponse) -> String {
    let mut out = format!(
        "meta: leader {}, term {}, commit index {}, applied index {}, memory {}\n",
        s.leader_id,
        s.term,
        s.commit_index,
        s.applied_index,
        memory(s.leader_memory.as_ref())
    );
    out.push_str(&table(
        &["VOTER", "ADDR", "ROLE", "TERM", "APPLIED", "MATCHED"],
        s.voters
            .iter()
            .map(|v| {
                let [role, term, applied, matched] = voter_cells(v);
                vec![
                    v.id.to_string(),
                    v.addr.clone(),
                    role.to_string(),
                    term,
                    applied,
                    matched,
                ]
            })
            .collect(),
    ));
    out.push('\n');
    out.push_str(&table(
        &[
            "DATANODE",
            "ZONE",
            "HOST",
            "STATE",
            "USED",
            "FREE",
            "CREDIT IN USE",
            "MEMORY",
            "ADDR",
        ],
        s.datanodes
            .iter()
            .map(|d| {
                let state = if !d.live && d.last_heartbeat_ms != 0 {
                    format!(
                        "{} (last seen {})",
                        d.state,
                        ago(s.now_ms, d.last_heartbeat_ms)
                    )
                } else {
                    d.state.clone()
                };
                vec![
                    d.id.to_string(),
                    non_empty(&d.zone).unwrap_or_else(|| "-".into()),
                    non_empty(&d.host).unwrap_or_else(|| "-".into()),
                    state,
                    size(d.used_bytes),
                    size(d.free_bytes),
                    format!(
                        "{} / {}",
                        size(d.credit_in_use_bytes),
                        size(d.write_budget_bytes)
                    ),
                    memory(d.memory.as_ref()),
                    d.addr.clone(),
                ]
            })
            .collect(),
    ));
    out.push('\n');
    if s.gateways.is_empty() {
        out.push_str("gateways: none with an open write epoch\n");
    } else {
        out.push_str(&table(
            &[
                "GATEWAY",
                "OPEN EPOCHS",
                "LAST RENEWAL",
                "MEMORY",
                "REQUESTS",
                "SLOWDOWNS",
            ],
            s.gateways
                .iter()
                .map(|g| {
                    vec![
                        g.gateway_id.clone(),
                        g.open_epochs
                            .iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join(","),
                        ago(s.now_ms, g.last_renewed_ms),
                        memory(g.memory.as_ref()),
                        g.requests_total.to_string(),
                        g.slowdowns_total.to_string(),
                    ]
                })
                .collect(),
        ));
    }
    let workers = worker_rows(s);
    if !workers.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &["NODE", "WORKER", "STATE", "PASSES", "LAST ERROR"],
            workers,
        ));
    }
    out.push_str(&format!(
        "\ndegraded blobs: {}{}; heals in progress: {}\n",
        if s.degraded_capped { "at least " } else { "" },
        s.degraded_blobs,
        s.heals_in_progress
    ));
    out
}

/// One row per background worker: the leader's (`meta <id>`), each
/// datanode's (`datanode <id>`) and each gateway's (`gateway <id>`); the
/// last error with how long ago it was reported, `-` if none.
pub(crate) fn worker_rows(s: &StatusResponse) -> Vec<Vec<String>> {
    let row = |node: &str, w: &WorkerStatus| {
        let error = if w.last_error.is_empty() {
            "-".to_string()
        } else {
            format!("{} ({})", w.last_error, ago(s.now_ms, w.last_error_at_ms))
        };
        vec![
            node.to_string(),
            w.name.clone(),
            w.state.clone(),
            w.iterations.to_string(),
            error,
        ]
    };
    let mut rows = Vec::new();
    let meta = format!("meta {}", s.leader_id);
    rows.extend(s.leader_workers.iter().map(|w| row(&meta, w)));
    for d in &s.datanodes {
        let node = format!("datanode {}", d.id);
        rows.extend(d.workers.iter().map(|w| row(&node, w)));
    }
    for g in &s.gateways {
        let node = format!("gateway {}", g.gateway_id);
        rows.extend(g.workers.iter().map(|w| row(&node, w)));
    }
    rows
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sluice_proto::admin::{GatewayStatus, MetaVoterStatus, StatusDatanode};

    pub(crate) fn sample() -> StatusResponse {
        StatusResponse {
            leader_id: 1,
            term: 3,
            commit_index: 40,
            applied_index: 40,
            voters: vec![
                MetaVoterStatus {
                    id: 1,
                    addr: "http://m1:7000".into(),
                    leader: true,
                    reachable: true,
                    term: 3,
                    applied_index: 40,
                    matched_index: Some(40),
                },
                MetaVoterStatus {
                    id: 2,
                    addr: "http://m2:7000".into(),
                    leader: false,
                    reachable: false,
                    term: 0,
                    applied_index: 0,
                    matched_index: Some(38),
                },
            ],
            datanodes: vec![
                StatusDatanode {
                    id: 7,
                    addr: "http://d7:7101".into(),
                    state: "down".into(),
                    live: false,
                    last_heartbeat_ms: 1_000_000 - 90_000,
                    zone: "a".into(),
                    used_bytes: 3 << 30,
                    ..Default::default()
                },
                StatusDatanode {
                    id: 8,
                    addr: "http://d8:7101".into(),
                    state: "up".into(),
                    live: true,
                    writable: true,
                    credit_in_use_bytes: 1 << 20,
                    write_budget_bytes: 64 << 20,
                    memory: Some(ProcessMemory {
                        rss_bytes: 100 << 20,
                        budget_bytes: 64 << 20,
                        reported_ms: 999_000,
                    }),
                    ..Default::default()
                },
            ],
            gateways: vec![GatewayStatus {
                gateway_id: "gw-1".into(),
                open_epochs: vec![4, 5],
                last_renewed_ms: 995_000,
                memory: None,
                requests_total: 120,
                slowdowns_total: 3,
                workers: vec![WorkerStatus {
                    name: "epoch-renewal".into(),
                    state: "running".into(),
                    iterations: 40,
                    ..Default::default()
                }],
            }],
            degraded_blobs: 2,
            degraded_capped: false,
            degraded_limit: 100_000,
            heals_in_progress: 1,
            leader_memory: None,
            leader_workers: vec![WorkerStatus {
                name: "reclaimer".into(),
                state: "failed".into(),
                last_error: "reclaim pass stopped: no quorum".into(),
                last_error_at_ms: 1_000_000 - 30_000,
                iterations: 7,
            }],
            now_ms: 1_000_000,
        }
    }

    #[test]
    fn renders_tables() {
        let text = render(&sample());
        assert!(
            text.starts_with(
                "meta: leader 1, term 3, commit index 40, applied index 40, memory -\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("\n2      http://m2:7000  unreachable  -     -        38\n"),
            "{text}"
        );
        assert!(text.contains("down (last seen 90s ago)"), "{text}");
        assert!(text.contains("1.0 MiB / 64.0 MiB"), "{text}");
        assert!(text.contains("100.0 MiB / 64.0 MiB"), "{text}");
        assert!(text.contains("gw-1     4,5"), "{text}");
        assert!(text.contains("-       120       3\n"), "{text}");
        assert!(
            text.ends_with("\ndegraded blobs: 2; heals in progress: 1\n"),
            "{text}"
        );
        assert!(
            text.contains("\nmeta 1        reclaimer      failed   7       reclaim pass stopped: no quorum (30s ago)\n"),
            "{text}"
        );
        assert!(
            text.contains("\ngateway gw-1  epoch-renewal  running  40      -\n"),
            "{text}"
        );
    }

    #[test]
    fn json_names_states_and_labels() {
        let json = serde_json::to_value(StatusJson::from(&sample())).unwrap();
        assert_eq!(json["gateways"][0]["requests_total"], 120);
        assert_eq!(json["gateways"][0]["slowdowns_total"], 3);
        assert_eq!(json["datanodes"][0]["state"], "down");
        assert_eq!(json["datanodes"][0]["down_since_ms"], 910_000);
        assert_eq!(json["datanodes"][0]["zone"], "a");
        assert!(json["datanodes"][0]["host"].is_null());
        assert!(json["datanodes"][1]["down_since_ms"].is_null());
        assert_eq!(json["datanodes"][1]["memory"]["rss_bytes"], 100u64 << 20);
        assert_eq!(json["voters"][1]["reachable"], false);
        assert_eq!(json["gateways"][0]["open_epochs"][1], 5);
        assert_eq!(json["gateways"][0]["workers"][0]["name"], "epoch-renewal");
        assert!(json["gateways"][0]["workers"][0]["last_error"].is_null());
        assert_eq!(json["leader_workers"][0]["state"], "failed");
        assert_eq!(json["leader_workers"][0]["last_error_at_ms"], 970_000);
    }
}
