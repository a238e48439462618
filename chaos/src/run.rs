//! `sluice-chaos run`: for each seed, a fresh cluster, the workload, the
//! seeded faults, healing, settling, the read-back and the checks; then a
//! table over all seeds.
//!
//! One seed's run, in order:
//! 1. [`Cluster::setup`] and [`Cluster::start_all`] (baseline RSS taken).
//! 2. The workload starts in the client namespace (`sluice-chaos workload`,
//!    its history streamed to `history.jsonl`); the RSS sampler starts.
//! 3. Faults are injected and healed at their scheduled times; a process
//!    that exits on its own is a crash (reported, then restarted).
//! 4. At `--duration` the workload is stopped (SIGTERM), every fault is
//!    healed (they all end before the cool-down anyway), and the cluster
//!    must settle: every process ready, every datanode up and no degraded
//!    blob (`sluice admin status --json`, three polls in a row), within
//!    `--settle-timeout`.
//! 5. `sluice-chaos read-back` reads every key ever written and lists the
//!    bucket; the checker ([`crate::checker`]) checks the whole history.
//! 6. Liveness: each leader fault's recovery (first acknowledged write that
//!    started after the fault, minus the fault's start) within the
//!    election timeout + 5 s when no other fault overlapped it; no request
//!    ended by the client's attempt timeout; every sample of every process's
//!    RSS within its bound ([`crate::monitor`]).
//! 7. Replicas: the meta voters' state digests (`sluice admin meta digest`)
//!    are polled until all report one applied index; different digests at
//!    an equal index fail the run, and so does never lining up
//!    ([`checker::digest`]).
//!
//! A failing seed prints the seed, the fault schedule and the checker's
//! minimal evidence, and keeps every process's log in its run directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::process::Command;
use tokio::time::Instant;

use crate::checker::digest::{self, DigestVerdict};
use crate::checker::{self, CheckOptions, CheckReport};
use crate::cluster::{
    ACCESS_KEY, Cluster, ClusterOptions, DELETE_DELAY, ELECTION_TIMEOUT, RECLAIM_INTERVAL,
    RSS_SLACK_BYTES, Role, SECRET_KEY,
};
use crate::faults::{self, Event};
use crate::history::{self, Entry, Op, Outcome, ReadResult};
use crate::monitor::{self, Peaks, Pids, Sample};
use crate::schedule::{self, Fault, FaultKind, ScheduleOptions};

/// `sluice-chaos run` options.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Fault kinds: `all` or a comma list (see `sluice-chaos faults`).
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// First seed (printed; `--seed N --seeds 1` replays one run). Random
    /// when not given.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Number of seeds run one after another (seed, seed+1, ...).
    #[arg(long, default_value_t = 1)]
    pub seeds: u64,
    /// Workload time per seed; faults start after 15 s and end 30 s
    /// before it.
    #[arg(long, default_value = "5m")]
    pub duration: humantime::Duration,
    /// Concurrent S3 clients.
    #[arg(long, default_value_t = 6)]
    pub clients: u32,
    /// Shortest fault.
    #[arg(long, default_value = "5s")]
    pub fault_min: humantime::Duration,
    /// Longest fault.
    #[arg(long, default_value = "25s")]
    pub fault_max: humantime::Duration,
    /// Mean time between fault starts.
    #[arg(long, default_value = "12s")]
    pub fault_gap: humantime::Duration,
    /// The `sluice` binary (default: `sluice` beside this binary).
    #[arg(long)]
    pub sluice_bin: Option<PathBuf>,
    /// The previous release's `sluice` binary: the cluster starts on it.
    /// Needed by the upgrade kinds (`rolling-upgrade`, `upgrade-rollback`).
    #[arg(long)]
    pub old_sluice_bin: Option<PathBuf>,
    /// Output directory (one `seed-N/` per seed: logs, history, schedule,
    /// events, check report, summary).
    #[arg(long, default_value = "/tmp/sluice-chaos")]
    pub out: PathBuf,
    /// RUST_LOG of the cluster's processes.
    #[arg(long, default_value = "info")]
    pub log_filter: String,
    /// Longest wait for the cluster to settle after the faults.
    #[arg(long, default_value = "5m")]
    pub settle_timeout: humantime::Duration,
    /// S3 client attempt timeout (a request still open then is a hung
    /// request: a liveness violation).
    #[arg(long, default_value = "60s")]
    pub attempt_timeout: humantime::Duration,
}

/// What one seed's run found.
#[derive(Debug, Clone, Serialize)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// Its directory.
    pub dir: PathBuf,
    /// The schedule.
    pub schedule: Vec<Fault>,
    /// The faults as they happened.
    pub events: Vec<Event>,
    /// The checker's report.
    pub check: CheckReport,
    /// Where the read-back phase started (CLOCK_MONOTONIC µs): give it to
    /// `sluice-chaos check --final-phase-start-us` to check the history
    /// again.
    pub final_phase_start_us: Option<u64>,
    /// Leader recovery times, ms, per leader fault (with whether another
    /// fault overlapped it).
    pub leader_recovery_ms: Vec<(u64, bool)>,
    /// Requests the client gave up on (its attempt timeout).
    pub hung_requests: usize,
    /// Processes that exited on their own.
    pub crashes: Vec<String>,
    /// Seconds to settle after the workload stopped (`None`: did not).
    pub settle_secs: Option<f64>,
    /// RSS peaks.
    pub peaks: BTreeMap<String, (Role, Sample)>,
    /// Overwrite storms: the meta leader's pending deletions, highest
    /// sample while a storm ran, its bound, and the count once the load
    /// stopped and the reclaimer had its delay and passes.
    pub pending_deletions: Option<PendingDeletions>,
    /// Slow readers across an overwrite: one line each.
    pub slow_reads: Vec<String>,
    /// The meta voters' state digests after the load: the last poll's
    /// verdict (`Agree` passes).
    pub state_digest: DigestVerdict,
    /// Every liveness and safety failure, one line each.
    pub failures: Vec<String>,
}

/// What the reclaimer did under overwrite storms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PendingDeletions {
    /// Highest `sluice_meta_pending_deletions` of the leader sampled while
    /// a storm ran.
    pub peak: u64,
    /// Samples taken while storms ran.
    pub samples: usize,
    /// The most writes, deletes and aborts the history shows within any
    /// `delete_delay` + 2 reclaim intervals: no more can be pending if the
    /// reclaimer keeps up.
    pub bound: u64,
    /// The last sample after the load stopped.
    pub after: Option<u64>,
    /// Seconds from the load's stop to that sample.
    pub after_secs: f64,
}

impl SeedResult {
    /// No failure of any kind.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs every seed; prints and writes the table.
///
/// # Errors
/// Setup failures (not check failures: those are in the results).
pub async fn run(args: RunArgs) -> anyhow::Result<Vec<SeedResult>> {
    crate::cluster::preflight()?;
    let kinds = schedule::parse_kinds(&args.faults).map_err(anyhow::Error::msg)?;
    if kinds.contains(&FaultKind::ClockJump) {
        crate::cluster::faketime_lib()?;
    }
    if kinds.contains(&FaultKind::DiskReadErrors) {
        crate::cluster::sh(&["sh", "-c", "command -v strace"])
            .context("disk-read-errors needs strace on PATH")?;
    }
    match &args.old_sluice_bin {
        Some(b) if !b.exists() => bail!("no previous-release binary at {}", b.display()),
        None if kinds.iter().any(|k| k.upgrade()) => {
            bail!("the upgrade kinds need --old-sluice-bin (the previous release's sluice)")
        }
        _ => {}
    }
    let chaos_bin = std::env::current_exe()?;
    let sluice_bin = match &args.sluice_bin {
        Some(b) => b.clone(),
        None => chaos_bin.with_file_name("sluice"),
    };
    if !sluice_bin.exists() {
        bail!(
            "no sluice binary at {} (give --sluice-bin)",
            sluice_bin.display()
        );
    }
    let first = args
        .seed
        .unwrap_or_else(|| u64::from(rand::random::<u32>()));
    println!(
        "sluice-chaos: seeds {first}..{} (replay one with --seed N --seeds 1), faults {}",
        first + args.seeds - 1,
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
    );
    std::fs::create_dir_all(&args.out)?;
    let mut results = Vec::new();
    for seed in first..first + args.seeds {
        let r = run_seed(&args, &kinds, seed, &sluice_bin, &chaos_bin).await?;
        println!("{}", seed_line(&r));
        if !r.passed() {
            println!("{}", failure_report(&r));
        }
        results.push(r);
    }
    let table = table(&results, &kinds);
    println!("{table}");
    std::fs::write(args.out.join("summary.md"), &table)?;
    Ok(results)
}

/// The schedule shape `run` uses.
pub fn schedule_options(args: &RunArgs, kinds: &[FaultKind]) -> ScheduleOptions {
    ScheduleOptions {
        kinds: kinds.to_vec(),
        duration: *args.duration,
        warmup: Duration::from_secs(15),
        cooldown: Duration::from_secs(30),
        fault_duration: (*args.fault_min, *args.fault_max),
        mean_gap: *args.fault_gap,
    }
}

/// One action of the timeline: inject or heal fault `i`.
enum Action {
    Inject(usize),
    Heal(usize),
}

async fn run_seed(
    args: &RunArgs,
    kinds: &[FaultKind],
    seed: u64,
    sluice_bin: &Path,
    chaos_bin: &Path,
) -> anyhow::Result<SeedResult> {
    let dir = args.out.join(format!("seed-{seed}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let plan = schedule::schedule(seed, &schedule_options(args, kinds));
    std::fs::write(
        dir.join("schedule.json"),
        serde_json::to_string_pretty(&plan)?,
    )?;
    println!(
        "seed {seed}: {} faults scheduled ({}):",
        plan.len(),
        dir.join("schedule.json").display()
    );
    for f in &plan {
        println!("  {}", f.describe());
    }
    let mut cluster = Cluster::setup(ClusterOptions {
        bin: sluice_bin.to_owned(),
        old_bin: args.old_sluice_bin.clone(),
        chaos_bin: chaos_bin.to_owned(),
        dir: dir.clone(),
        prefix: format!("sc{}", std::process::id() % 100_000),
        log_filter: args.log_filter.clone(),
    })?;
    // SIGINT/SIGTERM stop the run, but everything it made is removed.
    let interrupted = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    };
    let result = tokio::select! {
        r = drive(args, kinds, seed, &dir, &plan, &mut cluster) => r,
        _ = interrupted => Err(anyhow::anyhow!("interrupted; logs kept in {}", dir.join("logs").display())),
    };
    cluster.cleanup().await;
    cluster.remove_images();
    let result = result?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&result)?,
    )?;
    Ok(result)
}

fn publish_pids(cluster: &Cluster, pids: &Pids) {
    let mut p = pids.lock().expect("pids");
    for n in &cluster.nodes {
        let bound =
            n.baseline_rss.unwrap_or(0) + crate::cluster::budget_bytes(n.role) + RSS_SLACK_BYTES;
        p.insert(n.name.clone(), (n.role, n.pid, bound));
    }
}

fn connection_args(cluster: &Cluster, args: &RunArgs) -> Vec<String> {
    vec![
        "--endpoints".into(),
        cluster.s3_endpoints().join(","),
        "--ca-bundle".into(),
        cluster.s3_ca.display().to_string(),
        "--access-key".into(),
        ACCESS_KEY.into(),
        "--secret-key".into(),
        SECRET_KEY.into(),
        "--bucket".into(),
        "chaos".into(),
        "--attempt-timeout".into(),
        args.attempt_timeout.to_string(),
    ]
}

async fn drive(
    args: &RunArgs,
    kinds: &[FaultKind],
    seed: u64,
    dir: &Path,
    plan: &[Fault],
    cluster: &mut Cluster,
) -> anyhow::Result<SeedResult> {
    cluster.start_all().await?;
    let pids: Pids = Arc::new(Mutex::new(BTreeMap::new()));
    let peaks: Peaks = Arc::new(Mutex::new(BTreeMap::new()));
    publish_pids(cluster, &pids);
    let sampler = monitor::spawn(pids.clone(), peaks.clone());

    let history_path = dir.join("history.jsonl");
    let client_ns = cluster.hosts["client"].ns.clone();
    let mut workload = Command::new("ip")
        .args(["netns", "exec", &client_ns])
        .arg(&cluster.opts.chaos_bin)
        .arg("workload")
        .args(connection_args(cluster, args))
        .arg("--clients")
        .arg(args.clients.to_string())
        .arg("--seed")
        .arg(seed.to_string())
        .arg("--history")
        .arg(&history_path)
        .args(phase_args(plan))
        .env("RUST_LOG", "warn,sluice_chaos::workload=info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("workload.out"))?)
        .stderr(std::fs::File::create(
            dir.join("logs").join("workload.log"),
        )?)
        .kill_on_drop(true)
        .spawn()
        .context("starting the workload")?;
    let t0 = Instant::now();

    let mut timeline: Vec<(Duration, Action)> = Vec::new();
    for (i, f) in plan.iter().enumerate() {
        timeline.push((f.at, Action::Inject(i)));
        timeline.push((f.end(), Action::Heal(i)));
    }
    timeline.sort_by_key(|(t, a)| (*t, matches!(a, Action::Inject(_))));
    let mut events: Vec<Option<Event>> = vec![None; plan.len()];
    let mut crashes = Vec::new();
    let mut next = 0;
    let end = t0 + *args.duration;
    let storms: Vec<(Duration, Duration)> = plan
        .iter()
        .filter(|f| f.kind == FaultKind::OverwriteStorm)
        .map(|f| (f.at, f.end()))
        .collect();
    let mut pending: Option<PendingDeletions> =
        (!storms.is_empty()).then(PendingDeletions::default);
    let mut next_pending_sample = t0;
    loop {
        let now = Instant::now();
        if let Some(p) = pending.as_mut()
            && now >= next_pending_sample
            && storms.iter().any(|(a, b)| now >= t0 + *a && now < t0 + *b)
        {
            next_pending_sample = now + PENDING_SAMPLE_EVERY;
            if let Some(v) = pending_deletions(cluster).await {
                p.peak = p.peak.max(v);
                p.samples += 1;
            }
            continue;
        }
        if next < timeline.len() && now >= t0 + timeline[next].0 {
            match timeline[next].1 {
                Action::Inject(i) => {
                    events[i] = Some(faults::inject_event(cluster, &plan[i]).await)
                }
                Action::Heal(i) => {
                    if let Some(ev) = events[i].as_mut() {
                        faults::heal_event(cluster, ev).await;
                    }
                }
            }
            publish_pids(cluster, &pids);
            next += 1;
            continue;
        }
        if now >= end && next >= timeline.len() {
            break;
        }
        for (name, status) in cluster.exited() {
            tracing::error!(%name, %status, "process exited on its own: restarting it");
            crashes.push(format!(
                "{name} exited on its own ({status}); log {}",
                cluster.node(&name).log.display()
            ));
            cluster.start(&name, None)?;
            publish_pids(cluster, &pids);
        }
        if let Ok(Some(status)) = workload.try_wait() {
            bail!(
                "the workload exited early ({status}): {}",
                crate::cluster::tail(&dir.join("logs").join("workload.log"), 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Stop the workload: in-flight requests end within the attempt timeout.
    if let Some(pid) = workload.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let stopped_at = Instant::now();
    let grace = *args.attempt_timeout + Duration::from_secs(30);
    match tokio::time::timeout(grace, workload.wait()).await {
        Ok(status) => tracing::info!(status = ?status, "workload stopped"),
        Err(_) => {
            let _ = workload.start_kill();
            bail!("the workload did not stop within {grace:?}");
        }
    }
    let events: Vec<Event> = events.into_iter().flatten().collect();
    std::fs::write(
        dir.join("events.json"),
        serde_json::to_string_pretty(&events)?,
    )?;

    let settle_secs = settle(cluster, *args.settle_timeout, &mut crashes).await;
    publish_pids(cluster, &pids);

    // The read-back phase.
    let out = Command::new("ip")
        .args(["netns", "exec", &client_ns])
        .arg(&cluster.opts.chaos_bin)
        .arg("read-back")
        .args(connection_args(cluster, args))
        .arg("--history")
        .arg(&history_path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(
            dir.join("logs").join("read-back.log"),
        )?)
        .output()
        .await
        .context("running the read-back")?;
    if !out.status.success() {
        bail!(
            "the read-back failed ({}): {}",
            out.status,
            crate::cluster::tail(&dir.join("logs").join("read-back.log"), 20)
        );
    }
    let final_phase_start_us = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("final_phase_start_us")?.as_u64());
    sampler.abort();
    if let Some(p) = pending.as_mut() {
        drain_pending(cluster, p, stopped_at).await;
    }
    let state_digest = voter_digests(cluster).await;
    tracing::info!(?state_digest, "meta voters' state digests");
    for (name, status) in cluster.exited() {
        crashes.push(format!(
            "{name} exited on its own ({status}); log {}",
            cluster.node(&name).log.display()
        ));
    }

    let history = history::read_jsonl(&history_path)?;
    let check = checker::check(
        &history,
        &CheckOptions {
            final_phase_start_us,
            ..CheckOptions::default()
        },
    );
    std::fs::write(dir.join("check.txt"), check.render())?;
    let leader_recovery_ms = leader_recovery(&events, &history);
    // Past the failure budget only safety is promised: a request that hung
    // while such a fault lasted is not a liveness failure.
    let beyond_budget: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e.fault.kind.beyond_budget())
        .map(|e| (e.start_us, if e.end_us == 0 { u64::MAX } else { e.end_us }))
        .collect();
    let hung_requests = history
        .iter()
        .filter(|e| matches!(&e.outcome, Outcome::Indeterminate { reason } if reason == "attempt timeout"))
        .filter(|e| !beyond_budget.iter().any(|(a, b)| e.start_us < *b && e.end_us > *a))
        .count();
    if let Some(p) = pending.as_mut() {
        p.bound = release_bound(&history, DELETE_DELAY + 2 * RECLAIM_INTERVAL);
    }
    let slow_reads = slow_reads(&history, final_phase_start_us);
    let peaks = peaks.lock().expect("peaks").clone();

    let mut failures = Vec::new();
    for v in &check.violations {
        failures.push(format!("{:?} on {:?}: {}", v.kind, v.key, v.message));
    }
    for k in &check.inconclusive_keys {
        failures.push(format!(
            "linearizability search budget exceeded on key {k} (inconclusive)"
        ));
    }
    failures.extend(crashes.iter().cloned());
    if settle_secs.is_none() {
        failures.push(format!(
            "did not settle (all up, nothing degraded) within {}",
            args.settle_timeout
        ));
    }
    let recovery_bound = ELECTION_TIMEOUT.1 + Duration::from_secs(5);
    for (ms, overlapped) in &leader_recovery_ms {
        if *ms == u64::MAX {
            failures.push("no acknowledged write after a leader fault".into());
        } else if !overlapped && *ms > recovery_bound.as_millis() as u64 {
            failures.push(format!(
                "writes resumed {ms} ms after a leader fault (bound {} ms)",
                recovery_bound.as_millis()
            ));
        }
    }
    failures.extend(read_back_gaps(&history, final_phase_start_us));
    match &state_digest {
        DigestVerdict::Agree { .. } => {}
        DigestVerdict::Differ {
            applied_index,
            digests,
        } => failures.push(format!(
            "meta voters diverged: different state digests at applied index {applied_index}: {digests:?}"
        )),
        DigestVerdict::NotAligned { indexes } => failures.push(format!(
            "state digests not compared: the meta voters never reported one applied index in {DIGEST_POLLS} polls (last: {indexes:?})"
        )),
        DigestVerdict::Unreadable(e) => {
            failures.push(format!("state digests not compared: {e}"))
        }
        DigestVerdict::Skipped(why) => tracing::info!(%why, "state digests not compared"),
    }
    if hung_requests > 0 {
        failures.push(format!(
            "{hung_requests} requests hit the client's {} attempt timeout",
            args.attempt_timeout
        ));
    }
    for (name, (_, s)) in &peaks {
        if s.over_bound > 0 {
            failures.push(format!(
                "{name}: RSS {} MiB over its bound {} MiB in {} of {} samples",
                s.peak_bytes >> 20,
                s.bound_bytes >> 20,
                s.over_bound,
                s.samples
            ));
        }
    }
    if let Some(p) = &pending {
        if p.samples == 0 {
            failures.push("overwrite storm: no pending-deletion sample was taken".into());
        } else if p.peak > p.bound {
            failures.push(format!(
                "overwrite storm: {} pending deletions, above the {} writes and deletes of any {}",
                p.peak,
                p.bound,
                humantime::format_duration(DELETE_DELAY + 2 * RECLAIM_INTERVAL)
            ));
        }
        match p.after {
            Some(0) => {}
            Some(n) => failures.push(format!(
                "overwrite storm: {n} deletions still pending {:.0} s after the load stopped",
                p.after_secs
            )),
            None => {
                failures.push("overwrite storm: pending deletions unreadable after the load".into())
            }
        }
    }
    for line in &slow_reads {
        if !line.starts_with("ok") {
            failures.push(format!("slow reader across an overwrite: {line}"));
        }
    }
    if kinds.contains(&FaultKind::SlowReaderOverwrite) && slow_reads.is_empty() {
        failures.push("slow reader across an overwrite: no slow GET in the history".into());
    }
    for k in kinds {
        if !plan.iter().any(|f| f.kind == *k) {
            failures.push(format!(
                "fault kind {k} was not scheduled (no room in --duration)"
            ));
        }
    }
    // A fault that was not applied (or not healed) makes the run test less
    // than it claims: that fails it too.
    for e in &events {
        if let Some(err) = &e.error {
            failures.push(format!(
                "fault not applied or not healed: {} -> {err}",
                e.fault.describe()
            ));
        }
    }
    Ok(SeedResult {
        seed,
        dir: dir.to_owned(),
        schedule: plan.to_vec(),
        events,
        check,
        final_phase_start_us,
        leader_recovery_ms,
        hung_requests,
        crashes,
        settle_secs,
        peaks,
        pending_deletions: pending,
        slow_reads,
        state_digest,
        failures,
    })
}

/// Polls of the voters' digests before giving up on their lining up.
const DIGEST_POLLS: usize = 30;
/// Pause between two polls.
const DIGEST_POLL_EVERY: Duration = Duration::from_millis(500);

/// Polls `sluice admin meta digest` until every voter reports the same
/// applied index (or a divergence shows), at most [`DIGEST_POLLS`] times;
/// the last verdict. Each poll asks the voters concurrently, so they line
/// up as soon as no entry is appended for the poll's few milliseconds.
async fn voter_digests(cluster: &Cluster) -> DigestVerdict {
    let old: Vec<String> = cluster
        .names(Role::Meta)
        .into_iter()
        .filter(|m| cluster.node(m).bin != cluster.opts.bin)
        .collect();
    if !old.is_empty() {
        return DigestVerdict::Skipped(format!(
            "{} run the previous release, which has no state digest",
            old.join(", ")
        ));
    }
    let mut verdict = DigestVerdict::Unreadable("not polled".into());
    for _ in 0..DIGEST_POLLS {
        verdict = match cluster.admin(&["meta", "digest", "--json"]).await {
            Ok(out) => match serde_json::from_str::<serde_json::Value>(&out)
                .map_err(|e| e.to_string())
                .and_then(|j| digest::parse(&j))
            {
                Ok(voters) => digest::compare(&voters),
                Err(e) => DigestVerdict::Unreadable(format!("meta digest --json: {e}")),
            },
            Err(e) => DigestVerdict::Unreadable(e.to_string()),
        };
        if matches!(
            verdict,
            DigestVerdict::Agree { .. } | DigestVerdict::Differ { .. }
        ) {
            return verdict;
        }
        tokio::time::sleep(DIGEST_POLL_EVERY).await;
    }
    verdict
}

/// How often the leader's pending deletions are sampled during a storm.
const PENDING_SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The workload's phase options for the overwrite storms and slow readers
/// of `plan`.
fn phase_args(plan: &[Fault]) -> Vec<String> {
    let mut out = Vec::new();
    for f in plan {
        match f.kind {
            FaultKind::OverwriteStorm => {
                out.push("--storm".into());
                out.push(format!(
                    "{}ms/{}ms",
                    f.at.as_millis(),
                    f.duration.as_millis()
                ));
            }
            FaultKind::SlowReaderOverwrite => {
                out.push("--slow-read".into());
                out.push(format!("{}ms", f.at.as_millis()));
            }
            _ => {}
        }
    }
    if plan
        .iter()
        .any(|f| f.kind == FaultKind::SlowReaderOverwrite)
    {
        out.push("--slow-read-for".into());
        out.push(humantime::format_duration(schedule::slow_read_duration()).to_string());
    }
    out
}

/// The meta leader's `sluice_meta_pending_deletions`.
async fn pending_deletions(cluster: &Cluster) -> Option<u64> {
    let leader = cluster.leader().await?;
    let text = faults::metrics_text(cluster, &leader).await?;
    Some(faults::metric_sum(&text, "sluice_meta_pending_deletions") as u64)
}

/// After the load: waits until the reclaimer had `delete_delay` and three
/// passes since the load stopped, then samples until nothing is pending
/// (or two more intervals passed).
async fn drain_pending(cluster: &Cluster, p: &mut PendingDeletions, stopped_at: Instant) {
    let due = stopped_at + DELETE_DELAY + 3 * RECLAIM_INTERVAL;
    tokio::time::sleep_until(due).await;
    let deadline = due + 2 * RECLAIM_INTERVAL;
    loop {
        if let Some(v) = pending_deletions(cluster).await {
            p.after = Some(v);
            p.after_secs = stopped_at.elapsed().as_secs_f64();
            if v == 0 {
                return;
            }
        }
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(RECLAIM_INTERVAL / 2).await;
    }
}

/// The most writes, deletes, parts and aborts (any outcome: each may
/// release a blob) that ended within any `window`.
pub fn release_bound(history: &[Entry], window: Duration) -> u64 {
    let mut ends: Vec<u64> = history
        .iter()
        .filter(|e| {
            matches!(
                e.op,
                Op::Put { .. } | Op::Delete { .. } | Op::UploadPart { .. } | Op::Abort { .. }
            )
        })
        .map(|e| e.end_us)
        .collect();
    ends.sort_unstable();
    let w = window.as_micros() as u64;
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..ends.len() {
        while ends[hi] - ends[lo] > w {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best as u64
}

/// Each slow GET (`slow/` keys, before the read-back): `ok ...` when it
/// returned the original value whole while an overwrite or delete of its
/// key ran, else what went wrong.
pub fn slow_reads(history: &[Entry], final_phase_start_us: Option<u64>) -> Vec<String> {
    let before_final = |e: &Entry| final_phase_start_us.is_none_or(|s| e.start_us < s);
    let mut out = Vec::new();
    for get in history.iter().filter(|e| {
        matches!(&e.op, Op::Get { key, range: None } if key.starts_with("slow/")) && before_final(e)
    }) {
        let Op::Get { key, .. } = &get.op else {
            continue;
        };
        let original = history.iter().find(|e| {
            matches!(&e.op, Op::Put { key: k, .. } if k == key) && e.outcome == Outcome::Ok
        });
        let Some(Entry {
            op: Op::Put { value, .. },
            ..
        }) = original
        else {
            continue;
        };
        let overlapped = history.iter().any(|e| {
            let writes_key = matches!(&e.op, Op::Put { key: k, value: v, .. } if k == key && v.id != value.id)
                || matches!(&e.op, Op::Delete { key: k } if k == key);
            writes_key && e.start_us > get.start_us && e.start_us < get.end_us
        });
        let secs = (get.end_us - get.start_us) as f64 / 1e6;
        let line = match &get.outcome {
            Outcome::Read {
                result: ReadResult::Found { value_id, len, .. },
            } if *value_id == Some(value.id) && *len == value.size() => {
                if overlapped {
                    format!(
                        "ok {key}: {len} bytes of the original in {secs:.0} s across its overwrite and delete"
                    )
                } else {
                    format!(
                        "not exercised {key}: read whole in {secs:.0} s but no overwrite or delete started during it"
                    )
                }
            }
            other => format!(
                "{key}: the GET of the original {} bytes ended after {secs:.0} s with {other:?}",
                value.size()
            ),
        };
        out.push(line);
    }
    out
}

/// Waits until every process is ready, every datanode is up and nothing
/// is degraded; seconds it took, or `None` at the timeout.
async fn settle(
    cluster: &mut Cluster,
    timeout: Duration,
    crashes: &mut Vec<String>,
) -> Option<f64> {
    let started = Instant::now();
    let deadline = started + timeout;
    for (name, status) in cluster.exited() {
        crashes.push(format!("{name} exited on its own ({status})"));
        let _ = cluster.start(&name, None);
    }
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    if let Err(e) = cluster.wait_ready(&names, timeout).await {
        tracing::error!(error = %e, "not every process became ready");
        return None;
    }
    let mut calm = 0;
    while Instant::now() < deadline {
        if let Ok(s) = cluster.status().await {
            let up = s["datanodes"]
                .as_array()
                .is_some_and(|d| d.len() == 6 && d.iter().all(|n| n["state"] == "up"));
            let degraded = s["degraded_blobs"].as_u64().unwrap_or(u64::MAX);
            let heals = s["heals_in_progress"].as_u64().unwrap_or(u64::MAX);
            tracing::info!(up, degraded, heals, "settling");
            // Not `heals_in_progress`: it counts heal intents, which stay
            // until their gateway's write epoch closes (epoch_rotation),
            // long after the heal itself committed.
            if up && degraded == 0 {
                calm += 1;
                if calm >= 3 {
                    return Some(started.elapsed().as_secs_f64());
                }
            } else {
                calm = 0;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    None
}

/// For each leader fault: ms from its start to the end of the first
/// acknowledged write or delete that started after it, and whether another
/// fault was active then.
/// What the read-back left unchecked: no start time, a written key with no
/// final read, no final listing. Each is a failure: the checker's final
/// checks would pass vacuously.
pub fn read_back_gaps(history: &[Entry], final_phase_start_us: Option<u64>) -> Vec<String> {
    let Some(start) = final_phase_start_us else {
        return vec!["the read-back printed no final_phase_start_us".into()];
    };
    let mut written: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    let mut read: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    let mut listed = false;
    for e in history {
        match (&e.op, &e.outcome) {
            (Op::Put { key, .. }, o) if !matches!(o, Outcome::Failed { .. }) => {
                written.insert(key);
            }
            (Op::Get { key, range: None }, Outcome::Read { .. }) if e.start_us >= start => {
                read.insert(key);
            }
            (Op::List { .. }, Outcome::Listed { .. }) if e.start_us >= start => listed = true,
            _ => {}
        }
    }
    let mut gaps: Vec<String> = written
        .difference(&read)
        .map(|k| format!("key {k} was written but never read back"))
        .collect();
    if !listed {
        gaps.push("the read-back never listed the bucket".into());
    }
    gaps
}

/// `u64::MAX` ms: no acknowledged write after the fault at all.
pub fn leader_recovery(events: &[Event], history: &[Entry]) -> Vec<(u64, bool)> {
    let mut out = Vec::new();
    for e in events
        .iter()
        .filter(|e| e.fault.kind.hits_leader() && e.error.is_none())
    {
        let first = history
            .iter()
            .filter(|h| {
                matches!(h.op, Op::Put { .. } | Op::Delete { .. })
                    && h.outcome == Outcome::Ok
                    && h.start_us >= e.start_us
            })
            .map(|h| h.end_us)
            .min();
        let (ms, window_end) = match first {
            Some(end) => ((end - e.start_us) / 1000, end),
            None => (u64::MAX, u64::MAX),
        };
        // Only faults that can hold writes up on their own: another meta
        // or gateway fault, a host cut off or lossy, a gateway cut from a
        // host (one datanode out leaves the write quorum reachable).
        let overlapped = events.iter().any(|o| {
            o.fault.n != e.fault.n
                && o.error.is_none()
                && blocks_writes(o.fault.kind)
                && o.start_us < window_end
                && (o.end_us == 0 || o.end_us > e.start_us)
        });
        out.push((ms, overlapped));
    }
    out
}

fn blocks_writes(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::KillMetaLeader
            | FaultKind::KillMetaFollower
            | FaultKind::PauseMetaLeader
            | FaultKind::IsolateMetaLeader
            | FaultKind::KillGateway
            | FaultKind::PauseGateway
            | FaultKind::PartitionHost
            | FaultKind::PacketLoss
            | FaultKind::PartitionGatewayDatanodes
            | FaultKind::ClockJump
            | FaultKind::PauseDatanodesPastDownAfter
            | FaultKind::PartitionDatanodesFromMeta
    )
}

fn seed_line(r: &SeedResult) -> String {
    format!(
        "seed {}: {} — {} ops ({} acknowledged, {} indeterminate), {} faults, {} violations, settle {}, dir {}",
        r.seed,
        if r.passed() { "PASS" } else { "FAIL" },
        r.check.operations,
        r.check.acknowledged,
        r.check.indeterminate,
        r.events.len(),
        r.failures.len(),
        r.settle_secs.map_or("-".into(), |s| format!("{s:.0}s")),
        r.dir.display()
    )
}

/// The seed, the schedule, the failures and the checker's evidence.
pub fn failure_report(r: &SeedResult) -> String {
    let mut s = format!(
        "FAILED seed {} (replay: sluice-chaos run --seed {} --seeds 1 ...)\nschedule:\n",
        r.seed, r.seed
    );
    for e in &r.events {
        s.push_str(&format!(
            "  {} -> {}{}\n",
            e.fault.describe(),
            e.hit,
            e.error
                .as_ref()
                .map_or(String::new(), |x| format!(" [{x}]"))
        ));
    }
    s.push_str("failures:\n");
    for f in &r.failures {
        s.push_str(&format!("  {f}\n"));
    }
    s.push_str(&r.check.render());
    s.push_str(&format!(
        "\nlogs of every process: {}\n",
        r.dir.join("logs").display()
    ));
    s
}

fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(sorted[i])
}

/// The markdown table of chaos/README.md.
pub fn table(results: &[SeedResult], kinds: &[FaultKind]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "Seeds {}; {} passed.\n\n",
        results
            .iter()
            .map(|r| r.seed.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        results.iter().filter(|r| r.passed()).count()
    ));
    s.push_str("| fault kind | injected | not applied |\n|---|---:|---:|\n");
    for k in kinds {
        let n = results
            .iter()
            .flat_map(|r| &r.events)
            .filter(|e| e.fault.kind == *k)
            .count();
        let err = results
            .iter()
            .flat_map(|r| &r.events)
            .filter(|e| e.fault.kind == *k && e.error.is_some())
            .count();
        s.push_str(&format!("| {k} | {n} | {err} |\n"));
    }
    let ops: usize = results.iter().map(|r| r.check.operations).sum();
    let ack: usize = results.iter().map(|r| r.check.acknowledged).sum();
    let ind: usize = results.iter().map(|r| r.check.indeterminate).sum();
    let viol: usize = results.iter().map(|r| r.failures.len()).sum();
    let mut rec: Vec<u64> = results
        .iter()
        .flat_map(|r| r.leader_recovery_ms.iter().map(|(ms, _)| *ms))
        .filter(|ms| *ms != u64::MAX)
        .collect();
    rec.sort();
    s.push_str(&format!(
        "\n| operations | acknowledged, checked | indeterminate | violations | leader recovery p50 / max |\n|---:|---:|---:|---:|---|\n| {ops} | {ack} | {ind} | {viol} | {} / {} ms ({} faults) |\n",
        percentile(&rec, 0.5).map_or("-".into(), |v| v.to_string()),
        rec.last().map_or("-".into(), |v| v.to_string()),
        rec.len()
    ));
    for r in results {
        if let Some(p) = &r.pending_deletions {
            s.push_str(&format!(
                "\nseed {}: pending deletions under the overwrite storm: peak {} (bound {}, {} samples), {} {:.0} s after the load stopped\n",
                r.seed,
                p.peak,
                p.bound,
                p.samples,
                p.after.map_or("-".into(), |v| v.to_string()),
                p.after_secs
            ));
        }
        for line in &r.slow_reads {
            s.push_str(&format!("\nseed {}: slow reader: {line}\n", r.seed));
        }
    }
    s.push_str("\n| role | peak RSS (MiB) | bound (MiB) |\n|---|---:|---:|\n");
    for role in [Role::Meta, Role::Datanode, Role::Gateway] {
        let mut peak = 0;
        let mut bound = 0;
        for r in results {
            for (_, (rl, smp)) in r.peaks.iter() {
                if *rl == role && smp.peak_bytes >= peak {
                    peak = smp.peak_bytes;
                    bound = smp.bound_bytes;
                }
            }
        }
        s.push_str(&format!(
            "| {} | {} | {} |\n",
            role.as_str(),
            peak >> 20,
            bound >> 20
        ));
    }
    s
}
