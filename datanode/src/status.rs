//! The one place datanode errors become gRPC statuses.
//!
//! | condition                                   | code               |
//! |---------------------------------------------|--------------------|
//! | shard not stored                            | `NOT_FOUND`        |
//! | stored block/header fails its checksum      | `DATA_LOSS`        |
//! | block range outside the shard               | `OUT_OF_RANGE`     |
//! | bad blob id / block size / block length,    | `INVALID_ARGUMENT` |
//! | checksum sent by the client does not match, |                    |
//! | stream not `header, block*`                 |                    |
//! | bad gateway id (Credits, PutShard header)   | `INVALID_ARGUMENT` |
//! | disk full; too many credit streams          | `RESOURCE_EXHAUSTED` |
//! | ReportCredits without an open Credits stream | `FAILED_PRECONDITION` |
//! | shutting down                               | `UNAVAILABLE`      |
//! | Credits stream replaced by a newer one      | `ABORTED`          |
//! | other I/O error                             | `INTERNAL`         |

use std::io::ErrorKind;

use tonic::{Code, Status};

use crate::credit::CreditError;
use crate::store::StoreError;

/// A PutShard stream that breaks the protocol, or a server-side refusal.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("the first PutShard message must be a header")]
    MissingHeader,
    #[error("a PutShard stream carries exactly one header")]
    RepeatedHeader,
    #[error("PutShard message without header, block or end")]
    EmptyMessage,
    #[error("PutShard message after the end message")]
    AfterEnd,
    /// The stream ended (or was cancelled) before its `ShardEnd`.
    #[error("PutShard stream ended after {blocks} blocks without an end message; shard discarded")]
    Truncated { blocks: u64 },
    #[error(
        "PutShard end message says {sent_blocks} blocks / {sent_bytes} bytes, received {blocks} / {bytes}"
    )]
    EndMismatch {
        sent_blocks: u64,
        sent_bytes: u64,
        blocks: u64,
        bytes: u64,
    },
    #[error("block {block}: crc32c sent {sent:#010x}, data has {computed:#010x}")]
    ChecksumMismatch {
        block: u64,
        sent: u32,
        computed: u32,
    },
    #[error("datanode is shutting down")]
    ShuttingDown,
    /// A block arrived beyond the sender's outstanding credit: the shard
    /// is refused and not stored.
    #[error(
        "block {block}: {overdrawn} bytes beyond gateway {gateway:?}'s credit; shard refused, not stored"
    )]
    BeyondCredit {
        gateway: String,
        block: u64,
        overdrawn: u64,
    },
}

impl From<RequestError> for Status {
    fn from(e: RequestError) -> Status {
        let code = match e {
            RequestError::ShuttingDown => Code::Unavailable,
            RequestError::Truncated { .. } => Code::Aborted,
            RequestError::BeyondCredit { .. } => Code::FailedPrecondition,
            _ => Code::InvalidArgument,
        };
        Status::new(code, e.to_string())
    }
}

impl From<CreditError> for Status {
    fn from(e: CreditError) -> Status {
        let code = match e {
            CreditError::InvalidGatewayId(_) => Code::InvalidArgument,
            CreditError::TooManyGateways => Code::ResourceExhausted,
            CreditError::NotConnected(_) => Code::FailedPrecondition,
        };
        Status::new(code, e.to_string())
    }
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        let code = match &e {
            StoreError::NotFound(_) => Code::NotFound,
            StoreError::Corrupt { .. } => Code::DataLoss,
            StoreError::RangeOutOfBounds { .. } => Code::OutOfRange,
            StoreError::InvalidBlobId(_)
            | StoreError::InvalidShardIndex(_)
            | StoreError::InvalidBlockSize(_)
            | StoreError::InvalidBlockLen { .. }
            | StoreError::BlockAfterShortBlock { .. } => Code::InvalidArgument,
            StoreError::ShuttingDown => Code::Unavailable,
            StoreError::ShardFormat { .. }
            | StoreError::DirFormat(_)
            | StoreError::BadFormatFile { .. } => Code::FailedPrecondition,
            StoreError::Io { source, .. } if source.kind() == ErrorKind::StorageFull => {
                Code::ResourceExhausted
            }
            StoreError::Io { .. } | StoreError::WriterFailed(_) => Code::Internal,
        };
        let message = match &e {
            StoreError::Io { source, .. } => format!("{e}: {source}"),
            _ => e.to_string(),
        };
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ShardKey;

    #[test]
    fn store_errors_map_to_codes() {
        let key = ShardKey::new("b", 1).unwrap();
        let cases = [
            (StoreError::NotFound(key.clone()), Code::NotFound),
            (
                StoreError::Corrupt {
                    key: key.clone(),
                    block: Some(3),
                    reason: "x",
                },
                Code::DataLoss,
            ),
            (
                StoreError::RangeOutOfBounds {
                    key,
                    first: 9,
                    end: 9,
                    blocks: 2,
                },
                Code::OutOfRange,
            ),
            (StoreError::InvalidBlockSize(0), Code::InvalidArgument),
            (StoreError::InvalidShardIndex(256), Code::InvalidArgument),
            (
                StoreError::Io {
                    op: "write",
                    path: "/x".into(),
                    source: ErrorKind::StorageFull.into(),
                },
                Code::ResourceExhausted,
            ),
            (
                StoreError::Io {
                    op: "write",
                    path: "/x".into(),
                    source: ErrorKind::PermissionDenied.into(),
                },
                Code::Internal,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(Status::from(e).code(), code);
        }
        let s = Status::from(RequestError::ChecksumMismatch {
            block: 2,
            sent: 1,
            computed: 2,
        });
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("block 2"), "{}", s.message());

        let credit = [
            (
                CreditError::InvalidGatewayId(String::new()),
                Code::InvalidArgument,
            ),
            (CreditError::TooManyGateways, Code::ResourceExhausted),
            (
                CreditError::NotConnected("g".into()),
                Code::FailedPrecondition,
            ),
        ];
        for (e, code) in credit {
            assert_eq!(Status::from(e).code(), code);
        }
    }
}
