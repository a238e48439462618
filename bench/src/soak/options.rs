//! Flags of `sluice-bench soak` and the [`Plan`] they resolve to.
//!
//! Every flag whose default differs between a full run and `--smoke` is an
//! `Option` here; [`SoakOptions::resolve`] fills it from the profile of the
//! mode, so that a flag given on the command line always wins.

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;

use crate::error::BenchError;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// The shapes, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShapeName {
    /// warp's multipart-put that OOM-killed another server: 5 uploads x 1 part in flight.
    Seed,
    /// What aws CLI / boto3 do by default: 8 uploads x 10 parts in parallel, read back.
    SdkDefault,
    /// Far more parts in flight than small budgets allow: SlowDown expected.
    Overload,
}

impl ShapeName {
    /// The name used in output directories and verdict lines.
    pub fn as_str(self) -> &'static str {
        match self {
            ShapeName::Seed => "seed",
            ShapeName::SdkDefault => "sdk-default",
            ShapeName::Overload => "overload",
        }
    }
}

/// Flags of `sluice-bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakOptions {
    /// CI mode: tiny durations and shapes, generous bounds (about 2-3 minutes in all); SlowDown
    /// in the overload shape is reported but not required. Flags given explicitly still win.
    #[arg(long)]
    pub smoke: bool,
    /// The `sluice` binary to start the cluster from.
    #[arg(long, default_value = "target/release/sluice")]
    pub sluice_bin: PathBuf,
    /// Directory for the cluster's configs and data (data is deleted at the end unless --keep).
    #[arg(long, default_value = "sluice-soak")]
    pub work_dir: PathBuf,
    /// Directory for results: one sub-directory per shape (samples.csv, summary.json,
    /// chart.svg), the cluster logs, and verdict.json.
    #[arg(long, default_value = "sluice-soak-out")]
    pub out_dir: PathBuf,
    /// Keep the cluster's data directories at the end.
    #[arg(long)]
    pub keep: bool,
    /// Run the cluster's internal gRPC in plaintext (`insecure_cluster =
    /// true`) instead of mutual TLS with certificates made by `sluice admin
    /// certs`, e.g. to compare the two.
    #[arg(long)]
    pub insecure_cluster: bool,
    /// Serve S3 over HTTPS: the gateway gets a certificate for 127.0.0.1
    /// from the cluster CA (`sluice admin certs issue --ip`) and the load
    /// generator trusts that CA. Needs cluster TLS (not with
    /// `--insecure-cluster`).
    #[arg(long, conflicts_with = "insecure_cluster")]
    pub s3_https: bool,
    /// Shapes to run, comma-separated, in any order (they run as seed, sdk-default, overload).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "seed,sdk-default,overload"
    )]
    pub shapes: Vec<ShapeName>,
    /// Refuse to start unless the work dir's file system has this much free space
    /// [default: 10GiB; smoke 2GiB].
    #[arg(long)]
    pub min_free_disk: Option<ByteSize>,
    /// How long the cluster may take to become writable (bucket created, probe object put).
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
    /// Objects read back at once when checking them.
    #[arg(long, default_value_t = 4)]
    pub verify_concurrency: usize,

    /// Datanode `write_budget_bytes` of the seed/sdk-default cluster [default: 64MiB].
    #[arg(long)]
    pub datanode_write_budget: Option<ByteSize>,
    /// Gateway `buffer_budget_bytes` of the seed/sdk-default cluster [default: 256MiB].
    #[arg(long)]
    pub gateway_buffer_budget: Option<ByteSize>,
    /// Gateway `read_budget_bytes` of the seed/sdk-default cluster [default: 128MiB].
    #[arg(long)]
    pub gateway_read_budget: Option<ByteSize>,
    /// Gateway `max_inflight_requests` of the seed/sdk-default cluster [default: the gateway's].
    #[arg(long)]
    pub max_inflight: Option<u64>,
    /// Gateway `stall_timeout` of the seed/sdk-default cluster [default: the gateway's].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub stall_timeout: Option<Duration>,
    /// Meta `sled_cache_bytes` of every cluster [default: 64MiB].
    #[arg(long)]
    pub meta_sled_cache: Option<ByteSize>,
    /// Datanode `write_budget_bytes` of the overload cluster [default: 8MiB].
    #[arg(long)]
    pub overload_datanode_write_budget: Option<ByteSize>,
    /// Gateway `buffer_budget_bytes` of the overload cluster [default: 16MiB].
    #[arg(long)]
    pub overload_gateway_buffer_budget: Option<ByteSize>,
    /// Gateway `read_budget_bytes` of the overload cluster [default: 8MiB].
    #[arg(long)]
    pub overload_gateway_read_budget: Option<ByteSize>,
    /// Gateway `max_inflight_requests` of the overload cluster [default: 32].
    #[arg(long)]
    pub overload_max_inflight: Option<u64>,
    /// Gateway `stall_timeout` of the overload cluster [default: the gateway's].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub overload_stall_timeout: Option<Duration>,

    /// Seed shape: load duration [default: 30m; smoke 60s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Seed shape: warm-up; RSS growth is measured from its end [default: 5m; smoke 10s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub warmup: Option<Duration>,
    /// Seed shape: uploads in parallel [default: 5].
    #[arg(long)]
    pub seed_concurrent: Option<usize>,
    /// Seed shape: parts per upload [default: 100; smoke 10].
    #[arg(long)]
    pub seed_parts: Option<u32>,
    /// Seed shape: part size [default: 10MiB; smoke 5MiB].
    #[arg(long)]
    pub seed_part_size: Option<ByteSize>,
    /// SDK-default shape: uploads, all in parallel [default: 8; smoke 2].
    #[arg(long)]
    pub sdk_uploads: Option<usize>,
    /// SDK-default shape: parts per upload, all in parallel [default: 10; smoke 3].
    #[arg(long)]
    pub sdk_parts: Option<u32>,
    /// SDK-default shape: part size [default: 8MiB; smoke 5MiB].
    #[arg(long)]
    pub sdk_part_size: Option<ByteSize>,
    /// SDK-default shape: time limit for the uploads [default: 10m; smoke 2m].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub sdk_timeout: Option<Duration>,
    /// Overload shape: load duration [default: 3m; smoke 30s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub overload_duration: Option<Duration>,
    /// Overload shape: uploads in parallel [default: 64; smoke 16].
    #[arg(long)]
    pub overload_concurrent: Option<usize>,
    /// Overload shape: parts per upload, all in parallel [default: 16; smoke 4].
    #[arg(long)]
    pub overload_parts: Option<u32>,
    /// Overload shape: part size [default: 5MiB].
    #[arg(long)]
    pub overload_part_size: Option<ByteSize>,

    /// Seed verdict: allowed RSS growth after the warm-up, percent of the RSS at its end
    /// [default: 5; smoke 25].
    #[arg(long)]
    pub rss_growth_pct: Option<f64>,
    /// Seed verdict: allowed RSS growth after the warm-up when larger than the percentage
    /// [default: 16MiB; smoke 64MiB].
    #[arg(long)]
    pub rss_growth_floor: Option<ByteSize>,
    /// Extra allowance over baseline + budgets (+ the gateway's client terms) in the peak-RSS
    /// checks, per process: what the memory formula does not count (allocator metadata,
    /// thread stacks, the roles' mutual-TLS connections; see docs/design/memory.md#memory-formula)
    /// [default: 4MiB; smoke 256MiB].
    #[arg(long)]
    pub rss_slack: Option<ByteSize>,
}

/// One workload, as handed to the multipart-put engine.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoadShape {
    /// Uploads in parallel.
    pub concurrent: usize,
    /// Parts per upload.
    pub parts: u32,
    /// Bytes per part.
    pub part_size: u64,
    /// Parts of one upload in parallel.
    pub part_concurrent: usize,
    /// Load duration (a time limit when `uploads_per_worker` is set).
    #[serde(with = "humantime_secs")]
    pub duration: Duration,
    /// Uploads per worker before it stops; `None` = until `duration`.
    pub uploads_per_worker: Option<u64>,
    /// Delete each object once completed.
    pub delete_after: bool,
}

/// A config value of the cluster and whether it was given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Knob<T> {
    /// The value written into the config.
    pub value: T,
    /// Given on the command line (then the binary must accept it).
    pub explicit: bool,
}

/// Budgets and admission settings of one cluster.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Knobs {
    /// Meta `sled_cache_bytes`.
    pub meta_sled_cache: Knob<u64>,
    /// Datanode `write_budget_bytes`.
    pub datanode_write_budget: Knob<u64>,
    /// Gateway `buffer_budget_bytes`.
    pub gateway_buffer_budget: Knob<u64>,
    /// Gateway `read_budget_bytes`.
    pub gateway_read_budget: Knob<u64>,
    /// Gateway `max_inflight_requests` (left to the gateway when `None`).
    pub max_inflight: Option<Knob<u64>>,
    /// Gateway `stall_timeout` (left to the gateway when `None`).
    pub stall_timeout: Option<Knob<Duration>>,
}

/// Thresholds of the RSS checks.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RssRules {
    /// Allowed growth after the warm-up, percent of the RSS at its end.
    pub growth_pct: f64,
    /// Allowed growth when larger than the percentage, bytes.
    pub growth_floor: u64,
    /// Extra allowance over baseline + budgets, bytes.
    pub slack: u64,
}

/// Everything a soak run does, resolved from [`SoakOptions`].
#[derive(Debug, Clone)]
pub struct Plan {
    /// `--smoke`.
    pub smoke: bool,
    /// The `sluice` binary.
    pub sluice_bin: PathBuf,
    /// Configs and data.
    pub work_dir: PathBuf,
    /// Results.
    pub out_dir: PathBuf,
    /// Keep data directories.
    pub keep: bool,
    /// `--insecure-cluster`.
    pub insecure_cluster: bool,
    /// `--s3-https`.
    pub s3_https: bool,
    /// Shapes to run, sorted.
    pub shapes: Vec<ShapeName>,
    /// Free bytes required in the work dir's file system.
    pub min_free_disk: u64,
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
    /// Cluster settings for the seed and SDK-default shapes.
    pub normal_knobs: Knobs,
    /// Cluster settings for the overload shape.
    pub overload_knobs: Knobs,
    /// Seed workload.
    pub seed: LoadShape,
    /// Seed warm-up.
    pub warmup: Duration,
    /// SDK-default workload.
    pub sdk: LoadShape,
    /// Overload workload.
    pub overload: LoadShape,
    /// RSS thresholds.
    pub rss: RssRules,
}

fn knob<T>(given: Option<T>, default: T) -> Knob<T> {
    match given {
        Some(value) => Knob {
            value,
            explicit: true,
        },
        None => Knob {
            value: default,
            explicit: false,
        },
    }
}

fn explicit<T>(given: Option<T>) -> Option<Knob<T>> {
    given.map(|value| Knob {
        value,
        explicit: true,
    })
}

impl SoakOptions {
    /// Fills every unset flag from the profile (full or `--smoke`) and checks ranges.
    ///
    /// # Errors
    /// [`BenchError::InvalidOption`] for an empty shape list, a zero
    /// concurrency, part count, part size, duration or attempt count, a
    /// warm-up not shorter than the seed duration, or a negative growth percentage.
    pub fn resolve(&self) -> Result<Plan, BenchError> {
        let smoke = self.smoke;
        let pick = |full: u64, small: u64| if smoke { small } else { full };
        let pick_d = |full: u64, small: u64| Duration::from_secs(pick(full, small));
        let size = |given: Option<ByteSize>, full: u64, small: u64| {
            given.map_or_else(|| pick(full, small), |b| b.as_u64())
        };
        let mut shapes = self.shapes.clone();
        shapes.sort();
        shapes.dedup();

        let seed = LoadShape {
            concurrent: self.seed_concurrent.unwrap_or(5),
            parts: self.seed_parts.unwrap_or(if smoke { 10 } else { 100 }),
            part_size: size(self.seed_part_size, 10 * MIB, 5 * MIB),
            part_concurrent: 1,
            duration: self.duration.unwrap_or_else(|| pick_d(30 * 60, 60)),
            uploads_per_worker: None,
            delete_after: true,
        };
        let sdk_parts = self.sdk_parts.unwrap_or(if smoke { 3 } else { 10 });
        let sdk = LoadShape {
            concurrent: self.sdk_uploads.unwrap_or(if smoke { 2 } else { 8 }),
            parts: sdk_parts,
            part_size: size(self.sdk_part_size, 8 * MIB, 5 * MIB),
            part_concurrent: sdk_parts as usize,
            duration: self.sdk_timeout.unwrap_or_else(|| pick_d(10 * 60, 120)),
            uploads_per_worker: Some(1),
            delete_after: false,
        };
        let overload_parts = self.overload_parts.unwrap_or(if smoke { 4 } else { 16 });
        let overload = LoadShape {
            concurrent: self
                .overload_concurrent
                .unwrap_or(if smoke { 16 } else { 64 }),
            parts: overload_parts,
            part_size: size(self.overload_part_size, 5 * MIB, 5 * MIB),
            part_concurrent: overload_parts as usize,
            duration: self.overload_duration.unwrap_or_else(|| pick_d(180, 30)),
            uploads_per_worker: None,
            delete_after: false,
        };
        let warmup = self.warmup.unwrap_or_else(|| pick_d(5 * 60, 10));
        let meta_sled_cache = knob(self.meta_sled_cache.map(|b| b.as_u64()), 64 * MIB);
        let plan = Plan {
            smoke,
            sluice_bin: self.sluice_bin.clone(),
            work_dir: self.work_dir.clone(),
            out_dir: self.out_dir.clone(),
            keep: self.keep,
            insecure_cluster: self.insecure_cluster,
            s3_https: self.s3_https,
            shapes,
            min_free_disk: size(self.min_free_disk, 10 * GIB, 2 * GIB),
            ready_timeout: self.ready_timeout,
            stop_timeout: self.stop_timeout,
            cluster_log: self.cluster_log.clone(),
            max_attempts: self.max_attempts,
            verify_concurrency: self.verify_concurrency,
            normal_knobs: Knobs {
                meta_sled_cache,
                datanode_write_budget: knob(
                    self.datanode_write_budget.map(|b| b.as_u64()),
                    64 * MIB,
                ),
                gateway_buffer_budget: knob(
                    self.gateway_buffer_budget.map(|b| b.as_u64()),
                    256 * MIB,
                ),
                gateway_read_budget: knob(self.gateway_read_budget.map(|b| b.as_u64()), 128 * MIB),
                max_inflight: explicit(self.max_inflight),
                stall_timeout: explicit(self.stall_timeout),
            },
            overload_knobs: Knobs {
                meta_sled_cache,
                datanode_write_budget: knob(
                    self.overload_datanode_write_budget.map(|b| b.as_u64()),
                    8 * MIB,
                ),
                gateway_buffer_budget: knob(
                    self.overload_gateway_buffer_budget.map(|b| b.as_u64()),
                    16 * MIB,
                ),
                gateway_read_budget: knob(
                    self.overload_gateway_read_budget.map(|b| b.as_u64()),
                    8 * MIB,
                ),
                max_inflight: Some(knob(self.overload_max_inflight, 32)),
                stall_timeout: explicit(self.overload_stall_timeout),
            },
            seed,
            warmup,
            sdk,
            overload,
            rss: RssRules {
                growth_pct: self
                    .rss_growth_pct
                    .unwrap_or(if smoke { 25.0 } else { 5.0 }),
                growth_floor: size(self.rss_growth_floor, 16 * MIB, 64 * MIB),
                slack: size(self.rss_slack, 4 * MIB, 256 * MIB),
            },
        };
        plan.validate()?;
        Ok(plan)
    }
}

impl Plan {
    fn validate(&self) -> Result<(), BenchError> {
        let invalid = |flag: &'static str, reason: &str| {
            Err(BenchError::InvalidOption {
                flag,
                reason: reason.to_owned(),
            })
        };
        if self.shapes.is_empty() {
            return invalid("shapes", "name at least one shape");
        }
        for (flag, shape) in [
            ("seed-*", &self.seed),
            ("sdk-*", &self.sdk),
            ("overload-*", &self.overload),
        ] {
            if shape.concurrent == 0 || shape.parts == 0 || shape.part_concurrent == 0 {
                return invalid(flag, "uploads and parts must be at least 1");
            }
            if shape.part_size == 0 {
                return invalid(flag, "part size must be positive");
            }
            if shape.duration.is_zero() {
                return invalid(flag, "duration must be positive");
            }
        }
        if self.warmup >= self.seed.duration {
            return invalid("warmup", "must be shorter than --duration");
        }
        if self.max_attempts == 0 {
            return invalid("max-attempts", "must be at least 1");
        }
        if self.verify_concurrency == 0 {
            return invalid("verify-concurrency", "must be at least 1");
        }
        if self.rss.growth_pct.is_nan() || self.rss.growth_pct < 0.0 {
            return invalid("rss-growth-pct", "must be a non-negative number");
        }
        Ok(())
    }
}

/// Serialises a duration as seconds (f64).
mod humantime_secs {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        options: SoakOptions,
    }

    fn plan(args: &[&str]) -> Result<Plan, BenchError> {
        let cli = Cli::try_parse_from(std::iter::once("soak").chain(args.iter().copied()))
            .expect("flags parse");
        cli.options.resolve()
    }

    #[test]
    fn full_profile_matches_the_issue() {
        let p = plan(&[]).expect("valid");
        assert!(!p.smoke);
        assert_eq!(
            p.shapes,
            vec![ShapeName::Seed, ShapeName::SdkDefault, ShapeName::Overload]
        );
        assert_eq!(
            (p.seed.concurrent, p.seed.part_concurrent, p.seed.parts),
            (5, 1, 100)
        );
        assert_eq!(p.seed.part_size, 10 * MIB);
        assert_eq!(p.seed.duration, Duration::from_secs(1800));
        assert!(p.seed.delete_after);
        assert_eq!(p.warmup, Duration::from_secs(300));
        assert_eq!(
            (p.sdk.concurrent, p.sdk.parts, p.sdk.part_concurrent),
            (8, 10, 10)
        );
        assert_eq!(p.sdk.part_size, 8 * MIB);
        assert_eq!(p.sdk.uploads_per_worker, Some(1));
        assert_eq!(
            (p.overload.concurrent, p.overload.part_concurrent),
            (64, 16)
        );
        assert_eq!(p.overload.duration, Duration::from_secs(180));
        assert_eq!(p.min_free_disk, 10 * GIB);
        assert_eq!(p.rss.growth_pct, 5.0);
        assert_eq!(p.rss.growth_floor, 16 * MIB);
        // base + budgets (+ the gateway's client terms), plus 4 MiB for
        // what the formula does not count (allocator metadata, thread stacks).
        assert_eq!(p.rss.slack, 4 * MIB);
        assert_eq!(p.overload_knobs.datanode_write_budget.value, 8 * MIB);
        assert!(!p.overload_knobs.datanode_write_budget.explicit);
        assert_eq!(p.normal_knobs.max_inflight, None);
    }

    #[test]
    fn smoke_profile_is_small_and_flags_still_win() {
        let p = plan(&["--smoke", "--duration", "90s", "--max-inflight", "100"]).expect("valid");
        assert!(p.smoke);
        assert_eq!(p.seed.duration, Duration::from_secs(90));
        assert_eq!(p.warmup, Duration::from_secs(10));
        assert_eq!((p.sdk.concurrent, p.sdk.parts), (2, 3));
        assert_eq!(p.sdk.part_size, 5 * MIB);
        assert_eq!(p.overload.duration, Duration::from_secs(30));
        assert_eq!(p.min_free_disk, 2 * GIB);
        assert_eq!(
            p.normal_knobs.max_inflight,
            Some(Knob {
                value: 100,
                explicit: true
            })
        );
    }

    #[test]
    fn shapes_are_sorted_and_deduplicated() {
        let p = plan(&["--shapes", "overload,seed,overload"]).expect("valid");
        assert_eq!(p.shapes, vec![ShapeName::Seed, ShapeName::Overload]);
    }

    #[test]
    fn rejects_inconsistent_values() {
        for args in [
            &["--warmup", "30m"][..],
            &["--seed-concurrent", "0"],
            &["--sdk-parts", "0"],
            &["--overload-part-size", "0"],
            &["--max-attempts", "0"],
            &["--rss-growth-pct=-1"],
        ] {
            assert!(plan(args).is_err(), "{args:?} should be rejected");
        }
    }
}
