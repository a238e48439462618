//! The upgrade test of the workspace's test command: the previous release
//! ([`PREVIOUS_RELEASE`], built from this repository's history at
//! [`PREVIOUS_COMMIT`]) runs the chaos cluster (3 meta nodes, 6
//! datanodes, 2 gateways, mTLS, HTTPS) under the chaos workload, then
//! * `rolling-upgrade`: every process is restarted on this build, one at a
//!   time (meta followers, the meta leader, datanodes, gateways); a command
//!   of the new cluster version is refused until `sluice admin version
//!   finalize`, and accepted after it;
//! * `upgrade-rollback`: the meta nodes, three datanodes and a gateway are
//!   upgraded, then rolled back to the previous release before finalizing.
//!
//! Each run's checker reads back every acknowledged object byte for byte.
//! Needs root and the chaos tools, like the short run (chaos/tests/short_run.rs),
//! and the repository's history (a full clone): the previous release is
//! built once into `target/previous-release/` and kept.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
/// The release this build upgrades from (CHANGELOG.md).
const PREVIOUS_RELEASE: &str = "v0.1.0";
/// Its commit (the tag may not travel with a clone; the commit does).
const PREVIOUS_COMMIT: &str = "2594d6d8a1f11f6177b7f9e59b12ac1caeae8cdf";

/// Builds the previous release's `sluice` (debug, its own target dir under
/// this build's) unless it is there already; its path.
fn previous_release_bin(target: &Path) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let root = target.join("previous-release").join(&PREVIOUS_COMMIT[..12]);
    let bin = root.join("target/debug/sluice");
    if bin.exists() {
        return bin;
    }
    let src = root.join("src");
    if !src.join("Cargo.toml").exists() {
        let known = Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["cat-file", "-e", &format!("{PREVIOUS_COMMIT}^{{commit}}")])
            .status()
            .expect("running git");
        assert!(
            known.success(),
            "the previous release {PREVIOUS_RELEASE} ({PREVIOUS_COMMIT}) is not in this \
             repository's history: the upgrade test needs a full clone"
        );
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(&src).unwrap();
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "git -C '{}' archive {PREVIOUS_COMMIT} | tar -x -C '{}'",
                repo.display(),
                src.display()
            ))
            .status()
            .expect("running git archive");
        assert!(status.success(), "git archive of {PREVIOUS_COMMIT} failed");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!(
        "building the previous release {PREVIOUS_RELEASE} into {}",
        root.display()
    );
    let status = Command::new(cargo)
        .args(["build", "--locked", "-p", "sluice", "--bin", "sluice"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .status()
        .expect("running cargo build");
    assert!(status.success(), "building {PREVIOUS_RELEASE} failed");
    assert!(bin.exists(), "no {} after the build", bin.display());
    bin
}

/// One chaos run of `kind` from the previous release to this build; panics
/// unless it passed with every acknowledged operation read back.
fn run(kind: &str, seed: u64, duration: &str, old: &Path, new: &Path, chaos: &Path) {
    let common::ChaosRun { out, line, summary } = common::run_chaos(
        chaos,
        "sluice-upgrade-ci",
        seed,
        [
            "--faults",
            kind,
            "--duration",
            duration,
            "--clients",
            "4",
            "--settle-timeout",
            "4m",
            "--log-filter",
            "info",
        ]
        .map(std::ffi::OsString::from)
        .into_iter()
        .chain([
            "--sluice-bin".into(),
            new.as_os_str().to_owned(),
            "--old-sluice-bin".into(),
            old.as_os_str().to_owned(),
        ]),
    );
    let events = summary["events"].as_array().unwrap();
    let ok = line.contains("PASS")
        && line.contains(" 0 violations")
        && events.len() == 1
        && events.iter().all(|e| e["error"].is_null());
    if !ok {
        let kept = out.keep();
        panic!(
            "{kind}: {line}\nevents: {}\nkept {}",
            serde_json::to_string_pretty(events).unwrap(),
            kept.display()
        );
    }
    assert_eq!(events[0]["fault"]["kind"], kind);
    let acknowledged = summary["check"]["acknowledged"].as_u64().unwrap();
    assert!(
        acknowledged >= 100,
        "{kind}: only {acknowledged} acknowledged operations checked"
    );
    eprintln!("{kind}: {line} ({acknowledged} acknowledged operations read back)");
}

#[test]
fn upgrade_from_the_previous_release_and_roll_back_lose_nothing() {
    if let Err(why) = common::have_everything(&["git", "tar"]) {
        eprintln!("skipping the upgrade test: {why}");
        return;
    }
    let chaos = PathBuf::from(env!("CARGO_BIN_EXE_sluice-chaos"));
    let new = chaos.with_file_name("sluice");
    assert!(
        new.exists(),
        "no sluice binary beside {} (cargo build -p sluice)",
        chaos.display()
    );
    let target = chaos
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_owned();
    let old = previous_release_bin(&target);
    // One run after the other: each is a whole cluster.
    run("rolling-upgrade", 1, "150s", &old, &new, &chaos);
    run("upgrade-rollback", 2, "120s", &old, &new, &chaos);
}
