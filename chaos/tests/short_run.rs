//! The short chaos run of the workspace's test command (CONTRIBUTING.md,
//! "What the test command runs"): one seed, a few fault
//! kinds (a leader kill, a datanode kill, a host partition, a gateway
//! pause, a wiped disk, bitrot, and three datanodes paused past
//! `node_down_after`: past the failure budget, where only safety is
//! checked), about five and a half minutes, against the `sluice`
//! binary of this build. Needs root and the tools of
//! `sluice_chaos::cluster::TOOLS` (ip, iptables, mkfs.xfs, losetup, mount,
//! fallocate, curl): without them it says so and passes without running
//! (`.ci/run` installs them).
//! The long run is `sluice-chaos run --faults all --seeds 10 --duration 5m`
//! (chaos/README.md).

mod common;

use std::path::PathBuf;
use std::process::Command;
#[test]
fn a_short_seeded_run_loses_nothing_and_stays_live() {
    if let Err(why) = common::have_everything(&[]) {
        eprintln!("skipping the chaos short run: {why}");
        return;
    }
    let chaos = PathBuf::from(env!("CARGO_BIN_EXE_sluice-chaos"));
    let sluice = chaos.with_file_name("sluice");
    assert!(
        sluice.exists(),
        "no sluice binary beside {} (cargo build -p sluice)",
        chaos.display()
    );
    let out = tempfile::Builder::new()
        .prefix("sluice-chaos-ci")
        .tempdir_in("/tmp")
        .unwrap();
    let output = Command::new(&chaos)
        .args([
            "run",
            "--faults",
            "kill-meta-leader,kill-datanode,partition-host,pause-gateway,wipe-disk,bitrot,pause-datanodes-past-down-after",
            "--seed",
            "1",
            "--seeds",
            "1",
            "--duration",
            "180s",
            "--clients",
            "4",
            "--fault-min",
            "5s",
            "--fault-max",
            "15s",
            "--fault-gap",
            "12s",
            "--settle-timeout",
            "4m",
            "--log-filter",
            "info",
        ])
        .arg("--sluice-bin")
        .arg(&sluice)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("running sluice-chaos");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        // Keep the run directory (logs of every process) for the CI log.
        let kept = out.keep();
        panic!(
            "chaos run failed ({}); kept {}\n--- stdout\n{stdout}\n--- stderr (tail)\n{}",
            output.status,
            kept.display(),
            common::tail(&stderr, 60)
        );
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with("seed 1: PASS") || l.starts_with("seed 1: FAIL"))
        .unwrap_or_else(|| panic!("no seed line in\n{stdout}"));
    assert!(
        line.contains("PASS") && line.contains(" 0 violations"),
        "{line}"
    );
    // Every scheduled kind was injected and the workload did real work.
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("seed-1/summary.json")).unwrap(),
    )
    .unwrap();
    for e in summary["events"].as_array().unwrap() {
        assert!(e["error"].is_null(), "fault not applied: {e}");
    }
    let kinds: Vec<&str> = summary["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["fault"]["kind"].as_str().unwrap())
        .collect();
    for k in [
        "kill-meta-leader",
        "kill-datanode",
        "partition-host",
        "pause-gateway",
        "wipe-disk",
        "bitrot",
        "pause-datanodes-past-down-after",
    ] {
        assert!(kinds.contains(&k), "{k} not injected: {kinds:?}");
    }
    let acknowledged = summary["check"]["acknowledged"].as_u64().unwrap();
    assert!(
        acknowledged >= 100,
        "only {acknowledged} acknowledged operations checked"
    );
}
