//! S3 over HTTPS: the rustls server config of the S3 listener (TLS 1.2 and
//! 1.3, aws-lc-rs crypto, ALPN `h2` and `http/1.1`), loaded from the PEM files
//! of `[s3_tls]` and reloaded on SIGHUP.
//!
//! [`S3TlsAcceptor`] holds the current config; [`S3TlsAcceptor::reload`]
//! swaps in a freshly loaded one, so connections accepted afterwards get
//! the new certificate while open ones keep theirs. A reload whose files do
//! not load keeps the old config and logs an error.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a TLS handshake may take before the connection is dropped (a
/// client that connects and sends nothing does not hold its slot longer).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0}: no certificate in the file")]
    NoCertificate(PathBuf),
    #[error("certificate {cert} / key {key}: {source}")]
    Rustls {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// A rustls server config serving the chain in `cert_file` with the key in
/// `key_file` (PEM), TLS 1.2 and 1.3. ALPN (RFC 7301) offers `h2` then
/// `http/1.1` when the listener serves HTTP/2 (`http2`), else `http/1.1`
/// only: a client that negotiated `h2` on an HTTP/1-only listener would
/// send a preface the server closes the connection on.
pub fn load_server_config(
    cert_file: &Path,
    key_file: &Path,
    http2: bool,
) -> Result<ServerConfig, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|source| TlsError::Read {
            path: cert_file.to_owned(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: cert_file.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert_file.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|source| TlsError::Read {
        path: key_file.to_owned(),
        source,
    })?;
    let rustls_err = |source| TlsError::Rustls {
        cert: cert_file.to_owned(),
        key: key_file.to_owned(),
        source,
    };
    let mut config = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .map_err(rustls_err)?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(rustls_err)?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

/// The S3 listener's TLS acceptor: the certificate files and the config
/// currently served.
pub struct S3TlsAcceptor {
    cert_file: PathBuf,
    key_file: PathBuf,
    /// Whether ALPN offers `h2` (the listener's `http2` setting).
    http2: bool,
    current: RwLock<TlsAcceptor>,
}

impl S3TlsAcceptor {
    /// Loads `cert_file` and `key_file`; an error when they do not load.
    /// `http2`: whether the listener serves HTTP/2 (ALPN `h2`).
    pub fn load(cert_file: &Path, key_file: &Path, http2: bool) -> Result<Arc<Self>, TlsError> {
        let config = load_server_config(cert_file, key_file, http2)?;
        Ok(Arc::new(S3TlsAcceptor {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            http2,
            current: RwLock::new(TlsAcceptor::from(Arc::new(config))),
        }))
    }

    /// Re-reads the files: new connections get the new certificate. On an
    /// error the old config stays and the error is logged and returned.
    pub fn reload(&self) -> Result<(), TlsError> {
        match load_server_config(&self.cert_file, &self.key_file, self.http2) {
            Ok(config) => {
                *self.current.write().expect("tls config lock") =
                    TlsAcceptor::from(Arc::new(config));
                tracing::info!(cert = %self.cert_file.display(), "S3 TLS certificate reloaded");
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "S3 TLS reload failed; keeping the previous certificate");
                Err(e)
            }
        }
    }

    /// Runs the TLS handshake on `stream` with the current config, within
    /// [`HANDSHAKE_TIMEOUT`].
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let acceptor = self.current.read().expect("tls config lock").clone();
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }

    /// Reloads on every SIGHUP until the returned task is aborted.
    pub fn reload_on_sighup(self: &Arc<Self>) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())?;
        let this = Arc::clone(self);
        Ok(tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the S3 TLS certificate");
                let _ = this.reload();
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;
    use tokio::net::TcpListener;

    /// A self-signed certificate for 127.0.0.1: (cert PEM, key PEM, DER).
    fn self_signed() -> (String, String, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }

    /// Connects to `addr` trusting only `root`; the server's leaf on success.
    async fn handshake(
        addr: std::net::SocketAddr,
        root: &CertificateDer<'static>,
    ) -> std::io::Result<CertificateDer<'static>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let tls = connector.connect(name, tcp).await?;
        Ok(tls.get_ref().1.peer_certificates().unwrap()[0].clone())
    }

    #[tokio::test]
    async fn reload_swaps_the_certificate_and_a_bad_file_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = (dir.path().join("s3.crt"), dir.path().join("s3.key"));
        let (c1, k1, der1) = self_signed();
        std::fs::write(&cert_path, c1).unwrap();
        std::fs::write(&key_path, k1).unwrap();
        let acceptor = S3TlsAcceptor::load(&cert_path, &key_path, false).unwrap();

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Arc::clone(&acceptor);
        let task = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let server = Arc::clone(&server);
                tokio::spawn(async move {
                    if let Ok(mut tls) = server.accept(stream).await {
                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut tls).await;
                    }
                });
            }
        });

        assert_eq!(handshake(addr, &der1).await.unwrap(), der1);

        let (c2, k2, der2) = self_signed();
        std::fs::write(&cert_path, c2).unwrap();
        std::fs::write(&key_path, k2).unwrap();
        acceptor.reload().unwrap();
        assert_eq!(handshake(addr, &der2).await.unwrap(), der2);
        assert!(
            handshake(addr, &der1).await.is_err(),
            "the old certificate is no longer served"
        );

        // A broken file: the reload fails and the current cert stays.
        std::fs::write(&cert_path, "not a certificate").unwrap();
        assert!(acceptor.reload().is_err());
        assert_eq!(handshake(addr, &der2).await.unwrap(), der2);
        // A key that does not match the certificate is refused too.
        let (c3, _, _) = self_signed();
        std::fs::write(&cert_path, c3).unwrap();
        assert!(matches!(acceptor.reload(), Err(TlsError::Rustls { .. })));
        assert_eq!(handshake(addr, &der2).await.unwrap(), der2);
        task.abort();
    }

    #[test]
    fn missing_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = S3TlsAcceptor::load(
            &dir.path().join("nope.crt"),
            &dir.path().join("nope.key"),
            false,
        );
        assert!(matches!(err, Err(TlsError::Read { .. })));
        std::fs::write(dir.path().join("empty.crt"), "").unwrap();
        let err = S3TlsAcceptor::load(
            &dir.path().join("empty.crt"),
            &dir.path().join("nope.key"),
            false,
        );
        assert!(matches!(err, Err(TlsError::NoCertificate(_))));
    }
}
