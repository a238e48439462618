//! End to end: `sluice admin meta` (the built binary) against `sluice dev`
//! (one meta voter): `list` as a table and as JSON, and the refusals a
//! single-voter cluster gives (`remove` of the last voter, `add` of a node
//! that never catches up, which leaves the membership as it was).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Output, Stdio};

/// Finds `count` consecutive free loopback ports.
fn free_port_range(count: u16) -> u16 {
    for attempt in 0..200u32 {
        let base = 20_000 + ((std::process::id() * 6007 + attempt * 104_729) % 40_000) as u16;
        let listeners: Vec<_> = (0..count)
            .map(|i| TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], base + i))))
            .collect();
        if listeners.iter().all(Result::is_ok) {
            return base;
        }
    }
    panic!("no free port range found");
}

/// `sluice dev`, killed on drop.
struct Dev(Child);

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_dev(dir: &std::path::Path, base: u16) -> Dev {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["dev", "--data-dir"])
        .arg(dir)
        .args(["--listen", &format!("127.0.0.1:{base}")])
        .args(["--grpc-port-base", &(base + 1).to_string()])
        .args(["--metrics-listen", "off"])
        .env("SLUICE_ACCESS_KEY", "SLUICEADMINTESTKEY")
        .env("SLUICE_SECRET_KEY", "admin-test-secret-0123456789abcdef")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start sluice dev");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.expect("read banner");
        if line.starts_with("Press Ctrl-C") {
            break;
        }
    }
    // Keep draining stdout so the process never writes to a closed pipe.
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    Dev(child)
}

/// `sluice dev`'s data dir: the admin certificate it made is under `tls/`.
static DEV_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

fn admin(meta: &str, args: &[&str]) -> Output {
    let tls = DEV_DIR.get().expect("dev started").join("tls");
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["admin", "meta"])
        .args(args)
        .args(["--meta", meta])
        .env("SLUICE_ADMIN_CA", tls.join("ca.pem"))
        .env("SLUICE_ADMIN_CERT", tls.join("admin-dev.pem"))
        .env("SLUICE_ADMIN_KEY", tls.join("admin-dev.key"))
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
    let base = free_port_range(16);
    let _dev = start_dev(dir.path(), base);
    DEV_DIR.set(dir.path().to_owned()).expect("one dev cluster");
    let meta = format!("https://127.0.0.1:{}", base + 1);

    let list: serde_json::Value =
        serde_json::from_str(&ok(admin(&meta, &["list", "--json"]))).expect("json");
    assert_eq!(list["leader_id"], 1, "{list}");
    assert_eq!(list["members"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list["members"][0]["role"], "voter", "{list}");
    assert_eq!(list["members"][0]["addr"], meta.as_str(), "{list}");
    assert!(list["commit_index"].as_u64().unwrap_or(0) >= 1, "{list}");

    let table = ok(admin(&meta, &["list"]));
    assert!(table.contains(&format!("   1  {meta}  leader")), "{table}");

    refused(admin(&meta, &["remove", "1"]), "last voter");
    refused(admin(&meta, &["remove", "9"]), "not a member");
    let nobody = TcpListener::bind("127.0.0.1:0").expect("bind");
    let nobody_addr = format!("http://{}", nobody.local_addr().expect("addr"));
    drop(nobody);
    refused(
        admin(
            &meta,
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
        serde_json::from_str(&ok(admin(&meta, &["list", "--json"]))).expect("json");
    assert_eq!(
        list["members"].as_array().map(Vec::len),
        Some(1),
        "learner left behind: {list}"
    );
}
