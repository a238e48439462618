//! Reed–Solomon coding of one stripe (`reed-solomon-erasure`, GF(2^8)).
//!
//! [`Codec::encode`] turns a stripe's payload (at most `k * block_size`
//! bytes) into `k + m` shard blocks of equal length, zero-padding a short
//! stripe; [`Codec::reconstruct_data`] rebuilds the k data blocks from any k
//! of the `k + m`.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use reed_solomon_erasure::galois_8::ReedSolomon;

use crate::layout::Layout;

/// Why coding failed.
#[derive(Debug, thiserror::Error)]
pub enum ErasureError {
    /// The shard counts are not usable (k = 0, m = 0 or k + m > 256).
    #[error("invalid erasure layout {data}+{parity}: {source}")]
    Layout {
        data: usize,
        parity: usize,
        #[source]
        source: reed_solomon_erasure::Error,
    },
    /// Fewer than k blocks given, or blocks of unequal length.
    #[error("cannot reconstruct stripe: {0}")]
    Reconstruct(#[source] reed_solomon_erasure::Error),
}

/// A k+m Reed–Solomon codec. Cheap to clone (the matrices are shared).
#[derive(Clone)]
pub struct Codec {
    rs: Arc<ReedSolomon>,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Codec({}+{})", self.data_shards(), self.parity_shards())
    }
}

impl Codec {
    /// A codec with `data` data shards and `parity` parity shards
    /// (`data >= 1`, `parity >= 1`, `data + parity <= 256`).
    pub fn new(data: usize, parity: usize) -> Result<Self, ErasureError> {
        let rs = ReedSolomon::new(data, parity).map_err(|source| ErasureError::Layout {
            data,
            parity,
            source,
        })?;
        Ok(Codec { rs: Arc::new(rs) })
    }

    /// k.
    pub fn data_shards(&self) -> usize {
        self.rs.data_shard_count()
    }

    /// m.
    pub fn parity_shards(&self) -> usize {
        self.rs.parity_shard_count()
    }

    /// k + m.
    pub fn total_shards(&self) -> usize {
        self.rs.total_shard_count()
    }

    /// Encodes one stripe's payload into `k + m` blocks of
    /// `ceil(len / k)` bytes each (index = shard index). The data blocks are
    /// slices of `stripe` (no copy) when its length is a multiple of k;
    /// otherwise the stripe is copied once and zero-padded. An empty stripe
    /// gives `k + m` empty blocks.
    pub fn encode(&self, stripe: Bytes) -> Vec<Bytes> {
        let k = self.data_shards();
        let len = Layout::block_len_for(stripe.len(), k);
        let stripe = if stripe.len() == k * len {
            stripe
        } else {
            let mut padded = BytesMut::with_capacity(k * len);
            padded.extend_from_slice(&stripe);
            padded.resize(k * len, 0);
            padded.freeze()
        };
        let data: Vec<Bytes> = (0..k)
            .map(|i| stripe.slice(i * len..(i + 1) * len))
            .collect();
        let mut parity = vec![vec![0u8; len]; self.parity_shards()];
        if len > 0 {
            // Lengths are equal and counts match by construction.
            self.rs
                .encode_sep(&data, &mut parity)
                .expect("encode_sep with k equal data blocks and m parity buffers");
        }
        data.into_iter()
            .chain(parity.into_iter().map(Bytes::from))
            .collect()
    }

    /// Computes the `m` parity blocks of a stripe whose `k` data blocks of
    /// `len` bytes each fill the start of `buf`, into the rest of `buf`
    /// (whatever it held there is overwritten). For a stripe kept in one
    /// reused buffer with its parity (see `blob::stripe_buffers`).
    ///
    /// # Panics
    /// If `buf` is not `(k + m) * len` bytes.
    pub fn encode_parity_in_place(&self, buf: &mut [u8], len: usize) {
        assert_eq!(
            buf.len(),
            self.total_shards() * len,
            "a buffer of k + m blocks"
        );
        if len == 0 {
            return;
        }
        let (data, parity) = buf.split_at_mut(self.data_shards() * len);
        let data: Vec<&[u8]> = data.chunks_exact(len).collect();
        let mut parity: Vec<&mut [u8]> = parity.chunks_exact_mut(len).collect();
        self.rs
            .encode_sep(&data, &mut parity)
            .expect("encode_sep with k equal data blocks and m parity blocks");
    }

    /// Rebuilds the missing data blocks of a stripe in place. `blocks` has
    /// `k + m` entries (index = shard index), `None` where a block is
    /// missing; at least k must be present and all of equal length. Parity
    /// entries that were `None` stay `None`.
    pub fn reconstruct_data(&self, blocks: &mut [Option<Vec<u8>>]) -> Result<(), ErasureError> {
        self.rs
            .reconstruct_data(blocks)
            .map_err(ErasureError::Reconstruct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes of test data (bounded by the caller's `len`).
    fn payload(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
            .collect::<Vec<u8>>()
            .into()
    }

    fn rebuild(codec: &Codec, blocks: &[Bytes], erased: &[usize], payload_len: usize) -> Vec<u8> {
        let mut opt: Vec<Option<Vec<u8>>> = blocks
            .iter()
            .enumerate()
            .map(|(i, b)| (!erased.contains(&i)).then(|| b.to_vec()))
            .collect();
        codec.reconstruct_data(&mut opt).expect("reconstruct");
        let mut out: Vec<u8> = opt[..codec.data_shards()]
            .iter()
            .flat_map(|b| b.clone().expect("data block"))
            .collect();
        out.truncate(payload_len);
        out
    }

    #[test]
    fn full_stripe_blocks_are_slices() {
        let codec = Codec::new(4, 2).expect("codec");
        let stripe = payload(4 * 1024, 7);
        let blocks = codec.encode(stripe.clone());
        assert_eq!(blocks.len(), 6);
        assert!(blocks.iter().all(|b| b.len() == 1024));
        let joined: Vec<u8> = blocks[..4].iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(joined, stripe.to_vec());
        // The data blocks share the stripe's buffer.
        assert_eq!(blocks[0].as_ptr(), stripe.as_ptr());
    }

    #[test]
    fn reconstruct_with_up_to_m_erased() {
        let codec = Codec::new(4, 2).expect("codec");
        for len in [4096usize, 4093, 1, 5] {
            let stripe = payload(len, len as u8);
            let blocks = codec.encode(stripe.clone());
            let block_len = len.div_ceil(4);
            assert!(blocks.iter().all(|b| b.len() == block_len));
            // Every erasure pattern of 0, 1 or 2 shards out of 6.
            for a in 0..6 {
                for b in a..6 {
                    let erased: Vec<usize> = if a == b { vec![a] } else { vec![a, b] };
                    assert_eq!(
                        rebuild(&codec, &blocks, &erased, len),
                        stripe.to_vec(),
                        "len {len} erased {erased:?}"
                    );
                }
            }
            assert_eq!(rebuild(&codec, &blocks, &[], len), stripe.to_vec());
        }
    }

    #[test]
    fn parity_in_place_overwrites_what_the_buffer_held() {
        let codec = Codec::new(4, 2).expect("codec");
        let stripe = payload(4 * 1000, 9);
        let expected = codec.encode(stripe.clone());
        // A reused buffer: the data in front, stale bytes where parity goes.
        let mut buf = vec![0xA5u8; 6 * 1000];
        buf[..4000].copy_from_slice(&stripe);
        codec.encode_parity_in_place(&mut buf, 1000);
        let blocks: Vec<&[u8]> = buf.chunks_exact(1000).collect();
        assert_eq!(blocks.len(), 6);
        for (i, block) in blocks.iter().enumerate() {
            assert_eq!(*block, expected[i].as_ref(), "block {i}");
        }
        let erased = [1, 4];
        assert_eq!(
            rebuild(
                &codec,
                &blocks
                    .iter()
                    .map(|b| Bytes::copy_from_slice(b))
                    .collect::<Vec<_>>(),
                &erased,
                4000
            ),
            stripe.to_vec()
        );
    }

    #[test]
    fn too_many_erasures_fail() {
        let codec = Codec::new(4, 2).expect("codec");
        let blocks = codec.encode(payload(400, 1));
        let mut opt: Vec<Option<Vec<u8>>> = blocks
            .iter()
            .enumerate()
            .map(|(i, b)| (i > 2).then(|| b.to_vec()))
            .collect();
        assert!(matches!(
            codec.reconstruct_data(&mut opt),
            Err(ErasureError::Reconstruct(_))
        ));
    }

    #[test]
    fn padding_is_zero_and_parity_is_deterministic() {
        let codec = Codec::new(3, 2).expect("codec");
        let blocks = codec.encode(payload(7, 3));
        // 7 bytes over 3 shards: 3 bytes per block, 2 bytes of padding.
        assert_eq!(blocks[2].as_ref(), &[payload(7, 3)[6], 0, 0]);
        assert_eq!(codec.encode(payload(7, 3)), blocks);
    }

    #[test]
    fn empty_stripe_and_bad_layouts() {
        let codec = Codec::new(4, 2).expect("codec");
        let blocks = codec.encode(Bytes::new());
        assert_eq!(blocks.len(), 6);
        assert!(blocks.iter().all(|b| b.is_empty()));
        assert!(matches!(Codec::new(0, 2), Err(ErasureError::Layout { .. })));
        assert!(matches!(
            Codec::new(200, 100),
            Err(ErasureError::Layout { .. })
        ));
    }
}
