//! Debug impls of the messages that hold an access key secret (their
//! derived Debug is skipped in `build.rs`): every field but the secret,
//! which prints as `<redacted>`.

use std::fmt;

const REDACTED: &str = "<redacted>";

impl fmt::Debug for crate::meta::AccessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessKey")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("secret", &REDACTED)
            .field("created_ms", &self.created_ms)
            .field("grants", &self.grants)
            .finish()
    }
}

impl fmt::Debug for crate::raft::CreateAccessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateAccessKey")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("secret", &REDACTED)
            .field("op_id", &self.op_id)
            .finish()
    }
}

impl fmt::Debug for crate::admin::CreateKeyResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateKeyResponse")
            .field("key", &self.key)
            .field("secret", &REDACTED)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_redacted_in_debug() {
        let key = crate::meta::AccessKey {
            id: "SKID".into(),
            name: "n".into(),
            secret: "TOPSECRET".into(),
            created_ms: 1,
            grants: Vec::new(),
        };
        let cmd = crate::raft::CreateAccessKey {
            id: "SKID".into(),
            name: "n".into(),
            secret: "TOPSECRET".into(),
            op_id: "op".into(),
        };
        let resp = crate::admin::CreateKeyResponse {
            key: None,
            secret: "TOPSECRET".into(),
        };
        for s in [
            format!("{key:?}"),
            format!("{cmd:?}"),
            format!("{resp:?}"),
            format!("{:?}", Some(&key)),
        ] {
            assert!(!s.contains("TOPSECRET"), "{s}");
            assert!(s.contains("<redacted>"), "{s}");
        }
    }
}
