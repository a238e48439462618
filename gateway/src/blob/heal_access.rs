//! Accessors the heal worker ([`crate::heal`]) needs on a [`BlobStore`]:
//! its codec, its datanode pool, its credit streams and its write buffer
//! budget. Heal runs inside the same credits and budgets as client writes
//! (`docs/design/durability.md` §6), so it reaches them here instead of owning
//! copies.

use std::sync::Arc;

use sluice_proto::datanode::datanode_client::DatanodeClient;
use tonic::transport::Channel;

use super::BlobStore;
use crate::admission::BufferPermit;
use crate::credit::NodeCredit;
use crate::datanodes::{MAX_MESSAGE_BYTES, PoolError};
use crate::erasure::Codec;

impl BlobStore {
    /// The erasure codec of this store's layout (k data, m parity shards).
    pub(crate) fn heal_codec(&self) -> &Codec {
        &self.inner.codec
    }

    /// A generated gRPC client for datanode `node` (lazily connected
    /// channel of the shared pool).
    pub(crate) fn heal_client(&self, node: u64) -> Result<DatanodeClient<Channel>, PoolError> {
        self.inner.pool.client(node)
    }

    /// The credit of datanode `node` on this gateway's credit stream
    /// (opening the stream on first use), shared with client writes.
    pub(crate) fn heal_credit(&self, node: u64) -> Result<Arc<NodeCredit>, PoolError> {
        let channel = self.inner.pool.channel(node)?;
        let addr = self.inner.pool.addr(node).unwrap_or_default();
        Ok(self.inner.credits.node(node, &addr, || {
            DatanodeClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        }))
    }

    /// A write-budget permit of `bytes` if one is free right now and no
    /// client request is queued for one (FIFO: heal never waits in the
    /// queue, so it never delays a client write). Idle stripe buffers
    /// beyond the budget's unused bytes are freed before it returns.
    pub(crate) fn heal_try_write_permit(&self, bytes: u64) -> Option<BufferPermit> {
        let permit = self.inner.write_budget.try_acquire(bytes)?;
        self.inner.stripe_buffers.trim();
        Some(permit)
    }

    /// Bytes of the write budget (the largest permit there can be).
    pub(crate) fn heal_write_budget_bytes(&self) -> u64 {
        self.inner.write_budget.budget()
    }
}
