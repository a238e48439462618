//! Byte credits: the protocol between gateways and datanodes, as a gateway
//! must implement it. The datanode's side is `sluice_datanode::credit`
//! (its ledger and max-min fair grants); the gateway's is
//! `sluice_gateway::credit`.
//!
//! The datanode has a write budget of `B` bytes (`write_budget_bytes`):
//! shard bytes it has received but not yet fsynced, plus credit it has
//! granted but not yet seen spent, never exceed `B`. A gateway may only put
//! shard bytes on the wire for which it holds credit from that datanode.
//!
//! 1. **Open one credit stream per datanode.** Call
//!    `Credits(CreditStreamRequest { gateway_id })` once per datanode you
//!    may write to and keep it open. `gateway_id` names this gateway
//!    *process*: 1..=128 printable ASCII bytes, unique in the cluster and
//!    fresh at every process start (e.g. `"<host>-<uuid>"`). A second stream
//!    with the same id replaces the first (the first ends with `ABORTED`
//!    and its credit is forfeited).
//! 2. **Keep a local balance per datanode**: add every
//!    `CreditGrant.bytes` received on that stream.
//! 3. **Debit before sending.** Every PutShard to that datanode carries
//!    `ShardHeader.gateway_id` = your id. Before a `ShardBlock` goes on the
//!    wire, subtract `block.data.len()` from the balance; if the balance is
//!    short, do not send — wait for a grant. Only block payload counts;
//!    headers and framing are free. A block needs credit for its whole
//!    length, so keep blocks well below `B / (number of gateways)`: with
//!    fair sharing that is about what each gateway can count on.
//! 4. **Report demand when you wait.** `ReportCredits { gateway_id,
//!    wanted_bytes, returned_bytes: 0 }` where `wanted_bytes` is the credit
//!    you need beyond your balance (e.g. the blocks queued for this
//!    datanode). It *replaces* the previous value; the datanode lowers it as
//!    it grants, so report again whenever your need changes, and
//!    `wanted_bytes = 0` when it ends. No grant ever comes without demand.
//! 5. **Return idle credit.** Balance you will not spend soon (the upload
//!    finished, nothing queued for this datanode) goes back with
//!    `ReportCredits { wanted_bytes: 0, returned_bytes: n }`; subtract `n`
//!    locally *before* sending. Never return more than you hold: the excess
//!    is ignored and counted as a violation.
//! 6. **A broken stream loses all credit.** When the credit stream ends or
//!    fails (`UNAVAILABLE` at datanode shutdown, `ABORTED` when replaced,
//!    any transport error), set the balance to 0 and send no more blocks
//!    until a new stream grants again; reconnect with backoff and report
//!    demand anew. The datanode has already taken that credit back.
//!    `ReportCredits` without an open stream fails with
//!    `FAILED_PRECONDITION`.
//!
//! The datanode re-grants bytes once they are fsynced: every
//! `credit_fsync_bytes` of a stream, after `credit_fsync_idle` without a new
//! block, and at shard commit. A slow disk therefore slows every sender
//! instead of filling the datanode's memory. A block that arrives beyond the
//! sender's credit is refused: the PutShard fails with
//! `FAILED_PRECONDITION` ("beyond ... credit"), the shard is not stored,
//! and the violation is counted in `sluice_datanode_credit_violations_total`.
//!
//! Under mutual TLS the gateway's credit account is its certificate's id
//! (`spiffe://sluice/gateway/<id>`): the request's `gateway_id` is ignored,
//! every PutShard of a gateway is credited, and each gateway process needs
//! its own certificate. In insecure mode the account is the request's
//! `gateway_id`, and a PutShard without one bypasses credits entirely (the
//! pre-credit behaviour).

/// Longest accepted gateway id (`CreditStreamRequest.gateway_id`,
/// `ShardHeader.gateway_id`), in bytes.
pub const MAX_GATEWAY_ID_LEN: usize = 128;
