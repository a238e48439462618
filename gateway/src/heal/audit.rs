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
//! asking it.
//!
//! Shards listed missing whose index is still assigned to a live node are
//! re-verified there (`VerifyShards`: present, every block's CRC32C good,
//! the length the placement gives; calls of at most
//! [`sluice_proto::shard::MAX_VERIFY_SHARDS`] shards and
//! [`sluice_proto::shard::MAX_VERIFY_BYTES`], each waited for at most
//! `audit_verify_timeout`; the datanode paces the reads) and the sound ones
//! are un-marked with `ReportPresent`, so a node that was only away keeps
//! its shards instead of heal rebuilding them. Absent, corrupt or unread
//! shards stay missing for heal.
//!
//! [`NodeWatch`] decides when a pass is due besides the timer: a node's
//! `disk_generation` changed, a node crossed `node_down_after`, or such a
//! node is live again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_proto::datanode::{
    HasShardsRequest, ShardId, ShardVerdict, VerifyShard, VerifyShardsRequest,
};
use sluice_proto::meta::{DatanodeInfo, ListPlacementsRequest, ShardRef};
use sluice_proto::shard::{MAX_VERIFY_BYTES, MAX_VERIFY_SHARDS};

use super::HealMeta;
use super::rebuild::HealError;
use crate::blob::BlobStore;
use crate::layout::Layout;

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
    /// Missing shards read through on their live node (`VerifyShards`).
    pub verified: u64,
    /// Shards found sound and un-marked (what `ReportPresent` un-marked).
    pub present_reported: u64,
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
    /// A node that had crossed `node_down_after` is live again: the shards
    /// reported missing on it are worth re-verifying before heal rebuilds
    /// them.
    pub returned: bool,
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
                if self.lost.remove(&d.id) {
                    obs.returned = true;
                }
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

/// Groups a page's shards listed missing by the node their index is still
/// assigned to, with the shape `VerifyShards` checks them against.
pub fn missing_by_node(
    blobs: &[sluice_proto::meta::PlacedBlob],
) -> BTreeMap<u64, Vec<VerifyShard>> {
    let mut by_node: BTreeMap<u64, Vec<VerifyShard>> = BTreeMap::new();
    for b in blobs {
        let Some(p) = &b.placement else { continue };
        if p.missing.is_empty() || p.data_shards == 0 || p.block_size == 0 {
            continue;
        }
        let layout = Layout::new(p.size, p.data_shards as usize, p.block_size as usize);
        for &i in &p.missing {
            let Some(&node) = p.nodes.get(i as usize) else {
                continue;
            };
            by_node.entry(node).or_default().push(VerifyShard {
                blob_id: p.blob_id.clone(),
                shard_index: i,
                block_size: p.block_size,
                payload_bytes: layout.shard_bytes(),
            });
        }
    }
    by_node
}

/// Cuts `shards` into `VerifyShards` calls: at most [`MAX_VERIFY_SHARDS`]
/// shards and, with more than one, [`MAX_VERIFY_BYTES`] of payload each.
pub fn verify_batches(shards: &[VerifyShard]) -> Vec<&[VerifyShard]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, s) in shards.iter().enumerate() {
        let full = i - start == MAX_VERIFY_SHARDS
            || (i > start && bytes.saturating_add(s.payload_bytes) > MAX_VERIFY_BYTES);
        if full {
            out.push(&shards[start..i]);
            start = i;
            bytes = 0;
        }
        bytes = bytes.saturating_add(s.payload_bytes);
    }
    if start < shards.len() {
        out.push(&shards[start..]);
    }
    out
}

/// Has node `node` read `shards` through; returns the sound ones. A call
/// that fails or times out leaves its shards (and the rest) unverified.
async fn sound_on(
    store: &BlobStore,
    node: u64,
    shards: &[VerifyShard],
    timeout: Duration,
) -> Result<Vec<ShardRef>, String> {
    let mut client = store.heal_client(node).map_err(|e| e.to_string())?;
    let mut sound = Vec::new();
    for batch in verify_batches(shards) {
        let req = VerifyShardsRequest {
            shards: batch.to_vec(),
        };
        let verdicts = match tokio::time::timeout(timeout, client.verify_shards(req)).await {
            Ok(Ok(r)) => r.into_inner().verdicts,
            Ok(Err(status)) => return Err(format!("{}: {}", status.code(), status.message())),
            Err(_) => return Err(format!("no answer within {timeout:?}")),
        };
        if verdicts.len() != batch.len() {
            return Err(format!(
                "VerifyShards answered {} verdicts for {} shards",
                verdicts.len(),
                batch.len()
            ));
        }
        for (s, v) in batch.iter().zip(verdicts) {
            if v == ShardVerdict::ShardSound as i32 {
                sound.push(ShardRef {
                    blob_id: s.blob_id.clone(),
                    shard_index: s.shard_index,
                });
            } else {
                tracing::debug!(node, blob_id = %s.blob_id, shard = s.shard_index, verdict = ?ShardVerdict::try_from(v), "audit: missing shard stays missing");
            }
        }
    }
    Ok(sound)
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
/// `watch` says which nodes are lost, `live` which may be asked;
/// `verify_timeout` bounds the wait for each `VerifyShards` answer.
pub async fn audit_pass(
    store: &BlobStore,
    meta: &dyn HealMeta,
    watch: &NodeWatch,
    live: &BTreeSet<u64>,
    verify_timeout: Duration,
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
        verify_missing(
            store,
            meta,
            watch,
            live,
            verify_timeout,
            &page.blobs,
            &mut report,
        )
        .await?;
        match page.blobs.last().and_then(|b| b.placement.as_ref()) {
            Some(p) if page.is_truncated => after = p.blob_id.clone(),
            _ => break,
        }
    }
    Ok(report)
}

/// Re-verifies the page's missing shards on the live nodes their index is
/// still assigned to and un-marks the sound ones.
async fn verify_missing(
    store: &BlobStore,
    meta: &dyn HealMeta,
    watch: &NodeWatch,
    live: &BTreeSet<u64>,
    timeout: Duration,
    blobs: &[sluice_proto::meta::PlacedBlob],
    report: &mut AuditReport,
) -> Result<(), HealError> {
    let asked = missing_by_node(blobs)
        .into_iter()
        .filter(|(node, _)| watch.audit_of(*node, live) == NodeAudit::Ask);
    let checks = futures::stream::iter(asked.map(|(node, shards)| async move {
        let found = sound_on(store, node, &shards, timeout).await;
        (node, shards.len() as u64, found)
    }))
    .buffer_unordered(AUDIT_NODE_CONCURRENCY)
    .collect::<Vec<_>>()
    .await;
    for (node, count, found) in checks {
        let sound = match found {
            Ok(sound) => sound,
            Err(e) => {
                tracing::warn!(node, shards = count, error = %e, "audit: datanode did not verify its missing shards; they stay missing");
                continue;
            }
        };
        report.verified += count;
        if sound.is_empty() {
            continue;
        }
        let n = sound.len();
        let unmarked = meta
            .report_present(node, sound)
            .await
            .map_err(HealError::Meta)?;
        tracing::info!(
            node,
            sound = n,
            unmarked,
            "audit: un-marked missing shards found sound on their node"
        );
        report.present_reported += u64::from(unmarked);
    }
    Ok(())
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
    fn missing_shards_are_asked_of_their_node_in_bounded_calls() {
        use sluice_proto::meta::{PlacedBlob, Placement};
        let blob = |id: &str, size: u64, missing: Vec<u32>| PlacedBlob {
            locator: None,
            placement: Some(Placement {
                blob_id: id.into(),
                size,
                data_shards: 2,
                parity_shards: 1,
                block_size: 10,
                nodes: vec![1, 2, 3],
                missing,
            }),
        };
        // 45 bytes over k = 2 and blocks of 10: stripes of 20, 20 and 5,
        // so every shard holds 10 + 10 + 3 bytes.
        let by = missing_by_node(&[blob("a", 45, vec![0, 2]), blob("b", 45, vec![])]);
        assert_eq!(by.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(by[&3][0].payload_bytes, 23);
        assert_eq!((by[&1][0].shard_index, by[&1][0].block_size), (0, 10));

        let shard = |payload_bytes| VerifyShard {
            payload_bytes,
            ..Default::default()
        };
        let many: Vec<_> = (0..2 * MAX_VERIFY_SHARDS + 1).map(|_| shard(1)).collect();
        let lens: Vec<usize> = verify_batches(&many).iter().map(|b| b.len()).collect();
        assert_eq!(lens, [MAX_VERIFY_SHARDS, MAX_VERIFY_SHARDS, 1]);
        let half = MAX_VERIFY_BYTES / 2;
        let big = [
            shard(half),
            shard(half),
            shard(1),
            shard(3 * half),
            shard(1),
        ];
        let lens: Vec<usize> = verify_batches(&big).iter().map(|b| b.len()).collect();
        assert_eq!(lens, [2, 1, 1, 1], "a shard past the bound goes alone");
        assert!(verify_batches(&[]).is_empty());
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
        assert!(!obs.returned);
        // Back: live again, not lost, and returned (once).
        let obs = watch.observe(&[node(1, true, 0, 1)], t0, down_after);
        assert!(obs.returned);
        assert_eq!(watch.audit_of(1, &BTreeSet::from([1])), NodeAudit::Ask);
        let obs = watch.observe(&[node(1, true, 0, 1)], t0, down_after);
        assert!(!obs.returned);
        // Our own sight of it down counts too (a new leader that has not
        // been leader for long reports a short silence).
        watch.observe(&[node(1, false, 1_000, 1)], t0, down_after);
        let obs = watch.observe(&[node(1, false, 2_000, 1)], t0 + down_after, down_after);
        assert!(obs.newly_lost);
    }
}
