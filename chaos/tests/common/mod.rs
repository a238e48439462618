//! What the chaos tests share: the check for root and the harness's tools,
//! and the tail of a long output for a failure message.

use std::process::Command;

/// `Ok` when running as root with every tool of
/// `sluice_chaos::cluster::TOOLS` and of `extra` on PATH; why not, else.
pub fn have_everything(extra: &[&str]) -> Result<(), String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("not root".into());
    }
    for tool in sluice_chaos::cluster::TOOLS.iter().chain(extra) {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            return Err(format!("no {tool}"));
        }
    }
    Ok(())
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One seed's `sluice-chaos run`: its output directory (kept on disk when
/// the caller panics after [`tempfile::TempDir::keep`]), the seed's result
/// line (`seed N: PASS ...` or `FAIL ...`) and its `summary.json`.
pub struct ChaosRun {
    /// The run's `--out` directory.
    pub out: tempfile::TempDir,
    /// The seed's result line.
    pub line: String,
    /// `seed-N/summary.json`.
    pub summary: serde_json::Value,
}

/// Runs `chaos run --seed SEED --seeds 1 --out <temp dir> ARGS`; panics,
/// keeping the run directory (logs of every process) for the CI log,
/// when it exits unsuccessfully or prints no result line for the seed.
pub fn run_chaos<I, S>(chaos: &std::path::Path, prefix: &str, seed: u64, args: I) -> ChaosRun
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    let output = Command::new(chaos)
        .args(["run", "--seeds", "1", "--seed"])
        .arg(seed.to_string())
        .args(args)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("running sluice-chaos");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let kept = out.keep();
        panic!(
            "chaos run failed ({}); kept {}\n--- stdout\n{stdout}\n--- stderr (tail)\n{}",
            output.status,
            kept.display(),
            tail(&stderr, 60)
        );
    }
    let (pass, fail) = (format!("seed {seed}: PASS"), format!("seed {seed}: FAIL"));
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&pass) || l.starts_with(&fail))
        .unwrap_or_else(|| panic!("no seed line in\n{stdout}"))
        .to_owned();
    let summary = serde_json::from_str(
        &std::fs::read_to_string(out.path().join(format!("seed-{seed}/summary.json"))).unwrap(),
    )
    .unwrap();
    ChaosRun { out, line, summary }
}
