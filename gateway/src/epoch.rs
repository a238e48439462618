//! The gateway's write epochs (see `docs/durability.md` §3 and
//! `OpenEpochRequest` in `proto/meta.proto`).
//!
//! Owner: the gateway-epochs work. The heal worker uses [`WriteEpochs::begin_write`]
//! and [`EpochGuard::epoch`]; keep those signatures.

use std::sync::Arc;

/// The write epochs of one gateway process: the current one new blobs are
/// written under, and older ones still renewed while writes begun under
/// them are in flight.
#[derive(Clone, Default)]
pub struct WriteEpochs {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    current: std::sync::atomic::AtomicU64,
}

/// Keeps its epoch renewed while alive: hold one for every write (client
/// or heal) from its first shard to its commit.
pub struct EpochGuard {
    epoch: u64,
}

impl EpochGuard {
    /// The epoch to name in blob ids, BeginHeal and UpdatePlacement.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl WriteEpochs {
    /// A guard on the current epoch.
    pub fn begin_write(&self) -> EpochGuard {
        EpochGuard {
            epoch: self
                .inner
                .current
                .load(std::sync::atomic::Ordering::Acquire),
        }
    }
}
