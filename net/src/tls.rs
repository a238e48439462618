//! [`ClusterTls`] (the `[cluster_tls]` config section) and [`Transport`]:
//! how a process serves and dials cluster gRPC, mutual TLS or (opt-in)
//! plaintext.

use std::path::PathBuf;
use std::sync::{Arc, Once};

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, ServerTlsConfig};
use tower::layer::util::Stack;

use crate::{AuthError, Identity, Role};

/// `[cluster_tls]`: the PEM files of this node's cluster identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTls {
    /// The cluster CA certificate(s): peers' certificates must chain to it.
    pub ca_file: PathBuf,
    /// This node's certificate (SAN URI `spiffe://sluice/<role>/<id>`).
    pub cert_file: PathBuf,
    /// This node's private key.
    pub key_file: PathBuf,
}

/// A loaded [`ClusterTls`].
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    /// The identity this node's certificate names.
    pub identity: Identity,
}

impl ClusterTls {
    /// Reads the three files and the identity of the certificate.
    pub fn load(&self) -> Result<TlsMaterial, AuthError> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).map_err(|source| AuthError::Io {
                path: p.clone(),
                source,
            })
        };
        let ca_pem = read(&self.ca_file)?;
        let cert_pem = read(&self.cert_file)?;
        let key_pem = read(&self.key_file)?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| AuthError::BadCertificate(format!("{}: {e}", self.cert_file.display())))?;
        let identity = Identity::from_der(&pem.contents)?;
        if x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).is_err() {
            return Err(AuthError::BadCertificate(format!(
                "{}: no PEM certificate",
                self.ca_file.display()
            )));
        }
        if !key_pem.contains("PRIVATE KEY") {
            return Err(AuthError::BadCertificate(format!(
                "{}: no PEM private key",
                self.key_file.display()
            )));
        }
        Ok(TlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
            identity,
        })
    }

    /// Checks the files load and the certificate names `role` (and, when
    /// given, `id`).
    pub fn validate(&self, role: Role, id: Option<&str>) -> Result<Identity, AuthError> {
        let m = self.load()?;
        if m.identity.role != role || id.is_some_and(|id| id != m.identity.id) {
            return Err(AuthError::BadIdentity(format!(
                "{} names {}, this node is {role}/{}",
                self.cert_file.display(),
                m.identity,
                id.unwrap_or("*")
            )));
        }
        Ok(m.identity)
    }
}

/// Validates a role config's choice: exactly one of `tls` and `insecure`;
/// under TLS the files load and the certificate names `role` (and `id`
/// when given).
pub fn validate_choice(
    tls: Option<&ClusterTls>,
    insecure: bool,
    role: Role,
    id: Option<&str>,
) -> Result<(), AuthError> {
    match (tls, insecure) {
        (Some(tls), false) => tls.validate(role, id).map(drop),
        (None, true) => Ok(()),
        (Some(_), true) => Err(AuthError::Config(
            "set either [cluster_tls] or insecure_cluster = true, not both".into(),
        )),
        (None, false) => Err(AuthError::Config(
            "set [cluster_tls] (ca_file, cert_file, key_file), or insecure_cluster = true for plaintext cluster gRPC".into(),
        )),
    }
}

/// Installs, once per process, the rustls crypto provider cluster TLS
/// uses: aws-lc-rs (rustls's default provider; its AES-GCM uses the
/// CPU's vector AES where ring's does not, which matters to a GET, whose
/// bytes cross TLS twice; figures in bench/RESULTS.md),
/// restricted to TLS 1.3 cipher suites, so every handshake made through
/// it is TLS 1.3. Installed as the process default because
/// tonic builds its rustls configs from the default provider; if another
/// default was installed first, that one stays (and is logged).
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        provider
            .cipher_suites
            .retain(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)));
        if provider.install_default().is_err() {
            tracing::warn!(
                "a rustls crypto provider was already installed; cluster TLS uses it (TLS 1.3 not enforced by sluice-net)"
            );
        }
    });
}

/// How this process talks cluster gRPC: mutual TLS, or plaintext when the
/// config says `insecure_cluster = true`.
#[derive(Clone, Debug)]
pub enum Transport {
    /// Mutual TLS with this node's certificate.
    Tls(Arc<TlsMaterial>),
    /// Plaintext, every caller allowed (no identity).
    Insecure,
    /// An in-process [`crate::net::MemNet`] (tests): plaintext and open
    /// like [`Transport::Insecure`], dialing the net's listeners instead
    /// of sockets; servers apply the net's [`crate::faults::Faults`].
    Memory(crate::net::MemNet),
}

impl Transport {
    /// From a role's config: exactly one of `tls` and `insecure` must be
    /// set. `role` is what the certificate must name.
    pub fn from_config(
        tls: Option<&ClusterTls>,
        insecure: bool,
        role: Role,
    ) -> Result<Self, AuthError> {
        match (tls, insecure) {
            (Some(tls), false) => {
                let m = tls.load()?;
                if m.identity.role != role {
                    return Err(AuthError::BadIdentity(format!(
                        "{} names {}, expected a {role} certificate",
                        tls.cert_file.display(),
                        m.identity
                    )));
                }
                install_crypto_provider();
                Ok(Transport::Tls(Arc::new(m)))
            }
            (None, true) => Ok(Transport::Insecure),
            (Some(_), true) => Err(AuthError::Config(
                "both [cluster_tls] and insecure_cluster = true are set; choose one".into(),
            )),
            (None, false) => Err(AuthError::Config(
                "cluster gRPC needs [cluster_tls] (ca_file, cert_file, key_file), or insecure_cluster = true to run it in plaintext".into(),
            )),
        }
    }

    /// The transport of a node serving on `listener`: the listener's
    /// memory net ([`Transport::Memory`]), else [`Transport::from_config`].
    pub fn for_listener(
        listener: &crate::net::Listener,
        tls: Option<&ClusterTls>,
        insecure: bool,
        role: Role,
    ) -> Result<Self, AuthError> {
        match listener.mem_net() {
            Some(net) => Ok(Transport::Memory(net.clone())),
            None => Self::from_config(tls, insecure, role),
        }
    }

    /// Logs the plaintext warning (call once at start).
    pub fn warn_if_insecure(&self, what: &str) {
        if matches!(self, Transport::Insecure) {
            tracing::warn!(
                "{what}: insecure_cluster = true: cluster gRPC is plaintext and unauthenticated; anyone who can reach these ports can read and change the cluster"
            );
        }
    }

    /// This node's identity (TLS only).
    pub fn identity(&self) -> Option<&Identity> {
        match self {
            Transport::Tls(m) => Some(&m.identity),
            Transport::Insecure | Transport::Memory(_) => None,
        }
    }

    /// Whether calls are authenticated and authorized.
    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }

    /// `addr` with the scheme this transport dials: `https://` under TLS,
    /// `http://` in plaintext. An address without a scheme gets one; an
    /// `http://`/`https://` one is rewritten, so registered and configured
    /// addresses may be written either way.
    pub fn uri(&self, addr: &str) -> String {
        let rest = addr
            .strip_prefix("https://")
            .or_else(|| addr.strip_prefix("http://"))
            .unwrap_or(addr);
        match self {
            Transport::Tls(_) => format!("https://{rest}"),
            Transport::Insecure | Transport::Memory(_) => format!("http://{rest}"),
        }
    }

    /// The endpoint for dialing a `server_role` node at `addr`: under TLS
    /// it presents this node's certificate and checks that the server's
    /// chains to the cluster CA and names `<server_role>.sluice.internal`.
    pub fn endpoint(&self, addr: &str, server_role: Role) -> Result<Endpoint, AuthError> {
        let uri = self.uri(addr);
        let endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| AuthError::Config(format!("bad address {addr}: {e}")))?;
        match self {
            Transport::Insecure | Transport::Memory(_) => Ok(endpoint),
            Transport::Tls(m) => endpoint
                .tls_config(m.client_config(server_role))
                .map_err(|e| AuthError::Config(format!("TLS for {uri}: {e}"))),
        }
    }

    /// Opens the channel `endpoint` describes (made by
    /// [`Transport::endpoint`]), lazily: the first call connects and a
    /// failed connection is retried by the next call. Must be called
    /// inside a tokio runtime. The one way a cluster client dials.
    pub fn dial(&self, endpoint: Endpoint) -> Channel {
        match self {
            Transport::Memory(net) => endpoint.connect_with_connector_lazy(net.connector()),
            Transport::Tls(_) | Transport::Insecure => endpoint.connect_lazy(),
        }
    }

    /// Like [`Transport::dial`], connecting now.
    pub async fn connect(&self, endpoint: Endpoint) -> Result<Channel, tonic::transport::Error> {
        match self {
            Transport::Memory(net) => endpoint.connect_with_connector(net.connector()).await,
            Transport::Tls(_) | Transport::Insecure => endpoint.connect().await,
        }
    }

    /// A gRPC server builder for `policy`: TLS (under TLS), the
    /// [`crate::AuthLayer`] in front of every service, and on a memory net
    /// its [`crate::faults::FaultLayer`]. The one place a cluster server
    /// is built.
    #[allow(clippy::type_complexity)]
    pub fn server(
        &self,
        policy: crate::Policy,
    ) -> Result<
        tonic::transport::Server<
            Stack<crate::faults::FaultLayer, Stack<crate::AuthLayer, tower::layer::util::Identity>>,
        >,
        AuthError,
    > {
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = self.server_tls() {
            builder = builder
                .tls_config(tls)
                .map_err(|e| AuthError::Config(format!("server TLS: {e}")))?;
        }
        let faults = match self {
            Transport::Memory(net) => crate::faults::FaultLayer::new(Arc::clone(net.faults())),
            Transport::Tls(_) | Transport::Insecure => crate::faults::FaultLayer::none(),
        };
        Ok(builder
            .layer(crate::AuthLayer::new(policy, self))
            .layer(faults))
    }

    /// The server TLS config (`None` in plaintext).
    pub fn server_tls(&self) -> Option<ServerTlsConfig> {
        match self {
            Transport::Tls(m) => Some(m.server_config()),
            Transport::Insecure | Transport::Memory(_) => None,
        }
    }
}

impl TlsMaterial {
    fn identity_pem(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem)
    }

    /// Server side: present this node's certificate, verify client
    /// certificates against the cluster CA. A client without a
    /// certificate still completes the handshake (so it gets gRPC
    /// `UNAUTHENTICATED` from [`crate::AuthLayer`] rather than a bare
    /// handshake failure).
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity_pem())
            .client_ca_root(Certificate::from_pem(&self.ca_pem))
            .client_auth_optional(true)
    }

    /// Client side, dialing a `server_role` node.
    pub fn client_config(&self, server_role: Role) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(self.identity_pem())
            .domain_name(server_role.dns_name())
    }
}

/// Whether `s` is a cluster endpoint a node can be configured with: an
/// `http://` (plaintext, `insecure_cluster`) or `https://` (mutual TLS)
/// URL with a host, which tonic accepts as an endpoint. The one check
/// every role's config and meta's membership changes use.
pub fn is_endpoint(s: &str) -> bool {
    let host = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"));
    matches!(host, Some(h) if !h.is_empty() && !h.starts_with('/'))
        && tonic::transport::Endpoint::from_shared(s.to_string()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_or_https_urls_with_a_host() {
        assert!(is_endpoint("http://10.0.0.14:7001"));
        assert!(is_endpoint("https://meta-4:7001"));
        assert!(!is_endpoint("meta-4:7001"));
        assert!(!is_endpoint("https://"));
        assert!(!is_endpoint("http:///path"));
        assert!(!is_endpoint("ftp://meta-4:7001"));
        assert!(!is_endpoint("http://[::1"));
    }

    #[test]
    fn exactly_one_of_tls_and_insecure() {
        assert!(matches!(
            Transport::from_config(None, false, Role::Meta),
            Err(AuthError::Config(_))
        ));
        assert!(matches!(
            Transport::from_config(None, true, Role::Meta),
            Ok(Transport::Insecure)
        ));
        let dir = tempfile::tempdir().unwrap();
        let files =
            crate::pki::ensure_dir(dir.path(), &[Identity::new(Role::Gateway, "g").unwrap()])
                .unwrap();
        assert!(Transport::from_config(Some(&files[0]), true, Role::Gateway).is_err());
        assert!(Transport::from_config(Some(&files[0]), false, Role::Meta).is_err());
        let t = Transport::from_config(Some(&files[0]), false, Role::Gateway).unwrap();
        assert_eq!(t.uri("http://127.0.0.1:1"), "https://127.0.0.1:1");
        assert_eq!(t.uri("127.0.0.1:1"), "https://127.0.0.1:1");
        assert_eq!(Transport::Insecure.uri("https://h:1"), "http://h:1");
        t.endpoint("http://127.0.0.1:1", Role::Meta).unwrap();
    }

    #[test]
    fn config_section_parses() {
        let t: ClusterTls =
            toml::from_str("ca_file = \"a\"\ncert_file = \"b\"\nkey_file = \"c\"\n").unwrap();
        assert_eq!(t.key_file, PathBuf::from("c"));
        assert!(toml::from_str::<ClusterTls>("ca_file = \"a\"\n").is_err());
    }
}
