//! `sluice dev`: a working cluster on one machine with embedded defaults.
//!
//! One meta node (single-voter Raft), six datanodes and one gateway, all in
//! this process, each with its own directory under `--data-dir` and its own
//! port; erasure layout 4+2. The S3 credentials come from the flags or
//! environment, else from `<data-dir>/credentials.toml`, generated on the
//! first start and kept, so a restart on the same directory keeps buckets,
//! objects, open multipart uploads and keys.
//!
//! Cluster TLS: on first start it makes a CA and one certificate per node
//! (meta 1, datanodes 1..=6, gateway `dev`) plus an operator certificate
//! (admin `dev`) under `<data-dir>/tls/` (see `sluice_auth::pki`), reuses
//! them on restart, runs every node with mutual TLS, and prints the
//! `sluice admin` settings that use the admin certificate.
//!
//! Memory: the process's memory limit is split among the roles (see
//! [`crate::budget`]: each datanode limit/32 in 8..=256 MiB, the gateway
//! limit/8 in 16..=512 MiB); every budget is printed in the banner. All
//! roles share one Prometheus endpoint, `--metrics-listen` (default
//! `127.0.0.1:9090`, `off` for none).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{budget, telemetry};

/// Number of datanodes `sluice dev` starts (k + m of the 4+2 layout).
const DATANODES: u64 = 6;

#[derive(clap::Args)]
pub struct DevArgs {
    /// Directory holding every node's data and the generated credentials.
    #[arg(long, default_value = "sluice-data")]
    data_dir: PathBuf,
    /// Address of the S3 endpoint.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// First internal gRPC port: the meta node listens on it, datanode i on base + i.
    #[arg(long, default_value_t = 7000)]
    grpc_port_base: u16,
    /// S3 region reported to clients.
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// S3 access key (else the one kept in the data dir).
    #[arg(long, env = "SLUICE_ACCESS_KEY")]
    access_key: Option<String>,
    /// S3 secret key (else the one kept in the data dir).
    #[arg(long, env = "SLUICE_SECRET_KEY", hide_env_values = true)]
    secret_key: Option<String>,
    /// Address of the Prometheus endpoint (GET /metrics) of every role, or `off`.
    #[arg(long, default_value = "127.0.0.1:9090")]
    metrics_listen: MetricsListen,
}

/// `--metrics-listen`: an address, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsListen {
    /// No metrics endpoint.
    Off,
    /// Serve `/metrics` here.
    At(SocketAddr),
}

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("off") {
            return Ok(MetricsListen::Off);
        }
        s.parse()
            .map(MetricsListen::At)
            .map_err(|e| format!("{s:?} is neither a socket address ({e}) nor `off`"))
    }
}

/// The S3 credentials kept in `<data-dir>/credentials.toml`.
#[derive(Serialize, Deserialize)]
struct Credentials {
    access_key: String,
    secret_key: String,
}

fn load_or_create_credentials(dir: &Path) -> anyhow::Result<Credentials> {
    let path = dir.join("credentials.toml");
    if path.exists() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        return toml::from_str(&text).with_context(|| format!("parsing {}", path.display()));
    }
    let credentials = Credentials {
        access_key: format!("SLUICE{}", hex::encode_upper(rand::random::<[u8; 7]>())),
        secret_key: hex::encode(rand::random::<[u8; 20]>()),
    };
    std::fs::write(&path, toml::to_string(&credentials)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(credentials)
}

/// The certificate files of every node of the dev cluster.
struct DevTls {
    meta: sluice_auth::ClusterTls,
    datanodes: Vec<sluice_auth::ClusterTls>,
    gateway: sluice_auth::ClusterTls,
    admin: sluice_auth::ClusterTls,
}

/// Makes (first start) or reuses (restart) the dev cluster's CA and
/// certificates in `dir`.
fn dev_certificates(dir: &Path) -> anyhow::Result<DevTls> {
    use sluice_auth::{Identity, Role};
    let mut identities = vec![Identity::new(Role::Meta, "1")?];
    for i in 1..=DATANODES {
        identities.push(Identity::new(Role::Datanode, i.to_string())?);
    }
    identities.push(Identity::new(Role::Gateway, "dev")?);
    identities.push(Identity::new(Role::Admin, "dev")?);
    let mut files = sluice_auth::pki::ensure_dir(dir, &identities)
        .with_context(|| format!("making the dev cluster's certificates in {}", dir.display()))?;
    let admin = files.pop().expect("admin");
    let gateway = files.pop().expect("gateway");
    let meta = files.remove(0);
    Ok(DevTls {
        meta,
        datanodes: files,
        gateway,
        admin,
    })
}

/// A role running as a task, with the error it ended with.
type RoleTask = (String, JoinHandle<anyhow::Result<()>>);

fn spawn_role<F, E>(name: String, fut: F) -> RoleTask
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<anyhow::Error> + Send + 'static,
{
    (
        name,
        tokio::spawn(async move { fut.await.map_err(Into::into) }),
    )
}

fn shutdown_of(rx: &watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

pub async fn run(
    args: DevArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let dir = &args.data_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let kept = load_or_create_credentials(&dir)?;
    let access_key = args.access_key.unwrap_or(kept.access_key);
    let secret_key = args.secret_key.unwrap_or(kept.secret_key);
    let tls_dir = dir.join("tls");
    let tls = dev_certificates(&tls_dir)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let host = args.listen.ip();
    let mut tasks: Vec<RoleTask> = Vec::new();
    let limit = budget::detect_memory_limit();
    let mut budgets: Vec<budget::Budget> = Vec::new();

    // Meta: a single voter.
    let meta_addr = SocketAddr::new(host, args.grpc_port_base);
    let meta_endpoint = format!("https://{meta_addr}");
    let meta_config = sluice_meta::Config {
        node_id: 1,
        listen: meta_addr,
        advertise_addr: meta_endpoint.clone(),
        data_dir: dir.join("meta-1"),
        cluster_tls: Some(tls.meta.clone()),
        ..Default::default()
    };
    budgets.extend(budget::meta_budgets(&meta_config));
    let mut datanode_configs = Vec::new();
    for i in 1..=DATANODES {
        let addr = SocketAddr::new(host, args.grpc_port_base + i as u16);
        let mut config = sluice_datanode::Config {
            node_id: i,
            listen: addr,
            advertise_addr: format!("https://{addr}"),
            data_dir: dir.join(format!("datanode-{i}")),
            meta_endpoints: vec![meta_endpoint.clone()],
            cluster_tls: Some(tls.datanodes[(i - 1) as usize].clone()),
            ..Default::default()
        };
        budgets.extend(budget::apply_datanode(
            &mut config,
            budget::DEV_DATANODE_WRITE,
            limit.bytes,
        ));
        datanode_configs.push(config);
    }
    let mut gateway_config = sluice_gateway::Config {
        listen: args.listen,
        region: args.region.clone(),
        access_key: access_key.clone(),
        secret_key: secret_key.clone(),
        meta_endpoints: vec![meta_endpoint.clone()],
        data_shards: 4,
        parity_shards: 2,
        cluster_tls: Some(tls.gateway.clone()),
        ..Default::default()
    };
    budgets.extend(budget::apply_gateway(
        &mut gateway_config,
        budget::DEV_GATEWAY_BUFFER,
        limit.bytes,
    ));
    crate::log_memory(&limit, &budgets);

    // Metrics first, so every role's metric handles bind to the recorder.
    let metrics = match args.metrics_listen {
        MetricsListen::Off => None,
        MetricsListen::At(addr) => {
            let handle = telemetry::install()?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding metrics on {addr}"))?;
            Some(telemetry::MetricsServer::start(
                listener,
                handle,
                crate::ALLOCATOR,
                &limit,
                &budgets,
            )?)
        }
    };
    let listener = tokio::net::TcpListener::bind(meta_addr)
        .await
        .with_context(|| format!("binding meta on {meta_addr}"))?;
    tasks.push(spawn_role(
        "meta-1".into(),
        sluice_meta::run(meta_config, listener, shutdown_of(&stop_rx)),
    ));

    // Datanodes.
    for config in datanode_configs {
        let (i, addr) = (config.node_id, config.listen);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding datanode {i} on {addr}"))?;
        tasks.push(spawn_role(
            format!("datanode-{i}"),
            sluice_datanode::run(config, listener, shutdown_of(&stop_rx)),
        ));
    }

    // Gateway.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding S3 on {}", args.listen))?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    tasks.push(spawn_role(
        "gateway".into(),
        sluice_gateway::run(gateway_config, listener, shutdown_of(&stop_rx)),
    ));

    println!("Sluice dev cluster: 1 meta node, {DATANODES} datanodes, erasure layout 4+2");
    println!("  data dir:   {}", dir.display());
    println!("  endpoint:   {endpoint}");
    println!("  region:     {}", args.region);
    println!("  access key: {access_key}");
    println!("  secret key: {secret_key}");
    match &metrics {
        Some(m) => println!("  metrics:    http://{}/metrics", m.local_addr()),
        None => println!("  metrics:    off"),
    }
    println!("  allocator:  {}", crate::ALLOCATOR);
    println!(
        "  cluster:    mutual TLS; CA and certificates in {}",
        tls_dir.display()
    );
    println!(
        "  admin:      SLUICE_META={meta_endpoint} SLUICE_ADMIN_CA={} SLUICE_ADMIN_CERT={} SLUICE_ADMIN_KEY={} sluice admin ...",
        tls.admin.ca_file.display(),
        tls.admin.cert_file.display(),
        tls.admin.key_file.display()
    );
    println!(
        "              (or --meta {meta_endpoint} --ca {} --cert {} --key {})",
        tls.admin.ca_file.display(),
        tls.admin.cert_file.display(),
        tls.admin.key_file.display()
    );
    let total: u64 = budgets.iter().map(|b| b.bytes).sum();
    println!(
        "  memory:     limit {limit}; budgets {} in all:",
        budget::mib(total)
    );
    for b in &budgets {
        println!("    {b}");
    }
    println!(
        "Try: AWS_ACCESS_KEY_ID={access_key} AWS_SECRET_ACCESS_KEY={secret_key} aws --endpoint-url {endpoint} --region {} s3 ls",
        args.region
    );
    println!("Press Ctrl-C to stop.");

    // Run until Ctrl-C, or until a role fails.
    let mut failed: Option<anyhow::Error> = None;
    {
        let watch_roles = futures_select_first_exit(&mut tasks);
        tokio::select! {
            _ = shutdown => {}
            (name, result) = watch_roles => {
                failed = Some(match result {
                    Ok(()) => anyhow::anyhow!("{name} stopped unexpectedly"),
                    Err(e) => e.context(format!("{name} failed")),
                });
            }
        }
    }
    let _ = stop_tx.send(true);
    // Stop in dependency order: the gateway first, then datanodes, meta last.
    for (name, handle) in tasks.into_iter().rev() {
        if handle.is_finished() && failed.is_some() {
            continue;
        }
        match handle.await {
            Ok(Ok(())) => tracing::info!(role = %name, "stopped"),
            Ok(Err(e)) => {
                tracing::error!(role = %name, error = %format!("{e:#}"), "stopped with an error")
            }
            Err(e) => tracing::error!(role = %name, error = %e, "task panicked"),
        }
    }
    drop(metrics);
    match failed {
        Some(e) => Err(e),
        None => {
            println!("Sluice dev cluster stopped.");
            Ok(())
        }
    }
}

/// Resolves when the first role task ends, with its name and result.
async fn futures_select_first_exit(tasks: &mut [RoleTask]) -> (String, anyhow::Result<()>) {
    let names: Vec<String> = tasks.iter().map(|(n, _)| n.clone()).collect();
    let handles = tasks.iter_mut().map(|(_, h)| h);
    let (result, index, _) = futures::future::select_all(handles).await;
    let result = match result {
        Ok(r) => r,
        Err(e) => Err(anyhow::anyhow!("task panicked: {e}")),
    };
    (names[index].clone(), result)
}
