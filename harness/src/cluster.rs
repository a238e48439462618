//! The launcher of `sluice` role processes, shared by the soak and heal
//! benchmarks, `sluice-chaos` and the meta-load benchmark: each writes its
//! own configs (TOML, the binary's file format) and places its processes
//! (loopback ports, or network namespaces for chaos); what starting,
//! stopping and watching a role process takes is here, once.
//!
//! * [`Role`] — the binary's role subcommands.
//! * [`reserve_ports`] — distinct free loopback ports;
//!   [`reserve_port_range`] — consecutive ones (`sluice dev
//!   --grpc-port-base` numbers its nodes from one port up).
//! * [`admin_certs`] — cluster certificates by the binary's `sluice admin certs`.
//! * [`Launch`] — `sluice <role> --config <file>`, output to a log file,
//!   optionally behind a wrapper command (`ip netns exec`, `env`).
//! * [`wait_ready`] — poll a readiness probe until it answers, the process
//!   exits or a deadline passes; [`tcp_listening`] and [`health_ready`]
//!   are the two probes in use.
//! * [`terminate`], [`wait_or_kill`], [`kill9`], [`signal`] — stopping.
//! * [`log_tail`] — the end of a process's log, for error messages.

use std::ffi::OsString;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// A role of the `sluice` binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `sluice meta`.
    Meta,
    /// `sluice datanode`.
    Datanode,
    /// `sluice gateway`.
    Gateway,
}

impl Role {
    /// The subcommand.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Meta => "meta",
            Role::Datanode => "datanode",
            Role::Gateway => "gateway",
        }
    }
}

/// `n` distinct free ports on 127.0.0.1.
///
/// # Errors
/// A port cannot be bound.
pub fn reserve_ports(n: usize) -> std::io::Result<Vec<u16>> {
    // All bound at once so that they differ; released just before the
    // processes bind them.
    let listeners = (0..n)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)))
        .collect::<Result<Vec<_>, _>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// The first of `count` consecutive free ports on 127.0.0.1.
///
/// The candidates are spread over 20000..60000 by the process id and by
/// how many ranges this process reserved before, so that tests running in
/// parallel (in one process or in several) do not probe, and then bind,
/// the same range. The ports are released on return.
///
/// # Errors
/// No free range was found in 200 tries.
pub fn reserve_port_range(count: u16) -> std::io::Result<u16> {
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let first = CALLS.fetch_add(1, Ordering::Relaxed) * 1000;
    for attempt in first..first + 200 {
        let spread = std::process::id()
            .wrapping_mul(7919)
            .wrapping_add(attempt.wrapping_mul(104_729));
        let base = 20_000 + (spread % 40_000) as u16;
        let listeners: Vec<_> = (0..count)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if listeners.iter().all(Result::is_ok) {
            return Ok(base);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no {count} consecutive free loopback ports found"),
    ))
}

/// The last `lines` lines of a log file (empty if unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `sluice admin certs` failed.
#[derive(Debug, thiserror::Error)]
#[error("`{command}` failed: {message}")]
pub struct CertsError {
    /// The command line.
    pub command: String,
    /// Why (spawn error, or exit status and stderr).
    pub message: String,
}

/// Runs `<bin> admin certs <args>` (e.g. `init --dir D`, `issue --dir D
/// --role datanode --id 3`).
///
/// # Errors
/// The binary cannot be run or exits unsuccessfully.
pub async fn admin_certs(bin: &Path, args: &[&str]) -> Result<(), CertsError> {
    let command = format!("{} admin certs {}", bin.display(), args.join(" "));
    let out = Command::new(bin)
        .args(["admin", "certs"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| CertsError {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(CertsError {
            command,
            message: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// A role process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Its log file could not be opened.
    #[error("open log {path}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The command could not be spawned.
    #[error("spawn {program}")]
    Spawn {
        /// The program run (the binary, or the wrapper's first word).
        program: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// How to start one role process: `[wrapper...] <bin> <role> --config
/// <config>`, stdin closed, stdout and stderr to `log`, `RUST_LOG` set,
/// killed when its [`Child`] is dropped.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The `sluice` binary.
    pub bin: PathBuf,
    /// Its role subcommand.
    pub role: Role,
    /// The config file.
    pub config: PathBuf,
    /// Where stdout and stderr go.
    pub log: PathBuf,
    /// `RUST_LOG`.
    pub log_filter: String,
    /// Append to the log (a restart), rather than truncate it.
    pub append: bool,
    /// Words run before the binary (e.g. `ip netns exec NS`, `env VAR=..`).
    pub wrapper: Vec<OsString>,
    /// More environment variables.
    pub env: Vec<(OsString, OsString)>,
}

impl Launch {
    /// A launch of `bin role --config config` logging to `log`, truncated,
    /// with no wrapper.
    pub fn new(bin: &Path, role: Role, config: &Path, log: &Path, log_filter: &str) -> Launch {
        Launch {
            bin: bin.to_owned(),
            role,
            config: config.to_owned(),
            log: log.to_owned(),
            log_filter: log_filter.to_owned(),
            append: false,
            wrapper: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Appends to the log instead of truncating it.
    pub fn append(mut self, append: bool) -> Launch {
        self.append = append;
        self
    }

    /// Runs the binary behind these words.
    pub fn wrapper<I, S>(mut self, words: I) -> Launch
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.wrapper.extend(words.into_iter().map(Into::into));
        self
    }

    /// Sets one more environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Launch {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the process.
    ///
    /// # Errors
    /// The log cannot be opened or the command cannot be spawned.
    pub fn spawn(&self) -> Result<Child, LaunchError> {
        let log_error = |source| LaunchError::Log {
            path: self.log.clone(),
            source,
        };
        let out = File::options()
            .create(true)
            .write(true)
            .append(self.append)
            .truncate(!self.append)
            .open(&self.log)
            .map_err(log_error)?;
        let err = out.try_clone().map_err(log_error)?;
        let (program, mut cmd) = match self.wrapper.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(&self.bin);
                (PathBuf::from(first), cmd)
            }
            None => (self.bin.clone(), Command::new(&self.bin)),
        };
        cmd.arg(self.role.as_str())
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", &self.log_filter)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| LaunchError::Spawn { program, source })
    }
}

/// Why [`wait_ready`] gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The process exited, with this status.
    Exited(String),
    /// The probe did not answer within the timeout; how long was waited.
    Timeout(Duration),
}

/// Polls `probe` every `poll` until it answers `true`; fails when `child`
/// exits first or `timeout` passes.
///
/// # Errors
/// [`NotReady`].
pub async fn wait_ready<F, Fut>(
    child: &mut Child,
    timeout: Duration,
    poll: Duration,
    mut probe: F,
) -> Result<(), NotReady>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NotReady::Exited(status.to_string()));
        }
        if probe().await {
            return Ok(());
        }
        if started.elapsed() >= timeout {
            return Err(NotReady::Timeout(started.elapsed()));
        }
        tokio::time::sleep(poll).await;
    }
}

/// Whether 127.0.0.1:`port` accepts TCP connections.
pub async fn tcp_listening(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// Whether `[wrapper...] <bin> health --url <url>` succeeds (the role's
/// `/health/ready` answers 200).
pub async fn health_ready(wrapper: &[OsString], bin: &Path, url: &str) -> bool {
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut cmd = Command::new(first);
            cmd.args(rest).arg(bin);
            cmd
        }
        None => Command::new(bin),
    };
    cmd.args(["health", "--url", url])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false)
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// Its exit status, or why it could not be waited for.
    pub status: String,
    /// Whether it had to be sent SIGKILL.
    pub killed: bool,
}

/// Waits up to `timeout` for `child` (already told to stop) to exit, then
/// sends SIGKILL; `name` is for the log line.
pub async fn wait_or_kill(child: &mut Child, name: &str, timeout: Duration) -> Exit {
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => Exit {
            status: status.to_string(),
            killed: false,
        },
        Ok(Err(e)) => Exit {
            status: format!("cannot wait: {e}"),
            killed: false,
        },
        Err(_) => {
            tracing::warn!(process = %name, ?timeout, "no exit after SIGTERM; sending SIGKILL");
            let _ = child.start_kill();
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(e) => format!("cannot wait: {e}"),
            };
            Exit {
                status,
                killed: true,
            }
        }
    }
}

/// SIGCONT (in case it is paused) and SIGTERM, then [`wait_or_kill`].
pub async fn terminate(child: &mut Child, name: &str, grace: Duration) -> Exit {
    if let Some(pid) = child.id() {
        let _ = signal(pid, Signal::SIGCONT);
        let _ = signal(pid, Signal::SIGTERM);
    }
    wait_or_kill(child, name, grace).await
}

/// SIGKILL and reap.
pub async fn kill9(child: &mut Child) {
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Sends `sig` to process `pid` (SIGSTOP and SIGCONT pause and resume it).
///
/// # Errors
/// The signal cannot be sent (e.g. no such process).
pub fn signal(pid: u32, sig: Signal) -> nix::Result<()> {
    kill(Pid::from_raw(pid as i32), sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_differ() {
        let ports = reserve_ports(8).unwrap();
        let unique: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(unique.len(), 8);
        assert!(ports.iter().all(|p| *p != 0));
    }

    #[test]
    fn a_port_range_is_free_and_consecutive() {
        let a = reserve_port_range(9).unwrap();
        let b = reserve_port_range(9).unwrap();
        assert_ne!(a, b, "two reservations probe different ranges");
        for base in [a, b] {
            assert!((20_000..60_000).contains(&base), "{base}");
            let held: Vec<_> = (0..9)
                .map(|i| TcpListener::bind(("127.0.0.1", base + i)).unwrap())
                .collect();
            assert_eq!(held.len(), 9);
        }
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = std::env::temp_dir().join(format!("sluice-harness-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("x.log");
        std::fs::write(&log, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&log, 2), "c\nd");
        assert_eq!(log_tail(&log, 10), "a\nb\nc\nd");
        assert_eq!(log_tail(&dir.join("missing.log"), 3), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_launch_logs_and_terminates() {
        let dir =
            std::env::temp_dir().join(format!("sluice-harness-launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sh.log");
        // `env X=1 sh meta --config f.toml`: sh cannot open the script
        // `meta`, says so in the log and exits non-zero.
        let launch = Launch::new(
            Path::new("sh"),
            Role::Meta,
            &dir.join("f.toml"),
            &log,
            "debug",
        )
        .wrapper(["env", "X=1"]);
        let mut child = launch.spawn().unwrap();
        let err = wait_ready(
            &mut child,
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async { false },
        )
        .await
        .unwrap_err();
        assert!(matches!(err, NotReady::Exited(_)), "{err:?}");
        assert!(log_tail(&log, 5).contains("meta"), "{}", log_tail(&log, 5));

        let mut child = Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let exit = terminate(&mut child, "sleep", Duration::from_secs(5)).await;
        assert!(!exit.killed, "{exit:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
