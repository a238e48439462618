//! Mutations: each reads the current state and returns the batch that
//! applies it and its outcome. A refusal returns an empty batch. Every
//! batch that writes or removes a part or object record also updates the
//! reference index (see [`super::refs`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use md5::{Digest, Md5};
use prost::Message;
use sluice_proto::meta::{self as pb, ErrorCode};
use sluice_proto::raft::{self as rpb, MetaCommand, meta_command::Command};

use super::refs::{part_refs, update_index};
use super::{
    Applied, MAX_PART_NUMBER, SmError, access, cluster_version, epochs, get, heal, keys, leases,
    pending, records, refuse, registry, require_bucket, sessions, settings, versions,
};
use crate::store::{Batch, KvStore, Space};
use crate::version::{REPLICATED_FORMAT, command_kind};
use versions::placements;

/// Applies `cmd`, the entry at log index `index`, to the state in `kv`:
/// the writes to make (atomically,
/// together with the applied log id) and the outcome. Only store failures
/// and corrupt records are errors; S3-level refusals are
/// [`Applied::Refused`] with no state change besides the session entry.
///
/// Around every mutation, centrally:
/// * *Sessions*: a request whose non-empty `op_id` is in the session table
///   gets its first outcome back with an empty batch; otherwise the
///   outcome (refusals too) is recorded under the op id, with `index`.
/// * *Replay*: a PutObject or PutPart whose blob a record already
///   references was applied before; it succeeds and changes nothing
///   ([`committed_replay`]).
/// * *Fence*: a PutObject or PutPart whose new record names a blob of a
///   write epoch that is not open is refused `EPOCH_CLOSED`; one naming a
///   blob id that names no epoch, or a blob with a pending deletion, is
///   refused `INVALID_ARGUMENT`.
/// * *Pending deletions*: every placement the mutation releases gets a
///   `PendingDeletion` record at leader time `leader_now_ms`.
///
/// What it writes depends on the state and the entry alone: never on a
/// node's config, a process global or a clock (the session table is
/// bounded by the leader before proposing, see [`sessions::admit`]; the
/// epoch lease is replicated state, see [`settings`]).
///
/// An entry this binary cannot apply is an error ([`SmError::NeedsNewer`]),
/// never skipped: its command kind is unknown here (prost decodes a oneof
/// variant it does not know as no command), or it requires a newer
/// replicated format than [`REPLICATED_FORMAT`].
pub fn apply_command<K: KvStore>(
    kv: &K,
    index: u64,
    cmd: &MetaCommand,
) -> Result<(Batch, Applied), SmError> {
    apply_command_as(kv, index, cmd, REPLICATED_FORMAT)
}

/// [`apply_command`] by a binary that understands replicated formats up
/// to `format` (a node's `replicated_format_override`, in tests).
pub fn apply_command_as<K: KvStore>(
    kv: &K,
    index: u64,
    cmd: &MetaCommand,
    format: u32,
) -> Result<(Batch, Applied), SmError> {
    let Some(command) = &cmd.command else {
        return Err(SmError::NeedsNewer {
            index,
            what: format!(
                "command kind unknown to this binary, replicated format {}",
                cmd.requires_format
            ),
            format,
        });
    };
    if cmd.requires_format > format {
        return Err(SmError::NeedsNewer {
            index,
            what: format!(
                "{} at replicated format {}",
                command_kind(command),
                cmd.requires_format
            ),
            format,
        });
    }
    let now_ms = cmd.leader_now_ms;
    let op_id = op_id_of(command);
    if let Some(first) = sessions::lookup(kv, op_id)? {
        return Ok((Batch::new(), first));
    }
    if let Err(SmError::Refused { code, message }) = check_names(command) {
        let applied = Applied::Refused { code, message };
        let mut batch = Batch::new();
        if !op_id.is_empty() {
            sessions::record(kv, &mut batch, op_id, &applied, index)?;
        }
        return Ok((batch, applied));
    }
    if let Some(replayed) = committed_replay(kv, command)? {
        let mut batch = Batch::new();
        if !op_id.is_empty() {
            sessions::record(kv, &mut batch, op_id, &replayed, index)?;
        }
        return Ok((batch, replayed));
    }
    let result = match command {
        Command::CreateBucket(r) => create_bucket(kv, r),
        Command::DeleteBucket(r) => delete_bucket(kv, r),
        Command::PutObject(r) => put_object(kv, r, index, now_ms),
        Command::DeleteObject(r) => delete_object(kv, r, index, now_ms),
        Command::PutObjectTagging(r) => put_object_tagging(kv, r),
        Command::PutObjectAcl(r) => put_object_acl(kv, r),
        Command::PutBucketConfig(r) => put_bucket_config(kv, r),
        Command::CreateUpload(r) => create_upload(kv, r, now_ms),
        Command::PutPart(r) => put_part(kv, r),
        Command::CompleteUpload(r) => complete_upload(kv, r, index, now_ms),
        Command::AbortUpload(r) => abort_upload(kv, r),
        Command::RegisterDatanode(r) => registry::register_datanode(kv, r),
        Command::OpenEpoch(r) => epochs::open_epoch(kv, r, now_ms),
        Command::RenewEpoch(r) => epochs::renew_epoch(kv, r, now_ms),
        Command::CloseEpochs(r) => epochs::close_epochs(kv, r, now_ms),
        Command::CollectPending(r) => pending::collect_pending(kv, r),
        Command::ClaimPending(r) => pending::claim_pending(kv, r),
        Command::LeaseBlobs(r) => leases::lease_blobs(kv, r),
        Command::ReleaseBlobs(r) => leases::release_blobs(kv, r),
        Command::ExpireSessions(r) => sessions::expire_sessions(kv, r),
        Command::ExpireObjects(r) => expire_objects(kv, r, index, now_ms),
        Command::ExpireUploads(r) => expire_uploads(kv, r, now_ms),
        Command::ReportMissing(r) => heal::report_missing(kv, r),
        Command::ReportPresent(r) => heal::report_present(kv, r),
        Command::BeginHeal(r) => heal::begin_heal(kv, r),
        Command::UpdatePlacement(r) => heal::update_placement(kv, r),
        Command::CreateAccessKey(r) => access::create_access_key(kv, r, now_ms),
        Command::DeleteAccessKey(r) => access::delete_access_key(kv, r),
        Command::SetKeyGrant(r) => access::set_key_grant(kv, r),
        Command::DrainDatanode(r) => registry::drain_datanode(kv, r),
        Command::RemoveDatanode(r) => registry::remove_datanode(kv, r),
        Command::FinalizeVersion(r) => cluster_version::finalize(kv, index, r, format),
        Command::SetClusterSettings(r) => settings::set_cluster_settings(kv, r),
    }
    .and_then(|applied| {
        fence(kv, command)?;
        Ok(applied)
    });
    let (mut batch, applied) = match result {
        Ok((mut batch, applied)) => {
            match &applied {
                Applied::Released(released) | Applied::Versioned { released, .. } => {
                    pending::record_released(&mut batch, released, index, now_ms);
                }
                Applied::Completed(resp) => {
                    pending::record_released(&mut batch, &resp.released, index, now_ms);
                }
                _ => {}
            }
            (batch, applied)
        }
        Err(SmError::Refused { code, message }) => {
            (Batch::new(), Applied::Refused { code, message })
        }
        Err(e) => return Err(e),
    };
    if !op_id.is_empty() {
        sessions::record(kv, &mut batch, op_id, &applied, index)?;
    }
    Ok((batch, applied))
}

/// The operation id of a mutation request; empty for the leader's internal
/// entries (CloseEpochs, CollectPending, ExpireSessions, ExpireObjects).
fn op_id_of(command: &Command) -> &str {
    match command {
        Command::CreateBucket(r) => &r.op_id,
        Command::DeleteBucket(r) => &r.op_id,
        Command::PutObject(r) => &r.op_id,
        Command::DeleteObject(r) => &r.op_id,
        Command::PutObjectTagging(r) => &r.op_id,
        Command::PutObjectAcl(r) => &r.op_id,
        Command::PutBucketConfig(r) => &r.op_id,
        Command::CreateUpload(r) => &r.op_id,
        Command::PutPart(r) => &r.op_id,
        Command::CompleteUpload(r) => &r.op_id,
        Command::AbortUpload(r) => &r.op_id,
        Command::RegisterDatanode(r) => &r.op_id,
        Command::OpenEpoch(r) => &r.op_id,
        Command::RenewEpoch(r) => &r.op_id,
        Command::ReportMissing(r) => &r.op_id,
        Command::ReportPresent(r) => &r.op_id,
        Command::BeginHeal(r) => &r.op_id,
        Command::UpdatePlacement(r) => &r.op_id,
        Command::CreateAccessKey(r) => &r.op_id,
        Command::DeleteAccessKey(r) => &r.op_id,
        Command::SetKeyGrant(r) => &r.op_id,
        Command::DrainDatanode(r) => &r.op_id,
        Command::RemoveDatanode(r) => &r.op_id,
        Command::SetClusterSettings(r) => &r.op_id,
        Command::CloseEpochs(_)
        | Command::CollectPending(_)
        | Command::ClaimPending(_)
        | Command::LeaseBlobs(_)
        | Command::ReleaseBlobs(_)
        | Command::ExpireSessions(_)
        | Command::ExpireObjects(_)
        | Command::ExpireUploads(_)
        | Command::FinalizeVersion(_) => "",
    }
}

/// The op id the leader checks against the session table's bound before
/// proposing `command` ([`sessions::admit`]); empty when it is not checked:
/// internal entries, and a gateway's OpenEpoch and RenewEpoch, which keep
/// its write epoch alive (refused under load, a live gateway would lose its
/// epoch; they add at most one entry per gateway per `epoch_lease / 3`).
pub fn admission_op_id(command: &Command) -> &str {
    match command {
        Command::OpenEpoch(_) | Command::RenewEpoch(_) => "",
        other => op_id_of(other),
    }
}

/// The outcome of a commit (PutObject, PutPart) that was already applied:
/// a record references one of its blobs. Blob ids are unique per write and
/// a blob is referenced by at most one record, so only an earlier
/// application of this same write can have committed it; the retry arrived
/// after its session entry expired or was evicted. It changes nothing and
/// succeeds, as its first application did (`Released` empty: what that
/// one released was released then).
///
/// Without this rule the retry would be judged again: refused when its
/// write epoch closed meanwhile, and the gateway deletes the blob of a
/// refused commit, which here is the committed object's only copy (a
/// listed object whose every GET fails).
/// With it, a refusal of a commit always means that no record references
/// its blobs.
fn committed_replay<K: KvStore>(kv: &K, command: &Command) -> Result<Option<Applied>, SmError> {
    let mut blobs = commit_blobs(command).into_iter().peekable();
    if blobs.peek().is_none() {
        return Ok(None);
    }
    for blob in blobs {
        if super::refs::is_referenced(kv, blob)? {
            return Ok(Some(Applied::Released(Vec::new())));
        }
    }
    Ok(None)
}

/// The blobs a commit (PutObject, PutPart) makes its record reference;
/// empty for every other command.
fn commit_blobs(command: &Command) -> Vec<&str> {
    match command {
        Command::PutObject(r) => r
            .object
            .iter()
            .flat_map(placements)
            .map(|p| p.blob_id.as_str())
            .collect(),
        Command::PutPart(r) => r
            .part
            .iter()
            .filter_map(|p| p.placement.as_ref())
            .map(|p| p.blob_id.as_str())
            .collect(),
        _ => Vec::new(),
    }
}

/// Refuses a commit (PutObject, PutPart) whose new record names a blob of
/// a write epoch that is not open, or a blob that was released.
/// CompleteUpload moves already committed part blobs and is not fenced.
fn fence<K: KvStore>(kv: &K, command: &Command) -> Result<(), SmError> {
    for blob in commit_blobs(command) {
        let epoch = match sluice_proto::blob_id::epoch_of(blob) {
            Ok(epoch) => epoch,
            Err(e) => return refuse(ErrorCode::InvalidArgument, e.to_string()),
        };
        if !epochs::is_open(kv, epoch)? {
            return refuse(
                ErrorCode::EpochClosed,
                format!("blob {blob} belongs to write epoch {epoch}, which is closed"),
            );
        }
        if pending::get(kv, blob)?.is_some() {
            return refuse(
                ErrorCode::InvalidArgument,
                format!("blob {blob} was released"),
            );
        }
    }
    Ok(())
}

type Outcome = Result<(Batch, Applied), SmError>;

/// Every bucket name, object key and upload id a command names, checked
/// by [`check_name`] before anything else runs: the key layout
/// (`keys.rs`) joins names with NUL, so a name holding one would land
/// inside another key's range (a delete marker among `k`'s versions).
fn check_names(command: &Command) -> Result<(), SmError> {
    const B: &str = "bucket name";
    const K: &str = "key";
    const U: &str = "upload id";
    let names: Vec<(&str, &str)> = match command {
        Command::CreateBucket(r) => vec![(B, &r.name)],
        Command::DeleteBucket(r) => vec![(B, &r.name)],
        Command::PutBucketConfig(r) => vec![(B, &r.name)],
        Command::PutObject(r) => r
            .object
            .iter()
            .flat_map(|o| [(B, o.bucket.as_str()), (K, o.key.as_str())])
            .collect(),
        Command::DeleteObject(r) => vec![(B, &r.bucket), (K, &r.key)],
        Command::PutObjectTagging(r) => vec![(B, &r.bucket), (K, &r.key)],
        Command::PutObjectAcl(r) => vec![(B, &r.bucket), (K, &r.key)],
        Command::CreateUpload(r) => r
            .upload
            .iter()
            .flat_map(|u| [(B, u.bucket.as_str()), (K, &u.key), (U, &u.upload_id)])
            .collect(),
        Command::PutPart(r) => {
            let mut v = vec![(B, r.bucket.as_str()), (K, r.key.as_str())];
            v.extend(r.part.iter().map(|p| (U, p.upload_id.as_str())));
            v
        }
        Command::CompleteUpload(r) => vec![(B, &r.bucket), (K, &r.key), (U, &r.upload_id)],
        Command::AbortUpload(r) => vec![(B, &r.bucket), (K, &r.key), (U, &r.upload_id)],
        Command::ExpireObjects(r) => r
            .objects
            .iter()
            .flat_map(|o| [(B, o.bucket.as_str()), (K, o.key.as_str())])
            .collect(),
        Command::ExpireUploads(r) => r
            .uploads
            .iter()
            .flat_map(|u| [(B, u.bucket.as_str()), (K, &u.key), (U, &u.upload_id)])
            .collect(),
        _ => Vec::new(),
    };
    names
        .into_iter()
        .try_for_each(|(what, value)| check_name(what, value))
}

fn check_name(what: &str, value: &str) -> Result<(), SmError> {
    if value.is_empty() || value.contains('\0') {
        return refuse(
            ErrorCode::InvalidArgument,
            format!("invalid {what}: {value:?}"),
        );
    }
    Ok(())
}

/// Hex MD5 of a part body: the ETag of a part or a single-PUT object.
pub fn part_etag(md5: &[u8]) -> String {
    hex::encode(md5)
}

/// The multipart ETag: hex(MD5(concatenated binary part MD5s)) "-" count.
pub fn multipart_etag<'a>(part_md5s: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = Md5::new();
    let mut n = 0usize;
    for m in part_md5s {
        h.update(m);
        n += 1;
    }
    format!("{}-{n}", hex::encode(h.finalize()))
}

fn normalize_etag(etag: &str) -> String {
    etag.trim().trim_matches('"').to_ascii_lowercase()
}

fn create_bucket<K: KvStore>(kv: &K, r: &pb::CreateBucketRequest) -> Outcome {
    let key = keys::bucket(&r.name);
    if kv.get(Space::Buckets, &key)?.is_some() {
        return Ok((Batch::new(), Applied::Created(false)));
    }
    let mut b = Batch::new();
    let bucket = pb::Bucket {
        name: r.name.clone(),
        created_at_ms: r.now_ms,
        acl: r.acl,
        owner_key_id: r.owner_key_id.clone(),
        ..Default::default()
    };
    b.put(Space::Buckets, key, bucket.encode_to_vec());
    access::grant_owner(kv, &mut b, &r.owner_key_id, &r.name)?;
    Ok((b, Applied::Created(true)))
}

fn delete_bucket<K: KvStore>(kv: &K, r: &pb::BucketRequest) -> Outcome {
    require_bucket(kv, &r.name)?;
    let base = keys::bucket_base(&r.name);
    if !kv.scan_prefix(Space::Objects, &base, 1)?.is_empty() {
        return refuse(
            ErrorCode::BucketNotEmpty,
            format!("bucket {} has objects", r.name),
        );
    }
    if versions::bucket_has_versions(kv, &r.name)? {
        return refuse(
            ErrorCode::BucketNotEmpty,
            format!("bucket {} has object versions or delete markers", r.name),
        );
    }
    if !kv.scan_prefix(Space::Uploads, &base, 1)?.is_empty() {
        return refuse(
            ErrorCode::BucketNotEmpty,
            format!("bucket {} has multipart uploads", r.name),
        );
    }
    let mut b = Batch::new();
    b.delete(Space::Buckets, keys::bucket(&r.name));
    access::drop_bucket_grants(kv, &mut b, &r.name)?;
    Ok((b, Applied::Done))
}

/// Checks a conditional write against the current object `current`.
fn check_condition(
    current: Option<&pb::ObjectRecord>,
    condition: Option<&pb::WriteCondition>,
) -> Result<(), SmError> {
    let Some(c) = condition else { return Ok(()) };
    let failed = || refuse(ErrorCode::PreconditionFailed, "precondition failed");
    match current {
        Some(obj) => {
            if c.if_none_match_any
                || (!c.if_none_match_etag.is_empty() && c.if_none_match_etag == obj.etag)
            {
                return failed();
            }
            if !c.if_match_etag.is_empty() && c.if_match_etag != obj.etag {
                return failed();
            }
        }
        None => {
            if c.if_match_any || !c.if_match_etag.is_empty() {
                return refuse(ErrorCode::NoSuchKey, "If-Match: no current object");
            }
        }
    }
    Ok(())
}

/// The outcome of a write or delete of one version: what unversioned
/// buckets always answered, or [`Applied::Versioned`].
fn written(
    versioning: pb::Versioning,
    released: Vec<pb::Placement>,
    version_id: String,
    marker: bool,
) -> Applied {
    if versioning == pb::Versioning::Unversioned && version_id.is_empty() {
        Applied::Released(released)
    } else {
        Applied::Versioned {
            released,
            version_id,
            delete_marker: marker,
        }
    }
}

fn put_object<K: KvStore>(kv: &K, r: &pb::PutObjectRequest, index: u64, now_ms: i64) -> Outcome {
    let Some(object) = &r.object else {
        return refuse(ErrorCode::InvalidArgument, "PutObject without an object");
    };
    let bucket = require_bucket(kv, &object.bucket)?;
    let key = keys::object(&object.bucket, &object.key);
    let old = records::get(kv, Space::Objects, &key)?;
    check_condition(old.as_ref(), r.condition.as_ref())?;
    let mut object = object.clone();
    // The leader's clock, which lifecycle expiry and every later decision
    // read, not the gateway's (a gateway clock days behind must not make a
    // new object look old).
    object.last_modified_ms = now_ms;
    let mut b = Batch::new();
    let released = versions::write_current(
        kv,
        &mut b,
        bucket.versioning(),
        &mut object,
        old.as_ref(),
        index,
    )?;
    let version_id = versions::reported(bucket.versioning(), &object);
    Ok((b, written(bucket.versioning(), released, version_id, false)))
}

fn delete_object<K: KvStore>(kv: &K, r: &pb::ObjectKey, index: u64, now_ms: i64) -> Outcome {
    let bucket = require_bucket(kv, &r.bucket)?;
    let want = versions::parse(&r.version_id)?;
    let mut b = Batch::new();
    let d = versions::delete(kv, &mut b, &bucket, &r.key, want, index, now_ms)?;
    Ok((
        b,
        written(
            bucket.versioning(),
            d.released,
            d.version_id,
            d.delete_marker,
        ),
    ))
}

/// Refuses a lifecycle entry whose length of a day (`day_ms`) is not
/// positive: the sweeper always sets it, and the rules cannot be judged
/// without it.
fn positive_day_ms(command: &str, day_ms: i64) -> Result<(), SmError> {
    if day_ms > 0 {
        return Ok(());
    }
    refuse(
        ErrorCode::InvalidArgument,
        format!("{command} with day_ms {day_ms}: want a positive length of a day in ms"),
    )
}

/// Deletes each listed object that is still the version the lifecycle
/// sweeper evaluated (same ETag and last-modified time) and that the
/// bucket's rules, as they are now, still expire at the entry's leader time
/// `now_ms`; anything changed since is left alone. The blobs are released
/// as DeleteObject releases them.
fn expire_objects<K: KvStore>(kv: &K, r: &rpb::ExpireObjects, index: u64, now_ms: i64) -> Outcome {
    positive_day_ms("ExpireObjects", r.day_ms)?;
    let mut b = Batch::new();
    let mut released = Vec::new();
    let mut seen = HashSet::new();
    let mut buckets: HashMap<&str, Option<pb::Bucket>> = HashMap::new();
    for e in &r.objects {
        if !buckets.contains_key(e.bucket.as_str()) {
            let bucket: Option<pb::Bucket> =
                get(kv, Space::Buckets, &keys::bucket(&e.bucket), "bucket")?;
            buckets.insert(&e.bucket, bucket);
        }
        let Some(bucket) = &buckets[e.bucket.as_str()] else {
            continue;
        };
        if !e.version_id.is_empty() {
            let mut id = keys::versions_of(&e.bucket, &e.key);
            id.extend_from_slice(e.version_id.as_bytes());
            if !seen.insert(id) {
                continue;
            }
            released.extend(expire_version(kv, &mut b, bucket, e, now_ms, r.day_ms)?);
            continue;
        }
        let key = keys::object(&e.bucket, &e.key);
        // The batch is applied after the loop: a key listed twice is
        // deleted (and released) once.
        if !seen.insert(key.clone()) {
            continue;
        }
        let Some(old) = records::get_head(kv, Space::Objects, &key)? else {
            continue;
        };
        if old.etag != e.etag
            || old.last_modified_ms != e.last_modified_ms
            || !super::lifecycle::object_expired(&bucket.lifecycle, &old, now_ms, r.day_ms)
        {
            continue;
        }
        // In a versioned bucket the expiration adds a delete marker (S3).
        let d = versions::delete(
            kv,
            &mut b,
            bucket,
            &e.key,
            versions::Want::Current,
            index,
            now_ms,
        )?;
        released.extend(d.released);
    }
    Ok((b, Applied::Released(released)))
}

/// NoncurrentVersionExpiration of one version: removed only if it is still
/// the noncurrent version the sweeper saw (same ETag and last-modified
/// time) and the bucket's rules, as they are now, still expire it at
/// `now_ms`. The placements it releases.
fn expire_version<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    bucket: &pb::Bucket,
    e: &rpb::ExpireObject,
    now_ms: i64,
    day_ms: i64,
) -> Result<Vec<pb::Placement>, SmError> {
    let Ok(want) = versions::parse(&e.version_id) else {
        return Ok(Vec::new());
    };
    let Some(found) = versions::find(kv, &bucket.name, &e.key, want)? else {
        return Ok(Vec::new());
    };
    if found.space != Space::Versions
        || found.record.etag != e.etag
        || found.record.last_modified_ms != e.last_modified_ms
    {
        return Ok(Vec::new());
    }
    let Some(since) = super::lifecycle::noncurrent_since(kv, &bucket.name, &e.key, &found.key)?
    else {
        return Ok(Vec::new());
    };
    if !super::lifecycle::noncurrent_expired(
        &bucket.lifecycle,
        &found.record,
        since,
        now_ms,
        day_ms,
    ) {
        return Ok(Vec::new());
    }
    // A noncurrent version that is no delete marker is never the latest:
    // nothing is promoted.
    records::delete(b, Space::Versions, found.key);
    let released: Vec<pb::Placement> = placements(&found.record).cloned().collect();
    update_index(b, &released, []);
    Ok(released)
}

/// Rewrites the version of (bucket, key) named by `version` (current when
/// empty) with `change` applied; its body, placements and last-modified
/// time are unchanged. A delete marker is refused METHOD_NOT_ALLOWED.
fn change_version<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    version: &str,
    change: impl FnOnce(&mut pb::ObjectRecord),
) -> Outcome {
    require_bucket(kv, bucket)?;
    let want = versions::parse(version)?;
    let Some(mut found) = versions::find(kv, bucket, key, want)? else {
        return match want {
            versions::Want::Current => refuse(ErrorCode::NoSuchKey, format!("no such key: {key}")),
            _ => refuse(
                ErrorCode::NoSuchVersion,
                format!("no version {version} of {key}"),
            ),
        };
    };
    if found.record.delete_marker {
        return refuse(
            ErrorCode::MethodNotAllowed,
            format!("version {version} of {key} is a delete marker"),
        );
    }
    change(&mut found.record);
    let mut b = Batch::new();
    records::put(&mut b, found.space, found.key, &found.record);
    Ok((b, Applied::Done))
}

/// Replaces the tags of a version (S3 PutObjectTagging).
fn put_object_tagging<K: KvStore>(kv: &K, r: &pb::PutObjectTaggingRequest) -> Outcome {
    change_version(kv, &r.bucket, &r.key, &r.version_id, |o| {
        o.tags = r.tags.clone()
    })
}

/// Replaces the canned ACL of a version (S3 PutObjectAcl); its tags are
/// unchanged.
fn put_object_acl<K: KvStore>(kv: &K, r: &pb::PutObjectAclRequest) -> Outcome {
    change_version(kv, &r.bucket, &r.key, &r.version_id, |o| o.acl = r.acl)
}

/// Replaces one subresource of a bucket (tags, ACL, policy, CORS) whole;
/// the others are unchanged.
fn put_bucket_config<K: KvStore>(kv: &K, r: &pb::PutBucketConfigRequest) -> Outcome {
    use pb::put_bucket_config_request::Config;
    let mut bucket = require_bucket(kv, &r.name)?;
    let key = keys::bucket(&r.name);
    match &r.config {
        Some(Config::Tags(t)) => bucket.tags = t.tags.clone(),
        Some(Config::Acl(acl)) => bucket.acl = *acl,
        Some(Config::Policy(p)) => bucket.policy = p.clone(),
        Some(Config::Cors(c)) => bucket.cors = c.rules.clone(),
        Some(Config::Lifecycle(l)) => bucket.lifecycle = l.rules.clone(),
        Some(Config::Versioning(v)) => {
            if !matches!(
                pb::Versioning::try_from(*v),
                Ok(pb::Versioning::Enabled | pb::Versioning::Suspended)
            ) {
                return refuse(
                    ErrorCode::InvalidArgument,
                    "versioning can only be Enabled or Suspended",
                );
            }
            bucket.versioning = *v;
        }
        None => {
            return refuse(
                ErrorCode::InvalidArgument,
                "PutBucketConfig without a value",
            );
        }
    }
    let mut b = Batch::new();
    b.put(Space::Buckets, key, bucket.encode_to_vec());
    Ok((b, Applied::Done))
}

/// Records a multipart upload initiated at leader time `now_ms` (the
/// caller's `initiated_ms` is ignored).
fn create_upload<K: KvStore>(kv: &K, r: &pb::CreateUploadRequest, now_ms: i64) -> Outcome {
    let Some(upload) = &r.upload else {
        return refuse(ErrorCode::InvalidArgument, "CreateUpload without an upload");
    };
    require_bucket(kv, &upload.bucket)?;
    let key = keys::upload(&upload.bucket, &upload.key, &upload.upload_id);
    let mut b = Batch::new();
    // A retried create keeps the first record (and its initiation time).
    if kv.get(Space::Uploads, &key)?.is_none() {
        let mut upload = upload.clone();
        upload.initiated_ms = now_ms;
        b.put(Space::Uploads, key, upload.encode_to_vec());
    }
    Ok((b, Applied::Done))
}

fn require_upload<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    upload_id: &str,
) -> Result<pb::UploadRecord, SmError> {
    match get(
        kv,
        Space::Uploads,
        &keys::upload(bucket, key, upload_id),
        "upload",
    )? {
        Some(u) => Ok(u),
        None => refuse(
            ErrorCode::NoSuchUpload,
            format!("no such upload: {upload_id}"),
        ),
    }
}

fn put_part<K: KvStore>(kv: &K, r: &pb::PutPartRequest) -> Outcome {
    let Some(part) = &r.part else {
        return refuse(ErrorCode::InvalidArgument, "PutPart without a part");
    };
    if part.part_number == 0 || part.part_number > MAX_PART_NUMBER {
        return refuse(
            ErrorCode::InvalidArgument,
            format!(
                "part number {} is not in 1..={MAX_PART_NUMBER}",
                part.part_number
            ),
        );
    }
    require_upload(kv, &r.bucket, &r.key, &part.upload_id)?;
    let key = keys::part(&part.upload_id, part.part_number);
    let old: Option<pb::PartRecord> = get(kv, Space::Parts, &key, "part")?;
    let new_blob = part.placement.as_ref().map(|p| p.blob_id.as_str());
    let released: Vec<pb::Placement> = old
        .and_then(|o| o.placement)
        .filter(|p| Some(p.blob_id.as_str()) != new_blob)
        .into_iter()
        .collect();
    let mut b = Batch::new();
    b.put(Space::Parts, key, part.encode_to_vec());
    update_index(&mut b, &released, part_refs(&r.bucket, &r.key, part));
    Ok((b, Applied::Released(released)))
}

/// All part records of an upload, by part number (at most 10000).
fn upload_parts<K: KvStore>(
    kv: &K,
    upload_id: &str,
) -> Result<BTreeMap<u32, pb::PartRecord>, SmError> {
    let rows = kv.scan_prefix(
        Space::Parts,
        &keys::parts_prefix(upload_id),
        MAX_PART_NUMBER as usize + 1,
    )?;
    let mut parts = BTreeMap::new();
    for (_, v) in rows {
        let p: pb::PartRecord = super::decode("part", &v)?;
        parts.insert(p.part_number, p);
    }
    Ok(parts)
}

fn same_list(object: &pb::ObjectRecord, listed: &[pb::CompletedPart]) -> bool {
    object.parts.len() == listed.len()
        && object.parts.iter().zip(listed).all(|(p, l)| {
            p.part_number == l.part_number && part_etag(&p.md5) == normalize_etag(&l.etag)
        })
}

fn complete_upload<K: KvStore>(
    kv: &K,
    r: &pb::CompleteUploadRequest,
    index: u64,
    now_ms: i64,
) -> Outcome {
    let bucket = require_bucket(kv, &r.bucket)?;
    let upload_key = keys::upload(&r.bucket, &r.key, &r.upload_id);
    let object_key = keys::object(&r.bucket, &r.key);
    let current = records::get(kv, Space::Objects, &object_key)?;
    let Some(upload) = get::<pb::UploadRecord, _>(kv, Space::Uploads, &upload_key, "upload")?
    else {
        // Completing an already completed upload with the same list returns
        // the object it created.
        if let Some(obj) = current
            && obj.multipart
            && obj.upload_id == r.upload_id
            && same_list(&obj, &r.parts)
        {
            let response = pb::CompleteUploadResponse {
                version_id: versions::reported(bucket.versioning(), &obj),
                object: Some(obj),
                released: Vec::new(),
            };
            return Ok((Batch::new(), Applied::Completed(Box::new(response))));
        }
        return refuse(
            ErrorCode::NoSuchUpload,
            format!("no such upload: {}", r.upload_id),
        );
    };

    check_condition(current.as_ref(), r.condition.as_ref())?;
    if r.parts.is_empty() {
        return refuse(ErrorCode::InvalidPartOrder, "the part list is empty");
    }
    if r.parts
        .windows(2)
        .any(|w| w[1].part_number <= w[0].part_number)
    {
        return refuse(
            ErrorCode::InvalidPartOrder,
            "parts are not in ascending order",
        );
    }
    let mut stored = upload_parts(kv, &r.upload_id)?;
    let all_numbers: Vec<u32> = stored.keys().copied().collect();
    let mut chosen = Vec::with_capacity(r.parts.len());
    for listed in &r.parts {
        let Some(record) = stored.remove(&listed.part_number) else {
            return refuse(
                ErrorCode::InvalidPart,
                format!("part {} was not uploaded", listed.part_number),
            );
        };
        if part_etag(&record.md5) != normalize_etag(&listed.etag) {
            return refuse(
                ErrorCode::InvalidPart,
                format!(
                    "part {} has ETag {}, not {}",
                    listed.part_number,
                    part_etag(&record.md5),
                    listed.etag
                ),
            );
        }
        chosen.push(record);
    }
    if let Some((_, init)) = chosen.split_last()
        && let Some(small) = init.iter().find(|p| p.size < r.min_part_size)
    {
        return refuse(
            ErrorCode::EntityTooSmall,
            format!(
                "part {} is {} bytes, below the minimum {}",
                small.part_number, small.size, r.min_part_size
            ),
        );
    }

    let mut object = pb::ObjectRecord {
        bucket: r.bucket.clone(),
        key: r.key.clone(),
        size: chosen.iter().map(|p| p.size).sum(),
        etag: multipart_etag(chosen.iter().map(|p| p.md5.as_slice())),
        last_modified_ms: now_ms,
        http: upload.http,
        tags: upload.tags,
        acl: upload.acl,
        checksums: r.checksums.clone(),
        parts: chosen,
        multipart: true,
        upload_id: r.upload_id.clone(),
        ..Default::default()
    };
    // What remains in `stored` was uploaded but not listed.
    let mut released: Vec<pb::Placement> =
        stored.into_values().filter_map(|p| p.placement).collect();

    let mut b = Batch::new();
    for n in all_numbers {
        b.delete(Space::Parts, keys::part(&r.upload_id, n));
    }
    b.delete(Space::Uploads, upload_key);
    update_index(&mut b, &released, []);
    released.extend(versions::write_current(
        kv,
        &mut b,
        bucket.versioning(),
        &mut object,
        current.as_ref(),
        index,
    )?);
    let version_id = versions::reported(bucket.versioning(), &object);
    Ok((
        b,
        Applied::Completed(Box::new(pb::CompleteUploadResponse {
            object: Some(object),
            released,
            version_id,
        })),
    ))
}

fn abort_upload<K: KvStore>(kv: &K, r: &pb::UploadKey) -> Outcome {
    require_upload(kv, &r.bucket, &r.key, &r.upload_id)?;
    let mut b = Batch::new();
    let released = abort_into(kv, &mut b, r)?;
    update_index(&mut b, &released, []);
    Ok((b, Applied::Released(released)))
}

/// Adds the deletions of upload `r` (its part records and itself) to `b`;
/// the placements it releases.
fn abort_into<K: KvStore>(
    kv: &K,
    b: &mut Batch,
    r: &pb::UploadKey,
) -> Result<Vec<pb::Placement>, SmError> {
    let parts = upload_parts(kv, &r.upload_id)?;
    for n in parts.keys() {
        b.delete(Space::Parts, keys::part(&r.upload_id, *n));
    }
    b.delete(
        Space::Uploads,
        keys::upload(&r.bucket, &r.key, &r.upload_id),
    );
    Ok(parts.into_values().filter_map(|p| p.placement).collect())
}

/// Aborts each listed upload that still exists and that the bucket's
/// rules, as they are now, still abort at leader time `now_ms`
/// (AbortIncompleteMultipartUpload); anything changed since the sweeper's
/// page is left alone.
fn expire_uploads<K: KvStore>(kv: &K, r: &rpb::ExpireUploads, now_ms: i64) -> Outcome {
    positive_day_ms("ExpireUploads", r.day_ms)?;
    let mut b = Batch::new();
    let mut released = Vec::new();
    let mut seen = HashSet::new();
    let mut rules: HashMap<&str, Vec<pb::LifecycleRule>> = HashMap::new();
    for u in &r.uploads {
        if !seen.insert((&u.bucket, &u.key, &u.upload_id)) {
            continue;
        }
        if !rules.contains_key(u.bucket.as_str()) {
            let bucket: Option<pb::Bucket> =
                get(kv, Space::Buckets, &keys::bucket(&u.bucket), "bucket")?;
            rules.insert(&u.bucket, bucket.map(|b| b.lifecycle).unwrap_or_default());
        }
        let key = keys::upload(&u.bucket, &u.key, &u.upload_id);
        let Some(upload): Option<pb::UploadRecord> = get(kv, Space::Uploads, &key, "upload")?
        else {
            continue;
        };
        if !super::lifecycle::upload_expired(&rules[u.bucket.as_str()], &upload, now_ms, r.day_ms) {
            continue;
        }
        released.extend(abort_into(kv, &mut b, u)?);
    }
    update_index(&mut b, &released, []);
    Ok((b, Applied::Released(released)))
}
