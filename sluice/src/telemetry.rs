//! Prometheus metrics and health checks of a `sluice` process.
//!
//! The listener of `metrics_listen` serves `GET /metrics`, `GET
//! /health/live` (200 while the process runs) and `GET /health/ready`
//! (the role's readiness, see [`crate::health`]): 200 or 503 with a
//! one-line reason. Health shares the metrics listener, so a role has
//! health checks on it exactly when `metrics_listen` is set (the gateway
//! also answers both on its S3 port, unauthenticated).
//!
//! The role libraries record through the `metrics` facade; this module
//! installs the process's one recorder (a Prometheus exporter), keeps the
//! process gauges up to date and serves the text exposition on
//! `GET /metrics` over a small HTTP/1 server. One recorder per process is
//! why the binary, not the roles, does this: `sluice dev` runs every role in
//! one process and serves them all on one endpoint.
//!
//! Process metrics:
//! * `sluice_process_resident_memory_bytes` — RSS (`VmRSS` of
//!   `/proc/self/status`), sampled every [`SAMPLE_INTERVAL`];
//! * `sluice_process_budget_bytes{node, budget}` — every effective memory
//!   budget (see [`crate::budget`]);
//! * `sluice_process_memory_limit_bytes` — the limit the defaults came from;
//! * `sluice_build_info{version, allocator}` — always 1.
//!
//! Histograms whose name ends in `_seconds` get [`SECONDS_BUCKETS`].
//!
//! # Layout
//!
//! * [`install`]: build and install the recorder.
//! * [`MetricsServer::start`]: process gauges, sampler and upkeep task, HTTP endpoint.
//! * `respond`: the request handler; `parse_vm_rss`: the `/proc` parser.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use sluice_gateway::health::{Health, LIVE_PATH, READY_PATH};

use crate::budget::{Budget, MemoryLimit};
pub use crate::health::ReadyProbe;

/// Gauge: resident set size of this process, bytes.
pub const RESIDENT_MEMORY_BYTES: &str = "sluice_process_resident_memory_bytes";
/// Gauge, labels `node` and `budget`: an effective memory budget, bytes.
pub const BUDGET_BYTES: &str = "sluice_process_budget_bytes";
/// Gauge: the memory limit the budget defaults derive from, bytes.
pub const MEMORY_LIMIT_BYTES: &str = "sluice_process_memory_limit_bytes";
/// Gauge, labels `version` and `allocator`: 1.
pub const BUILD_INFO: &str = "sluice_build_info";

/// Bucket upper bounds (seconds) of every histogram named `*_seconds`:
/// 100 µs to 60 s, about three per decade.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// How often RSS is sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the exporter's upkeep runs (drains recorded histogram samples
/// into buckets, so their memory stays bounded between scrapes).
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Most scrape connections served at once; more wait in the TCP backlog.
pub const MAX_SCRAPE_CONNECTIONS: usize = 8;
/// A scrape connection is closed after this long, answered or not.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the Prometheus recorder and installs it as the process's global
/// `metrics` recorder. Fails if one is installed already. Call it before
/// starting any role, so their metric handles bind to it.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    builder()?
        .install_recorder()
        .context("installing the Prometheus recorder")
}

fn builder() -> anyhow::Result<PrometheusBuilder> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .context("configuring histogram buckets")
}

/// The running `/metrics` endpoint and its sampler; both stop when this is
/// dropped.
pub struct MetricsServer {
    local_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl MetricsServer {
    /// Sets the process gauges (build info, memory limit, `budgets`, a first
    /// RSS sample), spawns the sampler/upkeep task and serves `GET /metrics`
    /// rendered from `handle` on `listener`. Must run inside a Tokio runtime.
    pub fn start(
        listener: TcpListener,
        handle: PrometheusHandle,
        allocator: &'static str,
        limit: &MemoryLimit,
        budgets: &[Budget],
        ready: ReadyProbe,
    ) -> anyhow::Result<MetricsServer> {
        let local_addr = listener.local_addr()?;
        describe();
        metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "allocator" => allocator)
            .set(1.0);
        metrics::gauge!(MEMORY_LIMIT_BYTES).set(limit.bytes as f64);
        for b in budgets {
            metrics::gauge!(BUDGET_BYTES, "node" => b.node.clone(), "budget" => b.budget)
                .set(b.bytes as f64);
        }
        sample_rss();
        let sampler = tokio::spawn(sample_and_upkeep(handle.clone()));
        let server = tokio::spawn(serve(listener, handle, ready));
        Ok(MetricsServer {
            local_addr,
            tasks: vec![sampler, server],
        })
    }

    /// The address `/metrics` is served on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn describe() {
    metrics::describe_gauge!(
        RESIDENT_MEMORY_BYTES,
        metrics::Unit::Bytes,
        "Resident set size of this process"
    );
    metrics::describe_gauge!(
        BUDGET_BYTES,
        metrics::Unit::Bytes,
        "Effective memory budget of a role in this process"
    );
    metrics::describe_gauge!(
        MEMORY_LIMIT_BYTES,
        metrics::Unit::Bytes,
        "Memory limit (cgroup, else physical RAM) the budget defaults derive from"
    );
    metrics::describe_gauge!(BUILD_INFO, "Version and allocator of this binary");
}

/// Samples RSS every [`SAMPLE_INTERVAL`] and runs the exporter's upkeep
/// every [`UPKEEP_INTERVAL`]. Runs until aborted.
async fn sample_and_upkeep(handle: PrometheusHandle) {
    let mut samples = tokio::time::interval(SAMPLE_INTERVAL);
    samples.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut upkeep = tokio::time::interval(UPKEEP_INTERVAL);
    upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = samples.tick() => sample_rss(),
            _ = upkeep.tick() => handle.run_upkeep(),
        }
    }
}

fn sample_rss() {
    match std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| parse_vm_rss(&t))
    {
        Some(bytes) => metrics::gauge!(RESIDENT_MEMORY_BYTES).set(bytes as f64),
        None => tracing::debug!("no VmRSS in /proc/self/status"),
    }
}

/// Parses `VmRSS` out of `/proc/self/status` (`VmRSS: 23456 kB`, tab separated), in bytes.
pub fn parse_vm_rss(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line["VmRSS:".len()..].split_whitespace();
    let kib: u64 = fields.next()?.parse().ok()?;
    (fields.next() == Some("kB")).then_some(kib.checked_mul(1024)?)
}

/// Serves `/metrics` and `/health/live|ready` on `listener`, at most
/// [`MAX_SCRAPE_CONNECTIONS`] connections at once, each closed after one
/// request or [`SCRAPE_TIMEOUT`]. Runs until aborted.
async fn serve(listener: TcpListener, handle: PrometheusHandle, ready: ReadyProbe) {
    let handler: crate::http::Handler = Arc::new(move |method: Method, path: String| {
        let (handle, ready) = (handle.clone(), Arc::clone(&ready));
        Box::pin(async move {
            match (&method, path.as_str()) {
                (&Method::GET | &Method::HEAD, LIVE_PATH) => {
                    health_response(&Health::ok("live: process up"))
                }
                (&Method::GET | &Method::HEAD, READY_PATH) => health_response(&ready().await),
                _ => respond(&method, &path, &handle),
            }
        })
    });
    crate::http::serve(
        listener,
        MAX_SCRAPE_CONNECTIONS,
        SCRAPE_TIMEOUT,
        handler,
        "metrics",
    )
    .await
}

/// A health answer: 200 or 503, the reason as one line of text.
fn health_response(health: &Health) -> Response<Full<Bytes>> {
    crate::http::text(health.status(), format!("{}\n", health.reason))
}

/// `GET /metrics` renders the exposition; other paths 404, other methods 405.
fn respond(method: &Method, path: &str, handle: &PrometheusHandle) -> Response<Full<Bytes>> {
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/metrics") => crate::http::respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            handle.render(),
        ),
        (_, "/metrics") => crate::http::text(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics\n"),
        _ => crate::http::text(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn vm_rss() {
        let status =
            "Name:\tsluice\nVmPeak:\t  123456 kB\nVmRSS:\t   23456 kB\nRssAnon:\t 1000 kB\n";
        assert_eq!(parse_vm_rss(status), Some(23_456 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\t12 MB\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tmany kB\n"), None);
        let own = std::fs::read_to_string("/proc/self/status").expect("status");
        assert!(parse_vm_rss(&own).expect("own VmRSS") > 0);
    }

    async fn request(addr: SocketAddr, head: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("write");
        let mut out = String::new();
        // keep_alive(false): the server closes after one response.
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut out))
            .await
            .expect("response within 10s")
            .expect("read");
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_rejects_the_rest() {
        // A recorder of this test's own, not the global one.
        let recorder = builder().expect("builder").build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::gauge!(RESIDENT_MEMORY_BYTES).set(4096.0);
            metrics::histogram!("sluice_test_latency_seconds").record(0.003);
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(serve(
            listener,
            handle,
            crate::health::fixed(Health::failing("not ready: test")),
        ));

        let live = request(addr, "GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(live.starts_with("HTTP/1.1 200 OK\r\n"), "{live}");
        assert!(live.ends_with("\r\n\r\nlive: process up\n"), "{live}");
        let ready = request(addr, "GET /health/ready HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            ready.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{ready}"
        );
        assert!(ready.ends_with("\r\n\r\nnot ready: test\n"), "{ready}");

        let ok = request(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("content-type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(
            ok.contains("\nsluice_process_resident_memory_bytes 4096\n"),
            "{ok}"
        );
        // `_seconds` histograms have the configured buckets, not quantiles.
        assert!(
            ok.contains("sluice_test_latency_seconds_bucket{le=\"0.005\"} 1\n"),
            "{ok}"
        );
        assert!(
            ok.contains("sluice_test_latency_seconds_bucket{le=\"0.0025\"} 0\n"),
            "{ok}"
        );

        let missing = request(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = request(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        server.abort();
    }

    #[tokio::test]
    async fn more_scrapers_than_permits_are_all_served() {
        let recorder = builder().expect("builder").build_recorder();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(serve(
            listener,
            recorder.handle(),
            crate::health::fixed(Health::ok("ready")),
        ));
        let scrapes = (0..MAX_SCRAPE_CONNECTIONS * 3)
            .map(|_| request(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
        for response in futures::future::join_all(scrapes).await {
            assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        }
        server.abort();
    }
}
