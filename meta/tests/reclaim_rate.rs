//! Pending deletions stay bounded under a sustained release rate, on an
//! in-process single-voter meta node at compressed time: PutObject
//! overwrites through MetaClient release a blob each (a `PendingDeletion`
//! record) at ≥ 200 releases/s for more than 10 × `delete_delay`, while
//! the leader's reclaimer deletes them through two fake datanodes. The
//! records the reclaimer sees in a pass (`sluice_meta_pending_deletions`,
//! exact below its per-pass read limit) stay under rate × (delete_delay +
//! reclaim_interval) × 2, and drain to none once the load stops.
//!
//! Its own test binary: it installs the process's metrics recorder.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use metrics::{Counter, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use sluice_meta::store::{KvStore, Space};
use sluice_proto::blob_id::new_blob_id;
use tokio::task::JoinSet;

mod common;
use common::fake_datanode::{FakeDatanode, serve_fake};
use common::*;

const DELETE_DELAY: Duration = Duration::from_secs(1);
const RECLAIM_INTERVAL: Duration = Duration::from_millis(100);
/// The release rate the load aims at, and the least it must reach.
const TARGET_PER_SEC: u64 = 250;
const FLOOR_PER_SEC: f64 = 200.0;
/// Longer than 10 × `DELETE_DELAY`.
const LOAD: Duration = Duration::from_secs(11);
/// Keys overwritten in turn: after the first round every put releases one.
const KEYS: u64 = 64;
/// Most puts in flight.
const IN_FLIGHT: usize = 32;

/// The last value of the reclaimer's pending-deletions gauge.
#[derive(Default)]
struct LastValue(AtomicU64);

impl GaugeFn for LastValue {
    fn increment(&self, _value: f64) {}
    fn decrement(&self, _value: f64) {}
    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::SeqCst);
    }
}

impl LastValue {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::SeqCst))
    }
}

/// A recorder that keeps `sluice_meta_pending_deletions` only.
struct PendingRecorder(Arc<LastValue>);

impl metrics::Recorder for PendingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        if key.name() == sluice_meta::reclaimer::PENDING_DELETIONS {
            Gauge::from_arc(self.0.clone())
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_deletions_stay_bounded_under_a_sustained_release_rate() -> Result<()> {
    let pending = Arc::new(LastValue::default());
    metrics::set_global_recorder(PendingRecorder(pending.clone()))
        .map_err(|e| anyhow::anyhow!("metrics recorder: {e}"))?;
    let tmp = tempfile::tempdir()?;
    let node = Node::start(tmp.path(), |c| {
        c.delete_delay = DELETE_DELAY;
        c.reclaim_interval = RECLAIM_INTERVAL;
        // The test's one epoch stays open without renewals.
        c.epoch_lease = Duration::from_secs(120);
    })
    .await?;
    let client = node.client();
    let nodes = [
        Arc::new(FakeDatanode::default()),
        Arc::new(FakeDatanode::default()),
    ];
    let mut servers = Vec::new();
    for (i, fake) in nodes.iter().enumerate() {
        let (addr, task) = serve_fake(fake.clone()).await?;
        let id = i as u64 + 1;
        client
            .register_datanode(id, &format!("http://{addr}"), &format!("disk-{id}"))
            .await?;
        servers.push(task);
    }
    let epoch = client.open_epoch("gw").await?.epoch;
    assert!(client.create_bucket("b", 1).await?);

    // Overwrite the keys in turn at the target rate, IN_FLIGHT at most.
    let released = Arc::new(AtomicU64::new(0));
    let mut puts = JoinSet::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / TARGET_PER_SEC as u32);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut samples: Vec<(Duration, f64)> = Vec::new();
    let mut next_sample = Duration::ZERO;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < LOAD {
        ticker.tick().await;
        while puts.len() >= IN_FLIGHT {
            puts.join_next().await.expect("a put in flight")??;
        }
        let (client, released) = (client.clone(), released.clone());
        let blob = new_blob_id(epoch, u128::from(n) + 1);
        let key = format!("k{}", n % KEYS);
        puts.spawn(async move {
            let r = client.put_object(object(&key, &blob, vec![1, 2])).await?;
            released.fetch_add(r.len() as u64, Ordering::SeqCst);
            anyhow::Ok(())
        });
        n += 1;
        let elapsed = start.elapsed();
        if elapsed >= next_sample {
            samples.push((elapsed, pending.get()));
            next_sample = elapsed + Duration::from_millis(100);
        }
    }
    while let Some(r) = puts.join_next().await {
        r??;
    }
    let elapsed = start.elapsed();
    let releases = released.load(Ordering::SeqCst);
    let rate = releases as f64 / elapsed.as_secs_f64();
    assert!(
        rate >= FLOOR_PER_SEC,
        "{releases} releases in {elapsed:?}: {rate:.0}/s"
    );
    // Records released within one delete_delay plus one pass interval are
    // pending; twice that is the bound.
    let bound = rate * (DELETE_DELAY + RECLAIM_INTERVAL).as_secs_f64() * 2.0;
    let peak = samples.iter().map(|(_, v)| *v).fold(0.0, f64::max);
    // Once the delay passed, the reclaimer must have seen records.
    assert!(
        samples.iter().any(|(at, v)| *at > DELETE_DELAY && *v > 0.0),
        "the gauge never moved: {samples:?}"
    );
    assert!(
        peak <= bound,
        "pending deletions peaked at {peak}, above {bound:.0} ({rate:.0} releases/s): {samples:?}"
    );
    eprintln!(
        "{releases} releases in {elapsed:.1?} ({rate:.0}/s); pending peak {peak}, bound {bound:.0}"
    );

    // Drained once the load stops.
    wait_for("pending deletions to drain", || {
        let pending = pending.clone();
        async move { (pending.get() == 0.0).then_some(()) }
    })
    .await?;
    for fake in &nodes {
        assert!(fake.deleted_count() as u64 >= releases);
    }
    let store = node.stop().await?;
    let left = store.scan(
        Space::Pending,
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
        10,
    )?;
    assert!(left.is_empty(), "{} pending deletions left", left.len());
    for s in servers {
        s.abort();
    }
    Ok(())
}
