//! The compose deployment smoke test: runs `deploy/compose/smoke.sh` with
//! this build's `sluice` binary (the debug one under `cargo test`), which
//! builds the container images, brings up 3 meta / 6 datanodes / 2 gateways
//! behind haproxy on a fresh docker-compose project, runs the shared smoke
//! steps (deploy/smoke/steps.sh: a 200 MiB multipart object and 200 small
//! ones, a gateway stopped, a host's two datanodes stopped, everything
//! restarted) and always tears the cluster down.
//!
//! Skipped, with a message saying why, when Docker does not answer
//! (`docker info`) or docker-compose or the aws CLI is missing. Needs
//! haproxy on the host for its image (`.ci/run` installs it; the image
//! script installs it with apt when it is missing and it runs as root).
//! Takes minutes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use sluice_harness::cluster::reserve_ports;

/// Why the smoke cannot run here, if it cannot.
fn missing_tool() -> Option<String> {
    let runs = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !runs("docker", &["info"]) {
        return Some("`docker info` fails (no Docker daemon reachable)".into());
    }
    if !runs("docker-compose", &["version"]) {
        return Some("docker-compose is not installed".into());
    }
    if !runs("aws", &["--version"]) {
        return Some("the aws CLI is not installed".into());
    }
    None
}

#[test]
fn compose_cluster_smoke() {
    if let Some(why) = missing_tool() {
        eprintln!("SKIPPED deploy_compose::compose_cluster_smoke: {why}");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = repo.join("deploy/compose/smoke.sh");
    let ports = reserve_ports(2).expect("two free ports");
    let (s3_port, status_port) = (ports[0], ports[1]);
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .env("SLUICE_S3_PORT", s3_port.to_string())
        .env("SLUICE_STATUS_PORT", status_port.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run deploy/compose/smoke.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    eprintln!(
        "deploy/compose/smoke.sh: {} after {:.0} s",
        out.status,
        started.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "smoke.sh failed: {}", out.status);
    assert!(
        stdout.lines().any(|l| l.starts_with("SMOKE PASS ")),
        "smoke.sh printed no SMOKE PASS line"
    );
}
