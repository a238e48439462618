//! Blob ids name the write epoch they were written under.
//!
//! A blob id is `e<epoch>.<32 hex digits>`: the decimal write epoch of the
//! gateway that wrote it (see `OpenEpoch` in `proto/meta.proto`), a dot and
//! a random 128-bit suffix. Ids without that shape (written before epochs
//! existed) belong to epoch 0, which is always closed.
//!
//! Blob ids are also file names on datanodes: only `[0-9a-z.]` appear, and
//! at most [`MAX_BLOB_ID_LEN`] bytes.

/// The epoch of blob ids written before write epochs existed: always closed.
pub const LEGACY_EPOCH: u64 = 0;

/// Longest blob id this module makes (`e` + 20 digits + `.` + 32 hex).
pub const MAX_BLOB_ID_LEN: usize = 54;

/// A fresh blob id of write epoch `epoch` with `random` as its suffix.
pub fn new_blob_id(epoch: u64, random: u128) -> String {
    format!("e{epoch}.{random:032x}")
}

/// The write epoch a blob id names; [`LEGACY_EPOCH`] for any other shape.
pub fn epoch_of(blob_id: &str) -> u64 {
    let Some(rest) = blob_id.strip_prefix('e') else {
        return LEGACY_EPOCH;
    };
    let Some((digits, suffix)) = rest.split_once('.') else {
        return LEGACY_EPOCH;
    };
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || suffix.is_empty()
        || !suffix.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return LEGACY_EPOCH;
    }
    digits.parse().unwrap_or(LEGACY_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let id = new_blob_id(42, 0xdead_beef);
        assert_eq!(id, "e42.000000000000000000000000deadbeef");
        assert_eq!(epoch_of(&id), 42);
        let max = new_blob_id(u64::MAX, u128::MAX);
        assert_eq!(max.len(), MAX_BLOB_ID_LEN);
        assert_eq!(epoch_of(&max), u64::MAX);
    }

    #[test]
    fn other_shapes_are_legacy() {
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
            assert_eq!(epoch_of(id), LEGACY_EPOCH, "{id:?}");
        }
    }
}
