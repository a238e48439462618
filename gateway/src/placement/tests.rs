//! Unit and property tests of [`super`]. The property tests draw random
//! cluster shapes (node counts, hosts, zones, capacities, k/m) from a
//! seeded RNG, so a failure names its seed and case and replays exactly.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::*;

fn plain(ids: &[u64]) -> Vec<Candidate<'static>> {
    ids.iter()
        .map(|&id| Candidate {
            id,
            zone: "",
            host: "",
            free_bytes: 0,
        })
        .collect()
}

#[test]
fn picks_distinct_nodes_deterministically() {
    let live: Vec<u64> = (1..=10).collect();
    for i in 0..200 {
        let key = format!("bucket/key-{i}/upload/{i}");
        let a = pick(&key, live.iter().copied(), 6).expect("enough nodes");
        let mut shuffled: Vec<u64> = live.iter().rev().copied().collect();
        shuffled.extend([3, 3, 7]);
        let b = pick(&key, shuffled, 6).expect("enough nodes");
        assert_eq!(a, b);
        let distinct: BTreeSet<u64> = a.iter().copied().collect();
        assert_eq!(distinct.len(), 6, "{a:?}");
        // Unlabelled, equal weights: `place` is the same order.
        assert_eq!(place(&key, &plain(&live), 4, 2), Some(a));
    }
}

#[test]
fn too_few_nodes() {
    assert_eq!(pick("k", [1, 2, 3, 4, 5], 6), None);
    assert_eq!(pick("k", [1, 1, 2, 2, 3, 3, 4, 5, 5], 6), None);
    assert_eq!(pick("k", [1, 2, 3, 4, 5, 6], 6).map(|v| v.len()), Some(6));
    assert_eq!(pick("k", std::iter::empty(), 0), Some(vec![]));
    assert_eq!(place("k", &plain(&[1, 2, 3, 4, 5]), 4, 2), None);
}

#[test]
fn removing_a_node_moves_only_its_shards() {
    let live: Vec<u64> = (1..=12).collect();
    let removed = 5;
    let rest: Vec<u64> = live.iter().copied().filter(|&n| n != removed).collect();
    let mut affected = 0;
    for i in 0..500 {
        let key = format!("b/k/{i}");
        let before = pick(&key, live.iter().copied(), live.len()).expect("enough nodes");
        let after = pick(&key, rest.iter().copied(), rest.len()).expect("enough nodes");
        let expected: Vec<u64> = before.iter().copied().filter(|&n| n != removed).collect();
        assert_eq!(after, expected);
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
    // The weighted, domain-aware placement with equal weights and no
    // labels is the same.
    let ids: Vec<u64> = (1..=10).collect();
    let mut nodes = plain(&ids);
    for n in &mut nodes {
        n.free_bytes = 3 << 40;
    }
    assert_eq!(
        place("bucket/key/upload/1", &nodes, 4, 2),
        Some(GOLDEN.to_vec())
    );
}

// Computed independently (FNV-1a + SplitMix64 + hrw-hash's merge, in Python).
const GOLDEN_KEY_HASH: u64 = 7_742_080_138_324_563_828;
const GOLDEN: [u64; 6] = [6, 1, 3, 7, 8, 10];

#[test]
fn weights_follow_free_space() {
    // Node 1 has twice the free space class of the others: it should be
    // first for about 2/(2+7) of keys.
    let ids: Vec<u64> = (1..=8).collect();
    let mut nodes = plain(&ids);
    for n in &mut nodes {
        n.free_bytes = if n.id == 1 { 1 << 41 } else { 1 << 40 };
    }
    let mut first = BTreeMap::new();
    for i in 0..9000 {
        let p = place(&format!("w/{i}"), &nodes, 1, 0).expect("enough");
        *first.entry(p[0]).or_insert(0u32) += 1;
    }
    let heavy = first[&1];
    assert!((1700..2300).contains(&heavy), "{first:?}");
    // Free space differing within a power of two does not change anything.
    let mut jitter = nodes.clone();
    for n in &mut jitter {
        n.free_bytes += n.id * 4096;
    }
    for i in 0..200 {
        let key = format!("j/{i}");
        assert_eq!(place(&key, &nodes, 4, 2), place(&key, &jitter, 4, 2));
    }
}

#[test]
fn two_nodes_per_host_never_exceed_m() {
    // 6 datanodes on 3 hosts, 4+2: no host holds more than 2 shards.
    let hosts = ["h1", "h1", "h2", "h2", "h3", "h3"];
    let nodes: Vec<Candidate<'_>> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| Candidate {
            id: i as u64 + 1,
            zone: "",
            host: h,
            free_bytes: 0,
        })
        .collect();
    for i in 0..300 {
        let p = place(&format!("x/{i}"), &nodes, 4, 2).expect("6 nodes");
        assert_eq!(p.len(), 6);
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for id in &p {
            *per.entry(hosts[*id as usize - 1]).or_default() += 1;
        }
        assert!(per.values().all(|&c| c <= 2), "{per:?}");
    }
    let entries: Vec<DatanodeEntry> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut e = DatanodeEntry::up(i as u64 + 1, "http://x");
            e.host = (*h).into();
            e
        })
        .collect();
    let r = domain_guarantee(&entries, 4, 2);
    assert_eq!(r.guarantee, Guarantee::HostSafe, "{r:?}");
    // Two hosts only: best effort, 3 per host.
    let r = domain_guarantee(&entries[..4], 2, 2);
    assert_eq!(r.guarantee, Guarantee::HostSafe, "{r:?}");
    let mut two = entries.clone();
    for e in &mut two {
        if e.host == "h3" {
            e.host = "h2".into();
        }
    }
    let r = domain_guarantee(&two, 4, 2);
    assert_eq!(r.guarantee, Guarantee::None, "{r:?}");
    // 2 nodes on h1, 4 on h2: 6 shards need 4 on h2.
    assert_eq!(r.max_shards_per_host, 4);
}

// ------------------------------------------------------------ properties

/// A random cluster shape: labels and free space per node.
#[derive(Debug, Clone)]
struct Shape {
    ids: Vec<u64>,
    zones: Vec<String>,
    hosts: Vec<String>,
    free: Vec<u64>,
    k: usize,
    m: usize,
}

impl Shape {
    fn random(rng: &mut StdRng) -> Shape {
        let k = rng.gen_range(1..=6);
        let m = rng.gen_range(1..=4);
        let count = rng.gen_range(1..=(k + m + 8));
        let host_count = rng.gen_range(1..=count);
        let zone_count = if rng.gen_bool(0.4) {
            0
        } else {
            rng.gen_range(1..=4)
        };
        // Each host sits in one zone.
        let host_zone: Vec<String> = (0..host_count)
            .map(|_| {
                if zone_count == 0 {
                    String::new()
                } else {
                    format!("z{}", rng.gen_range(0..zone_count))
                }
            })
            .collect();
        let mut ids: Vec<u64> = (1..=count as u64 * 3).collect();
        ids.shuffle(rng);
        ids.truncate(count);
        let mut zones = Vec::new();
        let mut hosts = Vec::new();
        let mut free = Vec::new();
        for i in 0..count {
            // Every host gets a node first, then random ones.
            let h = if i < host_count {
                i
            } else {
                rng.gen_range(0..host_count)
            };
            // Some nodes unlabelled (each its own host).
            if rng.gen_bool(0.05) {
                hosts.push(String::new());
            } else {
                hosts.push(format!("h{h}"));
            }
            zones.push(host_zone[h].clone());
            free.push(match rng.gen_range(0..4) {
                0 => 0,
                1 => 1 << 40,
                2 => rng.gen_range(1u64 << 30..1u64 << 42),
                _ => 1 << 41,
            });
        }
        Shape {
            ids,
            zones,
            hosts,
            free,
            k,
            m,
        }
    }

    fn candidates(&self) -> Vec<Candidate<'_>> {
        (0..self.ids.len())
            .map(|i| Candidate {
                id: self.ids[i],
                zone: &self.zones[i],
                host: &self.hosts[i],
                free_bytes: self.free[i],
            })
            .collect()
    }

    fn entries(&self) -> Vec<DatanodeEntry> {
        (0..self.ids.len())
            .map(|i| {
                let mut e = DatanodeEntry::up(self.ids[i], "http://x");
                e.zone.clone_from(&self.zones[i]);
                e.host.clone_from(&self.hosts[i]);
                e.free_bytes = self.free[i];
                e
            })
            .collect()
    }

    fn index(&self, id: u64) -> usize {
        self.ids
            .iter()
            .position(|&x| x == id)
            .expect("placed id is a node")
    }

    /// Host domain of node index `i`, as the module doc defines it.
    fn host_of(&self, i: usize) -> String {
        if self.hosts[i].is_empty() {
            format!("{}/#{}", self.zones[i], self.ids[i])
        } else {
            format!("{}/{}", self.zones[i], self.hosts[i])
        }
    }

    fn zoned(&self) -> bool {
        self.zones.iter().any(|z| !z.is_empty())
    }

    /// Nodes per host domain.
    fn host_sizes(&self) -> BTreeMap<String, usize> {
        let mut s = BTreeMap::new();
        for i in 0..self.ids.len() {
            *s.entry(self.host_of(i)).or_default() += 1;
        }
        s
    }

    /// Brute force: the least per-host maximum any placement of n shards
    /// can have.
    fn least_host_cap(&self) -> usize {
        let n = self.k + self.m;
        let sizes = self.host_sizes();
        (1..=n)
            .find(|&c| sizes.values().map(|&s| s.min(c)).sum::<usize>() >= n)
            .expect("enough nodes")
    }

    /// Whether some placement keeps every host at <= m shards.
    fn host_safe_possible(&self) -> bool {
        let n = self.k + self.m;
        self.host_sizes()
            .values()
            .map(|&s| s.min(self.m))
            .sum::<usize>()
            >= n
    }

    /// Whether some placement keeps every zone (and host) at <= m shards.
    fn zone_safe_possible(&self) -> bool {
        let n = self.k + self.m;
        if !self.zoned() {
            return false;
        }
        let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
        for (h, s) in self.host_sizes() {
            let zone = h.split('/').next().unwrap_or("").to_string();
            let zone_ref = self
                .zones
                .iter()
                .find(|z| **z == zone)
                .map(String::as_str)
                .unwrap_or("");
            *per_zone.entry(zone_ref).or_default() += s.min(self.m);
        }
        per_zone.values().map(|&s| s.min(self.m)).sum::<usize>() >= n
    }
}

fn counts(shape: &Shape, p: &[u64]) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut per_host = BTreeMap::new();
    let mut per_zone = BTreeMap::new();
    for &id in p {
        let i = shape.index(id);
        *per_host.entry(shape.host_of(i)).or_default() += 1;
        *per_zone.entry(shape.zones[i].clone()).or_default() += 1;
    }
    (per_host, per_zone)
}

#[test]
fn property_placement_over_random_shapes() {
    let mut rng = StdRng::seed_from_u64(0x5_1u64 << 20);
    let mut checked = 0;
    for case in 0..400 {
        let shape = Shape::random(&mut rng);
        let n = shape.k + shape.m;
        let nodes = shape.candidates();
        let report = domain_guarantee(&shape.entries(), shape.k, shape.m);
        if nodes.len() < n {
            assert_eq!(place("k", &nodes, shape.k, shape.m), None, "case {case}");
            assert_eq!(report.guarantee, Guarantee::None);
            continue;
        }
        checked += 1;
        // The reported guarantee is exactly what the shape allows.
        let expect = if shape.zone_safe_possible() {
            Guarantee::ZoneSafe
        } else if shape.host_safe_possible() {
            Guarantee::HostSafe
        } else {
            Guarantee::None
        };
        assert_eq!(
            report.guarantee, expect,
            "case {case}: {shape:?} {report:?}"
        );
        let host_cap = shape.least_host_cap().max(shape.m);
        assert_eq!(report.max_shards_per_host, host_cap, "case {case}");
        let mut reversed = nodes.clone();
        reversed.reverse();
        for key in 0..40 {
            let key = format!("b/{case}/{key}");
            let p = place(&key, &nodes, shape.k, shape.m).expect("enough nodes");
            // Distinct, from the candidates, deterministic, order-free.
            assert_eq!(p.len(), n);
            assert_eq!(p.iter().collect::<BTreeSet<_>>().len(), n, "{p:?}");
            assert_eq!(Some(p.clone()), place(&key, &reversed, shape.k, shape.m));
            let (per_host, per_zone) = counts(&shape, &p);
            // Best effort: never above the least achievable host cap (or m).
            let max_host = per_host.values().copied().max().unwrap_or(0);
            assert!(
                max_host <= host_cap,
                "case {case}: {per_host:?} cap {host_cap}"
            );
            if report.guarantee >= Guarantee::HostSafe {
                assert!(max_host <= shape.m, "case {case}: {per_host:?}");
            }
            if report.guarantee == Guarantee::ZoneSafe {
                let max_zone = per_zone.values().copied().max().unwrap_or(0);
                assert!(max_zone <= shape.m, "case {case}: {per_zone:?}");
            }
            if let Some(zcap) = report.max_shards_per_zone {
                assert!(per_zone.values().all(|&c| c <= zcap), "case {case}");
            }
        }
    }
    assert!(checked > 250, "only {checked} shapes had enough nodes");
}

#[test]
fn property_adding_a_node_moves_only_keys_it_takes() {
    let mut rng = StdRng::seed_from_u64(77);
    let mut compared = 0;
    for case in 0..200 {
        let shape = Shape::random(&mut rng);
        let n = shape.k + shape.m;
        if shape.ids.len() < n {
            continue;
        }
        // The new node: on an existing host (or a new one), a free space
        // drawn like the others'.
        let mut grown = shape.clone();
        let new_id = 10_000 + case as u64;
        let j = rng.gen_range(0..shape.ids.len());
        grown.ids.push(new_id);
        grown.zones.push(shape.zones[j].clone());
        grown.hosts.push(if rng.gen_bool(0.5) {
            shape.hosts[j].clone()
        } else {
            format!("new{case}")
        });
        grown
            .free
            .push(shape.free[rng.gen_range(0..shape.ids.len())]);
        let before_r = domain_guarantee(&shape.entries(), shape.k, shape.m);
        let after_r = domain_guarantee(&grown.entries(), shape.k, shape.m);
        let same_caps = before_r.max_shards_per_host == after_r.max_shards_per_host
            && before_r.max_shards_per_zone == after_r.max_shards_per_zone;
        // Weight classes of unknown (0) nodes follow the largest class of
        // the set: only compare when the largest class is unchanged.
        let top = |s: &Shape| s.free.iter().map(|&f| weight_class(f)).max();
        if !same_caps || top(&shape) != top(&grown) {
            continue;
        }
        compared += 1;
        let (a, b) = (shape.candidates(), grown.candidates());
        let mut moved = 0;
        let keys = 300;
        for key in 0..keys {
            let key = format!("m/{case}/{key}");
            let before = place(&key, &a, shape.k, shape.m).expect("enough");
            let after = place(&key, &b, shape.k, shape.m).expect("enough");
            if before != after {
                moved += 1;
                assert!(
                    after.contains(&new_id),
                    "case {case}: {before:?} -> {after:?} without the new node"
                );
            }
        }
        // Unlabelled shapes are plain weighted rendezvous: the new node is
        // taken for about n * w / Σw of the keys.
        if shape.hosts.iter().all(String::is_empty) && !shape.zoned() {
            let top = top(&grown).unwrap_or(0);
            let w = |f: u64| {
                let c = if weight_class(f) == 0 {
                    top
                } else {
                    weight_class(f)
                };
                2f64.powi(c as i32 - top as i32)
            };
            let total: f64 = grown.free.iter().map(|&f| w(f)).sum();
            let share = (n as f64 * w(*grown.free.last().expect("new")) / total).min(1.0);
            let frac = f64::from(moved) / f64::from(keys);
            assert!(
                frac <= share * 1.5 + 0.08,
                "case {case}: moved {frac}, share {share}"
            );
        }
    }
    assert!(compared > 50, "only {compared} shapes compared");
}

#[test]
fn property_unlabelled_movement_is_about_one_nth() {
    // Plain clusters of N equal nodes, 4+2: adding one moves ~6/(N+1).
    for count in [8u64, 12, 20] {
        let ids: Vec<u64> = (1..=count).collect();
        let a = plain(&ids);
        let mut grown_ids = ids.clone();
        grown_ids.push(count + 1);
        let b = plain(&grown_ids);
        let keys = 2000;
        let moved = (0..keys)
            .filter(|i| {
                let key = format!("one/{i}");
                place(&key, &a, 4, 2) != place(&key, &b, 4, 2)
            })
            .count();
        let expected = 6.0 / (count + 1) as f64;
        let frac = moved as f64 / keys as f64;
        assert!(
            (frac - expected).abs() < 0.05,
            "{count} nodes: moved {frac}, expected {expected}"
        );
    }
}

#[test]
fn property_pick_one_respects_domains() {
    let mut rng = StdRng::seed_from_u64(4242);
    for case in 0..300 {
        let shape = Shape::random(&mut rng);
        let n = shape.k + shape.m;
        if shape.ids.len() <= n {
            continue;
        }
        let nodes = shape.candidates();
        let report = domain_guarantee(&shape.entries(), shape.k, shape.m);
        let key = format!("p/{case}");
        let p = place(&key, &nodes, shape.k, shape.m).expect("enough");
        // Lose shard i's node; pick a replacement among the others.
        let i = rng.gen_range(0..n);
        let lost = p[i];
        let keeping: Vec<Candidate<'_>> = p
            .iter()
            .filter(|&&id| id != lost)
            .map(|&id| nodes[shape.index(id)])
            .collect();
        let others: Vec<Candidate<'_>> = nodes.iter().copied().filter(|c| c.id != lost).collect();
        let t = pick_one(&format!("{key}/{i}"), &others, &keeping, shape.k, shape.m)
            .expect("a free node");
        assert!(
            !p.contains(&t),
            "case {case}: target {t} already holds a shard"
        );
        let mut healed = p.clone();
        healed[i] = t;
        let (per_host, per_zone) = counts(&shape, &healed);
        // The old node's host lost one shard; the caps over the remaining
        // nodes hold when the guarantee did and still does.
        let rest_report = domain_guarantee(
            &shape
                .entries()
                .into_iter()
                .filter(|e| e.id != lost)
                .collect::<Vec<_>>(),
            shape.k,
            shape.m,
        );
        if report.guarantee >= Guarantee::HostSafe && rest_report.guarantee >= Guarantee::HostSafe {
            assert!(
                per_host.values().all(|&c| c <= shape.m),
                "case {case}: {per_host:?}"
            );
        }
        if report.guarantee == Guarantee::ZoneSafe && rest_report.guarantee == Guarantee::ZoneSafe {
            assert!(
                per_zone.values().all(|&c| c <= shape.m),
                "case {case}: {per_zone:?}"
            );
        }
    }
}
