//! Latency percentiles and throughput arithmetic.
//!
//! Latencies are recorded in microseconds into an HDR histogram with three
//! significant digits (relative error <= 0.1%), bounded at one hour;
//! larger values are clamped to the bound rather than dropped.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Bytes in one MiB.
pub const MIB: f64 = 1024.0 * 1024.0;

/// Largest latency the histogram tracks exactly, in microseconds (1 hour).
const MAX_TRACKED_MICROS: u64 = 3_600_000_000;

/// A latency histogram (microsecond resolution, 3 significant digits).
#[derive(Debug, Clone)]
pub struct LatencyStats {
    histogram: Histogram<u64>,
}

/// Percentiles of a [`LatencyStats`], in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Recorded samples.
    pub count: u64,
    /// Mean, ms.
    pub mean_ms: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest sample, ms.
    pub max_ms: f64,
}

impl Default for LatencyStats {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyStats {
    /// An empty histogram.
    pub fn new() -> Self {
        let histogram = Histogram::new_with_bounds(1, MAX_TRACKED_MICROS, 3)
            .expect("constant bounds 1..=1h with 3 significant digits are valid");
        Self { histogram }
    }

    /// Records one latency (clamped to [1 us, 1 h]).
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.histogram
            .saturating_record(micros.clamp(1, MAX_TRACKED_MICROS));
    }

    /// Adds the samples of `other` (e.g. one histogram per worker).
    pub fn merge(&mut self, other: &LatencyStats) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.histogram.add(&other.histogram);
    }

    /// Number of recorded samples.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The value at quantile `q` (0.0..=1.0), ms; 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.histogram.is_empty() {
            return 0.0;
        }
        micros_to_ms(self.histogram.value_at_quantile(q))
    }

    /// Count, mean, p50/p90/p99 and max, ms; all zero when empty.
    pub fn summary(&self) -> LatencySummary {
        if self.histogram.is_empty() {
            return LatencySummary {
                count: 0,
                mean_ms: 0.0,
                p50_ms: 0.0,
                p90_ms: 0.0,
                p99_ms: 0.0,
                max_ms: 0.0,
            };
        }
        LatencySummary {
            count: self.histogram.len(),
            mean_ms: self.histogram.mean() / 1000.0,
            p50_ms: self.quantile_ms(0.50),
            p90_ms: self.quantile_ms(0.90),
            p99_ms: self.quantile_ms(0.99),
            max_ms: micros_to_ms(self.histogram.max()),
        }
    }
}

fn micros_to_ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

/// Throughput in MiB/s of `bytes` moved in `elapsed`; 0 for an empty interval.
pub fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        bytes as f64 / MIB / secs
    }
}

/// Rate per second of `count` events in `elapsed`; 0 for an empty interval.
pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        count as f64 / secs
    }
}

/// Trailing moving average: element `i` is the mean of `values[i+1-window..=i]`
/// (fewer at the start). A `window` of 0 is treated as 1.
pub fn moving_average(values: &[f64], window: usize) -> Vec<f64> {
    let window = window.max(1);
    let mut sum = 0.0;
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        sum += v;
        if i >= window {
            sum -= values[i - window];
        }
        out.push(sum / (i + 1).min(window) as f64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64) -> bool {
        // HDR with 3 significant digits: relative error <= 0.1%.
        (actual - expected).abs() <= expected * 0.001 + 1e-9
    }

    #[test]
    fn percentiles_of_uniform_1_to_1000_ms() {
        let mut stats = LatencyStats::new();
        // Recorded in reverse to show order does not matter.
        for ms in (1..=1000u64).rev() {
            stats.record(Duration::from_millis(ms));
        }
        let s = stats.summary();
        assert_eq!(s.count, 1000);
        assert!(close(s.p50_ms, 500.0), "p50 {}", s.p50_ms);
        assert!(close(s.p90_ms, 900.0), "p90 {}", s.p90_ms);
        assert!(close(s.p99_ms, 990.0), "p99 {}", s.p99_ms);
        assert!(close(s.max_ms, 1000.0), "max {}", s.max_ms);
        assert!(close(s.mean_ms, 500.5), "mean {}", s.mean_ms);
    }

    #[test]
    fn a_single_outlier_is_the_max_but_not_p99() {
        let mut stats = LatencyStats::new();
        for _ in 0..999 {
            stats.record(Duration::from_millis(20));
        }
        stats.record(Duration::from_secs(30));
        let s = stats.summary();
        assert!(close(s.p50_ms, 20.0));
        assert!(close(s.p99_ms, 20.0));
        assert!(close(s.max_ms, 30_000.0), "max {}", s.max_ms);
    }

    #[test]
    fn empty_and_clamped_values() {
        let mut stats = LatencyStats::new();
        assert_eq!(stats.summary().count, 0);
        assert_eq!(stats.summary().p99_ms, 0.0);
        stats.record(Duration::ZERO);
        stats.record(Duration::from_secs(10 * 3600));
        let s = stats.summary();
        assert_eq!(s.count, 2);
        assert!(
            close(s.max_ms, 3_600_000.0),
            "clamped to 1 h, got {}",
            s.max_ms
        );
        assert!(s.p50_ms <= 0.002, "zero clamps to 1 us, got {}", s.p50_ms);
    }

    #[test]
    fn moving_average_trails() {
        let v = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(moving_average(&v, 3), vec![10.0, 15.0, 20.0, 30.0, 40.0]);
        assert_eq!(moving_average(&v, 1), v.to_vec());
        assert_eq!(moving_average(&v, 0), v.to_vec());
        assert_eq!(moving_average(&v, 10), vec![10.0, 15.0, 20.0, 25.0, 30.0]);
        assert!(moving_average(&[], 3).is_empty());
    }

    #[test]
    fn throughput_arithmetic() {
        assert_eq!(mib_per_s(10 * 1024 * 1024, Duration::from_secs(2)), 5.0);
        assert_eq!(mib_per_s(123, Duration::ZERO), 0.0);
        assert_eq!(per_second(30, Duration::from_millis(1500)), 20.0);
        assert_eq!(per_second(30, Duration::ZERO), 0.0);
    }
}
