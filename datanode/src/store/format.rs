//! The shard file format, shared by both stores (the memory store reports
//! the same sizes).
//!
//! ```text
//! offset 0   magic "SLSH"            4 bytes
//!        4   format version (1)      u16 LE (`SHARD_FORMAT`)
//!        6   reserved (0)            u16 LE
//!        8   block_size              u32 LE
//!       12   CRC32C of bytes 0..12   u32 LE
//!       16   block 0 data, block 0 CRC32C (u32 LE), block 1 data, ...
//! ```
//! Block `i` of a shard starts at `HEADER_LEN + i * (block_size + 4)`; only
//! the last block may be shorter than `block_size`.
//!
//! A header whose checksum holds but whose format version is newer than
//! [`SHARD_FORMAT`] was written by a newer release: it is refused with
//! [`HeaderError::Format`] (naming both versions), not treated as corrupt.

use sluice_proto::format::{self, FormatError, SHARD_FORMAT};

use crate::block_crc32c;

/// Bytes before the first block.
pub const HEADER_LEN: u64 = 16;
/// Largest accepted `block_size`, in bytes (8 MiB; the wire contract's).
pub use sluice_proto::shard::MAX_BLOCK_SIZE;
/// Bytes of the checksum stored after each block.
pub(crate) const CRC_LEN: u64 = 4;

const MAGIC: &[u8; 4] = b"SLSH";

/// Why a shard header cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Damaged: bad magic, checksum or block size.
    Corrupt(&'static str),
    /// Intact, but of a format version this binary does not read.
    Format(FormatError),
}

/// Bytes a shard of `blocks` blocks holding `payload_bytes` takes in the
/// store format (header, data and one checksum per block).
pub fn stored_len(payload_bytes: u64, blocks: u64) -> u64 {
    HEADER_LEN + payload_bytes + CRC_LEN * blocks
}

pub(crate) fn encode_header(block_size: u32) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[0..4].copy_from_slice(MAGIC);
    let version = u16::try_from(SHARD_FORMAT).expect("the shard format fits the header's u16");
    h[4..6].copy_from_slice(&version.to_le_bytes());
    h[8..12].copy_from_slice(&block_size.to_le_bytes());
    let crc = block_crc32c(&h[0..12]);
    h[12..16].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Returns the block size, or why the header is bad.
pub(crate) fn decode_header(h: &[u8; HEADER_LEN as usize]) -> Result<u32, HeaderError> {
    if &h[0..4] != MAGIC {
        return Err(HeaderError::Corrupt("bad magic"));
    }
    if block_crc32c(&h[0..12]) != u32_le(&h[12..16]) {
        return Err(HeaderError::Corrupt("header checksum mismatch"));
    }
    let version = u32::from(u16::from_le_bytes([h[4], h[5]]));
    format::check("shard file", version, SHARD_FORMAT).map_err(HeaderError::Format)?;
    let block_size = u32_le(&h[8..12]);
    if block_size == 0 || block_size > MAX_BLOCK_SIZE {
        return Err(HeaderError::Corrupt("bad block size"));
    }
    Ok(block_size)
}

/// Where the blocks of a shard file lie, derived from its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub block_size: u32,
    pub blocks: u64,
    /// Stored length (data + checksum) of the last block.
    pub last_stored_len: u64,
}

impl Geometry {
    /// Validates a file of `file_len` bytes with the given block size.
    pub fn from_file_len(block_size: u32, file_len: u64) -> Result<Self, &'static str> {
        let body = file_len
            .checked_sub(HEADER_LEN)
            .ok_or("shorter than its header")?;
        let stride = u64::from(block_size) + CRC_LEN;
        let blocks = body.div_ceil(stride);
        let last_stored_len = body - blocks.saturating_sub(1) * stride;
        if blocks > 0 && last_stored_len <= CRC_LEN {
            return Err("truncated last block");
        }
        Ok(Geometry {
            block_size,
            blocks,
            last_stored_len,
        })
    }

    /// Offset and stored length (data + checksum) of block `i < blocks`.
    pub fn block_span(&self, i: u64) -> (u64, u64) {
        let stride = u64::from(self.block_size) + CRC_LEN;
        let len = if i + 1 == self.blocks {
            self.last_stored_len
        } else {
            stride
        };
        (HEADER_LEN + i * stride, len)
    }
}

/// Splits a stored block (data followed by its CRC32C) and verifies it.
/// Returns `None` on a checksum mismatch.
pub(crate) fn verify_stored_block(mut stored: Vec<u8>) -> Option<(Vec<u8>, u32)> {
    let data_len = stored.len().checked_sub(CRC_LEN as usize)?;
    let crc = u32_le(&stored[data_len..]);
    stored.truncate(data_len);
    (block_crc32c(&stored) == crc).then_some((stored, crc))
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_damage() {
        let h = encode_header(262_144);
        assert_eq!(decode_header(&h), Ok(262_144));
        for i in 0..HEADER_LEN as usize {
            let mut bad = h;
            bad[i] ^= 0x10;
            assert!(decode_header(&bad).is_err(), "flip in byte {i} undetected");
        }
    }

    /// A header with a valid checksum whose version is newer than this
    /// binary's (or 0) is refused as a format, naming both versions.
    #[test]
    fn a_header_of_a_newer_format_is_refused_by_version() {
        let with_version = |v: u16| {
            let mut h = encode_header(4096);
            h[4..6].copy_from_slice(&v.to_le_bytes());
            let crc = block_crc32c(&h[0..12]);
            h[12..16].copy_from_slice(&crc.to_le_bytes());
            h
        };
        let newer = (SHARD_FORMAT + 1) as u16;
        let Err(HeaderError::Format(e)) = decode_header(&with_version(newer)) else {
            panic!("a newer header was accepted or called corrupt")
        };
        assert_eq!(
            e.to_string(),
            format!(
                "shard file has format version {newer}; this binary understands up to {SHARD_FORMAT}: use a newer sluice release"
            )
        );
        assert!(matches!(
            decode_header(&with_version(0)),
            Err(HeaderError::Format(FormatError::Unversioned { .. }))
        ));
        assert_eq!(decode_header(&with_version(SHARD_FORMAT as u16)), Ok(4096));
    }

    #[test]
    fn geometry_places_blocks_at_fixed_strides() {
        // 3 full blocks of 10 and a last block of 3: 16 + 3*14 + 7.
        let g = Geometry::from_file_len(10, 16 + 3 * 14 + 7).unwrap();
        assert_eq!(g.blocks, 4);
        assert_eq!(g.block_span(0), (16, 14));
        assert_eq!(g.block_span(2), (16 + 28, 14));
        assert_eq!(g.block_span(3), (16 + 42, 7));
        let g = Geometry::from_file_len(10, 16 + 2 * 14).unwrap();
        assert_eq!((g.blocks, g.block_span(1)), (2, (30, 14)));
        assert_eq!(Geometry::from_file_len(10, 16).unwrap().blocks, 0);
        assert!(Geometry::from_file_len(10, 15).is_err());
        assert!(Geometry::from_file_len(10, 16 + 14 + 4).is_err());
        assert_eq!(stored_len(33, 4), 16 + 33 + 16);
    }

    #[test]
    fn stored_blocks_verify() {
        let mut stored = b"hello".to_vec();
        stored.extend_from_slice(&block_crc32c(b"hello").to_le_bytes());
        let (data, crc) = verify_stored_block(stored.clone()).unwrap();
        assert_eq!(
            (data.as_slice(), crc),
            (&b"hello"[..], block_crc32c(b"hello"))
        );
        stored[1] ^= 1;
        assert!(verify_stored_block(stored).is_none());
        assert!(verify_stored_block(vec![1, 2]).is_none());
    }
}
