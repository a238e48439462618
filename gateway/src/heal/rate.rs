//! Heal's rate limit and its yield rule.
//!
//! * [`TokenBucket`] caps the shard bytes heal writes
//!   (`heal_bandwidth_bytes_per_sec`): pure arithmetic over an `Instant`
//!   the caller passes, so it is tested without a clock.
//! * [`should_yield`] is the rule "heal pauses while client requests wait
//!   for write buffers", read from [`GatewayStats::buffer_waiting`].
//! * [`HealGate`] puts both together for the worker: it waits for the
//!   bucket and for the gateway to be idle enough, then takes a stripe
//!   permit from the client write budget without ever queueing for it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admission::{BufferPermit, GatewayStats};
use crate::blob::BlobStore;

/// How long heal sleeps between two looks at the write budget while it
/// yields to client requests or finds no free buffer.
pub const YIELD_POLL: Duration = Duration::from_millis(20);

/// A token bucket over bytes: `rate` bytes per second refill, at most
/// `burst` bytes banked. A take larger than the burst is allowed once the
/// bucket is full (it then goes into debt), so one block bigger than the
/// burst is never stuck.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Refill, bytes per second (> 0).
    rate: u64,
    /// Most bytes banked.
    burst: u64,
    /// Bytes banked; negative while in debt.
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket refilling `rate` bytes per second with `burst` bytes of
    /// capacity (both at least 1).
    pub fn new(rate: u64, burst: u64, now: Instant) -> Self {
        let burst = burst.max(1);
        TokenBucket {
            rate: rate.max(1),
            burst,
            tokens: burst as f64,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.burst as f64);
    }

    /// Takes `bytes` if the bucket allows it at `now`: returns `None` when
    /// taken, else how long to wait before trying again.
    pub fn try_take(&mut self, bytes: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        let need = (bytes as f64).min(self.burst as f64);
        if self.tokens >= need {
            self.tokens -= bytes as f64;
            return None;
        }
        let short = need - self.tokens;
        Some(Duration::from_secs_f64(short / self.rate as f64).max(Duration::from_millis(1)))
    }

    /// Bytes banked at `now` (negative while in debt).
    pub fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }
}

/// Whether heal must pause before taking its next stripe permit: while
/// any client request waits for a write buffer (`buffer_waiting`
/// requests), heal leaves the budget to them.
pub fn should_yield(buffer_waiting: u64) -> bool {
    buffer_waiting > 0
}

/// Why [`HealGate`] gave up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GateError {
    /// The write budget stayed busy (client requests waiting, or no free
    /// buffer) for the whole wait.
    #[error("write budget busy for {0:?}")]
    Busy(Duration),
    /// The permit asked for exceeds the budget itself.
    #[error("a heal stripe of {bytes} bytes exceeds the write budget of {budget}")]
    TooLarge { bytes: u64, budget: u64 },
    /// Heal is disabled (`heal_bandwidth_bytes_per_sec = 0`).
    #[error("heal bandwidth is 0: heal disabled")]
    Disabled,
}

/// One heal stripe's share of the client write budget: the budget permit
/// and one of the `heal_concurrency` stripe slots. Both are released when
/// it drops (after the stripe's last block left for the datanode).
pub struct HealStripe {
    permit: BufferPermit,
    _slot: OwnedSemaphorePermit,
}

impl HealStripe {
    /// Budget bytes held.
    pub fn bytes(&self) -> u64 {
        self.permit.bytes()
    }
}

/// The bandwidth cap and the buffer rule shared by every heal task of a
/// gateway.
pub struct HealGate {
    bucket: Option<Mutex<TokenBucket>>,
    /// At most this many heal stripes hold budget at once.
    slots: Arc<Semaphore>,
    max_stripes: usize,
    stats: GatewayStats,
    /// Longest a stripe waits for a permit before the blob is given up
    /// (retried on a later pass).
    max_wait: Duration,
}

impl HealGate {
    /// `bytes_per_sec` = 0 disables heal; the bucket's burst is one second
    /// of bandwidth. At most `max_stripes` (>= 1) stripes hold budget at
    /// once; a stripe waits at most `max_wait` for its permit.
    pub fn new(
        bytes_per_sec: u64,
        max_stripes: usize,
        stats: GatewayStats,
        max_wait: Duration,
    ) -> Self {
        HealGate {
            slots: Arc::new(Semaphore::new(max_stripes.max(1))),
            bucket: (bytes_per_sec > 0).then(|| {
                Mutex::new(TokenBucket::new(
                    bytes_per_sec,
                    bytes_per_sec,
                    Instant::now(),
                ))
            }),
            max_stripes: max_stripes.max(1),
            stats,
            max_wait,
        }
    }

    /// Waits until the bucket grants `bytes` shard bytes.
    pub async fn throttle(&self, bytes: u64) -> Result<(), GateError> {
        let Some(bucket) = &self.bucket else {
            return Err(GateError::Disabled);
        };
        loop {
            let wait = bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .try_take(bytes, Instant::now());
            match wait {
                None => return Ok(()),
                Some(d) => tokio::time::sleep(d).await,
            }
        }
    }

    /// Stripes holding budget right now.
    pub fn stripe_holds(&self) -> usize {
        self.max_stripes - self.slots.available_permits()
    }

    /// A stripe permit of `bytes` from the client write budget, taken only
    /// while no client request waits for one and never by queueing (so
    /// heal cannot delay a client), and only when fewer than `max_stripes`
    /// heal stripes hold budget. Waits at most `max_wait`.
    pub async fn stripe_permit(
        &self,
        store: &BlobStore,
        bytes: u64,
    ) -> Result<HealStripe, GateError> {
        let budget = store.heal_write_budget_bytes();
        if bytes > budget {
            return Err(GateError::TooLarge { bytes, budget });
        }
        let deadline = Instant::now() + self.max_wait;
        let slot = tokio::time::timeout(self.max_wait, Arc::clone(&self.slots).acquire_owned())
            .await
            .map_err(|_| GateError::Busy(self.max_wait))?
            .map_err(|_| GateError::Busy(self.max_wait))?;
        loop {
            if !should_yield(self.stats.buffer_waiting())
                && let Some(permit) = store.heal_try_write_permit(bytes)
            {
                return Ok(HealStripe {
                    permit,
                    _slot: slot,
                });
            }
            if Instant::now() >= deadline {
                return Err(GateError::Busy(self.max_wait));
            }
            tokio::time::sleep(YIELD_POLL).await;
        }
    }
}
