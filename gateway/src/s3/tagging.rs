//! Object tagging: Put/Get/DeleteObjectTagging, the `x-amz-tagging` header
//! of PutObject, CopyObject (with `x-amz-tagging-directive`) and
//! CreateMultipartUpload, and `x-amz-tagging-count` on GetObject.
//!
//! Limits and errors follow S3 ("Categorizing your storage using tags" and
//! the PutObjectTagging page of the S3 API reference):
//! * at most 10 tags per object, else 400 `BadRequest` ("Object tags cannot
//!   be greater than 10");
//! * a key of 1 to 128 and a value of 0 to 256 Unicode characters, of
//!   letters, digits, white space and `+ - = . _ : / @`, the key not starting
//!   with `aws:`; a key given twice; else 400 `InvalidTag`;
//! * the header form is URL-query encoded (`k1=v1&k2=v2`); a malformed one
//!   is 400 `InvalidArgument`.
//!
//! Tags live in the object record (`ObjectRecord.tags`); PutObjectTagging
//! replaces them in one Raft command that leaves the body untouched.

use http::StatusCode;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use sluice_proto::meta as pb;

use super::Gateway;
use super::error::{invalid_argument, meta_error, version_header};

/// Most tags an object carries (S3's limit).
pub const MAX_TAGS: usize = 10;
/// Most tags a bucket carries (S3's limit).
pub const MAX_BUCKET_TAGS: usize = 50;
/// Longest tag key, in Unicode characters.
pub const MAX_KEY_CHARS: usize = 128;
/// Longest tag value, in Unicode characters.
pub const MAX_VALUE_CHARS: usize = 256;

fn invalid_tag(message: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidTag, message.into())
}

fn allowed(c: char) -> bool {
    c.is_alphanumeric() || c.is_whitespace() || "+-=._:/@".contains(c)
}

/// Checks an object's `tags` against S3's limits (see the module docs).
pub fn validate(tags: &[pb::Tag]) -> S3Result<()> {
    if tags.len() > MAX_TAGS {
        let mut e = S3Error::with_message(
            S3ErrorCode::Custom("BadRequest".into()),
            "Object tags cannot be greater than 10",
        );
        e.set_status_code(StatusCode::BAD_REQUEST);
        return Err(e);
    }
    validate_each(tags)
}

/// Checks a bucket's `tags` (S3 PutBucketTagging): at most
/// [`MAX_BUCKET_TAGS`], else 400 `InvalidTag`; each tag as an object's.
pub fn validate_bucket(tags: &[pb::Tag]) -> S3Result<()> {
    if tags.len() > MAX_BUCKET_TAGS {
        return Err(invalid_tag("Bucket tag count cannot be greater than 50"));
    }
    validate_each(tags)
}

fn validate_each(tags: &[pb::Tag]) -> S3Result<()> {
    for (i, t) in tags.iter().enumerate() {
        let key_chars = t.key.chars().count();
        if key_chars == 0 || key_chars > MAX_KEY_CHARS {
            return Err(invalid_tag(format!(
                "The TagKey you have provided is invalid: it must be 1 to {MAX_KEY_CHARS} characters"
            )));
        }
        if t.value.chars().count() > MAX_VALUE_CHARS {
            return Err(invalid_tag(format!(
                "The TagValue you have provided is too long, max {MAX_VALUE_CHARS}"
            )));
        }
        if !t.key.chars().all(allowed) || !t.value.chars().all(allowed) {
            return Err(invalid_tag(
                "The TagKey or TagValue you have provided contains a character that is not allowed",
            ));
        }
        if t.key.starts_with("aws:") {
            return Err(invalid_tag("Your TagKey cannot be prefixed with aws:"));
        }
        if tags[..i].iter().any(|o| o.key == t.key) {
            return Err(invalid_tag(
                "Cannot provide multiple Tags with the same key",
            ));
        }
    }
    Ok(())
}

/// Parses and checks an `x-amz-tagging` header (`k1=v1&k2=v2`, URL-query
/// encoded; a key without `=` has an empty value).
pub fn from_header(header: &str) -> S3Result<Vec<pb::Tag>> {
    if header.is_empty() {
        return Ok(Vec::new());
    }
    if header
        .split('&')
        .any(|pair| pair.split('=').next() == Some(""))
    {
        return Err(invalid_argument(
            "The header 'x-amz-tagging' shall be encoded as UTF-8 then URLEncoded URL query parameters without tag name duplicates.",
        ));
    }
    let tags: Vec<pb::Tag> = form_urlencoded::parse(header.as_bytes())
        .map(|(k, v)| pb::Tag {
            key: k.into_owned(),
            value: v.into_owned(),
        })
        .collect();
    validate(&tags)?;
    Ok(tags)
}

/// The tags of an optional `x-amz-tagging` header (none when absent).
pub fn from_optional_header(header: Option<&str>) -> S3Result<Vec<pb::Tag>> {
    header.map_or(Ok(Vec::new()), from_header)
}

/// `x-amz-tagging-count`: `None` for an untagged object, as S3 omits it.
pub fn tag_count(obj: &pb::ObjectRecord) -> Option<i32> {
    (!obj.tags.is_empty()).then_some(obj.tags.len() as i32)
}

pub(super) fn tags_of(set: TagSet) -> Vec<pb::Tag> {
    set.into_iter()
        .map(|t| pb::Tag {
            key: t.key.unwrap_or_default(),
            value: t.value.unwrap_or_default(),
        })
        .collect()
}

fn from_tag_set(set: TagSet) -> S3Result<Vec<pb::Tag>> {
    let tags = tags_of(set);
    validate(&tags)?;
    Ok(tags)
}

pub(super) fn to_tag_set(tags: &[pb::Tag]) -> TagSet {
    tags.iter()
        .map(|t| Tag {
            key: Some(t.key.clone()),
            value: Some(t.value.clone()),
        })
        .collect()
}

pub(super) async fn get_object_tagging(
    gw: &Gateway,
    req: S3Request<GetObjectTaggingInput>,
) -> S3Result<S3Response<GetObjectTaggingOutput>> {
    let input = req.input;
    let obj = gw
        .meta
        .head_version(
            &input.bucket,
            &input.key,
            input.version_id.as_deref().unwrap_or(""),
            false,
        )
        .await
        .map_err(meta_error)?;
    Ok(S3Response::new(GetObjectTaggingOutput {
        tag_set: to_tag_set(&obj.tags),
        version_id: version_header(&obj),
    }))
}

pub(super) async fn put_object_tagging(
    gw: &Gateway,
    req: S3Request<PutObjectTaggingInput>,
) -> S3Result<S3Response<PutObjectTaggingOutput>> {
    let input = req.input;
    let tags = from_tag_set(input.tagging.tag_set)?;
    gw.meta
        .put_object_tagging(
            &input.bucket,
            &input.key,
            input.version_id.as_deref().unwrap_or(""),
            tags,
        )
        .await
        .map_err(meta_error)?;
    Ok(S3Response::new(PutObjectTaggingOutput::default()))
}

pub(super) async fn delete_object_tagging(
    gw: &Gateway,
    req: S3Request<DeleteObjectTaggingInput>,
) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
    let input = req.input;
    gw.meta
        .put_object_tagging(
            &input.bucket,
            &input.key,
            input.version_id.as_deref().unwrap_or(""),
            Vec::new(),
        )
        .await
        .map_err(meta_error)?;
    // s3s answers 204 No Content, as S3 does.
    Ok(S3Response::new(DeleteObjectTaggingOutput::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(k: &str, v: &str) -> pb::Tag {
        pb::Tag {
            key: k.into(),
            value: v.into(),
        }
    }

    fn code(r: S3Result<Vec<pb::Tag>>) -> String {
        r.unwrap_err().code().as_str().to_string()
    }

    #[test]
    fn header_is_a_url_query() {
        assert_eq!(
            from_header("project=blue%20sky&empty=&bare").unwrap(),
            vec![
                tag("project", "blue sky"),
                tag("empty", ""),
                tag("bare", "")
            ]
        );
        assert_eq!(from_header("a=b+c").unwrap(), vec![tag("a", "b c")]);
        assert!(from_header("").unwrap().is_empty());
        assert_eq!(code(from_header("=v")), "InvalidArgument");
    }

    #[test]
    fn limits_follow_s3() {
        let eleven: Vec<String> = (0..11).map(|i| format!("k{i}=v")).collect();
        let e = from_header(&eleven.join("&")).unwrap_err();
        assert_eq!(
            (e.code().as_str(), e.status_code()),
            ("BadRequest", Some(StatusCode::BAD_REQUEST))
        );
        let ten: Vec<String> = (0..10).map(|i| format!("k{i}=v")).collect();
        assert_eq!(from_header(&ten.join("&")).unwrap().len(), 10);
        assert_eq!(code(from_header("a=1&a=2")), "InvalidTag");
        assert_eq!(code(from_header("aws:x=1")), "InvalidTag");
        assert_eq!(
            code(from_header("k=%3Cb%3E")),
            "InvalidTag",
            "< is not allowed"
        );
        let long_key = "k".repeat(129);
        assert_eq!(code(from_header(&format!("{long_key}=v"))), "InvalidTag");
        let ok_key = "ü".repeat(128);
        assert!(
            validate(&[tag(&ok_key, &"v".repeat(256))]).is_ok(),
            "characters, not bytes"
        );
        assert!(validate(&[tag("k", &"v".repeat(257))]).is_err());
        assert!(validate(&[tag("Team Name", "a+b-c=d.e_f:g/h@i")]).is_ok());
    }

    #[test]
    fn tag_count_is_absent_without_tags() {
        let mut obj = pb::ObjectRecord::default();
        assert_eq!(tag_count(&obj), None);
        obj.tags = vec![tag("a", "1"), tag("b", "2")];
        assert_eq!(tag_count(&obj), Some(2));
    }
}
