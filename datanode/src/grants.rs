//! [`CreditHub`]: the [`CreditLedger`] behind a mutex, wired to the
//! `Credits` streams and to the PutShard writers.
//!
//! Every ledger change (connect, report, debit, release, disconnect) is
//! followed by a grant round; each grant is added to the gateway's
//! [`Mailbox`] (a coalescing counter, never blocking the caller) and its
//! forwarding task moves it into that stream's channel of
//! [`CREDIT_GRANT_CHANNEL_DEPTH`] messages. The mutex is held only for the
//! ledger arithmetic; metrics are published after it is released.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::credit::{CreditError, CreditLedger, Debit, GatewayId, Session};
use crate::metrics;

/// Grant messages buffered per `Credits` stream. When a gateway does not
/// read them, further grants coalesce in a per-gateway counter instead.
pub const CREDIT_GRANT_CHANNEL_DEPTH: usize = 16;

/// Grants waiting to be sent on one gateway's `Credits` stream.
pub(crate) struct Mailbox {
    /// Bytes granted and not yet handed to the stream.
    pending: AtomicU64,
    /// Woken when `pending` grows (a stored permit: no lost wake-ups).
    notify: Notify,
    /// Cancelled when a newer stream of the same gateway replaces this one.
    pub(crate) replaced: CancellationToken,
}

impl Mailbox {
    /// Waits until grants may be pending.
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Takes every pending byte (0 if none).
    pub(crate) fn take(&self) -> u64 {
        self.pending.swap(0, Ordering::AcqRel)
    }
}

struct State {
    ledger: CreditLedger,
    /// Exactly the gateways connected in `ledger`.
    mailboxes: HashMap<GatewayId, Arc<Mailbox>>,
}

/// What to publish after a change, gathered under the lock.
struct Published {
    in_flight: u64,
    available: u64,
    /// `(gateway, outstanding)` of the gateways the change touched.
    granted: Vec<(GatewayId, u64)>,
    violations: u64,
}

/// Shared by the service handlers; cheap to clone through an `Arc`.
pub(crate) struct CreditHub {
    state: Mutex<State>,
    budget: u64,
    node_label: String,
}

impl CreditHub {
    pub(crate) fn new(budget: u64, node_label: String) -> Arc<Self> {
        let hub = Arc::new(CreditHub {
            state: Mutex::new(State {
                ledger: CreditLedger::new(budget),
                mailboxes: HashMap::new(),
            }),
            budget,
            node_label,
        });
        metrics::set_credit_totals(&hub.node_label, budget, 0, budget);
        hub
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new `Credits` stream of gateway `id`, superseding (and
    /// cancelling) an older stream of the same id.
    /// Errors: [`CreditError::InvalidGatewayId`], [`CreditError::TooManyGateways`].
    pub(crate) fn connect(&self, id: &str) -> Result<(Session, Arc<Mailbox>), CreditError> {
        let mut state = self.lock();
        let session = state.ledger.connect(id)?;
        let mailbox = Arc::new(Mailbox {
            pending: AtomicU64::new(0),
            notify: Notify::new(),
            replaced: CancellationToken::new(),
        });
        if let Some(old) = state.mailboxes.insert(id.to_string(), Arc::clone(&mailbox)) {
            old.replaced.cancel();
        }
        let published = self.dispatch(&mut state, Some(id), 0);
        drop(state);
        self.publish(published);
        Ok((session, mailbox))
    }

    /// The `Credits` stream `session` of gateway `id` ended; its credit
    /// returns to the pool (nothing happens if it was superseded).
    pub(crate) fn disconnect(&self, id: &str, session: Session) {
        let mut state = self.lock();
        if !state.ledger.disconnect(id, session) {
            return;
        }
        state.mailboxes.remove(id);
        let published = self.dispatch(&mut state, Some(id), 0);
        drop(state);
        self.publish(published);
    }

    /// A `ReportCredits` call. Errors: [`CreditError::NotConnected`].
    pub(crate) fn report(&self, id: &str, wanted: u64, returned: u64) -> Result<(), CreditError> {
        let mut state = self.lock();
        let before = state.ledger.violations();
        let accepted = state.ledger.report(id, wanted, returned)?;
        let violations = state.ledger.violations() - before;
        let published = self.dispatch(&mut state, Some(id), violations);
        drop(state);
        if accepted < returned {
            tracing::debug!(
                gateway = id,
                returned,
                accepted,
                "gateway returned more credit than it held"
            );
        }
        self.publish(published);
        Ok(())
    }

    /// The write budget shared among gateways, bytes.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// Credit granted and not returned plus bytes received and not yet
    /// fsynced: the part of the budget in use, bytes.
    pub(crate) fn in_use(&self) -> u64 {
        self.budget.saturating_sub(self.lock().ledger.available())
    }

    /// Shard bytes of gateway `id` arrived.
    pub(crate) fn debit(&self, id: &str, bytes: u64) -> Debit {
        let mut state = self.lock();
        let debit = state.ledger.debit(id, bytes);
        let violations = u64::from(debit.overdrawn > 0);
        let published = self.dispatch(&mut state, Some(id), violations);
        drop(state);
        self.publish(published);
        debit
    }

    /// Bytes received and not yet fsynced or discarded (tests).
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> u64 {
        self.lock().ledger.in_flight()
    }

    /// Shard bytes of gateway `id` are fsynced (`persisted`) or were
    /// dropped unwritten: either way they leave in-flight.
    pub(crate) fn release(&self, id: &str, bytes: u64, persisted: bool) {
        if bytes == 0 {
            return;
        }
        let mut state = self.lock();
        if persisted {
            state.ledger.persisted(id, bytes);
        } else {
            state.ledger.discarded(id, bytes);
        }
        let published = self.dispatch(&mut state, None, 0);
        drop(state);
        self.publish(published);
    }

    /// Runs a grant round and delivers it to the mailboxes.
    fn dispatch(&self, state: &mut State, touched: Option<&str>, violations: u64) -> Published {
        let grants = state.ledger.grants();
        let mut granted = Vec::with_capacity(grants.len() + 1);
        for (id, bytes) in grants {
            match state.mailboxes.get(&id) {
                Some(mailbox) => {
                    mailbox.pending.fetch_add(bytes, Ordering::AcqRel);
                    mailbox.notify.notify_one();
                }
                // Unreachable: mailboxes mirror the ledger's gateways.
                None => tracing::error!(gateway = %id, "grant for a gateway without a mailbox"),
            }
            let outstanding = state.ledger.gateway(&id).map_or(0, |c| c.outstanding);
            granted.push((id, outstanding));
        }
        if let Some(id) = touched
            && !granted.iter().any(|(g, _)| g == id)
        {
            let outstanding = state.ledger.gateway(id).map_or(0, |c| c.outstanding);
            granted.push((id.to_string(), outstanding));
        }
        debug_assert_eq!(state.ledger.check_consistency(), Ok(()));
        Published {
            in_flight: state.ledger.in_flight(),
            available: state.ledger.available(),
            granted,
            violations,
        }
    }

    fn publish(&self, p: Published) {
        let node = &self.node_label;
        metrics::set_credit_totals(node, self.budget, p.in_flight, p.available);
        for (gateway, outstanding) in &p.granted {
            metrics::set_credit_granted(node, gateway, *outstanding);
        }
        if p.violations > 0 {
            metrics::add_credit_violations(node, p.violations);
        }
    }
}

/// The credit held by one PutShard stream: debits each received block and
/// releases bytes as the writer fsyncs them. Dropping it (the stream failed
/// or was cancelled) releases whatever is still held.
pub(crate) struct StreamCredit {
    hub: Arc<CreditHub>,
    gateway: GatewayId,
    /// Debited and not yet released, in bytes.
    held: AtomicU64,
}

impl StreamCredit {
    pub(crate) fn new(hub: Arc<CreditHub>, gateway: GatewayId) -> Self {
        StreamCredit {
            hub,
            gateway,
            held: AtomicU64::new(0),
        }
    }

    pub(crate) fn gateway(&self) -> &str {
        &self.gateway
    }

    /// A block of `bytes` arrived.
    pub(crate) fn debit(&self, bytes: u64) -> Debit {
        self.held.fetch_add(bytes, Ordering::AcqRel);
        self.hub.debit(&self.gateway, bytes)
    }

    /// `bytes` already debited are fsynced.
    pub(crate) fn persisted(&self, bytes: u64) {
        let prev = self.held.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(prev >= bytes, "persisted {bytes} of {prev} held");
        self.hub.release(&self.gateway, bytes, true);
    }
}

impl StreamCredit {
    /// Every byte still held is fsynced (the shard is committed).
    pub(crate) fn persisted_all(&self) {
        let held = self.held.swap(0, Ordering::AcqRel);
        self.hub.release(&self.gateway, held, true);
    }
}

impl Drop for StreamCredit {
    fn drop(&mut self) {
        let held = *self.held.get_mut();
        self.hub.release(&self.gateway, held, false);
    }
}

/// Ends a gateway's session when its `Credits` forwarding task ends, by any
/// path (client gone, replaced, shutdown, task aborted).
pub(crate) struct SessionGuard {
    pub(crate) hub: Arc<CreditHub>,
    pub(crate) gateway: GatewayId,
    pub(crate) session: Session,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.hub.disconnect(&self.gateway, self.session);
        tracing::debug!(gateway = %self.gateway, "credit stream closed");
    }
}
