//! Reused buffers for full stripes on the write path.
//!
//! A full stripe (k blocks of `block_size` payload) and its m parity
//! blocks live in one buffer of `(k + m) * block_size` bytes; the blocks
//! sent to the datanodes are `Bytes` slices of it. When the last slice is
//! dropped (HTTP/2 wrote it, or the stream was reset) the buffer goes back
//! to the free list here instead of to the allocator.
//!
//! Why: the process's malloc gives every allocation of 128 KiB or more its
//! own mapping and unmaps it on free (`sluice/src/malloc.rs`, so RSS
//! follows the budgets), so a fresh 1.5 MiB stripe buffer costs a page
//! fault per 4 KiB page, the kernel's zeroing of each page, and an unmap
//! with its TLB flush, on every stripe. A reused buffer costs none of it
//! (these costs show in a PutObject load's profile; see bench/RESULTS.md).
//!
//! Bound: idle buffers are kept only inside the unused part of the write
//! budget, so buffers in use (each under its stripe's permit) and idle
//! ones together stay within `buffer_budget_bytes` and the memory formula
//! needs no term of its own. A returned buffer is kept only if the idle
//! ones, itself included, fit in the bytes no permit holds right then (and
//! at most `max_idle` are kept); every new write-budget permit is followed
//! by [`StripeBuffers::trim`], which frees idle buffers until they fit
//! again, before the permit's holder allocates anything. So after a burst
//! up to `MAX_IDLE_STRIPE_BUFFERS` buffers (48 MiB with 4+2 and 256 KiB
//! blocks) stay resident while the budget is unused; and when the budget
//! is saturated (writers waiting for permits), no buffer fits and stripes
//! are allocated and unmapped as before this pool.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use crate::admission::BufferBudget;

/// Buffers of one size, reused; see the module docs.
pub(crate) struct StripeBuffers {
    inner: Arc<Free>,
}

struct Free {
    /// Length of every buffer: `(k + m) * block_size`.
    len: usize,
    /// Most buffers kept in `list`; beyond it a returned buffer is freed.
    max_idle: usize,
    list: Mutex<Vec<Vec<u8>>>,
    /// The write budget whose unused bytes idle buffers must fit in.
    budget: Arc<BufferBudget>,
}

impl Free {
    /// Whether `count` idle buffers fit in the budget's unused bytes.
    fn fits(&self, count: usize) -> bool {
        count <= self.max_idle && (count as u64) * (self.len as u64) <= self.budget.available()
    }
}

impl StripeBuffers {
    /// Buffers of `len` bytes, keeping at most `max_idle` unused ones and
    /// never more than `budget`'s unused bytes hold.
    pub(crate) fn new(len: usize, max_idle: usize, budget: Arc<BufferBudget>) -> Self {
        StripeBuffers {
            inner: Arc::new(Free {
                len,
                max_idle,
                list: Mutex::new(Vec::with_capacity(max_idle)),
                budget,
            }),
        }
    }

    /// Frees idle buffers until the rest fit in the budget's unused bytes;
    /// called after each new permit of the budget (see the module docs).
    pub(crate) fn trim(&self) {
        let freed: Vec<Vec<u8>> = {
            let mut list = self
                .inner
                .list
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut keep = list.len();
            while keep > 0 && !self.inner.fits(keep) {
                keep -= 1;
            }
            list.split_off(keep)
        };
        // Unmapped outside the lock.
        drop(freed);
    }

    /// A buffer of `(k + m) * block_size` bytes whose content is whatever
    /// its last user left there: a reused one when one is free, else a new
    /// (zeroed) one.
    pub(crate) fn take(&self) -> StripeBuffer {
        let reused = self
            .inner
            .list
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        StripeBuffer {
            buf: reused.unwrap_or_else(|| vec![0; self.inner.len]),
            home: Arc::clone(&self.inner),
        }
    }

    /// Buffers waiting in the free list.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.inner.list.lock().unwrap().len()
    }
}

/// One buffer out of [`StripeBuffers`]; goes back to it when dropped.
pub(crate) struct StripeBuffer {
    buf: Vec<u8>,
    home: Arc<Free>,
}

impl StripeBuffer {
    /// The whole buffer, to fill.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The buffer as `Bytes` (no copy); it returns to its free list when
    /// the last slice of these `Bytes` is dropped.
    pub(crate) fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for StripeBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for StripeBuffer {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut list = self
            .home
            .list
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.home.fits(list.len() + 1) {
            list.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{BudgetKind, GatewayStats};

    fn budget(bytes: u64) -> Arc<BufferBudget> {
        BufferBudget::new(BudgetKind::Write, bytes, GatewayStats::new())
    }

    #[test]
    fn a_dropped_buffer_is_reused_once_every_slice_is_gone() {
        let pool = StripeBuffers::new(16, 2, budget(64));
        let mut buf = pool.take();
        buf.as_mut_slice().copy_from_slice(&[7; 16]);
        let first = buf.as_ref().as_ptr();
        let bytes = buf.freeze();
        let slice = bytes.slice(4..8);
        drop(bytes);
        assert_eq!(pool.idle(), 0, "a slice still holds the buffer");
        assert_eq!(slice.as_ref(), &[7; 4]);
        drop(slice);
        assert_eq!(pool.idle(), 1);
        let again = pool.take();
        assert_eq!(again.as_ref().as_ptr(), first, "the same allocation");
        assert_eq!(again.as_ref(), &[7; 16], "content is left as it was");
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn at_most_max_idle_buffers_are_kept() {
        let pool = StripeBuffers::new(8, 2, budget(1024));
        let taken: Vec<StripeBuffer> = (0..5).map(|_| pool.take()).collect();
        assert!(taken.iter().all(|b| b.as_ref().len() == 8));
        drop(taken);
        assert_eq!(pool.idle(), 2);
        // Buffers are only allocated when none is free: two come back from
        // the list, the third is new.
        let again: Vec<StripeBuffer> = (0..3).map(|_| pool.take()).collect();
        assert_eq!(pool.idle(), 0);
        drop(again);
        assert_eq!(pool.idle(), 2);
    }

    #[test]
    fn idle_buffers_stay_inside_the_unused_budget() {
        let budget = budget(40);
        let pool = StripeBuffers::new(10, 8, Arc::clone(&budget));
        let held = budget.try_acquire(15).expect("15 of 40 bytes");
        // 25 bytes unused: room for two idle buffers of 10, not three.
        drop((0..3).map(|_| pool.take()).collect::<Vec<_>>());
        assert_eq!(pool.idle(), 2);
        // A new permit leaves 5 bytes unused: trim frees both.
        let more = budget.try_acquire(20).expect("20 of the 25 left");
        pool.trim();
        assert_eq!(pool.idle(), 0);
        drop(pool.take());
        assert_eq!(pool.idle(), 0, "5 unused bytes hold no buffer of 10");
        drop((held, more));
        drop((0..2).map(|_| pool.take()).collect::<Vec<_>>());
        assert_eq!(pool.idle(), 2);
        pool.trim();
        assert_eq!(pool.idle(), 2, "nothing to trim with the budget unused");
    }
}
