//! Lifecycle rules evaluated against the state machine (S3 "Managing the
//! lifecycle of objects", "Lifecycle configuration elements"): which
//! objects a bucket's rules expire and which multipart uploads they abort,
//! one bounded page of a bucket's keyspace at a time. The leader's
//! lifecycle sweeper (meta/src/lifecycle.rs) proposes what a page finds.
//!
//! Timing follows S3: an object expires `Days` after its last-modified
//! time rounded up to the next midnight UTC, or on `Date` (midnight UTC);
//! an upload is aborted `DaysAfterInitiation` after its initiation, rounded
//! the same way. With a `day` shorter than 24 h (tests, like Ceph RGW's
//! `rgw_lc_debug_interval`), a day is that long and nothing is rounded.

use std::ops::Bound;

use sluice_proto::meta as pb;
use sluice_proto::raft as rpb;

use super::{SmError, decode, keys};
use crate::store::{KvStore, Pair, Space, prefix_end};

/// Milliseconds in a (real) day.
pub const DAY_MS: i64 = 86_400_000;

/// When `days` days after `from_ms` is, with days of `day_ms`: rounded up
/// to the next midnight UTC for real days.
fn after_days(from_ms: i64, days: u32, day_ms: i64) -> i64 {
    let at = from_ms.saturating_add(i64::from(days).saturating_mul(day_ms));
    if day_ms == DAY_MS {
        at.div_euclid(DAY_MS)
            .saturating_add(i64::from(at.rem_euclid(DAY_MS) != 0))
            .saturating_mul(DAY_MS)
    } else {
        at
    }
}

/// Whether `rule`'s filter selects an object (or upload) `key` of `size`
/// bytes carrying `tags`.
fn selects(rule: &pb::LifecycleRule, key: &str, size: Option<u64>, tags: &[pb::Tag]) -> bool {
    rule.enabled
        && key.starts_with(&rule.prefix)
        && rule.tags.iter().all(|t| tags.contains(t))
        && rule
            .size_greater_than
            .is_none_or(|min| size.is_some_and(|s| s > min))
        && rule
            .size_less_than
            .is_none_or(|max| size.is_some_and(|s| s < max))
}

/// Whether any of `rules` expires `obj` at `now_ms`.
pub fn object_expired(
    rules: &[pb::LifecycleRule],
    obj: &pb::ObjectRecord,
    now_ms: i64,
    day_ms: i64,
) -> bool {
    rules.iter().any(|r| {
        selects(r, &obj.key, Some(obj.size), &obj.tags)
            && ((r.expiration_days > 0
                && now_ms >= after_days(obj.last_modified_ms, r.expiration_days, day_ms))
                || (r.expiration_date_ms > 0 && now_ms >= r.expiration_date_ms))
    })
}

/// Whether any of `rules` expires the noncurrent version `obj`, noncurrent
/// since `since_ms` (when the next newer version was written), at `now_ms`
/// (NoncurrentVersionExpiration's NoncurrentDays, rounded as Days are).
pub fn noncurrent_expired(
    rules: &[pb::LifecycleRule],
    obj: &pb::ObjectRecord,
    since_ms: i64,
    now_ms: i64,
    day_ms: i64,
) -> bool {
    !obj.delete_marker
        && rules.iter().any(|r| {
            r.noncurrent_days > 0
                && selects(r, &obj.key, Some(obj.size), &obj.tags)
                && now_ms >= after_days(since_ms, r.noncurrent_days, day_ms)
        })
}

/// When the noncurrent version stored at `row` (a `Versions` key of
/// `bucket`/`key`) became noncurrent: the last-modified time of the next
/// newer version — the row before it, else the current record. `None`
/// when it is the latest version (a delete marker), so not noncurrent.
pub fn noncurrent_since<K: KvStore>(
    kv: &K,
    bucket: &str,
    key: &str,
    row: &[u8],
) -> Result<Option<i64>, SmError> {
    let first = keys::versions_of(bucket, key);
    let mut newer: Option<i64> = None;
    let mut from = Bound::Included(first);
    loop {
        let rows = kv.scan(
            Space::Versions,
            crate::store::as_ref_bound(&from),
            Bound::Excluded(row),
            256,
        )?;
        let n = rows.len();
        for (k, v) in rows {
            let r: pb::ObjectRecord = decode("object version", &v)?;
            newer = Some(r.last_modified_ms);
            from = Bound::Excluded(k);
        }
        if n < 256 {
            break;
        }
    }
    if newer.is_some() {
        return Ok(newer);
    }
    let current: Option<pb::ObjectRecord> =
        super::get(kv, Space::Objects, &keys::object(bucket, key), "object")?;
    Ok(current.map(|c| c.last_modified_ms))
}

/// Whether any of `rules` aborts `upload` at `now_ms`. An upload has no
/// tags nor size yet: a rule filtering on them does not apply (S3 refuses
/// AbortIncompleteMultipartUpload with a tag filter).
pub fn upload_expired(
    rules: &[pb::LifecycleRule],
    upload: &pb::UploadRecord,
    now_ms: i64,
    day_ms: i64,
) -> bool {
    rules.iter().any(|r| {
        r.abort_incomplete_days > 0
            && r.tags.is_empty()
            && r.size_greater_than.is_none()
            && r.size_less_than.is_none()
            && selects(r, &upload.key, None, &[])
            && now_ms >= after_days(upload.initiated_ms, r.abort_incomplete_days, day_ms)
    })
}

/// One page of a lifecycle scan: what it found, and where the next page
/// starts (exclusive; `None` after the bucket's last record).
#[derive(Debug, PartialEq)]
pub struct LifecyclePage<T> {
    pub found: Vec<T>,
    pub next: Option<Vec<u8>>,
}

fn scan_bucket<K: KvStore>(
    kv: &K,
    space: Space,
    bucket: &str,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<(Vec<Pair>, bool), SmError> {
    let base = keys::bucket_base(bucket);
    let end = prefix_end(&base);
    let start = match after {
        Some(k) => Bound::Excluded(k),
        None => Bound::Included(base.as_slice()),
    };
    let end = match &end {
        Some(e) => Bound::Excluded(e.as_slice()),
        None => Bound::Unbounded,
    };
    let limit = limit.max(1);
    let rows = kv.scan(space, start, end, limit)?;
    let full = rows.len() == limit;
    Ok((
        rows.into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect(),
        full,
    ))
}

/// The records of `space` in `bucket` after store key `after` (up to
/// `limit`) that `pick` selects.
fn scan_page<K: KvStore, R: prost::Message + Default, T>(
    kv: &K,
    space: Space,
    bucket: &str,
    after: Option<&[u8]>,
    limit: usize,
    what: &'static str,
    pick: impl Fn(R) -> Option<T>,
) -> Result<LifecyclePage<T>, SmError> {
    let (rows, full) = scan_bucket(kv, space, bucket, after, limit)?;
    let mut page = LifecyclePage {
        found: Vec::new(),
        next: None,
    };
    for (k, v) in rows {
        if let Some(found) = pick(decode(what, &v)?) {
            page.found.push(found);
        }
        if full {
            page.next = Some(k);
        }
    }
    Ok(page)
}

/// The objects of `bucket` that its rules expire at `now_ms`, among up to
/// `limit` records after store key `after`.
pub fn expired_objects<K: KvStore>(
    kv: &K,
    bucket: &pb::Bucket,
    after: Option<&[u8]>,
    now_ms: i64,
    day_ms: i64,
    limit: usize,
) -> Result<LifecyclePage<rpb::ExpireObject>, SmError> {
    scan_page(
        kv,
        Space::Objects,
        &bucket.name,
        after,
        limit,
        "object",
        |obj: pb::ObjectRecord| {
            object_expired(&bucket.lifecycle, &obj, now_ms, day_ms).then_some(rpb::ExpireObject {
                bucket: obj.bucket,
                key: obj.key,
                etag: obj.etag,
                last_modified_ms: obj.last_modified_ms,
                version_id: String::new(),
            })
        },
    )
}

/// The noncurrent versions of `bucket` that its rules expire at `now_ms`
/// (NoncurrentVersionExpiration), among up to `limit` `Versions` rows
/// after store key `after`.
pub fn expired_versions<K: KvStore>(
    kv: &K,
    bucket: &pb::Bucket,
    after: Option<&[u8]>,
    now_ms: i64,
    day_ms: i64,
    limit: usize,
) -> Result<LifecyclePage<rpb::ExpireObject>, SmError> {
    let mut page = LifecyclePage {
        found: Vec::new(),
        next: None,
    };
    if !bucket
        .lifecycle
        .iter()
        .any(|r| r.enabled && r.noncurrent_days > 0)
    {
        return Ok(page);
    }
    let (rows, full) = scan_bucket(kv, Space::Versions, &bucket.name, after, limit)?;
    // The previous row of this page: (key, last-modified), the next newer
    // version of a row of the same key.
    let mut previous: Option<(String, i64)> = None;
    for (k, v) in rows {
        let obj: pb::ObjectRecord = decode("object version", &v)?;
        let since = match &previous {
            Some((key, at)) if *key == obj.key => Some(*at),
            _ => noncurrent_since(kv, &bucket.name, &obj.key, &k)?,
        };
        if let Some(since) = since
            && noncurrent_expired(&bucket.lifecycle, &obj, since, now_ms, day_ms)
        {
            page.found.push(rpb::ExpireObject {
                bucket: obj.bucket.clone(),
                key: obj.key.clone(),
                etag: obj.etag.clone(),
                last_modified_ms: obj.last_modified_ms,
                version_id: super::versions::shown_id(&obj).to_string(),
            });
        }
        previous = Some((obj.key, obj.last_modified_ms));
        if full {
            page.next = Some(k);
        }
    }
    Ok(page)
}

/// The multipart uploads of `bucket` that its rules abort at `now_ms`,
/// among up to `limit` records after store key `after`.
pub fn expired_uploads<K: KvStore>(
    kv: &K,
    bucket: &pb::Bucket,
    after: Option<&[u8]>,
    now_ms: i64,
    day_ms: i64,
    limit: usize,
) -> Result<LifecyclePage<pb::UploadKey>, SmError> {
    scan_page(
        kv,
        Space::Uploads,
        &bucket.name,
        after,
        limit,
        "upload",
        |u: pb::UploadRecord| {
            upload_expired(&bucket.lifecycle, &u, now_ms, day_ms).then_some(pb::UploadKey {
                bucket: u.bucket,
                key: u.key,
                upload_id: u.upload_id,
                op_id: String::new(),
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> pb::LifecycleRule {
        pb::LifecycleRule {
            enabled: true,
            ..Default::default()
        }
    }

    fn object(key: &str, modified_ms: i64, size: u64) -> pb::ObjectRecord {
        pb::ObjectRecord {
            key: key.into(),
            last_modified_ms: modified_ms,
            size,
            ..Default::default()
        }
    }

    #[test]
    fn days_round_up_to_midnight_utc() {
        // 2026-12-03T10:00Z + 1 day -> 2026-12-05T00:00Z.
        let dec3_10h = 1_796_292_000_000;
        assert_eq!(dec3_10h % DAY_MS, 10 * 3_600_000);
        let expected = dec3_10h - 10 * 3_600_000 + 2 * DAY_MS;
        assert_eq!(after_days(dec3_10h, 1, DAY_MS), expected);
        // Exactly midnight stays.
        assert_eq!(after_days(expected - DAY_MS, 1, DAY_MS), expected);
        // Debug days are not rounded.
        assert_eq!(after_days(1_000, 3, 500), 2_500);
    }

    #[test]
    fn rules_select_by_prefix_tags_size_and_time() {
        let day = 1_000;
        let mut r = rule();
        r.prefix = "logs/".into();
        r.expiration_days = 2;
        let rules = vec![r.clone()];
        assert!(!object_expired(&rules, &object("logs/a", 0, 1), 1_999, day));
        assert!(object_expired(&rules, &object("logs/a", 0, 1), 2_000, day));
        assert!(!object_expired(&rules, &object("data/a", 0, 1), 9_999, day));
        // Disabled rules do nothing.
        let disabled = vec![pb::LifecycleRule {
            enabled: false,
            ..r.clone()
        }];
        assert!(!object_expired(
            &disabled,
            &object("logs/a", 0, 1),
            9_999,
            day
        ));
        // Tags: every tag of the filter must be on the object.
        let tag = pb::Tag {
            key: "tmp".into(),
            value: "1".into(),
        };
        let tagged = vec![pb::LifecycleRule {
            tags: vec![tag.clone()],
            ..r.clone()
        }];
        let mut obj = object("logs/a", 0, 1);
        assert!(!object_expired(&tagged, &obj, 9_999, day));
        obj.tags = vec![tag];
        assert!(object_expired(&tagged, &obj, 9_999, day));
        // Size bounds are exclusive.
        let sized = vec![pb::LifecycleRule {
            size_greater_than: Some(10),
            ..r.clone()
        }];
        assert!(!object_expired(
            &sized,
            &object("logs/a", 0, 10),
            9_999,
            day
        ));
        assert!(object_expired(&sized, &object("logs/a", 0, 11), 9_999, day));
        // A date expires everything selected once reached.
        let dated = vec![pb::LifecycleRule {
            expiration_days: 0,
            expiration_date_ms: 5_000,
            ..r
        }];
        assert!(!object_expired(
            &dated,
            &object("logs/a", 4_999, 1),
            4_999,
            day
        ));
        assert!(object_expired(
            &dated,
            &object("logs/a", 4_999, 1),
            5_000,
            day
        ));
    }

    #[test]
    fn uploads_abort_after_their_days_unless_the_rule_filters_on_tags() {
        let day = 1_000;
        let upload = pb::UploadRecord {
            key: "tmp/u".into(),
            initiated_ms: 100,
            ..Default::default()
        };
        let mut r = rule();
        r.abort_incomplete_days = 1;
        assert!(!upload_expired(&[r.clone()], &upload, 1_099, day));
        assert!(upload_expired(&[r.clone()], &upload, 1_100, day));
        let expiration_only = pb::LifecycleRule {
            abort_incomplete_days: 0,
            expiration_days: 1,
            ..r.clone()
        };
        assert!(!upload_expired(&[expiration_only], &upload, 9_999, day));
        let with_tags = pb::LifecycleRule {
            tags: vec![pb::Tag::default()],
            ..r
        };
        assert!(!upload_expired(&[with_tags], &upload, 9_999, day));
    }
}
