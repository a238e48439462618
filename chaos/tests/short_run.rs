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
    let common::ChaosRun {
        out: _out,
        line,
        summary,
    } = common::run_chaos(
        &chaos,
        "sluice-chaos-ci",
        1,
        [
            "--faults",
            "kill-meta-leader,kill-datanode,partition-host,pause-gateway,wipe-disk,bitrot,pause-datanodes-past-down-after",
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
            "--sluice-bin",
        ]
        .map(std::ffi::OsString::from)
        .into_iter()
        .chain([sluice.into_os_string()]),
    );
    assert!(
        line.contains("PASS") && line.contains(" 0 violations"),
        "{line}"
    );
    // Every scheduled kind was injected and the workload did real work.
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
