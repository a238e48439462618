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
