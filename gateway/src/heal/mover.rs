//! The mover: drain and rebalance, run by the heal worker after each heal
//! pass, through the same rebuild + `UpdatePlacement` compare-and-set path
//! ([`rebuild::rebuild_onto`]) and so within the same credits and buffer
//! budget.
//!
//! A pass pages every committed blob (`ListPlacements`, one page of at most
//! [`MOVE_PAGE`] blobs in memory at a time) and handles one blob at a time:
//!
//! * *Drain*: every shard on a draining node moves to a node chosen like a
//!   heal target ([`rebuild::choose_moves`]: same domain caps, never a
//!   draining node). The draining node is still read as a source. Drain
//!   writes go through the heal gate (`heal_bandwidth_bytes_per_sec`).
//!   Meta reports the node `drained` once no placement names it.
//! * *Rebalance* (when `rebalance_bandwidth_bytes_per_sec > 0`): the blob's
//!   placement is compared, as a set, with what [`placement::place`] gives
//!   its placement key over the nodes accepting shards now. When they
//!   differ, ONE shard moves from a node not in the wanted set to the
//!   best-ranked wanted node not holding one, if the move keeps the blob
//!   within the domain caps. Repeated passes converge; a new datanode
//!   receives about its share. Rebalance writes go through their own gate
//!   at the rebalance rate.
//!
//! [`MoveTrigger`] decides when a pass runs, so a settled cluster is not
//! scanned over and over: while a node is draining, when the datanode set
//! changed (ids, labels, liveness, draining, weight classes) since the
//! last pass, and again after a pass that moved or failed to move
//! something.
//!
//! Blobs with missing shards or a node that is not live are left to heal,
//! and rebalancing pauses while any registered datanode that is not
//! draining is down: a short outage must not move data toward the smaller
//! cluster's (weaker) placement. A node gone for good blocks rebalancing
//! until it is removed (`sluice admin datanode remove N --force`).
//! The placement key is rebuilt from the blob's locator: object
//! `bucket/key` for a single PUT (part 1 of an object), the part key for a
//! part of an open upload; for parts of a completed multipart upload the
//! upload id is gone and the blob id is used, so such blobs may move once
//! to the placement of that key.

use std::collections::BTreeSet;

use sluice_proto::meta::{BlobLocator, ListPlacementsRequest, Placement};

use super::HealMeta;
use super::rebuild::{self, HealError, NodeView, RebuildContext};
use crate::placement::{self, Candidate};

/// Blobs per `ListPlacements` page of a move pass.
pub const MOVE_PAGE: u32 = 1000;

/// When a move pass is due (see the module doc). Holds one hash.
#[derive(Debug, Default)]
pub struct MoveTrigger {
    /// Signature of the datanode set at the last pass.
    last: Option<u64>,
    /// The last pass moved or failed something.
    unsettled: bool,
    /// Signature seen by [`MoveTrigger::due`], recorded by `done`.
    pending: Option<u64>,
}

impl MoveTrigger {
    /// Whether a pass should run now over `nodes`; `rebalance` = rebalance
    /// is on.
    pub fn due(&mut self, nodes: &[NodeView], rebalance: bool) -> bool {
        use std::hash::{Hash, Hasher};
        let mut sig: Vec<(u64, &str, &str, bool, bool, u32)> = nodes
            .iter()
            .map(|n| {
                (
                    n.id,
                    n.zone.as_str(),
                    n.host.as_str(),
                    n.live,
                    n.draining,
                    placement::weight_class(n.free_bytes),
                )
            })
            .collect();
        sig.sort_unstable();
        let mut h = placement::StableHasher::default();
        sig.hash(&mut h);
        let sig = h.finish();
        self.pending = Some(sig);
        nodes.iter().any(|n| n.draining)
            || (rebalance && (self.unsettled || self.last != Some(sig)))
    }

    /// Records a finished pass; `busy` = it moved or failed something.
    pub fn done(&mut self, busy: bool) {
        self.last = self.pending.take();
        self.unsettled = busy;
    }
}

/// What one move pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoveReport {
    /// Blobs paged.
    pub blobs: u64,
    /// Shards moved off draining nodes.
    pub drained_shards: u64,
    /// Shards moved by rebalance.
    pub rebalanced_shards: u64,
    /// Shard bytes written.
    pub bytes: u64,
    /// Moves that failed (retried next pass).
    pub failed: u64,
}

/// The placement key a blob was written under, as far as its locator
/// tells (see the module doc).
pub fn placement_key(locator: &BlobLocator, blob_id: &str) -> String {
    if !locator.upload_id.is_empty() {
        crate::s3::part_placement_key(
            &locator.bucket,
            &locator.key,
            &locator.upload_id,
            locator.part_number,
        )
    } else if locator.part_number <= 1 {
        crate::s3::object_placement_key(&locator.bucket, &locator.key)
    } else {
        blob_id.to_string()
    }
}

/// The rebalance move for `p` (placement key `key`), if any: `(index,
/// target)`. `nodes` is the datanode set; only blobs whose every node is
/// live and that miss nothing are considered.
pub fn rebalance_move(key: &str, p: &Placement, nodes: &[NodeView]) -> Option<(u32, u64)> {
    let (k, m) = (p.data_shards as usize, p.parity_shards as usize);
    if !p.missing.is_empty() || p.nodes.len() != k + m || k == 0 {
        return None;
    }
    let view = |id: u64| nodes.iter().find(|n| n.id == id);
    if p.nodes.iter().any(|&id| !view(id).is_some_and(|n| n.live)) {
        return None;
    }
    let candidates: Vec<Candidate<'_>> = nodes
        .iter()
        .filter(|n| n.accepts_shards())
        .map(node_candidate)
        .collect();
    let wanted = placement::place(key, &candidates, k, m)?;
    let current: BTreeSet<u64> = p.nodes.iter().copied().collect();
    let wanted_set: BTreeSet<u64> = wanted.iter().copied().collect();
    if current == wanted_set {
        return None;
    }
    let report = placement::caps_of(&candidates, k, m)?;
    for &target in wanted.iter().filter(|t| !current.contains(t)) {
        for (i, &from) in p.nodes.iter().enumerate() {
            if wanted_set.contains(&from) {
                continue;
            }
            let mut next: Vec<Candidate<'_>> = p
                .nodes
                .iter()
                .map(|&id| view(id).map(node_candidate).expect("live above"))
                .collect();
            next[i] = view(target).map(node_candidate).expect("a candidate");
            if report.fits(&next) {
                return Some((i as u32, target));
            }
        }
    }
    None
}

fn node_candidate(n: &NodeView) -> Candidate<'_> {
    Candidate {
        id: n.id,
        zone: &n.zone,
        host: &n.host,
        free_bytes: n.free_bytes,
    }
}

/// One move pass (see the module doc). `drain` moves through the heal
/// gate, `rebalance` (None = off) through the rebalance gate.
pub async fn move_pass(
    meta: &dyn HealMeta,
    drain: &RebuildContext<'_>,
    rebalance: Option<&RebuildContext<'_>>,
    nodes: &[NodeView],
) -> Result<MoveReport, HealError> {
    let mut report = MoveReport::default();
    let draining: BTreeSet<u64> = nodes.iter().filter(|n| n.draining).map(|n| n.id).collect();
    let rebalance = rebalance.filter(|_| nodes.iter().all(|n| n.live || n.draining));
    if draining.is_empty() && rebalance.is_none() {
        return Ok(report);
    }
    let mut after = String::new();
    loop {
        let page = meta
            .list_placements(ListPlacementsRequest {
                after_blob_id: after.clone(),
                limit: MOVE_PAGE,
                degraded_only: false,
            })
            .await
            .map_err(HealError::Meta)?;
        for b in &page.blobs {
            let (Some(p), Some(loc)) = (&b.placement, &b.locator) else {
                continue;
            };
            report.blobs += 1;
            let moving: Vec<u32> = (0..p.nodes.len() as u32)
                .filter(|&i| draining.contains(&p.nodes[i as usize]))
                .collect();
            let (cx, targets, drained) = if !moving.is_empty() {
                if !p.missing.is_empty() {
                    continue; // heal first
                }
                match rebuild::choose_moves(p, &moving, nodes) {
                    Ok(t) => (drain, t, true),
                    Err(skip) => {
                        tracing::debug!(blob_id = %p.blob_id, %skip, "drain: blob not moved now");
                        report.failed += 1;
                        continue;
                    }
                }
            } else if let Some(cx) = rebalance {
                let key = placement_key(loc, &p.blob_id);
                match rebalance_move(&key, p, nodes) {
                    Some(t) => (cx, vec![t], false),
                    None => continue,
                }
            } else {
                continue;
            };
            let count = targets.len() as u64;
            match rebuild::rebuild_onto(cx, p, targets.clone(), nodes).await {
                Ok(h) => {
                    report.bytes += h.bytes;
                    if drained {
                        report.drained_shards += count;
                    } else {
                        report.rebalanced_shards += count;
                    }
                    tracing::debug!(blob_id = %p.blob_id, ?targets, drained, "moved shards");
                }
                Err(e) => {
                    report.failed += 1;
                    tracing::debug!(blob_id = %p.blob_id, error = %e, "move failed, retried next pass");
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

    fn view(id: u64, host: &str) -> NodeView {
        NodeView {
            id,
            live: true,
            writable: true,
            host: host.into(),
            ..NodeView::default()
        }
    }

    fn placement(nodes: Vec<u64>) -> Placement {
        Placement {
            blob_id: "b1".into(),
            size: 100,
            data_shards: 4,
            parity_shards: 2,
            block_size: 64,
            nodes,
            missing: vec![],
        }
    }

    #[test]
    fn rebalance_converges_to_the_placement_and_stops() {
        let mut nodes: Vec<NodeView> = (1..=6)
            .map(|i| view(i, &format!("h{}", i.div_ceil(2))))
            .collect();
        let key = "bucket/obj";
        let cands: Vec<Candidate<'_>> = nodes.iter().map(node_candidate).collect();
        let first = placement::place(key, &cands, 4, 2).expect("6 nodes");
        let mut p = placement(first);
        assert_eq!(rebalance_move(key, &p, &nodes), None, "already placed");
        // A new host with two nodes: moves happen one shard at a time
        // until the set is what placement wants now.
        nodes.push(view(7, "h4"));
        nodes.push(view(8, "h4"));
        let cands: Vec<Candidate<'_>> = nodes.iter().map(node_candidate).collect();
        let wanted: BTreeSet<u64> = placement::place(key, &cands, 4, 2)
            .expect("8 nodes")
            .into_iter()
            .collect();
        let mut moves = 0;
        while let Some((i, t)) = rebalance_move(key, &p, &nodes) {
            assert!(!p.nodes.contains(&t));
            p.nodes[i as usize] = t;
            moves += 1;
            assert!(moves <= 6, "does not converge");
        }
        let got: BTreeSet<u64> = p.nodes.iter().copied().collect();
        assert_eq!(got, wanted);
        // A blob with a missing shard or a down node is left to heal.
        p.missing = vec![1];
        nodes.push(view(9, "h5"));
        assert_eq!(rebalance_move(key, &p, &nodes), None);
    }

    #[test]
    fn trigger_runs_on_changes_and_until_settled() {
        let mut t = MoveTrigger::default();
        let mut nodes: Vec<NodeView> = (1..=6).map(|i| view(i, "h")).collect();
        assert!(t.due(&nodes, true), "first look");
        t.done(false);
        assert!(!t.due(&nodes, true), "settled");
        assert!(!t.due(&nodes, false));
        nodes.push(view(7, "h2"));
        assert!(t.due(&nodes, true), "a new node");
        t.done(true);
        assert!(t.due(&nodes, true), "the last pass moved shards");
        t.done(false);
        assert!(!t.due(&nodes, true));
        nodes[0].draining = true;
        assert!(t.due(&nodes, false), "draining runs without rebalance");
    }

    #[test]
    fn locator_keys() {
        let object = BlobLocator {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: String::new(),
            part_number: 1,
            version_seq: 0,
        };
        assert_eq!(placement_key(&object, "id"), "b/k");
        let part = BlobLocator {
            upload_id: "u".into(),
            part_number: 3,
            ..object.clone()
        };
        assert_eq!(placement_key(&part, "id"), "b/k/u/3");
        let completed = BlobLocator {
            part_number: 3,
            ..object
        };
        assert_eq!(placement_key(&completed, "id"), "id");
    }
}
