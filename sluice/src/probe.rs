//! `sluice health`: asks a running role for `/health/ready` (or
//! `/health/live`) and exits 0 when it answers 200, 1 otherwise. Used by
//! the container image's `HEALTHCHECK`, systemd units and scripts, so none
//! of them needs curl.
//!
//! The role serves its health endpoints on the config's `metrics_listen`
//! (plain HTTP/1.1; see [`crate::telemetry`]); `--config` reads that
//! address from any role's TOML file, `--url` names it directly.
//!
//! Also here: [`sd_notify`], systemd's readiness notification
//! (`sd_notify(3)`), sent once a role's listener is bound.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use crate::health::reachable;

/// Longest the probe waits to connect, and then for the whole answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Most bytes of the answer read (the reason text is short).
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// `sluice health`.
#[derive(Args, Debug)]
pub struct HealthArgs {
    /// The role's TOML config; its `metrics_listen` is asked (an unspecified
    /// address such as 0.0.0.0 is asked on loopback).
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Ask this base URL instead, e.g. `http://10.0.0.11:7091` (wins over
    /// --config and SLUICE_CONFIG, which the container image sets).
    #[arg(long)]
    pub url: Option<String>,
    /// Ask `/health/live` (serving at all) instead of `/health/ready`.
    #[arg(long)]
    pub live: bool,
}

/// Runs `sluice health`: prints the answer's first line and reason, and
/// returns whether it was 200.
pub fn run(args: HealthArgs) -> anyhow::Result<bool> {
    let addr = match (&args.config, &args.url) {
        (_, Some(url)) => addr_of_url(url)?,
        (Some(config), None) => metrics_addr_of(config)?,
        (None, None) => bail!("give --config (or SLUICE_CONFIG) or --url"),
    };
    let path = if args.live {
        "/health/live"
    } else {
        "/health/ready"
    };
    match get(addr, path) {
        Ok((status, body)) => {
            println!("{status} {}", body.trim());
            Ok(status == 200)
        }
        Err(e) => {
            println!("unreachable: {e:#}");
            Ok(false)
        }
    }
}

/// The `metrics_listen` address of a role's config, made reachable from
/// this host.
fn metrics_addr_of(config: &std::path::Path) -> anyhow::Result<SocketAddr> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("reading config {}", config.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing config {}", config.display()))?;
    let Some(listen) = table.get("metrics_listen").and_then(|v| v.as_str()) else {
        bail!(
            "{} sets no metrics_listen: health is served there",
            config.display()
        );
    };
    let addr: SocketAddr = listen
        .parse()
        .with_context(|| format!("metrics_listen {listen:?}"))?;
    Ok(reachable(addr))
}

fn addr_of_url(url: &str) -> anyhow::Result<SocketAddr> {
    let rest = url
        .strip_prefix("http://")
        .context("--url must start with http:// (health is served in plain HTTP)")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .to_socket_addrs()
        .with_context(|| format!("resolving {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to no address"))
}

/// One HTTP/1.1 GET with `Connection: close`; returns the status code and
/// the body (RFC 9112 §3 and §4: status line, headers, blank line).
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    // One write (`write!` on the socket would send each piece on its own).
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    // Bounded: at most MAX_ANSWER_BYTES are read.
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut answer)
        .with_context(|| format!("reading the answer of {addr}"))?;
    parse_answer(&answer)
}

fn parse_answer(answer: &[u8]) -> anyhow::Result<(u16, String)> {
    let text = String::from_utf8_lossy(answer);
    let status = text
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .context("not an HTTP/1.x answer")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .unwrap_or_default();
    Ok((status, body.to_string()))
}

/// Sends `state` (e.g. `READY=1`, `STOPPING=1`) to systemd when the process
/// runs under a `Type=notify` unit (`$NOTIFY_SOCKET` set); does nothing
/// otherwise. A socket name starting with `@` is in the abstract namespace
/// (sd_notify(3)).
pub fn sd_notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send_notify(&socket, state) {
        tracing::warn!(error = %e, state, "sd_notify failed");
    }
}

fn send_notify(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
    let bytes = socket.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            UnixAddr::from_abstract_name(name)?
        }
        None => UnixAddr::from_pathname(std::path::Path::new(socket))?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a request head (through the blank line): answering and closing
    /// before all of it arrived would reset the connection.
    fn read_head(s: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    #[test]
    fn parses_status_and_body() {
        let (code, body) =
            parse_answer(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\n\r\nnot ready")
                .unwrap();
        assert_eq!(code, 503);
        assert_eq!(body, "not ready");
        assert!(parse_answer(b"SSH-2.0-OpenSSH").is_err());
    }

    #[test]
    fn reads_metrics_listen_of_any_role() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("datanode.toml");
        std::fs::write(&config, "node_id = 3\nmetrics_listen = \"0.0.0.0:7191\"\n").unwrap();
        assert_eq!(
            metrics_addr_of(&config).unwrap(),
            "127.0.0.1:7191".parse().unwrap()
        );
        std::fs::write(&config, "node_id = 3\n").unwrap();
        let e = metrics_addr_of(&config).unwrap_err().to_string();
        assert!(e.contains("sets no metrics_listen"), "{e}");
    }

    #[test]
    fn probes_a_real_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let request = read_head(&mut s);
            s.write_all(b"HTTP/1.1 200 OK\r\n\r\nready").unwrap();
            request
        });
        let (code, body) = get(addr, "/health/ready").unwrap();
        assert_eq!((code, body.as_str()), (200, "ready"));
        assert!(
            server
                .join()
                .unwrap()
                .starts_with("GET /health/ready HTTP/1.1\r\n")
        );
    }

    #[test]
    fn url_wins_over_config() {
        // The container image sets SLUICE_CONFIG; `sluice health --url` in
        // it must still ask the URL (the config file need not even exist).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            read_head(&mut s);
            s.write_all(b"HTTP/1.1 200 OK\r\n\r\nready").unwrap();
        });
        let args = HealthArgs {
            config: Some(PathBuf::from("/nonexistent/sluice.toml")),
            url: Some(format!("http://{addr}")),
            live: false,
        };
        assert!(run(args).unwrap());
        server.join().unwrap();
    }

    #[test]
    fn notifies_a_datagram_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        send_notify(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
