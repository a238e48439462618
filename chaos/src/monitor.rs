//! Memory sampling: every process's RSS once a second against its bound,
//! baseline (RSS when the cluster first became ready) + the role's
//! configured budgets + [`crate::cluster::RSS_SLACK_BYTES`] (the memory
//! formula, docs/design/memory.md#memory-formula).
//!
//! The orchestrator publishes the current pid of each process (they change
//! on restarts) in a [`Pids`] table; the sampler reads `/proc/<pid>/status`.
//! Memory is one [`Sample`] peak per process (a bounded table: 11 entries).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::cluster::{Role, rss_bytes};

/// Current pid, role and bound of each process, by name.
pub type Pids = Arc<Mutex<BTreeMap<String, (Role, Option<u32>, u64)>>>;

/// Peak of one process.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Highest RSS seen, bytes.
    pub peak_bytes: u64,
    /// Its bound, bytes.
    pub bound_bytes: u64,
    /// Samples over the bound.
    pub over_bound: u64,
    /// Samples taken.
    pub samples: u64,
}

/// Peaks by process name.
pub type Peaks = Arc<Mutex<BTreeMap<String, (Role, Sample)>>>;

/// Samples every second until the returned handle is aborted.
pub fn spawn(pids: Pids, peaks: Peaks) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let current: Vec<(String, Role, Option<u32>, u64)> = pids
                .lock()
                .expect("pids")
                .iter()
                .map(|(n, (r, p, b))| (n.clone(), *r, *p, *b))
                .collect();
            let mut peaks = peaks.lock().expect("peaks");
            for (name, role, pid, bound) in current {
                let Some(rss) = pid.and_then(rss_bytes) else {
                    continue;
                };
                let entry = peaks
                    .entry(name)
                    .or_insert_with(|| (role, Sample::default()));
                let s = &mut entry.1;
                s.samples += 1;
                s.bound_bytes = bound;
                s.peak_bytes = s.peak_bytes.max(rss);
                if rss > bound {
                    s.over_bound += 1;
                }
            }
        }
    })
}
