//! The read path: stripes of a byte range from k verified shard streams.
//!
//! Shards are tried in preference order — data shards `0..k`, then parity
//! shards `k..k+m`, skipping those the placement lists as missing, and
//! those on datanodes meta reports down last (trying them first would cost
//! every read a failed connection: a connect timeout or DNS failure) — and
//! the first k that are not failed are read. Each shard in use has one
//! server-streaming `GetShard` RPC covering every stripe still needed,
//! consumed one block per stripe. A shard that answers `NOT_FOUND` /
//! `DATA_LOSS`, cannot be reached, stalls, ends early or sends a block whose
//! CRC32C or length is wrong is failed for the rest of the read and the next
//! shard in preference order is opened at the current stripe. When a parity
//! shard is in use, the stripe's data blocks are reconstructed.
//!
//! Memory: each stripe takes a permit of `(k + m) * block_len` bytes from
//! the read budget before its blocks are fetched (room to reconstruct from
//! parity), keeps `k * block_len` of it once decoded, and releases that when
//! every chunk cut from the stripe has been dropped — by hyper, after
//! writing it to the client (each chunk is a `Bytes` whose owner holds the
//! permit). A reader therefore holds at most the stripe it is fetching and
//! the chunks of the previous one still being written. Read-ahead beyond
//! that sits in the datanode's channel and the HTTP/2 stream window.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use sluice_proto::datanode::GetShardRequest;
use sluice_proto::framing::BlockChunks;
use sluice_proto::meta::Placement;

use super::get_shard::{ShardStream, get_shard};
use super::shard_failure::ShardFailure;
use super::{BlobError, BlobStore, SHARD_STALL_TIMEOUT};
use crate::admission::{BufferPermit, held};
use crate::erasure::Codec;
use crate::layout::Layout;

/// State of one shard during a read.
enum Slot {
    /// Not opened (yet, or again: a failed shard's stream is dropped).
    Idle,
    /// Streaming blocks from the stripe being read onwards.
    Open(Box<ShardStream>),
}

struct StripeReader {
    store: BlobStore,
    codec: Codec,
    layout: Layout,
    blob_id: String,
    nodes: Vec<u64>,
    range: Range<u64>,
    /// Next stripe to read and the end of the stripes needed.
    next_stripe: u64,
    end_stripe: u64,
    /// Which shards are tried, in what order, and which have failed.
    plan: ReadPlan,
    slots: Vec<Slot>,
    /// Decoded bytes of the current stripe not yet yielded.
    out: VecDeque<Bytes>,
}

/// See [`BlobStore::read`].
pub(super) fn read_blob(
    store: &BlobStore,
    placement: &Placement,
    range: Range<u64>,
) -> BoxStream<'static, Result<Bytes, BlobError>> {
    if range.start >= range.end {
        return Box::pin(futures::stream::empty());
    }
    let reader = match StripeReader::new(store, placement, range) {
        Ok(r) => r,
        Err(e) => return Box::pin(futures::stream::once(async move { Err(e) })),
    };
    Box::pin(futures::stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        match reader.next_chunk().await {
            Ok(Some(bytes)) => Some((Ok(bytes), Some(reader))),
            Ok(None) => None,
            // The error is the last item.
            Err(e) => Some((Err(e), None)),
        }
    }))
}

impl StripeReader {
    fn new(store: &BlobStore, p: &Placement, range: Range<u64>) -> Result<Self, BlobError> {
        let unreadable = |reason: String| BlobError::Unreadable {
            blob_id: p.blob_id.clone(),
            reason,
        };
        let (k, m) = (p.data_shards as usize, p.parity_shards as usize);
        if k == 0 || m == 0 || p.block_size == 0 || p.nodes.len() != k + m {
            return Err(unreadable(format!(
                "malformed placement: {k}+{m} shards, block size {}, {} nodes",
                p.block_size,
                p.nodes.len()
            )));
        }
        if range.end > p.size {
            return Err(unreadable(format!(
                "range {range:?} is past the blob's {} bytes",
                p.size
            )));
        }
        let codec = if (k, m)
            == (
                store.inner.codec.data_shards(),
                store.inner.codec.parity_shards(),
            ) {
            store.inner.codec.clone()
        } else {
            Codec::new(k, m).map_err(|e| unreadable(e.to_string()))?
        };
        let layout = Layout::new(p.size, k, p.block_size as usize);
        let stripes = layout.stripes_for(&range);
        let plan = ReadPlan::new(k, &p.missing, &p.nodes, &store.inner.pool.live_ids());
        Ok(StripeReader {
            store: store.clone(),
            codec,
            layout,
            blob_id: p.blob_id.clone(),
            nodes: p.nodes.clone(),
            range,
            next_stripe: stripes.start,
            end_stripe: stripes.end,
            plan,
            slots: (0..k + m).map(|_| Slot::Idle).collect(),
            out: VecDeque::new(),
        })
    }

    /// The next piece of the range, `None` at its end.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, BlobError> {
        loop {
            if let Some(bytes) = self.out.pop_front() {
                return Ok(Some(bytes));
            }
            if self.next_stripe >= self.end_stripe {
                return Ok(None);
            }
            let s = self.next_stripe;
            let (data, permit) = self.fetch_stripe(s).await?;
            self.next_stripe += 1;
            let permit = Arc::new(permit);
            let wanted = self.layout.trim(s, &self.range);
            for (i, pieces) in data.into_iter().enumerate() {
                // The wanted part of the block, as offsets within it; cut
                // from the pieces that overlap it.
                let b = self.layout.data_block_range(s, i);
                let start = b.start.max(wanted.start) - b.start;
                let end = b.end.min(wanted.end).saturating_sub(b.start);
                let mut at = 0;
                for piece in pieces {
                    let len = piece.len();
                    let (from, to) = (start.max(at), end.min(at + len));
                    if from < to {
                        let slice = piece.slice(from - at..to - at);
                        self.out.push_back(held(slice, &permit));
                    }
                    at += len;
                }
            }
        }
    }

    /// The k data blocks of stripe `s` (zero-padded length), each as the
    /// pieces it was received in (one piece if reconstructed), and the
    /// read permit (`k * block_len` bytes) that accounts for them.
    async fn fetch_stripe(&mut self, s: u64) -> Result<(Vec<Vec<Bytes>>, BufferPermit), BlobError> {
        let k = self.codec.data_shards();
        let n = self.codec.total_shards();
        let block_len = self.layout.block_len(s);
        let mut permit = self.store.read_permit((n * block_len) as u64).await?;
        // Parity room is released once the data blocks are decoded.
        let parity_room = ((n - k) * block_len) as u64;
        let mut got: Vec<Option<BlockChunks>> = vec![None; n];
        let mut failures: Vec<String> = Vec::new();
        loop {
            let read: Vec<bool> = got.iter().map(Option::is_some).collect();
            let want = match self.plan.next(&read) {
                Next::Done => break,
                Next::Fetch(want) => want,
                Next::Short { readable } => {
                    return Err(BlobError::TooFewShards {
                        blob_id: self.blob_id.clone(),
                        reason: format!(
                            "stripe {s}: {readable} of {k} shards readable ({})",
                            if failures.is_empty() {
                                "others missing at write".into()
                            } else {
                                failures.join("; ")
                            }
                        ),
                    });
                }
            };
            let fetches = self
                .slots
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| want.contains(i))
                .map(|(i, slot)| {
                    let fetch = Fetch {
                        store: &self.store,
                        blob_id: &self.blob_id,
                        node: self.nodes[i],
                        shard: i,
                        stripe: s,
                        end_stripe: self.end_stripe,
                        block_len,
                    };
                    async move { (i, fetch.next_block(slot).await) }
                });
            for (i, result) in futures::future::join_all(fetches).await {
                match result {
                    Ok(block) => got[i] = Some(block),
                    Err(reason) => {
                        tracing::warn!(
                            blob_id = %self.blob_id, shard = i, node = self.nodes[i], stripe = s, error = %reason,
                            "shard unreadable, reading another shard instead"
                        );
                        failures.push(format!("shard {i} on node {}: {reason}", self.nodes[i]));
                        // The plan never picks it again; drop its stream.
                        self.plan.fail(i);
                        self.slots[i] = Slot::Idle;
                    }
                }
            }
        }
        if got[..k].iter().all(Option::is_some) {
            let data = got.into_iter().take(k).flatten().map(|b| b.data).collect();
            drop(permit.split(parity_room));
            return Ok((data, permit));
        }
        let mut blocks: Vec<Option<Vec<u8>>> = got
            .into_iter()
            .map(|b| b.map(|b| b.data.concat()))
            .collect();
        self.codec
            .reconstruct_data(&mut blocks)
            .map_err(|e| BlobError::Unreadable {
                blob_id: self.blob_id.clone(),
                reason: format!("stripe {s}: {e}"),
            })?;
        let data = blocks
            .into_iter()
            .take(k)
            .map(|b| {
                b.map(|b| vec![Bytes::from(b)])
                    .ok_or_else(|| BlobError::Unreadable {
                        blob_id: self.blob_id.clone(),
                        reason: format!("stripe {s}: reconstruction left a data block empty"),
                    })
            })
            .collect::<Result<Vec<Vec<Bytes>>, BlobError>>()?;
        drop(permit.split(parity_room));
        Ok((data, permit))
    }
}

/// One block fetch from one shard.
struct Fetch<'a> {
    store: &'a BlobStore,
    blob_id: &'a str,
    node: u64,
    shard: usize,
    stripe: u64,
    end_stripe: u64,
    block_len: usize,
}

/// Which shards a read uses: k of the n = `nodes.len()` shards, tried in
/// preference order — `0..n` (data shards first, so no decoding is needed
/// while they answer) without the placement's missing shards, those on
/// datanodes not in `live` moved (stably) to the end — skipping shards that
/// failed earlier in the read (they are not retried: a shard that failed
/// once is likely to fail again, and another is available or the read is
/// lost anyway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReadPlan {
    k: usize,
    preference: Vec<usize>,
    failed: Vec<bool>,
}

/// What a stripe's read does next ([`ReadPlan::next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// k shards are read: decode.
    Done,
    /// Fetch these shards' blocks (as many as are still needed).
    Fetch(Vec<usize>),
    /// Fewer than k shards can be read: the stripe is lost; `readable`
    /// counts those read plus those left to try.
    Short { readable: usize },
}

impl ReadPlan {
    pub(super) fn new(k: usize, missing: &[u32], nodes: &[u64], live: &[u64]) -> Self {
        let n = nodes.len();
        // Shards marked missing come last, not never: a node that was
        // down may be back with its shards intact before heal ran.
        let mut preference: Vec<usize> = (0..n).collect();
        preference.sort_by_key(|&i| (missing.contains(&(i as u32)), !live.contains(&nodes[i])));
        ReadPlan {
            k,
            preference,
            failed: vec![false; n],
        }
    }

    /// The shard indices in the order they are tried.
    #[cfg(test)]
    pub(super) fn preference(&self) -> &[usize] {
        &self.preference
    }

    /// The next step for a stripe of which the shards with `read[i]` are
    /// already read.
    pub(super) fn next(&self, read: &[bool]) -> Next {
        let have = read.iter().filter(|r| **r).count();
        if have >= self.k {
            return Next::Done;
        }
        let want: Vec<usize> = self
            .preference
            .iter()
            .copied()
            .filter(|&i| !read[i] && !self.failed[i])
            .take(self.k - have)
            .collect();
        if want.len() < self.k - have {
            Next::Short {
                readable: have + want.len(),
            }
        } else {
            Next::Fetch(want)
        }
    }

    /// Shard `i` failed: never tried again in this read.
    pub(super) fn fail(&mut self, i: usize) {
        self.failed[i] = true;
    }
}

impl Fetch<'_> {
    /// Reads block `stripe` of the shard, opening its stream at that block
    /// if needed. `Err` carries why the shard must not be used any more.
    async fn next_block(&self, slot: &mut Slot) -> Result<BlockChunks, ShardFailure> {
        if matches!(slot, Slot::Idle) {
            let channel = self.store.inner.pool.channel(self.node)?;
            let req = GetShardRequest {
                blob_id: self.blob_id.to_string(),
                shard_index: self.shard as u32,
                first_block: self.stripe,
                block_count: self.end_stripe - self.stripe,
            };
            let stream =
                match tokio::time::timeout(SHARD_STALL_TIMEOUT, get_shard(channel, &req)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(status)) => return Err((&status).into()),
                    Err(_) => return Err(ShardFailure::NoAnswer(SHARD_STALL_TIMEOUT)),
                };
            *slot = Slot::Open(Box::new(stream));
        }
        let Slot::Open(stream) = slot else {
            return Err(ShardFailure::AlreadyFailed);
        };
        let block = match tokio::time::timeout(SHARD_STALL_TIMEOUT, stream.message()).await {
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return Err(ShardFailure::EndedEarly(self.stripe)),
            Ok(Err(status)) => return Err((&status).into()),
            Err(_) => return Err(ShardFailure::NoBlock(SHARD_STALL_TIMEOUT)),
        };
        if block.len() != self.block_len {
            return Err(ShardFailure::BlockLength {
                block: self.stripe,
                got: block.len(),
                want: self.block_len,
            });
        }
        let computed = block.computed_crc32c();
        if computed != block.crc32c {
            return Err(ShardFailure::Checksum {
                block: self.stripe,
                stored: block.crc32c,
                computed,
            });
        }
        Ok(block)
    }
}

#[cfg(test)]
mod tests {
    use super::{Next, ReadPlan};

    fn preference(missing: &[u32], live: &[u64]) -> Vec<usize> {
        ReadPlan::new(3, missing, &[11, 12, 13, 14, 15], live)
            .preference()
            .to_vec()
    }

    #[test]
    fn shards_on_down_datanodes_are_tried_last() {
        // Every datanode live: data shards first, then parity.
        assert_eq!(preference(&[], &[11, 12, 13, 14, 15]), vec![0, 1, 2, 3, 4]);
        // Datanodes 11 and 12 down: parity before their data shards.
        assert_eq!(preference(&[], &[13, 14, 15]), vec![2, 3, 4, 0, 1]);
        // Missing shards are tried last, after those on down datanodes.
        assert_eq!(preference(&[3], &[13, 14, 15]), vec![2, 4, 0, 1, 3]);
        assert_eq!(preference(&[0, 2], &[]), vec![1, 3, 4, 0, 2]);
        // No live set known (not refreshed yet): the plain order.
        assert_eq!(preference(&[], &[]), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_stripe_reads_the_first_k_and_replaces_failed_shards_in_order() {
        // 3+2, all live.
        let mut plan = ReadPlan::new(3, &[], &[11, 12, 13, 14, 15], &[11, 12, 13, 14, 15]);
        let none = [false; 5];
        assert_eq!(plan.next(&none), Next::Fetch(vec![0, 1, 2]));
        // Shard 1 failed, 0 and 2 read: the first parity shard replaces it.
        plan.fail(1);
        let read = [true, false, true, false, false];
        assert_eq!(plan.next(&read), Next::Fetch(vec![3]));
        assert_eq!(plan.next(&[true, false, true, true, false]), Next::Done);
        // The next stripe starts without the failed shard.
        assert_eq!(plan.next(&none), Next::Fetch(vec![0, 2, 3]));
        // Two failed of five: still k = 3 left; a third failure loses it.
        plan.fail(3);
        assert_eq!(plan.next(&none), Next::Fetch(vec![0, 2, 4]));
        plan.fail(4);
        assert_eq!(
            plan.next(&[true, false, false, false, false]),
            Next::Short { readable: 2 }
        );
    }

    #[test]
    fn missing_shards_are_the_last_resort_of_a_read() {
        // Shards 0 and 4 missing at write: the other three are read first.
        let mut plan = ReadPlan::new(3, &[0, 4], &[11, 12, 13, 14, 15], &[]);
        assert_eq!(plan.next(&[false; 5]), Next::Fetch(vec![1, 2, 3]));
        // Shard 2 fails: a missing shard is tried rather than give up (its
        // node may be back with the shard intact).
        plan.fail(2);
        let read = [false, true, false, true, false];
        assert_eq!(plan.next(&read), Next::Fetch(vec![0]));
        plan.fail(0);
        assert_eq!(plan.next(&read), Next::Fetch(vec![4]));
        plan.fail(4);
        assert_eq!(plan.next(&read), Next::Short { readable: 2 });
    }
}
