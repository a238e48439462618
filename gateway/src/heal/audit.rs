//! The audit (`docs/design/durability.md` §6, "Audit"): finds shards that
//! vanished (wiped or replaced disk, lost files) and shards on nodes down
//! too long, and reports them missing so the degraded poll heals them.
//!
//! A pass pages every committed blob (`ListPlacements`, one page of at
//! most [`AUDIT_PAGE`] blobs in memory at a time), groups the page's
//! shards by node, asks each live node `HasShards` (at most
//! [`HAS_SHARDS_BATCH`] per call, [`AUDIT_NODE_CONCURRENCY`] nodes at
//! once) and reports the absent ones with `ReportMissing`. Every shard of
//! a node down longer than `node_down_after` is reported missing without
//! asking it. Shards already missing are not checked again.
//!
//! [`NodeWatch`] decides when a pass is due besides the timer: a node's
//! `disk_generation` changed, or a node crossed `node_down_after`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_proto::datanode::{HasShardsRequest, ShardId};
use sluice_proto::meta::{DatanodeInfo, ListPlacementsRequest, ShardRef};

use super::HealMeta;
use super::rebuild::HealError;
use crate::blob::BlobStore;

/// Blobs per `ListPlacements` page of an audit pass.
pub const AUDIT_PAGE: u32 = 1000;
/// Shards per `HasShards` call (the datanode's limit).
pub const HAS_SHARDS_BATCH: usize = 1000;
/// Nodes asked at once during an audit page.
pub const AUDIT_NODE_CONCURRENCY: usize = 4;
/// Timeout of one `HasShards` call.
pub const HAS_SHARDS_TIMEOUT: Duration = Duration::from_secs(30);

/// What one audit pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Blobs paged.
    pub blobs: u64,
    /// Shards checked with `HasShards` or judged by a long-down node.
    pub shards_checked: u64,
    /// Shards reported missing (what `ReportMissing` marked).
    pub missing_reported: u64,
    /// Shards not checked because their node was unreachable.
    pub unchecked: u64,
}

/// How the audit treats a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAudit {
    /// Live: ask it `HasShards`.
    Ask,
    /// Down longer than `node_down_after`: every shard is missing.
    Lost,
    /// Down for less: leave its shards alone this pass.
    Skip,
}

/// Per-node memory of the heal worker between two looks at the datanode
/// set: the last `disk_generation` and when the node was first seen down.
/// Bounded by the cluster size (entries of nodes no longer listed are
/// dropped on every look).
#[derive(Debug, Default)]
pub struct NodeWatch {
    generations: HashMap<u64, u64>,
    down_since: HashMap<u64, Instant>,
    /// Nodes already counted as down past the threshold (an audit ran for
    /// them); cleared when they come back.
    lost: BTreeSet<u64>,
}

/// What a look at the datanode set found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// A known node's `disk_generation` differs from the last look.
    pub generation_changed: bool,
    /// A node crossed `node_down_after` since the last look.
    pub newly_lost: bool,
}

impl NodeWatch {
    /// Records `infos` seen at `now` (monotonic). A node is down past the
    /// threshold when the meta leader has not heard from it for
    /// `down_after` (`silent_ms`, the leader's monotonic clock) or we first
    /// saw it down that long ago (ours), whichever says longer. No two
    /// machines' wall clocks are compared: a skewed clock cannot make an
    /// ordinary restart look like a loss.
    pub fn observe(
        &mut self,
        infos: &[DatanodeInfo],
        now: Instant,
        down_after: Duration,
    ) -> Observation {
        let mut obs = Observation::default();
        let listed: BTreeSet<u64> = infos.iter().map(|d| d.id).collect();
        self.generations.retain(|id, _| listed.contains(id));
        self.down_since.retain(|id, _| listed.contains(id));
        self.lost.retain(|id| listed.contains(id));
        for d in infos {
            if let Some(old) = self.generations.insert(d.id, d.disk_generation)
                && old != d.disk_generation
            {
                obs.generation_changed = true;
            }
            if d.live {
                self.down_since.remove(&d.id);
                self.lost.remove(&d.id);
                continue;
            }
            let since = *self.down_since.entry(d.id).or_insert(now);
            let ours = now.saturating_duration_since(since);
            let theirs = Duration::from_millis(d.silent_ms);
            if ours.max(theirs) >= down_after && self.lost.insert(d.id) {
                obs.newly_lost = true;
            }
        }
        obs
    }

    /// How the audit treats node `id` (unknown nodes are skipped).
    pub fn audit_of(&self, id: u64, live: &BTreeSet<u64>) -> NodeAudit {
        if self.lost.contains(&id) {
            NodeAudit::Lost
        } else if live.contains(&id) {
            NodeAudit::Ask
        } else {
            NodeAudit::Skip
        }
    }
}

/// Groups a page's shards by node, leaving out shards already missing.
pub fn shards_by_node(blobs: &[sluice_proto::meta::PlacedBlob]) -> BTreeMap<u64, Vec<ShardRef>> {
    let mut by_node: BTreeMap<u64, Vec<ShardRef>> = BTreeMap::new();
    for b in blobs {
        let Some(p) = &b.placement else { continue };
        for (i, &node) in p.nodes.iter().enumerate() {
            if p.missing.contains(&(i as u32)) {
                continue;
            }
            by_node.entry(node).or_default().push(ShardRef {
                blob_id: p.blob_id.clone(),
                shard_index: i as u32,
            });
        }
    }
    by_node
}

/// Asks node `node` which of `shards` it holds; returns the absent ones.
async fn absent_on(
    store: &BlobStore,
    node: u64,
    shards: &[ShardRef],
) -> Result<Vec<ShardRef>, String> {
    let mut client = store.heal_client(node).map_err(|e| e.to_string())?;
    let mut absent = Vec::new();
    for batch in shards.chunks(HAS_SHARDS_BATCH) {
        let req = HasShardsRequest {
            shards: batch
                .iter()
                .map(|s| ShardId {
                    blob_id: s.blob_id.clone(),
                    shard_index: s.shard_index,
                })
                .collect(),
        };
        let present = match tokio::time::timeout(HAS_SHARDS_TIMEOUT, client.has_shards(req)).await {
            Ok(Ok(r)) => r.into_inner().present,
            Ok(Err(status)) => return Err(format!("{}: {}", status.code(), status.message())),
            Err(_) => return Err(format!("no answer within {HAS_SHARDS_TIMEOUT:?}")),
        };
        if present.len() != batch.len() {
            return Err(format!(
                "HasShards answered {} flags for {} shards",
                present.len(),
                batch.len()
            ));
        }
        absent.extend(
            batch
                .iter()
                .zip(present)
                .filter(|(_, p)| !p)
                .map(|(s, _)| s.clone()),
        );
    }
    Ok(absent)
}

/// One audit pass over every committed blob (see the module doc).
/// `watch` says which nodes are lost, `live` which may be asked.
pub async fn audit_pass(
    store: &BlobStore,
    meta: &dyn HealMeta,
    watch: &NodeWatch,
    live: &BTreeSet<u64>,
) -> Result<AuditReport, HealError> {
    let mut report = AuditReport::default();
    let mut after = String::new();
    loop {
        let page = meta
            .list_placements(ListPlacementsRequest {
                after_blob_id: after.clone(),
                limit: AUDIT_PAGE,
                degraded_only: false,
            })
            .await
            .map_err(HealError::Meta)?;
        report.blobs += page.blobs.len() as u64;
        let by_node = shards_by_node(&page.blobs);
        let checks = futures::stream::iter(by_node.into_iter().map(|(node, shards)| async move {
            let count = shards.len() as u64;
            let found = match watch.audit_of(node, live) {
                NodeAudit::Skip => Ok(None),
                NodeAudit::Lost => Ok(Some(shards)),
                NodeAudit::Ask => absent_on(store, node, &shards).await.map(Some),
            };
            (node, count, found)
        }))
        .buffer_unordered(AUDIT_NODE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
        for (node, count, found) in checks {
            match found {
                Ok(None) => report.unchecked += count,
                Err(e) => {
                    tracing::warn!(node, shards = count, error = %e, "audit: datanode did not answer HasShards");
                    report.unchecked += count;
                }
                Ok(Some(absent)) => {
                    report.shards_checked += count;
                    if absent.is_empty() {
                        continue;
                    }
                    let n = absent.len();
                    let marked = meta
                        .report_missing(node, absent)
                        .await
                        .map_err(HealError::Meta)?;
                    tracing::debug!(node, absent = n, marked, "audit: reported missing shards");
                    report.missing_reported += u64::from(marked);
                }
            }
        }
        match page.blobs.last().and_then(|b| b.placement.as_ref()) {
            Some(p) if page.is_truncated => after = p.blob_id.clone(),
            _ => break,
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, live: bool, silent_ms: u64, last_heartbeat_ms: i64) -> DatanodeInfo {
        DatanodeInfo {
            id,
            live,
            silent_ms,
            last_heartbeat_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_node_is_lost_by_the_leaders_monotonic_silence_not_wall_clocks() {
        let down_after = Duration::from_secs(600);
        let mut watch = NodeWatch::default();
        let t0 = Instant::now();
        // Node 1's last heartbeat is stamped a day ago by the leader's wall
        // clock (a gateway clock far ahead reads it that way), but the
        // leader heard it 5 s ago: not lost.
        let obs = watch.observe(&[node(1, false, 5_000, 1)], t0, down_after);
        assert!(!obs.newly_lost);
        assert_eq!(watch.audit_of(1, &BTreeSet::new()), NodeAudit::Skip);
        // The leader has not heard it for 600 s: lost, once.
        let obs = watch.observe(&[node(1, false, 600_000, 1)], t0, down_after);
        assert!(obs.newly_lost);
        assert_eq!(watch.audit_of(1, &BTreeSet::new()), NodeAudit::Lost);
        let obs = watch.observe(&[node(1, false, 601_000, 1)], t0, down_after);
        assert!(!obs.newly_lost, "already lost");
        // Back: live again, not lost.
        watch.observe(&[node(1, true, 0, 1)], t0, down_after);
        assert_eq!(watch.audit_of(1, &BTreeSet::from([1])), NodeAudit::Ask);
        // Our own sight of it down counts too (a new leader that has not
        // been leader for long reports a short silence).
        watch.observe(&[node(1, false, 1_000, 1)], t0, down_after);
        let obs = watch.observe(&[node(1, false, 2_000, 1)], t0 + down_after, down_after);
        assert!(obs.newly_lost);
    }
}
