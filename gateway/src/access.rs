//! Who may do what over S3: access keys and per-bucket authorization.
//!
//! * The gateway config's `access_key`/`secret_key` is the *root key*: it
//!   owns every bucket and is never looked up in meta (`sluice dev`'s key
//!   is this key).
//! * Any other access key id is resolved in meta (`GetAccessKey`: secret
//!   and bucket grants) through [`AccessKeys`], a small cache of at most
//!   [`KEY_CACHE_ENTRIES`] keys, each trusted for [`KEY_CACHE_TTL`]: a key
//!   deleted (or a grant changed) in meta takes effect on this gateway
//!   within that TTL. Unknown ids are cached too (same bound and TTL), so a
//!   client hammering a wrong key costs one meta read per TTL.
//! * [`KeyAuth`] is the s3s `S3Auth` (the secret for SigV4); an unknown id
//!   is `403 InvalidAccessKeyId`.
//! * [`KeyAccess`] is the s3s `S3Access`: every request is authorized per
//!   bucket before its input is parsed ([`required`]: read ops need `read`,
//!   write ops `write`, bucket deletion and bucket configuration `owner`);
//!   CopyObject and UploadPartCopy also need `read` on the source bucket.
//!   A missing permission is `403 AccessDenied`. CreateBucket is open to
//!   every valid key (the creator becomes the owner, in meta), ListBuckets
//!   too (the handler shows only buckets the key has a grant on).
//!
//! Secrets are never logged: [`pb::AccessKey`]'s Debug redacts them and
//! nothing here prints a secret.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::dto::{CopyObjectInput, CopySource, UploadPartCopyInput};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Result};
use sluice_meta::MetaClient;
use sluice_proto::meta as pb;

/// Most access keys the gateway's key cache holds.
pub const KEY_CACHE_ENTRIES: usize = 1024;

/// How long a cached key (or an unknown id) is trusted before meta is
/// asked again: the most a deletion or grant change waits to take effect.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);

/// The permission an S3 operation needs on its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any valid key (CreateBucket, ListBuckets).
    Authenticated,
    Read,
    Write,
    Owner,
}

/// The permission operation `op` (s3s operation name) needs on its
/// bucket. Deny by default: an operation not named as a read is a write on
/// an object, and any other bucket-level operation needs `owner`.
pub fn required(op: &str) -> Need {
    match op {
        "CreateBucket" | "ListBuckets" => Need::Authenticated,
        "HeadBucket"
        | "GetBucketLocation"
        | "GetBucketVersioning"
        | "ListObjects"
        | "ListObjectsV2"
        | "ListObjectVersions"
        | "ListMultipartUploads"
        | "ListParts"
        | "GetObject"
        | "HeadObject"
        | "GetObjectAttributes"
        | "GetObjectTagging"
        | "GetObjectAcl"
        | "GetObjectRetention"
        | "GetObjectLegalHold" => Need::Read,
        op if op.contains("Bucket") => Need::Owner,
        _ => Need::Write,
    }
}

/// The authenticated caller of a request, put in the request's extensions
/// by [`KeyAccess`] for the handlers (bucket listing, bucket creation).
#[derive(Clone)]
pub struct Caller {
    /// `None`: the root key.
    pub key: Option<Arc<pb::AccessKey>>,
    keys: Arc<AccessKeys>,
}

impl Caller {
    /// The access key id a new bucket's owner grant goes to (empty: root).
    pub fn owner_key_id(&self) -> &str {
        self.key.as_ref().map_or("", |k| k.id.as_str())
    }

    /// Whether the caller may see `bucket` in ListBuckets (any grant).
    pub fn sees(&self, bucket: &str) -> bool {
        self.key.as_ref().is_none_or(|k| grant(k, bucket).is_some())
    }

    /// Whether the caller owns `bucket`.
    pub fn owns(&self, bucket: &str) -> bool {
        self.key
            .as_ref()
            .is_none_or(|k| grant(k, bucket).is_some_and(|g| g.owner))
    }

    /// Forgets the cached grants of the caller's key (after it created a
    /// bucket, so its next request sees the new owner grant).
    pub fn refresh(&self) {
        if let Some(k) = &self.key {
            self.keys.invalidate(&k.id);
        }
    }
}

fn grant<'a>(key: &'a pb::AccessKey, bucket: &str) -> Option<&'a pb::BucketGrant> {
    key.grants.iter().find(|g| g.bucket == bucket)
}

/// Whether `key` (`None`: root) has `need` on `bucket`.
pub fn allows(key: Option<&pb::AccessKey>, bucket: &str, need: Need) -> bool {
    let Some(key) = key else { return true };
    let g = grant(key, bucket);
    match need {
        Need::Authenticated => true,
        Need::Read => g.is_some_and(|g| g.read),
        Need::Write => g.is_some_and(|g| g.write),
        Need::Owner => g.is_some_and(|g| g.owner),
    }
}

/// One cached answer of meta: the key, or `None` for an unknown id.
struct Cached {
    fetched: Instant,
    key: Option<Arc<pb::AccessKey>>,
}

/// The root key and a bounded, expiring cache of the keys stored in meta.
pub struct AccessKeys {
    root_id: String,
    root_secret: SecretKey,
    meta: Option<MetaClient>,
    max_entries: usize,
    ttl: Duration,
    cache: Mutex<HashMap<String, Cached>>,
}

/// What an access key id resolves to.
#[derive(Clone)]
pub enum Resolved {
    Root,
    Key(Arc<pb::AccessKey>),
    Unknown,
}

impl AccessKeys {
    /// The root key `root_id`/`root_secret` plus keys looked up in `meta`
    /// (`None`: only the root key exists), cached with the default bound
    /// and TTL.
    pub fn new(root_id: &str, root_secret: &str, meta: Option<MetaClient>) -> Arc<Self> {
        Self::with_cache(root_id, root_secret, meta, KEY_CACHE_ENTRIES, KEY_CACHE_TTL)
    }

    /// [`AccessKeys::new`] with a cache of `max_entries` keys trusted for `ttl`.
    pub fn with_cache(
        root_id: &str,
        root_secret: &str,
        meta: Option<MetaClient>,
        max_entries: usize,
        ttl: Duration,
    ) -> Arc<Self> {
        Arc::new(AccessKeys {
            root_id: root_id.to_string(),
            root_secret: SecretKey::from(root_secret),
            meta,
            max_entries: max_entries.max(1),
            ttl,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Resolves `id`: the root key, a cached answer younger than the TTL,
    /// or meta's answer (then cached). A meta failure is
    /// `503 ServiceUnavailable` and is not cached.
    pub async fn resolve(&self, id: &str) -> S3Result<Resolved> {
        if id == self.root_id {
            return Ok(Resolved::Root);
        }
        let Some(meta) = &self.meta else {
            return Ok(Resolved::Unknown);
        };
        if let Some(hit) = self.cached(id) {
            return Ok(hit);
        }
        let key = match meta.get_access_key(id).await {
            Ok(k) => k.map(Arc::new),
            Err(e) => {
                tracing::warn!(key_id = %id, error = %e, "looking up an access key in meta failed");
                return Err(S3Error::with_message(
                    S3ErrorCode::ServiceUnavailable,
                    "The access key could not be looked up; please retry.",
                ));
            }
        };
        self.insert(id, key.clone());
        Ok(match key {
            Some(k) => Resolved::Key(k),
            None => Resolved::Unknown,
        })
    }

    fn cached(&self, id: &str) -> Option<Resolved> {
        let cache = self.cache.lock().expect("key cache lock");
        let c = cache.get(id)?;
        if c.fetched.elapsed() >= self.ttl {
            return None;
        }
        Some(match &c.key {
            Some(k) => Resolved::Key(Arc::clone(k)),
            None => Resolved::Unknown,
        })
    }

    fn insert(&self, id: &str, key: Option<Arc<pb::AccessKey>>) {
        let mut cache = self.cache.lock().expect("key cache lock");
        if cache.len() >= self.max_entries && !cache.contains_key(id) {
            let ttl = self.ttl;
            cache.retain(|_, c| c.fetched.elapsed() < ttl);
            // Still full: drop the oldest entry (O(entries), bounded).
            if cache.len() >= self.max_entries
                && let Some(oldest) = cache
                    .iter()
                    .min_by_key(|(_, c)| c.fetched)
                    .map(|(k, _)| k.clone())
            {
                cache.remove(&oldest);
            }
        }
        cache.insert(
            id.to_string(),
            Cached {
                fetched: Instant::now(),
                key,
            },
        );
    }

    /// Forgets the cached answer for `id`.
    pub fn invalidate(&self, id: &str) {
        self.cache.lock().expect("key cache lock").remove(id);
    }

    /// Keys in the cache (tests).
    pub fn cached_entries(&self) -> usize {
        self.cache.lock().expect("key cache lock").len()
    }
}

/// The s3s authentication provider: the secret of an access key id.
pub struct KeyAuth(pub Arc<AccessKeys>);

#[async_trait::async_trait]
impl S3Auth for KeyAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.0.resolve(access_key).await? {
            Resolved::Root => Ok(self.0.root_secret.clone()),
            Resolved::Key(k) => Ok(SecretKey::from(k.secret.as_str())),
            Resolved::Unknown => Err(S3Error::with_message(
                S3ErrorCode::InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records.",
            )),
        }
    }
}

/// Where the s3s access hook puts the name of the S3 operation it routed a
/// request to (e.g. `UploadPart`), for the duration histogram.
#[derive(Clone, Default)]
pub(crate) struct OpName(pub(crate) Arc<std::sync::OnceLock<String>>);

/// The s3s access check: records the operation name, denies anonymous
/// requests, and authorizes the caller on the request's bucket.
pub struct KeyAccess(pub Arc<AccessKeys>);

fn access_denied() -> S3Error {
    S3Error::with_message(S3ErrorCode::AccessDenied, "Access Denied")
}

impl KeyAccess {
    fn caller_of<T>(req: &S3Request<T>) -> S3Result<&Caller> {
        req.extensions.get::<Caller>().ok_or_else(access_denied)
    }

    fn check_source(req_caller: &Caller, source: &CopySource) -> S3Result<()> {
        match source {
            CopySource::Bucket { bucket, .. } => {
                if allows(req_caller.key.as_deref(), &bucket[..], Need::Read) {
                    Ok(())
                } else {
                    Err(access_denied())
                }
            }
            _ => Err(access_denied()),
        }
    }
}

#[async_trait::async_trait]
impl S3Access for KeyAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name().to_string();
        if let Some(slot) = cx.extensions_mut().get::<OpName>() {
            let _ = slot.0.set(op.clone());
        }
        let Some(access_key) = cx.credentials().map(|c| c.access_key.clone()) else {
            return Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "Signature is required",
            ));
        };
        let key = match self.0.resolve(&access_key).await? {
            Resolved::Root => None,
            Resolved::Key(k) => Some(k),
            // Resolved during authentication; deleted since (cache expiry).
            Resolved::Unknown => {
                return Err(S3Error::new(S3ErrorCode::InvalidAccessKeyId));
            }
        };
        let need = required(&op);
        let bucket = match cx.s3_path() {
            S3Path::Root => None,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => Some(bucket.to_string()),
        };
        if let (Some(bucket), Some(k)) = (&bucket, &key)
            && need != Need::Authenticated
            && !allows(Some(k), bucket, need)
        {
            tracing::debug!(key_id = %k.id, %bucket, op = %op, ?need, "access denied");
            return Err(access_denied());
        }
        cx.extensions_mut().insert(Caller {
            key,
            keys: Arc::clone(&self.0),
        });
        Ok(())
    }

    async fn copy_object(&self, req: &mut S3Request<CopyObjectInput>) -> S3Result<()> {
        Self::check_source(Self::caller_of(req)?, &req.input.copy_source)
    }

    async fn upload_part_copy(&self, req: &mut S3Request<UploadPartCopyInput>) -> S3Result<()> {
        Self::check_source(Self::caller_of(req)?, &req.input.copy_source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(grants: &[(&str, bool, bool, bool)]) -> pb::AccessKey {
        pb::AccessKey {
            id: "SK1".into(),
            name: "n".into(),
            secret: "s".into(),
            created_ms: 0,
            grants: grants
                .iter()
                .map(|&(b, read, write, owner)| pb::BucketGrant {
                    bucket: b.into(),
                    read,
                    write,
                    owner,
                })
                .collect(),
        }
    }

    #[test]
    fn operations_need_the_right_permission() {
        for op in [
            "GetObject",
            "HeadObject",
            "ListObjectsV2",
            "ListParts",
            "HeadBucket",
        ] {
            assert_eq!(required(op), Need::Read, "{op}");
        }
        for op in [
            "PutObject",
            "DeleteObject",
            "DeleteObjects",
            "CopyObject",
            "CreateMultipartUpload",
            "UploadPart",
            "UploadPartCopy",
            "CompleteMultipartUpload",
            "AbortMultipartUpload",
            "PutObjectTagging",
        ] {
            assert_eq!(required(op), Need::Write, "{op}");
        }
        for op in [
            "DeleteBucket",
            "PutBucketAcl",
            "GetBucketAcl",
            "PutBucketPolicy",
            "DeleteBucketPolicy",
            "PutBucketVersioning",
        ] {
            assert_eq!(required(op), Need::Owner, "{op}");
        }
        assert_eq!(required("CreateBucket"), Need::Authenticated);
        assert_eq!(required("ListBuckets"), Need::Authenticated);
    }

    #[test]
    fn grants_decide_per_bucket() {
        let k = key(&[("r", true, false, false), ("o", false, false, true)]);
        assert!(allows(Some(&k), "r", Need::Read));
        assert!(!allows(Some(&k), "r", Need::Write));
        assert!(!allows(Some(&k), "r", Need::Owner));
        assert!(allows(Some(&k), "o", Need::Owner));
        assert!(!allows(Some(&k), "o", Need::Read));
        assert!(!allows(Some(&k), "other", Need::Read));
        assert!(allows(None, "anything", Need::Owner));
    }

    #[tokio::test]
    async fn the_cache_is_bounded_and_expires() {
        // A meta that never answers: only the cache and the root key work.
        let keys = AccessKeys::with_cache("ROOT", "rs", None, 2, Duration::from_millis(50));
        assert!(matches!(
            keys.resolve("ROOT").await.unwrap(),
            Resolved::Root
        ));
        assert!(matches!(
            keys.resolve("X").await.unwrap(),
            Resolved::Unknown
        ));
        keys.insert("A", Some(Arc::new(key(&[]))));
        keys.insert("B", None);
        keys.insert("C", None);
        assert_eq!(keys.cached_entries(), 2);
        assert!(keys.cached("C").is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert!(keys.cached("C").is_none(), "expired after the TTL");
        keys.insert("D", None);
        // The full cache first drops what expired.
        assert_eq!(keys.cached_entries(), 1);
        keys.invalidate("D");
        assert_eq!(keys.cached_entries(), 0);
    }
}
