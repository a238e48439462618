//! `gc-pass`: one datanode GC pass over a store of many shards (the time
//! of one GC pass on a datanode with 1 M synthetic shard files).
//!
//! Runs the datanode's own code on a real disk, in this process:
//! 1. checks the free bytes and inodes of the filesystem holding
//!    `--work-dir` (`statvfs`): each shard file takes one inode and one
//!    filesystem block;
//! 2. opens a real [`DiskStore`] in `<work-dir>/store`, writes one template
//!    shard through the store's own write path (create, one 1-byte block,
//!    commit: [`SHARD_FILE_BYTES`] bytes, the smallest shard with data) and
//!    copies those bytes to the paths of `--shards` shards
//!    ([`DiskStore::shard_path`], so every fan-out directory gets its
//!    share), each with an mtime [`SHARD_AGE`] back (past `gc_grace`). The
//!    write path's fsync, rename and directory fsync per shard would be
//!    slow for a million shards; the copies are the same bytes
//!    under the same names, and one `syncfs` makes them durable. The store
//!    is then opened again (its start-up count reads every directory).
//!    Setup is untimed but printed;
//! 3. with `--drop-caches` (root), drops the page, dentry and inode caches
//!    so the pass starts cold, as on a datanode whose metadata was evicted;
//! 4. times one pass of [`collect`], the function a datanode runs every
//!    `gc_interval`: its listing walk, [`BlobLocks`], oracle calls of
//!    [`GC_CALL_SHARDS`](sluice_datanode::gc::GC_CALL_SHARDS) and one unlink (plus directory fsync) per
//!    collectable shard, paced at `--gc-max-ops-per-sec`. The
//!    [`ReferenceOracle`] is [`TwinOracle`], an in-memory twin of meta's
//!    `Collectable` that answers from the shard's number (encoded in its
//!    blob id) whether it is one of the `--unreferenced-percent`
//!    unreferenced shards: meta's side of GC is measured by
//!    `sluice-bench meta-load`, so this isolates the datanode's walk and
//!    deletes (and the twin holds no per-shard memory, so the pass's peak
//!    RSS is the datanode's);
//! 5. checks every shard path with `stat`: exactly the unreferenced shards
//!    are gone and every referenced one is still there, and the store's own
//!    count agrees ([`Verification`]). The command fails otherwise;
//! 6. times a second pass, unpaced, which finds nothing left to delete: the
//!    listing walk and the oracle calls alone, without the deletes (each an
//!    unlink and a directory fsync) or the pace.
//!
//! The figures are printed as a table ([`render`]) and written to
//! `<out-dir>/summary.json`. Directory entries read are not counted (the
//! store has no counter); by the store's design a walk reads each fan-out
//! directory once, i.e. about `--shards` entries.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use serde::Serialize;
use sluice_datanode::config::DEFAULT_GC_MAX_OPS_PER_SEC;
use sluice_datanode::gc::{GcPass, ReferenceOracle, collect};
use sluice_datanode::locks::BlobLocks;
use sluice_datanode::store::{Block, DiskStore, ShardKey, ShardStore, ShardWriter};
use sluice_proto::blob_id::new_blob_id;

/// Write epoch named by every synthetic blob id (`e1.<32 hex>`).
pub const BLOB_EPOCH: u64 = 1;
/// Shard indexes used: shard `i` is index `i % SHARD_INDEXES` of its own
/// blob (one shard per blob on this node, as placement spreads a blob's
/// shards over nodes).
pub const SHARD_INDEXES: u64 = 9;
/// How far back every shard's mtime is set: well past the datanode's
/// default `gc_grace` (10 min), so the pass asks about every shard.
pub const SHARD_AGE: Duration = Duration::from_secs(24 * 3600);
/// Bytes of each shard file: the 16-byte header, one 1-byte block and its
/// 4-byte CRC32C (`sluice_datanode::store::stored_len(1, 1)`).
pub const SHARD_FILE_BYTES: u64 = 21;
/// Block size named in the template's header, bytes (any valid one; the
/// shard holds a single short block).
const TEMPLATE_BLOCK_SIZE: u32 = 1 << 20;
/// Free bytes kept beyond the estimate of what the shards need.
const SPACE_MARGIN_BYTES: u64 = 1 << 30;
/// Free inodes kept beyond one per shard and per directory.
const INODE_MARGIN: u64 = 100_000;
/// Shards between two progress lines of the setup.
const PROGRESS_EVERY: u64 = 100_000;

/// Flags of the `gc-pass` example (`cargo run -p sluice-datanode --example gc-pass`).
#[derive(Debug, Clone, clap::Args)]
pub struct GcPassOptions {
    /// Directory for the store (refused if it exists and is neither empty nor a previous
    /// gc-pass work dir; deleted at the end unless --keep).
    #[arg(long, default_value = "sluice-gc-pass")]
    pub work_dir: PathBuf,
    /// Directory for summary.json.
    #[arg(long, default_value = "sluice-gc-pass-out")]
    pub out_dir: PathBuf,
    /// Shard files written into the store (one 21-byte file each).
    #[arg(long, default_value_t = 1_000_000)]
    pub shards: u64,
    /// Percent of the shards the oracle answers collectable (0..=100).
    #[arg(long, default_value_t = 10)]
    pub unreferenced_percent: u64,
    /// GC pace: shards listed plus shards deleted per second (the datanode's
    /// gc_max_ops_per_sec, default its default); 0 = unlimited.
    #[arg(long, default_value_t = DEFAULT_GC_MAX_OPS_PER_SEC)]
    pub gc_max_ops_per_sec: u64,
    /// Drop the page, dentry and inode caches before the pass (needs root; affects the
    /// whole machine).
    #[arg(long)]
    pub drop_caches: bool,
    /// Keep the work directory at the end.
    #[arg(long)]
    pub keep: bool,
}

/// What the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct GcPassSummary {
    /// Shard files written.
    pub shards: u64,
    /// `--unreferenced-percent`.
    pub unreferenced_percent: u64,
    /// Shards the oracle answers collectable: `shards * percent / 100`.
    pub unreferenced_shards: u64,
    /// Bytes of each shard file.
    pub shard_file_bytes: u64,
    /// Filesystem kind of the work dir (`ext4`, `xfs`, ...).
    pub filesystem: String,
    /// Pace of the pass, shard operations per second; 0 = unlimited.
    pub gc_max_ops_per_sec: u64,
    /// Whether the caches were dropped before the pass.
    pub cold_cache: bool,
    /// Setup: seconds to write the shard files (untimed by the pass).
    pub create_s: f64,
    /// Setup: seconds of the `syncfs` after writing them.
    pub sync_s: f64,
    /// Setup: seconds to open the store (its start-up count of every shard).
    pub open_s: f64,
    /// Wall time of the GC pass, seconds.
    pub pass_s: f64,
    /// Least time the pace allows, seconds: (listed + deleted) / pace;
    /// `None` when unlimited.
    pub pace_floor_s: Option<f64>,
    /// Shards listed by the pass.
    pub scanned_shards: u64,
    /// Shards past the grace (asked about).
    pub old_shards: u64,
    /// Shards the oracle answered collectable.
    pub collectable_shards: u64,
    /// Shards the pass deleted.
    pub deleted_shards: u64,
    /// Wall time of a second, unpaced pass right after the first (nothing
    /// left to delete: the listing walk and oracle calls alone), seconds.
    pub second_pass_s: f64,
    /// Shards the second pass listed.
    pub second_pass_scanned_shards: u64,
    /// Oracle calls of both passes.
    pub oracle_calls: u64,
    /// Shards asked about in the oracle calls of both passes.
    pub oracle_shards_asked: u64,
    /// Peak RSS of this process during setup, MiB (`VmHWM`).
    pub peak_rss_setup_mib: f64,
    /// Peak RSS of this process during the pass, MiB (`VmHWM` after a reset
    /// through `/proc/self/clear_refs`; the process peak when the reset
    /// failed, see `peak_rss_reset`).
    pub peak_rss_pass_mib: f64,
    /// Whether the peak was reset before the pass.
    pub peak_rss_reset: bool,
    /// Seconds of the check after the pass.
    pub verify_s: f64,
    /// The check after the pass.
    pub verification: Verification,
}

/// The check after the pass: every shard path stat'ed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Verification {
    /// Referenced shards that are gone (GC deleted what meta still needs).
    pub wrongly_deleted: u64,
    /// Unreferenced shards still stored (GC missed garbage).
    pub missed: u64,
    /// Up to [`Verification::EXAMPLES`] file names of either kind.
    pub examples: Vec<String>,
    /// The store's own shard count after the pass.
    pub store_shards: u64,
    /// Shards that should remain: `shards - unreferenced_shards`.
    pub expected_shards: u64,
}

impl Verification {
    /// Most example names kept.
    pub const EXAMPLES: usize = 8;

    /// Exactly the unreferenced shards are gone.
    pub fn correct(&self) -> bool {
        self.wrongly_deleted == 0 && self.missed == 0 && self.store_shards == self.expected_shards
    }
}

/// Whether shard `i` is one of the unreferenced ones: spread evenly, and
/// exactly `n * percent / 100` of shards `0..n` are (rounded down).
pub fn is_unreferenced(i: u64, percent: u64) -> bool {
    let (i, p) = (u128::from(i), u128::from(percent));
    (i + 1) * p / 100 > i * p / 100
}

/// Unreferenced shards among `0..shards`.
pub fn unreferenced_count(shards: u64, percent: u64) -> u64 {
    (u128::from(shards) * u128::from(percent) / 100) as u64
}

/// SplitMix64 of `i`: the random-looking high half of shard `i`'s blob id.
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Key of synthetic shard `i`: blob `e1.<mix(i) hex><i hex>`, index
/// `i % SHARD_INDEXES`.
pub fn shard_key(i: u64) -> ShardKey {
    let blob = new_blob_id(BLOB_EPOCH, (u128::from(mix(i)) << 64) | u128::from(i));
    ShardKey::new(blob, (i % SHARD_INDEXES) as u32).expect("synthetic blob ids are valid")
}

/// The number `i` of a synthetic shard key ([`shard_key`]); `None` for
/// any other key.
pub fn shard_number(key: &ShardKey) -> Option<u64> {
    let hex = key.blob_id().strip_prefix("e1.")?;
    let n = u128::from_str_radix(hex, 16).ok()?;
    let i = n as u64;
    (hex.len() == 32
        && (n >> 64) as u64 == mix(i)
        && u64::from(key.shard_index()) == i % SHARD_INDEXES)
        .then_some(i)
}

/// An in-memory twin of meta's `Collectable` over the synthetic shards:
/// shard `i < shards` is collectable iff [`is_unreferenced`]; any other key
/// is referenced (GC never deletes on doubt). Holds no per-shard state.
#[derive(Debug, Default)]
pub struct TwinOracle {
    shards: u64,
    unreferenced_percent: u64,
    calls: AtomicU64,
    asked: AtomicU64,
}

impl TwinOracle {
    /// The twin of a store holding synthetic shards `0..shards`.
    pub fn new(shards: u64, unreferenced_percent: u64) -> Self {
        TwinOracle {
            shards,
            unreferenced_percent,
            ..TwinOracle::default()
        }
    }

    /// The answer for one shard.
    pub fn is_collectable(&self, key: &ShardKey) -> bool {
        shard_number(key)
            .is_some_and(|i| i < self.shards && is_unreferenced(i, self.unreferenced_percent))
    }
}

/// An oracle that counts what it was asked.
pub trait CountingOracle: ReferenceOracle {
    /// Calls answered so far.
    fn calls(&self) -> u64;
    /// Shards asked about so far.
    fn asked(&self) -> u64;
}

impl CountingOracle for TwinOracle {
    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn asked(&self) -> u64 {
        self.asked.load(Ordering::Relaxed)
    }
}

impl ReferenceOracle for TwinOracle {
    type Error = Infallible;

    async fn collectable(
        &self,
        _node_id: u64,
        shards: Vec<ShardKey>,
    ) -> Result<Vec<ShardKey>, Infallible> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.asked.fetch_add(shards.len() as u64, Ordering::Relaxed);
        Ok(shards
            .into_iter()
            .filter(|k| self.is_collectable(k))
            .collect())
    }
}

/// What [`measure`] needs: the store directory and the shape of the run.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The store's data dir (created; must not hold a store yet).
    pub store_dir: PathBuf,
    /// Shard files to write.
    pub shards: u64,
    /// Percent of them the oracle answers collectable.
    pub unreferenced_percent: u64,
    /// GC pace; 0 = unlimited.
    pub gc_max_ops_per_sec: u64,
    /// Drop the caches before the pass.
    pub drop_caches: bool,
}

/// Runs the benchmark (see the module docs): checks space, measures, writes
/// `summary.json`, removes the work dir unless `--keep`. Fails when the
/// check after the pass fails (after writing the summary).
pub async fn run(options: GcPassOptions) -> Result<GcPassSummary> {
    if options.shards == 0 || options.unreferenced_percent > 100 {
        bail!("--shards must be positive and --unreferenced-percent at most 100");
    }
    prepare_work_dir(&options.work_dir)?;
    check_space(&options.work_dir, options.shards)?;
    fs::create_dir_all(&options.out_dir)?;
    let shape = Shape {
        store_dir: options.work_dir.join("store"),
        shards: options.shards,
        unreferenced_percent: options.unreferenced_percent,
        gc_max_ops_per_sec: options.gc_max_ops_per_sec,
        drop_caches: options.drop_caches,
    };
    let oracle = TwinOracle::new(options.shards, options.unreferenced_percent);
    let summary = measure(&shape, &oracle).await?;
    fs::write(
        options.out_dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    if !options.keep {
        tracing::info!(dir = %options.work_dir.display(), "gc-pass: removing the work dir");
        fs::remove_dir_all(&options.work_dir)
            .with_context(|| format!("remove {}", options.work_dir.display()))?;
    }
    let v = &summary.verification;
    if !v.correct() {
        bail!(
            "GC deleted the wrong shards: {} referenced shards deleted, {} unreferenced shards kept, store counts {} (want {}); e.g. {:?}",
            v.wrongly_deleted,
            v.missed,
            v.store_shards,
            v.expected_shards,
            v.examples
        );
    }
    Ok(summary)
}

/// Creates `dir`, or empties it when it is a previous run's work dir
/// (holds only `store/`); refuses any other non-empty directory.
fn prepare_work_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let names: Vec<_> = fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        if names.iter().any(|n| n != "store") {
            bail!(
                "--work-dir {} exists and is not a gc-pass work dir; choose another",
                dir.display()
            );
        }
        fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(())
}

/// Checks (`statvfs`, like `df` and `df -i`) that the filesystem of `dir`
/// has an inode and a block per shard, plus the directories' entries
/// (~64 bytes per shard) and margins.
fn check_space(dir: &Path, shards: u64) -> Result<()> {
    let st =
        nix::sys::statvfs::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    #[allow(clippy::useless_conversion)]
    let (block, bytes_free, inodes_free) = (
        u64::from(st.fragment_size()),
        u64::from(st.blocks_available()).saturating_mul(u64::from(st.fragment_size())),
        u64::from(st.files_available()),
    );
    let bytes_needed = shards * (block.max(SHARD_FILE_BYTES) + 64) + SPACE_MARGIN_BYTES;
    let inodes_needed = shards + 512 + INODE_MARGIN;
    tracing::info!(
        bytes_free,
        bytes_needed,
        inodes_free,
        inodes_needed,
        "gc-pass: free space of the work dir's filesystem"
    );
    if bytes_free < bytes_needed || inodes_free < inodes_needed {
        bail!(
            "{} has {:.1} GiB and {} inodes free; {} shards need about {:.1} GiB and {} inodes",
            dir.display(),
            bytes_free as f64 / (1u64 << 30) as f64,
            inodes_free,
            shards,
            bytes_needed as f64 / (1u64 << 30) as f64,
            inodes_needed
        );
    }
    Ok(())
}

/// Sets up the store, runs one pass with `oracle` and checks the result
/// against [`is_unreferenced`] (see the module docs). Errors are setup,
/// pass or I/O failures; a wrong result is reported in
/// [`GcPassSummary::verification`].
pub async fn measure<O: CountingOracle>(shape: &Shape, oracle: &O) -> Result<GcPassSummary> {
    let filesystem = {
        fs::create_dir_all(&shape.store_dir)?;
        sluice_datanode::space::filesystem_kind(&shape.store_dir)
            .unwrap_or_else(|e| format!("unknown ({e})"))
    };
    let template = template_shard(&shape.store_dir).await?;
    anyhow::ensure!(
        template.len() as u64 == SHARD_FILE_BYTES,
        "template shard is {} bytes, want {SHARD_FILE_BYTES}",
        template.len()
    );

    // The shard files, written where the store keeps them.
    let probe = DiskStore::open(&shape.store_dir, 1).await?;
    let started = Instant::now();
    let mtime = SystemTime::now() - SHARD_AGE;
    let (store_for_write, shards) = (probe.clone(), shape.shards);
    tokio::task::spawn_blocking(move || write_shards(&store_for_write, shards, &template, mtime))
        .await??;
    let create_s = started.elapsed().as_secs_f64();
    drop(probe);
    let started = Instant::now();
    nix::unistd::syncfs(File::open(&shape.store_dir)?).context("syncfs")?;
    let sync_s = started.elapsed().as_secs_f64();
    if shape.drop_caches {
        fs::write("/proc/sys/vm/drop_caches", "3").context("drop caches (needs root)")?;
    }
    let started = Instant::now();
    let store = DiskStore::open(&shape.store_dir, 1).await?;
    let open_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        store.stats().shards == shape.shards,
        "the store counts {} shards after setup, want {}",
        store.stats().shards,
        shape.shards
    );
    if shape.drop_caches {
        // The open above read every directory; start the pass cold again.
        fs::write("/proc/sys/vm/drop_caches", "3").context("drop caches (needs root)")?;
    }
    tracing::info!(
        shards = shape.shards,
        create_s = format!("{create_s:.1}"),
        open_s = format!("{open_s:.1}"),
        "gc-pass: store ready; running one GC pass"
    );

    // The pass.
    let peak_rss_setup = vm_hwm_bytes();
    let peak_rss_reset = fs::write("/proc/self/clear_refs", "5").is_ok();
    let max_ops = match shape.gc_max_ops_per_sec {
        0 => u64::MAX,
        n => n,
    };
    let pass = GcPass {
        max_ops_per_sec: max_ops,
        ..GcPass::new(
            1,
            sluice_datanode::Config::default().gc_grace,
            SystemTime::now(),
        )
    };
    let locks = BlobLocks::new();
    let started = Instant::now();
    let report = collect(&store, oracle, &locks, &pass).await?;
    let pass_s = started.elapsed().as_secs_f64();
    let peak_rss_pass = vm_hwm_bytes();

    let started = Instant::now();
    let (check_store, percent) = (store.clone(), shape.unreferenced_percent);
    let mut verification =
        tokio::task::spawn_blocking(move || verify(&check_store, shards, percent)).await??;
    verification.store_shards = store.stats().shards;
    let verify_s = started.elapsed().as_secs_f64();

    // A second, unpaced pass finds nothing to delete: the walk and the
    // oracle calls alone.
    let unpaced = GcPass {
        max_ops_per_sec: u64::MAX,
        now: SystemTime::now(),
        ..pass
    };
    let started = Instant::now();
    let second = collect(&store, oracle, &locks, &unpaced).await?;
    let second_pass_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        second.deleted_shards == 0,
        "the second pass deleted {} shards",
        second.deleted_shards
    );

    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    Ok(GcPassSummary {
        shards: shape.shards,
        unreferenced_percent: shape.unreferenced_percent,
        unreferenced_shards: unreferenced_count(shape.shards, shape.unreferenced_percent),
        shard_file_bytes: SHARD_FILE_BYTES,
        filesystem,
        gc_max_ops_per_sec: shape.gc_max_ops_per_sec,
        cold_cache: shape.drop_caches,
        create_s,
        sync_s,
        open_s,
        pass_s,
        pace_floor_s: (shape.gc_max_ops_per_sec > 0).then(|| {
            (report.scanned_shards + report.deleted_shards) as f64 / shape.gc_max_ops_per_sec as f64
        }),
        scanned_shards: report.scanned_shards,
        old_shards: report.old_shards,
        collectable_shards: report.collectable_shards,
        deleted_shards: report.deleted_shards,
        second_pass_s,
        second_pass_scanned_shards: second.scanned_shards,
        oracle_calls: oracle.calls(),
        oracle_shards_asked: oracle.asked(),
        peak_rss_setup_mib: mib(peak_rss_setup),
        peak_rss_pass_mib: mib(peak_rss_pass),
        peak_rss_reset,
        verify_s,
        verification,
    })
}

/// Writes the template shard through the store's write path in a scratch
/// store next to `store_dir` and returns its file's bytes (the scratch
/// store is removed).
async fn template_shard(store_dir: &Path) -> Result<Vec<u8>> {
    let scratch = store_dir.with_extension("template");
    let store = DiskStore::open(&scratch, 1).await?;
    let key = shard_key(0);
    let mut writer = store.create(&key, TEMPLATE_BLOCK_SIZE).await?;
    let data = Bytes::from_static(b"s");
    writer
        .write_block(Block {
            crc32c: sluice_datanode::block_crc32c(&data),
            data,
        })
        .await?;
    writer.commit().await?;
    let bytes = fs::read(store.shard_path(&key))?;
    drop(store);
    fs::remove_dir_all(&scratch)?;
    Ok(bytes)
}

/// Writes shards `0..shards` as copies of `template` at their store paths,
/// each with mtime `mtime`; no fsync (the caller syncs the filesystem).
fn write_shards(store: &DiskStore, shards: u64, template: &[u8], mtime: SystemTime) -> Result<()> {
    for i in 0..shards {
        let path = store.shard_path(&shard_key(i));
        let mut file =
            File::create_new(&path).with_context(|| format!("create {}", path.display()))?;
        file.write_all(template)
            .with_context(|| format!("write {}", path.display()))?;
        file.set_modified(mtime)
            .with_context(|| format!("set mtime of {}", path.display()))?;
        if (i + 1) % PROGRESS_EVERY == 0 {
            tracing::info!(written = i + 1, of = shards, "gc-pass: writing shard files");
        }
    }
    Ok(())
}

/// Stats every shard path: referenced ones must exist, unreferenced ones
/// must not. Independent of the store's listing.
fn verify(store: &DiskStore, shards: u64, percent: u64) -> Result<Verification> {
    let mut v = Verification {
        expected_shards: shards - unreferenced_count(shards, percent),
        ..Verification::default()
    };
    for i in 0..shards {
        let key = shard_key(i);
        let path = store.shard_path(&key);
        let stored = match fs::symlink_metadata(&path) {
            Ok(_) => true,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(e).with_context(|| format!("stat {}", path.display())),
        };
        let wrong = match (is_unreferenced(i, percent), stored) {
            (false, false) => &mut v.wrongly_deleted,
            (true, true) => &mut v.missed,
            _ => continue,
        };
        *wrong += 1;
        if v.examples.len() < Verification::EXAMPLES {
            v.examples.push(key.to_string());
        }
    }
    Ok(v)
}

/// This process's peak RSS (`VmHWM` of `/proc/self/status`), bytes; 0 when
/// unreadable.
fn vm_hwm_bytes() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| sluice_harness::rss::parse_status_kib(&s, "VmHWM"))
        .unwrap_or(0)
}

/// The summary as a Markdown table.
pub fn render(s: &GcPassSummary) -> String {
    let mut out = String::new();
    let pace = match s.gc_max_ops_per_sec {
        0 => "unlimited".to_string(),
        n => format!("{n} ops/s"),
    };
    let _ = writeln!(
        out,
        "gc-pass: {} shard files of {} bytes on {}, {}% unreferenced, pace {}, {} cache",
        s.shards,
        s.shard_file_bytes,
        s.filesystem,
        s.unreferenced_percent,
        pace,
        if s.cold_cache { "cold" } else { "warm" }
    );
    let _ = writeln!(out, "| measure | value |\n|---|---|");
    let _ = writeln!(
        out,
        "| setup (untimed): write files / syncfs / open store | {:.1} s / {:.1} s / {:.1} s |",
        s.create_s, s.sync_s, s.open_s
    );
    let floor = s
        .pace_floor_s
        .map(|f| format!(" (pace floor {f:.1} s)"))
        .unwrap_or_default();
    let _ = writeln!(out, "| GC pass wall time | {:.2} s{floor} |", s.pass_s);
    let _ = writeln!(
        out,
        "| shards listed / asked / collectable / deleted | {} / {} / {} / {} |",
        s.scanned_shards, s.old_shards, s.collectable_shards, s.deleted_shards
    );
    let _ = writeln!(
        out,
        "| second pass, unpaced, nothing to delete (walk + oracle) | {:.2} s, {} shards listed |",
        s.second_pass_s, s.second_pass_scanned_shards
    );
    let _ = writeln!(
        out,
        "| oracle calls of both passes (shards asked) | {} ({}) |",
        s.oracle_calls, s.oracle_shards_asked
    );
    let _ = writeln!(
        out,
        "| peak RSS: pass / setup | {:.1} MiB{} / {:.1} MiB |",
        s.peak_rss_pass_mib,
        if s.peak_rss_reset {
            ""
        } else {
            " (process peak)"
        },
        s.peak_rss_setup_mib
    );
    let v = &s.verification;
    let _ = writeln!(
        out,
        "| check ({:.1} s) | {}: {} referenced deleted, {} unreferenced kept, store holds {} (want {}) |",
        s.verify_s,
        if v.correct() { "PASS" } else { "FAIL" },
        v.wrongly_deleted,
        v.missed,
        v.store_shards,
        v.expected_shards
    );
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};

    use sluice_datanode::store::{FANOUT, fanout_of};

    use super::*;

    /// Shard file names in all fan-out directories of a store's data dir,
    /// read from the disk (independent of the store and of [`verify`]).
    fn stored_names(store_dir: &Path) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for dir in fs::read_dir(store_dir.join("shards")).unwrap() {
            for entry in fs::read_dir(dir.unwrap().path()).unwrap() {
                names.insert(entry.unwrap().file_name().into_string().unwrap());
            }
        }
        names
    }

    fn shape(dir: &Path, shards: u64) -> Shape {
        Shape {
            store_dir: dir.join("store"),
            shards,
            unreferenced_percent: 10,
            gc_max_ops_per_sec: 0,
            drop_caches: false,
        }
    }

    #[test]
    fn unreferenced_shards_are_exactly_the_percent() {
        for n in [0u64, 1, 9, 10, 99, 100, 1000, 2001, 100_001] {
            for p in [0u64, 1, 10, 33, 50, 100] {
                let count = (0..n).filter(|&i| is_unreferenced(i, p)).count() as u64;
                assert_eq!(count, n * p / 100, "n {n} p {p}");
                assert_eq!(unreferenced_count(n, p), n * p / 100);
            }
        }
        // 10 %: one shard in every ten, evenly.
        let first: Vec<u64> = (0..30).filter(|&i| is_unreferenced(i, 10)).collect();
        assert_eq!(first, vec![9, 19, 29]);
    }

    #[test]
    fn shard_keys_round_trip_and_fill_every_fanout_directory() {
        let keys: Vec<ShardKey> = (0..2000).map(shard_key).collect();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(shard_number(k), Some(i as u64));
            assert_eq!(u64::from(k.shard_index()), i as u64 % SHARD_INDEXES);
            assert!(k.blob_id().starts_with("e1.") && k.blob_id().len() == 35);
        }
        assert_eq!(keys.iter().collect::<HashSet<_>>().len(), 2000);
        let fanouts: HashSet<usize> = keys.iter().map(|k| fanout_of(k.blob_id())).collect();
        assert_eq!(fanouts.len(), FANOUT);
        // Other keys are not synthetic shards (so never collectable).
        let other_index = ShardKey::new(shard_key(5).blob_id(), 6).unwrap();
        assert_eq!(shard_number(&other_index), None);
        assert_eq!(shard_number(&ShardKey::new("e1.00ff", 0).unwrap()), None);
        assert!(!TwinOracle::new(10, 100).is_collectable(&other_index));
        assert!(!TwinOracle::new(5, 100).is_collectable(&shard_key(5)));
        assert!(TwinOracle::new(6, 100).is_collectable(&shard_key(5)));
    }

    #[tokio::test]
    async fn one_pass_deletes_exactly_the_unreferenced_shards() {
        let dir = tempfile::tempdir().unwrap();
        let shape = shape(dir.path(), 2000);
        let oracle = TwinOracle::new(2000, 10);
        let s = measure(&shape, &oracle).await.unwrap();

        // What is on disk, read independently: every referenced shard and
        // nothing else.
        let want: BTreeSet<String> = (0..2000)
            .filter(|&i| !is_unreferenced(i, 10))
            .map(|i| shard_key(i).to_string())
            .collect();
        assert_eq!(want.len(), 1800);
        assert_eq!(stored_names(&shape.store_dir), want);

        assert_eq!(
            (
                s.scanned_shards,
                s.old_shards,
                s.collectable_shards,
                s.deleted_shards
            ),
            (2000, 2000, 200, 200)
        );
        assert_eq!(s.unreferenced_shards, 200);
        // Pages of 1000 blobs, calls of at most 1000 shards; the second
        // pass asks about the 1800 left and deletes none of them.
        assert_eq!(s.second_pass_scanned_shards, 1800);
        assert_eq!((s.oracle_calls, s.oracle_shards_asked), (4, 3800));
        assert_eq!(
            s.verification,
            Verification {
                store_shards: 1800,
                expected_shards: 1800,
                ..Verification::default()
            }
        );
        assert!(s.verification.correct());
        assert_eq!(s.pace_floor_s, None);
        assert!(s.pass_s > 0.0 && s.peak_rss_pass_mib > 0.0);
    }

    /// The twin, wrong about two shards: it answers one referenced shard
    /// collectable and one unreferenced shard referenced.
    struct WrongOracle(TwinOracle);

    const WRONGLY_COLLECTABLE: u64 = 5;
    const WRONGLY_REFERENCED: u64 = 9;

    impl ReferenceOracle for WrongOracle {
        type Error = Infallible;

        async fn collectable(
            &self,
            node_id: u64,
            shards: Vec<ShardKey>,
        ) -> Result<Vec<ShardKey>, Infallible> {
            let extra: Vec<ShardKey> = shards
                .iter()
                .filter(|k| shard_number(k) == Some(WRONGLY_COLLECTABLE))
                .cloned()
                .collect();
            let answer = self.0.collectable(node_id, shards).await?;
            Ok(answer
                .into_iter()
                .filter(|k| shard_number(k) != Some(WRONGLY_REFERENCED))
                .chain(extra)
                .collect())
        }
    }

    impl CountingOracle for WrongOracle {
        fn calls(&self) -> u64 {
            self.0.calls()
        }

        fn asked(&self) -> u64 {
            self.0.asked()
        }
    }

    #[tokio::test]
    async fn the_check_catches_a_wrong_delete_and_a_miss() {
        assert!(
            !is_unreferenced(WRONGLY_COLLECTABLE, 10) && is_unreferenced(WRONGLY_REFERENCED, 10)
        );
        let dir = tempfile::tempdir().unwrap();
        let shape = shape(dir.path(), 300);
        let s = measure(&shape, &WrongOracle(TwinOracle::new(300, 10)))
            .await
            .unwrap();
        let v = &s.verification;
        assert_eq!((v.wrongly_deleted, v.missed), (1, 1));
        assert_eq!((v.store_shards, v.expected_shards), (270, 270));
        let mut examples = v.examples.clone();
        examples.sort();
        let mut want = vec![
            shard_key(WRONGLY_COLLECTABLE).to_string(),
            shard_key(WRONGLY_REFERENCED).to_string(),
        ];
        want.sort();
        assert_eq!(examples, want);
        assert!(!v.correct());
        assert!(render(&s).contains("FAIL"));
    }
}
