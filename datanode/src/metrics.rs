//! Prometheus metrics of the datanode, labelled with `node` (the node id:
//! `sluice dev` runs several datanodes in one process). The exporter is
//! installed by the binary, before [`crate::run`].

use std::time::Duration;

/// Counter: payload bytes of committed shards.
pub const BYTES_WRITTEN_TOTAL: &str = "sluice_datanode_bytes_written_total";
/// Histogram: seconds spent in fsync per shard commit (file and directory).
pub const FSYNC_SECONDS: &str = "sluice_datanode_fsync_seconds";
/// Gauge: committed shards on this node.
pub const SHARDS_STORED: &str = "sluice_datanode_shards_stored";
/// Counter: blocks whose stored checksum did not match on read (bitrot).
pub const CORRUPT_BLOCKS_TOTAL: &str = "sluice_datanode_corrupt_blocks_total";

/// Gauge: the disk generation meta recorded for this node (bumped each
/// time the node registers with a new `disk_id`).
pub const DISK_GENERATION: &str = "sluice_datanode_disk_generation";
/// Counter: PutShard streams refused because the data dir is below its
/// free-space reserve.
pub const RESERVE_REFUSALS_TOTAL: &str = "sluice_datanode_reserve_refusals_total";
/// Counter: PutShard and GetShard streams refused because
/// `max_shard_streams` were open.
pub const BUSY_REFUSALS_TOTAL: &str = "sluice_datanode_busy_refusals_total";

/// Histogram: seconds per incremental fsync of a shard being written (every
/// `credit_fsync_bytes`, or when its stream goes idle; releases credit).
pub const CREDIT_FSYNC_SECONDS: &str = "sluice_datanode_credit_fsync_seconds";
/// Gauge: the write budget shared among gateways, in bytes.
pub const CREDIT_BUDGET_BYTES: &str = "sluice_datanode_credit_budget_bytes";
/// Gauge, label `gateway`: credit granted to that gateway and not yet spent
/// or returned (0 once it disconnects).
pub const CREDIT_GRANTED_BYTES: &str = "sluice_datanode_credit_granted_bytes";
/// Gauge: shard bytes received and not yet fsynced (or discarded).
pub const CREDIT_INFLIGHT_BYTES: &str = "sluice_datanode_credit_inflight_bytes";
/// Gauge: budget neither granted nor in flight.
pub const CREDIT_AVAILABLE_BYTES: &str = "sluice_datanode_credit_available_bytes";
/// Counter: protocol violations: shard bytes received beyond the sender's
/// credit (one per block), or returns of more credit than was outstanding.
pub const CREDIT_VIOLATIONS_TOTAL: &str = "sluice_datanode_credit_violations_total";

/// Registers descriptions with the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        BYTES_WRITTEN_TOTAL,
        metrics::Unit::Bytes,
        "Payload bytes of committed shards"
    );
    metrics::describe_histogram!(
        FSYNC_SECONDS,
        metrics::Unit::Seconds,
        "fsync time per shard commit"
    );
    metrics::describe_gauge!(
        SHARDS_STORED,
        metrics::Unit::Count,
        "Committed shards stored"
    );
    metrics::describe_counter!(
        CORRUPT_BLOCKS_TOTAL,
        metrics::Unit::Count,
        "Blocks that failed checksum on read"
    );
    metrics::describe_gauge!(
        DISK_GENERATION,
        metrics::Unit::Count,
        "Disk generation meta recorded for this node"
    );
    metrics::describe_counter!(
        RESERVE_REFUSALS_TOTAL,
        metrics::Unit::Count,
        "PutShard streams refused below the free-space reserve"
    );
    metrics::describe_counter!(
        BUSY_REFUSALS_TOTAL,
        metrics::Unit::Count,
        "Shard streams refused because max_shard_streams were open"
    );
    metrics::describe_histogram!(
        CREDIT_FSYNC_SECONDS,
        metrics::Unit::Seconds,
        "fsync time per incremental sync of a shard being written"
    );
    metrics::describe_gauge!(
        CREDIT_BUDGET_BYTES,
        metrics::Unit::Bytes,
        "Write budget shared among gateways"
    );
    metrics::describe_gauge!(
        CREDIT_GRANTED_BYTES,
        metrics::Unit::Bytes,
        "Credit granted to a gateway, not yet spent or returned"
    );
    metrics::describe_gauge!(
        CREDIT_INFLIGHT_BYTES,
        metrics::Unit::Bytes,
        "Shard bytes received, not yet fsynced"
    );
    metrics::describe_gauge!(
        CREDIT_AVAILABLE_BYTES,
        metrics::Unit::Bytes,
        "Write budget neither granted nor in flight"
    );
    metrics::describe_counter!(
        CREDIT_VIOLATIONS_TOTAL,
        metrics::Unit::Count,
        "Shard bytes received beyond credit, or credit over-returned"
    );
}

pub(crate) fn record_partial_fsync(node: &str, elapsed: Duration) {
    metrics::histogram!(CREDIT_FSYNC_SECONDS, "node" => node.to_string())
        .record(elapsed.as_secs_f64());
}

/// Node-wide credit gauges, in bytes.
pub(crate) fn set_credit_totals(node: &str, budget: u64, in_flight: u64, available: u64) {
    metrics::gauge!(CREDIT_BUDGET_BYTES, "node" => node.to_string()).set(budget as f64);
    metrics::gauge!(CREDIT_INFLIGHT_BYTES, "node" => node.to_string()).set(in_flight as f64);
    metrics::gauge!(CREDIT_AVAILABLE_BYTES, "node" => node.to_string()).set(available as f64);
}

pub(crate) fn set_credit_granted(node: &str, gateway: &str, bytes: u64) {
    metrics::gauge!(CREDIT_GRANTED_BYTES, "node" => node.to_string(), "gateway" => gateway.to_string())
        .set(bytes as f64);
}

pub(crate) fn add_credit_violations(node: &str, n: u64) {
    metrics::counter!(CREDIT_VIOLATIONS_TOTAL, "node" => node.to_string()).increment(n);
}

pub(crate) fn record_fsync(node: &str, elapsed: Duration) {
    metrics::histogram!(FSYNC_SECONDS, "node" => node.to_string()).record(elapsed.as_secs_f64());
}

pub(crate) fn add_bytes_written(node: &str, bytes: u64) {
    metrics::counter!(BYTES_WRITTEN_TOTAL, "node" => node.to_string()).increment(bytes);
}

pub(crate) fn set_shards_stored(node: &str, shards: u64) {
    metrics::gauge!(SHARDS_STORED, "node" => node.to_string()).set(shards as f64);
}

pub(crate) fn add_corrupt_block(node: &str) {
    metrics::counter!(CORRUPT_BLOCKS_TOTAL, "node" => node.to_string()).increment(1);
}

pub(crate) fn set_disk_generation(node: &str, generation: u64) {
    metrics::gauge!(DISK_GENERATION, "node" => node.to_string()).set(generation as f64);
}

pub(crate) fn add_reserve_refusal(node: &str) {
    metrics::counter!(RESERVE_REFUSALS_TOTAL, "node" => node.to_string()).increment(1);
}

/// Counts one shard stream refused for `max_shard_streams` ([`BUSY_REFUSALS_TOTAL`]).
pub fn count_busy_refusal(node: &str) {
    metrics::counter!(BUSY_REFUSALS_TOTAL, "node" => node.to_string()).increment(1);
}
