//! End to end: `sluice admin meta` (the built binary) against `sluice dev`
//! (one meta voter): `list` as a table and as JSON, and the refusals a
//! single-voter cluster gives (`remove` of the last voter, `add` of a node
//! that never catches up, which leaves the membership as it was); the
//! voter's state digest; `sluice admin settings show|set`; and `sluice
//! admin version` (show, finalize) on that cluster.

use std::path::Path;
use std::process::{Command, Output};

use sluice_harness::cluster::{reserve_port_range, reserve_ports};
use sluice_harness::dev::{Dev, DevOptions};

fn start_dev(dir: &Path, base: u16) -> Dev {
    let options = DevOptions::new(
        Path::new(env!("CARGO_BIN_EXE_sluice")),
        dir,
        base,
        base + 1,
        ("SLUICEADMINTESTKEY", "admin-test-secret-0123456789abcdef"),
    );
    Dev::start(options).expect("start sluice dev")
}

fn admin(dev: &Dev, args: &[&str]) -> Output {
    admin_area(dev, "meta", args)
}

fn admin_area(dev: &Dev, area: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["admin", area])
        .args(args)
        .args(["--meta", &dev.meta_url()])
        // The admin certificate `sluice dev` made.
        .envs(dev.admin_env())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run sluice admin meta")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "sluice admin meta failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn refused(out: Output, want: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "want a refusal, got success: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains(want),
        "stderr {stderr:?} does not contain {want:?}"
    );
}

#[test]
fn admin_meta_against_sluice_dev() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = reserve_port_range(16).expect("free ports");
    let dev = start_dev(dir.path(), base);
    let meta = dev.meta_url();

    let list: serde_json::Value =
        serde_json::from_str(&ok(admin(&dev, &["list", "--json"]))).expect("json");
    assert_eq!(list["leader_id"], 1, "{list}");
    assert_eq!(list["members"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list["members"][0]["role"], "voter", "{list}");
    assert_eq!(list["members"][0]["addr"], meta.as_str(), "{list}");
    assert!(list["commit_index"].as_u64().unwrap_or(0) >= 1, "{list}");

    let table = ok(admin(&dev, &["list"]));
    assert!(table.contains(&format!("   1  {meta}  leader")), "{table}");

    refused(admin(&dev, &["remove", "1"]), "last voter");
    refused(admin(&dev, &["remove", "9"]), "not a member");
    let nobody = reserve_ports(1).expect("a free port")[0];
    let nobody_addr = format!("http://127.0.0.1:{nobody}");
    refused(
        admin(
            &dev,
            &[
                "add",
                "--id",
                "2",
                "--addr",
                &nobody_addr,
                "--catch-up-timeout",
                "1s",
            ],
        ),
        "did not catch up",
    );
    let list: serde_json::Value =
        serde_json::from_str(&ok(admin(&dev, &["list", "--json"]))).expect("json");
    assert_eq!(
        list["members"].as_array().map(Vec::len),
        Some(1),
        "learner left behind: {list}"
    );

    // One meta node of this binary: it understands replicated format 2
    // and the cluster version is (or, once finalized, becomes) 2.
    let version: serde_json::Value =
        serde_json::from_str(&ok(admin_area(&dev, "version", &["show", "--json"]))).expect("json");
    assert_eq!(version["leader_format"], 2, "{version}");
    assert_eq!(version["nodes"][0]["reachable"], true, "{version}");
    assert_eq!(version["nodes"][0]["replicated_format"], 2, "{version}");
    assert_eq!(
        version["nodes"][0]["binary_version"],
        env!("CARGO_PKG_VERSION"),
        "{version}"
    );
    let table = ok(admin_area(&dev, "version", &[]));
    assert!(
        table.starts_with("cluster version ") && table.contains("  leader's replicated format 2\n"),
        "{table}"
    );
    ok(admin_area(&dev, "version", &["finalize"]));
    let again = ok(admin_area(&dev, "version", &["finalize"]));
    assert!(
        again.starts_with("nothing to finalize: the cluster version is 2\n"),
        "{again}"
    );

    let digest: serde_json::Value =
        serde_json::from_str(&ok(admin(&dev, &["digest", "--json"]))).expect("json");
    let voter = &digest["voters"][0];
    assert_eq!(voter["id"], 1, "{digest}");
    assert!(
        voter["applied_index"].as_u64().unwrap_or(0) >= 1,
        "{digest}"
    );
    assert_eq!(voter["digest"].as_str().map(str::len), Some(64), "{digest}");
    refused(admin(&dev, &["digest", "--node", "7"]), "not a member");

    let shown: serde_json::Value =
        serde_json::from_str(&ok(admin_area(&dev, "settings", &["show", "--json"]))).expect("json");
    assert!(
        shown["epoch_lease_ms"].as_u64().unwrap_or(0) >= 1,
        "{shown}"
    );
    let set: serde_json::Value = serde_json::from_str(&ok(admin_area(
        &dev,
        "settings",
        &["set", "--epoch-lease", "42s", "--json"],
    )))
    .expect("json");
    assert_eq!(set["epoch_lease_ms"], 42_000, "{set}");
    let table = ok(admin_area(&dev, "settings", &["show"]));
    assert_eq!(table, "epoch_lease  42s\n");
    refused(
        admin_area(&dev, "settings", &["set", "--epoch-lease", "2h"]),
        "out of range",
    );
}
