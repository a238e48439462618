//! [`MemCluster`]: one meta node (real Raft, sled in a temp dir) and k+m
//! datanodes (real shard files in temp dirs) that talk gRPC over an
//! in-process [`MemNet`], a [`BlobStore`] and the gateway's S3 service
//! ([`SluiceService`]) built on them, and an `aws-sdk-s3` client whose
//! HTTP client hands each request to that service in-process
//! ([`InProcessHttp`]). Nothing binds a socket, so tests start in well
//! under a second and can run many at once; faults are armed on
//! [`MemCluster::faults`].

use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use http_body_util::BodyExt;
use sluice_gateway::blob::{BlobStore, BlobStoreConfig};
use sluice_gateway::s3::Gateway;
use sluice_gateway::server::{SluiceService, s3_service};
use sluice_meta_client::MetaClient;
use sluice_net::Transport;
use sluice_net::faults::Faults;
use sluice_net::net::MemNet;
use sluice_test_support::RoleTask;
use sluice_util::byte_size::ByteSize;
use tempfile::TempDir;

/// Data shards per stripe.
pub const K: usize = 4;
/// Parity shards per stripe.
pub const M: usize = 2;
/// Bytes per shard block of a full stripe: small, so small bodies span
/// many stripes.
pub const BLOCK: usize = 4096;
/// The meta node's address on the net.
pub const META: &str = "http://meta-1:7001";
/// The root key pair the S3 service accepts.
pub const ACCESS_KEY: &str = "mem-access-key";
/// Its secret.
pub const SECRET_KEY: &str = "mem-secret-key-0123456789";
/// The region the S3 service signs for.
pub const REGION: &str = "us-east-1";

/// The address of datanode `id` on the net.
pub fn datanode_addr(id: u64) -> String {
    format!("http://dn-{id}:7100")
}

/// A cluster on a memory net (see the module docs).
pub struct MemCluster {
    net: MemNet,
    meta: RoleTask<sluice_meta::Error>,
    datanodes: Vec<RoleTask<sluice_datanode::Error>>,
    _dirs: Vec<TempDir>,
    /// A meta client on the net.
    pub meta_client: MetaClient,
    /// The gateway's data path.
    pub blobs: BlobStore,
    /// The gateway's S3 service.
    pub service: SluiceService,
}

/// `listen` is not bound on a memory net; the configs still carry one.
fn unused_socket() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 0))
}

impl MemCluster {
    /// Starts meta and k+m datanodes, waits until every datanode is live
    /// in meta, then builds the data path and the S3 service.
    pub async fn start() -> Result<MemCluster> {
        sluice_test_support::init_tracing();
        let net = MemNet::new();
        let mut dirs = Vec::new();

        let dir = tempfile::tempdir()?;
        let config = sluice_meta::Config {
            node_id: 1,
            listen: unused_socket(),
            advertise_addr: META.into(),
            data_dir: dir.path().to_path_buf(),
            sled_cache_bytes: ByteSize(4 << 20),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(400),
            election_timeout_max: Duration::from_millis(800),
            insecure_cluster: true,
            ..Default::default()
        };
        dirs.push(dir);
        let listener = net.listen(META)?;
        let meta = RoleTask::spawn(|stop| sluice_meta::run(config, listener, stop));

        let mut datanodes = Vec::new();
        for id in 1..=(K + M) as u64 {
            let dir = tempfile::tempdir()?;
            let config = sluice_datanode::Config {
                node_id: id,
                listen: unused_socket(),
                advertise_addr: datanode_addr(id),
                data_dir: dir.path().to_path_buf(),
                meta_endpoints: vec![META.into()],
                heartbeat_interval: Duration::from_millis(200),
                shutdown_grace: Duration::from_secs(1),
                insecure_cluster: true,
                ..Default::default()
            };
            dirs.push(dir);
            let listener = net.listen(&datanode_addr(id))?;
            datanodes.push(RoleTask::spawn(|stop| {
                sluice_datanode::run(config, listener, stop)
            }));
        }

        let meta_client = MetaClient::with_timeouts(
            vec![META.into()],
            Duration::from_secs(20),
            Duration::from_secs(5),
        )
        .with_transport(Transport::Memory(net.clone()));
        sluice_test_support::wait_until(
            "every datanode live in meta",
            Duration::from_secs(30),
            || async {
                let live = match meta_client.list_datanodes().await {
                    Ok(d) => d.iter().filter(|d| d.live).count(),
                    Err(e) => return Err(e.to_string()),
                };
                if live == K + M {
                    Ok(())
                } else {
                    Err(format!("{live} live"))
                }
            },
        )
        .await?;
        let config = BlobStoreConfig {
            data_shards: K,
            parity_shards: M,
            block_size: BLOCK,
            write_quorum: K + 1,
            datanode_refresh_interval: Duration::from_secs(60),
            shard_channel_depth: 4,
            ..Default::default()
        };
        let blobs = BlobStore::start(config, meta_client.clone())
            .await
            .context("starting the data path")?;
        let gateway = Gateway::new(meta_client.clone(), blobs.clone(), REGION.into(), 64)
            .with_inline_max(sluice_gateway::config::DEFAULT_INLINE_BYTES);
        let service = s3_service(gateway, ACCESS_KEY, SECRET_KEY);
        Ok(MemCluster {
            net,
            meta,
            datanodes,
            _dirs: dirs,
            meta_client,
            blobs,
            service,
        })
    }

    /// The fault rules every server of the cluster applies.
    pub fn faults(&self) -> &Faults {
        self.net.faults()
    }

    /// An S3 client with the root key that calls the S3 service in-process.
    pub fn s3(&self) -> aws_sdk_s3::Client {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(SharedHttpClient::new(InProcessHttp(self.service.clone())))
            .endpoint_url("http://gateway.mem")
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new(
                ACCESS_KEY,
                SECRET_KEY,
                None,
                None,
                "sluice-mem-cluster",
            ))
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    /// Disarms every fault and stops the datanodes and meta.
    pub async fn shut_down(mut self) -> Result<()> {
        self.net.faults().clear();
        for d in &mut self.datanodes {
            d.stop().await?;
        }
        self.meta.stop().await
    }
}

/// The SDK's HTTP client for [`MemCluster::s3`]: each request, its body
/// read whole, goes to [`SluiceService::call`]; the answer's body is read
/// whole too (test bodies are small; the streaming paths are the same
/// code either way below the s3s body).
#[derive(Clone)]
pub struct InProcessHttp(pub SluiceService);

impl std::fmt::Debug for InProcessHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcessHttp")
    }
}

fn connector_error(e: impl std::fmt::Display) -> ConnectorError {
    ConnectorError::io(std::io::Error::other(e.to_string()).into())
}

impl HttpConnector for InProcessHttp {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let service = self.0.clone();
        HttpConnectorFuture::new(async move {
            let request = request.try_into_http1x().map_err(connector_error)?;
            let (mut parts, body) = request.into_parts();
            // As an HTTP/1.1 server receives it: a Host header (hyper's
            // client adds it on the wire; SigV4 signed it) and the target
            // in origin form.
            if let Some(authority) = parts.uri.authority().cloned()
                && !parts.headers.contains_key(http::header::HOST)
            {
                let host =
                    http::HeaderValue::from_str(authority.as_str()).map_err(connector_error)?;
                parts.headers.insert(http::header::HOST, host);
            }
            if let Some(target) = parts.uri.path_and_query().cloned() {
                parts.uri = http::Uri::from(target);
            }
            let body = body.collect().await.map_err(connector_error)?.to_bytes();
            let response = service
                .call(http::Request::from_parts(parts, s3s::Body::from(body)))
                .await
                .map_err(|e| connector_error(format!("{e:?}")))?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(connector_error)?.to_bytes();
            HttpResponse::try_from(http::Response::from_parts(parts, SdkBody::from(body)))
                .map_err(connector_error)
        })
    }
}

impl HttpClient for InProcessHttp {
    fn http_connector(
        &self,
        _settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}
