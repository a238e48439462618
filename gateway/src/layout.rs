//! Stripe and range arithmetic of an erasure-coded blob (pure, no I/O).
//!
//! A blob of `size` payload bytes is cut into stripes of `k * block_size`
//! bytes; the last stripe may be short. Stripe `s` is split into `k` data
//! blocks of equal length — `block_size` for a full stripe, `ceil(rem / k)`
//! for a last stripe of `rem` bytes, zero-padded — plus `m` parity blocks of
//! the same length. Every shard holds exactly one block per stripe, so the
//! block index of stripe `s` in every shard is `s`.

use std::ops::Range;

/// The shape of one blob: payload size, data shards and block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Payload bytes.
    pub size: u64,
    /// Data shards (k), at least 1.
    pub data_shards: usize,
    /// Bytes per shard block in a full stripe, at least 1.
    pub block_size: usize,
}

impl Layout {
    /// Panics when `data_shards` or `block_size` is 0 (callers validate both).
    pub fn new(size: u64, data_shards: usize, block_size: usize) -> Self {
        assert!(
            data_shards > 0 && block_size > 0,
            "layout needs k > 0 and block_size > 0"
        );
        Layout {
            size,
            data_shards,
            block_size,
        }
    }

    /// Payload bytes in a full stripe: `k * block_size`.
    pub fn stripe_bytes(&self) -> u64 {
        self.data_shards as u64 * self.block_size as u64
    }

    /// Number of stripes (= blocks per shard); 0 for an empty blob.
    pub fn stripe_count(&self) -> u64 {
        self.size.div_ceil(self.stripe_bytes())
    }

    /// Payload byte range of stripe `s` (`s < stripe_count()`).
    pub fn stripe_range(&self, s: u64) -> Range<u64> {
        let start = s * self.stripe_bytes();
        start..(start + self.stripe_bytes()).min(self.size)
    }

    /// Payload bytes in stripe `s`.
    pub fn stripe_payload(&self, s: u64) -> usize {
        let r = self.stripe_range(s);
        (r.end - r.start) as usize
    }

    /// Length of every shard block (data and parity) of stripe `s`:
    /// `block_size` for a full stripe, `ceil(payload / k)` for a short one.
    pub fn block_len(&self, s: u64) -> usize {
        Self::block_len_for(self.stripe_payload(s), self.data_shards)
    }

    /// Block length for a stripe carrying `payload` bytes over `k` data shards.
    pub fn block_len_for(payload: usize, data_shards: usize) -> usize {
        payload.div_ceil(data_shards)
    }

    /// Total bytes one shard stores (the sum of its block lengths).
    pub fn shard_bytes(&self) -> u64 {
        match self.stripe_count() {
            0 => 0,
            n => (n - 1) * self.block_size as u64 + self.block_len(n - 1) as u64,
        }
    }

    /// Stripes overlapping the payload byte `range` (end exclusive, clamped
    /// to `size`); empty when the range is.
    pub fn stripes_for(&self, range: &Range<u64>) -> Range<u64> {
        let end = range.end.min(self.size);
        if range.start >= end {
            return 0..0;
        }
        range.start / self.stripe_bytes()..end.div_ceil(self.stripe_bytes())
    }

    /// Offset of `range.start` inside the first stripe overlapping it.
    pub fn offset_in_first_stripe(&self, range: &Range<u64>) -> u64 {
        range.start % self.stripe_bytes()
    }

    /// The part of stripe `s`'s payload that lies in `range`, relative to the
    /// stripe's first byte (empty if they do not overlap).
    pub fn trim(&self, s: u64, range: &Range<u64>) -> Range<usize> {
        let stripe = self.stripe_range(s);
        let start = range.start.clamp(stripe.start, stripe.end);
        let end = range.end.clamp(start, stripe.end);
        (start - stripe.start) as usize..(end - stripe.start) as usize
    }

    /// Byte range of data shard `i`'s block inside stripe `s`'s payload,
    /// without the zero padding of a short last stripe (may be empty).
    pub fn data_block_range(&self, s: u64, i: usize) -> Range<usize> {
        let len = self.block_len(s);
        let payload = self.stripe_payload(s);
        (i * len).min(payload)..((i + 1) * len).min(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 4;
    const BS: usize = 256 * 1024;
    const STRIPE: u64 = (K * BS) as u64;

    #[test]
    fn empty_blob() {
        let l = Layout::new(0, K, BS);
        assert_eq!(l.stripe_count(), 0);
        assert_eq!(l.shard_bytes(), 0);
        assert_eq!(l.stripes_for(&(0..0)), 0..0);
        assert_eq!(l.stripes_for(&(0..10)), 0..0);
    }

    #[test]
    fn exact_multiple_of_stripe() {
        let l = Layout::new(3 * STRIPE, K, BS);
        assert_eq!(l.stripe_count(), 3);
        for s in 0..3 {
            assert_eq!(l.block_len(s), BS);
            assert_eq!(l.stripe_payload(s), K * BS);
        }
        assert_eq!(l.shard_bytes(), 3 * BS as u64);
        assert_eq!(l.stripes_for(&(0..3 * STRIPE)), 0..3);
        assert_eq!(l.stripes_for(&(STRIPE..2 * STRIPE)), 1..2);
        assert_eq!(l.stripes_for(&(STRIPE - 1..STRIPE + 1)), 0..2);
        assert_eq!(l.stripes_for(&(3 * STRIPE - 1..3 * STRIPE)), 2..3);
    }

    #[test]
    fn short_last_stripe() {
        // 2 full stripes and 1001 bytes: ceil(1001 / 4) = 251 bytes per block.
        let size = 2 * STRIPE + 1001;
        let l = Layout::new(size, K, BS);
        assert_eq!(l.stripe_count(), 3);
        assert_eq!(l.block_len(2), 251);
        assert_eq!(l.stripe_payload(2), 1001);
        assert_eq!(l.shard_bytes(), 2 * BS as u64 + 251);
        assert_eq!(l.stripe_range(2), 2 * STRIPE..size);
        assert_eq!(l.data_block_range(2, 0), 0..251);
        assert_eq!(l.data_block_range(2, 3), 753..1001);
        assert_eq!(l.stripes_for(&(size - 1..size)), 2..3);
        // A range past the end is clamped.
        assert_eq!(l.stripes_for(&(size - 1..size + 100)), 2..3);
        // A tiny blob: 3 bytes over 4 data shards, the last block is empty.
        let tiny = Layout::new(3, K, BS);
        assert_eq!(tiny.stripe_count(), 1);
        assert_eq!(tiny.block_len(0), 1);
        assert_eq!(tiny.data_block_range(0, 2), 2..3);
        assert_eq!(tiny.data_block_range(0, 3), 3..3);
    }

    #[test]
    fn ranges_crossing_stripes() {
        let size = 5 * STRIPE + 7;
        let l = Layout::new(size, K, BS);
        let r = STRIPE + 10..3 * STRIPE + 20;
        assert_eq!(l.stripes_for(&r), 1..4);
        assert_eq!(l.offset_in_first_stripe(&r), 10);
        assert_eq!(l.trim(1, &r), 10..STRIPE as usize);
        assert_eq!(l.trim(2, &r), 0..STRIPE as usize);
        assert_eq!(l.trim(3, &r), 0..20);
        assert_eq!(l.trim(4, &r), 0..0);
        // Within one stripe.
        let r = 2 * STRIPE + 5..2 * STRIPE + 9;
        assert_eq!(l.stripes_for(&r), 2..3);
        assert_eq!(l.trim(2, &r), 5..9);
        // Into the short last stripe.
        let r = 5 * STRIPE - 3..size;
        assert_eq!(l.stripes_for(&r), 4..6);
        assert_eq!(l.trim(4, &r), STRIPE as usize - 3..STRIPE as usize);
        assert_eq!(l.trim(5, &r), 0..7);
        // Empty range.
        assert_eq!(l.stripes_for(&(9..9)), 0..0);
    }

    #[test]
    fn trimmed_stripes_cover_range_exactly() {
        let l = Layout::new(10_000, 3, 7);
        for (a, b) in [
            (0, 10_000),
            (1, 9_999),
            (20, 21),
            (20, 41),
            (41, 42),
            (9_990, 10_000),
        ] {
            let r = a..b;
            let total: usize = l.stripes_for(&r).map(|s| l.trim(s, &r).len()).sum();
            assert_eq!(total as u64, b - a);
        }
    }
}
