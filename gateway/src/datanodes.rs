//! The gateway's view of the datanodes: id -> address, liveness and a lazily
//! connected gRPC channel, refreshed from meta.
//!
//! One HTTP/2 connection per datanode carries every shard stream to it. Its
//! flow-control windows are sized for shard blocks: [`STREAM_WINDOW_BYTES`]
//! per stream and [`CONNECTION_WINDOW_BYTES`] per connection, which also
//! bounds how many received-but-unread bytes of GetShard streams one
//! datanode connection can hold in the gateway.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use sluice_meta_client::{MetaClient, MetaError};
use sluice_proto::datanode::datanode_client::DatanodeClient;
use tonic::transport::Channel;

/// HTTP/2 receive window of each stream from a datanode (bytes): how far a
/// `GetShard` stream may read ahead of the stripe being decoded (one block
/// of the default 256 KiB, as the whole gRPC message that carries it).
/// These bytes sit in the gateway outside the read budget, so the window
/// is small; the datanode's own receive windows (for `PutShard`) are what
/// is sized to the credit. A window of exactly 256 KiB left the last 19
/// bytes of every block's message (13 bytes of data and the CRC field,
/// its prefix and lengths going first) waiting for a `WINDOW_UPDATE`: a
/// round trip through both ends' connection tasks before the gateway
/// could check the block's CRC. Now the first block of a stream (a 1 MiB
/// object's whole shard) goes in one go, and a later block does when the
/// one before it was credited back in full; h2 credits back in batches,
/// so a later block may still wait (a guarantee would take ~1.5 blocks of
/// window, which the memory formula would count).
pub const STREAM_WINDOW_BYTES: u32 = 256 * 1024 + BLOCK_MESSAGE_FRAMING_BYTES;
/// Bytes of a `GetShard` answer's message besides its block's data,
/// rounded up: the 5-byte gRPC prefix and `ShardBlock`'s protobuf keys,
/// lengths and CRC (at most 21 for a block of up to 8 MiB;
/// `sluice_proto::framing::block_message`).
pub const BLOCK_MESSAGE_FRAMING_BYTES: u32 = 64;
/// Largest HTTP/2 DATA frame the gateway accepts from a datanode (bytes;
/// its `SETTINGS_MAX_FRAME_SIZE`, RFC 9113 section 6.5.2, 16,384 by
/// default). A datanode sends a block's data in frames of its own (the
/// few bytes of gRPC and protobuf framing before and after it go in two
/// small ones, `datanode/src/framed.rs`), so a default block's data
/// crosses in at least 3 frames instead of 16 (3 where the stream window
/// holds the whole block, as for a stream's first block): fewer, larger
/// TLS writes on the datanode and fewer, larger chunks handed to hyper on
/// the gateway, so the client too is woken fewer times per GET (figures in
/// bench/RESULTS.md). Small enough that h2's buffer for one
/// frame stays below glibc's mmap threshold (128 KiB, asserted in
/// `sluice/src/malloc.rs`): with 256 KiB frames (one per block's data)
/// most frame buffers were mappings of their own, page-faulted on every
/// GET, and a GET cost more CPU than with 16 KiB frames. Memory: the
/// chunks cut from a frame are slices of h2's buffer, so a held chunk
/// keeps that buffer alive (see docs/design/memory.md, "Memory formula").
pub const MAX_FRAME_BYTES: u32 = 112 * 1024;
// A frame size HTTP/2 allows (RFC 9113 section 6.5.2).
const _: () = assert!(MAX_FRAME_BYTES >= 16_384 && MAX_FRAME_BYTES <= 16_777_215);
/// HTTP/2 receive window of each datanode connection (bytes). Deliberately
/// far above what the streams need together: read-ahead of streams whose
/// readers wait for a read permit must never fill the connection window,
/// or it blocks the streams whose readers hold permits (and the credit
/// RPCs on the same connection) — a deadlock, seen with a 4 MiB window and
/// 32 concurrent reads. Read-ahead is bounded per stream instead:
/// `STREAM_WINDOW_BYTES × open GetShard streams`.
pub const CONNECTION_WINDOW_BYTES: u32 = 64 * 1024 * 1024;
pub use sluice_proto::shard::MAX_MESSAGE_BYTES;
/// How long connecting to a datanode may take before the RPC fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 keep-alive ping interval; a connection whose ping is not answered
/// within [`KEEP_ALIVE_TIMEOUT`] is closed and its streams fail.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// See [`KEEP_ALIVE_INTERVAL`].
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a datanode cannot be reached through the pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The id is not in the datanode set last read from meta.
    #[error("datanode {0} is not known")]
    UnknownNode(u64),
    /// The registered address is not a valid gRPC endpoint.
    #[error("datanode {id} has an invalid address {addr:?}: {source}")]
    BadAddress {
        id: u64,
        addr: String,
        #[source]
        source: sluice_net::AuthError,
    },
}

/// One datanode as meta reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatanodeEntry {
    pub id: u64,
    /// gRPC endpoint, e.g. `http://127.0.0.1:7101`.
    pub addr: String,
    /// Heartbeat seen within meta's liveness window.
    pub live: bool,
    /// Free space above the node's reserve and disk healthy (last
    /// heartbeat): new shards go only to live writable nodes.
    pub writable: bool,
    /// Free bytes of the node's data dir (statfs, last heartbeat).
    pub free_bytes: u64,
    /// Failure-domain labels (see [`crate::placement`]); empty zone = none,
    /// empty host = a host of its own.
    pub zone: String,
    pub host: String,
    /// Marked draining by an admin: no new shards; its shards are moved
    /// off (see [`crate::heal::mover`]).
    pub draining: bool,
}

impl DatanodeEntry {
    /// A live, writable node (free space unknown, no labels): for fixed
    /// sets in tests.
    pub fn up(id: u64, addr: impl Into<String>) -> DatanodeEntry {
        DatanodeEntry {
            id,
            addr: addr.into(),
            live: true,
            writable: true,
            free_bytes: 0,
            zone: String::new(),
            host: String::new(),
            draining: false,
        }
    }

    /// Whether new shards may be placed on this node: live, writable and
    /// not draining.
    pub fn accepts_shards(&self) -> bool {
        self.live && self.writable && !self.draining
    }
}

impl From<sluice_proto::meta::DatanodeInfo> for DatanodeEntry {
    fn from(d: sluice_proto::meta::DatanodeInfo) -> Self {
        DatanodeEntry {
            id: d.id,
            addr: d.addr,
            live: d.live,
            writable: d.writable,
            free_bytes: d.free_bytes,
            zone: d.zone,
            host: d.host,
            draining: d.draining,
        }
    }
}

/// What [`DatanodeDirectory::list`] returns.
pub type ListFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<DatanodeEntry>, MetaError>> + Send + 'a>>;

/// Where the gateway's data path learns the datanode set: the one part of
/// the metadata API that [`crate::blob::BlobStore`] reads on its own (at
/// start, every `datanode_refresh_interval`, and when a placement finds
/// too few writable nodes). [`MetaClient`] in a cluster (meta's
/// `ListDatanodes`, liveness from heartbeats); [`FixedDatanodes`] where
/// the set is chosen by hand: tests that run datanodes without meta, or
/// that mark nodes down or full without waiting for heartbeats.
pub trait DatanodeDirectory: Send + Sync + 'static {
    /// Every registered datanode with its liveness, space and labels.
    fn list(&self) -> ListFuture<'_>;
    /// How the datanodes are dialed (mutual TLS, plaintext, or an
    /// in-process network).
    fn transport(&self) -> &sluice_net::Transport;
}

impl DatanodeDirectory for MetaClient {
    fn list(&self) -> ListFuture<'_> {
        Box::pin(async move {
            let infos = self.list_datanodes().await?;
            Ok(infos.into_iter().map(DatanodeEntry::from).collect())
        })
    }

    fn transport(&self) -> &sluice_net::Transport {
        MetaClient::transport(self)
    }
}

/// A datanode set chosen by hand: [`FixedDatanodes::set`] replaces it,
/// and the store sees the change at its next refresh
/// ([`crate::blob::BlobStore::refresh_datanodes`] forces one). Holds the
/// entries given, so it is bounded by what the caller passes.
pub struct FixedDatanodes {
    entries: Mutex<Vec<DatanodeEntry>>,
    transport: sluice_net::Transport,
}

impl FixedDatanodes {
    /// `entries`, dialed with `transport`.
    pub fn new(entries: Vec<DatanodeEntry>, transport: sluice_net::Transport) -> Self {
        FixedDatanodes {
            entries: Mutex::new(entries),
            transport,
        }
    }

    /// Replaces the set the next [`DatanodeDirectory::list`] returns.
    pub fn set(&self, entries: Vec<DatanodeEntry>) {
        *self.entries.lock().expect("fixed datanodes lock") = entries;
    }
}

impl DatanodeDirectory for FixedDatanodes {
    fn list(&self) -> ListFuture<'_> {
        let entries = self.entries.lock().expect("fixed datanodes lock").clone();
        Box::pin(std::future::ready(Ok(entries)))
    }

    fn transport(&self) -> &sluice_net::Transport {
        &self.transport
    }
}

struct Node {
    addr: String,
    live: bool,
    writable: bool,
    free_bytes: u64,
    zone: String,
    host: String,
    draining: bool,
    /// Created on first use (creating one spawns tonic's buffer task, so it
    /// needs a runtime); dropped when the address changes.
    channel: Option<Channel>,
}

/// Datanode id -> address, liveness and channel. The map holds exactly the
/// datanodes of the last [`Datanodes::replace`], so it is bounded by the
/// cluster size.
#[derive(Default)]
pub struct Datanodes {
    nodes: Mutex<HashMap<u64, Node>>,
    /// How datanodes are dialed (mutual TLS or plaintext).
    transport: Option<sluice_net::Transport>,
}

impl Datanodes {
    /// An empty pool dialing plaintext.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty pool dialing with `transport`.
    pub fn with_transport(transport: sluice_net::Transport) -> Self {
        Datanodes {
            nodes: Mutex::default(),
            transport: Some(transport),
        }
    }

    /// Replaces the datanode set. Channels of nodes whose address did not
    /// change are kept; removed nodes' channels are dropped.
    pub fn replace(&self, entries: impl IntoIterator<Item = DatanodeEntry>) {
        let mut nodes = self.nodes.lock().expect("datanode pool lock");
        let mut next = HashMap::new();
        for e in entries {
            let channel = match nodes.remove(&e.id) {
                Some(old) if old.addr == e.addr => old.channel,
                _ => None,
            };
            next.insert(
                e.id,
                Node {
                    addr: e.addr,
                    live: e.live,
                    writable: e.writable,
                    free_bytes: e.free_bytes,
                    zone: e.zone,
                    host: e.host,
                    draining: e.draining,
                    channel,
                },
            );
        }
        *nodes = next;
    }

    /// Reads the datanode set from `directory` and installs it; returns
    /// how many datanodes are live.
    pub async fn refresh(&self, directory: &dyn DatanodeDirectory) -> Result<usize, MetaError> {
        let entries = directory.list().await?;
        let live = entries.iter().filter(|d| d.live).count();
        self.replace(entries);
        Ok(live)
    }

    /// Marks datanode `id` not writable until the next refresh (it refused
    /// a shard with `RESOURCE_EXHAUSTED`: its disk is full).
    pub fn mark_unwritable(&self, id: u64) {
        let mut nodes = self.nodes.lock().expect("datanode pool lock");
        if let Some(n) = nodes.get_mut(&id) {
            n.writable = false;
        }
    }

    /// Ids of the datanodes that accept new shards: live, writable and
    /// not draining.
    pub fn writable_ids(&self) -> Vec<u64> {
        let nodes = self.nodes.lock().expect("datanode pool lock");
        nodes
            .iter()
            .filter(|(_, n)| n.live && n.writable && !n.draining)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Ids of the datanodes meta reports live.
    pub fn live_ids(&self) -> Vec<u64> {
        let nodes = self.nodes.lock().expect("datanode pool lock");
        nodes
            .iter()
            .filter(|(_, n)| n.live)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The current set, sorted by id.
    pub fn entries(&self) -> Vec<DatanodeEntry> {
        let nodes = self.nodes.lock().expect("datanode pool lock");
        let mut v: Vec<DatanodeEntry> = nodes
            .iter()
            .map(|(id, n)| DatanodeEntry {
                id: *id,
                addr: n.addr.clone(),
                live: n.live,
                writable: n.writable,
                free_bytes: n.free_bytes,
                zone: n.zone.clone(),
                host: n.host.clone(),
                draining: n.draining,
            })
            .collect();
        v.sort_by_key(|e| e.id);
        v
    }

    /// The registered gRPC address of datanode `id`.
    pub fn addr(&self, id: u64) -> Option<String> {
        let nodes = self.nodes.lock().expect("datanode pool lock");
        nodes.get(&id).map(|n| n.addr.clone())
    }

    /// The channel to datanode `id`, connecting lazily (the first RPC
    /// connects; a failed connection is retried by the next RPC). Must be
    /// called inside a tokio runtime.
    pub fn channel(&self, id: u64) -> Result<Channel, PoolError> {
        let mut nodes = self.nodes.lock().expect("datanode pool lock");
        let node = nodes.get_mut(&id).ok_or(PoolError::UnknownNode(id))?;
        if let Some(c) = &node.channel {
            return Ok(c.clone());
        }
        // The one place the gateway builds a datanode endpoint.
        let transport = self
            .transport
            .as_ref()
            .unwrap_or(&sluice_net::Transport::Insecure);
        let endpoint = transport
            .endpoint(&node.addr, sluice_net::Role::Datanode)
            .map_err(|source| PoolError::BadAddress {
                id,
                addr: node.addr.clone(),
                source,
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .max_frame_size(MAX_FRAME_BYTES);
        let channel = transport.dial(endpoint);
        node.channel = Some(channel.clone());
        Ok(channel)
    }

    /// A generated client for datanode `id` with message limits for blocks.
    pub fn client(&self, id: u64) -> Result<DatanodeClient<Channel>, PoolError> {
        Ok(DatanodeClient::new(self.channel(id)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of a default-size block fits one stream window, so a
    /// datanode sends a stream's first block whole without waiting for a
    /// `WINDOW_UPDATE`; the framing allowance covers the largest block
    /// too.
    #[test]
    fn a_default_block_message_fits_one_stream_window() {
        use sluice_proto::framing::{GET_SHARD_RESPONSE_BLOCK_FIELD, block_message};
        let message_len = |block_len: usize| {
            let data = bytes::Bytes::from(vec![0xa5u8; block_len]);
            let (head, tail) = block_message(GET_SHARD_RESPONSE_BLOCK_FIELD, &data, u32::MAX);
            head.len() + data.len() + tail.len()
        };
        let default_block = crate::config::Config::default().block_size.as_u64() as usize;
        assert_eq!(default_block, 256 * 1024);
        let len = message_len(default_block);
        assert!(len > default_block, "the framing is counted");
        assert!(
            len <= STREAM_WINDOW_BYTES as usize,
            "{len} bytes > the window"
        );
        // A default block's data crosses in three frames.
        assert_eq!(default_block.div_ceil(MAX_FRAME_BYTES as usize), 3);
        let framing = message_len(crate::config::MAX_BLOCK_SIZE) - crate::config::MAX_BLOCK_SIZE;
        assert!(
            framing <= BLOCK_MESSAGE_FRAMING_BYTES as usize,
            "{framing} bytes of framing"
        );
    }

    fn entry(id: u64, port: u16, live: bool) -> DatanodeEntry {
        DatanodeEntry {
            id,
            addr: format!("http://127.0.0.1:{port}"),
            live,
            writable: true,
            free_bytes: 1 << 30,
            ..DatanodeEntry::up(id, "")
        }
    }

    #[tokio::test]
    async fn replace_keeps_channels_of_unchanged_nodes() {
        let pool = Datanodes::new();
        pool.replace([
            entry(1, 7101, true),
            entry(2, 7102, false),
            entry(3, 7103, true),
        ]);
        let mut live = pool.live_ids();
        live.sort_unstable();
        assert_eq!(live, vec![1, 3]);
        pool.channel(1).expect("channel 1");
        pool.channel(2).expect("channel 2");

        pool.replace([entry(1, 7101, true), entry(2, 7202, true)]);
        let nodes = pool.nodes.lock().expect("lock");
        assert!(
            nodes[&1].channel.is_some(),
            "same address keeps its channel"
        );
        assert!(nodes[&2].channel.is_none(), "new address drops the channel");
        assert!(!nodes.contains_key(&3));
        drop(nodes);
        assert_eq!(
            pool.entries(),
            vec![entry(1, 7101, true), entry(2, 7202, true)]
        );
        assert!(matches!(pool.channel(3), Err(PoolError::UnknownNode(3))));
    }

    #[tokio::test]
    async fn unwritable_nodes_are_not_offered_for_shards() {
        let pool = Datanodes::new();
        let mut full = entry(2, 7102, true);
        full.writable = false;
        pool.replace([entry(1, 7101, true), full, entry(3, 7103, false)]);
        let mut writable = pool.writable_ids();
        writable.sort_unstable();
        assert_eq!(writable, vec![1], "2 is full, 3 is down");
        let mut live = pool.live_ids();
        live.sort_unstable();
        assert_eq!(live, vec![1, 2]);
        pool.mark_unwritable(1);
        assert!(pool.writable_ids().is_empty());
        assert!(!pool.entries()[0].writable);
    }

    #[tokio::test]
    async fn bad_address_is_reported() {
        let pool = Datanodes::new();
        pool.replace([DatanodeEntry::up(9, "not a uri")]);
        assert!(matches!(
            pool.channel(9),
            Err(PoolError::BadAddress { id: 9, .. })
        ));
    }
}
