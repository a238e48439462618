//! Put/Get/DeleteBucketLifecycleConfiguration (S3 API reference, and
//! "Lifecycle configuration elements"): the rules are checked here and
//! stored in the bucket's record; the meta leader executes them
//! (meta/src/lifecycle.rs).
//!
//! Supported: `Expiration` with `Days` or `Date` (midnight UTC),
//! `AbortIncompleteMultipartUpload` (`DaysAfterInitiation`),
//! `NoncurrentVersionExpiration` (`NoncurrentDays`; there are no noncurrent
//! versions until versioning exists), filters by `Prefix` (also the
//! deprecated rule-level `Prefix`), `Tag`, `And` (prefix, tags, sizes) and
//! `ObjectSizeGreaterThan`/`LessThan`. Refused with `501 NotImplemented`:
//! `Transition`s (one storage class here), `ExpiredObjectDeleteMarker` and
//! `NewerNoncurrentVersions` (they need versioning). Errors otherwise as S3:
//! `MalformedXML` (no rules, more than 1000, a bad status, a prefix in both
//! places), `InvalidArgument` (days not positive, a date not at midnight,
//! an ID too long or repeated), `InvalidRequest` (a rule without an action,
//! an abort rule filtering on tags).

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_proto::meta as pb;
use sluice_proto::meta::put_bucket_config_request::Config;

use super::error::meta_error;
use super::{Gateway, tagging, timestamp, timestamp_ms};

/// Most rules in one configuration (S3's limit).
pub const MAX_RULES: usize = 1000;

/// Longest rule ID, in characters.
pub const MAX_ID_CHARS: usize = 255;

const DAY_MS: i64 = 86_400_000;

fn err(code: S3ErrorCode, message: impl Into<String>) -> S3Error {
    S3Error::with_message(code, message.into())
}

fn not_implemented(what: &str) -> S3Error {
    err(
        S3ErrorCode::NotImplemented,
        format!("{what} is not supported by this server."),
    )
}

fn positive(days: Option<i32>, what: &str) -> S3Result<u32> {
    match days {
        None => Ok(0),
        Some(d) if d > 0 => Ok(d as u32),
        Some(_) => Err(err(
            S3ErrorCode::InvalidArgument,
            format!("'Days' for {what} action must be a positive integer"),
        )),
    }
}

fn size(v: Option<i64>) -> S3Result<Option<u64>> {
    v.map(|n| {
        u64::try_from(n).map_err(|_| {
            err(
                S3ErrorCode::InvalidArgument,
                "Object size bounds must not be negative",
            )
        })
    })
    .transpose()
}

/// One S3 rule as stored, `index` naming it when it has no ID.
pub fn stored_rule(rule: &LifecycleRule, index: usize) -> S3Result<pb::LifecycleRule> {
    let enabled = match rule.status.as_str() {
        ExpirationStatus::ENABLED => true,
        ExpirationStatus::DISABLED => false,
        other => {
            return Err(err(
                S3ErrorCode::MalformedXML,
                format!("Status must be Enabled or Disabled, not {other}"),
            ));
        }
    };
    let id = rule
        .id
        .clone()
        .unwrap_or_else(|| format!("rule-{}", index + 1));
    if id.chars().count() > MAX_ID_CHARS {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "ID length should not exceed allowed limit of 255",
        ));
    }
    if rule.transitions.as_ref().is_some_and(|t| !t.is_empty())
        || rule
            .noncurrent_version_transitions
            .as_ref()
            .is_some_and(|t| !t.is_empty())
    {
        return Err(not_implemented("A Transition (storage classes)"));
    }
    let mut out = pb::LifecycleRule {
        id,
        enabled,
        ..Default::default()
    };
    // The filter: the deprecated rule-level Prefix, or Filter.
    match (&rule.prefix, &rule.filter) {
        (Some(_), Some(_)) => {
            return Err(err(
                S3ErrorCode::MalformedXML,
                "A rule has either a Prefix or a Filter, not both",
            ));
        }
        (Some(prefix), None) => out.prefix = prefix.clone(),
        (None, Some(f)) => {
            // A Filter holds exactly one of Prefix, Tag, And and the size
            // bounds (S3 LifecycleRuleFilter; combinations go in And).
            let given = [
                f.prefix.is_some(),
                f.tag.is_some(),
                f.and.is_some(),
                f.object_size_greater_than.is_some() || f.object_size_less_than.is_some(),
            ];
            if given.iter().filter(|g| **g).count() > 1 {
                return Err(err(
                    S3ErrorCode::MalformedXML,
                    "A Filter holds only one of Prefix, Tag, And and the object size bounds; combine them in And",
                ));
            }
            if let Some(and) = &f.and {
                out.prefix = and.prefix.clone().unwrap_or_default();
                out.tags = and.tags.clone().map(tagging::tags_of).unwrap_or_default();
                out.size_greater_than = size(and.object_size_greater_than)?;
                out.size_less_than = size(and.object_size_less_than)?;
            }
            if let Some(p) = &f.prefix {
                out.prefix = p.clone();
            }
            if let Some(t) = &f.tag {
                out.tags.extend(tagging::tags_of(vec![t.clone()]));
            }
            if f.object_size_greater_than.is_some() {
                out.size_greater_than = size(f.object_size_greater_than)?;
            }
            if f.object_size_less_than.is_some() {
                out.size_less_than = size(f.object_size_less_than)?;
            }
            tagging::validate_bucket(&out.tags)?;
        }
        (None, None) => {}
    }
    if let Some(e) = &rule.expiration {
        if e.expired_object_delete_marker == Some(true) {
            return Err(not_implemented(
                "ExpiredObjectDeleteMarker (delete markers need versioning)",
            ));
        }
        match (e.days, &e.date) {
            (None, None) if e.expired_object_delete_marker.is_some() => {}
            (Some(_), Some(_)) | (None, None) => {
                return Err(err(
                    S3ErrorCode::MalformedXML,
                    "Expiration needs exactly one of Days and Date",
                ));
            }
            (days @ Some(_), None) => out.expiration_days = positive(days, "Expiration")?,
            (None, Some(date)) => {
                let ms = timestamp_ms(date);
                if ms.rem_euclid(DAY_MS) != 0 {
                    return Err(err(
                        S3ErrorCode::InvalidArgument,
                        "'Date' must be at midnight GMT",
                    ));
                }
                out.expiration_date_ms = ms;
            }
        }
    }
    if let Some(n) = &rule.noncurrent_version_expiration {
        if n.newer_noncurrent_versions.is_some() {
            return Err(not_implemented("NewerNoncurrentVersions"));
        }
        out.noncurrent_days = positive(n.noncurrent_days, "NoncurrentVersionExpiration")?;
        if out.noncurrent_days == 0 {
            return Err(err(
                S3ErrorCode::MalformedXML,
                "NoncurrentVersionExpiration needs NoncurrentDays",
            ));
        }
    }
    if let Some(a) = &rule.abort_incomplete_multipart_upload {
        out.abort_incomplete_days =
            positive(a.days_after_initiation, "AbortIncompleteMultipartUpload")?;
        if out.abort_incomplete_days == 0 {
            return Err(err(
                S3ErrorCode::MalformedXML,
                "AbortIncompleteMultipartUpload needs DaysAfterInitiation",
            ));
        }
        if !out.tags.is_empty() {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "AbortIncompleteMultipartUpload cannot be specified with Tags.",
            ));
        }
        if out.size_greater_than.is_some() || out.size_less_than.is_some() {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "AbortIncompleteMultipartUpload cannot be specified with an object size filter.",
            ));
        }
    }
    if out.expiration_days == 0
        && out.expiration_date_ms == 0
        && out.noncurrent_days == 0
        && out.abort_incomplete_days == 0
    {
        return Err(err(
            S3ErrorCode::InvalidRequest,
            "At least one action needs to be specified in a rule",
        ));
    }
    Ok(out)
}

/// A whole configuration as stored (see the module docs for the errors).
pub fn stored_rules(rules: &[LifecycleRule]) -> S3Result<Vec<pb::LifecycleRule>> {
    if rules.is_empty() || rules.len() > MAX_RULES {
        return Err(err(
            S3ErrorCode::MalformedXML,
            format!("A lifecycle configuration has 1 to {MAX_RULES} rules"),
        ));
    }
    let out = rules
        .iter()
        .enumerate()
        .map(|(i, r)| stored_rule(r, i))
        .collect::<S3Result<Vec<_>>>()?;
    for (i, r) in out.iter().enumerate() {
        if out[..i].iter().any(|o| o.id == r.id) {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Rule ID must be unique. Found same ID for more than one rule",
            ));
        }
    }
    Ok(out)
}

/// A stored rule in S3's form (GetBucketLifecycleConfiguration).
pub fn s3_rule(r: &pb::LifecycleRule) -> LifecycleRule {
    let tags = tagging::to_tag_set(&r.tags);
    let sized = r.size_greater_than.is_some() || r.size_less_than.is_some();
    let as_i64 = |v: Option<u64>| v.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let elements = usize::from(!r.prefix.is_empty()) + tags.len() + usize::from(sized);
    let filter = if elements > 1 {
        LifecycleRuleFilter {
            and: Some(LifecycleRuleAndOperator {
                prefix: Some(r.prefix.clone()),
                tags: Some(tags),
                object_size_greater_than: as_i64(r.size_greater_than),
                object_size_less_than: as_i64(r.size_less_than),
            }),
            ..Default::default()
        }
    } else if !tags.is_empty() {
        LifecycleRuleFilter {
            tag: tags.into_iter().next(),
            ..Default::default()
        }
    } else if sized {
        LifecycleRuleFilter {
            object_size_greater_than: as_i64(r.size_greater_than),
            object_size_less_than: as_i64(r.size_less_than),
            ..Default::default()
        }
    } else {
        LifecycleRuleFilter {
            prefix: Some(r.prefix.clone()),
            ..Default::default()
        }
    };
    let days = |d: u32| (d > 0).then_some(d as i32);
    LifecycleRule {
        id: Some(r.id.clone()),
        status: ExpirationStatus::from_static(if r.enabled {
            ExpirationStatus::ENABLED
        } else {
            ExpirationStatus::DISABLED
        }),
        filter: Some(filter),
        prefix: None,
        expiration: (r.expiration_days > 0 || r.expiration_date_ms > 0).then(|| {
            LifecycleExpiration {
                days: days(r.expiration_days),
                date: (r.expiration_date_ms > 0).then(|| timestamp(r.expiration_date_ms)),
                expired_object_delete_marker: None,
            }
        }),
        noncurrent_version_expiration: (r.noncurrent_days > 0).then(|| {
            NoncurrentVersionExpiration {
                noncurrent_days: days(r.noncurrent_days),
                newer_noncurrent_versions: None,
            }
        }),
        abort_incomplete_multipart_upload: (r.abort_incomplete_days > 0).then(|| {
            AbortIncompleteMultipartUpload {
                days_after_initiation: days(r.abort_incomplete_days),
            }
        }),
        transitions: None,
        noncurrent_version_transitions: None,
    }
}

pub(super) async fn get_bucket_lifecycle_configuration(
    gw: &Gateway,
    req: S3Request<GetBucketLifecycleConfigurationInput>,
) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
    let b = gw
        .meta
        .get_bucket(&req.input.bucket)
        .await
        .map_err(meta_error)?;
    if b.lifecycle.is_empty() {
        return Err(err(
            S3ErrorCode::NoSuchLifecycleConfiguration,
            "The lifecycle configuration does not exist",
        ));
    }
    Ok(S3Response::new(GetBucketLifecycleConfigurationOutput {
        rules: Some(b.lifecycle.iter().map(s3_rule).collect()),
        ..Default::default()
    }))
}

pub(super) async fn put_bucket_lifecycle_configuration(
    gw: &Gateway,
    req: S3Request<PutBucketLifecycleConfigurationInput>,
) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
    let input = req.input;
    let Some(config) = input.lifecycle_configuration else {
        return Err(err(S3ErrorCode::MalformedXML, "No LifecycleConfiguration"));
    };
    let rules = stored_rules(&config.rules)?;
    gw.put_bucket_config(
        &input.bucket,
        Config::Lifecycle(pb::BucketLifecycle { rules }),
    )
    .await?;
    Ok(S3Response::new(
        PutBucketLifecycleConfigurationOutput::default(),
    ))
}

pub(super) async fn delete_bucket_lifecycle(
    gw: &Gateway,
    req: S3Request<DeleteBucketLifecycleInput>,
) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
    gw.put_bucket_config(
        &req.input.bucket,
        Config::Lifecycle(pb::BucketLifecycle::default()),
    )
    .await?;
    Ok(S3Response::new(DeleteBucketLifecycleOutput {}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> LifecycleRule {
        LifecycleRule {
            abort_incomplete_multipart_upload: None,
            expiration: Some(LifecycleExpiration {
                days: Some(30),
                date: None,
                expired_object_delete_marker: None,
            }),
            filter: Some(LifecycleRuleFilter {
                prefix: Some("logs/".into()),
                ..Default::default()
            }),
            id: Some("logs".into()),
            noncurrent_version_expiration: None,
            noncurrent_version_transitions: None,
            prefix: None,
            status: ExpirationStatus::from_static(ExpirationStatus::ENABLED),
            transitions: None,
        }
    }

    fn code(r: S3Result<Vec<pb::LifecycleRule>>) -> S3ErrorCode {
        r.expect_err("refused").code().clone()
    }

    #[test]
    fn rules_round_trip() {
        let mut tagged = rule();
        tagged.id = Some("tmp".into());
        tagged.filter = Some(LifecycleRuleFilter {
            and: Some(LifecycleRuleAndOperator {
                prefix: Some("tmp/".into()),
                tags: Some(vec![Tag {
                    key: Some("t".into()),
                    value: Some("1".into()),
                }]),
                object_size_greater_than: Some(10),
                object_size_less_than: None,
            }),
            ..Default::default()
        });
        let mut abort = rule();
        abort.id = None;
        abort.expiration = None;
        abort.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload {
            days_after_initiation: Some(7),
        });
        let mut sized = rule();
        sized.id = Some("big".into());
        sized.filter = Some(LifecycleRuleFilter {
            object_size_greater_than: Some(1 << 20),
            ..Default::default()
        });
        let mut one_tag = rule();
        one_tag.id = Some("tag".into());
        one_tag.filter = Some(LifecycleRuleFilter {
            tag: Some(Tag {
                key: Some("k".into()),
                value: Some("v".into()),
            }),
            ..Default::default()
        });
        let stored = stored_rules(&[rule(), tagged, abort, sized, one_tag]).unwrap();
        assert_eq!(stored[0].prefix, "logs/");
        assert_eq!(stored[0].expiration_days, 30);
        assert_eq!(stored[1].tags.len(), 1);
        assert_eq!(stored[1].size_greater_than, Some(10));
        assert_eq!(stored[2].id, "rule-3");
        assert_eq!(stored[2].abort_incomplete_days, 7);
        // Stored -> S3 -> stored is the identity.
        let again: Vec<LifecycleRule> = stored.iter().map(s3_rule).collect();
        assert_eq!(stored_rules(&again).unwrap(), stored);
    }

    #[test]
    fn bad_rules_get_s3_errors() {
        assert_eq!(code(stored_rules(&[])), S3ErrorCode::MalformedXML);
        let mut r = rule();
        r.expiration.as_mut().unwrap().days = Some(0);
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::InvalidArgument);
        let mut r = rule();
        r.expiration = Some(LifecycleExpiration {
            days: None,
            date: Some(timestamp(DAY_MS + 1)),
            expired_object_delete_marker: None,
        });
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::InvalidArgument);
        let mut r = rule();
        r.expiration = None;
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::InvalidRequest);
        assert_eq!(
            code(stored_rules(&[rule(), rule()])),
            S3ErrorCode::InvalidArgument,
            "duplicate IDs"
        );
        let mut r = rule();
        r.prefix = Some("x".into());
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::MalformedXML);
        let mut r = rule();
        r.status = ExpirationStatus::from("enabled".to_string());
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::MalformedXML);
        let mut r = rule();
        r.transitions = Some(vec![Transition::default()]);
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::NotImplemented);
        let mut r = rule();
        r.expiration.as_mut().unwrap().expired_object_delete_marker = Some(true);
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::NotImplemented);
        let mut r = rule();
        r.filter = Some(LifecycleRuleFilter {
            tag: Some(Tag {
                key: Some("t".into()),
                value: Some("1".into()),
            }),
            ..Default::default()
        });
        r.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload {
            days_after_initiation: Some(1),
        });
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::InvalidRequest);
        let mut r = rule();
        r.filter.as_mut().unwrap().tag = Some(Tag {
            key: Some("t".into()),
            value: Some("1".into()),
        });
        assert_eq!(
            code(stored_rules(&[r])),
            S3ErrorCode::MalformedXML,
            "Prefix and Tag"
        );
        let mut r = rule();
        r.filter = Some(LifecycleRuleFilter {
            object_size_greater_than: Some(5),
            ..Default::default()
        });
        r.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload {
            days_after_initiation: Some(1),
        });
        assert_eq!(code(stored_rules(&[r])), S3ErrorCode::InvalidRequest);
        let mut r = rule();
        r.expiration.as_mut().unwrap().expired_object_delete_marker = Some(false);
        assert_eq!(stored_rules(&[r]).unwrap()[0].expiration_days, 30);
        let mut r = rule();
        r.expiration.as_mut().unwrap().days = None;
        r.expiration.as_mut().unwrap().date = Some(timestamp(3 * DAY_MS));
        assert_eq!(
            stored_rules(&[r]).unwrap()[0].expiration_date_ms,
            3 * DAY_MS
        );
    }
}
