//! A small PKI for one cluster: a CA, and node certificates naming a
//! [`Identity`] (SAN URI `spiffe://sluice/<role>/<id>`, CN `<role>-<id>`,
//! DNS SAN `<role>.sluice.internal`, plus optional extra DNS/IP SANs).
//!
//! Files (PEM) in a certificate directory:
//! * `ca.pem`, `ca.key`: the CA certificate and key (`init`);
//! * `<role>-<id>.pem`, `<role>-<id>.key`: a node's certificate and key.
//!
//! Every file is written with mode 0600.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::{AuthError, ClusterTls, Identity};

/// CA certificate file name in a certificate directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// CA key file name in a certificate directory.
pub const CA_KEY_FILE: &str = "ca.key";

/// How long a CA certificate is valid.
const CA_VALIDITY: Duration = Duration::days(3650);
/// How long a node certificate is valid.
const NODE_VALIDITY: Duration = Duration::days(825);
/// Backdating, for clocks behind: a node whose clock is up to this far
/// behind the issuer's still accepts the certificates.
const BACKDATE: Duration = Duration::hours(2);

/// A cluster CA that can issue node certificates.
pub struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn generate(name: &str) -> Result<Self, AuthError> {
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        let key = KeyPair::generate().map_err(cert_error)?;
        let cert = params.self_signed(&key).map_err(cert_error)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its certificate and key, PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, AuthError> {
        let key = KeyPair::from_pem(key_pem).map_err(cert_error)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(cert_error)?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            issuer,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA key, PEM.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issues a certificate for `identity` (client and server auth), with
    /// the extra `dns` names and `ips` as SANs.
    pub fn issue(
        &self,
        identity: &Identity,
        dns: &[String],
        ips: &[IpAddr],
    ) -> Result<Issued, AuthError> {
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, identity.common_name());
        params.not_before = now - BACKDATE;
        params.not_after = now + NODE_VALIDITY;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let ia5 = |s: String| {
            s.clone()
                .try_into()
                .map_err(|_| AuthError::BadIdentity(format!("{s:?} is not an IA5 name")))
        };
        let mut sans = vec![
            SanType::URI(ia5(identity.spiffe_id())?),
            SanType::DnsName(ia5(identity.role.dns_name())?),
        ];
        for name in dns {
            sans.push(SanType::DnsName(ia5(name.clone())?));
        }
        sans.extend(ips.iter().copied().map(SanType::IpAddress));
        params.subject_alt_names = sans;
        let key = KeyPair::generate().map_err(cert_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(cert_error)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn cert_error(e: rcgen::Error) -> AuthError {
    AuthError::BadCertificate(e.to_string())
}

/// Writes `contents` to `path` with mode 0600 (replacing the file).
pub fn write_private(path: &Path, contents: &str) -> Result<(), AuthError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    // An existing file keeps its mode on open: set it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io)?;
    f.write_all(contents.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

fn read(path: &Path) -> Result<String, AuthError> {
    std::fs::read_to_string(path).map_err(|source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates `dir` (if needed) and a new CA in it. Refuses to replace an
/// existing `ca.pem` or `ca.key`.
pub fn init_dir(dir: &Path) -> Result<Ca, AuthError> {
    std::fs::create_dir_all(dir).map_err(|source| AuthError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for f in [CA_CERT_FILE, CA_KEY_FILE] {
        let p = dir.join(f);
        if p.exists() {
            return Err(AuthError::Exists(p));
        }
    }
    let ca = Ca::generate("sluice cluster CA")?;
    write_private(&dir.join(CA_KEY_FILE), &ca.key_pem())?;
    write_private(&dir.join(CA_CERT_FILE), ca.cert_pem())?;
    Ok(ca)
}

/// The CA in `dir` (`ca.pem`, `ca.key`).
pub fn load_ca(dir: &Path) -> Result<Ca, AuthError> {
    Ca::from_pem(
        &read(&dir.join(CA_CERT_FILE))?,
        &read(&dir.join(CA_KEY_FILE))?,
    )
}

/// The files of `identity`'s certificate in `dir`, as a [`ClusterTls`].
pub fn node_files(dir: &Path, identity: &Identity) -> ClusterTls {
    let stem = identity.common_name();
    ClusterTls {
        ca_file: dir.join(CA_CERT_FILE),
        cert_file: dir.join(format!("{stem}.pem")),
        key_file: dir.join(format!("{stem}.key")),
    }
}

/// Issues a certificate for `identity` with the CA in `dir` and writes it
/// next to it (`<role>-<id>.pem` / `.key`, replacing older ones).
pub fn issue_to_dir(
    dir: &Path,
    identity: &Identity,
    dns: &[String],
    ips: &[IpAddr],
) -> Result<ClusterTls, AuthError> {
    let ca = load_ca(dir)?;
    let issued = ca.issue(identity, dns, ips)?;
    let files = node_files(dir, identity);
    write_private(&files.key_file, &issued.key_pem)?;
    write_private(&files.cert_file, &issued.cert_pem)?;
    Ok(files)
}

/// For `sluice dev` and tests: makes sure `dir` holds a CA and a
/// certificate for each of `identities`, creating what is missing and
/// reusing what is there. Returns each identity's files, in order.
pub fn ensure_dir(dir: &Path, identities: &[Identity]) -> Result<Vec<ClusterTls>, AuthError> {
    let ca = if dir.join(CA_CERT_FILE).exists() {
        load_ca(dir)?
    } else {
        init_dir(dir)?
    };
    let mut out = Vec::with_capacity(identities.len());
    for identity in identities {
        let files = node_files(dir, identity);
        if !(files.cert_file.exists() && files.key_file.exists()) {
            let issued = ca.issue(identity, &[], &[])?;
            write_private(&files.key_file, &issued.key_pem)?;
            write_private(&files.cert_file, &issued.cert_pem)?;
        }
        out.push(files);
    }
    Ok(out)
}

/// The paths of a [`ClusterTls`], for messages.
pub fn describe(files: &ClusterTls) -> [PathBuf; 3] {
    [
        files.ca_file.clone(),
        files.cert_file.clone(),
        files.key_file.clone(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;

    #[test]
    fn issued_certificates_carry_the_identity_and_names() {
        let ca = Ca::generate("test CA").unwrap();
        let id = Identity::new(Role::Gateway, "gw-1").unwrap();
        let issued = ca
            .issue(&id, &["s3.example".into()], &["10.0.0.5".parse().unwrap()])
            .unwrap();
        let der = pem_der(&issued.cert_pem);
        assert_eq!(Identity::from_der(&der).unwrap(), id);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cn = cert.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "gateway-gw-1");
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert!(
            names.iter().any(|n| n.contains("gateway.sluice.internal")),
            "{names:?}"
        );
        assert!(names.iter().any(|n| n.contains("s3.example")), "{names:?}");
        assert!(names.iter().any(|n| n.contains("0a:00:00:05")), "{names:?}");
        // A CA reloaded from PEM issues certificates that chain the same.
        let again = Ca::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        let other = again
            .issue(&Identity::new(Role::Meta, "1").unwrap(), &[], &[])
            .unwrap();
        assert_eq!(
            Identity::from_der(&pem_der(&other.cert_pem)).unwrap().role,
            Role::Meta
        );
    }

    #[test]
    fn files_are_private_and_init_refuses_to_overwrite() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        init_dir(dir.path()).unwrap();
        assert!(matches!(init_dir(dir.path()), Err(AuthError::Exists(_))));
        let id = Identity::new(Role::Datanode, "3").unwrap();
        let files = issue_to_dir(dir.path(), &id, &[], &[]).unwrap();
        for p in describe(&files) {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
        assert_eq!(files.load().unwrap().identity, id);
        // ensure_dir reuses what is there.
        let before = std::fs::read(&files.cert_file).unwrap();
        let again = ensure_dir(dir.path(), std::slice::from_ref(&id)).unwrap();
        assert_eq!(std::fs::read(&again[0].cert_file).unwrap(), before);
    }

    fn pem_der(pem: &str) -> Vec<u8> {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        p.contents
    }
}
