//! Verdicts: the RSS figures of each process and the checks of each shape.
//!
//! Pure functions of the samples, the baselines and the budgets, so that
//! every rule is unit tested. Definitions (all RSS values are `VmRSS`):
//!
//! * **baseline**: RSS right after the cluster became writable.
//! * **bound**: baseline + the role's configured budgets (meta: sled
//!   cache; datanode: write budget; gateway: buffer + read budgets) + for
//!   the gateway the memory formula's terms for the shape's clients
//!   (`gateway_client_bytes` in `super::cluster`) + `--rss-slack`.
//!   **peak**: the largest sample of the shape.
//! * **warm-up end** (seed shape): the last sample at or before the
//!   warm-up (reported as the RSS at minute 5 of the default run).
//! * **warm-up level** (seed shape): the largest sample of the second half
//!   of the warm-up. RSS under this load oscillates by tens of MiB as
//!   stripes come and go, so one sample is no reference: comparing peak
//!   with peak measures creep (a leak raises every later peak), not where
//!   in a swing the warm-up happened to end. The first half is left out
//!   so that a start-up spike cannot hide growth.
//! * **growth** = max of the samples after the warm-up − warm-up level;
//!   **allowed** = max(`--rss-growth-pct` % of the warm-up level,
//!   `--rss-growth-floor`). Growth must be strictly below allowed.

use std::fmt::Write as _;

use serde::Serialize;

use super::options::RssRules;
use crate::samples::{Sample, bytes_to_mib};

/// One named pass/fail check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// Short name, e.g. `rss_bound`.
    pub name: &'static str,
    /// Whether it held.
    pub pass: bool,
    /// Whether the shape's verdict depends on it (false: reported only).
    pub required: bool,
    /// The figures behind it.
    pub detail: String,
}

impl Check {
    /// A required check.
    pub fn required(name: &'static str, pass: bool, detail: String) -> Self {
        Self {
            name,
            pass,
            required: true,
            detail,
        }
    }
}

/// What the verdict needs to know about one process.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessInput {
    /// Column name in `samples.csv`.
    pub name: String,
    /// OS process id.
    pub pid: u32,
    /// RSS right after startup, bytes.
    pub baseline_bytes: Option<u64>,
    /// Sum of the role's budgets, bytes.
    pub budget_bytes: u64,
    /// What the memory formula adds for the shape's load (the gateway's
    /// connections and admitted uploads; 0 for other roles), bytes.
    pub client_terms_bytes: u64,
}

/// RSS figures of one process over one shape, MiB.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessFigures {
    /// Process name.
    pub name: String,
    /// OS process id.
    pub pid: u32,
    /// RSS right after startup.
    pub baseline_mib: Option<f64>,
    /// The role's budgets.
    pub budget_mib: f64,
    /// The formula's terms for the shape's clients.
    pub client_terms_mib: f64,
    /// baseline + budgets + client terms + slack.
    pub bound_mib: Option<f64>,
    /// RSS at the end of the warm-up (seed shape).
    pub warmup_end_mib: Option<f64>,
    /// Largest RSS in the second half of the warm-up (seed shape).
    pub warmup_level_mib: Option<f64>,
    /// Largest RSS after the warm-up (seed shape).
    pub max_after_warmup_mib: Option<f64>,
    /// `max_after_warmup_mib - warmup_level_mib`.
    pub growth_mib: Option<f64>,
    /// Growth allowed.
    pub allowed_growth_mib: Option<f64>,
    /// Last sample.
    pub end_mib: Option<f64>,
    /// Largest sample.
    pub peak_mib: Option<f64>,
    /// Readable earlier but not at the last sample.
    pub exited: bool,
}

/// Computes every process's figures from the samples of a shape. `names`
/// are the CSV's process columns; `warmup_s` is set for the seed shape.
pub fn process_figures(
    inputs: &[ProcessInput],
    names: &[String],
    samples: &[Sample],
    warmup_s: Option<f64>,
    rules: &RssRules,
) -> Vec<ProcessFigures> {
    inputs
        .iter()
        .map(|input| {
            let column = names.iter().position(|n| *n == input.name);
            let series: Vec<(f64, f64)> = column
                .map(|c| {
                    samples
                        .iter()
                        .filter_map(|s| {
                            s.rss_mib
                                .get(c)
                                .copied()
                                .flatten()
                                .map(|v| (s.elapsed_s, v))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let last_readable = column
                .and_then(|c| {
                    samples
                        .last()
                        .and_then(|s| s.rss_mib.get(c).copied().flatten())
                })
                .is_some();
            let baseline_mib = input.baseline_bytes.map(bytes_to_mib);
            let budget_mib = bytes_to_mib(input.budget_bytes);
            let client_terms_mib = bytes_to_mib(input.client_terms_bytes);
            let max = |it: &mut dyn Iterator<Item = f64>| it.reduce(f64::max);
            let (warmup_end_mib, warmup_level_mib, max_after_warmup_mib) = match warmup_s {
                Some(w) => {
                    let end = series
                        .iter()
                        .rev()
                        .find(|(t, _)| *t <= w)
                        .or(series.first())
                        .map(|(_, v)| *v);
                    let level = max(&mut series
                        .iter()
                        .filter(|(t, _)| *t > w / 2.0 && *t <= w)
                        .map(|(_, v)| *v))
                    .or(end);
                    let after = max(&mut series.iter().filter(|(t, _)| *t > w).map(|(_, v)| *v));
                    (end, level, after)
                }
                None => (None, None, None),
            };
            let growth_mib = warmup_level_mib
                .zip(max_after_warmup_mib)
                .map(|(a, b)| b - a);
            let allowed_growth_mib = warmup_level_mib
                .map(|w| (w * rules.growth_pct / 100.0).max(bytes_to_mib(rules.growth_floor)));
            ProcessFigures {
                name: input.name.clone(),
                pid: input.pid,
                baseline_mib,
                budget_mib,
                client_terms_mib,
                bound_mib: baseline_mib
                    .map(|b| b + budget_mib + client_terms_mib + bytes_to_mib(rules.slack)),
                warmup_end_mib,
                warmup_level_mib,
                max_after_warmup_mib,
                growth_mib,
                allowed_growth_mib,
                end_mib: series.last().map(|(_, v)| *v),
                peak_mib: max(&mut series.iter().map(|(_, v)| *v)),
                exited: !series.is_empty() && !last_readable,
            }
        })
        .collect()
}

/// Every process grew less than allowed after the warm-up.
pub fn check_growth(figures: &[ProcessFigures]) -> Check {
    let mut bad = Vec::new();
    for f in figures {
        match (f.growth_mib, f.allowed_growth_mib) {
            (Some(g), Some(a)) if g < a => {}
            (Some(g), Some(a)) => bad.push(format!("{} grew {g:.1} MiB >= {a:.1} allowed", f.name)),
            _ => bad.push(format!("{} has no samples after the warm-up", f.name)),
        }
    }
    let worst = figures
        .iter()
        .filter_map(|f| f.growth_mib.map(|g| (g, f)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let detail = if bad.is_empty() {
        worst.map_or_else(
            || "no processes".to_owned(),
            |(g, f)| {
                format!(
                    "largest growth {g:.1} MiB ({}; allowed {:.1})",
                    f.name,
                    f.allowed_growth_mib.unwrap_or(0.0)
                )
            },
        )
    } else {
        bad.join("; ")
    };
    Check::required("rss_growth_after_warmup", bad.is_empty(), detail)
}

/// Every process's peak stayed within its bound (baseline + budgets +
/// client terms + slack).
pub fn check_bound(figures: &[ProcessFigures]) -> Check {
    let mut bad = Vec::new();
    let mut tightest: Option<(f64, &ProcessFigures)> = None;
    for f in figures {
        match (f.peak_mib, f.bound_mib) {
            (Some(p), Some(b)) => {
                if p > b {
                    bad.push(format!("{} peaked at {p:.1} MiB > bound {b:.1}", f.name));
                }
                if tightest.is_none_or(|(r, _)| p / b > r) {
                    tightest = Some((p / b, f));
                }
            }
            (None, _) => bad.push(format!("{} has no RSS samples", f.name)),
            (_, None) => bad.push(format!("{} has no baseline", f.name)),
        }
    }
    let detail = if bad.is_empty() {
        tightest.map_or_else(
            || "no processes".to_owned(),
            |(_, f)| {
                format!(
                    "closest: {} peak {:.1} MiB of bound {:.1}",
                    f.name,
                    f.peak_mib.unwrap_or(0.0),
                    f.bound_mib.unwrap_or(0.0)
                )
            },
        )
    } else {
        bad.join("; ")
    };
    Check::required("rss_within_budget", bad.is_empty(), detail)
}

/// No process exited: neither seen by the sampler nor by the harness
/// (`exited` = names and statuses of processes found dead after the shape).
pub fn check_alive(figures: &[ProcessFigures], exited: &[(String, String)]) -> Check {
    let mut dead: Vec<String> = exited.iter().map(|(n, s)| format!("{n} ({s})")).collect();
    for f in figures.iter().filter(|f| f.exited) {
        if !exited.iter().any(|(n, _)| *n == f.name) {
            dead.push(format!("{} (vanished during the load)", f.name));
        }
    }
    let detail = if dead.is_empty() {
        format!("all {} processes alive", figures.len())
    } else {
        format!("died: {}", dead.join(", "))
    };
    Check::required("no_process_died", dead.is_empty(), detail)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// The per-process RSS table printed under a verdict line.
pub fn render_processes(figures: &[ProcessFigures], with_warmup: bool) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "    {:<8} {:>8} {:>9} {:>9}",
        "RSS MiB", "pid", "baseline", "bound"
    );
    if with_warmup {
        let _ = write!(
            out,
            " {:>9} {:>9} {:>15}",
            "@warm-up", "w-u level", "growth/allowed"
        );
    }
    let _ = writeln!(out, " {:>9} {:>9}", "end", "peak");
    for f in figures {
        let _ = write!(
            out,
            "    {:<8} {:>8} {:>9} {:>9}",
            f.name,
            f.pid,
            opt(f.baseline_mib),
            opt(f.bound_mib)
        );
        if with_warmup {
            let growth = format!("{}/{}", opt(f.growth_mib), opt(f.allowed_growth_mib));
            let _ = write!(
                out,
                " {:>9} {:>9} {:>15}",
                opt(f.warmup_end_mib),
                opt(f.warmup_level_mib),
                growth
            );
        }
        let _ = writeln!(
            out,
            " {:>9} {:>9}{}",
            opt(f.end_mib),
            opt(f.peak_mib),
            if f.exited { "  EXITED" } else { "" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn rules() -> RssRules {
        RssRules {
            growth_pct: 5.0,
            growth_floor: 16 * MIB,
            slack: 0,
        }
    }

    fn sample(t: f64, rss: &[Option<f64>]) -> Sample {
        Sample {
            elapsed_s: t,
            mib_per_s: 1.0,
            ops_done: 0,
            errors: 0,
            rss_mib: rss.to_vec(),
        }
    }

    fn input(name: &str, baseline_mib: u64, budget_mib: u64) -> ProcessInput {
        ProcessInput {
            name: name.into(),
            pid: 1,
            baseline_bytes: Some(baseline_mib * MIB),
            budget_bytes: budget_mib * MIB,
            client_terms_bytes: 0,
        }
    }

    fn names() -> Vec<String> {
        vec!["gateway".into(), "dn1".into()]
    }

    #[test]
    fn growth_is_measured_from_the_warm_up_level() {
        // Warm-up 2.5 s: its second half is t in (1.25, 2.5].
        // gateway: a start-up spike of 900 at t=1 (ignored), level 400, then
        // up to 419 (19 < 20 = 5%).
        // dn1: 101 at t=1.5 and 100 at warm-up end: level 101, then 117
        // (16 >= 16 floor).
        let samples = [
            sample(1.0, &[Some(900.0), Some(50.0)]),
            sample(1.5, &[Some(380.0), Some(101.0)]),
            sample(2.0, &[Some(400.0), Some(100.0)]),
            sample(3.0, &[Some(419.0), Some(117.0)]),
            sample(4.0, &[Some(410.0), Some(101.0)]),
        ];
        let figs = process_figures(
            &[input("gateway", 300, 1024), input("dn1", 40, 64)],
            &names(),
            &samples,
            Some(2.5),
            &rules(),
        );
        let gw = &figs[0];
        assert_eq!(gw.warmup_end_mib, Some(400.0));
        assert_eq!(gw.warmup_level_mib, Some(400.0));
        assert_eq!(gw.max_after_warmup_mib, Some(419.0));
        assert_eq!(gw.allowed_growth_mib, Some(20.0));
        assert_eq!(gw.peak_mib, Some(900.0));
        assert_eq!(gw.end_mib, Some(410.0));
        let dn = &figs[1];
        assert_eq!(dn.warmup_end_mib, Some(100.0));
        assert_eq!(dn.warmup_level_mib, Some(101.0));
        assert_eq!(dn.growth_mib, Some(16.0));
        assert_eq!(dn.allowed_growth_mib, Some(16.0));
        let check = check_growth(&figs);
        assert!(!check.pass);
        assert!(check.detail.contains("dn1 grew 16.0"), "{}", check.detail);
        assert!(!check.detail.contains("gateway"), "{}", check.detail);
    }

    #[test]
    fn growth_needs_samples_after_the_warm_up() {
        let samples = [sample(1.0, &[Some(10.0), Some(10.0)])];
        let figs = process_figures(
            &[input("gateway", 10, 1)],
            &names(),
            &samples,
            Some(5.0),
            &rules(),
        );
        assert_eq!(figs[0].warmup_end_mib, Some(10.0));
        assert!(!check_growth(&figs).pass);
    }

    #[test]
    fn peak_is_bounded_by_baseline_budget_and_slack() {
        let samples = [
            sample(1.0, &[Some(300.0), Some(100.0)]),
            sample(2.0, &[Some(350.0), Some(105.0)]),
        ];
        let inputs = [input("gateway", 100, 250), input("dn1", 40, 64)];
        let figs = process_figures(&inputs, &names(), &samples, None, &rules());
        assert_eq!(figs[0].bound_mib, Some(350.0));
        assert_eq!(figs[1].bound_mib, Some(104.0));
        let check = check_bound(&figs);
        assert!(!check.pass);
        assert!(
            check.detail.contains("dn1 peaked at 105.0"),
            "{}",
            check.detail
        );
        let generous = RssRules {
            slack: MIB,
            ..rules()
        };
        let figs = process_figures(&inputs, &names(), &samples, None, &generous);
        let check = check_bound(&figs);
        assert!(check.pass, "{}", check.detail);
        assert!(check.detail.contains("dn1"), "{}", check.detail);
    }

    #[test]
    fn the_gateway_client_terms_raise_its_bound() {
        // Gateway: baseline 20 + budgets 24 = 44 without the client terms
        // (no slack here); a peak of 47 fails that and passes 44 + 6.
        let samples = [sample(1.0, &[Some(47.0), Some(20.0)])];
        let mut inputs = [input("gateway", 20, 24), input("dn1", 17, 8)];
        let figs = process_figures(&inputs, &names(), &samples, None, &rules());
        assert_eq!(figs[0].bound_mib, Some(44.0));
        assert!(!check_bound(&figs).pass);
        inputs[0].client_terms_bytes = 6 * MIB;
        let figs = process_figures(&inputs, &names(), &samples, None, &rules());
        assert_eq!(figs[0].client_terms_mib, 6.0);
        assert_eq!(figs[0].bound_mib, Some(50.0));
        assert_eq!(figs[1].bound_mib, Some(25.0));
        let check = check_bound(&figs);
        assert!(check.pass, "{}", check.detail);
    }

    #[test]
    fn dead_processes_fail_the_alive_check() {
        let samples = [
            sample(1.0, &[Some(300.0), Some(100.0)]),
            sample(2.0, &[Some(300.0), None]),
        ];
        let inputs = [input("gateway", 100, 250), input("dn1", 40, 64)];
        let figs = process_figures(&inputs, &names(), &samples, None, &rules());
        assert!(figs[1].exited);
        let check = check_alive(&figs, &[]);
        assert!(!check.pass);
        assert!(check.detail.contains("dn1 (vanished"), "{}", check.detail);
        let check = check_alive(&figs, &[("dn1".into(), "signal: 9".into())]);
        assert_eq!(check.detail, "died: dn1 (signal: 9)");
        let alive = process_figures(&inputs, &names(), &samples[..1], None, &rules());
        assert!(check_alive(&alive, &[]).pass);
    }

    #[test]
    fn table_lists_every_process() {
        let samples = [sample(1.0, &[Some(300.0), Some(100.0)])];
        let inputs = [input("gateway", 100, 250), input("dn1", 40, 64)];
        let figs = process_figures(&inputs, &names(), &samples, Some(0.5), &rules());
        let text = render_processes(&figs, true);
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("gateway"));
        assert!(text.contains("350.0"), "{text}");
    }
}
