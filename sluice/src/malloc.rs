//! Tuning of glibc's malloc, the system allocator, chosen by measurement
//! under the soak benchmark (see docs/design/memory.md).
//!
//! Applied once at start, before any thread is spawned; a setting whose
//! `MALLOC_*` environment variable is set is left to glibc (so it can still
//! be tuned without a rebuild). Not applied with the `jemalloc` or
//! `mimalloc` features, or off glibc.
//!
//! * `M_MMAP_THRESHOLD` = [`MMAP_THRESHOLD_BYTES`]. glibc's threshold is
//!   dynamic by default: each freed mmapped chunk raises it (up to 32 MiB),
//!   after which stripes and 256 KiB shard blocks are carved out of the
//!   arenas, and when freed they stay in the arenas' free lists, fragmented,
//!   instead of going back to the kernel. A fixed threshold keeps every
//!   buffer of that size in its own mapping, unmapped on free, so RSS
//!   follows the live bytes the budgets count (the gateway's reused
//!   full-stripe buffers are kept only inside its write budget's unused
//!   bytes: `gateway/src/blob/stripe_buffers.rs`). It lowers the soak's
//!   peak RSS of the gateway and the datanodes (`sluice-bench soak
//!   --shapes sdk-default,overload`; figures in bench/RESULTS.md).
//!   The gateway's largest HTTP/2 frame from a datanode, with its 9-byte
//!   head, is kept below it (`sluice_gateway::datanodes::MAX_FRAME_BYTES`,
//!   asserted below), so h2 reads a frame into a heap buffer of about its
//!   size; only its buffer grown by doubling past 128 KiB is a mapping.
//! * `M_ARENA_MAX` = [`ARENA_MAX`]. glibc creates up to 8 arenas per core,
//!   one per thread that allocates concurrently (tokio workers and
//!   blocking-pool threads doing disk I/O), and each keeps its own free
//!   memory. Two arenas are enough for two-way contention on small objects.
//!
//! Source: mallopt(3), and glibc's malloc/malloc.c on the dynamic mmap
//! threshold.

/// Allocations of at least this many bytes get their own mapping.
pub const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;
// The gateway's largest frame from a datanode and its 9-byte head (RFC 9113
// section 4.1) fit below the threshold: see the docs above.
const _: () = assert!(sluice_gateway::datanodes::MAX_FRAME_BYTES as i32 + 9 < MMAP_THRESHOLD_BYTES);
/// Most malloc arenas.
pub const ARENA_MAX: i32 = 2;

/// What [`tune`] did, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// `M_MMAP_THRESHOLD` set (not left to the environment or glibc).
    pub mmap_threshold: Option<i32>,
    /// `M_ARENA_MAX` set.
    pub arena_max: Option<i32>,
}

/// Applies the settings above (see the module docs). Call before spawning
/// threads.
pub fn tune() -> Tuning {
    imp::tune()
}

#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(feature = "jemalloc"),
    not(feature = "mimalloc")
))]
mod imp {
    use super::{ARENA_MAX, MMAP_THRESHOLD_BYTES, Tuning};

    #[allow(unsafe_code)]
    fn set(env: &str, param: libc::c_int, value: i32) -> Option<i32> {
        if std::env::var_os(env).is_some() {
            return None;
        }
        // SAFETY: mallopt only changes allocator parameters; it is called
        // before other threads exist.
        let ok = unsafe { libc::mallopt(param, value) } == 1;
        ok.then_some(value)
    }

    pub fn tune() -> Tuning {
        Tuning {
            mmap_threshold: set(
                "MALLOC_MMAP_THRESHOLD_",
                libc::M_MMAP_THRESHOLD,
                MMAP_THRESHOLD_BYTES,
            ),
            arena_max: set("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, ARENA_MAX),
        }
    }
}

#[cfg(not(all(
    target_os = "linux",
    target_env = "gnu",
    not(feature = "jemalloc"),
    not(feature = "mimalloc")
)))]
mod imp {
    use super::Tuning;

    pub fn tune() -> Tuning {
        Tuning {
            mmap_threshold: None,
            arena_max: None,
        }
    }
}
