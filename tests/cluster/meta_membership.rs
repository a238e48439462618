//! Meta membership changes (`sluice.admin.Admin` AddVoter / RemoveVoter /
//! ReplaceVoter / ListMembers) on real 3-voter clusters.
//!
//! * `membership_changes_are_refused_when_unsafe` — unknown id, bad
//!   address, a learner that never catches up (removed again), a second
//!   change while one is in progress, no live quorum left, the last voter;
//!   a follower answers NOT_LEADER with the leader's address.
//! * `voters_replaced_under_write_load` — four writers PUT continuously
//!   while node 4 is added, the leader is removed (and stopped), and a
//!   second original voter is replaced by node 5 (and stopped). Every
//!   acknowledged object reads back byte-identical, no write fails or
//!   stalls for longer than [`outage_bound`], clients whose seed lists name
//!   the removed nodes still find the leader, and after a restart of every
//!   meta node the new membership holds.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::primitives::ByteStream;
use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::admin as apb;
use sluice_proto::admin::admin_client::AdminClient;
use sluice_proto::meta::ErrorCode;
use tokio::sync::Mutex;

use crate::fixtures::{CONVERGE_TIMEOUT, Setup, TestCluster, wait_until};
use crate::{random_bytes, sha256_hex, test_seed};

/// The meta nodes' election timeout range (the meta config default, which
/// the fixture keeps).
const ELECTION_TIMEOUT_MAX: Duration = Duration::from_secs(2);

/// Longest stretch in which no write may be acknowledged while voters are
/// added and removed: one leader election after the leader removed itself
/// (followers wait out the old leader's lease, up to `election_timeout_max`,
/// then a randomized election timeout, again up to `election_timeout_max`)
/// plus 5 s of slack, the liveness rule of the chaos suite (writes resume
/// within 5 s of the election) for a small test machine running 11
/// in-process nodes and 4 writers (the MetaClient's retry backoff of up to
/// 500 ms, a PUT in flight, scheduling). 3 s of slack is too little under
/// a full CI run across a ReplaceVoter of the leader.
fn outage_bound() -> Duration {
    ELECTION_TIMEOUT_MAX * 2 + Duration::from_secs(5)
}

fn http(addr: std::net::SocketAddr) -> String {
    format!("http://{addr}")
}

/// A leader-following admin client on `seeds`.
fn admin(seeds: Vec<String>) -> MetaClient {
    MetaClient::with_timeouts(seeds, Duration::from_secs(30), Duration::from_secs(120))
        .with_transport(crate::fixtures::admin_transport())
}

async fn list_members(c: &MetaClient) -> Result<apb::ListMembersResponse, MetaError> {
    c.call_on("ListMembers", |ch| async move {
        AdminClient::new(ch)
            .list_members(apb::ListMembersRequest {})
            .await
    })
    .await
}

async fn add_voter(
    c: &MetaClient,
    id: u64,
    addr: &str,
    catch_up: Duration,
) -> Result<apb::MembershipResponse, MetaError> {
    let req = apb::AddVoterRequest {
        id,
        addr: addr.to_string(),
        catch_up_timeout_ms: Some(catch_up.as_millis() as u64),
    };
    c.call_on("AddVoter", |ch| {
        let req = req.clone();
        async move { AdminClient::new(ch).add_voter(req).await }
    })
    .await
}

async fn remove_voter(c: &MetaClient, id: u64) -> Result<apb::MembershipResponse, MetaError> {
    c.call_on("RemoveVoter", |ch| async move {
        AdminClient::new(ch)
            .remove_voter(apb::RemoveVoterRequest { id })
            .await
    })
    .await
}

async fn replace_voter(
    c: &MetaClient,
    old_id: u64,
    new_id: u64,
    new_addr: &str,
) -> Result<apb::MembershipResponse, MetaError> {
    let req = apb::ReplaceVoterRequest {
        old_id,
        new_id,
        new_addr: new_addr.to_string(),
        catch_up_timeout_ms: Some(60_000),
    };
    c.call_on("ReplaceVoter", |ch| {
        let req = req.clone();
        async move { AdminClient::new(ch).replace_voter(req).await }
    })
    .await
}

fn voters(m: &apb::ListMembersResponse) -> BTreeSet<u64> {
    m.members.iter().filter(|x| x.voter).map(|x| x.id).collect()
}

fn learners(m: &apb::ListMembersResponse) -> BTreeSet<u64> {
    m.members
        .iter()
        .filter(|x| !x.voter)
        .map(|x| x.id)
        .collect()
}

/// Fails unless `res` is a refusal with `code`; returns its message.
fn expect_refused<T: std::fmt::Debug>(
    what: &str,
    res: Result<T, MetaError>,
    code: ErrorCode,
) -> Result<String> {
    match res {
        Err(MetaError::Refused { code: got, message }) if got == code => {
            eprintln!("{what}: refused as expected: {message}");
            Ok(message)
        }
        other => bail!("{what}: want {code:?}, got {other:?}"),
    }
}

/// ListMembers sent to `addr` itself (no leader following).
async fn list_members_on(
    addr: std::net::SocketAddr,
) -> Result<apb::ListMembersResponse, tonic::Status> {
    let channel = crate::fixtures::admin_transport()
        .endpoint(&http(addr), sluice_net::Role::Meta)
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    AdminClient::new(channel)
        .list_members(apb::ListMembersRequest {})
        .await
        .map(|r| r.into_inner())
}

/// Waits until every running meta node agrees on a leader that reports
/// `want` as its voters with no change in progress.
async fn wait_voters(
    c: &TestCluster,
    admin: &MetaClient,
    want: &BTreeSet<u64>,
) -> Result<apb::ListMembersResponse> {
    wait_until("the expected meta voters", CONVERGE_TIMEOUT, || async {
        let m = list_members(admin).await.map_err(|e| e.to_string())?;
        if &voters(&m) == want && !m.change_in_progress && learners(&m).is_empty() {
            Ok(m)
        } else {
            Err(format!("members {:?}", m.members))
        }
    })
    .await
    .and_then(|m| {
        c.check_alive()?;
        Ok(m)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_changes_are_refused_when_unsafe() -> Result<()> {
    let mut c = TestCluster::start_setup_without_gateway(3, 0, Setup::default()).await?;
    let seeds: Vec<String> = c.metas.iter().map(|m| http(m.addr())).collect();
    let admin = admin(seeds);
    let leader = c.wait_leader().await?;

    // ListMembers: three voters, the leader marked, indexes reported.
    let m = list_members(&admin).await?;
    ensure!(
        voters(&m) == BTreeSet::from([1, 2, 3]),
        "voters {:?}",
        m.members
    );
    ensure!(
        m.leader_id == leader,
        "leader {} want {leader}",
        m.leader_id
    );
    ensure!(m.term >= 1, "term {}", m.term);
    let commit = m.commit_index.context("no commit index")?;
    ensure!(commit >= 1 && m.applied_index.is_some(), "indexes {m:?}");
    for x in &m.members {
        ensure!(x.leader == (x.id == leader), "leader flag of {x:?}");
        ensure!(
            x.addr == http(c.metas[x.id as usize - 1].addr()),
            "addr of {x:?}"
        );
        ensure!(x.matched_index.is_some(), "no matched index for {x:?}");
    }

    // A follower answers NOT_LEADER with the leader's address from the
    // Raft membership.
    let follower = (1..=3u64).find(|id| *id != leader).unwrap();
    let status = list_members_on(c.metas[follower as usize - 1].addr())
        .await
        .expect_err("a follower must refuse ListMembers");
    let detail = sluice_proto::error::detail(&status).context("NOT_LEADER without detail")?;
    ensure!(detail.code() == ErrorCode::NotLeader, "{status:?}");
    ensure!(detail.leader_id == Some(leader), "hint {detail:?}");
    ensure!(
        detail.leader_addr.as_deref() == Some(http(c.metas[leader as usize - 1].addr()).as_str()),
        "hint {detail:?}"
    );

    // Unknown ids and bad addresses.
    expect_refused(
        "remove unknown 99",
        remove_voter(&admin, 99).await,
        ErrorCode::InvalidArgument,
    )?;
    expect_refused(
        "add with a bad address",
        add_voter(&admin, 4, "127.0.0.1:1", Duration::from_secs(1)).await,
        ErrorCode::InvalidArgument,
    )?;
    let taken = http(c.metas[0].addr());
    expect_refused(
        "add with a member's address",
        add_voter(&admin, 4, &taken, Duration::from_secs(1)).await,
        ErrorCode::InvalidArgument,
    )?;

    // A learner that never catches up (nothing listens there) is removed
    // again; meanwhile a second change is refused as in progress.
    let nobody = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let nobody_addr = http(nobody.local_addr()?);
    drop(nobody);
    let slow = {
        let admin = admin.clone();
        let nobody_addr = nobody_addr.clone();
        tokio::spawn(
            async move { add_voter(&admin, 7, &nobody_addr, Duration::from_secs(3)).await },
        )
    };
    wait_until(
        "node 7 to show up as a learner",
        Duration::from_secs(10),
        || async {
            let m = list_members(&admin).await.map_err(|e| e.to_string())?;
            if learners(&m).contains(&7) {
                Ok(())
            } else {
                Err(format!("{:?}", m.members))
            }
        },
    )
    .await?;
    let msg = expect_refused(
        "remove while an add is in progress",
        remove_voter(&admin, follower).await,
        ErrorCode::MembershipChangeRefused,
    )?;
    ensure!(msg.contains("in progress"), "message {msg:?}");
    let msg = expect_refused(
        "add that never catches up",
        slow.await?,
        ErrorCode::MembershipChangeRefused,
    )?;
    ensure!(msg.contains("did not catch up"), "message {msg:?}");
    wait_voters(&c, &admin, &BTreeSet::from([1, 2, 3])).await?;

    // With one follower down, removing the other would leave {leader,
    // down}: no live quorum.
    let others: Vec<u64> = (1..=3u64).filter(|id| *id != leader).collect();
    c.metas[others[0] as usize - 1].stop().await?;
    let msg = expect_refused(
        "remove leaving no live quorum",
        remove_voter(&admin, others[1]).await,
        ErrorCode::MembershipChangeRefused,
    )?;
    ensure!(msg.contains("no live quorum"), "message {msg:?}");
    c.metas[others[0] as usize - 1].start().await?;
    c.wait_leader().await?;

    // Down to one voter, then the last one cannot go.
    for id in &others {
        let r = remove_voter(&admin, *id).await?;
        eprintln!("{}", r.message);
        c.metas[*id as usize - 1].stop().await?;
    }
    let m = wait_voters(&c, &admin, &BTreeSet::from([leader])).await?;
    ensure!(m.leader_id == leader, "leader changed: {m:?}");
    let msg = expect_refused(
        "remove the last voter",
        remove_voter(&admin, leader).await,
        ErrorCode::MembershipChangeRefused,
    )?;
    ensure!(msg.contains("last voter"), "message {msg:?}");
    // The single voter still commits.
    c.meta().create_bucket("still-writable", 0).await?;
    Ok(())
}

/// One acknowledged write.
struct Ack {
    key: String,
    sha256: String,
    len: usize,
    at: Instant,
}

#[derive(Default)]
struct Load {
    acks: Vec<Ack>,
    /// (first failed attempt, next success) of every failure stretch.
    failures: Vec<(Instant, Instant)>,
    failed_attempts: u64,
}

const BUCKET: &str = "load";
const WRITERS: usize = 4;

/// PUTs objects until `stop`, recording acknowledged keys and failure
/// stretches. Each failed attempt is retried with the same key and body
/// after 50 ms.
async fn writer(
    s3: aws_sdk_s3::Client,
    w: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    load: Arc<Mutex<Load>>,
) -> Result<()> {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w{w}/{n:06}");
        let len = 16 * 1024 + ((seed as usize ^ (n as usize * 7919)) % (96 * 1024));
        let data = random_bytes(seed ^ ((w as u64) << 32) ^ n, len);
        let mut failed_since: Option<Instant> = None;
        loop {
            let res = s3
                .put_object()
                .bucket(BUCKET)
                .key(&key)
                .body(ByteStream::from(data.clone()))
                .send()
                .await;
            match res {
                Ok(_) => {
                    let now = Instant::now();
                    let mut l = load.lock().await;
                    l.acks.push(Ack {
                        key: key.clone(),
                        sha256: sha256_hex(&data),
                        len,
                        at: now,
                    });
                    if let Some(since) = failed_since {
                        l.failures.push((since, now));
                    }
                    break;
                }
                Err(e) => {
                    failed_since.get_or_insert_with(Instant::now);
                    load.lock().await.failed_attempts += 1;
                    eprintln!(
                        "writer {w}: PUT {key} failed: {}",
                        aws_sdk_s3::error::DisplayErrorContext(&e)
                    );
                    if stop.load(Ordering::Relaxed)
                        && failed_since.is_some_and(|s| s.elapsed() > Duration::from_secs(60))
                    {
                        bail!("writer {w}: {key} failing for 60 s");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        n += 1;
    }
    Ok(())
}

/// The longest stretch inside `[from, to]` without an acknowledged write.
fn longest_gap(acks: &[Ack], from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = acks
        .iter()
        .map(|a| a.at)
        .filter(|t| *t >= from && *t <= to)
        .collect();
    times.push(from);
    times.push(to);
    times.sort();
    times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn voters_replaced_under_write_load() -> Result<()> {
    let seed = test_seed("voters_replaced_under_write_load");
    let mut c = TestCluster::start(3, 6).await?;
    let original: Vec<String> = c.metas.iter().map(|m| http(m.addr())).collect();
    // The admin client and every datanode and the gateway know only the
    // original three nodes.
    let admin = admin(original.clone());
    let s3 = c.s3();
    s3.create_bucket().bucket(BUCKET).send().await?;

    let writer_s3 = {
        let config = c
            .s3_without_retries()
            .config()
            .to_builder()
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(30))
                    .build(),
            )
            .build();
        aws_sdk_s3::Client::from_conf(config)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Mutex::new(Load::default()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(writer(
                writer_s3.clone(),
                w,
                seed,
                stop.clone(),
                load.clone(),
            ))
        })
        .collect();
    wait_until("writers to get going", CONVERGE_TIMEOUT, || async {
        let n = load.lock().await.acks.len();
        if n >= 20 {
            Ok(())
        } else {
            Err(format!("{n} acks"))
        }
    })
    .await?;
    let phase_start = Instant::now();
    let step = |what: &str| {
        eprintln!(
            "[membership {:>6.1}s] {what}",
            phase_start.elapsed().as_secs_f64()
        )
    };

    // ---- Add node 4.
    let four = c.add_meta_node(None).await?;
    let four_addr = http(c.metas[four].addr());
    let r = add_voter(&admin, 4, &four_addr, Duration::from_secs(60)).await?;
    step(&r.message);
    wait_voters(&c, &admin, &BTreeSet::from([1, 2, 3, 4])).await?;

    // ---- Remove the current leader (one of the original three), stop it.
    let leader = c.wait_leader().await?;
    let removed_leader = if leader == 4 {
        // Unlikely (4 only just joined); remove an original voter instead.
        1
    } else {
        leader
    };
    let r = remove_voter(&admin, removed_leader).await?;
    step(&r.message);
    c.metas[removed_leader as usize - 1].stop().await?;
    step(&format!("stopped meta-{removed_leader}"));
    let mut want: BTreeSet<u64> = BTreeSet::from([1, 2, 3, 4]);
    want.remove(&removed_leader);
    let m = wait_voters(&c, &admin, &want).await?;
    step(&format!("new leader {} in term {}", m.leader_id, m.term));

    // ---- Replace another original voter by node 5, stop it.
    let replaced = (1..=3u64).find(|id| *id != removed_leader).unwrap();
    let five = c.add_meta_node(None).await?;
    let five_addr = http(c.metas[five].addr());
    let r = replace_voter(&admin, replaced, 5, &five_addr).await?;
    step(&r.message);
    c.metas[replaced as usize - 1].stop().await?;
    step(&format!("stopped meta-{replaced}"));
    want.remove(&replaced);
    want.insert(5);
    let m = wait_voters(&c, &admin, &want).await?;
    step(&format!("voters {want:?}, leader {}", m.leader_id));

    // Writes keep being acknowledged afterwards, then stop the load.
    let settled = load.lock().await.acks.len();
    wait_until("writes after the changes", CONVERGE_TIMEOUT, || async {
        let n = load.lock().await.acks.len();
        if n >= settled + 20 {
            Ok(())
        } else {
            Err(format!("{n} acks, {settled} before"))
        }
    })
    .await?;
    let phase_end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await??;
    }
    let load = Arc::try_unwrap(load)
        .ok()
        .context("writers still hold the load")?
        .into_inner();
    let gap = longest_gap(&load.acks, phase_start, phase_end);
    let longest_failure = load
        .failures
        .iter()
        .map(|(a, b)| *b - *a)
        .max()
        .unwrap_or_default();
    eprintln!(
        "{} writes acknowledged, {} failed attempts in {} stretches; longest stretch without an acknowledged write {gap:?}, longest failure stretch {longest_failure:?}, bound {:?}",
        load.acks.len(),
        load.failed_attempts,
        load.failures.len(),
        outage_bound()
    );
    ensure!(
        gap < outage_bound(),
        "writes stalled for {gap:?}, bound {:?}",
        outage_bound()
    );
    ensure!(
        longest_failure < outage_bound(),
        "writes failed for {longest_failure:?}, bound {:?}",
        outage_bound()
    );

    // Every acknowledged write reads back byte-identical.
    for a in &load.acks {
        let got = crate::get_all(&s3, BUCKET, &a.key).await?;
        ensure!(
            got.len() == a.len && sha256_hex(&got) == a.sha256,
            "{}: read {} bytes sha256 {}, acknowledged {} bytes sha256 {}",
            a.key,
            got.len(),
            sha256_hex(&got),
            a.len,
            a.sha256
        );
    }
    step(&format!(
        "all {} acknowledged objects read back",
        load.acks.len()
    ));

    // Clients whose seeds name removed (stopped) nodes still find the
    // leader: the fixture's MetaClient and the admin client know only the
    // original three, two of which are gone.
    c.meta().create_bucket("after-replace", 0).await?;
    ensure!(
        c.meta()
            .list_buckets()
            .await?
            .iter()
            .any(|b| b.name == "after-replace"),
        "bucket missing"
    );
    // A follower's hint names the leader by its Raft address, a new node's
    // included.
    let m = list_members(&admin).await?;
    let leader_addr = m
        .members
        .iter()
        .find(|x| x.leader)
        .map(|x| x.addr.clone())
        .context("no leader in ListMembers")?;
    for id in &want {
        if *id == m.leader_id {
            continue;
        }
        let status = list_members_on(c.metas[*id as usize - 1].addr())
            .await
            .expect_err("a follower must refuse ListMembers");
        let detail = sluice_proto::error::detail(&status).context("no detail")?;
        ensure!(detail.code() == ErrorCode::NotLeader, "{status:?}");
        ensure!(
            detail.leader_addr.as_deref() == Some(leader_addr.as_str()),
            "hint {detail:?}, leader at {leader_addr}"
        );
    }

    // ---- Restart every meta node that is a member: the membership lives
    // in Raft, the removed nodes stay out.
    c.stop_all().await?;
    for id in &want {
        c.metas[*id as usize - 1].start().await?;
    }
    c.wait_leader().await?;
    let m = wait_voters(&c, &admin, &want).await?;
    ensure!(
        !voters(&m).contains(&removed_leader) && !voters(&m).contains(&replaced),
        "{m:?}"
    );
    step(&format!(
        "after a restart of every meta node: voters {:?}",
        voters(&m)
    ));
    for d in &mut c.datanodes {
        d.start().await?;
    }
    c.wait_datanodes_live().await?;
    c.gateway.start().await?;
    c.wait_gateway().await?;
    for a in load.acks.iter().step_by(10) {
        let got = crate::get_all(&s3, BUCKET, &a.key).await?;
        ensure!(sha256_hex(&got) == a.sha256, "{} after restart", a.key);
    }
    Ok(())
}
