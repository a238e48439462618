//! The heal's progress as seen through `/metrics`, and when it is done.
//!
//! Pure functions of the per-second [`HealSample`]s, so that the
//! done-criterion is unit tested. Definitions:
//!
//! * **done**: the healed-blob counter (`sluice_heal_healed_blobs_total`,
//!   summed over labels) has the same value in the last `settle_samples`
//!   samples, the degraded gauge (`sluice_heal_degraded_blobs`, summed) is
//!   0 in the last sample, and the wiped datanode holds 1/N of the shards
//!   of all N datanodes (`sluice_datanode_shards_stored`) within
//!   `share_tolerance` of 1/N (relative: 0.05 = ±5 % of 1/6).
//! * **heal end**: the first sample from which both heal counters
//!   (`sluice_heal_bytes_total`, `sluice_heal_healed_blobs_total`) keep
//!   their final values; **heal duration**: its time since the wiped node
//!   was started again (sample times are measured from then).

use serde::Serialize;

/// Gateway counter: shard bytes written by heal.
pub const HEAL_BYTES_TOTAL: &str = "sluice_heal_bytes_total";
/// Gateway counter: blobs healed.
pub const HEAL_HEALED_BLOBS_TOTAL: &str = "sluice_heal_healed_blobs_total";
/// Gateway gauge: committed blobs with missing shards.
pub const HEAL_DEGRADED_BLOBS: &str = "sluice_heal_degraded_blobs";
/// Gateway gauge: blobs queued for rebuild.
pub const HEAL_QUEUE_BLOBS: &str = "sluice_heal_queue_blobs";
/// Datanode gauge: committed shards stored.
pub const DATANODE_SHARDS_STORED: &str = "sluice_datanode_shards_stored";

/// One poll of the cluster during the heal.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HealSample {
    /// Seconds since the wiped node was started again (0: just before it was killed).
    pub elapsed_s: f64,
    /// [`HEAL_BYTES_TOTAL`]; `None` when not scraped or not exported.
    pub heal_bytes: Option<f64>,
    /// [`HEAL_HEALED_BLOBS_TOTAL`].
    pub healed_blobs: Option<f64>,
    /// [`HEAL_DEGRADED_BLOBS`].
    pub degraded_blobs: Option<f64>,
    /// [`HEAL_QUEUE_BLOBS`].
    pub queue_blobs: Option<f64>,
    /// [`DATANODE_SHARDS_STORED`] of dn1..dnN, in order.
    pub shards: Vec<Option<f64>>,
    /// RSS of every process (cluster order), MiB.
    pub rss_mib: Vec<Option<f64>>,
}

/// Thresholds of the done-criterion.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DoneRule {
    /// Samples (one a second) over which the healed-blob counter must not move.
    pub settle_samples: usize,
    /// Allowed relative deviation of the wiped node's shard share from 1/N.
    pub share_tolerance: f64,
    /// Index of the wiped datanode in [`HealSample::shards`].
    pub wiped: usize,
}

/// Whether the heal is done, and if not, why not.
#[derive(Debug, Clone, PartialEq)]
pub enum HealState {
    /// Every condition holds.
    Done,
    /// What is still missing.
    Waiting(String),
}

/// The wiped node's share of all shards, relative to the even share 1/N:
/// 1.0 = exactly even. `None` without every node's shard count or with none.
pub fn relative_share(shards: &[Option<f64>], wiped: usize) -> Option<f64> {
    let counts: Option<Vec<f64>> = shards.iter().copied().collect();
    let counts = counts?;
    let total: f64 = counts.iter().sum();
    let mine = *counts.get(wiped)?;
    (total > 0.0).then(|| mine / total * counts.len() as f64)
}

/// The done-criterion over the samples so far (see the module docs).
pub fn heal_state(samples: &[HealSample], rule: &DoneRule) -> HealState {
    let Some(last) = samples.last() else {
        return HealState::Waiting("no samples yet".to_owned());
    };
    match last.degraded_blobs {
        None => return HealState::Waiting(format!("no {HEAL_DEGRADED_BLOBS} gauge")),
        Some(d) if d > 0.0 => return HealState::Waiting(format!("{d} degraded blobs")),
        Some(_) => {}
    }
    let settle = rule.settle_samples.max(1);
    if samples.len() < settle {
        return HealState::Waiting(format!("fewer than {settle} samples"));
    }
    let window = &samples[samples.len() - settle..];
    let Some(healed) = last.healed_blobs else {
        return HealState::Waiting(format!("no {HEAL_HEALED_BLOBS_TOTAL} counter"));
    };
    if window.iter().any(|s| s.healed_blobs != Some(healed)) {
        return HealState::Waiting(format!(
            "healed-blob counter moved within the last {settle} samples (now {healed})"
        ));
    }
    match relative_share(&last.shards, rule.wiped) {
        None => HealState::Waiting("shard counts of the datanodes unknown".to_owned()),
        Some(share) if (share - 1.0).abs() > rule.share_tolerance => HealState::Waiting(format!(
            "wiped node holds {:.1} % of the even share",
            share * 100.0
        )),
        Some(_) => HealState::Done,
    }
}

/// What the heal did, from its samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HealFigures {
    /// Shard bytes healed (counter at the end minus at the start).
    pub healed_bytes: f64,
    /// Blobs healed (likewise).
    pub healed_blobs: f64,
    /// From the restart of the wiped node to the heal end, seconds; `None`
    /// when the counters never moved.
    pub heal_s: Option<f64>,
    /// `healed_bytes` in GiB per minute of `heal_s`.
    pub gib_per_min: Option<f64>,
    /// Largest degraded-blob gauge seen.
    pub peak_degraded_blobs: Option<f64>,
    /// Largest heal queue seen.
    pub peak_queue_blobs: Option<f64>,
    /// Shards on the wiped node in the last sample.
    pub wiped_shards_end: Option<f64>,
    /// Its share relative to 1/N in the last sample.
    pub wiped_share_end: Option<f64>,
}

fn delta(samples: &[HealSample], get: impl Fn(&HealSample) -> Option<f64>) -> f64 {
    let first = samples.iter().find_map(&get).unwrap_or(0.0);
    let last = samples.iter().rev().find_map(&get).unwrap_or(first);
    (last - first).max(0.0)
}

/// Index of the first sample from which `get` keeps its final value.
fn settled_from(samples: &[HealSample], get: impl Fn(&HealSample) -> Option<f64>) -> Option<usize> {
    let last = samples.iter().rev().find_map(&get)?;
    let changed = samples
        .iter()
        .rposition(|s| get(s).is_some_and(|v| v != last))?;
    Some(changed + 1)
}

/// Computes [`HealFigures`] (see the module docs for the heal end).
pub fn heal_figures(samples: &[HealSample], wiped: usize) -> HealFigures {
    let healed_bytes = delta(samples, |s| s.heal_bytes);
    let healed_blobs = delta(samples, |s| s.healed_blobs);
    let end = [
        settled_from(samples, |s| s.heal_bytes),
        settled_from(samples, |s| s.healed_blobs),
    ]
    .into_iter()
    .flatten()
    .max();
    let heal_s = end.and_then(|i| samples.get(i)).map(|s| s.elapsed_s);
    let gib_per_min = heal_s
        .filter(|s| *s > 0.0)
        .map(|s| healed_bytes / f64::from(1u32 << 30) / (s / 60.0));
    let peak =
        |get: fn(&HealSample) -> Option<f64>| samples.iter().filter_map(get).reduce(f64::max);
    let last = samples.last();
    HealFigures {
        healed_bytes,
        healed_blobs,
        heal_s,
        gib_per_min,
        peak_degraded_blobs: peak(|s| s.degraded_blobs),
        peak_queue_blobs: peak(|s| s.queue_blobs),
        wiped_shards_end: last.and_then(|s| s.shards.get(wiped).copied().flatten()),
        wiped_share_end: last.and_then(|s| relative_share(&s.shards, wiped)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: DoneRule = DoneRule {
        settle_samples: 3,
        share_tolerance: 0.05,
        wiped: 0,
    };

    fn sample(t: f64, bytes: f64, healed: f64, degraded: f64, dn1: f64) -> HealSample {
        HealSample {
            elapsed_s: t,
            heal_bytes: Some(bytes),
            healed_blobs: Some(healed),
            degraded_blobs: Some(degraded),
            queue_blobs: Some(degraded),
            shards: vec![
                Some(dn1),
                Some(100.0),
                Some(100.0),
                Some(100.0),
                Some(100.0),
                Some(100.0),
            ],
            rss_mib: vec![],
        }
    }

    #[test]
    fn the_share_is_relative_to_an_even_split() {
        let even = vec![Some(10.0); 6];
        assert_eq!(relative_share(&even, 0), Some(1.0));
        let mut low = even.clone();
        low[0] = Some(0.0);
        assert_eq!(relative_share(&low, 0), Some(0.0));
        low[3] = None;
        assert_eq!(relative_share(&low, 0), None);
        assert_eq!(relative_share(&[Some(0.0); 6], 0), None);
        assert_eq!(relative_share(&even, 9), None);
    }

    #[test]
    fn done_only_when_stable_not_degraded_and_rebalanced() {
        // Before the audit: nothing degraded yet, counter still, but dn1 empty.
        let early: Vec<HealSample> = (0..5)
            .map(|t| sample(t as f64, 0.0, 0.0, 0.0, 0.0))
            .collect();
        assert!(
            matches!(heal_state(&early, &RULE), HealState::Waiting(w) if w.contains("even share"))
        );

        let mut run = early;
        // The audit found 100 degraded blobs; heal is under way.
        run.push(sample(5.0, 0.0, 0.0, 100.0, 0.0));
        assert!(
            matches!(heal_state(&run, &RULE), HealState::Waiting(w) if w.contains("100 degraded"))
        );
        run.push(sample(6.0, 50.0, 50.0, 50.0, 50.0));
        run.push(sample(7.0, 99.0, 99.0, 0.0, 99.0));
        // Degraded 0 but the counter moved within the last 3 samples.
        assert!(matches!(heal_state(&run, &RULE), HealState::Waiting(w) if w.contains("moved")));
        run.push(sample(8.0, 100.0, 100.0, 0.0, 100.0));
        run.push(sample(9.0, 100.0, 100.0, 0.0, 100.0));
        assert!(matches!(heal_state(&run, &RULE), HealState::Waiting(_)));
        run.push(sample(10.0, 100.0, 100.0, 0.0, 100.0));
        assert_eq!(heal_state(&run, &RULE), HealState::Done);

        // 94 of an even 100 is outside 5 %; 96 is inside.
        let mut short = run.clone();
        for s in short.iter_mut().rev().take(3) {
            s.shards[0] = Some(94.0);
        }
        assert!(matches!(heal_state(&short, &RULE), HealState::Waiting(_)));
        for s in short.iter_mut().rev().take(3) {
            s.shards[0] = Some(96.0);
        }
        assert_eq!(heal_state(&short, &RULE), HealState::Done);

        // A binary without heal metrics never reads as done.
        let mut bare = run.clone();
        for s in &mut bare {
            s.degraded_blobs = None;
        }
        assert!(matches!(heal_state(&bare, &RULE), HealState::Waiting(w) if w.contains("gauge")));
        let mut no_shards = run;
        no_shards.last_mut().expect("last").shards[4] = None;
        assert!(
            matches!(heal_state(&no_shards, &RULE), HealState::Waiting(w) if w.contains("unknown"))
        );
        assert!(matches!(heal_state(&[], &RULE), HealState::Waiting(_)));
    }

    #[test]
    fn figures_measure_from_the_restart_to_the_last_change() {
        let mib = f64::from(1u32 << 20);
        let samples = vec![
            // Counters carried over from before the wipe do not count.
            sample(0.0, 8.0 * mib, 2.0, 0.0, 100.0),
            sample(1.0, 8.0 * mib, 2.0, 40.0, 0.0),
            sample(2.0, 520.0 * mib, 20.0, 22.0, 18.0),
            sample(30.0, 1032.0 * mib, 42.0, 0.0, 40.0),
            sample(31.0, 1032.0 * mib, 42.0, 0.0, 40.0),
            sample(32.0, 1032.0 * mib, 42.0, 0.0, 40.0),
        ];
        let f = heal_figures(&samples, 0);
        assert_eq!(f.healed_bytes, 1024.0 * mib);
        assert_eq!(f.healed_blobs, 40.0);
        assert_eq!(f.heal_s, Some(30.0));
        // 1 GiB in half a minute.
        assert_eq!(f.gib_per_min, Some(2.0));
        assert_eq!(f.peak_degraded_blobs, Some(40.0));
        assert_eq!(f.wiped_shards_end, Some(40.0));
        let share = f.wiped_share_end.expect("share");
        assert!((share - 40.0 / 540.0 * 6.0).abs() < 1e-9);

        // Nothing healed: no duration, no rate.
        let idle = vec![
            sample(0.0, 0.0, 0.0, 0.0, 0.0),
            sample(1.0, 0.0, 0.0, 0.0, 0.0),
        ];
        let f = heal_figures(&idle, 0);
        assert_eq!((f.heal_s, f.gib_per_min, f.healed_blobs), (None, None, 0.0));
    }
}
