//! GetObjectAttributes: the attributes `x-amz-object-attributes` names
//! (`ETag`, `Checksum`, `ObjectParts`, `StorageClass`, `ObjectSize`), from the
//! object's record alone; no shard is read.
//!
//! Follows the S3 API reference page "GetObjectAttributes":
//! * the header is a comma-separated list; an unknown name is
//!   400 `InvalidArgument`;
//! * `ETag` is returned quoted, as every ETag Sluice sends (s3s serializes
//!   the type so); S3 returns this one without quotes, and clients compare
//!   ETags with the quotes stripped;
//! * `Checksum` carries the whole-object checksum and its type; a
//!   `COMPOSITE` value is returned without the `-N` part count that GET and
//!   HEAD append (the count is `ObjectParts.TotalPartsCount`);
//! * `ObjectParts` is returned for multipart objects only:
//!   `TotalPartsCount`, and a page of `Part`s (`x-amz-max-parts`, default
//!   and cap 1000; `x-amz-part-number-marker`: parts after that number).
//!   As for S3's general-purpose buckets, the `Part` entries are listed only
//!   when the object carries an additional checksum.
//! * `StorageClass` is always `STANDARD` (Sluice has one class).
//!
//! `Last-Modified` is always sent as a header. Versioning is not built: a
//! `versionId` other than `null` is 501 `NotImplemented`, as for a copy
//! source.

use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result};
use sluice_proto::meta as pb;

use super::error::{invalid_argument, version_header};
use super::list::page_size;
use super::multipart::part_number_marker;
use super::put::ChecksumFields;
use super::{Gateway, etag, timestamp};

/// The attributes a request asked for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub etag: bool,
    pub checksum: bool,
    pub object_parts: bool,
    pub storage_class: bool,
    pub object_size: bool,
}

impl Wanted {
    /// Parses the `x-amz-object-attributes` values (each may itself be a
    /// comma-separated list, as the SDKs send one header). Names are
    /// case-sensitive, as S3 compares them.
    ///
    /// Errors: `InvalidArgument` for an unknown or empty name.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> S3Result<Wanted> {
        let mut w = Wanted::default();
        for value in values {
            for name in value.split(',').map(str::trim) {
                match name {
                    ObjectAttributes::ETAG => w.etag = true,
                    ObjectAttributes::CHECKSUM => w.checksum = true,
                    ObjectAttributes::OBJECT_PARTS => w.object_parts = true,
                    ObjectAttributes::STORAGE_CLASS => w.storage_class = true,
                    ObjectAttributes::OBJECT_SIZE => w.object_size = true,
                    _ => return Err(invalid_argument("Invalid attribute name specified.")),
                }
            }
        }
        Ok(w)
    }
}

/// The whole-object checksum as GetObjectAttributes returns it: the stored
/// value, without the `-N` suffix of a composite checksum.
fn attribute_checksum(obj: &pb::ObjectRecord) -> Option<Checksum> {
    let f = ChecksumFields::from(obj.checksums.as_ref());
    f.checksum_type.as_ref()?;
    let bare = |v: Option<String>| v.map(|v| v.split('-').next().unwrap_or_default().to_string());
    Some(Checksum {
        checksum_crc32: bare(f.crc32),
        checksum_crc32c: bare(f.crc32c),
        checksum_crc64nvme: bare(f.crc64nvme),
        checksum_sha1: bare(f.sha1),
        checksum_sha256: bare(f.sha256),
        checksum_type: f.checksum_type,
    })
}

/// `ObjectParts` of a multipart object: parts after `marker`, at most
/// `max_parts` of them. `None` for a single-part object.
pub fn object_parts(
    obj: &pb::ObjectRecord,
    marker: u32,
    max_parts: u32,
) -> Option<GetObjectAttributesParts> {
    if !obj.multipart {
        return None;
    }
    let after: Vec<&pb::PartRecord> = obj
        .parts
        .iter()
        .filter(|p| p.part_number > marker)
        .collect();
    let page = &after[..after.len().min(max_parts as usize)];
    let is_truncated = page.len() < after.len();
    let with_checksums = obj
        .checksums
        .as_ref()
        .is_some_and(|c| super::checksum::present(c).next().is_some());
    let parts: Vec<ObjectPart> = page
        .iter()
        .map(|p| {
            let sums = ChecksumFields::from(p.checksums.as_ref());
            ObjectPart {
                part_number: Some(p.part_number as i32),
                size: Some(i64::try_from(p.size).unwrap_or(i64::MAX)),
                checksum_crc32: sums.crc32,
                checksum_crc32c: sums.crc32c,
                checksum_crc64nvme: sums.crc64nvme,
                checksum_sha1: sums.sha1,
                checksum_sha256: sums.sha256,
            }
        })
        .collect();
    Some(GetObjectAttributesParts {
        total_parts_count: Some(obj.parts.len() as i32),
        part_number_marker: Some(marker as i32),
        next_part_number_marker: page.last().map(|p| p.part_number as i32),
        max_parts: Some(max_parts as i32),
        is_truncated: Some(is_truncated),
        parts: (with_checksums && !parts.is_empty()).then_some(parts),
    })
}

pub(super) async fn get_object_attributes(
    gw: &Gateway,
    req: S3Request<GetObjectAttributesInput>,
) -> S3Result<S3Response<GetObjectAttributesOutput>> {
    let (input, extensions) = (req.input, req.extensions);
    let wanted = Wanted::parse(input.object_attributes.iter().map(|a| a.as_str()))?;
    let max_parts = page_size(input.max_parts, "x-amz-max-parts")?;
    let marker = part_number_marker(input.part_number_marker, "x-amz-part-number-marker")?;
    let obj = super::acl::readable_object(
        gw,
        &extensions,
        &input.bucket,
        &input.key,
        input.version_id.as_deref(),
        wanted.object_parts,
    )
    .await?;
    Ok(S3Response::new(GetObjectAttributesOutput {
        version_id: version_header(&obj),
        last_modified: Some(timestamp(obj.last_modified_ms)),
        e_tag: wanted.etag.then(|| etag(&obj.etag)),
        checksum: if wanted.checksum {
            attribute_checksum(&obj)
        } else {
            None
        },
        object_parts: if wanted.object_parts {
            object_parts(&obj, marker, max_parts)
        } else {
            None
        },
        storage_class: wanted
            .storage_class
            .then(|| StorageClass::from_static(StorageClass::STANDARD)),
        object_size: wanted
            .object_size
            .then(|| i64::try_from(obj.size).unwrap_or(i64::MAX)),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn multipart(parts: u32, crc: bool) -> pb::ObjectRecord {
        pb::ObjectRecord {
            size: u64::from(parts) * 10,
            etag: "abc-3".into(),
            multipart: true,
            checksums: crc.then(|| pb::Checksums {
                crc32: Some(format!("AAAAAA==-{parts}")),
                ..Default::default()
            }),
            parts: (1..=parts)
                .map(|n| pb::PartRecord {
                    part_number: n,
                    size: 10,
                    checksums: crc.then(|| pb::Checksums {
                        crc32: Some(format!("part{n}==")),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn attribute_names_are_a_comma_list_and_unknown_names_are_invalid() {
        let w = Wanted::parse(["ETag, ObjectSize", "StorageClass"]).unwrap();
        assert_eq!(
            w,
            Wanted {
                etag: true,
                object_size: true,
                storage_class: true,
                ..Wanted::default()
            }
        );
        for bad in ["etag", "ETag,", "Size"] {
            let e = Wanted::parse([bad]).unwrap_err();
            assert_eq!(e.code(), &s3s::S3ErrorCode::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn parts_page_after_the_marker_and_say_where_to_go_on() {
        let obj = multipart(5, true);
        let p = object_parts(&obj, 1, 2).unwrap();
        assert_eq!(p.total_parts_count, Some(5));
        assert_eq!(p.is_truncated, Some(true));
        assert_eq!(p.next_part_number_marker, Some(3));
        let numbers: Vec<i32> = p
            .parts
            .unwrap()
            .iter()
            .map(|x| x.part_number.unwrap())
            .collect();
        assert_eq!(numbers, vec![2, 3]);
        let last = object_parts(&obj, 3, 1000).unwrap();
        assert_eq!(last.is_truncated, Some(false));
        assert_eq!(
            last.parts.unwrap()[1].checksum_crc32.as_deref(),
            Some("part5==")
        );
    }

    #[test]
    fn parts_are_listed_only_with_checksums_and_only_for_multipart() {
        let p = object_parts(&multipart(2, false), 0, 1000).unwrap();
        assert_eq!((p.total_parts_count, p.parts), (Some(2), None));
        let single = pb::ObjectRecord {
            parts: vec![pb::PartRecord::default()],
            ..Default::default()
        };
        assert!(object_parts(&single, 0, 1000).is_none());
    }

    #[test]
    fn a_composite_checksum_loses_its_part_count() {
        let c = attribute_checksum(&multipart(3, true)).unwrap();
        assert_eq!(c.checksum_crc32.as_deref(), Some("AAAAAA=="));
        assert_eq!(c.checksum_type.unwrap().as_str(), ChecksumType::COMPOSITE);
        assert!(attribute_checksum(&multipart(3, false)).is_none());
    }
}
