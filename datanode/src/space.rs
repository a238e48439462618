//! [`DiskSpace`]: free space of the data dir's filesystem and the
//! `reserved_free_bytes` reserve (`docs/design/durability.md` §7).
//!
//! Free bytes come from `statvfs(2)` of the data dir (blocks available to
//! unprivileged users × fragment size). PutShard asks
//! [`DiskSpace::below_reserve`] before taking a new shard; the answer is
//! cached for [`FREE_SPACE_RECHECK`] so a busy node does not statvfs per
//! request. Heartbeats read a fresh value ([`DiskSpace::probe`]).
//! A failing statvfs (the data dir's filesystem is gone or broken) marks
//! the disk failed: not writable, and PutShard refuses new shards.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use std::time::Instant;

/// Longest time a cached free-space answer is used by PutShard.
pub const FREE_SPACE_RECHECK: Duration = Duration::from_secs(1);

/// Reads the free bytes of a filesystem; a seam for tests.
pub type Probe = Box<dyn Fn(&Path) -> std::io::Result<u64> + Send + Sync>;

/// Free bytes of the filesystem holding `path`, from `statvfs(2)`.
pub fn statvfs_free_bytes(path: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    #[allow(clippy::useless_conversion)]
    let (avail, frag) = (
        u64::from(st.blocks_available()),
        u64::from(st.fragment_size()),
    );
    Ok(avail.saturating_mul(frag))
}

/// The kind of filesystem holding `path` (`statfs(2)`'s `f_type`): a name
/// such as `"xfs"`, or the magic number in hex for kinds not listed here.
pub fn filesystem_kind(path: &Path) -> std::io::Result<String> {
    use nix::sys::statfs::{
        BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, NFS_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC, TMPFS_MAGIC,
        XFS_SUPER_MAGIC, statfs,
    };
    let kind = statfs(path)
        .map_err(std::io::Error::from)?
        .filesystem_type();
    let name = match kind {
        XFS_SUPER_MAGIC => "xfs",
        // ext2, ext3 and ext4 share one magic number.
        EXT4_SUPER_MAGIC => "ext4",
        BTRFS_SUPER_MAGIC => "btrfs",
        TMPFS_MAGIC => "tmpfs",
        OVERLAYFS_SUPER_MAGIC => "overlayfs",
        NFS_SUPER_MAGIC => "nfs",
        other => return Ok(format!("{:#x}", other.0)),
    };
    Ok(name.to_string())
}

/// Whether Sluice is tested on this filesystem kind: XFS (recommended) and
/// ext4. Others work as far as POSIX goes, but their fsync and rename
/// durability is not what the tests check.
pub fn filesystem_is_tested(kind: &str) -> bool {
    matches!(kind, "xfs" | "ext4")
}

/// Logs the data dir's filesystem at start; a warning when it is not one
/// [`filesystem_is_tested`] (e.g. tmpfs loses every shard on reboot).
pub fn log_filesystem(data_dir: &Path) {
    match filesystem_kind(data_dir) {
        Ok(kind) if filesystem_is_tested(&kind) => {
            tracing::info!(data_dir = %data_dir.display(), filesystem = %kind, "data dir filesystem")
        }
        Ok(kind) => tracing::warn!(
            data_dir = %data_dir.display(),
            filesystem = %kind,
            "data dir is not on XFS or ext4: Sluice's durability is tested on XFS (recommended) and ext4 only"
        ),
        Err(e) => {
            tracing::warn!(data_dir = %data_dir.display(), error = %e, "cannot read the data dir's filesystem type")
        }
    }
}

/// What one look at the disk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceReading {
    /// Bytes free for this node's writes (0 when the probe failed).
    pub free_bytes: u64,
    /// The probe failed: the data dir's filesystem is unusable.
    pub disk_failed: bool,
    /// `free_bytes >= reserved_free_bytes && !disk_failed`.
    pub writable: bool,
}

/// Free space of the data dir against the reserve.
pub struct DiskSpace {
    path: PathBuf,
    /// `reserved_free_bytes`.
    reserve: u64,
    probe: Probe,
    /// Longest age of a cached reading ([`FREE_SPACE_RECHECK`]).
    recheck: Duration,
    /// Last reading and when it was taken.
    cached: Mutex<Option<(Instant, SpaceReading)>>,
}

impl DiskSpace {
    /// Watches the filesystem of `data_dir` with `statvfs`.
    pub fn new(data_dir: &Path, reserve: u64) -> Self {
        Self::with_probe(
            data_dir,
            reserve,
            FREE_SPACE_RECHECK,
            Box::new(statvfs_free_bytes),
        )
    }

    /// Watches with a custom probe and cache age (tests).
    pub fn with_probe(data_dir: &Path, reserve: u64, recheck: Duration, probe: Probe) -> Self {
        DiskSpace {
            path: data_dir.to_path_buf(),
            reserve,
            probe,
            recheck,
            cached: Mutex::new(None),
        }
    }

    /// `reserved_free_bytes`.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Reads the disk now (and refreshes the cache).
    pub fn probe(&self) -> SpaceReading {
        let reading = match (self.probe)(&self.path) {
            Ok(free_bytes) => SpaceReading {
                free_bytes,
                disk_failed: false,
                writable: free_bytes >= self.reserve,
            },
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "statvfs of the data dir failed: disk marked failed");
                SpaceReading {
                    free_bytes: 0,
                    disk_failed: true,
                    writable: false,
                }
            }
        };
        *self.cached.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), reading));
        reading
    }

    /// The last reading if younger than the recheck age, else a new one.
    pub fn cached(&self) -> SpaceReading {
        let last = *self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        match last {
            Some((at, r)) if at.elapsed() < self.recheck => r,
            _ => self.probe(),
        }
    }

    /// Whether PutShard must refuse a new shard (cached reading).
    pub fn below_reserve(&self) -> bool {
        !self.cached().writable
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn filesystem_kind_names_tmpfs_and_fails_on_a_missing_dir() {
        // /dev/shm is tmpfs on Linux (POSIX shared memory).
        assert_eq!(filesystem_kind(Path::new("/dev/shm")).unwrap(), "tmpfs");
        assert!(!filesystem_is_tested("tmpfs"));
        assert!(filesystem_is_tested("xfs") && filesystem_is_tested("ext4"));
        assert!(filesystem_kind(Path::new("/nonexistent/sluice")).is_err());
    }

    #[test]
    fn statvfs_reads_the_temp_dir() {
        let dir = tempfile::tempdir().unwrap();
        let free = statvfs_free_bytes(dir.path()).unwrap();
        assert!(free > 0, "a test machine has some free space");
        assert!(statvfs_free_bytes(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn the_reserve_is_rechecked_after_the_cache_age() {
        let free = Arc::new(AtomicU64::new(2000));
        let calls = Arc::new(AtomicU64::new(0));
        let (f, c) = (Arc::clone(&free), Arc::clone(&calls));
        let recheck = Duration::from_millis(200);
        let space = DiskSpace::with_probe(
            Path::new("/x"),
            1000,
            recheck,
            Box::new(move |_| {
                c.fetch_add(1, Ordering::Relaxed);
                Ok(f.load(Ordering::Relaxed))
            }),
        );
        assert!(!space.below_reserve());
        free.store(999, Ordering::Relaxed);
        assert!(!space.below_reserve(), "cached for a second");
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        std::thread::sleep(recheck);
        assert!(space.below_reserve());
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        assert_eq!(
            space.probe(),
            SpaceReading {
                free_bytes: 999,
                disk_failed: false,
                writable: false
            }
        );
        free.store(1000, Ordering::Relaxed);
        assert!(space.probe().writable, "exactly the reserve is writable");
    }

    #[test]
    fn a_failing_probe_marks_the_disk_failed() {
        let space = DiskSpace::with_probe(
            Path::new("/x"),
            0,
            FREE_SPACE_RECHECK,
            Box::new(|_| Err(std::io::Error::other("EIO"))),
        );
        assert_eq!(
            space.probe(),
            SpaceReading {
                free_bytes: 0,
                disk_failed: true,
                writable: false
            }
        );
        assert!(space.below_reserve());
    }
}
