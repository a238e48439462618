//! Fresh pseudo-random payloads.
//!
//! Every part gets bytes of its own, so that no layer (dedup, compression,
//! caches) can shortcut the work, as with warp. The stream is rand's
//! `StdRng` (ChaCha12) seeded per part: its block function lives in the
//! `rand_chacha` dependency, which the workspace compiles optimised even in
//! dev builds, so a dev build fills several times faster than a
//! hand-written xorshift loop compiled without optimisation, and close to
//! it in release builds. The
//! stream for a seed is stable within one build, not across rand versions.

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// Overwrites all of `buf` with the pseudo-random stream of `seed`.
pub fn fill(seed: u64, buf: &mut [u8]) {
    StdRng::seed_from_u64(seed).fill_bytes(buf);
}

/// SplitMix64 finaliser (Steele, Lea, Flood 2014): spreads structured
/// values (worker, upload, part numbers) over all 64 bits.
pub fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed unique to one part of one upload of one worker in one run.
pub fn part_seed(run_seed: u64, worker: u64, upload: u64, part: u64) -> u64 {
    splitmix64(run_seed ^ splitmix64(worker ^ splitmix64(upload ^ splitmix64(part))))
}

/// A seed unique to one object of one worker in one run (`put`, `get`);
/// part numbers start at 1, so it differs from every [`part_seed`] too.
pub fn object_seed(run_seed: u64, worker: u64, object: u64) -> u64 {
    part_seed(run_seed, worker, object, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let mut x = vec![0u8; 1021];
        let mut y = vec![0u8; 1021];
        fill(42, &mut x);
        fill(42, &mut y);
        assert_eq!(x, y);
        fill(43, &mut y);
        assert_ne!(x, y);
        // Odd lengths are covered to the last byte.
        assert!(x[1013..].iter().any(|&b| b != 0));
    }

    #[test]
    fn bytes_look_uniform() {
        let mut buf = vec![0u8; 1 << 20];
        fill(7, &mut buf);
        let mut counts = [0u64; 256];
        for &b in &buf {
            counts[b as usize] += 1;
        }
        let expected = buf.len() as f64 / 256.0;
        for (value, &count) in counts.iter().enumerate() {
            let ratio = count as f64 / expected;
            assert!(
                (0.9..1.1).contains(&ratio),
                "byte {value}: {count} vs {expected}"
            );
        }
    }

    #[test]
    fn part_seeds_differ() {
        let seeds = [
            part_seed(1, 0, 0, 1),
            part_seed(1, 0, 0, 2),
            part_seed(1, 0, 1, 1),
            part_seed(1, 1, 0, 1),
            part_seed(2, 0, 0, 1),
            object_seed(1, 0, 1),
            object_seed(1, 1, 1),
        ];
        for i in 0..seeds.len() {
            for j in i + 1..seeds.len() {
                assert_ne!(seeds[i], seeds[j]);
            }
        }
    }
}
