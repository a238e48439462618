//! The session table's bound on an in-process single-voter meta node, at
//! compressed time (`session_min_age` of one second): a full table refuses
//! new operations with `SLOW_DOWN` rather than evict; under pressure the
//! leader removes entries once they are older than `session_min_age`, and
//! never before; below the high-water mark it keeps older ones.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::meta::{self as pb, ErrorCode};

mod common;
use common::*;

const MAX: u64 = 8;
const MIN_AGE: Duration = Duration::from_secs(1);

/// CreateBucket of `name` sent with op id `op` (every retry of one
/// operation carries the same id): `created` as answered.
async fn create(client: &MetaClient, name: &str, op: &str) -> Result<bool, MetaError> {
    let req = pb::CreateBucketRequest {
        name: name.into(),
        now_ms: 1,
        op_id: op.into(),
        ..Default::default()
    };
    let r = client
        .call("CreateBucket", |mut c| {
            let req = req.clone();
            async move { c.create_bucket(req).await }
        })
        .await?;
    Ok(r.created)
}

fn is_slow_down(r: &Result<bool, MetaError>) -> bool {
    matches!(
        r,
        Err(MetaError::Refused {
            code: ErrorCode::SlowDown,
            ..
        })
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_go_by_age_under_pressure_and_never_before_the_minimum_age() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let node = Node::start(tmp.path(), |c| {
        c.session_table_max_entries = MAX;
        // The mark: 4 entries.
        c.session_high_water = 0.5;
        c.client_retry_deadline = Duration::from_millis(250);
        c.session_min_age = MIN_AGE;
        c.session_expiry = Duration::from_secs(120);
        c.session_sweep_interval = Duration::from_millis(50);
    })
    .await?;
    let client = node.client();

    // Fill the table: a first apply answers `created: true`; applied again
    // (its entry gone) the bucket exists and the answer is `false`.
    let sent = Instant::now();
    for i in 0..MAX {
        assert!(create(&client, &format!("p{i}"), &format!("op-{i}")).await?);
    }
    // Full: a new operation is refused, nothing is evicted for it.
    assert!(
        is_slow_down(&create(&client, "extra", "op-extra").await),
        "a new operation on a full table"
    );

    // Retry op-0, the oldest, until its entry is gone. Every answer that
    // came back before `sent + MIN_AGE` (so was applied less than the
    // minimum age after op-0 was) must come from the table.
    let mut answers = Vec::new();
    let gone_at = loop {
        let created = create(&client, "p0", "op-0").await?;
        let at = Instant::now();
        answers.push((at, created));
        if !created {
            break at;
        }
        if at - sent > MIN_AGE + Duration::from_secs(20) {
            bail!("op-0's entry never went under pressure: {answers:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let early: Vec<_> = answers
        .iter()
        .filter(|(at, _)| *at - sent < MIN_AGE)
        .collect();
    assert!(
        early.len() >= 3,
        "the probe ran inside the minimum age: {answers:?}"
    );
    assert!(
        early.iter().all(|(_, created)| *created),
        "an entry went before the minimum age: {answers:?}"
    );
    assert!(
        gone_at - sent >= MIN_AGE,
        "op-0 went after {:?}",
        gone_at - sent
    );

    // Room again: new operations are admitted.
    let extra = wait_for("a new operation to be admitted", || {
        let client = client.clone();
        async move {
            let r = create(&client, "extra", "op-extra").await;
            (!is_slow_down(&r)).then_some(r)
        }
    })
    .await?;
    assert!(extra?);

    // Below the mark, entries older than the minimum age stay (until
    // session_expiry): op-7 is answered from the table long after it.
    tokio::time::sleep(MIN_AGE * 2).await;
    assert!(create(&client, "p7", "op-7").await?, "op-7 was re-applied");
    assert!(create(&client, "p6", "op-6").await?, "op-6 was re-applied");
    node.shut_down().await?;
    Ok(())
}

/// A new leader (here: the node restarted) has no samples of its clock:
/// it removes nothing for its first `session_min_age`, however full the
/// table it inherits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_removes_nothing_for_its_first_minimum_age() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let tune = |c: &mut sluice_meta::Config| {
        c.session_table_max_entries = 4;
        c.session_high_water = 0.25;
        c.client_retry_deadline = Duration::from_millis(250);
        // Long enough that the restart fits well inside it.
        c.session_min_age = Duration::from_secs(3);
        c.session_expiry = Duration::from_secs(120);
        c.session_sweep_interval = Duration::from_millis(50);
    };
    let node = Node::start(tmp.path(), tune).await?;
    let client = node.client();
    for i in 0..4 {
        assert!(create(&client, &format!("p{i}"), &format!("op-{i}")).await?);
    }
    let config = node.shut_down().await?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let restarted = Instant::now();
    let node = Node::start_on(tmp.path(), listener, tune)?;
    let client = node.client();
    let min_age = node.config.session_min_age;
    // The entries are older than anything this leader has seen; it keeps
    // them (and stays full) until it has watched them for the minimum age.
    loop {
        let created = create(&client, "p0", "op-0").await?;
        let elapsed = restarted.elapsed();
        if elapsed >= min_age {
            break;
        }
        assert!(created, "op-0 re-applied {elapsed:?} after the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(
        "op-0's entry to go once watched for the minimum age",
        || {
            let client = client.clone();
            async move { (!create(&client, "p0", "op-0").await.ok()?).then_some(()) }
        },
    )
    .await?;
    node.shut_down().await?;
    Ok(())
}
