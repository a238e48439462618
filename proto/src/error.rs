//! A meta error travels as a `tonic::Status` whose `details` are a
//! prost-encoded [`ErrorDetail`]: the S3-level code a gateway maps to an S3
//! error, and for `NOT_LEADER` the leader hint a client follows.

use crate::meta::{ErrorCode, ErrorDetail};
use prost::Message;

/// Builds a status for `code`; `NOT_LEADER` and `INTERNAL` map to
/// `UNAVAILABLE`/`INTERNAL`, the S3-level codes to the nearest gRPC code.
pub fn status(code: ErrorCode, message: impl Into<String>) -> tonic::Status {
    let detail = ErrorDetail {
        code: code.into(),
        message: message.into(),
        leader_id: None,
        leader_addr: None,
    };
    status_from_detail(detail)
}

/// Builds a `NOT_LEADER` status with the leader hint, when one is known.
pub fn not_leader(leader_id: Option<u64>, leader_addr: Option<String>) -> tonic::Status {
    status_from_detail(ErrorDetail {
        code: ErrorCode::NotLeader.into(),
        message: "not the leader".into(),
        leader_id,
        leader_addr,
    })
}

fn status_from_detail(detail: ErrorDetail) -> tonic::Status {
    let code = match detail.code() {
        ErrorCode::NotLeader => tonic::Code::Unavailable,
        ErrorCode::NoSuchBucket
        | ErrorCode::NoSuchKey
        | ErrorCode::NoSuchUpload
        | ErrorCode::NoSuchVersion
        | ErrorCode::NoSuchAccessKey => tonic::Code::NotFound,
        ErrorCode::BucketAlreadyOwnedByYou => tonic::Code::AlreadyExists,
        ErrorCode::BucketNotEmpty
        | ErrorCode::InvalidPart
        | ErrorCode::InvalidPartOrder
        | ErrorCode::EntityTooSmall
        | ErrorCode::EpochClosed
        | ErrorCode::PlacementChanged
        | ErrorCode::PreconditionFailed
        | ErrorCode::MethodNotAllowed
        | ErrorCode::MembershipChangeRefused
        | ErrorCode::ClusterVersionGate => tonic::Code::FailedPrecondition,
        ErrorCode::DuplicateDatanode => tonic::Code::AlreadyExists,
        ErrorCode::DatanodeInUse => tonic::Code::FailedPrecondition,
        ErrorCode::NoSuchDatanode => tonic::Code::NotFound,
        ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorCode::SlowDown => tonic::Code::ResourceExhausted,
        ErrorCode::Internal | ErrorCode::Unspecified => tonic::Code::Internal,
    };
    let message = detail.message.clone();
    tonic::Status::with_details(code, message, detail.encode_to_vec().into())
}

/// Reads the [`ErrorDetail`] of a status, if it carries one.
pub fn detail(status: &tonic::Status) -> Option<ErrorDetail> {
    if status.details().is_empty() {
        return None;
    }
    ErrorDetail::decode(status.details()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_round_trips_through_status() {
        let s = not_leader(Some(2), Some("http://127.0.0.1:7002".into()));
        assert_eq!(s.code(), tonic::Code::Unavailable);
        let d = detail(&s).expect("detail");
        assert_eq!(d.code(), ErrorCode::NotLeader);
        assert_eq!(d.leader_id, Some(2));
        assert_eq!(d.leader_addr.as_deref(), Some("http://127.0.0.1:7002"));

        let s = status(ErrorCode::NoSuchUpload, "no such upload");
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert_eq!(detail(&s).unwrap().code(), ErrorCode::NoSuchUpload);
        assert!(detail(&tonic::Status::internal("x")).is_none());
    }
}
