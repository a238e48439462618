//! Mutual TLS and the per-RPC role policy, over real sockets and real TLS
//! against an in-process cluster: for each service (Meta, Raft and Admin
//! on meta; Datanode) a TLS caller without a client certificate gets
//! `UNAUTHENTICATED`, a wrong-role (or wrong-id) certificate
//! `PERMISSION_DENIED`, and nothing changes; a plaintext client cannot talk
//! to a TLS server; a PutShard beyond the sender's credit is refused and
//! not stored, and so is a block whose CRC32C does not match its bytes.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use sluice_net::{Role, Transport};
use sluice_proto::datanode::datanode_client::DatanodeClient;
use sluice_proto::datanode::put_shard_request::Msg;
use sluice_proto::datanode::{
    CreditStreamRequest, PutShardRequest, ShardBlock, ShardEnd, ShardHeader,
};
use sluice_proto::meta::meta_client::MetaClient as MetaRpc;
use sluice_proto::meta::{
    CollectableRequest, CreateBucketRequest, HeartbeatRequest, ListBucketsRequest,
    ListDatanodesRequest, ObjectRecord, PutObjectRequest, RegisterDatanodeRequest,
    ReportMissingRequest, ShardRef,
};
use sluice_proto::raft::raft_client::RaftClient;
use sluice_proto::raft::{AppendEntriesRequest, LeaderId, Vote, VoteRequest};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::fixtures::{
    Overrides, TestCluster, ca_file, harness_transport, has_shards, meta_status, transport_as,
};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS channel that trusts the cluster CA but presents no certificate.
async fn no_cert(addr: SocketAddr, server: Role) -> Result<Channel> {
    let ca = std::fs::read_to_string(ca_file())?;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(server.dns_name());
    Ok(Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .timeout(TIMEOUT)
        .connect()
        .await?)
}

/// A mutual-TLS channel presenting a `role`/`id` certificate.
async fn as_role(addr: SocketAddr, server: Role, role: Role, id: &str) -> Result<Channel> {
    Ok(transport_as(role, id)
        .endpoint(&format!("http://{addr}"), server)?
        .timeout(TIMEOUT)
        .connect()
        .await?)
}

fn expect_code<T: std::fmt::Debug>(
    what: &str,
    r: std::result::Result<T, tonic::Status>,
    code: Code,
) -> Result<()> {
    match r {
        Err(s) if s.code() == code => Ok(()),
        other => anyhow::bail!("{what}: expected {code:?}, got {other:?}"),
    }
}

async fn bucket_names(c: &TestCluster) -> Result<Vec<String>> {
    Ok(c.meta()
        .list_buckets()
        .await?
        .into_iter()
        .map(|b| b.name)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_services_refuse_unauthenticated_and_wrong_role_callers() -> Result<()> {
    let c = TestCluster::start_without_gateway(1, 2, Overrides::default()).await?;
    let meta = c.metas[0].addr();

    // Meta service: no certificate -> UNAUTHENTICATED.
    let mut anon = MetaRpc::new(no_cert(meta, Role::Meta).await?);
    expect_code(
        "ListBuckets without a certificate",
        anon.list_buckets(ListBucketsRequest {}).await,
        Code::Unauthenticated,
    )?;
    expect_code(
        "CreateBucket without a certificate",
        anon.create_bucket(CreateBucketRequest {
            name: "anon".into(),
            now_ms: 1,
            op_id: "op-anon".into(),
            ..Default::default()
        })
        .await,
        Code::Unauthenticated,
    )?;

    // A datanode certificate may not write metadata.
    let mut dn = MetaRpc::new(as_role(meta, Role::Meta, Role::Datanode, "1").await?);
    expect_code(
        "CreateBucket as datanode",
        dn.create_bucket(CreateBucketRequest {
            name: "bydatanode".into(),
            now_ms: 1,
            op_id: "op-dn".into(),
            ..Default::default()
        })
        .await,
        Code::PermissionDenied,
    )?;
    expect_code(
        "PutObject as datanode",
        dn.put_object(PutObjectRequest {
            object: Some(ObjectRecord {
                bucket: "bydatanode".into(),
                key: "k".into(),
                ..Default::default()
            }),
            condition: None,
            op_id: "op-dn-put".into(),
        })
        .await,
        Code::PermissionDenied,
    )?;
    // An admin certificate may read the datanode list but not write.
    let mut admin = MetaRpc::new(as_role(meta, Role::Meta, Role::Admin, "ops").await?);
    admin
        .list_datanodes(ListDatanodesRequest {})
        .await
        .context("ListDatanodes as admin")?;
    expect_code(
        "CreateBucket as admin",
        admin
            .create_bucket(CreateBucketRequest {
                name: "byadmin".into(),
                now_ms: 1,
                op_id: "op-admin".into(),
                ..Default::default()
            })
            .await,
        Code::PermissionDenied,
    )?;
    let names = bucket_names(&c).await?;
    ensure!(names.is_empty(), "refused calls created buckets: {names:?}");

    // A datanode heartbeats and registers only as itself.
    let registry = c.meta().list_datanodes().await?;
    let dn1 = registry.iter().find(|d| d.id == 1).context("datanode 1")?;
    let mut dn2 = MetaRpc::new(as_role(meta, Role::Meta, Role::Datanode, "2").await?);
    expect_code(
        "Heartbeat of datanode 1 with datanode 2's certificate",
        dn2.heartbeat(HeartbeatRequest {
            id: 1,
            addr: "http://127.0.0.1:1".into(),
            disk_id: dn1.disk_id.clone(),
            writable: true,
            ..Default::default()
        })
        .await,
        Code::PermissionDenied,
    )?;
    expect_code(
        "RegisterDatanode 1 with datanode 2's certificate",
        dn2.register_datanode(RegisterDatanodeRequest {
            id: 1,
            addr: "http://127.0.0.1:1".into(),
            disk_id: "stolen".into(),
            op_id: "op-steal".into(),
            ..Default::default()
        })
        .await,
        Code::PermissionDenied,
    )?;
    let after = c.meta().list_datanodes().await?;
    let dn1_after = after.iter().find(|d| d.id == 1).context("datanode 1")?;
    ensure!(
        dn1_after.addr == dn1.addr && dn1_after.disk_id == dn1.disk_id,
        "datanode 1 was re-registered: {dn1_after:?}"
    );
    // Nor does it report or ask about another node's shards: with datanode
    // 2's certificate, ReportMissing and Collectable for node 1 are refused
    // before they reach the state machine.
    let shard = ShardRef {
        blob_id: "not-a-blob".into(),
        shard_index: 0,
    };
    expect_code(
        "ReportMissing for datanode 1 with datanode 2's certificate",
        dn2.report_missing(ReportMissingRequest {
            node_id: 1,
            shards: vec![shard.clone()],
            op_id: "op-report".into(),
        })
        .await,
        Code::PermissionDenied,
    )?;
    expect_code(
        "Collectable for datanode 1 with datanode 2's certificate",
        dn2.collectable(CollectableRequest {
            node_id: 1,
            shards: vec![shard.clone()],
        })
        .await,
        Code::PermissionDenied,
    )?;
    // For its own node id the same calls pass the check (nothing to mark:
    // the blob does not exist).
    let own = dn2
        .report_missing(ReportMissingRequest {
            node_id: 2,
            shards: vec![shard.clone()],
            op_id: "op-report-own".into(),
        })
        .await?;
    ensure!(own.get_ref().marked == 0, "marked {own:?}");
    dn2.collectable(CollectableRequest {
        node_id: 2,
        shards: vec![shard],
    })
    .await?;
    // ... and a gateway certificate cannot heartbeat at all.
    let mut gw = MetaRpc::new(as_role(meta, Role::Meta, Role::Gateway, "x").await?);
    expect_code(
        "Heartbeat as gateway",
        gw.heartbeat(HeartbeatRequest {
            id: 1,
            ..Default::default()
        })
        .await,
        Code::PermissionDenied,
    )?;

    // Raft: only meta peers. A gateway voting with a huge term changes
    // nothing.
    let term = meta_status(meta).await.map_err(anyhow::Error::msg)?.term;
    let vote = Vote {
        leader_id: Some(LeaderId {
            term: term + 100,
            node_id: 9,
        }),
        committed: false,
    };
    let mut raft_gw = RaftClient::new(as_role(meta, Role::Meta, Role::Gateway, "x").await?);
    expect_code(
        "Vote as gateway",
        raft_gw
            .vote(VoteRequest {
                vote: Some(vote),
                last_log_id: None,
            })
            .await,
        Code::PermissionDenied,
    )?;
    expect_code(
        "AppendEntries as gateway",
        raft_gw
            .append_entries(AppendEntriesRequest {
                vote: Some(vote),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            })
            .await,
        Code::PermissionDenied,
    )?;
    let mut raft_anon = RaftClient::new(no_cert(meta, Role::Meta).await?);
    expect_code(
        "Vote without a certificate",
        raft_anon
            .vote(VoteRequest {
                vote: Some(vote),
                last_log_id: None,
            })
            .await,
        Code::Unauthenticated,
    )?;
    let after = meta_status(meta).await.map_err(anyhow::Error::msg)?;
    ensure!(after.term == term, "term moved {term} -> {}", after.term);
    ensure!(after.leader_id == Some(1), "leader changed: {after:?}");

    // Admin: admin certificates only (checked before routing, so it holds
    // for every Admin RPC, present and future).
    let path = "/sluice.admin.Admin/Anything";
    expect_code(
        "Admin RPC as gateway",
        raw_call(as_role(meta, Role::Meta, Role::Gateway, "x").await?, path).await,
        Code::PermissionDenied,
    )?;
    expect_code(
        "Admin RPC as meta",
        raw_call(as_role(meta, Role::Meta, Role::Meta, "2").await?, path).await,
        Code::PermissionDenied,
    )?;
    expect_code(
        "Admin RPC without a certificate",
        raw_call(no_cert(meta, Role::Meta).await?, path).await,
        Code::Unauthenticated,
    )?;
    // An admin passes the policy; the (non-existent) method is then
    // UNIMPLEMENTED.
    expect_code(
        "unknown Admin RPC as admin",
        raw_call(as_role(meta, Role::Meta, Role::Admin, "ops").await?, path).await,
        Code::Unimplemented,
    )?;
    // Unknown services are denied by default, whoever calls.
    expect_code(
        "unknown service as admin",
        raw_call(
            as_role(meta, Role::Meta, Role::Admin, "ops").await?,
            "/sluice.other.Other/Call",
        )
        .await,
        Code::PermissionDenied,
    )?;
    Ok(())
}

/// A unary call of `path` with an empty message.
async fn raw_call(channel: Channel, path: &'static str) -> std::result::Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    grpc.unary(
        tonic::Request::new(()),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        codec,
    )
    .await
    .map(drop)
}

/// Block size of the shards the tests send.
const BLOCK: usize = 64 * 1024;

fn shard_messages(blob: &str, gateway_id: &str, blocks: usize) -> Vec<PutShardRequest> {
    let data = vec![7u8; BLOCK];
    let mut msgs = vec![PutShardRequest {
        msg: Some(Msg::Header(ShardHeader {
            blob_id: blob.into(),
            shard_index: 0,
            block_size: BLOCK as u32,
            gateway_id: gateway_id.into(),
        })),
    }];
    for _ in 0..blocks {
        msgs.push(PutShardRequest {
            msg: Some(Msg::Block(ShardBlock {
                data: data.clone().into(),
                crc32c: sluice_datanode::block_crc32c(&data),
            })),
        });
    }
    msgs.push(PutShardRequest {
        msg: Some(Msg::End(ShardEnd {
            blocks: blocks as u64,
            bytes: (blocks * BLOCK) as u64,
        })),
    });
    msgs
}

async fn put_shard(
    channel: Channel,
    msgs: Vec<PutShardRequest>,
) -> std::result::Result<(), tonic::Status> {
    DatanodeClient::new(channel)
        .put_shard(tokio_stream::iter(msgs))
        .await
        .map(drop)
}

/// Asks the datanode for `bytes` of credit on `channel` and waits until
/// `credits` (the caller's open credit stream) has granted them.
async fn report_and_wait_for_credit(
    channel: &Channel,
    credits: &mut tonic::Streaming<sluice_proto::datanode::CreditGrant>,
    bytes: u64,
) -> Result<()> {
    DatanodeClient::new(channel.clone())
        .report_credits(sluice_proto::datanode::CreditReport {
            gateway_id: String::new(),
            wanted_bytes: bytes,
            returned_bytes: 0,
        })
        .await?;
    let mut granted = 0u64;
    while granted < bytes {
        let grant = tokio::time::timeout(TIMEOUT, credits.message())
            .await
            .context("waiting for a grant")??
            .context("credit stream ended")?;
        granted += grant.bytes;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datanode_refuses_unauthenticated_wrong_role_and_uncredited_writes() -> Result<()> {
    let c = TestCluster::start_without_gateway(1, 1, Overrides::default()).await?;
    let dn = c.datanodes[0].addr();

    expect_code(
        "PutShard without a certificate",
        put_shard(
            no_cert(dn, Role::Datanode).await?,
            shard_messages("e1.anon", "", 1),
        )
        .await,
        Code::Unauthenticated,
    )?;
    expect_code(
        "PutShard as datanode",
        put_shard(
            as_role(dn, Role::Datanode, Role::Datanode, "1").await?,
            shard_messages("e1.peer", "", 1),
        )
        .await,
        Code::PermissionDenied,
    )?;
    expect_code(
        "PutShard as admin",
        put_shard(
            as_role(dn, Role::Datanode, Role::Admin, "ops").await?,
            shard_messages("e1.admin", "", 1),
        )
        .await,
        Code::PermissionDenied,
    )?;
    // A gateway certificate without credit, claiming another gateway's id
    // in the request: the datanode charges the certificate's account, which
    // holds nothing, so the first block is beyond credit.
    expect_code(
        "PutShard beyond credit",
        put_shard(
            as_role(dn, Role::Datanode, Role::Gateway, "rogue").await?,
            shard_messages("e1.rogue", "gw", 4),
        )
        .await,
        Code::FailedPrecondition,
    )?;
    // A gateway with an open credit stream but no grant (no demand
    // reported) is refused the same way, even with an empty gateway_id.
    let channel = as_role(dn, Role::Datanode, Role::Gateway, "greedy").await?;
    let mut credits = DatanodeClient::new(channel.clone())
        .credits(CreditStreamRequest {
            gateway_id: "someone-else".into(),
        })
        .await?
        .into_inner();
    expect_code(
        "PutShard beyond an empty balance",
        put_shard(channel.clone(), shard_messages("e1.greedy", "", 2)).await,
        Code::FailedPrecondition,
    )?;
    // With credit granted, the same gateway writes within it.
    report_and_wait_for_credit(&channel, &mut credits, 2 * BLOCK as u64).await?;
    put_shard(channel, shard_messages("e1.credited", "", 2))
        .await
        .context("PutShard within credit")?;

    let present = has_shards(
        dn,
        &[
            ("e1.anon".into(), 0),
            ("e1.peer".into(), 0),
            ("e1.admin".into(), 0),
            ("e1.rogue".into(), 0),
            ("e1.greedy".into(), 0),
            ("e1.credited".into(), 0),
        ],
    )
    .await
    .map_err(anyhow::Error::msg)?;
    ensure!(
        present == [false, false, false, false, false, true],
        "stored shards: {present:?}"
    );

    // Read-only RPCs by role: NodeStatus for gateways and admins, ListShards
    // for admins only, DeleteBlobs for gateways and meta.
    let mut admin = DatanodeClient::new(as_role(dn, Role::Datanode, Role::Admin, "ops").await?);
    admin
        .node_status(sluice_proto::datanode::NodeStatusRequest {})
        .await
        .context("NodeStatus as admin")?;
    let mut peer = DatanodeClient::new(as_role(dn, Role::Datanode, Role::Datanode, "1").await?);
    expect_code(
        "DeleteBlobs as datanode",
        peer.delete_blobs(sluice_proto::datanode::DeleteBlobsRequest {
            blob_ids: vec!["e1.credited".into()],
        })
        .await,
        Code::PermissionDenied,
    )?;
    let mut anon = DatanodeClient::new(no_cert(dn, Role::Datanode).await?);
    expect_code(
        "DeleteBlobs without a certificate",
        anon.delete_blobs(sluice_proto::datanode::DeleteBlobsRequest {
            blob_ids: vec!["e1.credited".into()],
        })
        .await,
        Code::Unauthenticated,
    )?;
    let present = has_shards(dn, &[("e1.credited".into(), 0)])
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(present == [true], "a refused DeleteBlobs deleted the shard");
    Ok(())
}

/// Over mutual TLS, whose records already refuse changed bytes, a datanode
/// still recomputes each received block's CRC32C: the CRC it stores must
/// be that of the bytes it stores (the ShardWriter contract), or a shard
/// counted in the write quorum would be unreadable until scrub finds it.
/// A block sent with a CRC that does not match its bytes (a gateway bug,
/// or memory changed between the CRC and the send) is refused with
/// `INVALID_ARGUMENT` and nothing is stored; the same over plaintext is
/// datanode/tests/grpc.rs, `bad_checksum_or_protocol_stores_nothing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_block_whose_crc_does_not_match_is_refused() -> Result<()> {
    let c = TestCluster::start_without_gateway(1, 1, Overrides::default()).await?;
    let dn = c.datanodes[0].addr();
    let channel = as_role(dn, Role::Datanode, Role::Gateway, "gw-crc").await?;
    let mut credits = DatanodeClient::new(channel.clone())
        .credits(CreditStreamRequest {
            gateway_id: String::new(),
        })
        .await?
        .into_inner();
    report_and_wait_for_credit(&channel, &mut credits, 4 * BLOCK as u64).await?;
    let mut msgs = shard_messages("e1.crc", "", 2);
    let Some(Msg::Block(second)) = &mut msgs[2].msg else {
        anyhow::bail!("message 2 is not a block: {:?}", msgs[2]);
    };
    second.crc32c ^= 1;
    let refused = put_shard(channel.clone(), msgs).await;
    match &refused {
        Err(status) if status.code() == Code::InvalidArgument => ensure!(
            status.message().contains("block 1"),
            "refusal names another block: {}",
            status.message()
        ),
        other => anyhow::bail!("PutShard with a wrong CRC on block 1: {other:?}"),
    }
    // The same gateway's well-formed shard is stored: the refusal was the
    // CRC's, not the credit's.
    put_shard(channel, shard_messages("e1.good", "", 2))
        .await
        .context("PutShard with right CRCs")?;
    let present = has_shards(dn, &[("e1.crc".into(), 0), ("e1.good".into(), 0)])
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(present == [false, true], "stored shards: {present:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_clients_cannot_talk_to_tls_servers() -> Result<()> {
    let c = TestCluster::start_without_gateway(1, 1, Overrides::default()).await?;
    let plain = Transport::Insecure;
    // Meta: a plaintext HTTP/2 call fails (no gRPC answer).
    let meta = plain
        .endpoint(&format!("http://{}", c.metas[0].addr()), Role::Meta)?
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    let r = match meta.connect().await {
        Ok(ch) => MetaRpc::new(ch)
            .list_buckets(ListBucketsRequest {})
            .await
            .map(drop)
            .map_err(|s| s.to_string()),
        Err(e) => Err(e.to_string()),
    };
    ensure!(r.is_err(), "plaintext ListBuckets to meta succeeded");
    let dn = plain
        .endpoint(&format!("http://{}", c.datanodes[0].addr()), Role::Datanode)?
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    let r = match dn.connect().await {
        Ok(ch) => DatanodeClient::new(ch)
            .list_shards(sluice_proto::datanode::ListShardsRequest::default())
            .await
            .map(drop)
            .map_err(|s| s.to_string()),
        Err(e) => Err(e.to_string()),
    };
    ensure!(r.is_err(), "plaintext ListShards to a datanode succeeded");
    // The same calls over mutual TLS work (the harness is a gateway).
    harness_transport();
    c.meta().list_buckets().await?;
    Ok(())
}
