//! The soak cluster: one meta node, six datanodes and one gateway, each a
//! separate `sluice` process on loopback, so that each RSS is its own.
//!
//! [`Cluster::start`] reserves free ports, writes one TOML config per
//! process under `<work dir>/<label>/`, starts the processes with their
//! output in `<out dir>/logs/<label>/<name>.log`, and waits until the
//! gateway accepts a write (bucket created, probe object put). The RSS of
//! every process right then is the cluster's baseline. [`Cluster::stop`]
//! sends SIGTERM (gateway first, then datanodes, then meta), SIGKILL after
//! a timeout, and removes the data unless asked to keep it. Children are
//! also killed if the cluster is dropped without being stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::primitives::ByteStream;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::process::Child;
use tokio::time::Instant;

use super::config::{
    AcceptedKeys, GatewayAccess, KnobOutcome, Placement, Role, datanode_config, gateway_config,
    meta_config, resolve_knobs, write_config,
};
use super::error::SoakError;
use super::options::Knobs;
use crate::error::BoxError;
use crate::rss::ProcTarget;
use crate::s3::{ChecksumMode, ClientOptions, ErrorTally, build_client, ensure_bucket};
use sluice_harness::cluster::{self, Launch, LaunchError, NotReady};

/// Datanodes in the cluster: k + m of the gateway's default 4+2 layout.
pub const DATANODES: u64 = 6;
/// Pause between two readiness probes.
const READY_POLL: Duration = Duration::from_millis(250);
/// Time limit of one readiness probe request.
const READY_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Key of the readiness probe object.
const READY_KEY: &str = "soak-ready-probe";
/// Size of the readiness probe object: above the largest `inline_max_bytes`
/// a gateway accepts (64 KiB), so that it is stored on the datanodes, not
/// inline in its metadata record; a cluster that only stores inline bodies
/// is not ready for the shapes (their first parts would get `503 Not enough
/// storage nodes`).
const READY_PROBE_BYTES: usize = 128 * 1024;
/// Log lines quoted when a process exits during startup.
const LOG_TAIL_LINES: usize = 30;

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Names the cluster's directories: `main` or `overload`.
    pub label: &'static str,
    /// The `sluice` binary.
    pub bin: PathBuf,
    /// Configs and data go in `<work_dir>/<label>/`.
    pub work_dir: PathBuf,
    /// Logs go in `<log_dir>/<label>/`.
    pub log_dir: PathBuf,
    /// Budgets and admission settings.
    pub knobs: Knobs,
    /// Whether `knobs` come from the `--overload-*` flags.
    pub overload: bool,
    /// Keys the binary accepts.
    pub accepted: AcceptedKeys,
    /// RUST_LOG of the processes.
    pub log_filter: String,
    /// Startup limit.
    pub ready_timeout: Duration,
    /// S3 settings of the gateway.
    pub access: GatewayAccess,
    /// Bucket the readiness probe creates.
    pub bucket: String,
    /// Further keys per role, written as given (after the knobs), e.g. the
    /// heal benchmark's gateway heal settings. The caller checks that the
    /// binary accepts them.
    pub extra: BTreeMap<Role, toml::Table>,
    /// Plaintext internal gRPC (`insecure_cluster = true`) instead of
    /// mutual TLS (see [`secure_configs`]).
    pub insecure_cluster: bool,
    /// S3 over HTTPS with a certificate from the cluster CA (needs cluster
    /// TLS; see [`secure_configs`]).
    pub s3_https: bool,
}

/// One process of the cluster.
#[derive(Debug)]
pub struct Process {
    /// `meta`, `dn1`..`dn6` or `gateway`.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// OS process id.
    pub pid: u32,
    /// Its log file.
    pub log: PathBuf,
    /// `http://127.0.0.1:PORT/metrics`, when the binary serves metrics.
    pub metrics_url: Option<String>,
    /// The role's memory budgets summed (the RSS bound is baseline + this
    /// + the gateway's client terms + slack), bytes.
    pub budget_bytes: u64,
    /// RSS right after the cluster became writable, bytes.
    pub baseline_bytes: Option<u64>,
    /// Its config file (a restart starts it again from this).
    pub config: PathBuf,
    /// Its data directory (meta and datanodes; unused by the gateway).
    pub data_dir: PathBuf,
    /// Port of its main listener on 127.0.0.1.
    pub port: u16,
    /// Times it was started again after the cluster start.
    pub restarts: u32,
    child: Child,
}

/// How a process ended when the cluster was stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessExit {
    /// Process name.
    pub name: String,
    /// Exit status as printed by the OS (`exit status: 0`, `signal: 9`).
    pub status: String,
    /// Whether it needed SIGKILL.
    pub killed: bool,
}

/// A running soak cluster.
#[derive(Debug)]
pub struct Cluster {
    /// `main` or `overload`.
    pub label: &'static str,
    /// S3 endpoint of the gateway.
    pub endpoint: String,
    /// CA the S3 clients trust (PEM), when S3 is served over HTTPS.
    pub ca_bundle: Option<PathBuf>,
    /// meta, dn1..dn6, gateway, in that order.
    pub processes: Vec<Process>,
    /// Which knobs were written into the configs.
    pub knobs: Vec<KnobOutcome>,
    /// Configs and data.
    pub dir: PathBuf,
    /// The `sluice` binary (for restarts).
    bin: PathBuf,
    /// RUST_LOG of the processes (for restarts).
    log_filter: String,
}

/// How long [`Cluster::restart`] waits for a restarted process to accept
/// connections on its main port.
pub const RESTART_READY_TIMEOUT: Duration = Duration::from_secs(60);

fn reserve_ports(n: usize) -> Result<Vec<u16>, SoakError> {
    cluster::reserve_ports(n).map_err(SoakError::Port)
}

fn create_dir(path: &Path) -> Result<(), SoakError> {
    std::fs::create_dir_all(path).map_err(|source| SoakError::Filesystem {
        action: "create",
        path: path.to_owned(),
        source,
    })
}

pub use sluice_harness::cluster::log_tail;

impl Cluster {
    /// Writes the configs, starts every process and waits until the
    /// cluster accepts a write; records each process's baseline RSS.
    ///
    /// # Errors
    /// Unsupported explicit knobs, I/O on the work or log directory, a
    /// process that cannot be started or exits during startup, or no
    /// successful write within the spec's `ready_timeout`.
    pub async fn start(spec: &ClusterSpec) -> Result<Cluster, SoakError> {
        let (mut extra, knobs) = resolve_knobs(&spec.knobs, spec.overload, &spec.accepted)?;
        for (role, table) in &spec.extra {
            extra.entry(*role).or_default().extend(table.clone());
        }
        let dir = spec.work_dir.join(spec.label);
        let log_dir = spec.log_dir.join(spec.label);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| SoakError::Filesystem {
                action: "remove",
                path: dir.clone(),
                source,
            })?;
        }
        create_dir(&dir)?;
        create_dir(&log_dir)?;

        let count = 2 + DATANODES as usize;
        let ports = reserve_ports(2 * count)?;
        let place = |i: usize, role: Role, name: &str| Placement {
            port: ports[i],
            // Only where the binary is known to serve metrics.
            metrics_port: spec
                .accepted
                .lists(role, "metrics_listen")
                .then_some(ports[count + i]),
            data_dir: dir.join(name).join("data"),
        };
        let meta_port = ports[0];
        let mut planned: Vec<(String, Role, Placement, toml::Table)> = Vec::new();
        let meta_at = place(0, Role::Meta, "meta");
        let meta = meta_config(&meta_at, extra.get(&Role::Meta));
        planned.push(("meta".into(), Role::Meta, meta_at, meta));
        for id in 1..=DATANODES {
            let name = format!("dn{id}");
            let at = place(id as usize, Role::Datanode, &name);
            let config = datanode_config(id, &at, meta_port, extra.get(&Role::Datanode));
            planned.push((name, Role::Datanode, at, config));
        }
        let gw_at = place(count - 1, Role::Gateway, "gateway");
        let mut gw = gateway_config(&gw_at, meta_port, &spec.access, extra.get(&Role::Gateway));
        // Plain HTTP to S3 unless `s3_https`; a gateway that knows the key
        // must be told so explicitly (it serves HTTPS otherwise).
        if !spec.s3_https && spec.accepted.lists(Role::Gateway, "s3_plaintext") {
            gw.entry("s3_plaintext")
                .or_insert(toml::Value::Boolean(true));
        }
        let scheme = if spec.s3_https { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{}", gw_at.port);
        planned.push(("gateway".into(), Role::Gateway, gw_at, gw));
        let ca_bundle = secure_configs(spec, &dir, &mut planned).await?;

        let budgets = role_budgets(&spec.knobs);
        let mut cluster = Cluster {
            label: spec.label,
            endpoint,
            ca_bundle,
            processes: Vec::with_capacity(count),
            knobs,
            dir,
            bin: spec.bin.clone(),
            log_filter: spec.log_filter.clone(),
        };
        for (name, role, at, config) in planned {
            let process_dir = cluster.dir.join(&name);
            create_dir(&process_dir)?;
            let config_path = process_dir.join(format!("{}.toml", role.as_str()));
            write_config(role, &config, &config_path)?;
            let log = log_dir.join(format!("{name}.log"));
            let child = spawn(
                &spec.bin,
                role,
                &config_path,
                &log,
                &spec.log_filter,
                &name,
                false,
            )?;
            let pid = child.id().unwrap_or(0);
            tracing::info!(process = %name, pid, port = at.port, "started");
            cluster.processes.push(Process {
                name,
                role,
                pid,
                log,
                metrics_url: at
                    .metrics_port
                    .map(|p| format!("http://127.0.0.1:{p}/metrics")),
                budget_bytes: budgets.get(&role).copied().unwrap_or(0),
                baseline_bytes: None,
                config: config_path,
                data_dir: at.data_dir.clone(),
                port: at.port,
                restarts: 0,
                child,
            });
        }
        cluster.wait_ready(spec).await?;
        for p in &mut cluster.processes {
            p.baseline_bytes = p.target().rss_bytes().ok().flatten();
        }
        Ok(cluster)
    }

    async fn wait_ready(&mut self, spec: &ClusterSpec) -> Result<(), SoakError> {
        let client = build_client(
            &ClientOptions {
                endpoint: self.endpoint.clone(),
                ca_bundle: self.ca_bundle.clone(),
                region: spec.access.region.clone(),
                access_key: spec.access.access_key.clone(),
                secret_key: spec.access.secret_key.clone(),
                max_attempts: 1,
                initial_backoff: Duration::from_millis(100),
                attempt_timeout: READY_ATTEMPT_TIMEOUT,
                checksum: ChecksumMode::WhenSupported,
            },
            Arc::new(ErrorTally::default()),
        );
        let started = Instant::now();
        let deadline = started + spec.ready_timeout;
        loop {
            if let Some((name, status)) = self.exited().into_iter().next() {
                let log = self
                    .processes
                    .iter()
                    .find(|p| p.name == name)
                    .map(|p| p.log.clone())
                    .unwrap_or_default();
                return Err(SoakError::Exited {
                    tail: log_tail(&log, LOG_TAIL_LINES),
                    name,
                    status,
                    log,
                });
            }
            match probe_write(&client, &spec.bucket, &spec.access.region).await {
                Ok(()) => {
                    tracing::info!(cluster = self.label, endpoint = %self.endpoint, after = ?started.elapsed(), "cluster writable");
                    return Ok(());
                }
                Err(source) if Instant::now() >= deadline => {
                    return Err(SoakError::NotReady {
                        waited: started.elapsed(),
                        source,
                    });
                }
                Err(e) => tracing::debug!(error = %e, "cluster not writable yet"),
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// `name=pid` pairs of every process, for `multipart-put --pids`.
    pub fn pids_spec(&self) -> String {
        self.processes
            .iter()
            .map(|p| format!("{}={}", p.name, p.pid))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Processes that have exited, with their status.
    pub fn exited(&mut self) -> Vec<(String, String)> {
        let mut gone = Vec::new();
        for p in &mut self.processes {
            match p.child.try_wait() {
                Ok(Some(status)) => gone.push((p.name.clone(), status.to_string())),
                Ok(None) => {}
                Err(e) => gone.push((p.name.clone(), format!("cannot wait: {e}"))),
            }
        }
        gone
    }

    fn process_mut(&mut self, name: &str) -> Result<&mut Process, SoakError> {
        self.processes
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| SoakError::NoSuchProcess {
                name: name.to_owned(),
            })
    }

    /// Kills process `name` with SIGKILL (no shutdown of any kind, as a
    /// crash or power loss) and reaps it; returns its exit. A process that
    /// had already exited is only reaped.
    ///
    /// # Errors
    /// [`SoakError::NoSuchProcess`].
    pub async fn kill(&mut self, name: &str) -> Result<ProcessExit, SoakError> {
        let p = self.process_mut(name)?;
        let already = matches!(p.child.try_wait(), Ok(Some(_)));
        if !already {
            // ESRCH races (it exited just now) are settled by the wait below.
            let _ = p.child.start_kill();
        }
        let status = match p.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => format!("cannot wait: {e}"),
        };
        tracing::info!(process = name, pid = p.pid, %status, "killed with SIGKILL");
        Ok(ProcessExit {
            name: name.to_owned(),
            status,
            killed: !already,
        })
    }

    /// Starts process `name` again from its config (same port, same node
    /// id, same data directory), its output appended to the same log, and
    /// waits until it accepts TCP connections on its main port. The
    /// process must have exited (see [`Cluster::kill`]).
    ///
    /// # Errors
    /// [`SoakError::NoSuchProcess`], [`SoakError::StillRunning`],
    /// [`SoakError::Spawn`], [`SoakError::Exited`] when it exits before it
    /// listens, [`SoakError::RestartNotReady`] after [`RESTART_READY_TIMEOUT`].
    pub async fn restart(&mut self, name: &str) -> Result<u32, SoakError> {
        let (bin, log_filter) = (self.bin.clone(), self.log_filter.clone());
        let p = self.process_mut(name)?;
        if matches!(p.child.try_wait(), Ok(None)) {
            return Err(SoakError::StillRunning {
                name: name.to_owned(),
            });
        }
        p.child = spawn(&bin, p.role, &p.config, &p.log, &log_filter, &p.name, true)?;
        p.pid = p.child.id().unwrap_or(0);
        p.restarts += 1;
        tracing::info!(process = name, pid = p.pid, port = p.port, "started again");
        wait_listening(p, RESTART_READY_TIMEOUT).await?;
        Ok(p.pid)
    }

    /// The wiped-disk path: kills `name` with SIGKILL, removes its data
    /// directory entirely and starts it again from its config (same port,
    /// same node id). A datanode then formats an empty data dir with a new
    /// disk id. Returns the new pid.
    ///
    /// # Errors
    /// As [`Cluster::kill`] and [`Cluster::restart`]; [`SoakError::Filesystem`]
    /// when the data directory cannot be removed.
    pub async fn restart_wiped(&mut self, name: &str) -> Result<u32, SoakError> {
        self.kill(name).await?;
        let data_dir = self.process_mut(name)?.data_dir.clone();
        match std::fs::remove_dir_all(&data_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SoakError::Filesystem {
                    action: "remove",
                    path: data_dir,
                    source,
                });
            }
        }
        tracing::info!(process = name, dir = %data_dir.display(), "data directory wiped");
        self.restart(name).await
    }

    /// Stops every process (SIGTERM; SIGKILL after `timeout`): gateway,
    /// then datanodes, then meta. Removes the data directory unless `keep`.
    pub async fn stop(mut self, timeout: Duration, keep: bool) -> Vec<ProcessExit> {
        let mut exits = Vec::new();
        for role in [Role::Gateway, Role::Datanode, Role::Meta] {
            let group: Vec<&mut Process> = self
                .processes
                .iter_mut()
                .filter(|p| p.role == role)
                .collect();
            for p in &group {
                if let Ok(pid) = i32::try_from(p.pid)
                    && pid > 0
                {
                    // ESRCH: already gone; its status is collected below.
                    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
                }
            }
            for p in group {
                exits.push(stop_one(p, timeout).await);
            }
        }
        if keep {
            tracing::info!(dir = %self.dir.display(), "cluster data kept");
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove cluster data");
        }
        exits
    }
}

impl Process {
    /// This process as an RSS sampling target.
    pub fn target(&self) -> ProcTarget {
        ProcTarget {
            name: self.name.clone(),
            pid: self.pid,
        }
    }
}

/// Waits until `p` accepts TCP connections on its main port.
async fn wait_listening(p: &mut Process, timeout: Duration) -> Result<(), SoakError> {
    let port = p.port;
    match cluster::wait_ready(&mut p.child, timeout, READY_POLL, || {
        cluster::tcp_listening(port)
    })
    .await
    {
        Ok(()) => Ok(()),
        Err(NotReady::Exited(status)) => Err(SoakError::Exited {
            name: p.name.clone(),
            status,
            log: p.log.clone(),
            tail: log_tail(&p.log, LOG_TAIL_LINES),
        }),
        Err(NotReady::Timeout(waited)) => Err(SoakError::RestartNotReady {
            name: p.name.clone(),
            port,
            waited,
        }),
    }
}

async fn stop_one(p: &mut Process, timeout: Duration) -> ProcessExit {
    let exit = cluster::wait_or_kill(&mut p.child, &p.name, timeout).await;
    ProcessExit {
        name: p.name.clone(),
        status: exit.status,
        killed: exit.killed,
    }
}

/// Cluster security of the planned configs. By default mutual TLS: a CA
/// and one certificate per process, made by the binary's `sluice admin
/// certs` in `<dir>/tls`, and each config's `[cluster_tls]` pointing at
/// them; with `spec.insecure_cluster`, `insecure_cluster = true`. A binary
/// whose configs do not list `insecure_cluster` (older than cluster TLS)
/// gets neither. With `spec.s3_https` the gateway also gets `[s3_tls]`, a
/// certificate for 127.0.0.1 from the same CA, whose `ca.pem` is returned
/// for the S3 clients to trust.
async fn secure_configs(
    spec: &ClusterSpec,
    dir: &Path,
    planned: &mut [(String, Role, Placement, toml::Table)],
) -> Result<Option<PathBuf>, SoakError> {
    let roles = [Role::Meta, Role::Datanode, Role::Gateway];
    if !roles
        .iter()
        .all(|r| spec.accepted.lists(*r, "insecure_cluster"))
    {
        return Ok(None);
    }
    if spec.insecure_cluster {
        for (_, _, _, table) in planned.iter_mut() {
            table.insert("insecure_cluster".into(), toml::Value::Boolean(true));
        }
        return Ok(None);
    }
    let tls = dir.join("tls");
    let tls_arg = tls.display().to_string();
    admin_certs(&spec.bin, &["init", "--dir", &tls_arg]).await?;
    for (name, role, _, table) in planned.iter_mut() {
        let id = match role {
            Role::Meta => "1".to_owned(),
            Role::Datanode => name.trim_start_matches("dn").to_owned(),
            Role::Gateway => name.clone(),
        };
        admin_certs(
            &spec.bin,
            &[
                "issue",
                "--dir",
                &tls_arg,
                "--role",
                role.as_str(),
                "--id",
                &id,
            ],
        )
        .await?;
        let file = |f: String| toml::Value::String(tls.join(f).display().to_string());
        let mut section = toml::Table::new();
        section.insert("ca_file".into(), file("ca.pem".into()));
        section.insert(
            "cert_file".into(),
            file(format!("{}-{id}.pem", role.as_str())),
        );
        section.insert(
            "key_file".into(),
            file(format!("{}-{id}.key", role.as_str())),
        );
        table.insert("cluster_tls".into(), toml::Value::Table(section));
    }
    if !spec.s3_https {
        return Ok(None);
    }
    admin_certs(
        &spec.bin,
        &[
            "issue",
            "--dir",
            &tls_arg,
            "--role",
            "gateway",
            "--id",
            "s3",
            "--ip",
            "127.0.0.1",
        ],
    )
    .await?;
    let file = |f: &str| toml::Value::String(tls.join(f).display().to_string());
    for (_, role, _, table) in planned.iter_mut() {
        if *role == Role::Gateway {
            let mut section = toml::Table::new();
            section.insert("cert_file".into(), file("gateway-s3.pem"));
            section.insert("key_file".into(), file("gateway-s3.key"));
            table.insert("s3_tls".into(), toml::Value::Table(section));
        }
    }
    Ok(Some(tls.join("ca.pem")))
}

/// Runs `<bin> admin certs <args>`.
async fn admin_certs(bin: &Path, args: &[&str]) -> Result<(), SoakError> {
    cluster::admin_certs(bin, args)
        .await
        .map_err(|e| SoakError::Certs {
            command: e.command,
            message: e.message,
        })
}

fn spawn(
    bin: &Path,
    role: Role,
    config: &Path,
    log: &Path,
    log_filter: &str,
    name: &str,
    append: bool,
) -> Result<Child, SoakError> {
    Launch::new(bin, role, config, log, log_filter)
        .append(append)
        .spawn()
        .map_err(|e| match e {
            LaunchError::Log { path, source } => SoakError::Filesystem {
                action: "create",
                path,
                source,
            },
            LaunchError::Spawn { source, .. } => SoakError::Spawn {
                name: name.to_owned(),
                path: bin.to_owned(),
                source,
            },
        })
}

/// The sum of each role's memory budgets in `knobs`, bytes: meta its sled
/// cache, a datanode its write budget, the gateway its buffer and read budgets.
pub fn role_budgets(knobs: &Knobs) -> BTreeMap<Role, u64> {
    BTreeMap::from([
        (Role::Meta, knobs.meta_sled_cache.value),
        (Role::Datanode, knobs.datanode_write_budget.value),
        (
            Role::Gateway,
            knobs
                .gateway_buffer_budget
                .value
                .saturating_add(knobs.gateway_read_budget.value),
        ),
    ])
}

/// How a shape's load meets the gateway, for its memory-formula terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLoad {
    /// Requests the load sends at once (one connection each).
    pub requests: usize,
    /// The gateway's `max_inflight_requests`.
    pub max_inflight: usize,
    /// The gateway's `max_connections`.
    pub max_connections: usize,
    /// S3 over HTTPS (`--s3-https`).
    pub tls: bool,
}

/// The memory formula's "~80 KiB × TLS connections" (rustls's record and
/// plaintext buffers of an S3 connection; docs/design/memory.md#memory-formula),
/// bytes.
pub const S3_TLS_CONNECTION_BYTES: u64 = 80 * 1024;

/// The gateway's fixed state per S3 connection, bytes: its
/// `server::CONNECTION_STATE_BYTES`, copied so that bench links no role
/// crate (`gateway_constants_agree` checks the copy against the gateway).
pub const CONNECTION_STATE_BYTES: usize = 16 * 1024;

/// The gateway's HTTP/1 read buffer limit, bytes: its
/// `server::HTTP1_MAX_BUF_BYTES` (checked like [`CONNECTION_STATE_BYTES`]).
pub const HTTP1_MAX_BUF_BYTES: usize = 64 * 1024;

/// The gateway's default `max_connections` (checked like
/// [`CONNECTION_STATE_BYTES`]).
pub const GATEWAY_DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The gateway's default `max_inflight_requests` (checked like
/// [`CONNECTION_STATE_BYTES`]).
pub const GATEWAY_DEFAULT_MAX_INFLIGHT_REQUESTS: usize = 256;

/// What the gateway's memory formula (docs/design/memory.md#memory-formula) adds to its
/// budgets for a shape's load, bytes: [`CONNECTION_STATE_BYTES`] per
/// connection (at most `max_connections`), [`S3_TLS_CONNECTION_BYTES`] more
/// per connection over HTTPS, and twice [`HTTP1_MAX_BUF_BYTES`] per upload
/// admitted at once (at most `max_inflight`). RSS is sampled during the load
/// only, so the read-back's terms are not added.
pub fn gateway_client_bytes(load: ClientLoad) -> u64 {
    let per_connection =
        CONNECTION_STATE_BYTES as u64 + if load.tls { S3_TLS_CONNECTION_BYTES } else { 0 };
    let connections = load.requests.min(load.max_connections) as u64;
    let uploading = load.requests.min(load.max_inflight) as u64;
    connections * per_connection + uploading * 2 * HTTP1_MAX_BUF_BYTES as u64
}

/// Creates the bucket if needed and puts (then deletes) a small object.
async fn probe_write(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    region: &str,
) -> Result<(), BoxError> {
    ensure_bucket(client, bucket, region).await?;
    client
        .put_object()
        .bucket(bucket)
        .key(READY_KEY)
        .body(ByteStream::from(vec![0x5a; READY_PROBE_BYTES]))
        .send()
        .await?;
    if let Err(e) = client
        .delete_object()
        .bucket(bucket)
        .key(READY_KEY)
        .send()
        .await
    {
        tracing::debug!(error = %e, "cannot delete the readiness probe object");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::options::Knob;
    use std::net::TcpListener;

    #[test]
    fn ports_are_distinct() {
        let ports = reserve_ports(16).expect("ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 16);
        assert!(ports.iter().all(|&p| p > 0));
    }

    #[test]
    fn budgets_per_role() {
        let k = |value| Knob {
            value,
            explicit: false,
        };
        let b = role_budgets(&Knobs {
            meta_sled_cache: k(64),
            datanode_write_budget: k(8),
            gateway_buffer_budget: k(16),
            gateway_read_budget: k(4),
            max_inflight: None,
            stall_timeout: None,
        });
        assert_eq!(b[&Role::Meta], 64);
        assert_eq!(b[&Role::Datanode], 8);
        assert_eq!(b[&Role::Gateway], 20);
    }

    #[test]
    fn gateway_client_terms_follow_the_memory_formula() {
        const KIB: u64 = 1024;
        let overload = ClientLoad {
            requests: 64 * 16,
            max_inflight: 32,
            max_connections: 1024,
            tls: false,
        };
        // 1,024 connections and 32 admitted uploads.
        assert_eq!(
            gateway_client_bytes(overload),
            1024 * 16 * KIB + 32 * 128 * KIB
        );
        // Connections past max_connections wait unserved.
        assert_eq!(
            gateway_client_bytes(ClientLoad {
                requests: 4096,
                ..overload
            }),
            1024 * 16 * KIB + 32 * 128 * KIB
        );
        // Over HTTPS each connection adds its TLS buffers.
        assert_eq!(
            gateway_client_bytes(ClientLoad {
                tls: true,
                ..overload
            }),
            1024 * (16 + 80) * KIB + 32 * 128 * KIB
        );
        // Seed: 5 uploads, none refused.
        let seed = ClientLoad {
            requests: 5,
            max_inflight: 256,
            ..overload
        };
        assert_eq!(gateway_client_bytes(seed), 5 * 16 * KIB + 5 * 128 * KIB);
    }

    /// A one-datanode "cluster" for the kill/wipe/restart path: its binary
    /// is a shell script that logs its pid and arguments and sleeps; the
    /// test itself binds (or leaves free) the port that stands for its listener.
    fn fake_cluster(dir: &Path, listener_port: u16) -> Cluster {
        let bin = dir.join("fake-sluice");
        std::fs::write(
            &bin,
            "#!/bin/sh\necho \"started $$ $1 $2 $3\"\nexec sleep 60\n",
        )
        .expect("write script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let data_dir = dir.join("dn1/data");
        std::fs::create_dir_all(data_dir.join("shards")).expect("data dir");
        std::fs::write(data_dir.join("disk_id"), "old-disk").expect("disk id");
        let config = dir.join("dn1/datanode.toml");
        std::fs::write(&config, "node_id = 1\n").expect("config");
        let log = dir.join("dn1.log");
        let child =
            spawn(&bin, Role::Datanode, &config, &log, "info", "dn1", false).expect("spawn");
        Cluster {
            label: "test",
            endpoint: String::new(),
            ca_bundle: None,
            processes: vec![Process {
                name: "dn1".into(),
                role: Role::Datanode,
                pid: child.id().unwrap_or(0),
                log,
                metrics_url: None,
                budget_bytes: 0,
                baseline_bytes: None,
                config,
                data_dir,
                port: listener_port,
                restarts: 0,
                child,
            }],
            knobs: Vec::new(),
            dir: dir.to_owned(),
            bin,
            log_filter: "info".into(),
        }
    }

    /// The log once it holds `needle` (the script may not have run yet), within 5 s.
    async fn wait_for_log(path: &Path, needle: &str) -> String {
        for _ in 0..100 {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            if log.contains(needle) {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::fs::read_to_string(path).unwrap_or_default()
    }

    fn alive(pid: u32) -> bool {
        kill(Pid::from_raw(pid as i32), None).is_ok()
    }

    #[tokio::test]
    async fn restart_wiped_kills_removes_the_data_and_starts_again_from_the_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Stands in for the restarted node's listener.
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mut cluster = fake_cluster(dir.path(), port);
        let old_pid = cluster.processes[0].pid;
        assert!(alive(old_pid));
        wait_for_log(&cluster.processes[0].log, &format!("started {old_pid} ")).await;

        // A running process cannot be restarted on top of itself.
        assert!(matches!(
            cluster.restart("dn1").await,
            Err(SoakError::StillRunning { .. })
        ));
        assert!(matches!(
            cluster.restart_wiped("dn9").await,
            Err(SoakError::NoSuchProcess { .. })
        ));

        let new_pid = cluster.restart_wiped("dn1").await.expect("restart");
        assert_ne!(new_pid, old_pid);
        assert!(!alive(old_pid), "the old process was killed and reaped");
        assert!(alive(new_pid));
        let p = &cluster.processes[0];
        assert_eq!((p.pid, p.restarts, p.port), (new_pid, 1, port));
        assert!(!p.data_dir.exists(), "the data directory is gone entirely");
        // Same config, and both starts in one log.
        let log = wait_for_log(&p.log, &format!("started {new_pid} ")).await;
        let config = p.config.display().to_string();
        assert!(
            log.contains(&format!("started {old_pid} datanode --config {config}")),
            "{log}"
        );
        assert!(
            log.contains(&format!("started {new_pid} datanode --config {config}")),
            "{log}"
        );

        // A plain kill reports SIGKILL; a second kill only reaps.
        let exit = cluster.kill("dn1").await.expect("kill");
        assert!(exit.killed);
        assert!(exit.status.contains("signal: 9"), "{}", exit.status);
        assert!(!cluster.kill("dn1").await.expect("reap").killed);
        drop(listener);
    }

    #[tokio::test]
    async fn restart_fails_when_the_process_never_listens() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A port nothing listens on.
        let port = TcpListener::bind(("127.0.0.1", 0))
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let mut cluster = fake_cluster(dir.path(), port);
        cluster.kill("dn1").await.expect("kill");
        match wait_listening(&mut cluster.processes[0], Duration::from_millis(600)).await {
            Err(SoakError::Exited { .. }) => {}
            other => panic!("a reaped process reads as exited, got {other:?}"),
        }
        cluster.processes[0].child = spawn(
            &cluster.bin,
            Role::Datanode,
            &cluster.processes[0].config,
            &cluster.processes[0].log,
            "info",
            "dn1",
            true,
        )
        .expect("spawn");
        match wait_listening(&mut cluster.processes[0], Duration::from_millis(600)).await {
            Err(SoakError::RestartNotReady { port: p, .. }) => assert_eq!(p, port),
            other => panic!("expected RestartNotReady, got {other:?}"),
        }
    }

    #[test]
    fn gateway_constants_agree() {
        use sluice_gateway::server;
        assert_eq!(CONNECTION_STATE_BYTES, server::CONNECTION_STATE_BYTES);
        assert_eq!(HTTP1_MAX_BUF_BYTES, server::HTTP1_MAX_BUF_BYTES);
        let config = sluice_gateway::Config::default();
        assert_eq!(GATEWAY_DEFAULT_MAX_CONNECTIONS, config.max_connections);
        assert_eq!(
            GATEWAY_DEFAULT_MAX_INFLIGHT_REQUESTS,
            config.max_inflight_requests
        );
    }
}
