//! Readiness of each role, answered on `GET /health/ready` of the
//! `metrics_listen` listener (see [`crate::telemetry`]).
//!
//! * meta: this node's own `ClusterStatus` (asked on its listener) names a
//!   leader, and this node is a voter.
//! * datanode: meta's registry lists this node id as live (heartbeats
//!   arrive) and writable (free space above the reserve, disk healthy).
//! * gateway (and `sluice dev`): the meta leader answers and enough
//!   datanodes are writable for the write quorum
//!   ([`sluice_gateway::health::GatewayHealth`]).
//!
//! Every probe waits at most [`PROBE_TIMEOUT`]; the metrics listener
//! serves at most `MAX_SCRAPE_CONNECTIONS` requests at once, which bounds
//! the meta calls probes make.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use sluice_gateway::health::{GatewayHealth, Health};
use sluice_meta_client::MetaClient;
use sluice_net::Transport;

/// Longest a readiness probe waits for meta.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Computes the readiness of this process's role.
pub type ReadyProbe = Arc<dyn Fn() -> BoxFuture<'static, Health> + Send + Sync>;

/// A probe that always answers `health` (tests).
#[allow(dead_code)]
pub fn fixed(health: Health) -> ReadyProbe {
    Arc::new(move || {
        let health = health.clone();
        Box::pin(async move { health })
    })
}

/// The address to reach a listener bound to `listen` from this host: the
/// loopback address when it is bound to every address.
pub(crate) fn reachable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}

/// Meta readiness (see the module docs).
///
/// `transport` is the node's own (its certificate under mutual TLS).
pub fn meta(listen: SocketAddr, node_id: u64, transport: Transport) -> ReadyProbe {
    let client = MetaClient::with_timeouts(
        vec![format!("http://{}", reachable(listen))],
        PROBE_TIMEOUT,
        PROBE_TIMEOUT,
    )
    .with_transport(transport);
    Arc::new(move || {
        let client = client.clone();
        Box::pin(async move {
            match tokio::time::timeout(PROBE_TIMEOUT, client.cluster_status()).await {
                Err(_) => Health::failing(
                    "not ready: this meta node did not answer ClusterStatus in time",
                ),
                Ok(Err(e)) => Health::failing(format!("not ready: ClusterStatus failed: {e}")),
                Ok(Ok(s)) if s.node_id != node_id => Health::failing(format!(
                    "not ready: the meta listener answers as node {} instead of {node_id}",
                    s.node_id
                )),
                Ok(Ok(s)) => match s.leader_id {
                    None => Health::failing(format!(
                        "not ready: no meta leader known (term {})",
                        s.term
                    )),
                    Some(_) if !s.voters.contains(&node_id) => Health::failing(format!(
                        "not ready: node {node_id} is not a voter (voters {:?})",
                        s.voters
                    )),
                    Some(leader) => Health::ok(format!(
                        "ready: meta node {node_id} is a voter, leader {leader}, term {}",
                        s.term
                    )),
                },
            }
        })
    })
}

/// Datanode readiness (see the module docs).
///
/// `transport` is the node's own (its certificate under mutual TLS).
pub fn datanode(meta_endpoints: Vec<String>, node_id: u64, transport: Transport) -> ReadyProbe {
    let client = MetaClient::with_timeouts(meta_endpoints, PROBE_TIMEOUT, PROBE_TIMEOUT)
        .with_transport(transport);
    Arc::new(move || {
        let client = client.clone();
        Box::pin(async move {
            match tokio::time::timeout(PROBE_TIMEOUT, client.list_datanodes()).await {
                Err(_) => Health::failing("not ready: the meta leader did not answer in time"),
                Ok(Err(e)) => Health::failing(format!("not ready: meta leader unreachable: {e}")),
                Ok(Ok(nodes)) => match nodes.iter().find(|d| d.id == node_id) {
                    None => Health::failing(format!(
                        "not ready: datanode {node_id} is not registered with meta"
                    )),
                    Some(d) if !d.live => Health::failing(format!(
                        "not ready: meta has no recent heartbeat of datanode {node_id}"
                    )),
                    Some(d) if !d.writable => Health::failing(format!(
                        "not ready: datanode {node_id} is not writable (free space below its reserve, or disk failing)"
                    )),
                    Some(d) => Health::ok(format!(
                        "ready: datanode {node_id} registered, heartbeating, disk writable ({} bytes free)",
                        d.free_bytes
                    )),
                },
            }
        })
    })
}

/// Gateway readiness (see the module docs).
///
/// `transport` is the gateway's own (its certificate under mutual TLS).
pub fn gateway(
    meta_endpoints: Vec<String>,
    write_quorum: usize,
    transport: Transport,
) -> ReadyProbe {
    let health = Arc::new(GatewayHealth::new(
        MetaClient::with_timeouts(meta_endpoints, PROBE_TIMEOUT, PROBE_TIMEOUT)
            .with_transport(transport),
        write_quorum,
    ));
    Arc::new(move || {
        let health = Arc::clone(&health);
        Box::pin(async move { health.ready().await })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_listen_addresses_are_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:7000".parse().unwrap()),
            "127.0.0.1:7000".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            reachable("[::]:7000".parse().unwrap()),
            "[::1]:7000".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            reachable("10.0.0.1:7000".parse().unwrap()),
            "10.0.0.1:7000".parse::<SocketAddr>().unwrap()
        );
    }

    #[tokio::test]
    async fn probes_fail_with_a_reason_when_meta_is_down() {
        // Nothing listens on port 1.
        let down = vec!["http://127.0.0.1:1".to_string()];
        let g = gateway(down.clone(), 5, Transport::Insecure)().await;
        assert!(!g.ok && g.reason.starts_with("not ready:"), "{g:?}");
        let d = datanode(down, 3, Transport::Insecure)().await;
        assert!(!d.ok && d.reason.starts_with("not ready:"), "{d:?}");
        let m = meta("127.0.0.1:1".parse().unwrap(), 1, Transport::Insecure)().await;
        assert!(!m.ok && m.reason.starts_with("not ready:"), "{m:?}");
    }
}
