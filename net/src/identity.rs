//! [`Role`] and [`Identity`]: who a node certificate names.

use std::fmt;
use std::str::FromStr;

use crate::AuthError;

/// The SPIFFE trust domain of every Sluice certificate.
pub const TRUST_DOMAIN: &str = "sluice";

/// The DNS suffix of the per-role names (`<role>.sluice.internal`) a
/// client checks the server's certificate against.
pub const DNS_SUFFIX: &str = "sluice.internal";

/// Longest accepted id in a certificate (bytes).
pub const MAX_ID_LEN: usize = 64;

/// What a certificate allows its holder to be in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A meta node (Raft peer).
    Meta,
    /// A datanode.
    Datanode,
    /// An S3 gateway.
    Gateway,
    /// An operator running `sluice admin`.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Meta, Role::Datanode, Role::Gateway, Role::Admin];

    /// The role's name in SPIFFE ids, CNs and DNS names.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Meta => "meta",
            Role::Datanode => "datanode",
            Role::Gateway => "gateway",
            Role::Admin => "admin",
        }
    }

    /// `<role>.sluice.internal`: the DNS SAN every certificate of this role
    /// carries and the name a client verifies when it dials this role.
    pub fn dns_name(self) -> String {
        format!("{}.{DNS_SUFFIX}", self.as_str())
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = AuthError;
    fn from_str(s: &str) -> Result<Self, AuthError> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| AuthError::BadIdentity(format!("unknown role {s:?}")))
    }
}

/// A caller's identity, read from the SAN URI
/// `spiffe://sluice/<role>/<id>` of its certificate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The role the certificate grants.
    pub role: Role,
    /// The node id (meta and datanode ids are decimal numbers, a gateway's
    /// is its `gateway_id`, an admin's a free name).
    pub id: String,
}

impl Identity {
    /// An identity; `id` is 1..=64 bytes of `[A-Za-z0-9._-]`.
    pub fn new(role: Role, id: impl Into<String>) -> Result<Self, AuthError> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= MAX_ID_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !ok {
            return Err(AuthError::BadIdentity(format!(
                "id {id:?} must be 1..={MAX_ID_LEN} characters of [A-Za-z0-9._-]"
            )));
        }
        Ok(Identity { role, id })
    }

    /// `spiffe://sluice/<role>/<id>`.
    pub fn spiffe_id(&self) -> String {
        format!("spiffe://{TRUST_DOMAIN}/{}/{}", self.role, self.id)
    }

    /// The certificate's common name, `<role>-<id>`.
    pub fn common_name(&self) -> String {
        format!("{}-{}", self.role, self.id)
    }

    /// Parses `spiffe://sluice/<role>/<id>`.
    pub fn from_spiffe_id(uri: &str) -> Result<Self, AuthError> {
        let bad = || {
            AuthError::BadIdentity(format!(
                "{uri:?} is not spiffe://{TRUST_DOMAIN}/<role>/<id>"
            ))
        };
        let rest = uri
            .strip_prefix("spiffe://")
            .and_then(|r| r.strip_prefix(TRUST_DOMAIN))
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(bad)?;
        let (role, id) = rest.split_once('/').ok_or_else(bad)?;
        Identity::new(role.parse()?, id)
    }

    /// The identity of a DER certificate: its one `spiffe://sluice/` SAN
    /// URI. A certificate with none, or with several, has no identity.
    pub fn from_der(der: &[u8]) -> Result<Self, AuthError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| AuthError::BadCertificate(e.to_string()))?;
        let san = cert
            .subject_alternative_name()
            .map_err(|e| AuthError::BadCertificate(e.to_string()))?
            .ok_or_else(|| AuthError::BadIdentity("certificate has no subjectAltName".into()))?;
        let prefix = format!("spiffe://{TRUST_DOMAIN}/");
        let mut found = None;
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name
                && uri.starts_with(&prefix)
            {
                if found.is_some() {
                    return Err(AuthError::BadIdentity(
                        "certificate has more than one spiffe://sluice/ URI".into(),
                    ));
                }
                found = Some(Identity::from_spiffe_id(uri)?);
            }
        }
        found.ok_or_else(|| {
            AuthError::BadIdentity(format!("certificate has no {prefix}<role>/<id> SAN URI"))
        })
    }

    /// The id as a node number (meta and datanode ids).
    pub fn numeric_id(&self) -> Option<u64> {
        self.id.parse().ok()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.role, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_round_trip() {
        let id = Identity::new(Role::Datanode, "7").unwrap();
        assert_eq!(id.spiffe_id(), "spiffe://sluice/datanode/7");
        assert_eq!(id.common_name(), "datanode-7");
        assert_eq!(Identity::from_spiffe_id(&id.spiffe_id()).unwrap(), id);
        assert_eq!(id.numeric_id(), Some(7));
    }

    #[test]
    fn bad_ids_are_refused() {
        for uri in [
            "spiffe://other/meta/1",
            "spiffe://sluice/root/1",
            "spiffe://sluice/meta/",
            "spiffe://sluice/meta/a/b",
            "spiffe://sluice/meta",
            "https://sluice/meta/1",
        ] {
            assert!(Identity::from_spiffe_id(uri).is_err(), "{uri}");
        }
    }
}
