//! Byte counts in every role's config, one way: a field is a
//! [`ByteSize`] (the `bytesize` crate's type, re-exported here for the
//! crates that do not depend on it) and reads as an integer or a bytesize
//! string in TOML (`65536`, `"64 KiB"`, `"1 GiB"`, `"1.5 MB"`; units per the
//! `bytesize` crate: SI `KB`/`MB`/… are powers of 1000, IEC `KiB`/`MiB`/…
//! powers of 1024). It is written back as an integer count of bytes
//! (`--print-config`): `bytesize`'s own `Serialize` writes a rounded
//! string ("1.2 MiB") to text formats, which would not read back as the
//! same count.
//!
//! Use `#[serde(with = "sluice_util::byte_size")]` on a `ByteSize` and
//! `"sluice_util::byte_size::optional"` on an `Option<ByteSize>` (absent or
//! `null` is `None`; add `#[serde(default)]`). A role that needs a narrower
//! range (a block size that must fit a `u32`, say) checks it in its
//! config's `validate`.

pub use bytesize::ByteSize;
use serde::{Deserialize, Deserializer, Serializer};

/// Writes a byte count as an integer.
pub fn serialize<S: Serializer>(value: &ByteSize, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(value.as_u64())
}

/// Reads a byte count from an integer or a bytesize string.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ByteSize, D::Error> {
    ByteSize::deserialize(deserializer)
}

/// For `Option<ByteSize>` fields.
pub mod optional {
    use bytesize::ByteSize;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `Some(n)` as an integer and `None` as none.
    pub fn serialize<S: Serializer>(
        value: &Option<ByteSize>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => serializer.serialize_some(&v.as_u64()),
            None => serializer.serialize_none(),
        }
    }

    /// Reads an optional byte count.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<ByteSize>, D::Error> {
        Option::<ByteSize>::deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::ByteSize;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Sizes {
        #[serde(with = "crate::byte_size")]
        big: ByteSize,
        #[serde(default, with = "crate::byte_size::optional")]
        maybe: Option<ByteSize>,
    }

    #[test]
    fn integers_and_bytesize_strings_read_alike() {
        let a: Sizes = toml::from_str("big = 65536\nmaybe = 1048576").unwrap();
        let b: Sizes = toml::from_str("big = \"64 KiB\"\nmaybe = \"1 MiB\"").unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a,
            Sizes {
                big: ByteSize(65536),
                maybe: Some(ByteSize(1 << 20))
            }
        );
        let si: Sizes = toml::from_str("big = \"1 GB\"").unwrap();
        assert_eq!((si.big, si.maybe), (ByteSize(1_000_000_000), None));
        // Written back as integers, exactly (not "1.2 MiB").
        let odd = Sizes {
            big: ByteSize(1_234_567),
            maybe: None,
        };
        assert_eq!(toml::to_string(&odd).unwrap(), "big = 1234567\n");
        assert_eq!(
            toml::to_string(&a).unwrap(),
            "big = 65536\nmaybe = 1048576\n"
        );
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(toml::from_str::<Sizes>("big = \"lots\"").is_err());
        assert!(toml::from_str::<Sizes>("big = -1").is_err());
    }
}
