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
use s3s::dto::{CORSRule, CopyObjectInput, CopySource, DeleteObjectsInput, UploadPartCopyInput};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Result};
use sluice_meta_client::MetaClient;
use sluice_proto::meta as pb;
use sluice_proto::meta::ErrorCode;

use crate::s3::acl;
use crate::s3::policy::{self, BucketPolicy, Decision};

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
        // Making an object public is the owner's decision (S3's
        // s3:PutObjectAcl), not every writer's.
        "PutObjectAcl" => Need::Owner,
        "GetObjectLockConfiguration"
        | "PutObjectLockConfiguration"
        | "GetPublicAccessBlock"
        | "PutPublicAccessBlock"
        | "DeletePublicAccessBlock" => Need::Owner,
        op if op.contains("Bucket") => Need::Owner,
        _ => Need::Write,
    }
}

/// The authenticated caller of a request, put in the request's extensions
/// by [`KeyAccess`] for the handlers (bucket listing, bucket creation).
#[derive(Clone)]
pub struct Caller {
    /// `None`: the root key, or nobody when `anonymous`.
    pub key: Option<Arc<pb::AccessKey>>,
    /// An unsigned request.
    pub anonymous: bool,
    keys: Arc<AccessKeys>,
}

impl Caller {
    /// The access key id a new bucket's owner grant goes to (empty: root).
    pub fn owner_key_id(&self) -> &str {
        self.key.as_ref().map_or("", |k| k.id.as_str())
    }

    /// Whether the caller may see `bucket` in ListBuckets (any grant).
    pub fn sees(&self, bucket: &str) -> bool {
        !self.anonymous && self.key.as_ref().is_none_or(|k| grant(k, bucket).is_some())
    }

    /// Whether the caller owns `bucket`.
    pub fn owns(&self, bucket: &str) -> bool {
        !self.anonymous
            && self
                .key
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

/// A bounded map whose entries are trusted for a TTL: at most
/// `max_entries`; a full cache first drops expired entries, then the
/// oldest one. Used for access keys and bucket settings.
pub(crate) struct TtlCache<V> {
    max_entries: usize,
    ttl: Duration,
    map: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> TtlCache<V> {
    pub(crate) fn new(max_entries: usize, ttl: Duration) -> Self {
        TtlCache {
            max_entries: max_entries.max(1),
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The value cached for `id`, if younger than the TTL.
    pub(crate) fn get(&self, id: &str) -> Option<V> {
        let map = self.map.lock().expect("cache lock");
        let (fetched, v) = map.get(id)?;
        (fetched.elapsed() < self.ttl).then(|| v.clone())
    }

    pub(crate) fn insert(&self, id: &str, value: V) {
        let mut map = self.map.lock().expect("cache lock");
        if map.len() >= self.max_entries && !map.contains_key(id) {
            let ttl = self.ttl;
            map.retain(|_, (fetched, _)| fetched.elapsed() < ttl);
            // Still full: drop the oldest entry (O(entries), bounded).
            if map.len() >= self.max_entries
                && let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, (fetched, _))| *fetched)
                    .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(id.to_string(), (Instant::now(), value));
    }

    pub(crate) fn invalidate(&self, id: &str) {
        self.map.lock().expect("cache lock").remove(id);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().expect("cache lock").len()
    }
}

/// The root key and a bounded, expiring cache of the keys stored in meta.
pub struct AccessKeys {
    root_id: String,
    root_secret: SecretKey,
    meta: Option<MetaClient>,
    cache: TtlCache<Option<Arc<pb::AccessKey>>>,
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
            cache: TtlCache::new(max_entries, ttl),
        })
    }

    /// The root key's id (the owner shown for buckets it created).
    pub fn root_id(&self) -> &str {
        &self.root_id
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
        Some(match self.cache.get(id)? {
            Some(k) => Resolved::Key(k),
            None => Resolved::Unknown,
        })
    }

    fn insert(&self, id: &str, key: Option<Arc<pb::AccessKey>>) {
        self.cache.insert(id, key);
    }

    /// Forgets the cached answer for `id`.
    pub fn invalidate(&self, id: &str) {
        self.cache.invalidate(id);
    }

    /// Keys in the cache (tests).
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
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

/// Most buckets whose settings (ACL, policy, CORS) a gateway caches.
pub const BUCKET_CACHE_ENTRIES: usize = 1024;

/// How long cached bucket settings are trusted: the most a PutBucketAcl,
/// PutBucketPolicy or PutBucketCors made through another gateway waits to
/// take effect on this one (on the gateway that made it: at once).
pub const BUCKET_CACHE_TTL: Duration = Duration::from_secs(5);

/// A bucket's record with its policy parsed and CORS rules in s3s's form.
pub struct BucketView {
    pub record: pb::Bucket,
    pub policy: Option<BucketPolicy>,
    /// A stored policy that did not parse (written by another version):
    /// [`authorize`] then refuses everyone but the owner.
    pub policy_unreadable: bool,
    pub cors: Vec<CORSRule>,
}

impl BucketView {
    fn new(record: pb::Bucket) -> Self {
        let (policy, policy_unreadable) = if record.policy.is_empty() {
            (None, false)
        } else {
            match policy::parse(&record.policy, &record.name) {
                Ok(p) => (Some(p), false),
                Err(e) => {
                    // Checked at PutBucketPolicy; only a policy written by
                    // another version could fail here. Fail closed.
                    tracing::warn!(bucket = %record.name, error = %e, "stored bucket policy unreadable; only the owner may act");
                    (None, true)
                }
            }
        };
        let cors = record.cors.iter().map(cors_rule).collect();
        BucketView {
            record,
            policy,
            policy_unreadable,
            cors,
        }
    }
}

/// A stored CORS rule in s3s's form.
pub fn cors_rule(r: &pb::CorsRule) -> CORSRule {
    let opt = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    CORSRule {
        allowed_headers: opt(&r.allowed_headers),
        allowed_methods: r.allowed_methods.clone(),
        allowed_origins: r.allowed_origins.clone(),
        expose_headers: opt(&r.expose_headers),
        id: (!r.id.is_empty()).then(|| r.id.clone()),
        max_age_seconds: r.max_age_seconds,
    }
}

/// Bucket settings read from meta, cached: at most
/// [`BUCKET_CACHE_ENTRIES`] buckets, each trusted for [`BUCKET_CACHE_TTL`].
/// A missing bucket is remembered only for unsigned requests, and only for
/// [`MISSING_BUCKET_TTL`] (at most [`BUCKET_CACHE_ENTRIES`] names): a
/// bucket just created through another gateway is usable by its owner at
/// once, and a flood of anonymous requests to made-up buckets costs meta
/// one read per name per second.
pub struct BucketCache {
    meta: MetaClient,
    cache: TtlCache<Arc<BucketView>>,
    missing: TtlCache<()>,
}

/// How long an unsigned request's "no such bucket" is remembered.
pub const MISSING_BUCKET_TTL: Duration = Duration::from_secs(1);

impl BucketCache {
    pub fn new(meta: MetaClient) -> Arc<Self> {
        Arc::new(BucketCache {
            meta,
            cache: TtlCache::new(BUCKET_CACHE_ENTRIES, BUCKET_CACHE_TTL),
            missing: TtlCache::new(BUCKET_CACHE_ENTRIES, MISSING_BUCKET_TTL),
        })
    }

    /// The settings of `bucket` for a signed request; `None` if it does
    /// not exist. A meta failure is `503 ServiceUnavailable`.
    pub async fn get(&self, bucket: &str) -> S3Result<Option<Arc<BucketView>>> {
        self.get_as(bucket, false).await
    }

    /// [`BucketCache::get`], for an unsigned request when `anonymous`
    /// (which may be answered from the missing-bucket cache).
    pub async fn get_as(&self, bucket: &str, anonymous: bool) -> S3Result<Option<Arc<BucketView>>> {
        if let Some(hit) = self.cache.get(bucket) {
            return Ok(Some(hit));
        }
        if anonymous && self.missing.get(bucket).is_some() {
            return Ok(None);
        }
        match self.meta.get_bucket(bucket).await {
            Ok(record) => {
                let view = Arc::new(BucketView::new(record));
                self.cache.insert(bucket, Arc::clone(&view));
                Ok(Some(view))
            }
            Err(e) if e.code() == Some(ErrorCode::NoSuchBucket) => {
                if anonymous {
                    self.missing.insert(bucket, ());
                }
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(%bucket, error = %e, "reading bucket settings from meta failed");
                Err(S3Error::with_message(
                    S3ErrorCode::ServiceUnavailable,
                    "The bucket's settings could not be read; please retry.",
                ))
            }
        }
    }

    /// Forgets `bucket`'s cached settings (after this gateway changed them).
    pub fn invalidate(&self, bucket: &str) {
        self.cache.invalidate(bucket);
        self.missing.invalidate(bucket);
    }
}

/// Who sent a request.
#[derive(Clone, Copy)]
pub enum Who<'a> {
    /// The root key: owns every bucket.
    Root,
    Key(&'a pb::AccessKey),
    /// No signature: S3's AllUsers group only.
    Anonymous,
}

/// The outcome of [`authorize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
    /// A read of an object: when not `granted` at the bucket level the
    /// object's own ACL decides, once the handler has read it; a missing
    /// key is `404` only to a caller that may list the bucket.
    ObjectAcl {
        can_list: bool,
        granted: bool,
    },
}

/// Put in a request's extensions when [`Verdict::ObjectAcl`]: the handler
/// checks the object's ACL (`s3::acl::readable_object`).
#[derive(Clone, Copy, Debug)]
pub struct ObjectAclCheck {
    /// The bucket policy allowed the read: the object's ACL need not.
    pub granted: bool,
    /// A valid key signed the request (AuthenticatedUsers).
    pub authenticated: bool,
    /// The caller may list the bucket: a missing key is then 404, not 403.
    pub can_list: bool,
}

/// Put in a copy's extensions when its source is readable by policy only,
/// to a caller that may not list the source bucket: a missing source is
/// then `403 AccessDenied`, as a GET of it is.
#[derive(Clone, Copy, Debug)]
pub struct HideMissingSource;

/// The keys of a DeleteObjects request the caller may not delete (taken
/// out of the request by the access hook; the handler reports each as
/// `AccessDenied`).
#[derive(Clone, Debug, Default)]
pub struct DeniedKeys(pub Vec<String>);

/// Whether `who` may perform `op` (s3s operation name) on `bucket`
/// (`key`: the object, for object operations), as S3 combines its sources
/// ("How Amazon S3 authorizes a request"), simplified to one account:
///
/// 1. the root key and a key with the bucket's `owner` grant may always act
///    (an owner cannot lock itself out);
/// 2. an explicit `Deny` of the bucket policy for the caller refuses;
/// 3. a key's grant ([`required`]) allows;
/// 4. an `Allow` of the bucket policy for the caller allows;
/// 5. the bucket's canned ACL allows listing (`READ`: ListObjects,
///    ListObjectVersions, ListMultipartUploads, HeadBucket) and, for
///    `public-read-write`, object writes and deletes (`WRITE`);
/// 6. an object read (GetObject, HeadObject, GetObjectAttributes) is left
///    to the object's ACL ([`Verdict::ObjectAcl`]);
/// 7. anything else is denied.
pub fn authorize(who: Who<'_>, op: &str, view: &BucketView, key: Option<&str>) -> Verdict {
    let bucket = view.record.name.as_str();
    let principal = match who {
        Who::Root => return Verdict::Allow,
        Who::Key(k) if allows(Some(k), bucket, Need::Owner) => return Verdict::Allow,
        Who::Key(k) => policy::Principal::Key(&k.id),
        Who::Anonymous => policy::Principal::Anonymous,
    };
    // Bucket configuration and deletion are the owner's: no policy or ACL
    // hands them to anyone else (S3 never lets another account touch a
    // bucket's policy). A stored policy that cannot be read grants nothing
    // and, since its Deny statements cannot be read either, refuses all.
    if required(op) == Need::Owner || view.policy_unreadable {
        return Verdict::Deny;
    }
    let by_policy = |actions: &[&str], key: Option<&str>| {
        view.policy.as_ref().map_or(Decision::NotApplicable, |p| {
            p.evaluate_all(principal, actions, &policy::resource_of(bucket, key))
        })
    };
    let actions = policy::actions_of(op);
    let decision = by_policy(actions, key);
    if decision == Decision::Deny {
        return Verdict::Deny;
    }
    if let Who::Key(k) = who
        && allows(Some(k), bucket, required(op))
    {
        return Verdict::Allow;
    }
    let authenticated = matches!(who, Who::Key(_));
    let acl = view.record.acl();
    let action = policy::action_of(op);
    let can_list = || {
        acl::allows_read(acl, authenticated)
            || match who {
                Who::Key(k) => allows(Some(k), bucket, Need::Read),
                _ => false,
            }
            || by_policy(&["s3:ListBucket"], None) == Decision::Allow
    };
    if decision == Decision::Allow {
        // A read allowed by the policy still hides which keys exist from a
        // caller that may not list them.
        return if action == "s3:GetObject" {
            Verdict::ObjectAcl {
                can_list: can_list(),
                granted: true,
            }
        } else {
            Verdict::Allow
        };
    }
    let bucket_read = |a: &str| {
        matches!(
            a,
            "s3:ListBucket" | "s3:ListBucketVersions" | "s3:ListBucketMultipartUploads"
        )
    };
    let bucket_write = |a: &str| {
        matches!(
            a,
            "s3:PutObject"
                | "s3:DeleteObject"
                | "s3:DeleteObjectVersion"
                | "s3:AbortMultipartUpload"
                | "s3:ListMultipartUploadParts"
        )
    };
    if (bucket_read(action) && acl::allows_read(acl, authenticated))
        || (bucket_write(action) && acl::allows_write(acl))
    {
        return Verdict::Allow;
    }
    if action == "s3:GetObject" {
        return Verdict::ObjectAcl {
            can_list: can_list(),
            granted: false,
        };
    }
    Verdict::Deny
}

/// Whether a write (`op`) asks for an ACL other than private in
/// `x-amz-acl`.
fn sets_public_acl(op: &str, headers: &http::HeaderMap) -> bool {
    matches!(op, "PutObject" | "CopyObject" | "CreateMultipartUpload")
        && headers
            .get("x-amz-acl")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                !matches!(
                    v,
                    "private" | "bucket-owner-read" | "bucket-owner-full-control"
                )
            })
}

/// The s3s access check: records the operation name, resolves the caller
/// (a key, the root key, or anonymous) and authorizes it on the request's
/// bucket ([`authorize`]).
pub struct KeyAccess {
    pub keys: Arc<AccessKeys>,
    pub buckets: Arc<BucketCache>,
}

fn access_denied() -> S3Error {
    S3Error::with_message(S3ErrorCode::AccessDenied, "Access Denied")
}

impl KeyAccess {
    fn caller_of<T>(req: &S3Request<T>) -> S3Result<&Caller> {
        req.extensions.get::<Caller>().ok_or_else(access_denied)
    }

    /// A copy's source must be readable by the caller ([`authorize`] of a
    /// GetObject of the source: the root key, an owner, a `read` grant or
    /// the policy, a policy Deny refusing); a source readable only through
    /// its object ACL is refused.
    async fn check_source(
        &self,
        caller: &Caller,
        source: &CopySource,
        extensions: &mut http::Extensions,
    ) -> S3Result<()> {
        let CopySource::Bucket { bucket, key, .. } = source else {
            return Err(access_denied());
        };
        let who = match (&caller.key, caller.anonymous) {
            (_, true) => Who::Anonymous,
            (None, false) => return Ok(()),
            (Some(k), false) => Who::Key(k),
        };
        // Always through `authorize`: a policy Deny on the source beats
        // a read grant, as for a GET.
        let Some(view) = self.buckets.get(bucket).await? else {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        };
        match authorize(who, "GetObject", &view, Some(key)) {
            Verdict::Allow => Ok(()),
            Verdict::ObjectAcl {
                granted: true,
                can_list,
            } => {
                if !can_list {
                    // As for a GET: a missing source is 403, not 404.
                    extensions.insert(HideMissingSource);
                }
                Ok(())
            }
            // Readable only through the object's own ACL: not checked for
            // copies (S3 would; Sluice refuses, the safe side).
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
        // Browser form uploads carry key and ACL in the body, past every
        // check here: not served (s3s would accept an empty file).
        if op == "PostObject" {
            return Err(S3Error::with_message(
                S3ErrorCode::NotImplemented,
                "PostObject (browser form uploads) is not supported.",
            ));
        }
        let key = match cx.credentials().map(|c| c.access_key.clone()) {
            None => None,
            Some(access_key) => Some(match self.keys.resolve(&access_key).await? {
                Resolved::Root => None,
                Resolved::Key(k) => Some(k),
                // Resolved during authentication; deleted since (cache expiry).
                Resolved::Unknown => {
                    return Err(S3Error::new(S3ErrorCode::InvalidAccessKeyId));
                }
            }),
        };
        let anonymous = key.is_none();
        let key = key.flatten();
        let (bucket, object) = match cx.s3_path() {
            S3Path::Root => (None, None),
            S3Path::Bucket { bucket } => (Some(bucket.to_string()), None),
            S3Path::Object { bucket, key } => (Some(bucket.to_string()), Some(key.to_string())),
        };
        let who = match (&key, anonymous) {
            (_, true) => Who::Anonymous,
            (None, false) => Who::Root,
            (Some(k), false) => Who::Key(k),
        };
        if required(&op) == Need::Authenticated || bucket.is_none() {
            // CreateBucket and ListBuckets: any valid key, never anonymous.
            if anonymous {
                return Err(access_denied());
            }
        } else if let Some(bucket) = &bucket
            && !matches!(who, Who::Root)
        {
            let view = self.buckets.get_as(bucket, anonymous).await?;
            let Some(view) = view else {
                // A missing bucket is 404 to everyone (S3's answer).
                return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
            };
            // DeleteObjects names its keys in the body: the hook authorizes
            // each (`delete_objects` below).
            let mut verdict = if op == "DeleteObjects" {
                Verdict::Allow
            } else {
                authorize(who, &op, &view, object.as_deref())
            };
            // A write that also sets a non-private `x-amz-acl` needs
            // PutObjectAcl's permission too.
            if verdict == Verdict::Allow
                && sets_public_acl(&op, cx.headers())
                && authorize(who, "PutObjectAcl", &view, object.as_deref()) != Verdict::Allow
            {
                verdict = Verdict::Deny;
            }
            match verdict {
                Verdict::Allow => {}
                Verdict::Deny => {
                    tracing::debug!(key_id = key.as_ref().map_or("-", |k| k.id.as_str()), %bucket, op = %op, "access denied");
                    return Err(access_denied());
                }
                Verdict::ObjectAcl { can_list, granted } => {
                    cx.extensions_mut().insert(ObjectAclCheck {
                        granted,
                        authenticated: !anonymous,
                        can_list,
                    });
                }
            }
        }
        cx.extensions_mut().insert(Caller {
            key,
            anonymous,
            keys: Arc::clone(&self.keys),
        });
        Ok(())
    }

    /// DeleteObjects names its keys in the body: each is authorized as a
    /// DeleteObject of that key (a policy Deny on `b/locked/*` holds here
    /// too). Refused keys leave the request and are answered per key as
    /// `AccessDenied` ([`DeniedKeys`]), as S3 answers them.
    async fn delete_objects(&self, req: &mut S3Request<DeleteObjectsInput>) -> S3Result<()> {
        let caller = Self::caller_of(req)?.clone();
        let who = match (&caller.key, caller.anonymous) {
            (_, true) => Who::Anonymous,
            (None, false) => return Ok(()),
            (Some(k), false) => Who::Key(k),
        };
        // The request's size first: no per-key work past S3's limit.
        crate::s3::delete::check_delete_count(req.input.delete.objects.len())?;
        let Some(view) = self
            .buckets
            .get_as(&req.input.bucket, caller.anonymous)
            .await?
        else {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        };
        let objects = std::mem::take(&mut req.input.delete.objects);
        let (allowed, denied): (Vec<_>, Vec<_>) = objects
            .into_iter()
            .partition(|o| authorize(who, "DeleteObject", &view, Some(&o.key)) == Verdict::Allow);
        req.input.delete.objects = allowed;
        if !denied.is_empty() {
            req.extensions
                .insert(DeniedKeys(denied.into_iter().map(|o| o.key).collect()));
        }
        Ok(())
    }

    async fn copy_object(&self, req: &mut S3Request<CopyObjectInput>) -> S3Result<()> {
        let caller = Self::caller_of(req)?.clone();
        self.check_source(&caller, &req.input.copy_source, &mut req.extensions)
            .await
    }

    async fn upload_part_copy(&self, req: &mut S3Request<UploadPartCopyInput>) -> S3Result<()> {
        let caller = Self::caller_of(req)?.clone();
        self.check_source(&caller, &req.input.copy_source, &mut req.extensions)
            .await
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

    fn view(acl: pb::CannedAcl, policy: &str) -> BucketView {
        BucketView::new(pb::Bucket {
            name: "b".into(),
            acl: acl.into(),
            policy: policy.into(),
            ..Default::default()
        })
    }

    #[test]
    fn anonymous_callers_get_exactly_what_acls_and_policies_grant() {
        use pb::CannedAcl::*;
        let private = view(AclPrivate, "");
        for op in ["ListObjectsV2", "PutObject", "DeleteObject", "GetBucketAcl"] {
            assert_eq!(
                authorize(Who::Anonymous, op, &private, None),
                Verdict::Deny,
                "{op}"
            );
        }
        // An object read is the object's ACL's to decide; not listable.
        assert_eq!(
            authorize(Who::Anonymous, "GetObject", &private, Some("k")),
            Verdict::ObjectAcl {
                can_list: false,
                granted: false
            }
        );
        let public = view(AclPublicRead, "");
        assert_eq!(
            authorize(Who::Anonymous, "ListObjectsV2", &public, None),
            Verdict::Allow
        );
        assert_eq!(
            authorize(Who::Anonymous, "HeadBucket", &public, None),
            Verdict::Allow
        );
        assert_eq!(
            authorize(Who::Anonymous, "PutObject", &public, Some("k")),
            Verdict::Deny
        );
        assert_eq!(
            authorize(Who::Anonymous, "GetObject", &public, Some("k")),
            Verdict::ObjectAcl {
                can_list: true,
                granted: false
            }
        );
        let open = view(AclPublicReadWrite, "");
        for op in [
            "PutObject",
            "DeleteObject",
            "CreateMultipartUpload",
            "UploadPart",
        ] {
            assert_eq!(
                authorize(Who::Anonymous, op, &open, Some("k")),
                Verdict::Allow,
                "{op}"
            );
        }
        // Bucket configuration is never granted by an ACL.
        assert_eq!(
            authorize(Who::Anonymous, "PutBucketAcl", &open, None),
            Verdict::Deny
        );
        let authenticated = view(AclAuthenticatedRead, "");
        assert_eq!(
            authorize(Who::Anonymous, "ListObjects", &authenticated, None),
            Verdict::Deny
        );
        let stranger = pb::AccessKey {
            id: "SK9".into(),
            ..Default::default()
        };
        assert_eq!(
            authorize(Who::Key(&stranger), "ListObjects", &authenticated, None),
            Verdict::Allow
        );
        assert_eq!(
            authorize(Who::Key(&stranger), "ListObjects", &private, None),
            Verdict::Deny
        );

        let read_policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/public/*"}]}"#;
        let by_policy = view(AclPrivate, read_policy);
        // Allowed by the policy, but a missing key stays hidden (403).
        assert_eq!(
            authorize(Who::Anonymous, "GetObject", &by_policy, Some("public/x")),
            Verdict::ObjectAcl {
                can_list: false,
                granted: true
            }
        );
        assert_eq!(
            authorize(Who::Anonymous, "GetObject", &by_policy, Some("secret/x")),
            Verdict::ObjectAcl {
                can_list: false,
                granted: false
            }
        );
        // No policy hands bucket configuration or deletion to others.
        let everything = r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]}]}"#;
        let open_policy = view(AclPrivate, everything);
        for op in [
            "PutBucketPolicy",
            "GetBucketPolicy",
            "DeleteBucketPolicy",
            "PutBucketLifecycleConfiguration",
            "PutBucketAcl",
            "DeleteBucket",
        ] {
            assert_eq!(
                authorize(Who::Anonymous, op, &open_policy, None),
                Verdict::Deny,
                "{op}"
            );
        }
        assert_eq!(
            authorize(Who::Anonymous, "PutObject", &open_policy, Some("k")),
            Verdict::Allow
        );
        // A stored policy that cannot be read refuses all but the owner.
        let unreadable = view(AclPublicReadWrite, "{not json");
        assert!(unreadable.policy_unreadable);
        assert_eq!(
            authorize(Who::Anonymous, "PutObject", &unreadable, Some("k")),
            Verdict::Deny
        );
        assert_eq!(
            authorize(Who::Root, "PutObject", &unreadable, Some("k")),
            Verdict::Allow
        );
        assert_eq!(
            authorize(Who::Anonymous, "PutObject", &by_policy, Some("public/x")),
            Verdict::Deny
        );
    }

    #[test]
    fn keys_combine_grants_policy_denies_and_owners() {
        use pb::CannedAcl::*;
        let deny = r#"{"Statement":[{"Effect":"Deny","Principal":{"AWS":["SK1","SK2"]},"Action":"s3:DeleteObject","Resource":"arn:aws:s3:::b/*"}]}"#;
        let v = view(AclPublicReadWrite, deny);
        let writer = key(&[("b", true, true, false)]);
        let owner = pb::AccessKey {
            id: "SK2".into(),
            ..key(&[("b", false, false, true)])
        };
        assert_eq!(
            authorize(Who::Key(&writer), "PutObject", &v, Some("k")),
            Verdict::Allow
        );
        // An explicit Deny beats the key's write grant and the ACL...
        assert_eq!(
            authorize(Who::Key(&writer), "DeleteObject", &v, Some("k")),
            Verdict::Deny
        );
        // ...but not the owner, nor the root key.
        assert_eq!(
            authorize(Who::Key(&owner), "DeleteObject", &v, Some("k")),
            Verdict::Allow
        );
        assert_eq!(
            authorize(Who::Root, "DeleteObject", &v, Some("k")),
            Verdict::Allow
        );
        // Anonymous callers are not named: the ACL lets them delete.
        assert_eq!(
            authorize(Who::Anonymous, "DeleteObject", &v, Some("k")),
            Verdict::Allow
        );
        // A key's grant still needs the right permission.
        let reader = key(&[("b", true, false, false)]);
        let private = view(AclPrivate, "");
        assert_eq!(
            authorize(Who::Key(&reader), "GetObject", &private, Some("k")),
            Verdict::Allow
        );
        assert_eq!(
            authorize(Who::Key(&reader), "PutObject", &private, Some("k")),
            Verdict::Deny
        );
        assert_eq!(
            authorize(Who::Key(&reader), "PutBucketPolicy", &private, None),
            Verdict::Deny
        );
    }
}
