//! GetObject and HeadObject: conditional requests, `Range` and `partNumber`,
//! and the object body, streamed part by part from the data path.
//!
//! Precedence of conditionals follows S3 and RFC 9110 §13.2.2:
//! `If-Match` (412) first, else `If-Unmodified-Since` (412); then
//! `If-None-Match` (304), else `If-Modified-Since` (304). Dates compare at
//! one-second resolution, as HTTP dates carry.

use std::ops::Range;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode};
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, StdError};
use sluice_proto::meta as pb;

use super::error::{blob_error, custom, internal, invalid_argument, invalid_request};
use super::put::{ChecksumFields, matches_etag};
use super::{Gateway, etag, timestamp, timestamp_ms};
use crate::blob::{BlobError, BlobStore};
use crate::read_lease::ReadLease;

/// Outcome of the conditional headers of a GET or HEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    Pass,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// The conditional headers of a GET/HEAD (or, for copies, of `x-amz-copy-source-if-*`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Conditions<'a> {
    pub if_match: Option<&'a ETagCondition>,
    pub if_none_match: Option<&'a ETagCondition>,
    pub if_modified_since: Option<&'a Timestamp>,
    pub if_unmodified_since: Option<&'a Timestamp>,
}

impl Conditions<'_> {
    /// Evaluates the conditions against an object's ETag (unquoted) and
    /// last-modified time in milliseconds.
    pub fn evaluate(&self, object_etag: &str, last_modified_ms: i64) -> Precondition {
        let modified_s = last_modified_ms.div_euclid(1000);
        let seconds = |t: &Timestamp| timestamp_ms(t).div_euclid(1000);
        match self.if_match {
            Some(cond) if !matches_etag(cond, object_etag) => return Precondition::Failed,
            Some(_) => {}
            None => {
                if let Some(t) = self.if_unmodified_since
                    && modified_s > seconds(t)
                {
                    return Precondition::Failed;
                }
            }
        }
        match self.if_none_match {
            Some(cond) if matches_etag(cond, object_etag) => return Precondition::NotModified,
            Some(_) => {}
            None => {
                if let Some(t) = self.if_modified_since
                    && modified_s <= seconds(t)
                {
                    return Precondition::NotModified;
                }
            }
        }
        Precondition::Pass
    }
}

/// Turns a failed precondition into the S3 error (304 carries the validators).
fn precondition_error(outcome: Precondition, obj: &pb::ObjectRecord) -> S3Result<()> {
    match outcome {
        Precondition::Pass => Ok(()),
        Precondition::Failed => Err(S3Error::with_message(
            S3ErrorCode::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        )),
        Precondition::NotModified => {
            let mut err = S3Error::new(S3ErrorCode::NotModified);
            let mut headers = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", obj.etag)) {
                headers.insert(http::header::ETAG, v);
            }
            let mut date = Vec::new();
            if timestamp(obj.last_modified_ms)
                .format(TimestampFormat::HttpDate, &mut date)
                .is_ok()
                && let Ok(v) = HeaderValue::from_bytes(&date)
            {
                headers.insert(http::header::LAST_MODIFIED, v);
            }
            err.set_headers(headers);
            Err(err)
        }
    }
}

/// Which bytes of an object a GET/HEAD answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Payload byte range, end exclusive.
    pub range: Range<u64>,
    /// Answer 206 with `Content-Range`.
    pub partial: bool,
    /// `x-amz-mp-parts-count`, for a partNumber read of a multipart object.
    pub parts_count: Option<i32>,
    /// Index into `parts` of the part read by partNumber.
    pub part_index: Option<usize>,
}

/// Resolves `partNumber` / `Range` against an object.
///
/// Errors: both given -> `InvalidRequest`; a part number outside 1..=10000
/// -> `InvalidArgument`; a part number other than 1 of an object not
/// uploaded in parts -> `InvalidPart` (400, as S3 and RGW answer); a part a
/// multipart object does not have -> `InvalidPartNumber` (416); an
/// unsatisfiable range -> `InvalidRange` (416).
pub fn select(
    obj: &pb::ObjectRecord,
    part_number: Option<i32>,
    range: Option<&s3s::dto::Range>,
) -> S3Result<Selection> {
    let size = obj.size;
    match (part_number, range) {
        (Some(_), Some(_)) => Err(invalid_request(
            "Cannot specify both Range header and partNumber query parameter",
        )),
        (Some(pn), None) => {
            if !(1..=10_000).contains(&pn) {
                return Err(invalid_argument(
                    "Part number must be an integer between 1 and 10000, inclusive",
                ));
            }
            let unsatisfiable = || {
                custom(
                    "InvalidPartNumber",
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "The requested partnumber is not satisfiable",
                )
            };
            if !obj.multipart {
                if pn != 1 {
                    return Err(S3Error::with_message(
                        S3ErrorCode::InvalidPart,
                        "The object was not uploaded in parts; its only part is 1",
                    ));
                }
                return Ok(Selection {
                    range: 0..size,
                    partial: size > 0,
                    parts_count: None,
                    part_index: None,
                });
            }
            let pn = pn as u32;
            let index = obj
                .parts
                .iter()
                .position(|p| p.part_number == pn)
                .ok_or_else(unsatisfiable)?;
            let start: u64 = obj.parts[..index].iter().map(|p| p.size).sum();
            let end = start + obj.parts[index].size;
            Ok(Selection {
                range: start..end,
                partial: end > start,
                parts_count: Some(i32::try_from(obj.parts.len()).unwrap_or(i32::MAX)),
                part_index: Some(index),
            })
        }
        (None, Some(r)) => {
            let range = r
                .check(size)
                .ok()
                .filter(|r| !r.is_empty())
                .ok_or_else(|| {
                    S3Error::with_message(
                        S3ErrorCode::InvalidRange,
                        "The requested range is not satisfiable",
                    )
                })?;
            Ok(Selection {
                range,
                partial: true,
                parts_count: None,
                part_index: None,
            })
        }
        (None, None) => Ok(Selection {
            range: 0..size,
            partial: false,
            parts_count: None,
            part_index: None,
        }),
    }
}

impl Selection {
    /// `Content-Range` value, e.g. `bytes 0-99/1000`.
    pub fn content_range(&self, size: u64) -> Option<String> {
        (self.partial && !self.range.is_empty())
            .then(|| format!("bytes {}-{}/{size}", self.range.start, self.range.end - 1))
    }

    /// Checksums to return with `x-amz-checksum-mode: ENABLED`: the object's
    /// for a whole-object read, the part's for a partNumber read of a
    /// multipart object, none for a byte range.
    pub fn checksums<'a>(
        &self,
        obj: &'a pb::ObjectRecord,
        mode_enabled: bool,
    ) -> Option<&'a pb::Checksums> {
        if !mode_enabled {
            return None;
        }
        match self.part_index {
            Some(i) => obj.parts.get(i).and_then(|p| p.checksums.as_ref()),
            None if self.range == (0..obj.size) => obj.checksums.as_ref(),
            None => None,
        }
    }
}

/// The pieces of each part that cover `range` of an object made of parts of
/// `sizes` (in order): `(part index, byte range within the part)`.
pub fn segments(
    sizes: impl IntoIterator<Item = u64>,
    range: Range<u64>,
) -> Vec<(usize, Range<u64>)> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    for (i, size) in sizes.into_iter().enumerate() {
        let (start, end) = (offset, offset + size);
        offset = end;
        if end <= range.start || size == 0 {
            continue;
        }
        if start >= range.end {
            break;
        }
        out.push((
            i,
            range.start.max(start) - start..range.end.min(end) - start,
        ));
    }
    out
}

/// Streams bytes `range` of `object`: from its record when it is stored
/// inline, else from its parts' blobs, one part's blob at a time (a part's
/// read starts when the previous one ends).
pub fn object_stream(
    blobs: &BlobStore,
    object: &pb::ObjectRecord,
    range: Range<u64>,
) -> S3Result<BoxStream<'static, Result<Bytes, BlobError>>> {
    if !object.inline_data.is_empty() {
        // A small object's body is in its record: no datanode is read.
        let data = Bytes::copy_from_slice(
            object
                .inline_data
                .get(range.start as usize..range.end as usize)
                .ok_or_else(|| internal("range past an inline body"))?,
        );
        return Ok(futures::stream::once(async move { Ok(data) }).boxed());
    }
    let parts = &object.parts;
    let mut reads = Vec::new();
    for (i, r) in segments(parts.iter().map(|p| p.size), range) {
        let placement = parts[i]
            .placement
            .clone()
            .ok_or_else(|| internal("object part without a placement"))?;
        reads.push((placement, r));
    }
    let blobs = blobs.clone();
    Ok(futures::stream::iter(reads)
        .flat_map(move |(placement, r)| blobs.read(&placement, r))
        .boxed())
}

/// The blob ids bytes `range` of `object` are read from (none when it is
/// stored inline), in read order.
pub fn blobs_read(object: &pb::ObjectRecord, range: Range<u64>) -> Vec<String> {
    if !object.inline_data.is_empty() {
        return Vec::new();
    }
    segments(object.parts.iter().map(|p| p.size), range)
        .into_iter()
        .filter_map(|(i, _)| object.parts[i].placement.as_ref())
        .map(|p| p.blob_id.clone())
        .collect()
}

/// Why a streamed object body was cut short.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("reading object data: {0}")]
    Blob(#[from] BlobError),
    #[error("object data ended {0} bytes early")]
    Short(u64),
    #[error("object data ran past its length")]
    Long,
}

/// A response body of known length over a part-by-part blob stream. It is
/// `Sync` (as s3s requires) by holding the stream in a `Mutex` it only
/// reaches through `&mut self`, and ends with an error, never silently
/// short, if the data path yields fewer or more bytes than announced.
pub struct ObjectBody {
    inner: Mutex<BoxStream<'static, Result<Bytes, BlobError>>>,
    remaining: u64,
    done: bool,
    /// Keeps the blobs read alive while the body streams; dropped at its end.
    lease: Option<ReadLease>,
}

impl ObjectBody {
    pub fn new(inner: BoxStream<'static, Result<Bytes, BlobError>>, len: u64) -> Self {
        ObjectBody {
            inner: Mutex::new(inner),
            remaining: len,
            done: false,
            lease: None,
        }
    }

    /// This body holding `lease` until it ends or is dropped.
    pub fn with_lease(mut self, lease: Option<ReadLease>) -> Self {
        self.lease = lease;
        self
    }

    fn fail(&mut self, err: BodyError) -> Poll<Option<Result<Bytes, StdError>>> {
        tracing::error!(error = %err, "object body aborted");
        self.done = true;
        self.lease = None;
        Poll::Ready(Some(Err(Box::new(err))))
    }
}

impl Stream for ObjectBody {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let inner = this.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        match inner.poll_next_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(chunk))) => {
                let len = chunk.len() as u64;
                if len > this.remaining {
                    return this.fail(BodyError::Long);
                }
                this.remaining -= len;
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => this.fail(BodyError::Blob(e)),
            Poll::Ready(None) if this.remaining > 0 => {
                let short = this.remaining;
                this.fail(BodyError::Short(short))
            }
            Poll::Ready(None) => {
                this.done = true;
                this.lease = None;
                Poll::Ready(None)
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, None)
    }
}

impl ByteStream for ObjectBody {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(usize::try_from(self.remaining).unwrap_or(usize::MAX))
    }
}

/// Whether `x-amz-checksum-mode: ENABLED` was sent.
fn checksum_mode(mode: Option<&ChecksumMode>) -> bool {
    mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

/// Fills the output fields GetObject and HeadObject share.
macro_rules! object_output {
    ($ty:ident, $obj:expr, $sel:expr, $sums:expr, { $($extra:tt)* }) => {{
        let obj: &pb::ObjectRecord = $obj;
        let sel: &Selection = $sel;
        let sums: ChecksumFields = $sums;
        let http = obj.http.clone().unwrap_or_default();
        $ty {
            accept_ranges: Some("bytes".to_string()),
            cache_control: http.cache_control,
            content_disposition: http.content_disposition,
            content_encoding: http.content_encoding,
            content_language: http.content_language,
            content_type: Some(http.content_type.unwrap_or_else(|| "binary/octet-stream".to_string())),
            expires: http.expires_ms.map(timestamp),
            metadata: (!http.user_metadata.is_empty()).then(|| http.user_metadata.into_iter().collect()),
            content_length: Some(i64::try_from(sel.range.end - sel.range.start).unwrap_or(i64::MAX)),
            content_range: sel.content_range(obj.size),
            e_tag: Some(etag(&obj.etag)),
            last_modified: Some(timestamp(obj.last_modified_ms)),
            parts_count: sel.parts_count,
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_crc64nvme: sums.crc64nvme,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
            checksum_type: sums.checksum_type,
            version_id: super::error::version_header(obj),
            $($extra)*
            ..Default::default()
        }
    }};
}

pub(super) async fn get_object(
    gw: &Gateway,
    req: S3Request<GetObjectInput>,
) -> S3Result<S3Response<GetObjectOutput>> {
    let obj = super::acl::readable_object(
        gw,
        &req.extensions,
        &req.input.bucket,
        &req.input.key,
        req.input.version_id.as_deref(),
        true,
    )
    .await?;
    let input = req.input;
    let conditions = Conditions {
        if_match: input.if_match.as_ref(),
        if_none_match: input.if_none_match.as_ref(),
        if_modified_since: input.if_modified_since.as_ref(),
        if_unmodified_since: input.if_unmodified_since.as_ref(),
    };
    precondition_error(conditions.evaluate(&obj.etag, obj.last_modified_ms), &obj)?;
    let sel = select(&obj, input.part_number, input.range.as_ref())?;
    let len = sel.range.end - sel.range.start;
    // Started before the first byte: the GET's age is counted from here.
    let lease = gw.read_leases.start(blobs_read(&obj, sel.range.clone()));
    let mut stream = object_stream(&gw.blobs, &obj, sel.range.clone())?;
    // Read the first chunk before answering, so an unreadable object is an
    // S3 error (e.g. 503) rather than a 200 whose body breaks off.
    if len > 0 {
        match stream.next().await {
            Some(Ok(first)) => {
                stream = futures::stream::once(async move { Ok(first) })
                    .chain(stream)
                    .boxed()
            }
            Some(Err(e)) => return Err(blob_error(e)),
            None => stream = futures::stream::empty().boxed(),
        }
    }
    let body = StreamingBlob::new(ObjectBody::new(stream, len).with_lease(lease));
    let sums =
        ChecksumFields::from(sel.checksums(&obj, checksum_mode(input.checksum_mode.as_ref())));
    tracing::debug!(bucket = %input.bucket, key = %input.key, range = ?sel.range, "get object");
    let mut out = object_output!(GetObjectOutput, &obj, &sel, sums, {
        body: Some(body),
        tag_count: super::tagging::tag_count(&obj),
    });
    // A version asked for by id is named back (`null` for a record from
    // before versioning, which carries no id).
    out.version_id = out.version_id.or(input.version_id);
    Ok(S3Response::new(out))
}

pub(super) async fn head_object(
    gw: &Gateway,
    req: S3Request<HeadObjectInput>,
) -> S3Result<S3Response<HeadObjectOutput>> {
    // Only a partNumber HEAD needs the part list (the part's range, count
    // and checksums); any other reads the record's head alone.
    let obj = super::acl::readable_object(
        gw,
        &req.extensions,
        &req.input.bucket,
        &req.input.key,
        req.input.version_id.as_deref(),
        req.input.part_number.is_some(),
    )
    .await?;
    let input = req.input;
    let conditions = Conditions {
        if_match: input.if_match.as_ref(),
        if_none_match: input.if_none_match.as_ref(),
        if_modified_since: input.if_modified_since.as_ref(),
        if_unmodified_since: input.if_unmodified_since.as_ref(),
    };
    precondition_error(conditions.evaluate(&obj.etag, obj.last_modified_ms), &obj)?;
    let sel = select(&obj, input.part_number, input.range.as_ref())?;
    let sums =
        ChecksumFields::from(sel.checksums(&obj, checksum_mode(input.checksum_mode.as_ref())));
    let mut out = object_output!(HeadObjectOutput, &obj, &sel, sums, {});
    out.version_id = out.version_id.or(input.version_id);
    Ok(S3Response::new(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(sizes: &[u64], multipart: bool) -> pb::ObjectRecord {
        pb::ObjectRecord {
            size: sizes.iter().sum(),
            etag: "abc".into(),
            multipart,
            parts: sizes
                .iter()
                .enumerate()
                .map(|(i, s)| pb::PartRecord {
                    part_number: i as u32 + 1,
                    size: *s,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn range(header: &str) -> s3s::dto::Range {
        s3s::dto::Range::parse(header).expect("range header")
    }

    #[test]
    fn range_headers_resolve_like_s3() {
        let obj = object(&[1000], false);
        let sel = select(&obj, None, Some(&range("bytes=0-99"))).unwrap();
        assert_eq!(
            (sel.range.clone(), sel.content_range(1000).as_deref()),
            (0..100, Some("bytes 0-99/1000"))
        );
        // Open-ended and past-the-end ranges are clamped.
        assert_eq!(
            select(&obj, None, Some(&range("bytes=900-")))
                .unwrap()
                .range,
            900..1000
        );
        assert_eq!(
            select(&obj, None, Some(&range("bytes=990-5000")))
                .unwrap()
                .range,
            990..1000
        );
        // Suffix ranges: the last n bytes, or the whole object when n exceeds it.
        let sel = select(&obj, None, Some(&range("bytes=-10"))).unwrap();
        assert_eq!(
            (sel.range.clone(), sel.content_range(1000).as_deref()),
            (990..1000, Some("bytes 990-999/1000"))
        );
        assert_eq!(
            select(&obj, None, Some(&range("bytes=-5000")))
                .unwrap()
                .range,
            0..1000
        );
        // Unsatisfiable: 416 InvalidRange.
        for bad in ["bytes=1000-", "bytes=1000-2000", "bytes=-0"] {
            let e = select(&obj, None, Some(&range(bad))).unwrap_err();
            assert_eq!(e.code(), &S3ErrorCode::InvalidRange, "{bad}");
            assert_eq!(e.status_code(), Some(StatusCode::RANGE_NOT_SATISFIABLE));
        }
        let empty = object(&[], false);
        assert_eq!(
            select(&empty, None, Some(&range("bytes=0-")))
                .unwrap_err()
                .code(),
            &S3ErrorCode::InvalidRange
        );
        assert_eq!(select(&empty, None, None).unwrap().range, 0..0);
        // Malformed headers do not parse.
        assert!(s3s::dto::Range::parse("bytes=5-1").is_err());
        assert!(s3s::dto::Range::parse("items=0-1").is_err());
    }

    #[test]
    fn part_numbers_select_parts() {
        let obj = object(&[5, 7, 3], true);
        let sel = select(&obj, Some(2), None).unwrap();
        assert_eq!(sel.range, 5..12);
        assert_eq!(sel.parts_count, Some(3));
        assert_eq!(sel.content_range(15).as_deref(), Some("bytes 5-11/15"));
        assert_eq!(
            select(&obj, Some(4), None).unwrap_err().status_code(),
            Some(StatusCode::RANGE_NOT_SATISFIABLE)
        );
        assert_eq!(
            select(&obj, Some(0), None).unwrap_err().code(),
            &S3ErrorCode::InvalidArgument
        );
        assert_eq!(
            select(&obj, Some(1), Some(&range("bytes=0-1")))
                .unwrap_err()
                .code(),
            &S3ErrorCode::InvalidRequest
        );
        // A single-PUT object is part 1 as a whole.
        let single = object(&[10], false);
        let sel = select(&single, Some(1), None).unwrap();
        assert_eq!((sel.range.clone(), sel.parts_count), (0..10, None));
        let err = select(&single, Some(2), None).unwrap_err();
        assert_eq!(err.code(), &S3ErrorCode::InvalidPart);
        assert_eq!(err.status_code(), Some(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn segments_cover_ranges_across_parts() {
        let sizes = [5u64, 7, 3];
        assert_eq!(
            segments(sizes, 0..15),
            vec![(0, 0..5), (1, 0..7), (2, 0..3)]
        );
        assert_eq!(segments(sizes, 4..6), vec![(0, 4..5), (1, 0..1)]);
        assert_eq!(segments(sizes, 5..12), vec![(1, 0..7)]);
        assert_eq!(segments(sizes, 13..15), vec![(2, 1..3)]);
        assert_eq!(segments(sizes, 0..0), vec![]);
        assert_eq!(segments([0u64, 4], 0..4), vec![(1, 0..4)]);
    }

    fn ts(ms: i64) -> Timestamp {
        timestamp(ms)
    }

    #[test]
    fn conditionals_follow_s3_precedence() {
        let lm = 1_700_000_000_500; // .5 s past a whole second
        let same = ETagCondition::ETag(ETag::Strong("abc".into()));
        let other = ETagCondition::ETag(ETag::Strong("xyz".into()));
        let (before, at, after) = (ts(lm - 10_000), ts(lm - 500), ts(lm + 10_000));
        let eval = |c: Conditions<'_>| c.evaluate("abc", lm);

        assert_eq!(eval(Conditions::default()), Precondition::Pass);
        assert_eq!(
            eval(Conditions {
                if_match: Some(&same),
                ..Default::default()
            }),
            Precondition::Pass
        );
        assert_eq!(
            eval(Conditions {
                if_match: Some(&other),
                ..Default::default()
            }),
            Precondition::Failed
        );
        assert_eq!(
            eval(Conditions {
                if_match: Some(&ETagCondition::Any),
                ..Default::default()
            }),
            Precondition::Pass
        );
        assert_eq!(
            eval(Conditions {
                if_none_match: Some(&same),
                ..Default::default()
            }),
            Precondition::NotModified
        );
        assert_eq!(
            eval(Conditions {
                if_none_match: Some(&other),
                ..Default::default()
            }),
            Precondition::Pass
        );
        // Second resolution: modified at the same second is "not modified since".
        assert_eq!(
            eval(Conditions {
                if_modified_since: Some(&at),
                ..Default::default()
            }),
            Precondition::NotModified
        );
        assert_eq!(
            eval(Conditions {
                if_modified_since: Some(&before),
                ..Default::default()
            }),
            Precondition::Pass
        );
        assert_eq!(
            eval(Conditions {
                if_unmodified_since: Some(&before),
                ..Default::default()
            }),
            Precondition::Failed
        );
        assert_eq!(
            eval(Conditions {
                if_unmodified_since: Some(&after),
                ..Default::default()
            }),
            Precondition::Pass
        );
        // If-Match true wins over a failing If-Unmodified-Since.
        assert_eq!(
            eval(Conditions {
                if_match: Some(&same),
                if_unmodified_since: Some(&before),
                ..Default::default()
            }),
            Precondition::Pass
        );
        // If-None-Match false wins over If-Modified-Since (which is then ignored).
        assert_eq!(
            eval(Conditions {
                if_none_match: Some(&other),
                if_modified_since: Some(&after),
                ..Default::default()
            }),
            Precondition::Pass
        );
        // 412 is checked before 304.
        assert_eq!(
            eval(Conditions {
                if_match: Some(&other),
                if_none_match: Some(&same),
                ..Default::default()
            }),
            Precondition::Failed
        );
    }

    #[test]
    fn not_modified_carries_validators() {
        let obj = pb::ObjectRecord {
            etag: "abc".into(),
            last_modified_ms: 784_111_777_000,
            ..Default::default()
        };
        let e = precondition_error(Precondition::NotModified, &obj).unwrap_err();
        assert_eq!(e.status_code(), Some(StatusCode::NOT_MODIFIED));
        let h = e.headers().expect("headers");
        assert_eq!(h.get("etag").unwrap(), "\"abc\"");
        assert_eq!(
            h.get("last-modified").unwrap(),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
    }

    #[tokio::test]
    async fn object_body_refuses_short_and_long_streams() {
        let ok = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Ok(Bytes::from_static(b"de")),
        ])
        .boxed();
        let mut body = ObjectBody::new(ok, 5);
        assert_eq!(body.remaining_length().exact(), Some(5));
        let mut got = Vec::new();
        while let Some(c) = body.next().await {
            got.extend_from_slice(&c.expect("chunk"));
        }
        assert_eq!(got, b"abcde");

        let short = futures::stream::iter(vec![Ok(Bytes::from_static(b"abc"))]).boxed();
        let mut body = ObjectBody::new(short, 5);
        assert!(body.next().await.unwrap().is_ok());
        assert!(body.next().await.unwrap().is_err());
        assert!(body.next().await.is_none());

        let long = futures::stream::iter(vec![Ok(Bytes::from_static(b"abcdef"))]).boxed();
        let mut body = ObjectBody::new(long, 5);
        assert!(body.next().await.unwrap().is_err());
    }
}
