//! Placement of a blob's shards: weighted rendezvous (highest-random-weight)
//! hashing of a placement key over the datanodes that accept shards, spread
//! across failure domains.
//!
//! # The rule
//! Given the candidate nodes (live, writable, not draining: the caller
//! filters), a placement key and `k + m`:
//!
//! 1. *Ranking.* Every (key, node) pair gets a score; the nodes sorted by
//!    score, highest first, are the key's preference list. The score is
//!    weighted rendezvous hashing by the logarithmic method,
//!    `score = w / -ln(u)` with `u` in (0, 1) the pair's hash (Schindelhauer
//!    and Schomaker, "Weighted Distributed Hash Tables", SPAA 2005; the same
//!    formula as "Weighted rendezvous hashing" in Wikipedia's *Rendezvous
//!    hashing* article and Resch's "New Hashing Algorithms for Data
//!    Storage"): a node of weight `w` is first for a `w / Σw` share of
//!    keys, and adding or removing a node moves only the keys it wins or
//!    held. The weight is the node's free bytes rounded down to a power of
//!    two ([`weight_class`]), so small changes of free space do not move
//!    data; a node reporting no figure yet (0) gets the largest class of
//!    the set. With equal weights the order is exactly the unweighted one
//!    of earlier releases (`placement_is_stable_across_releases`).
//! 2. *Failure domains.* A node's host domain is (zone, host); an empty
//!    host label makes the node a host of its own. Zones are in force when
//!    any candidate has a non-empty zone (an empty zone is then a zone of
//!    its own). With `n = k + m` shards and per-host node counts `c_h`, the
//!    host cap is `max(m, c*)` where `c*` is the least `c` with
//!    `Σ_h min(c_h, c) >= n` (the fewest shards per host any placement can
//!    achieve); the zone cap is computed the same way over each zone's
//!    capacity `Σ_{h in z} min(c_h, host cap)`. So with at least
//!    `ceil(n / m)` hosts (each with enough nodes) no host holds more than
//!    `m` shards of a blob: losing any one host removes at most `m` shards,
//!    and the blob stays readable. The same for zones when configured.
//!    When the cluster is too small for that the caps are the least
//!    achievable (best effort) and [`domain_guarantee`] says so.
//! 3. *Selection.* Walk the preference list and take every node whose host
//!    and zone are below their caps, until `n` are taken: shard `i` goes to
//!    the `i`-th node taken. Hosts nest in zones, so the caps form a laminar
//!    matroid and this greedy walk always finds `n` nodes when the caps
//!    allow them (which they do by construction).
//!
//! Stability: as long as the caps do not change, adding a node changes the
//! placement of exactly the keys for which the new node is taken (about
//! `n·w / Σw` of them), and removing a node only the keys it held. The
//! property tests at the end of this file check distinctness, the caps,
//! determinism and the movement over random cluster shapes.
//!
//! Hashes use [`StableHasher`] (FNV-1a and a SplitMix64 finalizer, both
//! fixed here) and the node/key merge of `hrw-hash` 0.2 copied here, so the
//! placement depends only on the key's bytes and the node ids, not on
//! `std`'s `Hash` impl, the platform or a crate's release.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use crate::datanodes::DatanodeEntry;

/// One node as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub id: u64,
    /// Zone label; empty = none.
    pub zone: &'a str,
    /// Host label; empty = the node is a host of its own.
    pub host: &'a str,
    /// Free bytes of its data dir; 0 = not known yet.
    pub free_bytes: u64,
}

impl<'a> From<&'a DatanodeEntry> for Candidate<'a> {
    fn from(e: &'a DatanodeEntry) -> Self {
        Candidate {
            id: e.id,
            zone: &e.zone,
            host: &e.host,
            free_bytes: e.free_bytes,
        }
    }
}

/// The weight class of a node with `free_bytes` free: `free_bytes` rounded
/// down to a power of two (as its exponent + 1); 0 for an unknown figure.
pub fn weight_class(free_bytes: u64) -> u32 {
    64 - free_bytes.leading_zeros()
}

/// Which failure-domain guarantee placements on a node set give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Guarantee {
    /// Neither: some host may hold more than m shards of a blob.
    None,
    /// No host holds more than m shards of any blob.
    HostSafe,
    /// No zone (so no host) holds more than m shards of any blob.
    ZoneSafe,
}

/// What [`domain_guarantee`] found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DomainReport {
    pub guarantee: Guarantee,
    /// Most shards of one blob a host may hold (the host cap); 0 when
    /// there are too few nodes to place at all.
    pub max_shards_per_host: usize,
    /// Most shards of one blob a zone may hold; `None` without zones.
    pub max_shards_per_zone: Option<usize>,
    /// Why, in words.
    pub reason: String,
}

/// The caps for `n` shards over `nodes` (see the module doc); `None` when
/// fewer than `n` distinct nodes are given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Caps {
    host: usize,
    host_least: usize,
    /// `None` when zones are not in force.
    zone: Option<(usize, usize)>,
    hosts: usize,
    zones: usize,
}

type HostKey<'a> = (&'a str, &'a str, u64);

/// The host domain of a node: (zone, host), or the node itself when its
/// host label is empty.
fn host_key<'a>(c: &Candidate<'a>) -> HostKey<'a> {
    if c.host.is_empty() {
        (c.zone, "", c.id)
    } else {
        (c.zone, c.host, 0)
    }
}

/// The least `c >= 1` with `Σ min(size, c) >= n` over `sizes`, if any.
fn least_cap(sizes: &[usize], n: usize) -> Option<usize> {
    let total: usize = sizes.iter().sum();
    if total < n {
        return None;
    }
    (1..=n.max(1)).find(|&c| sizes.iter().map(|&s| s.min(c)).sum::<usize>() >= n)
}

fn caps(nodes: &[Candidate<'_>], n: usize, m: usize) -> Option<Caps> {
    let mut per_host: BTreeMap<HostKey<'_>, usize> = BTreeMap::new();
    for c in nodes {
        *per_host.entry(host_key(c)).or_default() += 1;
    }
    let sizes: Vec<usize> = per_host.values().copied().collect();
    let host_least = least_cap(&sizes, n)?;
    let host = host_least.max(m);
    let zoned = nodes.iter().any(|c| !c.zone.is_empty());
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    for (h, size) in &per_host {
        *per_zone.entry(h.0).or_default() += (*size).min(host);
    }
    let zone = if zoned {
        let zsizes: Vec<usize> = per_zone.values().copied().collect();
        let least = least_cap(&zsizes, n)?;
        Some((least.max(m), least))
    } else {
        None
    };
    Some(Caps {
        host,
        host_least,
        zone,
        hosts: per_host.len(),
        zones: per_zone.len(),
    })
}

/// The host and zone caps [`place`] applies for `k + m` shards over some
/// candidates (see [`caps_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainCaps {
    pub host: usize,
    /// `None` when zones are not in force.
    pub zone: Option<usize>,
}

impl DomainCaps {
    /// Whether the nodes of one blob (`chosen`) keep every host and zone
    /// within the caps.
    pub fn fits(&self, chosen: &[Candidate<'_>]) -> bool {
        let mut per_host: BTreeMap<HostKey<'_>, usize> = BTreeMap::new();
        let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
        for c in chosen {
            *per_host.entry(host_key(c)).or_default() += 1;
            *per_zone.entry(c.zone).or_default() += 1;
        }
        per_host.values().all(|&n| n <= self.host)
            && self.zone.is_none_or(|z| per_zone.values().all(|&n| n <= z))
    }
}

/// The caps [`place`] uses for `k + m` shards over `nodes`; `None` when
/// fewer than `k + m` distinct nodes are given.
pub fn caps_of(nodes: &[Candidate<'_>], k: usize, m: usize) -> Option<DomainCaps> {
    let c = caps(&dedup(nodes), k + m, m)?;
    Some(DomainCaps {
        host: c.host,
        zone: c.zone.map(|z| z.0),
    })
}

/// Picks `k + m` distinct datanodes for `key` from `nodes` (the candidates:
/// live, writable, not draining), in shard order (the first holds shard
/// 0), by the rule of the module doc. Duplicated ids count once (the first
/// entry wins). `None` when fewer than `k + m` distinct nodes are given.
pub fn place(key: &str, nodes: &[Candidate<'_>], k: usize, m: usize) -> Option<Vec<u64>> {
    let n = k + m;
    let nodes = dedup(nodes);
    let caps = caps(&nodes, n, m)?;
    let ranked = rank(key, &nodes);
    let mut per_host: BTreeMap<HostKey<'_>, usize> = BTreeMap::new();
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::with_capacity(n);
    for c in ranked {
        if out.len() == n {
            break;
        }
        let h = per_host.entry(host_key(&c)).or_default();
        if *h >= caps.host {
            continue;
        }
        if let Some((zcap, _)) = caps.zone {
            let z = per_zone.entry(c.zone).or_default();
            if *z >= zcap {
                continue;
            }
            *z += 1;
        }
        *h += 1;
        out.push(c.id);
    }
    (out.len() == n).then_some(out)
}

/// The failure-domain guarantee of placing `k + m` shards on the entries
/// that accept shards (live, writable, not draining), with the reason.
pub fn domain_guarantee(entries: &[DatanodeEntry], k: usize, m: usize) -> DomainReport {
    let nodes: Vec<Candidate<'_>> = entries
        .iter()
        .filter(|e| e.accepts_shards())
        .map(Candidate::from)
        .collect();
    guarantee_of(&dedup(&nodes), k, m)
}

fn guarantee_of(nodes: &[Candidate<'_>], k: usize, m: usize) -> DomainReport {
    let n = k + m;
    let Some(caps) = caps(nodes, n, m) else {
        return DomainReport {
            guarantee: Guarantee::None,
            max_shards_per_host: 0,
            max_shards_per_zone: None,
            reason: format!(
                "{} datanodes accept shards, {n} are needed for a {k}+{m} stripe",
                nodes.len()
            ),
        };
    };
    let need = if m == 0 { usize::MAX } else { n.div_ceil(m) };
    let host_safe = m > 0 && caps.host_least <= m;
    let zone_safe = m > 0 && caps.zone.is_some_and(|(_, least)| least <= m);
    let guarantee = if zone_safe {
        Guarantee::ZoneSafe
    } else if host_safe {
        Guarantee::HostSafe
    } else {
        Guarantee::None
    };
    let hosts = caps.hosts;
    let zones = caps.zones;
    let reason = match (guarantee, caps.zone) {
        (Guarantee::ZoneSafe, _) => {
            format!("{zones} zones and {hosts} hosts: no zone holds more than {m} of {n} shards")
        }
        (Guarantee::HostSafe, None) => format!(
            "{hosts} hosts, zones not configured: no host holds more than {m} of {n} shards"
        ),
        (Guarantee::HostSafe, Some((zcap, _))) => format!(
            "{hosts} hosts: no host holds more than {m} of {n} shards; only {zones} zones \
             (at least {need} with room needed), so a zone may hold {zcap}"
        ),
        (Guarantee::None, _) if m == 0 => "no parity shards: any lost shard loses data".into(),
        (Guarantee::None, _) => format!(
            "only {hosts} hosts with room (at least {need} needed for {k}+{m}): a host may hold \
             {} shards, losing it can lose data",
            caps.host
        ),
    };
    DomainReport {
        guarantee,
        max_shards_per_host: caps.host,
        max_shards_per_zone: caps.zone.map(|(c, _)| c),
        reason,
    }
}

/// A node to hold one more shard of a blob whose other shards are on
/// `keeping` (any nodes, ids), from `nodes` (the candidates), for the
/// rendezvous `key`: the best-ranked candidate not in `keeping` whose host
/// and zone stay within the caps of [`place`] for `k + m` shards over
/// `nodes ∪ keeping`; when none does (a small or lopsided cluster), the
/// candidate that adds to the least loaded host, then zone (best effort).
/// `keeping` holds the domains of the kept shards (all nodes of the blob,
/// even ones that no longer accept shards). `None` without a candidate.
pub fn pick_one<'a>(
    key: &str,
    nodes: &[Candidate<'a>],
    keeping: &[Candidate<'a>],
    k: usize,
    m: usize,
) -> Option<u64> {
    let kept: BTreeSet<u64> = keeping.iter().map(|c| c.id).collect();
    let free: Vec<Candidate<'a>> = dedup(nodes)
        .into_iter()
        .filter(|c| !kept.contains(&c.id))
        .collect();
    if free.is_empty() {
        return None;
    }
    let mut all: Vec<Candidate<'a>> = free.clone();
    all.extend(keeping.iter().copied());
    let all = dedup(&all);
    let zoned = all.iter().any(|c| !c.zone.is_empty());
    let (hcap, zcap) = match caps(&all, k + m, m) {
        Some(c) => (c.host, c.zone.map(|z| z.0)),
        None => (m.max(1), if zoned { Some(m.max(1)) } else { None }),
    };
    let mut per_host: BTreeMap<HostKey<'a>, usize> = BTreeMap::new();
    let mut per_zone: BTreeMap<&'a str, usize> = BTreeMap::new();
    for c in keeping {
        *per_host.entry(host_key(c)).or_default() += 1;
        *per_zone.entry(c.zone).or_default() += 1;
    }
    let ranked = rank(key, &free);
    let load = |c: &Candidate<'a>| {
        (
            per_host.get(&host_key(c)).copied().unwrap_or(0),
            if zoned {
                per_zone.get(c.zone).copied().unwrap_or(0)
            } else {
                0
            },
        )
    };
    if let Some(c) = ranked.iter().find(|c| {
        let (h, z) = load(c);
        h < hcap && zcap.is_none_or(|cap| z < cap)
    }) {
        return Some(c.id);
    }
    // Best effort: the least loaded host, then zone; rank breaks ties.
    ranked
        .iter()
        .enumerate()
        .min_by_key(|(i, c)| (load(c), *i))
        .map(|(_, c)| c.id)
}

/// Picks `count` distinct ids for `key` from `live`, unweighted and without
/// failure domains, in preference order. `None` when fewer than `count`
/// distinct ids are given. Used where only an order is wanted (the
/// fallback of a write with fewer writable nodes than shards).
pub fn pick(key: &str, live: impl IntoIterator<Item = u64>, count: usize) -> Option<Vec<u64>> {
    let ids: BTreeSet<u64> = live.into_iter().collect();
    if ids.len() < count {
        return None;
    }
    let nodes: Vec<Candidate<'_>> = ids
        .into_iter()
        .map(|id| Candidate {
            id,
            zone: "",
            host: "",
            free_bytes: 0,
        })
        .collect();
    Some(
        rank(key, &nodes)
            .into_iter()
            .take(count)
            .map(|c| c.id)
            .collect(),
    )
}

/// `nodes` without repeated ids (the first entry of an id wins).
fn dedup<'a>(nodes: &[Candidate<'a>]) -> Vec<Candidate<'a>> {
    let mut seen = BTreeSet::new();
    nodes
        .iter()
        .copied()
        .filter(|c| seen.insert(c.id))
        .collect()
}

/// `nodes` in preference order for `key`: weighted rendezvous score,
/// highest first (ties, which need equal 53-bit hashes, by merged hash then
/// id).
fn rank<'a>(key: &str, nodes: &[Candidate<'a>]) -> Vec<Candidate<'a>> {
    let kh = hash_u64(key_hash(key));
    let top = nodes
        .iter()
        .map(|c| weight_class(c.free_bytes))
        .max()
        .unwrap_or(0);
    let mut scored: Vec<(f64, u64, Candidate<'a>)> = nodes
        .iter()
        .map(|c| {
            let merged = merge(hash_u64(c.id), kh);
            let class = match weight_class(c.free_bytes) {
                0 => top,
                w => w,
            };
            // Classes differ by powers of two: relative weight 2^(class-top).
            let w = 2f64.powi(class as i32 - top as i32);
            // Smaller merged hash = earlier (the unweighted order of
            // `hrw-hash`), so u grows as merged shrinks.
            let u = ((!merged >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (w / -u.ln(), merged, *c)
        })
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.id.cmp(&b.2.id))
    });
    scored.into_iter().map(|(_, _, c)| c).collect()
}

/// `hrw-hash` 0.2's merge of a node hash and a key hash (a MurmurHash3
/// finalizer over their xor), copied so a crate release cannot change it.
fn merge(a: u64, b: u64) -> u64 {
    let mut d = a ^ b;
    d ^= d >> 33;
    d = d.wrapping_mul(0xff51_afd7_ed55_8ccd);
    d ^= d >> 33;
    d = d.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    d ^= d >> 33;
    d
}

/// [`StableHasher`] over one `u64` (a node id or a key hash).
fn hash_u64(v: u64) -> u64 {
    let mut h = StableHasher::default();
    h.write_u64(v);
    h.finish()
}

/// The 64-bit hash of a placement key: FNV-1a over its UTF-8 bytes.
fn key_hash(key: &str) -> u64 {
    let mut h = StableHasher::default();
    h.write(key.as_bytes());
    h.finish()
}

/// A `Hasher` whose output is fixed by this file: FNV-1a (64 bit) over the
/// bytes written, integers written little-endian, finished with SplitMix64.
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
mod tests;
