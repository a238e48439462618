//! A committed PutObject whose response was lost, retried after its
//! session entry is gone (removed past `session_min_age` from a table
//! above its high-water mark) and its write epoch closed, on an in-process
//! single-voter meta node.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_meta_client::MetaClient;
use sluice_proto::blob_id::new_blob_id;
use sluice_proto::meta as pb;

mod common;
use common::*;

/// On one node: a PutObject is applied and its
/// response lost; the retry is stalled (a paused process, longer than the
/// `client_retry_deadline` the node was told of), while the session entry
/// is removed (older than `session_min_age` in a table above its
/// high-water mark of one entry) and the gateway's write epoch closes
/// (never renewed). The retry must succeed: it committed. (Were it refused
/// `EPOCH_CLOSED`, the gateway would delete the blob of a refused commit:
/// the object would stay listed with its shards gone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_put_retried_after_its_session_and_epoch_are_gone_succeeds() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let node = Node::start(tmp.path(), |c| {
        c.session_table_max_entries = 4;
        c.session_high_water = 0.25;
        c.client_retry_deadline = Duration::from_millis(200);
        c.session_min_age = Duration::from_millis(400);
        c.session_expiry = Duration::from_secs(60);
        c.session_sweep_interval = Duration::from_millis(50);
        c.epoch_lease = Duration::from_millis(600);
        c.epoch_sweep_interval = Duration::from_millis(50);
    })
    .await?;
    let client = node.client();
    assert!(client.create_bucket("b", 1).await?);
    let epoch = client.open_epoch("gw-paused").await?.epoch;
    let x = new_blob_id(epoch, 0xa);

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
    assert_eq!(blob_of(&client.get_object("b", "k").await?), x);
    // Another operation keeps the table above its mark of one entry, so
    // the PutObject's entry goes once it is older than the minimum age.
    assert!(client.create_bucket("c", 1).await?);
    // The epoch, never renewed, closes: a probe commit of a new blob of
    // it (a commit does not renew) is refused once it has.
    let probes = AtomicUsize::new(0);
    wait_for("the epoch to close", || {
        let client = client.clone();
        let probe = new_blob_id(epoch, 0x100 + probes.fetch_add(1, Ordering::SeqCst) as u128);
        async move {
            match client.put_object(object("probe", &probe, vec![1])).await {
                Err(sluice_meta_client::MetaError::Refused {
                    code: pb::ErrorCode::EpochClosed,
                    ..
                }) => Some(()),
                // Not yet closed; or the table is full of young entries.
                Ok(_)
                | Err(sluice_meta_client::MetaError::Refused {
                    code: pb::ErrorCode::SlowDown,
                    ..
                }) => None,
                Err(e) => panic!("probe commit: {e}"),
            }
        }
    })
    .await?;

    let retried = first.await?;
    let released = retried.context("the retry of a committed PutObject")?;
    assert!(released.is_empty(), "nothing released: {released:?}");
    assert_eq!(faults.attempts.load(Ordering::SeqCst), 2);
    assert_eq!(blob_of(&client.get_object("b", "k").await?), x);

    let store = node.stop().await?;
    assert!(
        sluice_meta::sm::pending::get(&store, &x)?.is_none(),
        "x is not released"
    );
    assert!(sluice_meta::sm::refs::is_referenced(&store, &x)?);
    Ok(())
}
