//! Meta membership changes through openraft's membership API: add, remove
//! and replace voters, list the members (`sluice admin meta ...`).
//!
//! Every call runs on the leader (`NOT_LEADER` with the hint elsewhere).
//! Changes are serialized by one lock per node: a second change while one
//! is running (an AddVoter waiting for its learner to catch up, say), or
//! while Raft still holds an uncommitted joint configuration, is refused
//! with `MEMBERSHIP_CHANGE_REFUSED` ("another membership change is in
//! progress").
//!
//! * AddVoter: `add_learner` (non-blocking), then a bounded wait until the
//!   learner's matched log index is within [`CATCH_UP_LAG`] entries of the
//!   leader's last log and past the entry that added it, then
//!   `change_membership(AddVoterIds)`. If it does not catch up in time, the
//!   learner is removed again and the call fails, naming its progress.
//! * RemoveVoter: refuses the last voter, and a change after which the
//!   remaining voters have no live majority: the leader writes a no-op
//!   entry and waits up to [`QUORUM_PROBE`] for the remaining voters to
//!   replicate it; fewer than a majority answering refuses the change.
//!   Then `change_membership(RemoveVoters, retain = false)`: the node leaves
//!   the cluster entirely. Removing the leader itself works: it commits the
//!   configuration without itself, steps down, and the others elect a new
//!   leader after an election timeout.
//! * ReplaceVoter: AddVoter(new), then RemoveVoter(old), under one lock.
//!
//! Membership lives in the Raft log (and snapshots) from the first start
//! on; the `voters` config key only seeds the very first initialization.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use sluice_net::is_endpoint;
use sluice_proto::admin as apb;
use sluice_proto::error::{not_leader, status};
use sluice_proto::meta::ErrorCode;
use sluice_proto::raft::{self as rpb, MetaCommand, meta_command::Command};
use tonic::Status;

use crate::raft::MetaRaft;

/// AddVoter's catch-up wait when the request names none.
pub const DEFAULT_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest catch-up wait a request may ask for.
pub const MAX_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(600);
/// A learner is caught up when its matched index is at most this many
/// entries behind the leader's last log index.
pub const CATCH_UP_LAG: u64 = 64;
/// How long RemoveVoter waits for the voters that remain to replicate a
/// probe entry (proof that they are live) before refusing the change.
pub const QUORUM_PROBE: Duration = Duration::from_secs(5);

/// Why a membership call failed.
#[derive(Debug, thiserror::Error)]
pub enum MembersError {
    /// This node is not the leader (hint: the leader's id and address).
    #[error("not the leader")]
    NotLeader {
        leader_id: Option<u64>,
        leader_addr: Option<String>,
    },
    /// The request names an unknown node, a bad address, or an id already
    /// in use elsewhere.
    #[error("{0}")]
    InvalidArgument(String),
    /// The change is refused: last voter, no live quorum, another change in
    /// progress, or the learner did not catch up.
    #[error("{0}")]
    Refused(String),
    /// Raft stopped or failed otherwise.
    #[error("{0}")]
    Raft(String),
}

impl From<MembersError> for Status {
    fn from(e: MembersError) -> Status {
        match e {
            MembersError::NotLeader {
                leader_id,
                leader_addr,
            } => not_leader(leader_id, leader_addr),
            MembersError::InvalidArgument(m) => status(ErrorCode::InvalidArgument, m),
            MembersError::Refused(m) => status(ErrorCode::MembershipChangeRefused, m),
            MembersError::Raft(m) => status(ErrorCode::Internal, m),
        }
    }
}

const IN_PROGRESS: &str = "another membership change is in progress; retry when it has finished";

fn raft_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> MembersError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => MembersError::NotLeader {
            leader_id: f.leader_id,
            leader_addr: f.leader_node.map(|n| n.addr),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_),
        )) => MembersError::Refused(IN_PROGRESS.to_string()),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            MembersError::Refused(e.to_string())
        }
        RaftError::Fatal(f) => MembersError::Raft(format!("raft is not running: {f}")),
    }
}

/// A snapshot of the membership as the leader's metrics show it.
struct View {
    voters: BTreeSet<u64>,
    nodes: BTreeMap<u64, BasicNode>,
    joint: bool,
}

/// The membership handlers of one meta node.
pub(crate) struct Members {
    node_id: u64,
    raft: MetaRaft,
    /// Held for the whole of a change (including a learner's catch-up
    /// wait); a second change finds it taken and is refused.
    change: tokio::sync::Mutex<()>,
}

impl Members {
    pub(crate) fn new(node_id: u64, raft: MetaRaft) -> Self {
        Members {
            node_id,
            raft,
            change: tokio::sync::Mutex::new(()),
        }
    }

    /// `Ok` on the leader; `NotLeader` with the hint elsewhere.
    fn leader_only(&self) -> Result<(), MembersError> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.state == ServerState::Leader && m.current_leader == Some(self.node_id) {
            return Ok(());
        }
        let leader_addr = m
            .current_leader
            .and_then(|id| m.membership_config.membership().get_node(&id))
            .map(|n| n.addr.clone());
        Err(MembersError::NotLeader {
            leader_id: m.current_leader,
            leader_addr,
        })
    }

    fn view(&self) -> View {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        View {
            voters: membership.voter_ids().collect(),
            nodes: membership.nodes().map(|(id, n)| (*id, n.clone())).collect(),
            joint: membership.get_joint_config().len() > 1,
        }
    }

    /// Takes the change lock and checks leadership and that no joint
    /// configuration is pending.
    fn begin(&self) -> Result<(tokio::sync::MutexGuard<'_, ()>, View), MembersError> {
        self.leader_only()?;
        let guard = self
            .change
            .try_lock()
            .map_err(|_| MembersError::Refused(IN_PROGRESS.to_string()))?;
        let view = self.view();
        if view.joint {
            return Err(MembersError::Refused(IN_PROGRESS.to_string()));
        }
        Ok((guard, view))
    }

    /// ListMembers: leader only.
    pub(crate) async fn list(&self) -> Result<apb::ListMembersResponse, MembersError> {
        self.leader_only()?;
        self.describe().await
    }

    /// The members as this node sees them (used after a change too, when a
    /// removed leader may already have stepped down).
    async fn describe(&self) -> Result<apb::ListMembersResponse, MembersError> {
        let commit_index = self
            .raft
            .with_raft_state(|st| st.committed.map(|l| l.index))
            .await
            .map_err(|f| MembersError::Raft(format!("raft is not running: {f}")))?;
        let metrics = self.raft.metrics();
        let m = metrics.borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let leader = m.current_leader;
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let matched = match &m.replication {
                    Some(r) => r.get(id).cloned().flatten().map(|l| l.index),
                    None => None,
                };
                let matched = if Some(*id) == leader && *id == self.node_id {
                    matched.or(m.last_log_index)
                } else {
                    matched
                };
                apb::MetaMember {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                    leader: Some(*id) == leader,
                    matched_index: matched,
                }
            })
            .collect();
        Ok(apb::ListMembersResponse {
            members,
            leader_id: leader.unwrap_or(0),
            term: m.current_term,
            commit_index,
            applied_index: m.last_applied.map(|l| l.index),
            last_log_index: m.last_log_index,
            change_in_progress: membership.get_joint_config().len() > 1,
        })
    }

    /// AddVoter: see the module docs.
    pub(crate) async fn add_voter(
        &self,
        id: u64,
        addr: String,
        catch_up_timeout: Option<Duration>,
    ) -> Result<apb::MembershipResponse, MembersError> {
        let (_guard, view) = self.begin()?;
        let message = self
            .add_voter_locked(&view, id, &addr, catch_up_timeout)
            .await?;
        Ok(apb::MembershipResponse {
            members: Some(self.describe().await?),
            message,
        })
    }

    /// RemoveVoter: see the module docs.
    pub(crate) async fn remove_voter(
        &self,
        id: u64,
    ) -> Result<apb::MembershipResponse, MembersError> {
        let (_guard, view) = self.begin()?;
        let message = self.remove_locked(&view, id).await?;
        Ok(apb::MembershipResponse {
            members: Some(self.describe().await?),
            message,
        })
    }

    /// ReplaceVoter: AddVoter(new), then RemoveVoter(old).
    pub(crate) async fn replace_voter(
        &self,
        old_id: u64,
        new_id: u64,
        new_addr: String,
        catch_up_timeout: Option<Duration>,
    ) -> Result<apb::MembershipResponse, MembersError> {
        let (_guard, view) = self.begin()?;
        if old_id == new_id {
            return Err(MembersError::InvalidArgument(format!(
                "the old and the new node have the same id {old_id}"
            )));
        }
        if !view.voters.contains(&old_id) {
            return Err(unknown_voter(old_id, &view));
        }
        let added = self
            .add_voter_locked(&view, new_id, &new_addr, catch_up_timeout)
            .await?;
        let view = self.view();
        let removed = self.remove_locked(&view, old_id).await?;
        Ok(apb::MembershipResponse {
            members: Some(self.describe().await?),
            message: format!("{added}; {removed}"),
        })
    }

    async fn add_voter_locked(
        &self,
        view: &View,
        id: u64,
        addr: &str,
        catch_up_timeout: Option<Duration>,
    ) -> Result<String, MembersError> {
        if id == 0 {
            return Err(MembersError::InvalidArgument(
                "meta node id 0 is not allowed".into(),
            ));
        }
        if !is_endpoint(addr) {
            return Err(MembersError::InvalidArgument(format!(
                "address {addr:?} must be an http:// or https:// URL (the node's advertise_addr)"
            )));
        }
        let timeout = catch_up_timeout
            .filter(|t| !t.is_zero())
            .unwrap_or(DEFAULT_CATCH_UP_TIMEOUT)
            .min(MAX_CATCH_UP_TIMEOUT);
        if let Some(node) = view.nodes.get(&id) {
            if node.addr != addr {
                return Err(MembersError::InvalidArgument(format!(
                    "meta node {id} is already a member at {}; remove it first to move it to {addr}",
                    node.addr
                )));
            }
            if view.voters.contains(&id) {
                return Ok(format!("{id} is already a voter at {addr}"));
            }
        }
        if let Some((other, _)) = view.nodes.iter().find(|(o, n)| **o != id && n.addr == addr) {
            return Err(MembersError::InvalidArgument(format!(
                "address {addr} already belongs to meta node {other}"
            )));
        }

        let resp = self
            .raft
            .add_learner(
                id,
                BasicNode {
                    addr: addr.to_string(),
                },
                false,
            )
            .await
            .map_err(raft_error)?;
        tracing::info!(
            id,
            addr,
            "meta node added as a learner; waiting for it to catch up"
        );
        if let Err(e) = self.wait_caught_up(id, resp.log_id.index, timeout).await {
            // Leave the membership as it was: drop the learner again.
            if let Err(undo) = self
                .raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
            {
                tracing::warn!(id, error = %undo, "could not remove the learner that did not catch up");
            }
            return Err(e);
        }
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(raft_error)?;
        tracing::info!(id, addr, "meta node promoted to voter");
        Ok(format!("added {id} at {addr} as a voter"))
    }

    /// Waits until learner `id` has matched `since` and is within
    /// [`CATCH_UP_LAG`] entries of the last log, or `timeout`.
    async fn wait_caught_up(
        &self,
        id: u64,
        since: u64,
        timeout: Duration,
    ) -> Result<(), MembersError> {
        let mut rx = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (state, matched, last) = {
                let m = rx.borrow_and_update();
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .map(|l| l.index);
                (m.state, matched, m.last_log_index.unwrap_or(0))
            };
            if state != ServerState::Leader {
                return Err(self.leader_only().err().unwrap_or(MembersError::NotLeader {
                    leader_id: None,
                    leader_addr: None,
                }));
            }
            if let Some(matched) = matched
                && matched >= since
                && matched + CATCH_UP_LAG >= last
            {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(MembersError::Raft("raft is not running".into())),
                Err(_) => {
                    return Err(MembersError::Refused(format!(
                        "meta node {id} did not catch up within {timeout:?} (matched index {matched:?}, leader's last log index {last}); \
                         it was removed again. Is it running, started with `join = true`, and reachable from the leader?"
                    )));
                }
            }
        }
    }

    async fn remove_locked(&self, view: &View, id: u64) -> Result<String, MembersError> {
        if !view.nodes.contains_key(&id) {
            return Err(unknown_voter(id, view));
        }
        if !view.voters.contains(&id) {
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
                .map_err(raft_error)?;
            return Ok(format!("removed learner {id}"));
        }
        let remaining: BTreeSet<u64> = view.voters.iter().copied().filter(|v| *v != id).collect();
        if remaining.is_empty() {
            return Err(MembersError::Refused(format!(
                "meta node {id} is the last voter; add another voter before removing it"
            )));
        }
        self.check_live_quorum(&remaining).await?;
        self.raft
            .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
            .await
            .map_err(raft_error)?;
        tracing::info!(id, "meta voter removed");
        Ok(if id == self.node_id {
            format!("removed voter {id} (the leader: it steps down and the others elect a new one)")
        } else {
            format!("removed voter {id}")
        })
    }

    /// Writes a no-op entry ([`probe_entry`]) and waits up to [`QUORUM_PROBE`] for a majority
    /// of `voters` to replicate it.
    async fn check_live_quorum(&self, voters: &BTreeSet<u64>) -> Result<(), MembersError> {
        let probe = self
            .raft
            .client_write(probe_entry())
            .await
            .map_err(raft_error)?;
        let index = probe.log_id.index;
        let need = voters.len() / 2 + 1;
        let mut rx = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + QUORUM_PROBE;
        loop {
            let live: Vec<u64> = {
                let m = rx.borrow_and_update();
                voters
                    .iter()
                    .copied()
                    .filter(|v| {
                        if *v == self.node_id {
                            return true;
                        }
                        m.replication
                            .as_ref()
                            .and_then(|r| r.get(v).cloned().flatten())
                            .is_some_and(|l| l.index >= index)
                    })
                    .collect()
            };
            if live.len() >= need {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(MembersError::Raft("raft is not running".into())),
                Err(_) => {
                    return Err(MembersError::Refused(format!(
                        "the remaining voters {voters:?} would have no live quorum: only {live:?} replicated a probe entry within {QUORUM_PROBE:?}, {need} needed"
                    )));
                }
            }
        }
    }
}

fn unknown_voter(id: u64, view: &View) -> MembersError {
    MembersError::InvalidArgument(format!(
        "meta node {id} is not a member; voters are {:?}, learners {:?}",
        view.voters,
        view.nodes
            .keys()
            .filter(|n| !view.voters.contains(n))
            .collect::<Vec<_>>()
    ))
}

/// The quorum probe's entry: an ExpireSessions with `before_index` 0,
/// which every binary applies as a no-op. Never an entry without a
/// command: a replica stops at one (it is what a command kind unknown to
/// its binary decodes as).
fn probe_entry() -> MetaCommand {
    let command = Command::ExpireSessions(rpb::ExpireSessions {
        before_index: 0,
        limit: 0,
    });
    let needs = crate::version::required_format(&command);
    crate::version::stamped(command, needs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::error::detail;

    #[test]
    fn errors_carry_their_code_and_the_leader_hint() {
        let s: Status = MembersError::Refused("last voter".into()).into();
        assert_eq!(s.code(), tonic::Code::FailedPrecondition);
        let d = detail(&s).expect("detail");
        assert_eq!(d.code(), ErrorCode::MembershipChangeRefused);
        assert_eq!(d.message, "last voter");

        let s: Status = MembersError::InvalidArgument("unknown".into()).into();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(detail(&s).unwrap().code(), ErrorCode::InvalidArgument);

        let s: Status = MembersError::NotLeader {
            leader_id: Some(4),
            leader_addr: Some("http://10.0.0.14:7001".into()),
        }
        .into();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        let d = detail(&s).unwrap();
        assert_eq!(d.code(), ErrorCode::NotLeader);
        assert_eq!(d.leader_id, Some(4));
        assert_eq!(d.leader_addr.as_deref(), Some("http://10.0.0.14:7001"));
    }

    #[test]
    fn addresses_must_be_urls() {
        assert!(is_endpoint("http://10.0.0.14:7001"));
        assert!(is_endpoint("https://meta-4:7001"));
        assert!(!is_endpoint("10.0.0.14:7001"));
        assert!(!is_endpoint("http://"));
    }
}
