//! The byte-credit protocol over real gRPC: `run()` on a port-0 listener
//! with a real data dir and a small write budget, driven by the generated
//! client acting as one or two gateways. Every wait is on a condition with
//! a timeout.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_datanode::{Config, MAX_MESSAGE_BYTES, block_crc32c, run};
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{
    CreditGrant, CreditReport, CreditStreamRequest, GetShardRequest, PutShardRequest,
    PutShardResponse, ShardBlock, ShardEnd, ShardHeader,
};
use sluice_util::byte_size::ByteSize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const WAIT: Duration = Duration::from_secs(10);
const KIB: u64 = 1024;
/// The datanode's write budget in these tests.
const BUDGET: u64 = 1024 * KIB;
const FSYNC_BYTES: u64 = 256 * KIB;
const BLOCK: usize = 64 * 1024;

struct Node {
    addr: String,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), sluice_datanode::Error>>,
}

impl Node {
    async fn start(data_dir: &Path) -> Result<Node> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = format!("http://{}", listener.local_addr()?);
        // Nothing listens there: registration keeps retrying meanwhile.
        let meta = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
        let config = Config {
            node_id: 9,
            listen: listener.local_addr()?,
            advertise_addr: addr.clone(),
            data_dir: data_dir.to_path_buf(),
            meta_endpoints: vec![format!("http://{meta}")],
            heartbeat_interval: Duration::from_millis(100),
            shutdown_grace: Duration::from_secs(2),
            write_budget_bytes: Some(ByteSize(BUDGET)),
            credit_fsync_bytes: ByteSize(FSYNC_BYTES),
            insecure_cluster: true,
            ..Config::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(run(config, listener, async {
            let _ = stopped.await;
        }));
        Ok(Node { addr, stop, handle })
    }

    async fn client(&self) -> Result<DatanodeClient<Channel>> {
        Ok(DatanodeClient::connect(self.addr.clone())
            .await?
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.handle)
            .await
            .context("run() did not return")???;
        Ok(())
    }
}

/// A gateway's side of one credit stream.
struct Gateway {
    id: String,
    client: DatanodeClient<Channel>,
    grants: Streaming<CreditGrant>,
    /// Bytes granted so far on this stream.
    granted: u64,
    /// Credit held: granted, not yet spent on blocks or returned.
    balance: u64,
}

impl Gateway {
    async fn open(node: &Node, id: &str) -> Result<Gateway> {
        let mut client = node.client().await?;
        let grants = client
            .credits(CreditStreamRequest {
                gateway_id: id.into(),
            })
            .await?
            .into_inner();
        Ok(Gateway {
            id: id.into(),
            client,
            grants,
            granted: 0,
            balance: 0,
        })
    }

    /// Reports demand and returns `returned` bytes of the balance.
    async fn report(&mut self, wanted: u64, returned: u64) -> Result<(), tonic::Status> {
        assert!(returned <= self.balance, "returning credit not held");
        self.balance -= returned;
        self.client
            .report_credits(CreditReport {
                gateway_id: self.id.clone(),
                wanted_bytes: wanted,
                returned_bytes: returned,
            })
            .await
            .map(|_| ())
    }

    /// Reads grants until `granted` reaches `total`; fails past it or on timeout.
    async fn granted_reaches(&mut self, total: u64) -> Result<()> {
        self.granted_at_least(total).await?;
        if self.granted > total {
            bail!("{}: granted {} > expected {total}", self.id, self.granted);
        }
        Ok(())
    }

    /// Reads grants until `granted` is at least `total`; fails on timeout.
    async fn granted_at_least(&mut self, total: u64) -> Result<()> {
        tokio::time::timeout(WAIT, async {
            while self.granted < total {
                match self.grants.next().await {
                    Some(Ok(g)) => {
                        self.granted += g.bytes;
                        self.balance += g.bytes;
                    }
                    Some(Err(status)) => bail!("{}: credit stream failed: {status}", self.id),
                    None => bail!("{}: credit stream ended", self.id),
                }
            }
            Ok(())
        })
        .await
        .with_context(|| format!("{}: waiting for {total} bytes granted", self.id))?
    }

    /// Puts `data` as shard `(blob, 0)` debited from this gateway, which
    /// must hold credit for all of it.
    async fn put(&mut self, blob: &str, data: &[u8]) -> Result<PutShardResponse, tonic::Status> {
        assert!(data.len() as u64 <= self.balance, "sending beyond credit");
        self.balance -= data.len() as u64;
        let mut msgs = shard_messages(blob, &self.id, data);
        msgs.push(shard_end(data));
        self.client
            .put_shard(tokio_stream::iter(msgs))
            .await
            .map(|r| r.into_inner())
    }
}

fn shard_messages(blob: &str, gateway: &str, data: &[u8]) -> Vec<PutShardRequest> {
    let mut msgs = vec![PutShardRequest {
        msg: Some(Msg::Header(ShardHeader {
            blob_id: blob.into(),
            shard_index: 0,
            block_size: BLOCK as u32,
            gateway_id: gateway.into(),
        })),
    }];
    msgs.extend(data.chunks(BLOCK).map(|c| PutShardRequest {
        msg: Some(Msg::Block(ShardBlock {
            data: c.to_vec().into(),
            crc32c: block_crc32c(c),
        })),
    }));
    msgs
}

/// The end message of a shard of `data`.
fn shard_end(data: &[u8]) -> PutShardRequest {
    PutShardRequest {
        msg: Some(Msg::End(ShardEnd {
            blocks: data.chunks(BLOCK).count() as u64,
            bytes: data.len() as u64,
        })),
    }
}

fn payload(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

async fn read_shard(c: &mut DatanodeClient<Channel>, blob: &str) -> Result<Vec<u8>> {
    let mut stream = c
        .get_shard(GetShardRequest {
            blob_id: blob.into(),
            shard_index: 0,
            first_block: 0,
            block_count: 0,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(item) = stream.next().await {
        out.extend_from_slice(&item?.block.context("block")?.data);
    }
    Ok(out)
}

/// Reads both gateways' grants until together they got `total` more bytes;
/// returns what each got.
async fn shared_grants(a: &mut Gateway, b: &mut Gateway, total: u64) -> Result<(u64, u64)> {
    let (a0, b0) = (a.granted, b.granted);
    tokio::time::timeout(WAIT, async {
        while (a.granted - a0) + (b.granted - b0) < total {
            let (who, next) = tokio::select! {
                n = a.grants.next() => (&mut *a, n),
                n = b.grants.next() => (&mut *b, n),
            };
            match next {
                Some(Ok(g)) => {
                    who.granted += g.bytes;
                    who.balance += g.bytes;
                }
                other => bail!("{}: credit stream broke: {other:?}", who.id),
            }
        }
        Ok(())
    })
    .await
    .context("waiting for shared grants")??;
    Ok((a.granted - a0, b.granted - b0))
}

#[tokio::test]
async fn grant_spend_and_regrant_after_fsync() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut g1 = Gateway::open(&node, "g1").await?;

    // Demand above the budget: exactly the budget is granted.
    g1.report(4 * BUDGET, 0).await?;
    g1.granted_reaches(BUDGET).await?;

    // Spend all of it on one shard while still wanting more: the only
    // source of new credit is this shard's bytes reaching disk.
    g1.report(BUDGET, 0).await?;
    let data = payload(BUDGET, 1);
    let r = g1.put("credited", &data).await?;
    assert_eq!((r.bytes_written, r.blocks), (BUDGET, BUDGET / BLOCK as u64));
    g1.granted_reaches(2 * BUDGET).await?;
    assert_eq!(read_shard(&mut g1.client, "credited").await?, data);

    // A credited stream that fails (bad checksum on its last block) gives
    // back what it had received.
    g1.report(BUDGET, 0).await?;
    g1.balance -= BUDGET;
    let mut msgs = shard_messages("broken", "g1", &payload(BUDGET, 2));
    if let Some(Msg::Block(b)) = msgs.last_mut().and_then(|m| m.msg.as_mut()) {
        b.crc32c ^= 1;
    }
    let err = g1
        .client
        .put_shard(tokio_stream::iter(msgs))
        .await
        .expect_err("bad checksum");
    assert_eq!(err.code(), Code::InvalidArgument);
    g1.granted_reaches(3 * BUDGET).await?;

    // Idle credit goes back; an unknown gateway cannot report.
    g1.report(0, BUDGET).await?;
    let err = g1
        .client
        .report_credits(CreditReport {
            gateway_id: "nobody".into(),
            wanted_bytes: 1,
            returned_bytes: 0,
        })
        .await
        .expect_err("no credit stream");
    assert_eq!(err.code(), Code::FailedPrecondition);

    // Shutdown ends the long-lived stream at once, with UNAVAILABLE.
    node.stop().await?;
    match tokio::time::timeout(WAIT, g1.grants.next()).await? {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable),
        other => bail!("credit stream at shutdown: {other:?}"),
    }
    Ok(())
}

/// Sends `shards` as a gateway must: blocks round-robin over concurrent
/// PutShard streams, each debited from the local balance before it goes on
/// the wire, waiting for grants (and reporting the demand) when short.
/// Then returns the credit left over to the datanode.
async fn send_within_credit(g: &mut Gateway, shards: &[(&str, Vec<u8>)]) -> Result<()> {
    let mut queues = Vec::new();
    let mut calls = Vec::new();
    for (blob, data) in shards {
        let mut msgs = shard_messages(blob, &g.id, data).into_iter();
        let (tx, rx) = mpsc::channel(4);
        tx.send(msgs.next().context("header")?).await?;
        let mut client = g.client.clone();
        calls.push(tokio::spawn(async move {
            client.put_shard(ReceiverStream::new(rx)).await
        }));
        queues.push((tx, msgs.collect::<Vec<_>>().into_iter(), shard_end(data)));
    }
    let mut left: u64 = shards.iter().map(|(_, d)| d.len() as u64).sum();
    while !queues.is_empty() {
        let mut i = 0;
        while i < queues.len() {
            let Some(block) = queues[i].1.next() else {
                // The end message, then the end of the stream, lets the
                // datanode commit.
                let (tx, _, end) = queues.remove(i);
                tx.send(end).await?;
                continue;
            };
            let len = match &block.msg {
                Some(Msg::Block(b)) => b.data.len() as u64,
                _ => bail!("not a block"),
            };
            if g.balance < len {
                g.report(left - g.balance, 0).await?;
                let target = g.granted + (len - g.balance);
                g.granted_at_least(target)
                    .await
                    .context("stalled waiting for credit")?;
            }
            g.balance -= len;
            left -= len;
            queues[i].0.send(block).await?;
            i += 1;
        }
    }
    for (call, (_, data)) in calls.into_iter().zip(shards) {
        let r = call.await??.into_inner();
        assert_eq!(r.bytes_written, data.len() as u64);
    }
    let idle = g.balance;
    g.report(0, idle).await?;
    Ok(())
}

#[tokio::test]
async fn shards_larger_than_the_budget_stream_through() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut g = Gateway::open(&node, "g1").await?;

    // One shard of 4× the budget: it completes only because its bytes are
    // fsynced and re-granted while the stream is still open.
    let big = payload(4 * BUDGET, 7);
    send_within_credit(&mut g, &[("big", big.clone())]).await?;
    assert_eq!(read_shard(&mut g.client, "big").await?, big);

    // Eight concurrent shards whose partial writes each stay below
    // `credit_fsync_bytes` while the budget is used up: idle fsync releases
    // them, or this would stall.
    let shards: Vec<(String, Vec<u8>)> = (0..8u8)
        .map(|i| (format!("many-{i}"), payload(BUDGET / 2, i)))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = shards
        .iter()
        .map(|(b, d)| (b.as_str(), d.clone()))
        .collect();
    send_within_credit(&mut g, &refs).await?;
    for (blob, data) in &shards {
        assert_eq!(&read_shard(&mut g.client, blob).await?, data, "{blob}");
    }
    node.stop().await
}

#[tokio::test]
async fn two_gateways_share_the_budget_fairly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut g1 = Gateway::open(&node, "g1").await?;
    let mut g2 = Gateway::open(&node, "g2").await?;

    // g1 came first and holds everything; g2's demand waits.
    g1.report(BUDGET, 0).await?;
    g1.granted_reaches(BUDGET).await?;
    g2.report(BUDGET, 0).await?;

    // g1 hands everything back while both want the whole budget: half each.
    g1.report(BUDGET, BUDGET).await?;
    let (a, b) = shared_grants(&mut g1, &mut g2, BUDGET).await?;
    assert_eq!((a, b), (BUDGET / 2, BUDGET / 2));

    // Both spend their half and keep wanting the whole budget: as the
    // bytes reach disk, the credit is shared again, about evenly.
    g1.report(BUDGET, 0).await?;
    g2.report(BUDGET, 0).await?;
    let (d1, d2) = (payload(BUDGET / 2, 3), payload(BUDGET / 2, 4));
    let (r1, r2) = tokio::join!(g1.put("fair-1", &d1), g2.put("fair-2", &d2));
    assert_eq!(r1?.bytes_written, BUDGET / 2);
    assert_eq!(r2?.bytes_written, BUDGET / 2);
    let (a, b) = shared_grants(&mut g1, &mut g2, BUDGET).await?;
    assert!(
        a.abs_diff(b) <= 2 * BLOCK as u64,
        "unfair re-grant: g1 {a}, g2 {b}"
    );
    node.stop().await
}

#[tokio::test]
async fn a_dropped_credit_stream_returns_its_credit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut g1 = Gateway::open(&node, "g1").await?;
    let mut g2 = Gateway::open(&node, "g2").await?;
    g1.report(BUDGET, 0).await?;
    g1.granted_reaches(BUDGET).await?;
    g2.report(BUDGET, 0).await?;

    // g1 goes away without returning anything: dropping its stream resets
    // it, and the datanode takes the credit back and gives it to g2.
    let Gateway {
        grants, mut client, ..
    } = g1;
    drop(grants);
    g2.granted_reaches(BUDGET).await?;
    let err = client
        .report_credits(CreditReport {
            gateway_id: "g1".into(),
            wanted_bytes: 1,
            returned_bytes: 0,
        })
        .await
        .expect_err("g1 has no stream any more");
    assert_eq!(err.code(), Code::FailedPrecondition);
    node.stop().await
}

#[tokio::test]
async fn a_second_stream_replaces_the_first() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path()).await?;
    let mut old = Gateway::open(&node, "g1").await?;
    old.report(BUDGET, 0).await?;
    old.granted_reaches(BUDGET).await?;

    // The gateway restarted under the same id: the old credit is forfeited
    // and the new stream can be granted the whole budget.
    let mut new = Gateway::open(&node, "g1").await?;
    match tokio::time::timeout(WAIT, old.grants.next()).await? {
        Some(Err(status)) => assert_eq!(status.code(), Code::Aborted),
        other => bail!("replaced credit stream: {other:?}"),
    }
    new.report(BUDGET, 0).await?;
    new.granted_reaches(BUDGET).await?;

    let err = Gateway::open(&node, "bad id")
        .await
        .err()
        .context("bad id")?;
    let status = err.downcast::<tonic::Status>()?;
    assert_eq!(status.code(), Code::InvalidArgument);
    node.stop().await
}
