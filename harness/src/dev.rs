//! `sluice dev` as a child process, for the end-to-end tests of the
//! `sluice` binary (the aws CLI, `sluice admin status`, `sluice admin
//! meta`): start it on chosen loopback ports, read its banner (endpoint,
//! metrics URL, CA bundle), point `sluice admin` at it, stop it with
//! Ctrl-C (SIGINT), kill it when dropped ([`KillOnDrop`], for the other
//! processes such a test starts too).
//!
//! Synchronous, unlike [`crate::cluster`]: the tests that use it are plain
//! `#[test]`s driving command-line clients one after another.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// The line `sluice dev` prints once every listener is bound.
const READY_LINE: &str = "Press Ctrl-C";

/// How to start `sluice dev`.
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// The `sluice` binary.
    pub bin: PathBuf,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// The S3 port (`--listen 127.0.0.1:PORT`).
    pub s3_port: u16,
    /// `--grpc-port-base`: meta on it, the datanodes on the ports above.
    pub grpc_port_base: u16,
    /// The metrics port (`--metrics-listen`), or `None` for `off`.
    pub metrics_port: Option<u16>,
    /// `--https`: S3 over TLS with a dev CA.
    pub https: bool,
    /// `SLUICE_ACCESS_KEY`.
    pub access_key: String,
    /// `SLUICE_SECRET_KEY`.
    pub secret_key: String,
    /// `RUST_LOG` (its stderr goes to the caller's).
    pub log_filter: String,
}

impl DevOptions {
    /// Plain HTTP, no metrics listener, `RUST_LOG=warn`.
    pub fn new(
        bin: &Path,
        data_dir: &Path,
        s3_port: u16,
        grpc_port_base: u16,
        (access_key, secret_key): (&str, &str),
    ) -> DevOptions {
        DevOptions {
            bin: bin.to_owned(),
            data_dir: data_dir.to_owned(),
            s3_port,
            grpc_port_base,
            metrics_port: None,
            https: false,
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
            log_filter: "warn".to_owned(),
        }
    }

    /// With the metrics listener on `port`.
    pub fn metrics_port(mut self, port: u16) -> DevOptions {
        self.metrics_port = Some(port);
        self
    }

    /// With `--https` or without.
    pub fn https(mut self, https: bool) -> DevOptions {
        self.https = https;
        self
    }

    /// The arguments after the binary.
    fn args(&self) -> Vec<OsString> {
        let metrics = match self.metrics_port {
            Some(port) => format!("127.0.0.1:{port}"),
            None => "off".to_owned(),
        };
        let mut args: Vec<OsString> = vec!["dev".into(), "--data-dir".into()];
        args.push(self.data_dir.clone().into());
        for (flag, value) in [
            ("--listen", format!("127.0.0.1:{}", self.s3_port)),
            ("--grpc-port-base", self.grpc_port_base.to_string()),
            ("--metrics-listen", metrics),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        if self.https {
            args.push("--https".into());
        }
        args
    }
}

/// `sluice dev` could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The binary could not be spawned.
    #[error("spawn {bin}")]
    Spawn {
        /// The binary.
        bin: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Its stdout ended (it exited) before the banner was complete.
    #[error("sluice dev ended its banner early; printed: {printed:?}")]
    Banner {
        /// The lines it printed.
        printed: Vec<String>,
    },
    /// It did not exit within the time given after Ctrl-C.
    #[error("sluice dev did not stop within {0:?} of Ctrl-C")]
    NoExit(Duration),
    /// Signalling or waiting failed.
    #[error("stop sluice dev: {0}")]
    Stop(String),
}

/// A child process killed (and reaped) when dropped, so that a failing
/// test leaves nothing running.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `sluice dev`, killed when dropped. Its stdout is echoed to
/// the caller's (prefixed `sluice dev: `), so a failing test shows it.
#[derive(Debug)]
pub struct Dev {
    child: KillOnDrop,
    options: DevOptions,
    /// The S3 endpoint the banner names (`http://` or `https://`).
    pub endpoint: String,
    /// The metrics URL the banner names (`None` when off).
    pub metrics_url: Option<String>,
    /// The dev CA of an `--https` endpoint, as the banner names it.
    pub ca_bundle: Option<String>,
}

/// The value of a banner line `label: value`.
fn banner_value<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    line.trim().strip_prefix(label).map(str::trim)
}

impl Dev {
    /// Starts `sluice dev` and returns once its banner says every listener
    /// is bound.
    ///
    /// # Errors
    /// [`DevError::Spawn`], or [`DevError::Banner`] when it exits first.
    pub fn start(options: DevOptions) -> Result<Dev, DevError> {
        let mut child = Command::new(&options.bin)
            .args(options.args())
            .env("SLUICE_ACCESS_KEY", &options.access_key)
            .env("SLUICE_SECRET_KEY", &options.secret_key)
            .env("RUST_LOG", &options.log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| DevError::Spawn {
                bin: options.bin.clone(),
                source,
            })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut dev = Dev {
            child: KillOnDrop(child),
            options,
            endpoint: String::new(),
            metrics_url: None,
            ca_bundle: None,
        };
        let mut printed = Vec::new();
        let mut ready = false;
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref().map_while(Result::ok) {
            println!("sluice dev: {line}");
            if let Some(e) = banner_value(&line, "endpoint:") {
                dev.endpoint = e.to_owned();
            }
            if let Some(m) = banner_value(&line, "metrics:") {
                dev.metrics_url = (m != "off").then(|| m.to_owned());
            }
            if let Some(c) = banner_value(&line, "CA bundle:") {
                dev.ca_bundle = Some(c.to_owned());
            }
            ready = line.starts_with(READY_LINE);
            printed.push(line);
            if ready {
                break;
            }
        }
        if !ready || dev.endpoint.is_empty() {
            return Err(DevError::Banner { printed });
        }
        // Keep draining stdout so the process never writes to a closed pipe.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                println!("sluice dev: {line}");
            }
        });
        Ok(dev)
    }

    /// How it was started.
    pub fn options(&self) -> &DevOptions {
        &self.options
    }

    /// Its meta endpoint, `https://127.0.0.1:<grpc port base>`.
    pub fn meta_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.options.grpc_port_base)
    }

    /// The environment that makes `sluice admin` use the admin certificate
    /// `sluice dev` made (`SLUICE_ADMIN_CA`, `_CERT`, `_KEY`).
    pub fn admin_env(&self) -> [(&'static str, PathBuf); 3] {
        let tls = self.options.data_dir.join("tls");
        [
            ("SLUICE_ADMIN_CA", tls.join("ca.pem")),
            ("SLUICE_ADMIN_CERT", tls.join("admin-dev.pem")),
            ("SLUICE_ADMIN_KEY", tls.join("admin-dev.key")),
        ]
    }

    /// Sends SIGINT (Ctrl-C) and waits up to `timeout` for it to exit.
    ///
    /// # Errors
    /// [`DevError::NoExit`] when it is still running (it is killed on
    /// drop), [`DevError::Stop`] when it cannot be signalled or waited for.
    pub fn stop(mut self, timeout: Duration) -> Result<ExitStatus, DevError> {
        crate::cluster::signal(self.child.0.id(), Signal::SIGINT)
            .map_err(|e| DevError::Stop(e.to_string()))?;
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.0.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() >= deadline => return Err(DevError::NoExit(timeout)),
                Ok(None) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => return Err(DevError::Stop(e.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `sluice dev`: prints its arguments and a banner,
    /// then runs until SIGINT, which it answers by exiting 0. (Python, not
    /// sh: a shell cannot trap SIGINT when it starts with SIGINT ignored,
    /// as under `cargo test &`; `sluice dev` installs its handler anyway.)
    const FAKE: &str = r#"#!/usr/bin/env python3
import signal, sys, time
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
print("args:", " ".join(sys.argv[1:]))
print("  endpoint:   https://" + sys.argv[5])
print("  CA bundle:  /x/ca.pem")
print("  metrics:    off")
print("Press Ctrl-C to stop.", flush=True)
while True:
    time.sleep(0.05)
"#;

    #[test]
    fn reads_the_banner_and_stops_on_ctrl_c() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sluice-harness-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("fake-sluice");
        std::fs::write(&bin, FAKE).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options =
            DevOptions::new(&bin, &dir.join("data"), 4100, 4101, ("AK", "SK")).https(true);
        assert_eq!(
            options.args().last().and_then(|a| a.to_str()),
            Some("--https")
        );
        // Another test's fork may briefly hold the new file open for
        // writing (ETXTBSY); try again.
        let dev = (0..50)
            .find_map(|_| match Dev::start(options.clone()) {
                Err(DevError::Spawn { source, .. }) if source.raw_os_error() == Some(26) => {
                    std::thread::sleep(Duration::from_millis(20));
                    None
                }
                other => Some(other),
            })
            .unwrap()
            .unwrap();
        assert_eq!(dev.endpoint, "https://127.0.0.1:4100");
        assert_eq!(dev.ca_bundle.as_deref(), Some("/x/ca.pem"));
        assert_eq!(dev.metrics_url, None);
        assert_eq!(dev.meta_url(), "https://127.0.0.1:4101");
        assert_eq!(dev.admin_env()[0].1, dir.join("data/tls/ca.pem"));
        let status = dev.stop(Duration::from_secs(10)).unwrap();
        assert!(status.success(), "{status}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kill_on_drop_kills_and_reaps() {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let proc_dir = PathBuf::from(format!("/proc/{}", child.id()));
        assert!(proc_dir.exists());
        drop(KillOnDrop(child));
        assert!(!proc_dir.exists(), "still there after the drop");
    }

    #[test]
    fn an_early_exit_is_an_error() {
        let options = DevOptions::new(
            Path::new("true"),
            Path::new("/nonexistent"),
            1,
            2,
            ("a", "b"),
        );
        let err = Dev::start(options).unwrap_err();
        assert!(
            matches!(err, DevError::Banner { ref printed } if printed.is_empty()),
            "{err:?}"
        );
    }
}
