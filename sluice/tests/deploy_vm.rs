//! The multi-VM deployment (deploy/vm/, deploy/systemd/):
//!
//! * every per-host config of the 3-VM and 6-VM layouts parses into its
//!   role's `Config` and validates, with the shape the guide promises
//!   (mutual TLS, metrics_listen everywhere, host labels, 3+2 gateways);
//! * the systemd units pass `systemd-analyze verify` (skipped when it is
//!   absent) and carry the settings the guide relies on;
//! * `deploy/vm/netns-smoke.sh` runs the 6-VM layout in network namespaces
//!   on loop-mounted XFS behind haproxy and passes the deployment smoke
//!   steps, then adds a datanode and replaces a failed meta VM as the guide
//!   says (skipped unless root with ip, mkfs.xfs, haproxy and aws).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use sluice_net::{Identity, Role};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

const TLS_DIR: &str = "/etc/sluice/tls/";

/// A CA holding every certificate the layouts name.
fn pki_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ids = vec![Identity::new(Role::Gateway, "s3").unwrap()];
        for i in 1..=3 {
            ids.push(Identity::new(Role::Meta, i.to_string()).unwrap());
            ids.push(Identity::new(Role::Gateway, format!("gw-{i}")).unwrap());
        }
        for i in 1..=6 {
            ids.push(Identity::new(Role::Datanode, i.to_string()).unwrap());
        }
        sluice_net::pki::ensure_dir(dir.path(), &ids).expect("test PKI");
        dir
    })
    .path()
}

/// (host, file stem, text with its TLS files in the test CA) of a layout.
fn layout(name: &str) -> Vec<(String, String, String)> {
    let dir = repo().join("deploy/vm").join(name);
    let mut out = Vec::new();
    for host in std::fs::read_dir(&dir).unwrap() {
        let host = host.unwrap().path();
        if !host.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&host).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&file).unwrap();
                assert!(text.contains(TLS_DIR), "{} has no TLS", file.display());
                out.push((
                    host.file_name().unwrap().to_string_lossy().into_owned(),
                    file.file_stem().unwrap().to_string_lossy().into_owned(),
                    text.replace(TLS_DIR, &format!("{}/", pki_dir().display())),
                ));
            }
        }
    }
    out.sort();
    out
}

/// The hosts file of a layout: host -> address.
fn hosts(name: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join("deploy/vm").join(name).join("hosts")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut words = l.split_whitespace();
            (
                words.next().unwrap().to_string(),
                words.next().unwrap().to_string(),
            )
        })
        .collect()
}

fn check_layout(name: &str, metas: usize, datanodes: usize, gateways: usize) {
    let hosts = hosts(name);
    let mut counts = (0, 0, 0);
    let mut datanode_ids = BTreeSet::new();
    let mut host_labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (host, stem, text) in layout(name) {
        let ip = &hosts[&host];
        let what = format!("{name}/{host}/{stem}.toml");
        match stem.split('-').next().unwrap() {
            "meta" => {
                let c: sluice_meta::Config = toml::from_str(&text).expect(&what);
                c.validate().expect(&what);
                assert!(c.cluster_tls.is_some() && !c.insecure_cluster, "{what}");
                assert!(c.metrics_listen.is_some(), "{what}: metrics_listen");
                assert_eq!(c.advertise_addr, format!("https://{ip}:7001"), "{what}");
                assert_eq!(c.voters.len(), 3, "{what}");
                counts.0 += 1;
            }
            "datanode" => {
                let c: sluice_datanode::Config = toml::from_str(&text).expect(&what);
                c.validate().expect(&what);
                assert!(c.cluster_tls.is_some() && !c.insecure_cluster, "{what}");
                assert!(c.metrics_listen.is_some(), "{what}: metrics_listen");
                assert!(c.advertise_addr.contains(ip.as_str()), "{what}");
                assert!(datanode_ids.insert(c.node_id), "{what}: duplicate id");
                assert!(!c.zone.is_empty(), "{what}: zone");
                assert_eq!(c.host.as_deref(), Some(host.as_str()), "{what}: host label");
                host_labels.entry(host.clone()).or_default().insert(stem);
                counts.1 += 1;
            }
            "gateway" => {
                let c: sluice_gateway::Config = toml::from_str(&text).expect(&what);
                c.validate().expect(&what);
                assert!(c.cluster_tls.is_some() && !c.insecure_cluster, "{what}");
                assert!(c.s3_tls.is_some(), "{what}: HTTPS");
                assert!(c.metrics_listen.is_some(), "{what}: metrics_listen");
                assert_eq!((c.data_shards, c.parity_shards), (3, 2), "{what}");
                // A whole storage host (2 datanodes) down leaves 4 writable.
                assert_eq!(c.effective_write_quorum(), 4, "{what}");
                counts.2 += 1;
            }
            other => panic!("{what}: unknown role {other}"),
        }
    }
    assert_eq!(counts, (metas, datanodes, gateways), "{name}");
    assert_eq!(host_labels.len(), 3, "{name}: 3 storage hosts");
    assert!(host_labels.values().all(|dns| dns.len() == 2), "{name}");
}

#[test]
fn vm_layout_configs() {
    check_layout("3-vm", 3, 6, 3);
    check_layout("6-vm", 3, 6, 3);
}

/// The gateways haproxy balances are the layouts' gateways, health-checked.
#[test]
fn haproxy_cfg_names_the_gateways() {
    let cfg = std::fs::read_to_string(repo().join("deploy/vm/haproxy.cfg")).unwrap();
    for needle in [
        "balance leastconn",
        "/health/ready",
        "check port 9090",
        "server gw-1 10.0.0.11:9000",
        "server gw-2 10.0.0.12:9000",
        "server gw-3 10.0.0.13:9000",
        "timeout server 1h",
    ] {
        assert!(cfg.contains(needle), "haproxy.cfg lacks {needle:?}");
    }
    if which("haproxy").is_some() {
        let out = Command::new("haproxy")
            .args(["-c", "-f"])
            .arg(repo().join("deploy/vm/haproxy.cfg"))
            .output()
            .unwrap();
        assert!(out.status.success(), "haproxy -c: {out:?}");
    }
}

const UNITS: [&str; 4] = [
    "sluice-meta.service",
    "sluice-datanode.service",
    "sluice-datanode@.service",
    "sluice-gateway.service",
];

fn unit_text(name: &str) -> String {
    std::fs::read_to_string(repo().join("deploy/systemd").join(name)).unwrap()
}

/// What the guide relies on, in every unit.
#[test]
fn systemd_units_settings() {
    for name in UNITS {
        let text = unit_text(name);
        for needle in [
            "Type=notify",
            "Restart=on-failure",
            "User=sluice",
            "LimitNOFILE=",
            "MemoryMax=",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "NoNewPrivileges=yes",
            "ExecStart=/usr/local/bin/sluice ",
            "--config /etc/sluice/",
        ] {
            assert!(text.contains(needle), "{name} lacks {needle}");
        }
    }
    assert!(unit_text("sluice-meta.service").contains("ReadWritePaths=/var/lib/sluice/meta"));
    assert!(
        unit_text("sluice-datanode@.service")
            .contains("ReadWritePaths=/var/lib/sluice/datanode-%i")
    );
    assert!(unit_text("sluice-datanode@.service").contains("/etc/sluice/datanode-%i.toml"));
    // The guide's datanode configs live where the template unit looks.
    for (_, stem, text) in layout("6-vm") {
        if let Some(n) = stem.strip_prefix("datanode-") {
            assert!(
                text.contains(&format!("data_dir = \"/var/lib/sluice/datanode-{n}\"")),
                "{stem}"
            );
        }
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// `systemd-analyze verify` on the units, ExecStart pointed at the built
/// binary (verify checks that it exists). The template is verified as
/// instance `sluice-datanode@1.service`.
#[test]
fn systemd_units_verify() {
    let Some(analyze) = which("systemd-analyze") else {
        eprintln!("SKIP systemd_units_verify: systemd-analyze not found (install systemd)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for name in UNITS {
        let text = unit_text(name).replace("/usr/local/bin/sluice", env!("CARGO_BIN_EXE_sluice"));
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let out = Command::new(&analyze)
        .current_dir(dir.path())
        .args([
            "verify",
            "sluice-meta.service",
            "sluice-datanode.service",
            "sluice-datanode@1.service",
            "sluice-gateway.service",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    // Warnings about our files (unknown keys, bad values) name them.
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("sluice-")).collect();
    assert!(ours.is_empty(), "systemd-analyze verify warns: {ours:#?}");
}

/// The 6-VM layout in network namespaces, then the deployment smoke steps.
#[test]
fn netns_smoke() {
    // /proc/self belongs to the effective uid.
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    let missing: Vec<&str> = ["ip", "mkfs.xfs", "haproxy", "aws", "losetup"]
        .into_iter()
        .filter(|t| which(t).is_none())
        .collect();
    if !root || !missing.is_empty() {
        eprintln!(
            "SKIP netns_smoke: needs root (is root: {root}) and ip, mkfs.xfs, haproxy, aws, losetup \
             (missing: {missing:?}); .ci/run installs them"
        );
        return;
    }
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(repo().join("deploy/vm/netns-smoke.sh"))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .arg("6-vm")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let secs = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "netns-smoke.sh failed after {secs:.0} s\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("XFS OK datanodes=6"), "{stdout}");
    // The guide's steps 10 (a datanode added) and 11 (a failed meta VM replaced).
    assert!(stdout.contains("OPS OK"), "{stdout}");
    let pass = stdout
        .lines()
        .find(|l| l.starts_with("SMOKE PASS"))
        .unwrap_or_else(|| panic!("no SMOKE PASS line:\n{stdout}\n{stderr}"));
    assert!(pass.contains("big=200MiB"), "{pass}");
    eprintln!("{pass}");
    eprintln!("netns_smoke took {secs:.0} s");
}
