//! Exactly-once commits and the leader's reclaimer on an in-process
//! single-voter meta node: a lost PutObject response is retried with the
//! same op id and answered from the session table (replay.rs: when the
//! entry is gone); a released blob's
//! shards are deleted by the reclaimer (through a fake datanode's
//! DeleteBlobs) only after `delete_delay`, and its pending deletion is
//! dropped once every node confirmed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_meta_client::MetaClient;
use sluice_proto::blob_id::new_blob_id;
use sluice_proto::meta as pb;

mod common;
use common::fake_datanode::{FakeDatanode, serve_fake};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimer_deletes_released_blobs_after_the_delay() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let delay = Duration::from_millis(1500);
    let node = Node::start(tmp.path(), |c| {
        c.reclaim_interval = Duration::from_millis(100);
        c.delete_delay = delay;
    })
    .await?;
    let client = node.client();
    let healthy = Arc::new(FakeDatanode::default());
    // Node 2 fails its first DeleteBlobs: it keeps its entry for a later pass.
    let flaky = Arc::new(FakeDatanode {
        fail_first: 1,
        ..Default::default()
    });
    let (addr1, dn1) = serve_fake(healthy.clone()).await?;
    let (addr2, dn2) = serve_fake(flaky.clone()).await?;
    client
        .register_datanode(1, &format!("http://{addr1}"), "disk-1")
        .await?;
    client
        .register_datanode(2, &format!("http://{addr2}"), "disk-2")
        .await?;

    let epoch = client.open_epoch("gw").await?.epoch;
    let x = new_blob_id(epoch, 1);
    let y = new_blob_id(epoch, 2);
    assert!(client.create_bucket("b", 1).await?);
    client.put_object(object("k", &x, vec![1, 2, 1])).await?;
    let before_release = Instant::now();
    let released = client.put_object(object("k", &y, vec![1, 2])).await?;
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].blob_id, x);

    // Not before the delay (leader time; checked well inside it).
    tokio::time::sleep(delay / 2).await;
    assert!(healthy.deleted.lock().unwrap().is_empty(), "deleted early");
    // A released blob cannot be committed again while it is pending.
    match client.put_object(object("k2", &x, vec![1, 2])).await {
        Err(sluice_meta_client::MetaError::Refused {
            code: pb::ErrorCode::InvalidArgument,
            ..
        }) => {}
        other => bail!("expected InvalidArgument for a released blob, got {other:?}"),
    }

    let at1 = wait_for("node 1 to delete x", || async {
        healthy.deleted.lock().unwrap().first().cloned()
    })
    .await?;
    let at2 = wait_for("node 2 to delete x", || async {
        flaky.deleted.lock().unwrap().first().cloned()
    })
    .await?;
    assert_eq!(at1.1, x);
    assert_eq!(at2.1, x);
    assert!(
        at1.0 - before_release >= delay,
        "node 1 deleted before the delay"
    );
    assert!(
        flaky.calls.load(Ordering::SeqCst) >= 2,
        "retried after the failure"
    );
    // Y, still referenced, is never deleted; X is deleted once per node
    // (its record goes once both confirmed).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(healthy.deleted.lock().unwrap().len(), 1);
    assert_eq!(flaky.deleted.lock().unwrap().len(), 1);
    assert_eq!(blob_of(&client.get_object("b", "k").await?), y);

    let store = node.stop().await?;
    assert!(sluice_meta::sm::pending::get(&store, &x)?.is_none());
    assert!(sluice_meta::sm::pending::get(&store, &y)?.is_none());
    dn1.abort();
    dn2.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_put_is_answered_from_the_session_table() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let node = Node::start(tmp.path(), |_| {}).await?;
    let client = node.client();
    let epoch = client.open_epoch("gw").await?.epoch;
    let x = new_blob_id(epoch, 0xa);
    let y = new_blob_id(epoch, 0xb);
    assert!(client.create_bucket("b", 1).await?);

    let faults = Arc::new(LoseFirstPut::default());
    let faulty = MetaClient::with_faults(
        vec![node.config.advertise_addr.clone()],
        Duration::from_secs(20),
        Duration::from_secs(5),
        faults.clone(),
    );
    let first = {
        let x = x.clone();
        tokio::spawn(async move { faulty.put_object(object("k", &x, vec![1, 2])).await })
    };
    faults.dropped.notified().await;
    // The first attempt committed K -> X; another writer replaces it
    // while the lost attempt's retry is stalled.
    assert_eq!(blob_of(&client.get_object("b", "k").await?), x);
    let replaced = client.put_object(object("k", &y, vec![1, 2])).await?;
    assert_eq!(replaced.len(), 1);
    assert_eq!(replaced[0].blob_id, x);

    // The retry carries the same op id: the first outcome (nothing
    // released), and K keeps pointing at Y. (Applied again, it would be
    // refused: X is released and pending.)
    let retried = first.await??;
    assert!(retried.is_empty(), "first outcome: {retried:?}");
    assert_eq!(faults.attempts.load(Ordering::SeqCst), 2);
    assert_eq!(blob_of(&client.get_object("b", "k").await?), y);

    let store = node.stop().await?;
    let pending = sluice_meta::sm::pending::get(&store, &x)?.context("x is pending")?;
    assert_eq!(pending.remaining_nodes, [1, 2]);
    assert!(
        sluice_meta::sm::pending::get(&store, &y)?.is_none(),
        "Y was never released"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_closes_an_epoch_whose_lease_ran_out() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let node = Node::start(tmp.path(), |c| {
        c.epoch_lease = Duration::from_millis(600);
        c.epoch_sweep_interval = Duration::from_millis(50);
    })
    .await?;
    let client = node.client();
    assert!(client.create_bucket("b", 1).await?);
    let kept = client.open_epoch("gw-renewing").await?;
    assert_eq!(kept.lease_ms, 600);
    let lapsed = client.open_epoch("gw-paused").await?;
    assert_ne!(kept.epoch, lapsed.epoch);

    // One gateway renews well within the lease; the other is "paused".
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        client.renew_epoch(kept.epoch).await?;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    match client.renew_epoch(lapsed.epoch).await {
        Err(sluice_meta_client::MetaError::Refused {
            code: pb::ErrorCode::EpochClosed,
            ..
        }) => {}
        other => bail!("expected EPOCH_CLOSED for the lapsed epoch, got {other:?}"),
    }
    // Its late commit is refused; the renewed epoch still commits.
    let late = new_blob_id(lapsed.epoch, 1);
    match client.put_object(object("k", &late, vec![1])).await {
        Err(sluice_meta_client::MetaError::Refused {
            code: pb::ErrorCode::EpochClosed,
            ..
        }) => {}
        other => bail!("expected EPOCH_CLOSED for a late commit, got {other:?}"),
    }
    let live = new_blob_id(kept.epoch, 1);
    client.put_object(object("k", &live, vec![1])).await?;
    assert_eq!(blob_of(&client.get_object("b", "k").await?), live);
    node.stop().await?;
    Ok(())
}
