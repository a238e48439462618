//! Datanode liveness, kept in the leader's memory (never in the Raft log).
//!
//! A datanode is live when its last heartbeat is within the window. For
//! one window after this node became leader it has not yet heard from
//! anyone, so every registered datanode counts as live (the previous
//! leader's view is not replicated). Entries exist only for registered
//! datanodes, so the map is bounded by the registry. The capacity a
//! datanode reported with its last heartbeat (`writable`, free and used
//! bytes) is kept with it, in memory like liveness itself.

use sluice_util::clock::wall_clock_ms;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::ServerState;

use crate::raft::MetaRaft;

#[derive(Debug)]
pub(crate) struct Liveness {
    window: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When this node last became leader; `None` while not leader.
    leader_since: Option<Instant>,
    /// Datanode id -> its last heartbeat.
    seen: HashMap<u64, Seen>,
}

/// What the last heartbeat of one datanode said.
#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Instant,
    /// This node's wall clock at the heartbeat, ms since the Unix epoch.
    ms: i64,
    capacity: Capacity,
}

/// Disk capacity a datanode reports with each heartbeat. Before its first
/// heartbeat to this leader (a registration, or right after an election) a
/// node counts as writable with unknown (zero) figures: the previous
/// leader's view is not replicated, and refusing every write until the
/// next heartbeat would turn each election into a burst of 503s. A full
/// node says so within one heartbeat interval, and refuses shards itself
/// meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capacity {
    /// Free space above the node's `reserved_free_bytes` and a working disk.
    pub(crate) writable: bool,
    /// statfs free bytes of the data dir.
    pub(crate) free_bytes: u64,
    /// Bytes of shard files.
    pub(crate) used_bytes: u64,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            writable: true,
            free_bytes: 0,
            used_bytes: 0,
        }
    }
}

/// One datanode's liveness as [`Liveness::status`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Status {
    /// Heard from within the window (or within the grace window after
    /// this node became leader).
    pub(crate) live: bool,
    /// Wall clock of the last heartbeat, ms since the Unix epoch; 0 = none.
    pub(crate) last_heartbeat_ms: i64,
    /// `true` when a heartbeat was actually received within the window (no
    /// grace).
    pub(crate) heard: bool,
    /// From the last heartbeat; [`Capacity::default`] (writable) without one.
    pub(crate) capacity: Capacity,
    /// Since the last heartbeat, or since this node became leader when it
    /// has heard none (monotonic); zero while not leader.
    pub(crate) silent: Duration,
}

impl Liveness {
    pub(crate) fn new(window: Duration) -> Self {
        Liveness {
            window,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a cache that every operation leaves consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_leader(&self, leader: bool) {
        let mut s = self.lock();
        match (leader, s.leader_since.is_some()) {
            (true, false) => {
                s.leader_since = Some(Instant::now());
                s.seen.clear();
            }
            (false, true) => {
                s.leader_since = None;
                s.seen.clear();
            }
            _ => {}
        }
    }

    /// Drops what is known of datanode `id` (it was removed from the
    /// registry), keeping the map bounded by the registry.
    pub(crate) fn forget(&self, id: u64) {
        self.lock().seen.remove(&id);
    }

    /// Records a sign of life of a registered datanode without capacity
    /// figures (a registration): keeps the capacity of its last heartbeat.
    pub(crate) fn beat(&self, id: u64) {
        let mut s = self.lock();
        let capacity = s.seen.get(&id).map(|e| e.capacity).unwrap_or_default();
        s.seen.insert(
            id,
            Seen {
                at: Instant::now(),
                ms: wall_clock_ms(),
                capacity,
            },
        );
    }

    /// Records a heartbeat of a registered datanode with its capacity.
    pub(crate) fn beat_with(&self, id: u64, capacity: Capacity) {
        self.lock().seen.insert(
            id,
            Seen {
                at: Instant::now(),
                ms: wall_clock_ms(),
                capacity,
            },
        );
    }

    /// The liveness and last reported capacity of datanode `id`.
    pub(crate) fn status(&self, id: u64) -> Status {
        let s = self.lock();
        let Some(since) = s.leader_since else {
            return Status::default();
        };
        let grace = since.elapsed() < self.window;
        match s.seen.get(&id) {
            Some(e) => {
                let heard = e.at.elapsed() <= self.window;
                Status {
                    live: grace || heard,
                    last_heartbeat_ms: e.ms,
                    heard,
                    capacity: e.capacity,
                    silent: e.at.elapsed(),
                }
            }
            None => Status {
                live: grace,
                silent: since.elapsed(),
                ..Default::default()
            },
        }
    }
}

/// Follows the Raft state and resets liveness on leadership changes.
/// Returns when the Raft shuts down.
pub(crate) async fn watch_leadership(
    raft: MetaRaft,
    liveness: std::sync::Arc<Liveness>,
    worker: sluice_util::worker::WorkerHandle,
) {
    let mut metrics = raft.metrics();
    loop {
        let leader = metrics.borrow_and_update().state == ServerState::Leader;
        liveness.set_leader(leader);
        worker.ran();
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_period_then_heartbeats() {
        let l = Liveness::new(Duration::from_secs(3600));
        assert_eq!(l.status(1), Status::default(), "not leader: nobody live");
        l.set_leader(true);
        let s = l.status(1);
        assert!(s.live, "registered nodes are live right after election");
        assert!(!s.heard, "grace is not a heartbeat");
        l.beat(1);
        let s = l.status(1);
        assert!(s.live && s.heard && s.last_heartbeat_ms > 0);
        assert!(s.silent < Duration::from_secs(60), "{:?}", s.silent);
        // A node never heard is silent since the election.
        std::thread::sleep(Duration::from_millis(20));
        assert!(l.status(2).silent >= Duration::from_millis(20));
        l.set_leader(false);
        assert_eq!(l.status(1), Status::default());

        let short = Liveness::new(Duration::ZERO);
        short.set_leader(true);
        assert!(
            !short.status(2).live,
            "past the grace window, no heartbeat: not live"
        );
    }

    #[test]
    fn heartbeats_carry_capacity_and_registration_keeps_it() {
        let l = Liveness::new(Duration::from_secs(3600));
        l.set_leader(true);
        let cap = Capacity {
            writable: true,
            free_bytes: 7 << 30,
            used_bytes: 3 << 20,
        };
        l.beat_with(4, cap);
        assert_eq!(l.status(4).capacity, cap);
        l.beat(4);
        assert_eq!(l.status(4).capacity, cap, "a registration keeps capacity");
        let full = Capacity {
            writable: false,
            free_bytes: 1 << 20,
            used_bytes: 9 << 30,
        };
        l.beat_with(4, full);
        assert_eq!(l.status(4).capacity, full);
        assert_eq!(l.status(5).capacity, Capacity::default());
    }
}
