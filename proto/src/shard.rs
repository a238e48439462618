//! The shard transfer contract between gateways and datanodes: how large a
//! block may be, the checksum every block carries, and the largest gRPC
//! message either side sends or accepts. Both roles read these from here,
//! so the limits cannot drift apart.

/// Largest shard block, in bytes (8 MiB): the largest `block_size` a
/// datanode stores in a shard file header and the largest `ShardBlock.data`
/// it accepts.
pub const MAX_BLOCK_SIZE: u32 = 8 * 1024 * 1024;

/// Largest gRPC message to or from a datanode, in bytes (16 MiB): one block
/// of at most [`MAX_BLOCK_SIZE`] plus framing, with room to spare.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Most shards one `VerifyShards` call may name.
pub const MAX_VERIFY_SHARDS: usize = 100;

/// Most payload bytes (the sum of `VerifyShard.payload_bytes`) one
/// `VerifyShards` call of more than one shard may ask a datanode to read
/// (256 MiB); a single larger shard may go alone.
pub const MAX_VERIFY_BYTES: u64 = 256 * 1024 * 1024;

/// CRC32C (Castagnoli, the iSCSI polynomial of RFC 3720) of `data`: the
/// checksum of every shard block (`ShardBlock.crc32c`), computed by the
/// gateway before sending and verified by the datanode on receipt and on
/// every read, and by the gateway again on every block it reads.
pub fn block_crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn block_crc32c_is_castagnoli() {
        // RFC 3720 B.4 check value and 32 bytes of zeros.
        assert_eq!(super::block_crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(super::block_crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(super::block_crc32c(b""), 0);
    }

    #[test]
    fn a_full_block_fits_one_message() {
        assert!(super::MAX_BLOCK_SIZE as usize + 64 <= super::MAX_MESSAGE_BYTES);
    }
}
