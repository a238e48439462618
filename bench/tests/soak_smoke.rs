//! Soak smoke: `sluice-bench soak --smoke` against a real multi-process
//! cluster (the `sluice` binary: meta, six datanodes, gateway), about two
//! minutes, so that a regression in boundedness, backpressure or data
//! integrity fails CI. Every shape's verdict must be PASS.
//!
//! The `sluice` binary is taken from the same target directory as
//! `sluice-bench` (`cargo test --workspace` builds it for the sluice
//! package's own tests); when it is missing, it is built with the cargo
//! that runs this test. `SLUICE_BIN` overrides the path.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Far above the smoke's usual run time; this only guards a hang.
const SMOKE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

fn sluice_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_BIN") {
        return PathBuf::from(path);
    }
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_sluice-bench"));
    let profile_dir = bench.parent().expect("sluice-bench lives in a target dir");
    let sluice = profile_dir.join(format!("sluice{}", std::env::consts::EXE_SUFFIX));
    if !sluice.is_file() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("bench/ is inside the workspace");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "-p", "sluice", "--bin", "sluice"])
            .current_dir(workspace);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build -p sluice");
        assert!(status.success(), "cargo build -p sluice: {status}");
    }
    assert!(sluice.is_file(), "no sluice binary at {}", sluice.display());
    sluice
}

/// Waits for `child` until `timeout`, killing it then.
fn wait_with_timeout(child: &mut std::process::Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("wait for sluice-bench") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice-bench soak --smoke still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn soak_smoke_passes_every_shape() {
    let sluice = sluice_binary();
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path().join("work");
    let out = dir.path().join("out");
    let stdout_path = dir.path().join("stdout.txt");
    let stderr_path = dir.path().join("stderr.txt");

    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .arg("soak")
        .arg("--smoke")
        .arg("--sluice-bin")
        .arg(&sluice)
        .arg("--work-dir")
        .arg(&work)
        .arg("--out-dir")
        .arg(&out)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(File::create(&stdout_path).expect("stdout file"))
        .stderr(File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("start sluice-bench soak");
    let status = wait_with_timeout(&mut child, SMOKE_TIMEOUT);
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    println!("soak --smoke took {:?}\n{stdout}", started.elapsed());
    let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
    let context = format!(
        "stdout:\n{stdout}\nstderr (last lines):\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    assert!(
        status.success(),
        "soak --smoke failed ({status})\n{context}"
    );

    let verdict: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("verdict.json")).expect("verdict.json"),
    )
    .expect("verdict.json is JSON");
    assert_eq!(verdict["mode"], "smoke");
    assert_eq!(verdict["pass"], true, "{context}");
    let shapes = verdict["shapes"].as_array().expect("shapes");
    let names: Vec<&str> = shapes.iter().filter_map(|s| s["shape"].as_str()).collect();
    assert_eq!(names, ["seed", "sdk-default", "overload"]);
    for shape in shapes {
        let name = shape["shape"].as_str().unwrap_or("?");
        assert_eq!(shape["pass"], true, "{name}\n{context}");
        for check in shape["checks"].as_array().expect("checks") {
            if check["required"] == true {
                assert_eq!(check["pass"], true, "{name}: {check}");
            }
        }
        // Eight processes sampled, none exited.
        let processes = shape["processes"].as_array().expect("processes");
        assert_eq!(processes.len(), 8, "{name}");
        assert!(processes.iter().all(|p| p["exited"] == false), "{name}");
        for file in ["samples.csv", "summary.json", "chart.svg"] {
            assert!(out.join(name).join(file).is_file(), "{name}/{file}");
        }
    }
    // The seed shape moved data; the others read every completed object back.
    assert!(shapes[0]["parts"].as_u64().unwrap_or(0) > 0);
    assert_eq!(shapes[1]["read_back"]["identical"], 2);
    assert_eq!(shapes[1]["slowdown"], 0);
    let overload = &shapes[2]["read_back"];
    assert!(overload["identical"].as_u64().unwrap_or(0) >= 1);
    assert_eq!(overload["identical"], overload["checked"]);

    // Both clusters stopped on SIGTERM, and their data is gone.
    let clusters = verdict["clusters"].as_array().expect("clusters");
    assert_eq!(clusters.len(), 2);
    for cluster in clusters {
        let exits = cluster["exits"].as_array().expect("exits");
        assert_eq!(exits.len(), 8);
        for exit in exits {
            assert_eq!(exit["killed"], false, "{exit}");
        }
    }
    assert!(!work.join("main").exists() && !work.join("overload").exists());
}
