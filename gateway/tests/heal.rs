//! The heal worker: target choice, the token bucket and the yield rule as
//! pure tests; the rebuild of one blob against six or seven real datanodes
//! (real gRPC, real shard files) with a recording fake of the meta calls.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use async_trait::async_trait;
use bytes::Bytes;
use common::Datanode;
use futures::StreamExt;
use sluice_gateway::GatewayStats;
use sluice_gateway::blob::{BlobStore, BlobStoreConfig};
use sluice_gateway::datanodes::{DatanodeEntry, FixedDatanodes};
use sluice_gateway::epoch::WriteEpochs;
use sluice_gateway::heal::HealMeta;
use sluice_gateway::heal::audit::{NodeAudit, NodeWatch, shards_by_node};
use sluice_gateway::heal::rate::{HealGate, TokenBucket, should_yield};
use sluice_gateway::heal::rebuild::{
    HealError, NodeView, RebuildContext, Skip, choose_targets, healed_placement, rebuild_blob,
};
use sluice_meta_client::MetaError;
use sluice_proto::meta::{
    BeginHealRequest, DatanodeInfo, ErrorCode, ListPlacementsRequest, ListPlacementsResponse,
    PlacedBlob, Placement, ShardRef, UpdatePlacementRequest,
};
use sluice_test_support::payload;

const K: usize = 4;
const M: usize = 2;
const BLOCK: usize = 4096;

// ------------------------------------------------------------ pure parts

fn placement(nodes: &[u64], missing: &[u32]) -> Placement {
    Placement {
        blob_id: "e1.00ff".into(),
        size: 100_000,
        data_shards: K as u32,
        parity_shards: M as u32,
        block_size: BLOCK as u32,
        nodes: nodes.to_vec(),
        missing: missing.to_vec(),
    }
}

fn views(ids: impl IntoIterator<Item = u64>, down: &[u64], full: &[u64]) -> Vec<NodeView> {
    ids.into_iter()
        .map(|id| NodeView {
            id,
            live: !down.contains(&id),
            writable: !full.contains(&id),
            ..NodeView::default()
        })
        .collect()
}

#[test]
fn a_live_writable_node_is_repaired_in_place() {
    let p = placement(&[1, 2, 3, 4, 5, 6], &[2]);
    let t = choose_targets(&p, &views(1..=8, &[], &[])).expect("targets");
    assert_eq!(t, vec![(2, 3)]);
}

#[test]
fn a_down_or_full_node_is_replaced_by_one_holding_no_shard() {
    let p = placement(&[1, 2, 3, 4, 5, 6], &[2, 5]);
    // Node 3 down, node 6 full: both shards go elsewhere, to distinct nodes
    // outside the placement.
    let t = choose_targets(&p, &views(1..=9, &[3], &[6])).expect("targets");
    assert_eq!(t.len(), 2);
    assert_eq!((t[0].0, t[1].0), (2, 5));
    let targets: BTreeSet<u64> = t.iter().map(|x| x.1).collect();
    assert_eq!(targets.len(), 2, "no node takes two shards: {t:?}");
    assert!(targets.is_subset(&[7, 8, 9].into()), "{t:?}");
    // Deterministic (rendezvous seeded by blob id and index).
    assert_eq!(t, choose_targets(&p, &views(1..=9, &[3], &[6])).unwrap());
    let next = healed_placement(&p, &t);
    assert!(next.missing.is_empty());
    let distinct: BTreeSet<u64> = next.nodes.iter().copied().collect();
    assert_eq!(distinct.len(), 6);
}

#[test]
fn no_node_holds_two_shards_even_when_the_placement_repeats_one() {
    // Shard 1 and shard 2 both on node 2 (degenerate placement written with
    // too few nodes); shard 2 missing: it must not go back to node 2.
    let p = placement(&[1, 2, 2, 4, 5, 6], &[2]);
    let t = choose_targets(&p, &views(1..=7, &[], &[])).expect("targets");
    assert_eq!(t, vec![(2, 7)]);
}

#[test]
fn too_few_healthy_shards_or_no_target_skips_the_blob() {
    // Missing 0 and 1, nodes 3 and 4 down: 2 healthy < k = 4.
    let p = placement(&[1, 2, 3, 4, 5, 6], &[0, 1]);
    assert_eq!(
        choose_targets(&p, &views(1..=8, &[3, 4], &[])),
        Err(Skip::NotEnoughHealthy {
            healthy: 2,
            needed: 4
        })
    );
    // Node 3 down and no spare node: nowhere to put shard 2.
    let p = placement(&[1, 2, 3, 4, 5, 6], &[2]);
    assert_eq!(
        choose_targets(&p, &views(1..=6, &[3], &[])),
        Err(Skip::NoTarget { index: 2 })
    );
    assert_eq!(
        choose_targets(
            &placement(&[1, 2, 3, 4, 5, 6], &[]),
            &views(1..=6, &[], &[])
        ),
        Err(Skip::NothingMissing)
    );
    assert!(matches!(
        choose_targets(&placement(&[1, 2, 3], &[0]), &views(1..=6, &[], &[])),
        Err(Skip::Malformed(_))
    ));
}

#[test]
fn token_bucket_caps_bytes_per_second() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(1000, 1000, t0);
    assert_eq!(b.try_take(600, t0), None);
    assert_eq!(b.try_take(400, t0), None);
    let wait = b.try_take(500, t0).expect("empty bucket");
    assert_eq!(wait, Duration::from_millis(500));
    // Half a second refills 500 bytes.
    assert_eq!(b.try_take(500, t0 + Duration::from_millis(500)), None);
    // Never more than the burst banked.
    assert_eq!(b.tokens(t0 + Duration::from_secs(100)), 1000.0);
    // A take above the burst waits for a full bucket, then goes into debt.
    assert_eq!(b.try_take(5000, t0 + Duration::from_secs(100)), None);
    assert_eq!(b.tokens(t0 + Duration::from_secs(100)), -4000.0);
    assert_eq!(
        b.try_take(1, t0 + Duration::from_secs(100)),
        Some(Duration::from_secs_f64(4.001))
    );
}

#[test]
fn heal_yields_while_clients_wait_for_buffers() {
    assert!(!should_yield(0));
    assert!(should_yield(1));
    assert!(should_yield(40));
}

#[tokio::test]
async fn heal_takes_no_buffer_while_a_client_waits_and_holds_at_most_its_stripes() {
    // Budget of exactly one stripe.
    let config = BlobStoreConfig {
        data_shards: K,
        parity_shards: M,
        block_size: BLOCK,
        write_quorum: K + 1,
        buffer_budget: ((K + M) * BLOCK * 2) as u64,
        stall_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let (store, _) = common::fixed_store(config, Vec::new())
        .await
        .expect("empty fixed set");
    let stripe = ((K + M) * BLOCK) as u64;
    let gate = HealGate::new(
        1 << 30,
        1,
        store.stats().clone(),
        Duration::from_millis(200),
    );
    let first = gate
        .stripe_permit(&store, stripe)
        .await
        .expect("free budget");
    assert_eq!(first.bytes(), stripe);
    assert_eq!(gate.stripe_holds(), 1);
    // heal_concurrency = 1: a second stripe waits for the first.
    let err = gate
        .stripe_permit(&store, stripe)
        .await
        .err()
        .expect("one stripe at most");
    assert!(matches!(
        err,
        sluice_gateway::heal::rate::GateError::Busy(_)
    ));
    drop(first);
    let gate = HealGate::new(
        1 << 30,
        2,
        store.stats().clone(),
        Duration::from_millis(300),
    );
    let stats: &GatewayStats = store.stats();
    assert_eq!(stats.buffer_waiting(), 0);
    let s1 = gate
        .stripe_permit(&store, stripe)
        .await
        .expect("budget free");
    let s2 = gate
        .stripe_permit(&store, stripe)
        .await
        .expect("budget free");
    // Budget full (two heal stripes); now heal asks again: busy.
    assert!(gate.stripe_permit(&store, stripe).await.is_err());
    drop((s1, s2));
    let disabled = HealGate::new(0, 2, store.stats().clone(), Duration::from_millis(10));
    assert_eq!(
        disabled.throttle(10).await,
        Err(sluice_gateway::heal::rate::GateError::Disabled)
    );
}

#[test]
fn node_watch_triggers_on_disk_generation_and_long_down_nodes() {
    // `hb`: the leader's wall-clock stamp of the last heartbeat; the leader
    // reports the silence since (`silent_ms`), measured on its own clock.
    let now_ms: i64 = 10_000_000;
    let info = |id: u64, live: bool, generation: u64, hb: i64| DatanodeInfo {
        id,
        live,
        disk_generation: generation,
        last_heartbeat_ms: hb,
        silent_ms: (now_ms - hb) as u64,
        ..Default::default()
    };
    let down_after = Duration::from_secs(600);
    let t0 = Instant::now();
    let mut w = NodeWatch::default();
    let obs = w.observe(
        &[info(1, true, 1, now_ms), info(2, false, 1, now_ms - 1000)],
        t0,
        down_after,
    );
    assert!(!obs.generation_changed && !obs.newly_lost);
    // Node 1 re-registered with another disk.
    let obs = w.observe(
        &[info(1, true, 2, now_ms), info(2, false, 1, now_ms - 1000)],
        t0,
        down_after,
    );
    assert!(obs.generation_changed);
    // Node 2 down for 10 min by our own clock (its heartbeat time says less).
    let later = t0 + down_after;
    let obs = w.observe(
        &[info(1, true, 2, now_ms), info(2, false, 1, now_ms - 1000)],
        later,
        down_after,
    );
    assert!(obs.newly_lost && !obs.generation_changed);
    let live: BTreeSet<u64> = [1].into();
    assert_eq!(w.audit_of(2, &live), NodeAudit::Lost);
    assert_eq!(w.audit_of(1, &live), NodeAudit::Ask);
    // Only once.
    let obs = w.observe(
        &[info(1, true, 2, now_ms), info(2, false, 1, now_ms - 1000)],
        later,
        down_after,
    );
    assert!(!obs.newly_lost);
    // Node 3: first seen now, but its last heartbeat is 11 min old.
    let obs = w.observe(&[info(3, false, 1, now_ms - 660_000)], later, down_after);
    assert!(obs.newly_lost);
    assert_eq!(
        w.audit_of(1, &live),
        NodeAudit::Ask,
        "node 1 is no longer listed but live set says ask"
    );
    assert_eq!(
        w.audit_of(2, &BTreeSet::new()),
        NodeAudit::Skip,
        "node 2 forgotten when unlisted"
    );
}

#[test]
fn audit_groups_shards_by_node_without_missing_ones() {
    let blobs = vec![
        PlacedBlob {
            locator: None,
            placement: Some(Placement {
                blob_id: "a".into(),
                nodes: vec![1, 2, 3],
                missing: vec![1],
                ..Default::default()
            }),
        },
        PlacedBlob {
            locator: None,
            placement: Some(Placement {
                blob_id: "b".into(),
                nodes: vec![3, 1, 2],
                ..Default::default()
            }),
        },
    ];
    let by = shards_by_node(&blobs);
    let refs = |v: &[(&str, u32)]| -> Vec<ShardRef> {
        v.iter()
            .map(|(b, i)| ShardRef {
                blob_id: (*b).into(),
                shard_index: *i,
            })
            .collect()
    };
    assert_eq!(by[&1], refs(&[("a", 0), ("b", 1)]));
    assert_eq!(by[&2], refs(&[("b", 2)]));
    assert_eq!(by[&3], refs(&[("a", 2), ("b", 0)]));
}

// ------------------------------------------------------------ fake meta

/// Records the heal calls; answers `update_placement` with `cas_error`
/// when set.
#[derive(Default)]
struct FakeMeta {
    begun: Mutex<Vec<BeginHealRequest>>,
    updates: Mutex<Vec<UpdatePlacementRequest>>,
    reported: Mutex<Vec<(u64, Vec<ShardRef>)>>,
    present: Mutex<Vec<(u64, Vec<ShardRef>)>>,
    placements: Mutex<Vec<PlacedBlob>>,
    cas_error: Option<ErrorCode>,
}

#[async_trait]
impl HealMeta for FakeMeta {
    async fn list_placements(
        &self,
        req: ListPlacementsRequest,
    ) -> Result<ListPlacementsResponse, MetaError> {
        let all = self.placements.lock().unwrap().clone();
        let blobs: Vec<PlacedBlob> = all
            .into_iter()
            .filter(|b| b.placement.as_ref().unwrap().blob_id > req.after_blob_id)
            .filter(|b| !req.degraded_only || !b.placement.as_ref().unwrap().missing.is_empty())
            .take(req.limit as usize)
            .collect();
        Ok(ListPlacementsResponse {
            blobs,
            is_truncated: false,
        })
    }
    async fn report_missing(&self, node_id: u64, shards: Vec<ShardRef>) -> Result<u32, MetaError> {
        let n = shards.len() as u32;
        self.reported.lock().unwrap().push((node_id, shards));
        Ok(n)
    }
    async fn report_present(&self, node_id: u64, shards: Vec<ShardRef>) -> Result<u32, MetaError> {
        let n = shards.len() as u32;
        self.present.lock().unwrap().push((node_id, shards));
        Ok(n)
    }
    async fn begin_heal(&self, req: BeginHealRequest) -> Result<(), MetaError> {
        self.begun.lock().unwrap().push(req);
        Ok(())
    }
    async fn update_placement(&self, req: UpdatePlacementRequest) -> Result<(), MetaError> {
        self.updates.lock().unwrap().push(req);
        match self.cas_error {
            Some(code) => Err(MetaError::Refused {
                code,
                message: "placement changed".into(),
            }),
            None => Ok(()),
        }
    }
    async fn list_datanodes(&self) -> Result<Vec<DatanodeInfo>, MetaError> {
        Ok(Vec::new())
    }
}

// ------------------------------------------------------------ real datanodes

/// `count` datanodes, a store over them, and its datanode set.
async fn cluster(count: u64) -> Result<(Vec<Datanode>, BlobStore, Arc<FixedDatanodes>)> {
    sluice_test_support::init_tracing();
    let mut nodes = Vec::new();
    for id in 1..=count {
        nodes.push(Datanode::start(id, common::no_scrub).await?);
    }
    let config = BlobStoreConfig {
        data_shards: K,
        parity_shards: M,
        block_size: BLOCK,
        write_quorum: K + 1,
        datanode_refresh_interval: Duration::from_secs(60),
        ..Default::default()
    };
    let (store, directory) = common::fixed_store(config, common::up(&nodes)).await?;
    Ok((nodes, store, directory))
}

async fn read_all(store: &BlobStore, p: &Placement) -> Result<Vec<u8>> {
    let mut stream = store.read(p, 0..p.size);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// A blob of several stripes plus a short last one.
const SIZE: usize = 5 * K * BLOCK + 1234;

async fn write_blob(store: &BlobStore, data: &[u8]) -> Result<Placement> {
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::copy_from_slice(data))]);
    let p = store.write("b/k", body, Some(data.len() as u64)).await?;
    ensure!(p.missing.is_empty(), "all shards durable: {p:?}");
    Ok(p)
}

fn gate(store: &BlobStore) -> HealGate {
    HealGate::new(64 << 20, 2, store.stats().clone(), Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_restores_a_deleted_shard_in_place() -> Result<()> {
    let (mut nodes, store, _) = cluster(6).await?;
    let data = payload(SIZE, 7);
    let p = write_blob(&store, &data).await?;
    // Shard 2 (a data shard) vanishes from its node.
    let victim = p.nodes[2];
    let node = nodes.iter().find(|n| n.id == victim).unwrap();
    let file = node.shard_file(&p.blob_id, 2)?.context("shard 2 file")?;
    let original = std::fs::read(&file)?;
    std::fs::remove_file(&file)?;
    let degraded = Placement {
        missing: vec![2],
        ..p.clone()
    };

    let meta = FakeMeta::default();
    let (gate, epochs) = (gate(&store), WriteEpochs::default());
    let cx = RebuildContext {
        store: &store,
        meta: &meta,
        gate: &gate,
        epochs: &epochs,
        credit_stall: Duration::from_secs(5),
    };
    let views = views(1..=6, &[], &[]);
    let healed = rebuild_blob(&cx, &degraded, &views).await?;
    assert_eq!(healed.targets, vec![(2, victim)]);
    assert_eq!(healed.placement, p, "healed placement is the original one");
    let layout = sluice_gateway::layout::Layout::new(p.size, K, BLOCK);
    assert_eq!(healed.bytes, layout.shard_bytes());
    assert!(healed.bad_sources.is_empty());

    let begun = meta.begun.lock().unwrap().clone();
    assert_eq!(begun.len(), 1);
    assert_eq!(
        (
            begun[0].blob_id.as_str(),
            begun[0].shard_index,
            begun[0].node_id,
            begun[0].epoch
        ),
        (p.blob_id.as_str(), 2, victim, epochs.begin_write().epoch())
    );
    let updates = meta.updates.lock().unwrap().clone();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].expected.as_ref(), Some(&degraded));
    assert_eq!(updates[0].placement.as_ref(), Some(&p));
    assert_eq!(updates[0].epoch, begun[0].epoch);

    // The file is back, byte for byte.
    let node = nodes.iter().find(|n| n.id == victim).unwrap();
    let back = node
        .shard_file(&p.blob_id, 2)?
        .context("rebuilt shard 2 file")?;
    assert_eq!(std::fs::read(&back)?, original);
    // And the blob reads back from the rebuilt shard plus k-1 others only
    // (0 and 1 treated as missing: shards 2, 3, 4, 5).
    let without = Placement {
        missing: vec![0, 1],
        ..p.clone()
    };
    assert_eq!(read_all(&store, &without).await?, data);
    // Heal's stripes went back to the budget.
    assert_eq!(gate.stripe_holds(), 0);
    store.shutdown().await;
    for n in &mut nodes {
        n.shut_down().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_moves_parity_off_a_down_node_and_a_lost_race_is_reported() -> Result<()> {
    let (mut nodes, store, directory) = cluster(7).await?;
    // Write with node 7 out of the set so the blob lands on 1..=6.
    directory.set(
        nodes
            .iter()
            .map(|n| DatanodeEntry {
                id: n.id,
                addr: n.addr.clone(),
                live: n.id != 7,
                writable: n.id != 7,
                free_bytes: 0,
                ..DatanodeEntry::up(n.id, "")
            })
            .collect(),
    );
    store.refresh_datanodes().await?;
    let data = payload(SIZE, 11);
    let p = write_blob(&store, &data).await?;
    assert!(!p.nodes.contains(&7));
    // The parity shard 5's node goes down for good.
    let down = p.nodes[5];
    let degraded = Placement {
        missing: vec![5],
        ..p.clone()
    };
    let views = views(1..=7, &[down], &[]);
    let meta = FakeMeta::default();
    let (gate, epochs) = (gate(&store), WriteEpochs::default());
    let cx = RebuildContext {
        store: &store,
        meta: &meta,
        gate: &gate,
        epochs: &epochs,
        credit_stall: Duration::from_secs(5),
    };
    let healed = rebuild_blob(&cx, &degraded, &views).await?;
    assert_eq!(healed.targets, vec![(5, 7)]);
    let mut expect = p.clone();
    expect.nodes[5] = 7;
    assert_eq!(healed.placement, expect);
    assert!(
        nodes[6].shard_file(&p.blob_id, 5)?.is_some(),
        "parity on node 7"
    );
    // Read with shard 5 (the rebuilt parity on node 7) in use: drop the
    // down node's copy too, so the parity must be right.
    let down_node = nodes.iter_mut().find(|n| n.id == down).unwrap();
    down_node.shut_down().await?;
    let without = Placement {
        missing: vec![0, 1],
        ..expect.clone()
    };
    let mut entries: Vec<_> = nodes
        .iter()
        .map(|n| DatanodeEntry {
            id: n.id,
            addr: n.addr.clone(),
            live: n.id != down,
            writable: n.id != down,
            free_bytes: 0,
            ..DatanodeEntry::up(n.id, "")
        })
        .collect();
    directory.set(entries.clone());
    store.refresh_datanodes().await?;
    assert_eq!(read_all(&store, &without).await?, data);

    // Lost race: the compare-and-set is refused.
    let lost = FakeMeta {
        cas_error: Some(ErrorCode::PlacementChanged),
        ..Default::default()
    };
    let cx = RebuildContext { meta: &lost, ..cx };
    let again = Placement {
        missing: vec![4],
        ..expect.clone()
    };
    entries.retain(|e| e.id != down);
    let views2 = views_from(&entries);
    let err = rebuild_blob(&cx, &again, &views2)
        .await
        .expect_err("CAS refused");
    assert!(
        matches!(err, HealError::Lost(ErrorCode::PlacementChanged)),
        "{err:?}"
    );
    assert_eq!(err.reason(), "lost_race");
    assert_eq!(lost.updates.lock().unwrap().len(), 1);

    store.shutdown().await;
    for n in &mut nodes {
        n.shut_down().await?;
    }
    Ok(())
}

fn views_from(entries: &[DatanodeEntry]) -> Vec<NodeView> {
    entries
        .iter()
        .map(|e| NodeView {
            id: e.id,
            live: e.live,
            writable: true,
            ..NodeView::default()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_source_is_skipped_and_reported() -> Result<()> {
    let (mut nodes, store, _) = cluster(6).await?;
    let data = payload(SIZE, 13);
    let p = write_blob(&store, &data).await?;
    // Shard 0 vanished; shard 1's file is damaged (bit flips mid-file).
    let n0 = nodes.iter().find(|n| n.id == p.nodes[0]).unwrap();
    std::fs::remove_file(n0.shard_file(&p.blob_id, 0)?.context("shard 0")?)?;
    let n1 = nodes.iter().find(|n| n.id == p.nodes[1]).unwrap();
    let f1 = n1.shard_file(&p.blob_id, 1)?.context("shard 1")?;
    let mut bytes = std::fs::read(&f1)?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&f1, &bytes)?;
    let degraded = Placement {
        missing: vec![0],
        ..p.clone()
    };
    let meta = FakeMeta::default();
    let (gate, epochs) = (gate(&store), WriteEpochs::default());
    let cx = RebuildContext {
        store: &store,
        meta: &meta,
        gate: &gate,
        epochs: &epochs,
        credit_stall: Duration::from_secs(5),
    };
    let healed = rebuild_blob(&cx, &degraded, &views(1..=6, &[], &[])).await?;
    assert_eq!(healed.targets, vec![(0, p.nodes[0])]);
    assert_eq!(healed.bad_sources, vec![1]);
    let reported = meta.reported.lock().unwrap().clone();
    assert_eq!(
        reported,
        vec![(
            p.nodes[1],
            vec![ShardRef {
                blob_id: p.blob_id.clone(),
                shard_index: 1
            }]
        )]
    );
    // Shard 0 is readable again: read with 0, 2, 3, 4.
    let without = Placement {
        missing: vec![1, 5],
        ..p.clone()
    };
    assert_eq!(read_all(&store, &without).await?, data);
    store.shutdown().await;
    for n in &mut nodes {
        n.shut_down().await?;
    }
    Ok(())
}

#[tokio::test]
async fn audit_reports_every_shard_of_a_long_down_node_and_counts_silent_nodes_unchecked() {
    // Nodes 1..=6 registered at addresses where nothing listens.
    let (store, _) = common::fixed_store(
        BlobStoreConfig::default(),
        (1..=6)
            .map(|i| DatanodeEntry::up(i, "http://127.0.0.1:9"))
            .collect(),
    )
    .await
    .expect("fixed set");
    let meta = FakeMeta::default();
    for (id, missing) in [("a", vec![]), ("b", vec![5u32])] {
        meta.placements.lock().unwrap().push(PlacedBlob {
            locator: None,
            placement: Some(Placement {
                blob_id: id.into(),
                nodes: vec![1, 2, 3, 4, 5, 6],
                missing,
                ..Default::default()
            }),
        });
    }
    // Node 6 has been down past node_down_after; node 1 is live but does
    // not answer; the rest are down for less and are left alone.
    let mut watch = NodeWatch::default();
    let infos: Vec<DatanodeInfo> = (1..=6)
        .map(|id| DatanodeInfo {
            id,
            live: id == 1,
            silent_ms: if id == 6 { 10 * 60 * 1000 + 1 } else { 0 },
            ..Default::default()
        })
        .collect();
    let obs = watch.observe(&infos, Instant::now(), Duration::from_secs(600));
    assert!(obs.newly_lost);
    let live: BTreeSet<u64> = [1].into();
    let report = sluice_gateway::heal::audit::audit_pass(
        &store,
        &meta,
        &watch,
        &live,
        Duration::from_secs(5),
    )
    .await
    .expect("audit pass");
    assert_eq!(report.blobs, 2);
    // Node 6 holds shard 5 of "a" only ("b"'s shard 5 is already missing).
    assert_eq!(
        meta.reported.lock().unwrap().clone(),
        vec![(
            6,
            vec![ShardRef {
                blob_id: "a".into(),
                shard_index: 5
            }]
        )]
    );
    assert_eq!(report.missing_reported, 1);
    assert_eq!(report.shards_checked, 1);
    // Node 1 (2 shards, no answer) and nodes 2..=5 (8 shards, briefly down).
    assert_eq!(report.unchecked, 10);
    // "b"'s missing shard 5 is on lost node 6: not asked, not un-marked.
    assert_eq!(report.verified, 0);
    assert!(meta.present.lock().unwrap().is_empty());
}
