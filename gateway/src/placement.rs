//! Placement of a blob's shards: rendezvous (highest-random-weight) hashing of
//! a placement key over the live datanode ids.
//!
//! Every (key, node) pair gets a score; the nodes sorted by score give the
//! key's preference list and the first `k + m` of it hold shards `0..k+m` in
//! that order. Removing a node only moves the shards that node held; adding
//! one only moves shards onto it.
//!
//! The ranking uses `hrw-hash` with [`StableHasher`] instead of the crate's
//! default hasher, so the placement depends only on the key's bytes and the
//! node ids (FNV-1a and a SplitMix64 finalizer, both fixed here), not on
//! `std`'s `Hash` impl for `str`, the platform's endianness or a hash crate's
//! release. The unit test `placement_is_stable_across_releases` pins it.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};

use hrw_hash::{HrwNodes, NodeHasher};

/// Picks `count` distinct datanode ids for `key` from `live`, in shard order
/// (the first id holds shard 0). Duplicated ids in `live` count once.
/// Returns `None` when fewer than `count` distinct ids are given.
pub fn pick(key: &str, live: impl IntoIterator<Item = u64>, count: usize) -> Option<Vec<u64>> {
    let nodes: BTreeSet<u64> = live.into_iter().collect();
    if nodes.len() < count {
        return None;
    }
    let hrw = HrwNodes::with_hasher(StableNodeHasher, nodes);
    Some(hrw.sorted(&key_hash(key)).take(count).copied().collect())
}

/// The 64-bit hash of a placement key: FNV-1a over its UTF-8 bytes.
fn key_hash(key: &str) -> u64 {
    let mut h = StableHasher::default();
    h.write(key.as_bytes());
    h.finish()
}

/// [`NodeHasher`] that hashes through [`StableHasher`].
struct StableNodeHasher;

impl NodeHasher for StableNodeHasher {
    fn hash<K: Hash>(&self, key: &K) -> u64 {
        let mut h = StableHasher::default();
        key.hash(&mut h);
        h.finish()
    }
}

/// A `Hasher` whose output is fixed by this file: FNV-1a (64 bit) over the
/// bytes written, integers written little-endian, finished with SplitMix64.
/// Only `u64` node ids and the `u64` key hash are ever fed to it.
#[derive(Debug)]
pub struct StableHasher(u64);

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(FNV_OFFSET)
    }
}

impl Hasher for StableHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }

    fn write_u64(&mut self, i: u64) {
        self.write(&i.to_le_bytes());
    }

    fn finish(&self) -> u64 {
        // SplitMix64 finalizer: spreads FNV's weak low-entropy high bits.
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_distinct_nodes_deterministically() {
        let live: Vec<u64> = (1..=10).collect();
        for i in 0..200 {
            let key = format!("bucket/key-{i}/upload/{i}");
            let a = pick(&key, live.iter().copied(), 6).expect("enough nodes");
            // Input order and duplicates do not matter.
            let mut shuffled: Vec<u64> = live.iter().rev().copied().collect();
            shuffled.extend([3, 3, 7]);
            let b = pick(&key, shuffled, 6).expect("enough nodes");
            assert_eq!(a, b);
            assert_eq!(a.len(), 6);
            let distinct: BTreeSet<u64> = a.iter().copied().collect();
            assert_eq!(distinct.len(), 6, "{a:?}");
            assert!(a.iter().all(|n| live.contains(n)));
        }
    }

    #[test]
    fn too_few_nodes() {
        assert_eq!(pick("k", [1, 2, 3, 4, 5], 6), None);
        assert_eq!(pick("k", [1, 1, 2, 2, 3, 3, 4, 5, 5], 6), None);
        assert_eq!(pick("k", [1, 2, 3, 4, 5, 6], 6).map(|v| v.len()), Some(6));
        assert_eq!(pick("k", std::iter::empty(), 0), Some(vec![]));
    }

    #[test]
    fn removing_a_node_moves_only_its_shards() {
        let live: Vec<u64> = (1..=12).collect();
        let removed = 5;
        let rest: Vec<u64> = live.iter().copied().filter(|&n| n != removed).collect();
        let mut affected = 0;
        for i in 0..500 {
            let key = format!("b/k/{i}");
            // The full preference list over all nodes, minus the removed one,
            // is exactly the preference list over the remaining nodes.
            let before = pick(&key, live.iter().copied(), live.len()).expect("enough nodes");
            let after = pick(&key, rest.iter().copied(), rest.len()).expect("enough nodes");
            let expected: Vec<u64> = before.iter().copied().filter(|&n| n != removed).collect();
            assert_eq!(after, expected);
            // So the 6-node placements differ only where the removed node was.
            let before6 = &before[..6];
            let after6 = pick(&key, rest.iter().copied(), 6).expect("enough nodes");
            if before6.contains(&removed) {
                affected += 1;
                let kept: Vec<u64> = before6.iter().copied().filter(|&n| n != removed).collect();
                assert_eq!(&after6[..5], &kept[..]);
            } else {
                assert_eq!(&after6[..], before6);
            }
        }
        // Node 5 of 12 should hold a shard of about 6/12 of the keys.
        assert!((150..350).contains(&affected), "affected {affected}");
    }

    #[test]
    fn spreads_load() {
        let live: Vec<u64> = (1..=8).collect();
        let mut first = [0u32; 9];
        for i in 0..4000 {
            let p = pick(&format!("obj/{i}"), live.iter().copied(), 6).expect("enough nodes");
            first[p[0] as usize] += 1;
        }
        // 500 expected per node as shard 0.
        for (node, &n) in first.iter().enumerate().skip(1) {
            assert!((380..620).contains(&n), "node {node} is first for {n} keys");
        }
    }

    #[test]
    fn placement_is_stable_across_releases() {
        // Golden values: a change here relocates every stored blob.
        assert_eq!(key_hash("bucket/key/upload/1"), GOLDEN_KEY_HASH);
        let p = pick("bucket/key/upload/1", 1..=10, 6).expect("enough nodes");
        assert_eq!(p, GOLDEN);
    }

    // Computed independently (FNV-1a + SplitMix64 + hrw-hash's merge, in Python).
    const GOLDEN_KEY_HASH: u64 = 7_742_080_138_324_563_828;
    const GOLDEN: [u64; 6] = [6, 1, 3, 7, 8, 10];
}
