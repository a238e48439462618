//! Version ids as S3 clients see them (`x-amz-version-id`, `versionId`):
//! the text meta issues and the gateway checks before asking.

use sluice_proto::meta as pb;

/// Whether `v` is a version id Sluice issues: 16 lowercase hex digits
/// (ids are case-sensitive, as S3's are).
pub fn is_version_id(v: &str) -> bool {
    v.len() == 16
        && v.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// The version id S3 shows for `record`: its id, or "null" for the null
/// version.
pub fn shown_id(record: &pb::ObjectRecord) -> &str {
    if record.version_id.is_empty() {
        "null"
    } else {
        &record.version_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_ids_are_sixteen_lowercase_hex_digits() {
        assert!(is_version_id("00000000000000ff"));
        assert!(!is_version_id("00000000000000FF"));
        assert!(!is_version_id("ff"));
        assert!(!is_version_id("null"));
    }

    #[test]
    fn the_null_version_shows_as_null() {
        let mut record = pb::ObjectRecord::default();
        assert_eq!(shown_id(&record), "null");
        record.version_id = "00000000000000ff".into();
        assert_eq!(shown_id(&record), "00000000000000ff");
    }
}
