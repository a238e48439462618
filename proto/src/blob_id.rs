//! Blob ids name the write epoch they were written under.
//!
//! A blob id is `e<epoch>.<32 hex digits>`: the decimal write epoch of the
//! gateway that wrote it (see `OpenEpoch` in `proto/meta.proto`), a dot and
//! a random 128-bit suffix. An id of any other shape names no epoch: it
//! does not parse ([`epoch_of`]), and meta refuses to commit it.
//!
//! Blob ids are also file names on datanodes: only `[0-9a-z.]` appear, and
//! at most [`MAX_BLOB_ID_LEN`] bytes.

/// Longest blob id this module makes (`e` + 20 digits + `.` + 32 hex).
pub const MAX_BLOB_ID_LEN: usize = 54;

/// A string that is not a blob id of the shape [`new_blob_id`] makes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("blob id {0:?} is not e<epoch>.<hex digits>")]
pub struct BadBlobId(pub String);

/// A fresh blob id of write epoch `epoch` with `random` as its suffix.
pub fn new_blob_id(epoch: u64, random: u128) -> String {
    format!("e{epoch}.{random:032x}")
}

/// The write epoch a blob id names.
///
/// Errors: [`BadBlobId`] when the id is not `e<decimal u64>.<hex digits>`.
pub fn epoch_of(blob_id: &str) -> Result<u64, BadBlobId> {
    let bad = || BadBlobId(blob_id.to_string());
    let rest = blob_id.strip_prefix('e').ok_or_else(bad)?;
    let (digits, suffix) = rest.split_once('.').ok_or_else(bad)?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || suffix.is_empty()
        || !suffix.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(bad());
    }
    digits.parse().map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let id = new_blob_id(42, 0xdead_beef);
        assert_eq!(id, "e42.000000000000000000000000deadbeef");
        assert_eq!(epoch_of(&id), Ok(42));
        let max = new_blob_id(u64::MAX, u128::MAX);
        assert_eq!(max.len(), MAX_BLOB_ID_LEN);
        assert_eq!(epoch_of(&max), Ok(u64::MAX));
    }

    #[test]
    fn other_shapes_do_not_parse() {
        for id in [
            "",
            "0123456789abcdef0123456789abcdef",
            "e.abc",
            "e12",
            "e12.",
            "ex.12",
            "e1x.ab",
            "e1.xyz",
            "e99999999999999999999999.ab",
        ] {
            assert_eq!(epoch_of(id), Err(BadBlobId(id.to_string())), "{id:?}");
        }
        assert_eq!(
            BadBlobId("0123".into()).to_string(),
            "blob id \"0123\" is not e<epoch>.<hex digits>"
        );
    }
}
