//! Shard blocks framed by hand, without copying them: the length-prefixed
//! gRPC messages that carry a [`ShardBlock`] (`PutShardRequest.block`, field
//! 2 of its `msg` oneof; `GetShardResponse.block`, field 1), built as the
//! bytes before the block's data and the bytes after it. Together with the
//! data in between they are exactly what prost and tonic would send, so
//! either side may be framed by hand and the other decode with tonic.
//!
//! Message prefix: <https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md>
//! (1 byte compressed flag, 4 bytes big-endian length); field encoding:
//! <https://protobuf.dev/programming-guides/encoding/>.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use prost::encoding::{self, WireType};

use crate::datanode::ShardBlock;

/// Path of the `PutShard` method (`proto/datanode.proto`), for bodies framed by hand.
pub const PUT_SHARD_PATH: &str = "/sluice.datanode.Datanode/PutShard";
/// Path of the `GetShard` method (`proto/datanode.proto`), answered by hand.
pub const GET_SHARD_PATH: &str = "/sluice.datanode.Datanode/GetShard";

/// Field of `ShardBlock` in `PutShardRequest` (its `msg` oneof).
pub const PUT_SHARD_REQUEST_BLOCK_FIELD: u32 = 2;
/// Field of `ShardBlock` in `GetShardResponse`.
pub const GET_SHARD_RESPONSE_BLOCK_FIELD: u32 = 1;

/// Appends the 5-byte gRPC message prefix: not compressed, big-endian
/// length.
///
/// # Panics
/// If `message_len` does not fit in 32 bits (no Sluice message is near).
pub fn grpc_prefix(buf: &mut BytesMut, message_len: usize) {
    buf.put_u8(0);
    buf.put_u32(u32::try_from(message_len).expect("message fits a gRPC frame"));
}

/// A whole length-prefixed gRPC message (for the small ones).
pub fn grpc_message(msg: &impl Message) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    grpc_prefix(&mut buf, len);
    msg.encode(&mut buf).expect("buffer has room");
    buf.freeze()
}

/// The length-prefixed gRPC message of a message whose only field is
/// `field`, a `ShardBlock { data, crc32c }`, as (bytes before `data`,
/// bytes after `data`). For an empty `data` (which proto3 leaves out) the
/// whole message is the first part and the second is empty.
pub fn block_message(field: u32, data: &Bytes, crc32c: u32) -> (Bytes, Bytes) {
    let tail = ShardBlock {
        data: Bytes::new(),
        crc32c,
    }
    .encode_to_vec();
    let data_field_len = if data.is_empty() {
        0
    } else {
        encoding::key_len(1) + encoding::encoded_len_varint(data.len() as u64) + data.len()
    };
    let block_len = data_field_len + tail.len();
    let message_len =
        encoding::key_len(field) + encoding::encoded_len_varint(block_len as u64) + block_len;
    let mut head = BytesMut::with_capacity(5 + 4 * 10);
    grpc_prefix(&mut head, message_len);
    encoding::encode_key(field, WireType::LengthDelimited, &mut head);
    encoding::encode_varint(block_len as u64, &mut head);
    if data.is_empty() {
        head.extend_from_slice(&tail);
        return (head.freeze(), Bytes::new());
    }
    encoding::encode_key(1, WireType::LengthDelimited, &mut head);
    encoding::encode_varint(data.len() as u64, &mut head);
    (head.freeze(), Bytes::from(tail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datanode::put_shard_request::Msg;
    use crate::datanode::{GetShardResponse, PutShardRequest};

    fn framed(field: u32, data: &Bytes, crc: u32) -> Vec<u8> {
        let (head, tail) = block_message(field, data, crc);
        [&head[..], &data[..], &tail[..]].concat()
    }

    #[test]
    fn framed_blocks_are_what_prost_encodes() {
        for len in [0usize, 1, 127, 128, 16_383, 16_384, 262_144, 1 << 20] {
            let data = Bytes::from((0..len).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>());
            for crc in [0u32, 1, 0xdead_beef] {
                let block = ShardBlock {
                    data: data.clone(),
                    crc32c: crc,
                };
                let get = GetShardResponse {
                    block: Some(block.clone()),
                };
                assert_eq!(
                    framed(GET_SHARD_RESPONSE_BLOCK_FIELD, &data, crc),
                    grpc_message(&get).to_vec(),
                    "GetShardResponse, {len} bytes, crc {crc}"
                );
                let put = PutShardRequest {
                    msg: Some(Msg::Block(block)),
                };
                assert_eq!(
                    framed(PUT_SHARD_REQUEST_BLOCK_FIELD, &data, crc),
                    grpc_message(&put).to_vec(),
                    "PutShardRequest, {len} bytes, crc {crc}"
                );
            }
        }
    }

    #[test]
    fn the_prefix_names_the_message_length() {
        let data = Bytes::from_static(b"abc");
        let (head, tail) = block_message(GET_SHARD_RESPONSE_BLOCK_FIELD, &data, 9);
        let total = head.len() + data.len() + tail.len();
        assert_eq!(head[0], 0, "not compressed");
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        assert_eq!(len, total - 5);
    }
}
