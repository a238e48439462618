//! Byte counts in every role's config, one way: a field is a plain
//! integer count of bytes in code and reads as an integer or a bytesize
//! string in TOML (`65536`, `"64 KiB"`, `"1 GiB"`, `"1.5 MB"`; units per the
//! `bytesize` crate: SI `KB`/`MB`/… are powers of 1000, IEC `KiB`/`MiB`/…
//! powers of 1024). It is written back as an integer (`--print-config`).
//!
//! Use `#[serde(with = "sluice_auth::byte_size")]` on a `u64`,
//! `"sluice_auth::byte_size::as_u32"` on a `u32` (a count past `u32::MAX`
//! is an error naming it) and `"sluice_auth::byte_size::optional"` on an
//! `Option<u64>` (absent or `null` is `None`; add `#[serde(default)]`).

use serde::{Deserialize, Deserializer, Serializer};

/// Writes a `u64` byte count as an integer.
pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(*value)
}

/// Reads a `u64` byte count from an integer or a bytesize string.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    Ok(bytesize::ByteSize::deserialize(deserializer)?.as_u64())
}

/// For `u32` fields.
pub mod as_u32 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    /// Writes a `u32` byte count as an integer.
    pub fn serialize<S: Serializer>(value: &u32, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(*value)
    }

    /// Reads a byte count that must fit in 32 bits.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
        let size = bytesize::ByteSize::deserialize(deserializer)?;
        u32::try_from(size.as_u64()).map_err(|_| {
            D::Error::custom(format!("{} bytes does not fit in 32 bits", size.as_u64()))
        })
    }
}

/// For `Option<u64>` fields.
pub mod optional {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `Some(n)` as an integer and `None` as none.
    pub fn serialize<S: Serializer>(value: &Option<u64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => serializer.serialize_some(v),
            None => serializer.serialize_none(),
        }
    }

    /// Reads an optional byte count.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u64>, D::Error> {
        Ok(Option::<bytesize::ByteSize>::deserialize(deserializer)?.map(|s| s.as_u64()))
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Sizes {
        #[serde(with = "crate::byte_size")]
        big: u64,
        #[serde(with = "crate::byte_size::as_u32")]
        small: u32,
        #[serde(default, with = "crate::byte_size::optional")]
        maybe: Option<u64>,
    }

    #[test]
    fn integers_and_bytesize_strings_read_alike() {
        let a: Sizes = toml::from_str("big = 65536\nsmall = 4096\nmaybe = 1048576").unwrap();
        let b: Sizes =
            toml::from_str("big = \"64 KiB\"\nsmall = \"4 KiB\"\nmaybe = \"1 MiB\"").unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a,
            Sizes {
                big: 65536,
                small: 4096,
                maybe: Some(1 << 20)
            }
        );
        let si: Sizes = toml::from_str("big = \"1 GB\"\nsmall = \"1 KB\"").unwrap();
        assert_eq!((si.big, si.small, si.maybe), (1_000_000_000, 1000, None));
        // Written back as integers.
        assert_eq!(
            toml::to_string(&a).unwrap(),
            "big = 65536\nsmall = 4096\nmaybe = 1048576\n"
        );
    }

    #[test]
    fn bad_sizes_are_refused() {
        let too_big = toml::from_str::<Sizes>("big = 1\nsmall = \"5 GiB\"").unwrap_err();
        assert!(
            too_big.to_string().contains("does not fit in 32 bits"),
            "{too_big}"
        );
        assert!(toml::from_str::<Sizes>("big = \"lots\"\nsmall = 1").is_err());
        assert!(toml::from_str::<Sizes>("big = -1\nsmall = 1").is_err());
    }
}
