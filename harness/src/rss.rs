//! Resident-set sampling of server processes from `/proc/PID/status`.
//!
//! `VmRSS` is what the kernel counts against a process (anonymous + file +
//! shmem resident pages), the figure an OOM report shows; see proc(5).

use std::io;
use std::path::PathBuf;

use crate::error::HarnessError;

/// A process whose RSS is sampled, named for its CSV column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcTarget {
    /// Column suffix: `rss_mib_<name>`. Letters, digits, `-`, `_`.
    pub name: String,
    /// Process id.
    pub pid: u32,
}

impl ProcTarget {
    /// Path of the process's status file.
    pub fn status_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/status", self.pid))
    }

    /// CPU time the process has used so far (user + system, all threads),
    /// in seconds, from fields 14 and 15 of `/proc/PID/stat` (proc(5));
    /// `None` when the process no longer exists or the file is malformed.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.cpu_ticks().map(ticks_to_seconds)
    }

    /// [`Self::cpu_seconds`] in clock ticks (units of
    /// [`CLOCK_TICKS_PER_SECOND`]), exact, for differences.
    pub fn cpu_ticks(&self) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        parse_stat_cpu_ticks(&text)
    }

    /// Current RSS in bytes; `Ok(None)` when the process no longer exists
    /// (or, like a kernel thread, has no `VmRSS` line).
    ///
    /// # Errors
    /// [`HarnessError::ReadProc`] when the status file exists but cannot be read.
    pub fn rss_bytes(&self) -> Result<Option<u64>, HarnessError> {
        let path = self.status_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(parse_vm_rss(&text)),
            // ESRCH shows up when the process exits between open and read.
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(3) => {
                Ok(None)
            }
            Err(source) => Err(HarnessError::ReadProc { path, source }),
        }
    }
}

/// `VmRSS` of process `pid`, bytes; `None` when it cannot be read.
pub fn rss_bytes_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// The CPU ticks ([`ProcTarget::cpu_ticks`]) of every target, in order;
/// `None` for one that cannot be read.
pub fn read_cpu_ticks(targets: &[ProcTarget]) -> Vec<Option<u64>> {
    targets.iter().map(ProcTarget::cpu_ticks).collect()
}

/// Parses a `--pids` list: comma-separated `pid` or `name=pid` entries;
/// `self` as a pid means this benchmark process. Unnamed entries are named
/// `pid<PID>` (`bench` for `self`). An empty string gives an empty list.
///
/// # Errors
/// [`HarnessError::InvalidPids`] for a non-numeric pid, a name with characters
/// other than letters, digits, `-` and `_`, or a duplicate name.
pub fn parse_targets(spec: &str) -> Result<Vec<ProcTarget>, HarnessError> {
    let invalid = |reason: String| HarnessError::InvalidPids {
        spec: spec.to_owned(),
        reason,
    };
    let mut targets: Vec<ProcTarget> = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, pid_text) = match entry.split_once('=') {
            Some((name, pid)) => (Some(name.trim()), pid.trim()),
            None => (None, entry),
        };
        let pid = if pid_text == "self" {
            std::process::id()
        } else {
            pid_text
                .parse::<u32>()
                .map_err(|_| invalid(format!("`{pid_text}` is not a process id")))?
        };
        let name = match name {
            Some(name) => name.to_owned(),
            None if pid_text == "self" => "bench".to_owned(),
            None => format!("pid{pid}"),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(format!(
                "name `{name}` must be letters, digits, '-' or '_'"
            )));
        }
        if targets.iter().any(|t| t.name == name) {
            return Err(invalid(format!("name `{name}` appears twice")));
        }
        targets.push(ProcTarget { name, pid });
    }
    Ok(targets)
}

/// utime + stime (fields 14 and 15, clock ticks) of a `/proc/PID/stat`
/// text. The command name (field 2) is in parentheses and may hold spaces,
/// so fields are counted after its closing parenthesis.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so field N is index N - 3.
    let mut fields = after.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The unit of `/proc/PID/stat` CPU times: `sysconf(_SC_CLK_TCK)`, which
/// is the kernel's `USER_HZ`, fixed at 100 on every Linux architecture this
/// benchmark runs on (time(7); `getconf CLK_TCK` prints it). Assumed rather
/// than asked for: this crate does not depend on `libc`, and nix's
/// `sysconf` needs a feature the workspace does not enable.
pub const CLOCK_TICKS_PER_SECOND: u64 = 100;

/// Clock ticks of `/proc/PID/stat` to seconds.
pub fn ticks_to_seconds(ticks: u64) -> f64 {
    ticks as f64 / CLOCK_TICKS_PER_SECOND as f64
}

/// The `VmRSS` value of a `/proc/PID/status` text, in bytes (the file
/// reports kB = KiB). `None` when the line is missing or malformed.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    parse_status_kib(status, "VmRSS")
}

/// The value of a `/proc/PID/status` line `<field>:  <n> kB` (such as
/// `VmRSS` or `VmHWM`, the peak RSS), in bytes. `None` when the line is
/// missing or malformed.
pub fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let mut fields = line.split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    // The kernel always prints "kB" (meaning KiB) here.
    if fields.next() != Some("kB") {
        return None;
    }
    value.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tsluice\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
        VmPeak:\t 1234568 kB\nVmSize:\t 1200000 kB\nVmHWM:\t  300000 kB\nVmRSS:\t  262144 kB\n\
        RssAnon:\t  200000 kB\nThreads:\t12\n";

    #[test]
    fn parses_cpu_ticks_after_a_name_with_spaces() {
        let stat = "4242 (tokio (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 75 0 0 20 0 12 0 1000 123456 789 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
        assert_eq!(parse_stat_cpu_ticks("4242 (x) S 1 2"), None);
    }

    #[test]
    fn parses_cpu_ticks_of_a_full_stat_line() {
        // A whole line, the name holding ") (" and digits that would
        // shift a naive split by whitespace.
        let stat = "1234 (gw) (7) 1 2) R 1 1234 1234 0 -1 4194304 5821 0 0 0 \
                    1520 347 0 0 20 0 17 0 4321 1234567890 65432 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 17634 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(1520 + 347));
        assert_eq!(ticks_to_seconds(1867), 18.67);
        // No name, non-numeric times, nothing after the name.
        assert_eq!(parse_stat_cpu_ticks("1234 S 1 2 3"), None);
        assert_eq!(
            parse_stat_cpu_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 ab 3 0"),
            None
        );
        assert_eq!(parse_stat_cpu_ticks("1 (x)"), None);
        assert_eq!(parse_stat_cpu_ticks(""), None);
    }

    #[test]
    fn reads_own_cpu_ticks() {
        let me = ProcTarget {
            name: "bench".into(),
            pid: std::process::id(),
        };
        // Burn a little CPU so that at least one tick is likely counted.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(me.cpu_ticks().is_some());
        assert!(me.cpu_seconds().is_some_and(|s| s >= 0.0));
        let gone = ProcTarget {
            name: "gone".into(),
            pid: u32::MAX - 1,
        };
        assert_eq!(gone.cpu_ticks(), None);
    }

    #[test]
    fn parses_vm_rss_in_bytes() {
        assert_eq!(parse_vm_rss(STATUS), Some(262_144 * 1024));
        // Not fooled by VmHWM or RssAnon.
        assert_eq!(parse_vm_rss("VmHWM:\t 5 kB\nRssAnon:\t 7 kB\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\t garbage kB\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\t 12 GB\n"), None);
        assert_eq!(parse_status_kib(STATUS, "VmHWM"), Some(300_000 * 1024));
        // A field name that is a prefix of another line's name is not that line.
        assert_eq!(parse_status_kib("VmHWMx:\t 5 kB\n", "VmHWM"), None);
    }

    #[test]
    fn reads_own_rss() {
        let me = ProcTarget {
            name: "bench".into(),
            pid: std::process::id(),
        };
        let rss = me.rss_bytes().expect("read own status").expect("own VmRSS");
        assert!(
            rss > 1024 * 1024,
            "a test binary is bigger than 1 MiB: {rss}"
        );
    }

    #[test]
    fn vanished_process_reads_as_none() {
        // PIDs are bounded by /proc/sys/kernel/pid_max (<= 2^22).
        let gone = ProcTarget {
            name: "gone".into(),
            pid: u32::MAX - 1,
        };
        assert_eq!(gone.rss_bytes().expect("missing is not an error"), None);
    }

    #[test]
    fn parses_pid_lists() {
        let t = parse_targets("gateway=100, meta=200,300").expect("valid");
        assert_eq!(
            t,
            vec![
                ProcTarget {
                    name: "gateway".into(),
                    pid: 100
                },
                ProcTarget {
                    name: "meta".into(),
                    pid: 200
                },
                ProcTarget {
                    name: "pid300".into(),
                    pid: 300
                },
            ]
        );
        assert_eq!(parse_targets("").expect("empty"), vec![]);
        let own = parse_targets("self").expect("self");
        assert_eq!(
            own,
            vec![ProcTarget {
                name: "bench".into(),
                pid: std::process::id()
            }]
        );
    }

    #[test]
    fn rejects_bad_pid_lists() {
        for bad in ["gateway=abc", "a b=1", "x=1,x=2", "=5", "12x"] {
            assert!(parse_targets(bad).is_err(), "{bad} should be rejected");
        }
    }
}
