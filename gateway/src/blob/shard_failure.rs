//! Why one shard stream of a write or a read was given up. A failed shard
//! is not used again in that write or read; the write goes on while the
//! write quorum holds, the read opens the next shard in preference order.
//! The text of each variant is what the logs and `BlobError` reasons show.

use std::time::Duration;

use crate::credit::CreditError;
use crate::datanodes::PoolError;

#[derive(Debug, thiserror::Error)]
pub(super) enum ShardFailure {
    /// The datanode has no usable channel (unknown id, bad address).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The datanode answered the RPC with an error status (for a write,
    /// `RESOURCE_EXHAUSTED` marks it full: see `ShardWriter::status_error`).
    #[error("{code}: {message}")]
    Status { code: tonic::Code, message: String },
    /// The datanode granted no credit within `stall_timeout`.
    #[error("{0}")]
    Credit(CreditError),
    /// Credit ran out without the credit client saying why.
    #[error("no credit")]
    NoCredit,
    /// A write's channel stayed full this long.
    #[error("no progress for {0:?}")]
    NoProgress(Duration),
    /// Nothing came back from the datanode within this long: no answer
    /// to the request, no block, or no acknowledgement of a written shard.
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    #[error("no block within {0:?}")]
    NoBlock(Duration),
    #[error("no acknowledgement within {0:?}")]
    NoAck(Duration),
    /// The RPC's stream closed without a status.
    #[error("shard stream closed")]
    StreamClosed,
    /// The shard was failed earlier in this write or read.
    #[error("shard already failed")]
    AlreadyFailed,
    /// The RPC's task already reported its outcome.
    #[error("shard task already finished")]
    TaskFinished,
    /// The RPC's task panicked or was cancelled.
    #[error("shard task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The datanode acknowledged a shard it could not have completed.
    #[error("datanode answered before the shard was complete")]
    EarlyAnswer,
    /// The datanode acknowledged another shape than was sent.
    #[error(
        "datanode stored {blocks} blocks / {bytes} bytes, expected {want_blocks} / {want_bytes}"
    )]
    WrongShape {
        blocks: u64,
        bytes: u64,
        want_blocks: u64,
        want_bytes: u64,
    },
    /// A read's stream ended before this block.
    #[error("stream ended before block {0}")]
    EndedEarly(u64),
    /// A read's block is not the length the layout says (a response
    /// without a block has none).
    #[error("block {block} has {got} bytes, expected {want}")]
    BlockLength { block: u64, got: usize, want: usize },
    /// A read's block does not match its CRC32C.
    #[error("block {block} checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    Checksum {
        block: u64,
        stored: u32,
        computed: u32,
    },
}

impl From<&tonic::Status> for ShardFailure {
    fn from(status: &tonic::Status) -> Self {
        ShardFailure::Status {
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}

impl ShardFailure {
    /// Whether the datanode refused the shard as full (`RESOURCE_EXHAUSTED`
    /// from the datanode itself, not our own credit wait).
    pub(super) fn is_resource_exhausted(&self) -> bool {
        matches!(
            self,
            ShardFailure::Status {
                code: tonic::Code::ResourceExhausted,
                ..
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_before() {
        let status = tonic::Status::not_found("no such shard");
        assert_eq!(
            ShardFailure::from(&status).to_string(),
            "Some requested entity was not found: no such shard"
        );
        assert_eq!(
            ShardFailure::Checksum {
                block: 3,
                stored: 0xdead_beef,
                computed: 1
            }
            .to_string(),
            "block 3 checksum mismatch: stored deadbeef, computed 00000001"
        );
        assert!(
            ShardFailure::from(&tonic::Status::resource_exhausted("disk full"))
                .is_resource_exhausted()
        );
        assert!(!ShardFailure::NoCredit.is_resource_exhausted());
    }
}
