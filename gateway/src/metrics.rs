//! Prometheus metric names of the gateway (`metrics` 0.24 macros). The
//! exporter is installed by the binary before [`crate::run`]; without one
//! every update is a no-op.

use std::sync::atomic::{AtomicU64, Ordering};

/// Gauge: write-path buffer bytes held (stripes and shard blocks), ≤
/// [`BUFFER_BUDGET_BYTES`].
pub const BUFFER_BYTES_IN_USE: &str = "sluice_gateway_buffer_bytes_in_use";
/// Gauge: the write buffer budget (`buffer_budget_bytes`).
pub const BUFFER_BUDGET_BYTES: &str = "sluice_gateway_buffer_budget_bytes";
/// Gauge: requests waiting for a write buffer.
pub const BUFFER_WAITING_REQUESTS: &str = "sluice_gateway_buffer_waiting_requests";
/// Gauge: read-path buffer bytes held (decoded stripes), ≤
/// [`READ_BUFFER_BUDGET_BYTES`].
pub const READ_BUFFER_BYTES_IN_USE: &str = "sluice_gateway_read_buffer_bytes_in_use";
/// Gauge: the read buffer budget (`read_budget_bytes`).
pub const READ_BUFFER_BUDGET_BYTES: &str = "sluice_gateway_read_buffer_budget_bytes";
/// Gauge: reads waiting for a read buffer.
pub const READ_BUFFER_WAITING_REQUESTS: &str = "sluice_gateway_read_buffer_waiting_requests";
/// Counter, label `reason` (`inflight`, `stall`, `datanodes`, `meta`): `503 SlowDown`
/// responses.
pub const SLOWDOWN_TOTAL: &str = "sluice_gateway_slowdown_total";
/// Histogram, label `op` (the S3 operation, e.g. `UploadPart`; `Unknown`
/// when s3s could not route the request): seconds from the request head
/// to the end of the response body.
pub const REQUEST_DURATION_SECONDS: &str = "sluice_gateway_request_duration_seconds";
/// Counter: S3 connections closed because they sent nothing within
/// `header_read_timeout` of being accepted.
pub const SILENT_CONNECTIONS_TOTAL: &str = "sluice_gateway_silent_connections_total";
/// Gauge: requests admitted and not finished.
pub const INFLIGHT_REQUESTS: &str = "sluice_gateway_inflight_requests";
/// Gauge, label `datanode`: credit granted by that datanode and not yet spent.
pub const CREDIT_AVAILABLE_BYTES: &str = "sluice_gateway_credit_available_bytes";
/// Gauge, label `datanode`: shard bytes waiting for that datanode's credit.
pub const CREDIT_WAITING_BYTES: &str = "sluice_gateway_credit_waiting_bytes";
/// Counter, label `datanode`: credit granted by that datanode.
pub const CREDIT_GRANTED_BYTES_TOTAL: &str = "sluice_gateway_credit_granted_bytes_total";
/// Counter, label `datanode`: idle credit returned to that datanode.
pub const CREDIT_RETURNED_BYTES_TOTAL: &str = "sluice_gateway_credit_returned_bytes_total";
/// Counter, label `datanode`: credit lost with a broken credit stream.
pub const CREDIT_FORFEITED_BYTES_TOTAL: &str = "sluice_gateway_credit_forfeited_bytes_total";
/// Gauge: the current write epoch (new blob ids name it).
pub const WRITE_EPOCH: &str = "sluice_gateway_write_epoch";
/// Counter: write epochs lost (a renewal refused with `EPOCH_CLOSED`).
pub const EPOCHS_LOST_TOTAL: &str = "sluice_gateway_epochs_lost_total";
/// Counter: blobs meta released on commit, delete, abort or complete (meta
/// deletes them after `delete_delay`; the gateway only counts them).
pub const BLOBS_RELEASED_TOTAL: &str = "sluice_gateway_blobs_released_total";
/// Counter: blobs this gateway wrote and deleted itself because their
/// commit was refused or never happened.
pub const BLOBS_DISCARDED_TOTAL: &str = "sluice_gateway_blobs_discarded_total";
/// Counter: read leases taken (GETs that streamed past `read_lease_after`).
pub const READ_LEASES_TOTAL: &str = "sluice_gateway_read_leases_total";
/// Counter: `LeaseBlobs` calls that failed (retried while the GET runs).
pub const READ_LEASE_FAILURES_TOTAL: &str = "sluice_gateway_read_lease_failures_total";
/// Counter: blobs a lease came too late for (their deletion was claimed).
pub const READ_LEASE_LOST_BLOBS_TOTAL: &str = "sluice_gateway_read_lease_lost_blobs_total";

/// Requests recorded by [`record_request`] in this process (reported to meta
/// with each epoch renewal, for `sluice admin status`).
static REQUESTS: AtomicU64 = AtomicU64::new(0);
/// `503 SlowDown` answers counted by [`count_slowdown`] in this process.
static SLOWDOWNS: AtomicU64 = AtomicU64::new(0);

/// S3 requests answered and `503 SlowDown` answers since this process
/// started (every gateway in the process together; a deployment runs one).
pub fn request_totals() -> (u64, u64) {
    (
        REQUESTS.load(Ordering::Relaxed),
        SLOWDOWNS.load(Ordering::Relaxed),
    )
}

/// `reason` label of [`SLOWDOWN_TOTAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowDownReason {
    /// `max_inflight_requests` were in flight.
    Inflight,
    /// No buffer within `stall_timeout`.
    Stall,
    /// Datanodes granted no credit within `stall_timeout`.
    Datanodes,
    /// Meta's leader refused a new operation: its session table is full.
    Meta,
}

impl SlowDownReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SlowDownReason::Inflight => "inflight",
            SlowDownReason::Stall => "stall",
            SlowDownReason::Datanodes => "datanodes",
            SlowDownReason::Meta => "meta",
        }
    }
}

/// Counts one `503 SlowDown` answered for `reason`.
pub fn count_slowdown(reason: SlowDownReason) {
    SLOWDOWNS.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(SLOWDOWN_TOTAL, "reason" => reason.as_str()).increment(1);
}

/// Counts one connection closed for sending nothing ([`SILENT_CONNECTIONS_TOTAL`]).
pub fn count_silent_connection() {
    metrics::counter!(SILENT_CONNECTIONS_TOTAL).increment(1);
}

/// Records one request of S3 operation `op` that took `seconds`.
pub fn record_request(op: &str, seconds: f64) {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    metrics::histogram!(REQUEST_DURATION_SECONDS, "op" => op.to_string()).record(seconds);
}

/// Sets [`WRITE_EPOCH`].
pub fn set_write_epoch(epoch: u64) {
    metrics::gauge!(WRITE_EPOCH).set(epoch as f64);
}

/// Counts one lost write epoch in [`EPOCHS_LOST_TOTAL`].
pub fn count_epoch_lost() {
    metrics::counter!(EPOCHS_LOST_TOTAL).increment(1);
}

/// Counts `n` released blobs in [`BLOBS_RELEASED_TOTAL`].
pub fn count_released(n: usize) {
    metrics::counter!(BLOBS_RELEASED_TOTAL).increment(n as u64);
}

/// Counts `n` discarded blobs in [`BLOBS_DISCARDED_TOTAL`].
pub fn count_discarded(n: usize) {
    metrics::counter!(BLOBS_DISCARDED_TOTAL).increment(n as u64);
}

/// Counts one read lease taken in [`READ_LEASES_TOTAL`].
pub fn read_lease_taken() {
    metrics::counter!(READ_LEASES_TOTAL).increment(1);
}

/// Counts one failed `LeaseBlobs` in [`READ_LEASE_FAILURES_TOTAL`].
pub fn read_lease_failed() {
    metrics::counter!(READ_LEASE_FAILURES_TOTAL).increment(1);
}

/// Counts `n` blobs leased too late in [`READ_LEASE_LOST_BLOBS_TOTAL`].
pub fn read_lease_lost(n: usize) {
    metrics::counter!(READ_LEASE_LOST_BLOBS_TOTAL).increment(n as u64);
}

/// Registers descriptions with the installed recorder.
pub fn describe() {
    use metrics::Unit;
    metrics::describe_gauge!(
        BUFFER_BYTES_IN_USE,
        Unit::Bytes,
        "Write-path stripe and shard buffer bytes held"
    );
    metrics::describe_gauge!(BUFFER_BUDGET_BYTES, Unit::Bytes, "Write buffer budget");
    metrics::describe_gauge!(
        BUFFER_WAITING_REQUESTS,
        Unit::Count,
        "Requests waiting for a write buffer"
    );
    metrics::describe_gauge!(
        READ_BUFFER_BYTES_IN_USE,
        Unit::Bytes,
        "Read-path decoded stripe bytes held"
    );
    metrics::describe_gauge!(READ_BUFFER_BUDGET_BYTES, Unit::Bytes, "Read buffer budget");
    metrics::describe_gauge!(
        READ_BUFFER_WAITING_REQUESTS,
        Unit::Count,
        "Reads waiting for a read buffer"
    );
    metrics::describe_counter!(
        SILENT_CONNECTIONS_TOTAL,
        Unit::Count,
        "S3 connections closed for sending nothing within the header timeout"
    );
    metrics::describe_counter!(
        SLOWDOWN_TOTAL,
        Unit::Count,
        "503 SlowDown responses by reason"
    );
    metrics::describe_histogram!(
        REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "S3 request duration by operation, head to end of response body"
    );
    metrics::describe_gauge!(INFLIGHT_REQUESTS, Unit::Count, "S3 requests in flight");
    metrics::describe_gauge!(
        CREDIT_AVAILABLE_BYTES,
        Unit::Bytes,
        "Datanode credit held and not yet spent"
    );
    metrics::describe_gauge!(
        CREDIT_WAITING_BYTES,
        Unit::Bytes,
        "Shard bytes waiting for datanode credit"
    );
    metrics::describe_counter!(
        CREDIT_GRANTED_BYTES_TOTAL,
        Unit::Bytes,
        "Credit granted by datanodes"
    );
    metrics::describe_counter!(
        CREDIT_RETURNED_BYTES_TOTAL,
        Unit::Bytes,
        "Idle credit returned to datanodes"
    );
    metrics::describe_counter!(
        CREDIT_FORFEITED_BYTES_TOTAL,
        Unit::Bytes,
        "Credit lost with broken credit streams"
    );
    metrics::describe_gauge!(WRITE_EPOCH, Unit::Count, "Current write epoch");
    metrics::describe_counter!(
        READ_LEASES_TOTAL,
        Unit::Count,
        "Read leases taken by GETs streaming past read_lease_after"
    );
    metrics::describe_counter!(
        READ_LEASE_FAILURES_TOTAL,
        Unit::Count,
        "LeaseBlobs calls that failed"
    );
    metrics::describe_counter!(
        READ_LEASE_LOST_BLOBS_TOTAL,
        Unit::Count,
        "Blobs a read lease came too late for (deletion already claimed)"
    );
    metrics::describe_counter!(
        EPOCHS_LOST_TOTAL,
        Unit::Count,
        "Write epochs lost (renewal refused: closed on meta)"
    );
    metrics::describe_counter!(
        BLOBS_RELEASED_TOTAL,
        Unit::Count,
        "Blobs released by commits and deletes (deleted by meta after delete_delay)"
    );
    metrics::describe_counter!(
        BLOBS_DISCARDED_TOTAL,
        Unit::Count,
        "Blobs deleted by the gateway because their commit was refused or never happened"
    );
}
