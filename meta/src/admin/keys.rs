//! s3auth admin handlers: access keys (`sluice admin key ...`).
//!
//! The leader generates a new key's id and secret, then proposes them in a
//! `CreateAccessKey` entry with the caller's op id; a retry of that op id
//! (even on a new leader, which would generate another pair) gets the
//! first key back from the session table. Secrets are never logged.

use rand::Rng;
use sluice_proto::admin as apb;
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft as rpb;
use sluice_proto::raft::meta_command::Command;
use tonic::Status;

use crate::api::{linearizable, propose, sm_status, unexpected};
use crate::raft::MetaRaft;
use crate::sm::{self, Applied};
use crate::store::KvStore;
use crate::version::Gate;

/// Prefix of generated access key ids.
pub const KEY_ID_PREFIX: &str = "SK";

/// Random characters after [`KEY_ID_PREFIX`] (uppercase hex: 88 bits).
const KEY_ID_HEX: usize = 22;

/// Random bytes of a generated secret (hex encoded: 64 characters).
const SECRET_BYTES: usize = 32;

/// A new (id, secret) pair from the OS-seeded thread RNG.
pub fn generate_key() -> (String, String) {
    let mut rng = rand::thread_rng();
    let mut id_bytes = [0u8; KEY_ID_HEX.div_ceil(2)];
    rng.fill(&mut id_bytes[..]);
    let mut id = hex::encode_upper(id_bytes);
    id.truncate(KEY_ID_HEX);
    let mut secret = [0u8; SECRET_BYTES];
    rng.fill(&mut secret[..]);
    (format!("{KEY_ID_PREFIX}{id}"), hex::encode(secret))
}

/// The key without its secret.
pub fn key_info(key: &pb::AccessKey) -> apb::KeyInfo {
    apb::KeyInfo {
        id: key.id.clone(),
        name: key.name.clone(),
        created_ms: key.created_ms,
        grants: key.grants.clone(),
    }
}

fn read_key<K: KvStore>(kv: &K, id: &str) -> Result<pb::AccessKey, Status> {
    sm::access::require_access_key(kv, id).map_err(sm_status)
}

pub(crate) async fn create_key<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
    gate: &Gate,
    req: apb::CreateKeyRequest,
) -> Result<apb::CreateKeyResponse, Status> {
    if req.name.is_empty() {
        return Err(sluice_proto::error::status(
            ErrorCode::InvalidArgument,
            "a key needs a name",
        ));
    }
    let (id, secret) = generate_key();
    let applied = propose(
        raft,
        kv,
        gate,
        Command::CreateAccessKey(rpb::CreateAccessKey {
            id,
            name: req.name,
            secret,
            op_id: req.op_id,
        }),
    )
    .await?;
    let Applied::KeyCreated(id) = applied else {
        return Err(unexpected("CreateAccessKey", &applied));
    };
    // Applied on this node (the leader) before client_write returned.
    let key = read_key(kv, &id)?;
    tracing::info!(key_id = %key.id, name = %key.name, "access key created");
    Ok(apb::CreateKeyResponse {
        key: Some(key_info(&key)),
        secret: key.secret,
    })
}

pub(crate) async fn list_keys<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
) -> Result<apb::ListKeysResponse, Status> {
    linearizable(raft).await?;
    let keys = sm::access::list_access_keys(kv).map_err(sm_status)?;
    Ok(apb::ListKeysResponse {
        keys: keys.iter().map(key_info).collect(),
    })
}

pub(crate) async fn delete_key<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
    gate: &Gate,
    req: apb::DeleteKeyRequest,
) -> Result<apb::DeleteKeyResponse, Status> {
    let id = req.id.clone();
    let applied = propose(
        raft,
        kv,
        gate,
        Command::DeleteAccessKey(rpb::DeleteAccessKey {
            id: req.id,
            op_id: req.op_id,
        }),
    )
    .await?;
    if applied != Applied::Done {
        return Err(unexpected("DeleteAccessKey", &applied));
    }
    tracing::info!(key_id = %id, "access key deleted");
    Ok(apb::DeleteKeyResponse {})
}

pub(crate) async fn set_grant<K: KvStore>(
    raft: &MetaRaft,
    kv: &K,
    gate: &Gate,
    req: apb::KeyGrantRequest,
    allow: bool,
) -> Result<apb::KeyGrantResponse, Status> {
    let id = req.id.clone();
    let applied = propose(
        raft,
        kv,
        gate,
        Command::SetKeyGrant(rpb::SetKeyGrant {
            id: req.id,
            bucket: req.bucket,
            read: req.read,
            write: req.write,
            owner: req.owner,
            allow,
            op_id: req.op_id,
        }),
    )
    .await?;
    if applied != Applied::Done {
        return Err(unexpected("SetKeyGrant", &applied));
    }
    let key = read_key(kv, &id)?;
    Ok(apb::KeyGrantResponse {
        key: Some(key_info(&key)),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_keys_look_right_and_differ() {
        let (id, secret) = super::generate_key();
        assert_eq!(id.len(), 24);
        assert!(id.starts_with("SK"));
        assert!(
            id[2..]
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        );
        assert_eq!(secret.len(), 64);
        assert_ne!(super::generate_key(), super::generate_key());
    }
}
