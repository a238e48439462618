//! `Status` (`sluice admin status`): the cluster at a glance, answered by
//! the leader from its Raft metrics, the registry, liveness, open write
//! epochs, the degraded index, heal intents, and the loads datanodes and
//! gateways report ([`Loads`]).

use sluice_util::clock::wall_clock_ms;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::ServerState;
use sluice_meta_client::process_rss;
use sluice_proto::admin as apb;
use sluice_proto::error::not_leader;
use sluice_proto::meta::meta_client::MetaClient as MetaRpcClient;
use sluice_proto::meta::{self as pb};
use tonic::Status;

use crate::liveness::Liveness;
use crate::raft::MetaRaft;
use crate::sm;
use crate::store::{KvStore, Space};

/// Most degraded blobs counted per Status call (the index is scanned in
/// pages up to this; more is reported as "at least").
pub const DEGRADED_COUNT_LIMIT: usize = 100_000;
/// Most heal intents counted per Status call.
pub const HEAL_COUNT_LIMIT: usize = 100_000;
/// Keys read per page while counting.
const COUNT_PAGE: usize = 4096;
/// How long the leader waits for each voter's own ClusterStatus.
const VOTER_TIMEOUT: Duration = Duration::from_secs(1);
/// Most open epochs listed per Status call.
const EPOCH_LIMIT: usize = 10_000;
/// Gateway load entries (one per renewed epoch) kept at most; the oldest
/// are dropped past it.
pub const MAX_GATEWAY_LOADS: usize = 4096;
/// A gateway load entry not refreshed for this long is dropped.
const GATEWAY_LOAD_TTL: Duration = Duration::from_secs(3600);

/// Memory a process reported.
#[derive(Debug, Clone, Copy)]
struct Reported {
    rss: u64,
    budget: u64,
    /// Leader wall clock of the report, ms since the Unix epoch.
    ms: i64,
    at: Instant,
}

impl Reported {
    fn now(rss: u64, budget: u64) -> Self {
        Reported {
            rss,
            budget,
            ms: wall_clock_ms(),
            at: Instant::now(),
        }
    }

    fn to_proto(self) -> apb::ProcessMemory {
        apb::ProcessMemory {
            rss_bytes: self.rss,
            budget_bytes: self.budget,
            reported_ms: self.ms,
        }
    }
}

#[derive(Debug, Clone)]
struct DatanodeLoad {
    credit_in_use: u64,
    write_budget: u64,
    memory: Reported,
    /// Its background workers (a fixed, small set per node).
    workers: Vec<pb::WorkerStatus>,
}

/// A gateway's last renewal report.
#[derive(Debug, Clone)]
struct GatewayLoad {
    memory: Reported,
    requests_total: u64,
    slowdowns_total: u64,
    /// Its background workers (a fixed, small set per gateway).
    workers: Vec<pb::WorkerStatus>,
}

#[derive(Debug, Default)]
struct LoadState {
    /// Datanode id -> its last heartbeat's load. Only registered ids are
    /// recorded (the heartbeat handler registers first), so bounded by the
    /// registry.
    datanodes: HashMap<u64, DatanodeLoad>,
    /// Write epoch -> the load its gateway reported with its last
    /// renewal; at most [`MAX_GATEWAY_LOADS`] entries.
    gateways: HashMap<u64, GatewayLoad>,
}

/// Loads reported with datanode heartbeats and gateway epoch renewals,
/// kept in this node's memory (never in the Raft log; a new leader learns
/// them within one heartbeat or renewal).
#[derive(Debug, Default)]
pub(crate) struct Loads {
    state: Mutex<LoadState>,
}

impl Loads {
    fn lock(&self) -> std::sync::MutexGuard<'_, LoadState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the load of registered datanode `id` (from its heartbeat).
    pub(crate) fn datanode(&self, id: u64, r: &pb::HeartbeatRequest) {
        self.lock().datanodes.insert(
            id,
            DatanodeLoad {
                credit_in_use: r.credit_in_use_bytes,
                write_budget: r.write_budget_bytes,
                memory: Reported::now(r.rss_bytes, r.memory_budget_bytes),
                workers: capped(&r.workers),
            },
        );
    }

    /// Records the load of the gateway renewing `epoch`.
    pub(crate) fn gateway(&self, epoch: u64, report: sluice_meta_client::GatewayReport) {
        let mut s = self.lock();
        s.gateways
            .retain(|_, r| r.memory.at.elapsed() < GATEWAY_LOAD_TTL);
        if s.gateways.len() >= MAX_GATEWAY_LOADS
            && !s.gateways.contains_key(&epoch)
            && let Some(oldest) = s
                .gateways
                .iter()
                .min_by_key(|(_, r)| r.memory.at)
                .map(|(e, _)| *e)
        {
            s.gateways.remove(&oldest);
        }
        s.gateways.insert(
            epoch,
            GatewayLoad {
                memory: Reported::now(report.rss_bytes, report.memory_budget_bytes),
                requests_total: report.requests_total,
                slowdowns_total: report.slowdowns_total,
                workers: capped(&report.workers),
            },
        );
    }
}

/// Workers kept per reporting node (a node runs a fixed set of about
/// three to six; this bounds a misbehaving one).
const MAX_REPORTED_WORKERS: usize = 16;
/// Longest worker name and last error kept, bytes. With
/// [`MAX_GATEWAY_LOADS`] entries the worst case is about
/// 4096 x 16 x 300 B = 20 MiB; a real gateway reports 3 workers.
const MAX_REPORTED_TEXT: usize = 256;

/// At most [`MAX_REPORTED_WORKERS`] of a node's reported workers, names
/// and errors cut to [`MAX_REPORTED_TEXT`].
fn capped(workers: &[pb::WorkerStatus]) -> Vec<pb::WorkerStatus> {
    fn cut(s: &mut String) {
        if s.len() > MAX_REPORTED_TEXT {
            let mut end = MAX_REPORTED_TEXT;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
        }
    }
    workers
        .iter()
        .take(MAX_REPORTED_WORKERS)
        .map(|w| {
            let mut w = w.clone();
            cut(&mut w.name);
            cut(&mut w.last_error);
            cut(&mut w.state);
            w
        })
        .collect()
}

/// Keys of `space` counted up to `limit`; `(count, capped)`.
fn count_keys<K: KvStore>(kv: &K, space: Space, limit: usize) -> Result<(u64, bool), Status> {
    let mut count = 0usize;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let start = match &after {
            Some(k) => Bound::Excluded(k.as_slice()),
            None => Bound::Unbounded,
        };
        let page = kv
            .scan(space, start, Bound::Unbounded, COUNT_PAGE)
            .map_err(|e| Status::internal(format!("reading {space:?}: {e}")))?;
        count += page.len();
        if count >= limit {
            return Ok((limit as u64, true));
        }
        match page.last() {
            Some((k, _)) if page.len() == COUNT_PAGE => after = Some(k.clone()),
            _ => return Ok((count as u64, false)),
        }
    }
}

/// What `Status` needs of the meta node.
pub(crate) struct StatusSources<'a, K: KvStore> {
    pub(crate) node_id: u64,
    pub(crate) raft: &'a MetaRaft,
    pub(crate) kv: &'a K,
    pub(crate) liveness: &'a Liveness,
    pub(crate) loads: &'a Loads,
    /// This node's memory budgets (the sled cache).
    pub(crate) memory_budget: u64,
    /// How this node dials the other voters (mutual TLS as itself).
    pub(crate) transport: &'a sluice_net::Transport,
    /// This node's own background workers.
    pub(crate) workers: &'a sluice_util::worker::Workers,
}

/// A voter's own view, from its `ClusterStatus`.
async fn ask_voter(
    addr: String,
    transport: &sluice_net::Transport,
) -> Option<pb::ClusterStatusResponse> {
    let endpoint = transport.endpoint(&addr, sluice_net::Role::Meta).ok()?;
    let call = async {
        let channel = transport
            .connect(endpoint.connect_timeout(VOTER_TIMEOUT))
            .await
            .ok()?;
        MetaRpcClient::new(channel)
            .cluster_status(pb::ClusterStatusRequest {})
            .await
            .ok()
            .map(tonic::Response::into_inner)
    };
    tokio::time::timeout(VOTER_TIMEOUT, call)
        .await
        .ok()
        .flatten()
}

/// The `Status` answer (on the leader; `NOT_LEADER` elsewhere).
pub(crate) async fn status<K: KvStore>(
    src: StatusSources<'_, K>,
) -> Result<apb::StatusResponse, Status> {
    let (term, applied, last_log, replication, voters) = {
        let metrics = src.raft.metrics();
        let m = metrics.borrow();
        if !(m.state == ServerState::Leader && m.current_leader == Some(src.node_id)) {
            let addr = m
                .current_leader
                .and_then(|id| m.membership_config.membership().get_node(&id))
                .map(|n| n.addr.clone());
            return Err(not_leader(m.current_leader, addr));
        }
        let membership = m.membership_config.membership();
        let voters: Vec<(u64, String)> = membership
            .voter_ids()
            .map(|id| {
                let addr = membership
                    .get_node(&id)
                    .map(|n| n.addr.clone())
                    .unwrap_or_default();
                (id, addr)
            })
            .collect();
        let replication: BTreeMap<u64, u64> = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .filter_map(|(id, log)| log.map(|l| (*id, l.index)))
                    .collect()
            })
            .unwrap_or_default();
        (
            m.current_term,
            m.last_applied.map_or(0, |l| l.index),
            m.last_log_index.unwrap_or(0),
            replication,
            voters,
        )
    };

    // Each voter's own term and applied index, asked in parallel.
    let views = futures::future::join_all(
        voters
            .iter()
            .map(|(_, addr)| ask_voter(addr.clone(), src.transport)),
    )
    .await;
    let mut matched: Vec<u64> = Vec::with_capacity(voters.len());
    let mut voter_status = Vec::with_capacity(voters.len());
    for ((id, addr), view) in voters.iter().zip(views) {
        let is_leader = *id == src.node_id;
        let matched_index = if is_leader {
            Some(last_log)
        } else {
            replication.get(id).copied()
        };
        matched.push(matched_index.unwrap_or(0));
        voter_status.push(apb::MetaVoterStatus {
            id: *id,
            addr: addr.clone(),
            leader: is_leader,
            reachable: view.is_some(),
            term: view.as_ref().map_or(0, |v| v.term),
            applied_index: view.as_ref().map_or(0, |v| v.last_applied_index),
            matched_index,
        });
    }
    // The highest index a majority holds.
    matched.sort_unstable_by(|a, b| b.cmp(a));
    let commit_index = matched.get(matched.len() / 2).copied().unwrap_or(0);

    let registry = sm::list_datanodes(src.kv).map_err(|e| Status::internal(e.to_string()))?;
    let loads = src.loads.lock();
    let datanodes = registry
        .into_iter()
        .map(|d| {
            let l = src.liveness.status(d.id);
            let load = loads.datanodes.get(&d.id);
            let state = if !l.live {
                "down"
            } else if d.draining {
                "draining"
            } else if !l.capacity.writable {
                "full"
            } else {
                "up"
            };
            apb::StatusDatanode {
                id: d.id,
                addr: d.addr,
                state: state.to_string(),
                live: l.live,
                last_heartbeat_ms: l.last_heartbeat_ms,
                writable: l.capacity.writable,
                free_bytes: l.capacity.free_bytes,
                used_bytes: l.capacity.used_bytes,
                credit_in_use_bytes: load.map_or(0, |x| x.credit_in_use),
                write_budget_bytes: load.map_or(0, |x| x.write_budget),
                memory: load.map(|x| x.memory.to_proto()),
                disk_generation: d.disk_generation,
                zone: d.zone,
                host: d.host,
                workers: load.map(|x| x.workers.clone()).unwrap_or_default(),
            }
        })
        .collect();

    // Gateways: open write epochs grouped by the gateway that opened them.
    let open = sm::epochs::list_open(src.kv, None, EPOCH_LIMIT)
        .map_err(|e| Status::internal(e.to_string()))?;
    let mut gateways: BTreeMap<String, apb::GatewayStatus> = BTreeMap::new();
    for (epoch, record) in open {
        let g = gateways
            .entry(record.gateway_id.clone())
            .or_insert_with(|| apb::GatewayStatus {
                gateway_id: record.gateway_id.clone(),
                ..Default::default()
            });
        g.open_epochs.push(epoch);
        g.last_renewed_ms = g.last_renewed_ms.max(record.renewed_ms);
        if let Some(r) = loads.gateways.get(&epoch)
            && g.memory
                .as_ref()
                .is_none_or(|m| m.reported_ms < r.memory.ms)
        {
            g.memory = Some(r.memory.to_proto());
            g.requests_total = r.requests_total;
            g.slowdowns_total = r.slowdowns_total;
            g.workers = r.workers.clone();
        }
    }
    drop(loads);

    let (degraded_blobs, degraded_capped) =
        count_keys(src.kv, Space::Degraded, DEGRADED_COUNT_LIMIT)?;
    let (heals, _) = count_keys(src.kv, Space::HealIntents, HEAL_COUNT_LIMIT)?;
    Ok(apb::StatusResponse {
        leader_id: src.node_id,
        term,
        commit_index,
        applied_index: applied,
        voters: voter_status,
        datanodes,
        gateways: gateways.into_values().collect(),
        degraded_blobs,
        degraded_capped,
        degraded_limit: DEGRADED_COUNT_LIMIT as u64,
        // Two keys per intent (by shard and by epoch; see `sm::heal`).
        heals_in_progress: heals / 2,
        leader_memory: Some(Reported::now(process_rss(), src.memory_budget).to_proto()),
        now_ms: wall_clock_ms(),
        leader_workers: sluice_meta_client::worker_states(&src.workers.snapshot()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_loads_are_bounded() {
        let loads = Loads::default();
        for epoch in 0..(MAX_GATEWAY_LOADS as u64 + 10) {
            loads.gateway(
                epoch,
                sluice_meta_client::GatewayReport {
                    rss_bytes: 1,
                    memory_budget_bytes: 2,
                    requests_total: 3,
                    slowdowns_total: 4,
                    workers: Vec::new(),
                },
            );
        }
        let s = loads.lock();
        assert_eq!(s.gateways.len(), MAX_GATEWAY_LOADS);
        assert!(s.gateways.contains_key(&(MAX_GATEWAY_LOADS as u64 + 9)));
    }

    #[test]
    fn reported_workers_are_bounded() {
        let long = "é".repeat(1000);
        let reported: Vec<pb::WorkerStatus> = (0..40)
            .map(|i| pb::WorkerStatus {
                name: format!("w{i}"),
                state: "failed".into(),
                last_error: long.clone(),
                ..Default::default()
            })
            .collect();
        let kept = capped(&reported);
        assert_eq!(kept.len(), MAX_REPORTED_WORKERS);
        assert_eq!(kept[0].name, "w0");
        assert!(kept.iter().all(|w| w.last_error.len() <= MAX_REPORTED_TEXT));
    }

    #[test]
    fn rss_of_this_process() {
        assert!(process_rss() > 0);
    }
}
