//! `sluice dev`: a working cluster on one machine with embedded defaults.
//!
//! One meta node (single-voter Raft), six datanodes and one gateway, all in
//! this process, each with its own directory under `--data-dir` and its own
//! port; erasure layout 4+2. The S3 credentials come from the flags or
//! environment, else from `<data-dir>/credentials.toml`, generated on the
//! first start and kept, so a restart on the same directory keeps buckets,
//! objects, open multipart uploads and keys.
//!
//! S3 is plain HTTP (`s3_plaintext`, set explicitly) unless `--https` is
//! given: then the gateway serves HTTPS with a certificate for the listen
//! address, `localhost` and 127.0.0.1, issued by a dev CA kept in
//! `<data-dir>/s3-tls/` (`ca.crt` is what clients pass as `--ca-bundle`;
//! key files are mode 0600). The credentials file is mode 0600 too.
//! Cluster TLS: on first start it makes a CA and one certificate per node
//! (meta 1, datanodes 1..=6, gateway `dev`) plus an operator certificate
//! (admin `dev`) under `<data-dir>/tls/` (see `sluice_net::pki`), reuses
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
use sluice_util::byte_size::ByteSize;
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
    /// Serve S3 over HTTPS with a certificate from a dev CA kept in
    /// `<data-dir>/s3-tls/` (clients trust `ca.crt`, e.g. `aws --ca-bundle`).
    #[arg(long)]
    https: bool,
    /// Largest object body stored inline in its metadata record (the
    /// gateway's `inline_max_bytes`; bytes or a size such as "4 KiB"; 0
    /// turns it off).
    // A string default: bytesize's Display is rounded SI ("4.1 KB"), and
    // clap parses a displayed default back (4100 bytes). The test below
    // holds it equal to the gateway's default.
    #[arg(long, default_value = "4 KiB")]
    inline_max_bytes: ByteSize,
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
        // Kept by an older version with the default mode: tighten it.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 0600 {}", path.display()))?;
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        return toml::from_str(&text).with_context(|| format!("parsing {}", path.display()));
    }
    let credentials = Credentials {
        access_key: format!("SLUICE{}", hex::encode_upper(rand::random::<[u8; 7]>())),
        secret_key: hex::encode(rand::random::<[u8; 20]>()),
    };
    write_secret(&path, toml::to_string(&credentials)?.as_bytes())?;
    Ok(credentials)
}

/// Writes `bytes` to `path` as a file only its owner may read (mode 0600,
/// also when it existed with a wider mode).
fn write_secret(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The files of `sluice dev --https`: the dev CA certificate clients
/// trust, and the gateway's certificate and key.
pub struct DevS3Tls {
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Distinguished name of the dev CA.
const DEV_CA_NAME: &str = "Sluice dev S3 CA";

/// The dev CA's parameters (the same on every start, so a kept CA key
/// signs certificates that chain to the kept `ca.crt`).
fn dev_ca_params() -> anyhow::Result<rcgen::CertificateParams> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, DEV_CA_NAME);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Creates (first start) or reuses the dev CA in `dir`, and issues the S3
/// certificate for `hosts` (DNS names or IP addresses) on every start.
pub fn dev_s3_tls(dir: &Path, hosts: &[String]) -> anyhow::Result<DevS3Tls> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca_cert = dir.join("ca.crt");
    let ca_key_path = dir.join("ca.key");
    let ca_params = dev_ca_params()?;
    let ca_key = if ca_cert.exists() && ca_key_path.exists() {
        let pem = std::fs::read_to_string(&ca_key_path)
            .with_context(|| format!("reading {}", ca_key_path.display()))?;
        rcgen::KeyPair::from_pem(&pem)?
    } else {
        let key = rcgen::KeyPair::generate()?;
        let cert = ca_params.self_signed(&key)?;
        write_secret(&ca_key_path, key.serialize_pem().as_bytes())?;
        std::fs::write(&ca_cert, cert.pem())
            .with_context(|| format!("writing {}", ca_cert.display()))?;
        key
    };
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice dev S3");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = params.signed_by(&leaf_key, &issuer)?;
    let cert = dir.join("s3.crt");
    let key = dir.join("s3.key");
    std::fs::write(&cert, leaf.pem()).with_context(|| format!("writing {}", cert.display()))?;
    write_secret(&key, leaf_key.serialize_pem().as_bytes())?;
    Ok(DevS3Tls { ca_cert, cert, key })
}

/// The certificate files of every node of the dev cluster.
struct DevTls {
    meta: sluice_net::ClusterTls,
    datanodes: Vec<sluice_net::ClusterTls>,
    gateway: sluice_net::ClusterTls,
    admin: sluice_net::ClusterTls,
}

/// Makes (first start) or reuses (restart) the dev cluster's CA and
/// certificates in `dir`.
fn dev_certificates(dir: &Path) -> anyhow::Result<DevTls> {
    use sluice_net::{Identity, Role};
    let mut identities = vec![Identity::new(Role::Meta, "1")?];
    for i in 1..=DATANODES {
        identities.push(Identity::new(Role::Datanode, i.to_string())?);
    }
    identities.push(Identity::new(Role::Gateway, "dev")?);
    identities.push(Identity::new(Role::Admin, "dev")?);
    let mut files = sluice_net::pki::ensure_dir(dir, &identities)
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
    let s3_tls = if args.https {
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let ip = args.listen.ip();
        if !ip.is_unspecified() && !hosts.contains(&ip.to_string()) {
            hosts.push(ip.to_string());
        }
        Some(dev_s3_tls(&dir.join("s3-tls"), &hosts)?)
    } else {
        None
    };
    let mut gateway_config = sluice_gateway::Config {
        listen: args.listen,
        region: args.region.clone(),
        access_key: access_key.clone(),
        secret_key: secret_key.clone().into(),
        meta_endpoints: vec![meta_endpoint.clone()],
        data_shards: 4,
        parity_shards: 2,
        s3_tls: s3_tls.as_ref().map(|t| sluice_gateway::config::S3Tls {
            cert_file: t.cert.clone(),
            key_file: t.key.clone(),
        }),
        s3_plaintext: s3_tls.is_none(),
        cluster_tls: Some(tls.gateway.clone()),
        inline_max_bytes: args.inline_max_bytes,
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
            // Readiness of the whole dev cluster: the gateway's.
            let ready = crate::health::gateway(
                gateway_config.meta_endpoints.clone(),
                gateway_config.effective_write_quorum() as usize,
                sluice_net::Transport::from_config(
                    gateway_config.cluster_tls.as_ref(),
                    gateway_config.insecure_cluster,
                    sluice_net::Role::Gateway,
                )?,
            );
            Some(telemetry::MetricsServer::start(
                listener,
                handle,
                crate::ALLOCATOR,
                &limit,
                &budgets,
                ready,
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
    let scheme = if s3_tls.is_some() { "https" } else { "http" };
    let endpoint = format!("{scheme}://{}", listener.local_addr()?);
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
    if let Some(t) = &s3_tls {
        println!("  CA bundle:  {}", t.ca_cert.display());
    }
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
    let ca_flag = s3_tls
        .as_ref()
        .map(|t| format!(" --ca-bundle {}", t.ca_cert.display()))
        .unwrap_or_default();
    println!(
        "Try: AWS_ACCESS_KEY_ID={access_key} AWS_SECRET_ACCESS_KEY={secret_key} aws --endpoint-url {endpoint}{ca_flag} --region {} s3 ls",
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        dev: DevArgs,
    }

    #[test]
    fn inline_max_defaults_to_the_gateways_default_and_takes_sizes() {
        let default = Cli::parse_from(["dev"]).dev.inline_max_bytes;
        assert_eq!(
            default,
            ByteSize(sluice_gateway::config::DEFAULT_INLINE_BYTES)
        );
        let set = Cli::parse_from(["dev", "--inline-max-bytes", "16 KiB"]);
        assert_eq!(set.dev.inline_max_bytes, ByteSize(16 * 1024));
        let plain = Cli::parse_from(["dev", "--inline-max-bytes", "0"]);
        assert_eq!(plain.dev.inline_max_bytes, ByteSize(0));
    }
}
