//! Cluster security for Sluice: node certificates, mutual TLS for every
//! internal gRPC connection, the caller's identity, and the per-RPC role
//! policy.
//!
//! # Identity format
//!
//! Every node (and operator) holds an X.509 certificate issued by the
//! cluster CA that carries:
//! * the SAN URI `spiffe://sluice/<role>/<id>` (a SPIFFE ID; trust domain
//!   `sluice`) — this, and only this, is the caller's [`Identity`]; roles
//!   are `meta`, `datanode`, `gateway`, `admin`; a meta or datanode id is
//!   its node id, a gateway's its `gateway_id`;
//! * the DNS SAN `<role>.sluice.internal`: a client dialing a role checks
//!   the server certificate against that name (so a datanode cannot
//!   impersonate meta), whatever address it dials;
//! * CN `<role>-<id>` (informational), extended key usages server and
//!   client auth, and optional extra DNS/IP SANs.
//!
//! Cluster gRPC is TLS 1.3 only (see [`install_crypto_provider`]), with
//! client certificates verified against the CA in `ca_file`.
//!
//! # Policy
//!
//! Each server runs [`AuthLayer`] (`Server::builder().layer(..)`), with one
//! table per gRPC service in [`policy`] ([`policy::META`],
//! [`policy::RAFT`], [`policy::DATANODE`], [`policy::ADMIN`]): full
//! method path -> allowed roles, deny by default. No (valid) client
//! certificate -> `UNAUTHENTICATED`; a role not in the table (or an
//! unknown method) -> `PERMISSION_DENIED`; the handler never runs.
//! Allowed calls carry the caller's [`Identity`] in the request
//! extensions ([`caller`]); handlers that must check more than the role
//! use it (a datanode registers, heartbeats, reports missing shards and
//! asks which shards are collectable only for its own node id; the
//! datanode takes a gateway's id for credit from its certificate).
//!
//! In short: Raft RPCs — meta only; Admin service — admin only; Meta —
//! gateway for buckets/objects/uploads/epochs/placement/heal, datanode for
//! RegisterDatanode/Heartbeat/FilterUnreferenced/Collectable/ReportMissing,
//! admin for ClusterStatus/ListDatanodes; Datanode — gateway for shard
//! I/O, credit, HasShards, VerifyShards, NodeStatus and DeleteBlobs, meta for DeleteBlobs
//! (the reclaimer), admin for ListShards/NodeStatus. A test checks every
//! RPC in `proto/proto/*.proto` has an entry.
//!
//! # Configuration
//!
//! Each role's config has a `[cluster_tls]` section ([`ClusterTls`]:
//! `ca_file`, `cert_file`, `key_file`) or `insecure_cluster = true`
//! (plaintext, every call allowed, a warning logged at start); exactly one
//! is required. Addresses (`meta_endpoints`, `advertise_addr`, peers) may
//! be written `http://` or `https://` or bare `host:port`: [`Transport`]
//! dials them with the scheme its mode needs (`https` under TLS).
//!
//! # Certificates
//!
//! `sluice admin certs init --dir DIR` makes a CA (`ca.pem`, `ca.key`);
//! `sluice admin certs issue --dir DIR --role R --id N [--dns NAME]...
//! [--ip ADDR]...` issues `R-N.pem` / `R-N.key` (all mode 0600; see
//! [`pki`]). `sluice dev` does both by itself under `<data-dir>/tls/`.
//!
//! To use an existing CA instead: any CA works if it issues each node a
//! certificate with the SAN URI `spiffe://sluice/<role>/<id>` and the DNS
//! SAN `<role>.sluice.internal` (EKU server+client auth, e.g. with
//! `openssl x509 -req ... -extfile` holding
//! `subjectAltName=URI:spiffe://sluice/datanode/3,DNS:datanode.sluice.internal`);
//! put the CA certificate (or chain) in `ca_file`. Note every certificate
//! that CA issues with such a URI is trusted as that identity.

// Tests: `net::MemNet` runs the roles' real servers and clients without
// sockets, and `faults` fails, delays or drops chosen calls on them.
pub mod faults;
mod identity;
mod layer;
pub mod net;
pub mod pki;
pub mod policy;
mod tls;

pub use identity::{DNS_SUFFIX, Identity, MAX_ID_LEN, Role, TRUST_DOMAIN};
pub use layer::{AuthLayer, AuthService, authorize, caller, peer_identity};
pub use policy::Policy;
pub use tls::{
    ClusterTls, TlsMaterial, Transport, install_crypto_provider, is_endpoint, validate_choice,
};

use std::path::PathBuf;

/// Errors of certificate handling and cluster TLS setup.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A certificate or key could not be made or parsed.
    #[error("certificate: {0}")]
    BadCertificate(String),
    /// A certificate does not name a valid Sluice identity.
    #[error("identity: {0}")]
    BadIdentity(String),
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file that must not be replaced exists.
    #[error("{} already exists; not replacing it", .0.display())]
    Exists(PathBuf),
    /// Invalid cluster security configuration.
    #[error("{0}")]
    Config(String),
}
