//! Conversions between openraft types and the `sluice.raft` protobuf
//! messages. Protobuf wraps required sub-messages in `Option`; a missing one
//! is a [`ConvertError`].
//!
//! openraft and the generated types are both foreign to this crate, so the
//! conversions are the local traits [`ToPb`] and [`FromPb`].

use std::collections::{BTreeMap, BTreeSet};

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{
    BasicNode, Entry, EntryPayload, LeaderId, LogId, Membership, SnapshotMeta, StoredMembership,
    Vote,
};
use sluice_proto::raft as rpb;

use super::TypeConfig;

/// A protobuf message lacks a field openraft requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protobuf {message} has no {field}")]
pub struct ConvertError {
    pub message: &'static str,
    pub field: &'static str,
}

fn need<T>(v: Option<T>, message: &'static str, field: &'static str) -> Result<T, ConvertError> {
    v.ok_or(ConvertError { message, field })
}

/// openraft -> protobuf.
pub trait ToPb {
    type Pb;
    fn to_pb(&self) -> Self::Pb;
}

/// protobuf -> openraft.
pub trait FromPb<P>: Sized {
    fn from_pb(p: P) -> Result<Self, ConvertError>;
}

fn opt_to_pb<T: ToPb>(v: &Option<T>) -> Option<T::Pb> {
    v.as_ref().map(ToPb::to_pb)
}

fn opt_from_pb<T: FromPb<P>, P>(v: Option<P>) -> Result<Option<T>, ConvertError> {
    v.map(T::from_pb).transpose()
}

impl ToPb for LeaderId<u64> {
    type Pb = rpb::LeaderId;
    fn to_pb(&self) -> rpb::LeaderId {
        rpb::LeaderId {
            term: self.term,
            node_id: self.node_id,
        }
    }
}

impl FromPb<rpb::LeaderId> for LeaderId<u64> {
    fn from_pb(p: rpb::LeaderId) -> Result<Self, ConvertError> {
        Ok(LeaderId::new(p.term, p.node_id))
    }
}

impl ToPb for LogId<u64> {
    type Pb = rpb::LogId;
    fn to_pb(&self) -> rpb::LogId {
        rpb::LogId {
            leader_id: Some(self.leader_id.to_pb()),
            index: self.index,
        }
    }
}

impl FromPb<rpb::LogId> for LogId<u64> {
    fn from_pb(p: rpb::LogId) -> Result<Self, ConvertError> {
        let leader = LeaderId::from_pb(need(p.leader_id, "LogId", "leader_id")?)?;
        Ok(LogId::new(leader, p.index))
    }
}

impl ToPb for Vote<u64> {
    type Pb = rpb::Vote;
    fn to_pb(&self) -> rpb::Vote {
        rpb::Vote {
            leader_id: Some(self.leader_id.to_pb()),
            committed: self.committed,
        }
    }
}

impl FromPb<rpb::Vote> for Vote<u64> {
    fn from_pb(p: rpb::Vote) -> Result<Self, ConvertError> {
        let leader_id = LeaderId::from_pb(need(p.leader_id, "Vote", "leader_id")?)?;
        Ok(Vote {
            leader_id,
            committed: p.committed,
        })
    }
}

impl ToPb for Membership<u64, BasicNode> {
    type Pb = rpb::Membership;
    fn to_pb(&self) -> rpb::Membership {
        rpb::Membership {
            configs: self
                .get_joint_config()
                .iter()
                .map(|c| rpb::NodeIdSet {
                    ids: c.iter().copied().collect(),
                })
                .collect(),
            nodes: self.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
        }
    }
}

impl FromPb<rpb::Membership> for Membership<u64, BasicNode> {
    fn from_pb(p: rpb::Membership) -> Result<Self, ConvertError> {
        let configs: Vec<BTreeSet<u64>> = p
            .configs
            .into_iter()
            .map(|c| c.ids.into_iter().collect())
            .collect();
        let nodes: BTreeMap<u64, BasicNode> = p
            .nodes
            .into_iter()
            .map(|(id, addr)| (id, BasicNode { addr }))
            .collect();
        Ok(Membership::new(configs, nodes))
    }
}

impl ToPb for StoredMembership<u64, BasicNode> {
    type Pb = rpb::StoredMembership;
    fn to_pb(&self) -> rpb::StoredMembership {
        rpb::StoredMembership {
            log_id: opt_to_pb(self.log_id()),
            membership: Some(self.membership().to_pb()),
        }
    }
}

impl FromPb<rpb::StoredMembership> for StoredMembership<u64, BasicNode> {
    fn from_pb(p: rpb::StoredMembership) -> Result<Self, ConvertError> {
        let membership =
            Membership::from_pb(need(p.membership, "StoredMembership", "membership")?)?;
        Ok(StoredMembership::new(opt_from_pb(p.log_id)?, membership))
    }
}

impl ToPb for Entry<TypeConfig> {
    type Pb = rpb::Entry;
    fn to_pb(&self) -> rpb::Entry {
        use rpb::entry::Payload;
        let payload = match &self.payload {
            EntryPayload::Blank => Payload::Blank(rpb::Blank {}),
            EntryPayload::Normal(cmd) => Payload::Normal(cmd.clone()),
            EntryPayload::Membership(m) => Payload::Membership(m.to_pb()),
        };
        rpb::Entry {
            log_id: Some(self.log_id.to_pb()),
            payload: Some(payload),
        }
    }
}

impl FromPb<rpb::Entry> for Entry<TypeConfig> {
    fn from_pb(p: rpb::Entry) -> Result<Self, ConvertError> {
        use rpb::entry::Payload;
        let log_id = LogId::from_pb(need(p.log_id, "Entry", "log_id")?)?;
        let payload = match need(p.payload, "Entry", "payload")? {
            Payload::Blank(_) => EntryPayload::Blank,
            Payload::Normal(cmd) => EntryPayload::Normal(cmd),
            Payload::Membership(m) => EntryPayload::Membership(Membership::from_pb(m)?),
        };
        Ok(Entry { log_id, payload })
    }
}

impl ToPb for SnapshotMeta<u64, BasicNode> {
    type Pb = rpb::SnapshotMeta;
    fn to_pb(&self) -> rpb::SnapshotMeta {
        rpb::SnapshotMeta {
            last_log_id: opt_to_pb(&self.last_log_id),
            last_membership: Some(self.last_membership.to_pb()),
            snapshot_id: self.snapshot_id.clone(),
        }
    }
}

impl FromPb<rpb::SnapshotMeta> for SnapshotMeta<u64, BasicNode> {
    fn from_pb(p: rpb::SnapshotMeta) -> Result<Self, ConvertError> {
        Ok(SnapshotMeta {
            last_log_id: opt_from_pb(p.last_log_id)?,
            last_membership: StoredMembership::from_pb(need(
                p.last_membership,
                "SnapshotMeta",
                "last_membership",
            )?)?,
            snapshot_id: p.snapshot_id,
        })
    }
}

impl ToPb for VoteRequest<u64> {
    type Pb = rpb::VoteRequest;
    fn to_pb(&self) -> rpb::VoteRequest {
        rpb::VoteRequest {
            vote: Some(self.vote.to_pb()),
            last_log_id: opt_to_pb(&self.last_log_id),
        }
    }
}

impl FromPb<rpb::VoteRequest> for VoteRequest<u64> {
    fn from_pb(p: rpb::VoteRequest) -> Result<Self, ConvertError> {
        Ok(VoteRequest::new(
            Vote::from_pb(need(p.vote, "VoteRequest", "vote")?)?,
            opt_from_pb(p.last_log_id)?,
        ))
    }
}

impl ToPb for VoteResponse<u64> {
    type Pb = rpb::VoteResponse;
    fn to_pb(&self) -> rpb::VoteResponse {
        rpb::VoteResponse {
            vote: Some(self.vote.to_pb()),
            vote_granted: self.vote_granted,
            last_log_id: opt_to_pb(&self.last_log_id),
        }
    }
}

impl FromPb<rpb::VoteResponse> for VoteResponse<u64> {
    fn from_pb(p: rpb::VoteResponse) -> Result<Self, ConvertError> {
        Ok(VoteResponse {
            vote: Vote::from_pb(need(p.vote, "VoteResponse", "vote")?)?,
            vote_granted: p.vote_granted,
            last_log_id: opt_from_pb(p.last_log_id)?,
        })
    }
}

impl ToPb for AppendEntriesRequest<TypeConfig> {
    type Pb = rpb::AppendEntriesRequest;
    fn to_pb(&self) -> rpb::AppendEntriesRequest {
        rpb::AppendEntriesRequest {
            vote: Some(self.vote.to_pb()),
            prev_log_id: opt_to_pb(&self.prev_log_id),
            entries: self.entries.iter().map(ToPb::to_pb).collect(),
            leader_commit: opt_to_pb(&self.leader_commit),
        }
    }
}

impl FromPb<rpb::AppendEntriesRequest> for AppendEntriesRequest<TypeConfig> {
    fn from_pb(p: rpb::AppendEntriesRequest) -> Result<Self, ConvertError> {
        Ok(AppendEntriesRequest {
            vote: Vote::from_pb(need(p.vote, "AppendEntriesRequest", "vote")?)?,
            prev_log_id: opt_from_pb(p.prev_log_id)?,
            entries: p
                .entries
                .into_iter()
                .map(Entry::from_pb)
                .collect::<Result<_, _>>()?,
            leader_commit: opt_from_pb(p.leader_commit)?,
        })
    }
}

impl ToPb for AppendEntriesResponse<u64> {
    type Pb = rpb::AppendEntriesResponse;
    fn to_pb(&self) -> rpb::AppendEntriesResponse {
        use rpb::append_entries_response::Result as R;
        let result = match self {
            AppendEntriesResponse::Success => R::Success(rpb::Blank {}),
            AppendEntriesResponse::PartialSuccess(m) => R::PartialSuccess(rpb::PartialSuccess {
                matching: opt_to_pb(m),
            }),
            AppendEntriesResponse::Conflict => R::Conflict(rpb::Blank {}),
            AppendEntriesResponse::HigherVote(v) => R::HigherVote(v.to_pb()),
        };
        rpb::AppendEntriesResponse {
            result: Some(result),
        }
    }
}

impl FromPb<rpb::AppendEntriesResponse> for AppendEntriesResponse<u64> {
    fn from_pb(p: rpb::AppendEntriesResponse) -> Result<Self, ConvertError> {
        use rpb::append_entries_response::Result as R;
        Ok(match need(p.result, "AppendEntriesResponse", "result")? {
            R::Success(_) => AppendEntriesResponse::Success,
            R::PartialSuccess(m) => AppendEntriesResponse::PartialSuccess(opt_from_pb(m.matching)?),
            R::Conflict(_) => AppendEntriesResponse::Conflict,
            R::HigherVote(v) => AppendEntriesResponse::HigherVote(Vote::from_pb(v)?),
        })
    }
}

impl ToPb for InstallSnapshotRequest<TypeConfig> {
    type Pb = rpb::InstallSnapshotRequest;
    fn to_pb(&self) -> rpb::InstallSnapshotRequest {
        rpb::InstallSnapshotRequest {
            vote: Some(self.vote.to_pb()),
            meta: Some(self.meta.to_pb()),
            offset: self.offset,
            data: self.data.clone(),
            done: self.done,
        }
    }
}

impl FromPb<rpb::InstallSnapshotRequest> for InstallSnapshotRequest<TypeConfig> {
    fn from_pb(p: rpb::InstallSnapshotRequest) -> Result<Self, ConvertError> {
        Ok(InstallSnapshotRequest {
            vote: Vote::from_pb(need(p.vote, "InstallSnapshotRequest", "vote")?)?,
            meta: SnapshotMeta::from_pb(need(p.meta, "InstallSnapshotRequest", "meta")?)?,
            offset: p.offset,
            data: p.data,
            done: p.done,
        })
    }
}

impl ToPb for InstallSnapshotResponse<u64> {
    type Pb = rpb::InstallSnapshotResponse;
    fn to_pb(&self) -> rpb::InstallSnapshotResponse {
        rpb::InstallSnapshotResponse {
            result: Some(rpb::install_snapshot_response::Result::Vote(
                self.vote.to_pb(),
            )),
        }
    }
}

impl ToPb for openraft::error::SnapshotMismatch {
    type Pb = rpb::SnapshotMismatch;
    fn to_pb(&self) -> rpb::SnapshotMismatch {
        let seg = |s: &openraft::SnapshotSegmentId| rpb::SnapshotSegmentId {
            id: s.id.clone(),
            offset: s.offset,
        };
        rpb::SnapshotMismatch {
            expect: Some(seg(&self.expect)),
            got: Some(seg(&self.got)),
        }
    }
}

impl FromPb<rpb::SnapshotMismatch> for openraft::error::SnapshotMismatch {
    fn from_pb(p: rpb::SnapshotMismatch) -> Result<Self, ConvertError> {
        let seg = |s: rpb::SnapshotSegmentId| openraft::SnapshotSegmentId {
            id: s.id,
            offset: s.offset,
        };
        Ok(openraft::error::SnapshotMismatch {
            expect: seg(need(p.expect, "SnapshotMismatch", "expect")?),
            got: seg(need(p.got, "SnapshotMismatch", "got")?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::meta as pb;

    fn log_id(term: u64, node: u64, index: u64) -> LogId<u64> {
        LogId::new(LeaderId::new(term, node), index)
    }

    #[test]
    fn entries_round_trip() {
        let membership = Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            BTreeMap::from([
                (1, BasicNode::new("http://a")),
                (2, BasicNode::new("http://b")),
                (3, BasicNode::new("http://c")),
                (4, BasicNode::new("http://learner")),
            ]),
        );
        let cmd = rpb::MetaCommand {
            command: Some(rpb::meta_command::Command::CreateBucket(
                pb::CreateBucketRequest {
                    name: "b".into(),
                    now_ms: 7,
                    ..Default::default()
                },
            )),
            ..Default::default()
        };
        let entries: Vec<Entry<TypeConfig>> = vec![
            Entry {
                log_id: log_id(1, 1, 1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(1, 1, 2),
                payload: EntryPayload::Normal(cmd),
            },
            Entry {
                log_id: log_id(2, 3, 3),
                payload: EntryPayload::Membership(membership),
            },
        ];
        let req = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(2, 3),
            prev_log_id: Some(log_id(1, 1, 0)),
            entries,
            leader_commit: None,
        };
        let back = AppendEntriesRequest::<TypeConfig>::from_pb(req.to_pb()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{req:?}"));
        assert_eq!(back.entries[2].payload, req.entries[2].payload);

        for resp in [
            AppendEntriesResponse::Success,
            AppendEntriesResponse::PartialSuccess(Some(log_id(1, 1, 5))),
            AppendEntriesResponse::PartialSuccess(None),
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(Vote::new(9, 2)),
        ] {
            assert_eq!(AppendEntriesResponse::from_pb(resp.to_pb()).unwrap(), resp);
        }
        let v = VoteResponse::new(Vote::new(3, 1), Some(log_id(2, 1, 9)), true);
        assert_eq!(VoteResponse::from_pb(v.to_pb()).unwrap(), v);
        assert!(
            Vote::<u64>::from_pb(rpb::Vote {
                leader_id: None,
                committed: true
            })
            .is_err()
        );
    }
}
