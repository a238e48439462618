//! Flags of `sluice-bench heal` and the [`HealPlan`] they resolve to.
//!
//! As with the soak, every flag whose default differs between a full run
//! and `--smoke` is an `Option`, filled by [`HealOptions::resolve`] from
//! the profile, so that a flag given on the command line always wins.

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;

use super::objects::{ObjectPlan, plan_objects};
use crate::error::BenchError;
use crate::soak::options::{Knob, Knobs, LoadShape, RssRules};

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
/// Free disk kept on top of the data the run writes (datanodes keep a
/// reserve of their own and logs grow), bytes.
pub const DISK_MARGIN: u64 = 2 * GIB;
/// Erasure-coding overhead assumed by the disk check: 6 shards of 4 data.
const EC_OVERHEAD: f64 = 1.5;

/// Flags of `sluice-bench heal`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealOptions {
    /// Quick check: 256 MiB of data in 32 MiB objects, generous RSS slack, 10 min timeout.
    /// Flags given explicitly still win.
    #[arg(long)]
    pub smoke: bool,
    /// Bytes of data written before the wipe [default: 4GiB; smoke 256MiB].
    #[arg(long)]
    pub data: Option<ByteSize>,
    /// Size of every object: PutObject up to 16 MiB, multipart with 16 MiB parts above
    /// (then a multiple of 16 MiB) [default: 64MiB; smoke 32MiB].
    #[arg(long)]
    pub object_size: Option<ByteSize>,
    /// Objects written at once.
    #[arg(long, default_value_t = 4)]
    pub write_concurrency: usize,
    /// Run client load during the heal: the soak's seed shape (5 uploads x 10 MiB parts, one
    /// part in flight each, objects deleted once completed), until the heal is done.
    #[arg(long)]
    pub load: bool,
    /// Parts per upload of the --load shape [default: 100; smoke 10].
    #[arg(long)]
    pub load_parts: Option<u32>,
    /// Gateway `heal_bandwidth_bytes_per_sec`.
    #[arg(long, default_value = "64MiB")]
    pub heal_bandwidth: ByteSize,
    /// Give up (FAIL) when the heal is not done this long after the wiped node restarted
    /// [default: 30m; smoke 10m].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Datanode that is killed, wiped and started again.
    #[arg(long, default_value = "dn1")]
    pub wipe: String,
    /// Datanodes killed (SIGKILL) before the read-back, comma-separated. With the default
    /// 4+2 layout, two of them are needed for the read-back to prove that the wiped node's
    /// shards were rebuilt: with one node down a blob still has k = 4 shards without them.
    #[arg(long, value_delimiter = ',', default_value = "dn2,dn3")]
    pub read_back_down: Vec<String>,
    /// Seconds (one sample each) the healed-blob counter must stand still to count as done.
    #[arg(long, default_value_t = 5)]
    pub settle_samples: usize,
    /// Allowed deviation of the wiped node's shard count from an even 1/6 share, percent.
    #[arg(long, default_value_t = 5.0)]
    pub share_tolerance_pct: f64,
    /// The `sluice` binary to start the cluster from.
    #[arg(long, default_value = "target/release/sluice")]
    pub sluice_bin: PathBuf,
    /// Directory for the cluster's configs and data (deleted at the end unless --keep).
    #[arg(long, default_value = "sluice-heal")]
    pub work_dir: PathBuf,
    /// Directory for results: heal/summary.json, heal/samples.csv, heal/load/ (with --load)
    /// and the cluster logs.
    #[arg(long, default_value = "sluice-heal-out")]
    pub out_dir: PathBuf,
    /// Keep the cluster's data directories at the end.
    #[arg(long)]
    pub keep: bool,
    /// Run against a binary whose gateway lacks the heal keys (they are then not written):
    /// tries the write / wipe / restart / read-back mechanics; the heal never completes.
    #[arg(long, hide = true)]
    pub without_heal_keys: bool,
    /// How long the cluster may take to become writable.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub ready_timeout: Duration,
    /// How long a process may take to exit after SIGTERM before it gets SIGKILL.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub stop_timeout: Duration,
    /// RUST_LOG filter of the cluster processes (their logs go to OUT_DIR/logs/).
    #[arg(long, default_value = "info,openraft=warn,sled=warn,s3s=off")]
    pub cluster_log: String,
    /// Attempts per S3 request, the first included (SDK standard retry mode).
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Objects read back at once.
    #[arg(long, default_value_t = 4)]
    pub verify_concurrency: usize,
    /// Datanode `write_budget_bytes` [default: 64MiB, as the soak].
    #[arg(long)]
    pub datanode_write_budget: Option<ByteSize>,
    /// Gateway `buffer_budget_bytes` [default: 256MiB, as the soak].
    #[arg(long)]
    pub gateway_buffer_budget: Option<ByteSize>,
    /// Gateway `read_budget_bytes` [default: 128MiB, as the soak].
    #[arg(long)]
    pub gateway_read_budget: Option<ByteSize>,
    /// Meta `sled_cache_bytes` [default: 64MiB, as the soak].
    #[arg(long)]
    pub meta_sled_cache: Option<ByteSize>,
    /// Extra allowance over baseline + budgets in the peak-RSS check, per process
    /// [default: 4MiB; smoke 256MiB, as the soak].
    #[arg(long)]
    pub rss_slack: Option<ByteSize>,
}

/// Everything a heal run does, resolved from [`HealOptions`].
#[derive(Debug, Clone)]
pub struct HealPlan {
    /// `--smoke`.
    pub smoke: bool,
    /// How the data set is cut into objects.
    pub objects: ObjectPlan,
    /// Objects written at once.
    pub write_concurrency: usize,
    /// Client load during the heal.
    pub load: Option<LoadShape>,
    /// Gateway `heal_bandwidth_bytes_per_sec`.
    pub heal_bandwidth: u64,
    /// Heal time limit after the restart.
    pub timeout: Duration,
    /// Datanode wiped.
    pub wipe: String,
    /// Datanodes down during the read-back.
    pub read_back_down: Vec<String>,
    /// Samples the counter must stand still.
    pub settle_samples: usize,
    /// Allowed relative share deviation (0.05 = 5 %).
    pub share_tolerance: f64,
    /// The `sluice` binary.
    pub sluice_bin: PathBuf,
    /// Configs and data.
    pub work_dir: PathBuf,
    /// Results.
    pub out_dir: PathBuf,
    /// Keep data directories.
    pub keep: bool,
    /// Skip the heal-key requirement (mechanics test).
    pub without_heal_keys: bool,
    /// Cluster start limit.
    pub ready_timeout: Duration,
    /// SIGTERM-to-SIGKILL delay.
    pub stop_timeout: Duration,
    /// RUST_LOG of the cluster.
    pub cluster_log: String,
    /// Attempts per S3 request.
    pub max_attempts: u32,
    /// Read-back parallelism.
    pub verify_concurrency: usize,
    /// Budgets of the cluster.
    pub knobs: Knobs,
    /// RSS thresholds (only `slack` is used).
    pub rss: RssRules,
    /// Free bytes required in the work dir's file system.
    pub min_free_disk: u64,
}

fn knob(given: Option<ByteSize>, default: u64) -> Knob<u64> {
    Knob {
        value: given.map_or(default, |b| b.as_u64()),
        explicit: given.is_some(),
    }
}

/// Free disk a run needs: the data set and the load's objects in flight,
/// erasure-coded (x 1.5), twice (heal rewrites a node's share and GC lags
/// behind), plus [`DISK_MARGIN`].
pub fn required_disk(data: u64, load: Option<&LoadShape>) -> u64 {
    let load_bytes = load.map_or(0, |l| {
        l.concurrent as u64 * u64::from(l.parts) * l.part_size
    });
    let coded = (data.saturating_add(load_bytes)) as f64 * EC_OVERHEAD * 2.0;
    (coded as u64).saturating_add(DISK_MARGIN)
}

impl HealOptions {
    /// Fills every unset flag from the profile (full or `--smoke`) and checks ranges.
    ///
    /// # Errors
    /// [`BenchError::InvalidOption`] for a data set that cannot be cut into
    /// objects, zero concurrency, attempts, settle samples or heal
    /// bandwidth, a negative tolerance, or a read-back node list that
    /// includes the wiped node.
    pub fn resolve(&self) -> Result<HealPlan, BenchError> {
        let smoke = self.smoke;
        let pick = |full: u64, small: u64| if smoke { small } else { full };
        let invalid = |flag: &'static str, reason: &str| {
            Err(BenchError::InvalidOption {
                flag,
                reason: reason.to_owned(),
            })
        };
        let data = self
            .data
            .map_or_else(|| pick(4 * GIB, 256 * MIB), |b| b.as_u64());
        let object_size = self
            .object_size
            .map_or_else(|| pick(64 * MIB, 32 * MIB), |b| b.as_u64());
        let objects = plan_objects(data, object_size)?;
        let load = self.load.then(|| LoadShape {
            concurrent: 5,
            parts: self.load_parts.unwrap_or(if smoke { 10 } else { 100 }),
            part_size: 10 * MIB,
            part_concurrent: 1,
            // A limit only: the load is stopped when the heal is done.
            duration: Duration::from_secs(24 * 3600),
            uploads_per_worker: None,
            delete_after: true,
        });
        if self.write_concurrency == 0 || self.verify_concurrency == 0 {
            return invalid("write-concurrency", "concurrency must be at least 1");
        }
        if self.max_attempts == 0 {
            return invalid("max-attempts", "must be at least 1");
        }
        if self.settle_samples == 0 {
            return invalid("settle-samples", "must be at least 1");
        }
        if self.heal_bandwidth.as_u64() == 0 {
            return invalid("heal-bandwidth", "must be positive");
        }
        if self.load_parts == Some(0) {
            return invalid("load-parts", "must be at least 1");
        }
        if self.share_tolerance_pct.is_nan() || self.share_tolerance_pct < 0.0 {
            return invalid("share-tolerance-pct", "must be a non-negative number");
        }
        if self.read_back_down.contains(&self.wipe) {
            return invalid(
                "read-back-down",
                "must not include the wiped node (its rebuilt shards are what is checked)",
            );
        }
        let min_free_disk = required_disk(objects.bytes(), load.as_ref());
        Ok(HealPlan {
            smoke,
            objects,
            write_concurrency: self.write_concurrency,
            load,
            heal_bandwidth: self.heal_bandwidth.as_u64(),
            timeout: self
                .timeout
                .unwrap_or_else(|| Duration::from_secs(pick(30 * 60, 10 * 60))),
            wipe: self.wipe.clone(),
            read_back_down: self.read_back_down.clone(),
            settle_samples: self.settle_samples,
            share_tolerance: self.share_tolerance_pct / 100.0,
            sluice_bin: self.sluice_bin.clone(),
            work_dir: self.work_dir.clone(),
            out_dir: self.out_dir.clone(),
            keep: self.keep,
            without_heal_keys: self.without_heal_keys,
            ready_timeout: self.ready_timeout,
            stop_timeout: self.stop_timeout,
            cluster_log: self.cluster_log.clone(),
            max_attempts: self.max_attempts,
            verify_concurrency: self.verify_concurrency,
            knobs: Knobs {
                meta_sled_cache: knob(self.meta_sled_cache, 64 * MIB),
                datanode_write_budget: knob(self.datanode_write_budget, 64 * MIB),
                gateway_buffer_budget: knob(self.gateway_buffer_budget, 256 * MIB),
                gateway_read_budget: knob(self.gateway_read_budget, 128 * MIB),
                max_inflight: None,
                stall_timeout: None,
            },
            rss: RssRules {
                growth_pct: 0.0,
                growth_floor: 0,
                slack: self
                    .rss_slack
                    .map_or_else(|| pick(4 * MIB, 256 * MIB), |b| b.as_u64()),
            },
            min_free_disk,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        options: HealOptions,
    }

    fn plan(args: &[&str]) -> Result<HealPlan, BenchError> {
        Cli::try_parse_from(std::iter::once("heal").chain(args.iter().copied()))
            .expect("flags parse")
            .options
            .resolve()
    }

    #[test]
    fn full_and_smoke_profiles() {
        let p = plan(&[]).expect("full");
        assert_eq!(p.objects.bytes(), 4 * GIB);
        assert_eq!((p.objects.count, p.objects.parts), (64, 4));
        assert_eq!(p.heal_bandwidth, 64 * MIB);
        assert_eq!(p.timeout, Duration::from_secs(1800));
        assert_eq!(p.wipe, "dn1");
        assert_eq!(p.read_back_down, vec!["dn2", "dn3"]);
        assert_eq!(p.share_tolerance, 0.05);
        assert_eq!(p.rss.slack, 4 * MIB);
        assert!(p.load.is_none());
        // 4 GiB x 1.5 x 2 + 2 GiB.
        assert_eq!(p.min_free_disk, 14 * GIB);

        let s = plan(&["--smoke", "--load", "--heal-bandwidth", "8MiB"]).expect("smoke");
        assert_eq!((s.objects.count, s.objects.object_size), (8, 32 * MIB));
        assert_eq!(s.heal_bandwidth, 8 * MIB);
        assert_eq!(s.timeout, Duration::from_secs(600));
        assert_eq!(s.rss.slack, 256 * MIB);
        let load = s.load.expect("load");
        assert_eq!(
            (load.concurrent, load.parts, load.part_size),
            (5, 10, 10 * MIB)
        );
        assert!(load.delete_after);
        // (256 MiB + 5 x 10 x 10 MiB) x 3 + 2 GiB.
        assert_eq!(s.min_free_disk, (256 + 500) * MIB * 3 + 2 * GIB);
    }

    #[test]
    fn rejects_inconsistent_values() {
        for args in [
            &["--data", "1MiB"][..],
            &["--object-size", "40MiB"],
            &["--write-concurrency", "0"],
            &["--settle-samples", "0"],
            &["--heal-bandwidth", "0"],
            &["--read-back-down", "dn1"],
            &["--share-tolerance-pct=-1"],
        ] {
            assert!(plan(args).is_err(), "{args:?} should be rejected");
        }
    }
}
