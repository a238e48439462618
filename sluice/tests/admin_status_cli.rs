//! End to end: `sluice dev` started as a process, then `sluice admin status
//! --json`, the health checks on its metrics listener and the `sluice admin
//! serve` status page (in headless Chromium when it is installed; `.ci/run`
//! installs it), as an operator would use them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_harness::cluster::reserve_port_range;
use sluice_harness::dev::{Dev, DevOptions, KillOnDrop};

const ACCESS_KEY: &str = "SLUICESTATUSKEY";
const SECRET_KEY: &str = "status-secret-key-0123456789abcdef";

/// `GET path` on `addr`: (status, body).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match probe() {
            Ok(v) => return v,
            Err(state) if started.elapsed() > Duration::from_secs(90) => {
                panic!("timed out waiting for {what}; last state: {state}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// `sluice admin status --json` against `meta` with the admin certificate.
fn status_json(
    meta: &str,
    admin_cert: &[(&str, std::path::PathBuf)],
) -> Result<serde_json::Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["admin", "status", "--json", "--meta", meta])
        .envs(admin_cert.iter().cloned())
        .env("RUST_LOG", "error")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

#[test]
fn admin_status_status_page_and_health_against_sluice_dev() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = reserve_port_range(10).expect("free ports");
    let (s3_port, grpc_base, metrics_port) = (base, base + 1, base + 9);
    let dev = Dev::start(
        DevOptions::new(
            Path::new(env!("CARGO_BIN_EXE_sluice")),
            dir.path(),
            s3_port,
            grpc_base,
            (ACCESS_KEY, SECRET_KEY),
        )
        .metrics_port(metrics_port),
    )
    .expect("start sluice dev");

    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let s3 = SocketAddr::from(([127, 0, 0, 1], s3_port));
    assert_eq!(get(metrics, "/health/live").expect("live").0, 200);
    assert_eq!(get(s3, "/health/live").expect("live on S3").0, 200);
    // Ready once write_quorum (5) datanodes are writable; wait for all six,
    // which register one after another.
    let body = wait_for("ready with 6 writable datanodes", || {
        match get(metrics, "/health/ready") {
            Ok((200, body)) if body.contains(", 6 writable datanodes") => Ok(body),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(
        body.starts_with("ready: meta leader reachable, 6 writable datanodes"),
        "{body}"
    );

    let meta = dev.meta_url();
    // The admin certificate `sluice dev` made.
    let admin_cert = dev.admin_env();
    let status: serde_json::Value = wait_for("status with every datanode up", || {
        let json = status_json(&meta, &admin_cert)?;
        let datanodes = json["datanodes"].as_array().cloned().unwrap_or_default();
        if datanodes.len() == 6 && datanodes.iter().all(|d| d["state"] == "up") {
            Ok(json)
        } else {
            Err(json.to_string())
        }
    });
    assert_eq!(status["leader_id"], 1);
    assert_eq!(status["voters"].as_array().expect("voters").len(), 1);
    assert_eq!(status["voters"][0]["leader"], true);
    assert!(status["applied_index"].as_u64().expect("applied") > 0);
    let ids: Vec<u64> = status["datanodes"]
        .as_array()
        .expect("datanodes")
        .iter()
        .map(|d| d["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5, 6]);

    // The human table names every datanode.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["admin", "status", "--meta", &meta])
        .envs(admin_cert.clone())
        .output()
        .expect("run sluice admin status");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.starts_with("meta: leader 1, term "), "{text}");
    assert_eq!(text.matches(" up ").count(), 6, "{text}");

    // A request on the S3 port (unsigned: 403) is counted and reported to
    // meta with the gateway's next epoch renewal.
    let (code, _) = get(s3, "/").expect("anonymous ListBuckets");
    assert_eq!(code, 403);
    wait_for("the gateway's request count in Status", || {
        let json = status_json(&meta, &admin_cert)?;
        match json["gateways"][0]["requests_total"].as_u64() {
            Some(n) if n >= 1 => Ok(()),
            _ => Err(json["gateways"].to_string()),
        }
    });

    // Every role's background workers are listed: the leader's own, and
    // those datanodes and gateways report with heartbeats and renewals.
    let names = |workers: &serde_json::Value| -> Vec<String> {
        workers
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter_map(|w| w["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let has =
        |listed: &[String], wanted: &[&str]| wanted.iter().all(|w| listed.iter().any(|l| l == w));
    let status = wait_for("every role's workers in Status", || {
        let json = status_json(&meta, &admin_cert)?;
        let meta_ok = has(
            &names(&json["leader_workers"]),
            &[
                "snapshot-schedule",
                "leadership-watch",
                "upload-sweeper",
                "lifecycle-sweeper",
                "lease-sweeper",
                "reclaimer",
            ],
        );
        let datanodes_ok = json["datanodes"].as_array().is_some_and(|ds| {
            ds.iter()
                .all(|d| has(&names(&d["workers"]), &["gc", "scrubber", "membership"]))
        });
        let gateway_ok = has(
            &names(&json["gateways"][0]["workers"]),
            &["epoch-renewal", "datanode-refresh"],
        );
        if meta_ok && datanodes_ok && gateway_ok {
            Ok(json)
        } else {
            Err(json.to_string())
        }
    });
    for w in status["leader_workers"].as_array().expect("leader workers") {
        assert!(
            ["running", "idle"].contains(&w["state"].as_str().expect("state")),
            "{w}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["admin", "status", "--meta", &meta])
        .envs(admin_cert.clone())
        .output()
        .expect("run sluice admin status");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        text.contains("NODE") && text.contains("WORKER") && text.contains("LAST ERROR"),
        "{text}"
    );
    for row in [
        "meta 1",
        "upload-sweeper",
        "datanode 1",
        "scrubber",
        "epoch-renewal",
    ] {
        assert!(text.contains(row), "{row}: {text}");
    }

    status_page(base + 8, &meta, &admin_cert, dir.path());
    drop(dev);
}

/// `sluice admin serve` on `port`: the page and its JSON name the leader
/// and every datanode; headless Chromium renders it.
fn status_page(
    port: u16,
    meta: &str,
    admin_cert: &[(&str, std::path::PathBuf)],
    dir: &std::path::Path,
) {
    let page = SocketAddr::from(([127, 0, 0, 1], port));
    let serve = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["admin", "serve", "--meta", meta, "--interval", "1s"])
        .args(["--listen", &page.to_string()])
        .envs(admin_cert.iter().cloned())
        .stdout(Stdio::null())
        .spawn()
        .expect("start sluice admin serve");
    let _serve = KillOnDrop(serve);
    // Two polls: the charts need two samples.
    let html = wait_for("the status page with its charts", || match get(page, "/") {
        Ok((200, body)) if body.contains("<polyline") => Ok(body),
        other => Err(format!("{other:?}")),
    });
    assert!(html.contains("<title>Sluice cluster status</title>"));
    assert!(
        html.contains("meta leader<b class=\"ok\">node 1 · term "),
        "{html}"
    );
    assert!(
        html.contains("datanodes up<b class=\"ok\">6 / 6</b>"),
        "{html}"
    );
    assert_eq!(
        html.matches("<td class=\"ok\">up</td>").count(),
        6,
        "{html}"
    );
    assert!(html.contains("RSS / memory budgets"));
    assert!(html.contains("<h2>Workers</h2>"), "{html}");
    assert!(html.contains("<td>upload-sweeper</td>"), "{html}");
    assert_eq!(html.matches("<svg ").count(), 3);
    let (code, json) = get(page, "/status.json").expect("status.json");
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(json["status"]["leader_id"], 1);
    assert_eq!(
        json["status"]["datanodes"]
            .as_array()
            .expect("datanodes")
            .len(),
        6
    );
    assert!(json["error"].is_null());

    let Some(chromium) = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install chromium (.ci/run) for the status page test"
        );
        eprintln!(
            "SKIPPED the headless-browser part: no chromium on PATH (apt-get install chromium)"
        );
        return;
    };
    let url = format!("http://{page}/");
    let shot = dir.join("status-page.png");
    let headless = |extra: &[&str]| {
        Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.join("chromium-profile").display()
            ))
            .args(extra)
            .arg(&url)
            .stderr(Stdio::null())
            .output()
            .expect("run chromium")
    };
    // The DOM after the browser parsed and laid out the page.
    let dom = headless(&["--dump-dom"]);
    assert!(dom.status.success());
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("datanodes up<b class=\"ok\">6 / 6</b>"),
        "{dom}"
    );
    assert!(dom.contains("<polyline"), "{dom}");
    let out = headless(&[
        "--window-size=1400,1500",
        &format!("--screenshot={}", shot.display()),
    ]);
    assert!(out.status.success(), "{out:?}");
    let png = std::fs::read(&shot).expect("screenshot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG file");
    let width = u32::from_be_bytes(png[16..20].try_into().expect("IHDR width"));
    let height = u32::from_be_bytes(png[20..24].try_into().expect("IHDR height"));
    assert_eq!((width, height), (1400, 1500));
    // A blank 1400x1500 page compresses to a few KiB; tables, text and
    // charts take far more.
    assert!(png.len() > 40_000, "screenshot of {} bytes", png.len());
}
