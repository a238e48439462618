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

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use prost::encoding::{self, DecodeContext, WireType};

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

/// A [`ShardBlock`] decoded without copying its data: `data` is the
/// pieces of the received body that held it, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockChunks {
    pub data: Vec<Bytes>,
    pub crc32c: u32,
}

impl BlockChunks {
    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.data.iter().map(Bytes::len).sum()
    }

    /// Whether the block holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.data.iter().all(Bytes::is_empty)
    }

    /// CRC32C of the data (as [`crate::shard::block_crc32c`] of it whole).
    pub fn computed_crc32c(&self) -> u32 {
        let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        for piece in &self.data {
            digest.update(piece);
        }
        digest.finalize() as u32
    }
}

/// Why a framed message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("compressed gRPC message (flag {0}); none is sent")]
    Compressed(u8),
    #[error("gRPC message of {len} bytes is over the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    #[error("malformed message: {0}")]
    Protobuf(#[from] prost::DecodeError),
}

/// Decodes the length-prefixed gRPC messages of a body whose only field of
/// interest is `field`, a `ShardBlock` (`GetShardResponse.block`), as the
/// body's data frames arrive, handing out the block data as slices of
/// those frames instead of copying it into one buffer (tonic's decoder
/// copies every frame into its own; prost can only hand out a field of
/// type `Bytes` whole, which for data spread over frames is a copy). Keys,
/// varints and unknown fields are read by prost's own functions. Holds at
/// most one message plus the start of the next: what the HTTP/2 stream
/// window lets in. A repeated `field` or `data` keeps the last one.
pub struct BlockDecoder {
    field: u32,
    max_message: usize,
    pending: Pieces,
}

impl BlockDecoder {
    /// A decoder for messages of at most `max_message` bytes.
    pub fn new(field: u32, max_message: usize) -> Self {
        BlockDecoder {
            field,
            max_message,
            // Room for a 256 KiB block's ~17 frames at HTTP/2's default
            // 16 KiB (5 from the gateway's datanodes) and the start of the
            // next message: the deque is not grown 4 -> 8 -> 16 -> 32 on
            // every stream.
            pending: Pieces {
                pieces: VecDeque::with_capacity(32),
                len: 0,
            },
        }
    }

    /// Adds a received data frame.
    pub fn push(&mut self, data: Bytes) {
        self.pending.push(data);
    }

    /// Bytes received and not yet decoded (a partial message at the end of
    /// a body means the stream ended early).
    pub fn buffered(&self) -> usize {
        self.pending.remaining()
    }

    /// The next whole message's block, `None` until all of it has arrived.
    /// A message without the field decodes as an empty block.
    pub fn next_block(&mut self) -> Result<Option<BlockChunks>, FramingError> {
        let Some(prefix) = self.pending.peek::<5>() else {
            return Ok(None);
        };
        if prefix[0] != 0 {
            return Err(FramingError::Compressed(prefix[0]));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.max_message {
            return Err(FramingError::TooLarge {
                len,
                max: self.max_message,
            });
        }
        if self.pending.remaining() < 5 + len {
            return Ok(None);
        }
        self.pending.advance(5);
        let mut message = self.pending.split_to(len)?;
        let mut block = None;
        while message.has_remaining() {
            let (tag, wire) = encoding::decode_key(&mut message)?;
            if tag == self.field && wire == WireType::LengthDelimited {
                let n = message.length()?;
                block = Some(message.split_to(n)?);
            } else {
                encoding::skip_field(wire, tag, &mut message, DecodeContext::default())?;
            }
        }
        let mut out = BlockChunks::default();
        let Some(mut block) = block else {
            return Ok(Some(out));
        };
        while block.has_remaining() {
            match encoding::decode_key(&mut block)? {
                (1, WireType::LengthDelimited) => {
                    let n = block.length()?;
                    out.data = block.split_to(n)?.pieces.into();
                }
                // uint32 from a varint, truncated as prost does.
                (2, WireType::Varint) => out.crc32c = encoding::decode_varint(&mut block)? as u32,
                (tag, wire) => {
                    encoding::skip_field(wire, tag, &mut block, DecodeContext::default())?;
                }
            }
        }
        Ok(Some(out))
    }
}

/// Bytes held as the (non-empty) pieces they arrived in; a [`Buf`] for
/// prost's decoding functions.
#[derive(Default)]
struct Pieces {
    pieces: VecDeque<Bytes>,
    len: usize,
}

impl Pieces {
    fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.len += piece.len();
            self.pieces.push_back(piece);
        }
    }

    /// The first `N` bytes, if there are that many.
    fn peek<const N: usize>(&self) -> Option<[u8; N]> {
        if self.len < N {
            return None;
        }
        let mut out = [0u8; N];
        let mut at = 0;
        for piece in &self.pieces {
            let n = (N - at).min(piece.len());
            out[at..at + n].copy_from_slice(&piece[..n]);
            at += n;
            if at == N {
                break;
            }
        }
        Some(out)
    }

    /// Moves the first `n` bytes out, splitting a piece if needed.
    fn split_to(&mut self, mut n: usize) -> Result<Pieces, FramingError> {
        if n > self.len {
            return Err(FramingError::Malformed(
                "length past the end of the message",
            ));
        }
        // Sized up front: a block arrives in up to ~17 frames, and
        // growing the deque piece by piece reallocated it four times per
        // split (three splits per block).
        let mut spanned = 0;
        let mut covered = 0;
        for piece in &self.pieces {
            if covered >= n {
                break;
            }
            covered += piece.len();
            spanned += 1;
        }
        let mut out = Pieces {
            pieces: VecDeque::with_capacity(spanned),
            len: 0,
        };
        while n > 0 {
            let front = self.pieces.front_mut().expect("len counts the pieces");
            let piece = if front.len() <= n {
                self.pieces.pop_front().expect("front exists")
            } else {
                front.split_to(n)
            };
            n -= piece.len();
            self.len -= piece.len();
            out.push(piece);
        }
        Ok(out)
    }

    /// A length prefix that stays inside the remaining bytes.
    fn length(&mut self) -> Result<usize, FramingError> {
        let n = encoding::decode_varint(self)?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.len)
            .ok_or(FramingError::Malformed(
                "length past the end of the message",
            ))
    }
}

impl Buf for Pieces {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.pieces.front().map_or(&[], |piece| &piece[..])
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.len, "advance past the end");
        self.len -= n;
        while n > 0 {
            let front = self.pieces.front_mut().expect("len counts the pieces");
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.pieces.pop_front();
        }
    }
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
            // Test data, at most the 1 MiB of the longest `len` above.
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

    /// `bytes` cut into pieces of `cut` bytes, as data frames.
    fn pieces(bytes: &[u8], cut: usize) -> Vec<Bytes> {
        bytes.chunks(cut).map(Bytes::copy_from_slice).collect()
    }

    #[test]
    fn blocks_decode_from_any_split_of_the_frames_without_copies() {
        let blocks: Vec<(Bytes, u32)> = [0usize, 1, 300, 16_384, 70_000]
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let data: Vec<u8> = (0..len).map(|j| (j * 13 + i) as u8).collect();
                (Bytes::from(data), 0x1234_5678 + i as u32)
            })
            .collect();
        let body_of = |blocks: &[(Bytes, u32)]| -> Vec<u8> {
            blocks
                .iter()
                .flat_map(|(data, crc)| {
                    grpc_message(&GetShardResponse {
                        block: Some(ShardBlock {
                            data: data.clone(),
                            crc32c: *crc,
                        }),
                    })
                    .to_vec()
                })
                .collect()
        };
        for cut in [1, 2, 5, 7, 16_384, usize::MAX] {
            // Frames of a few bytes: the small blocks only (quadratic
            // checks below).
            let blocks = if cut < 100 { &blocks[..3] } else { &blocks[..] };
            let body = body_of(blocks);
            let mut decoder = BlockDecoder::new(GET_SHARD_RESPONSE_BLOCK_FIELD, 1 << 20);
            let mut got = Vec::new();
            let frames = pieces(&body, cut);
            let within_a_frame = |piece: &Bytes| {
                let p = piece.as_ptr() as usize;
                frames.iter().any(|f| {
                    let start = f.as_ptr() as usize;
                    p >= start && p + piece.len() <= start + f.len()
                })
            };
            for frame in &frames {
                decoder.push(frame.clone());
                while let Some(block) = decoder.next_block().unwrap() {
                    // Not copied: every piece of data is a slice of a frame.
                    assert!(block.data.iter().all(within_a_frame), "cut {cut}");
                    got.push(block);
                }
            }
            assert_eq!(decoder.buffered(), 0, "cut {cut}");
            assert_eq!(got.len(), blocks.len(), "cut {cut}");
            for (block, (data, crc)) in got.iter().zip(blocks) {
                assert_eq!(block.data.concat(), data.to_vec(), "cut {cut}");
                assert_eq!(block.len(), data.len());
                assert_eq!(block.crc32c, *crc);
                assert_eq!(block.computed_crc32c(), crate::shard::block_crc32c(data));
            }
        }
    }

    #[test]
    fn unknown_fields_are_skipped_and_bad_messages_refused() {
        // Field 9 (varint, 64-bit, 32-bit, bytes) around the block, and an
        // unknown field inside it.
        let mut inner = BytesMut::new();
        encoding::encode_key(7, WireType::ThirtyTwoBit, &mut inner);
        inner.put_u32_le(1);
        encoding::bytes::encode(1, &Bytes::from_static(b"data"), &mut inner);
        encoding::uint32::encode(2, &77, &mut inner);
        let mut message = BytesMut::new();
        encoding::uint64::encode(9, &5, &mut message);
        encoding::encode_key(10, WireType::SixtyFourBit, &mut message);
        message.put_u64_le(1);
        encoding::bytes::encode(1, &inner.freeze(), &mut message);
        encoding::bytes::encode(11, &Bytes::from_static(b"xyz"), &mut message);
        let mut framed = BytesMut::new();
        grpc_prefix(&mut framed, message.len());
        framed.extend_from_slice(&message);
        let mut decoder = BlockDecoder::new(GET_SHARD_RESPONSE_BLOCK_FIELD, 1 << 20);
        decoder.push(framed.freeze());
        let block = decoder.next_block().unwrap().unwrap();
        assert_eq!(block.data.concat(), b"data");
        assert_eq!(block.crc32c, 77);

        let refused = |body: &[u8], max: usize| {
            let mut d = BlockDecoder::new(GET_SHARD_RESPONSE_BLOCK_FIELD, max);
            d.push(Bytes::copy_from_slice(body));
            d.next_block().unwrap_err()
        };
        assert_eq!(refused(&[1, 0, 0, 0, 0], 10), FramingError::Compressed(1));
        assert_eq!(
            refused(&[0, 0, 0, 0, 11], 10),
            FramingError::TooLarge { len: 11, max: 10 }
        );
        // The block field claims 5 bytes, the message holds 1.
        assert!(matches!(
            refused(&[0, 0, 0, 0, 3, 0x0a, 5, 0], 10),
            FramingError::Malformed(_)
        ));
        // A partial message is not an error until the body ends.
        let mut d = BlockDecoder::new(GET_SHARD_RESPONSE_BLOCK_FIELD, 10);
        d.push(Bytes::from_static(&[0, 0, 0, 0, 3, 0x0a]));
        assert_eq!(d.next_block(), Ok(None));
        assert_eq!(d.buffered(), 6);
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
