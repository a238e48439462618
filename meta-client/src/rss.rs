//! What a node reports to meta about itself.

/// Resident set size of this process (`VmRSS` of `/proc/self/status`), bytes; 0 when unknown.
pub fn process_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
            let mut fields = line["VmRSS:".len()..].split_whitespace();
            let kib: u64 = fields.next()?.parse().ok()?;
            (fields.next() == Some("kB")).then_some(kib.saturating_mul(1024))
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_resident_set() {
        assert!(super::process_rss() > 0);
    }
}
