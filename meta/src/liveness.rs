//! Datanode liveness, kept in the leader's memory (never in the Raft log).
//!
//! A datanode is live when its last heartbeat is within the window. For
//! one window after this node became leader it has not yet heard from
//! anyone, so every registered datanode counts as live (the previous
//! leader's view is not replicated). Entries exist only for registered
//! datanodes, so the map is bounded by the registry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// Datanode id -> (last heartbeat, its wall clock time in ms).
    seen: HashMap<u64, (Instant, i64)>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
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

    /// Records a heartbeat of a registered datanode.
    pub(crate) fn beat(&self, id: u64) {
        self.lock().seen.insert(id, (Instant::now(), now_ms()));
    }

    /// `(live, last_heartbeat_ms)` of datanode `id`.
    pub(crate) fn status(&self, id: u64) -> (bool, i64) {
        let s = self.lock();
        let grace = s.leader_since.is_some_and(|t| t.elapsed() < self.window);
        match s.seen.get(&id) {
            Some((at, ms)) => (grace || at.elapsed() <= self.window, *ms),
            None => (grace, 0),
        }
    }
}

/// Follows the Raft state and resets liveness on leadership changes.
/// Returns when the Raft shuts down.
pub(crate) async fn watch_leadership(raft: MetaRaft, liveness: std::sync::Arc<Liveness>) {
    let mut metrics = raft.metrics();
    loop {
        let leader = metrics.borrow_and_update().state == ServerState::Leader;
        liveness.set_leader(leader);
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
        assert_eq!(l.status(1), (false, 0), "not leader: nobody live");
        l.set_leader(true);
        assert!(
            l.status(1).0,
            "registered nodes are live right after election"
        );
        l.beat(1);
        let (live, ms) = l.status(1);
        assert!(live && ms > 0);
        l.set_leader(false);
        assert_eq!(l.status(1), (false, 0));

        let short = Liveness::new(Duration::ZERO);
        short.set_leader(true);
        assert!(
            !short.status(2).0,
            "past the grace window, no heartbeat: not live"
        );
    }
}
