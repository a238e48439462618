//! Byte credits: the datanode's write budget shared among gateways.
//!
//! [`CreditLedger`] is the pure, I/O-free accounting of the credit
//! protocol (the shape of openraft's engine): its methods mutate the
//! ledger, and [`CreditLedger::grants`] returns the grants to push to the
//! gateways. The service wraps it in a mutex and moves the grants onto the
//! `Credits` streams (see `grants.rs`).
//!
//! The protocol itself, as a gateway must implement it, is specified in
//! `sluice_proto::credit` (the wire contract); this module is the
//! datanode's side of it.
//!
//! # Fairness
//!
//! [`CreditLedger::grants`] pours the available bytes into the gateways
//! with demand, lowest holding first (holding = outstanding credit +
//! received bytes not yet fsynced), each capped by its demand: max-min
//! fairness. When every demanding gateway wants more than its share, each
//! ends up holding about `B / n`.

use std::collections::BTreeMap;

/// A gateway's self-chosen name on the credit protocol (see the module
/// docs for the rules, [`validate_gateway_id`]).
pub type GatewayId = String;

pub use sluice_proto::credit::MAX_GATEWAY_ID_LEN;
/// Most gateways that may hold a credit stream at once: the ledger's state
/// is one entry per connected gateway.
pub const MAX_GATEWAYS: usize = 1024;

/// Identifies one credit stream of a gateway; a reconnect gets a new one,
/// so a late disconnect of the old stream cannot drop the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Session(u64);

/// Why a credit operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreditError {
    #[error(
        "invalid gateway id {0:?}: want 1..={MAX_GATEWAY_ID_LEN} bytes of printable ASCII, no spaces"
    )]
    InvalidGatewayId(String),
    #[error("too many gateways: at most {MAX_GATEWAYS} credit streams at once")]
    TooManyGateways,
    /// The gateway has no open credit stream (never opened, or it broke).
    #[error("gateway {0:?} has no open Credits stream")]
    NotConnected(GatewayId),
}

/// Checks a gateway id: 1..=[`MAX_GATEWAY_ID_LEN`] bytes of printable
/// ASCII without spaces (it becomes a metric label and a log field).
pub fn validate_gateway_id(id: &str) -> Result<(), CreditError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_GATEWAY_ID_LEN
        && id.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(CreditError::InvalidGatewayId(
            id.chars().take(MAX_GATEWAY_ID_LEN + 8).collect(),
        ))
    }
}

/// One connected gateway's credit, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayCredit {
    pub session: Session,
    /// Granted and not yet spent (debited) or returned.
    pub outstanding: u64,
    /// Received from this gateway, not yet fsynced or discarded.
    pub in_flight: u64,
    /// Unmet demand last reported, minus what was granted since.
    pub wanted: u64,
}

impl GatewayCredit {
    /// What the gateway holds of the budget: `outstanding + in_flight`.
    pub fn holding(&self) -> u64 {
        self.outstanding.saturating_add(self.in_flight)
    }
}

/// Outcome of [`CreditLedger::debit`], in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Debit {
    /// Covered by the gateway's outstanding credit.
    pub credited: u64,
    /// Beyond it (a protocol violation; still counted in-flight).
    pub overdrawn: u64,
}

/// The credit accounting of one datanode. All amounts are bytes.
///
/// To ensure correctness the ledger keeps, after every method:
/// * `outstanding() + in_flight() <= budget()`, unless bytes arrived beyond
///   credit ([`Debit::overdrawn`]); then no grant is made until enough
///   in-flight bytes are released;
/// * [`grants`](Self::grants) never grants more than
///   [`available`](Self::available), nor to a gateway without demand, nor
///   beyond a gateway's demand;
/// * once every gateway has disconnected and every in-flight byte has been
///   persisted or discarded, `available() == budget()`: nothing leaks;
/// * its state is one entry per connected gateway, at most [`MAX_GATEWAYS`].
#[derive(Debug, Clone)]
pub struct CreditLedger {
    budget: u64,
    accounts: BTreeMap<GatewayId, GatewayCredit>,
    /// Σ `outstanding` over accounts.
    outstanding: u64,
    /// Σ `in_flight` over accounts, plus `orphan_in_flight`.
    in_flight: u64,
    /// In-flight bytes of gateways that have disconnected (or never
    /// connected): still in memory, owned by nobody.
    orphan_in_flight: u64,
    next_session: u64,
    violations: u64,
}

impl CreditLedger {
    /// An empty ledger sharing `budget` bytes.
    pub fn new(budget: u64) -> Self {
        CreditLedger {
            budget,
            accounts: BTreeMap::new(),
            outstanding: 0,
            in_flight: 0,
            orphan_in_flight: 0,
            next_session: 0,
            violations: 0,
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Credit granted to connected gateways and not yet spent or returned.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// Bytes received and not yet persisted or discarded.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// What may still be granted: `budget - outstanding - in_flight`
    /// (0 while overdrawn).
    pub fn available(&self) -> u64 {
        self.budget
            .saturating_sub(self.outstanding.saturating_add(self.in_flight))
    }

    /// Protocol violations seen: debits beyond credit and returns of more
    /// than was outstanding.
    pub fn violations(&self) -> u64 {
        self.violations
    }

    /// Number of connected gateways.
    pub fn gateways(&self) -> usize {
        self.accounts.len()
    }

    /// The credit of connected gateway `id`.
    pub fn gateway(&self, id: &str) -> Option<GatewayCredit> {
        self.accounts.get(id).copied()
    }

    /// A gateway opened its credit stream. If `id` was connected already,
    /// the old stream is superseded: its outstanding credit returns to the
    /// pool and its demand is forgotten (its in-flight bytes stay with it).
    /// Errors: [`CreditError::InvalidGatewayId`],
    /// [`CreditError::TooManyGateways`].
    pub fn connect(&mut self, id: &str) -> Result<Session, CreditError> {
        validate_gateway_id(id)?;
        let session = Session(self.next_session);
        if let Some(account) = self.accounts.get_mut(id) {
            self.outstanding -= account.outstanding;
            *account = GatewayCredit {
                session,
                outstanding: 0,
                in_flight: account.in_flight,
                wanted: 0,
            };
        } else {
            if self.accounts.len() >= MAX_GATEWAYS {
                return Err(CreditError::TooManyGateways);
            }
            self.accounts.insert(
                id.to_string(),
                GatewayCredit {
                    session,
                    outstanding: 0,
                    in_flight: 0,
                    wanted: 0,
                },
            );
        }
        self.next_session += 1;
        Ok(session)
    }

    /// The credit stream `session` of gateway `id` ended: its outstanding
    /// credit returns to the pool; its in-flight bytes stay counted until
    /// released. Returns false (and does nothing) if that stream was already
    /// superseded or gone.
    pub fn disconnect(&mut self, id: &str, session: Session) -> bool {
        match self.accounts.get(id) {
            Some(account) if account.session == session => {
                self.outstanding -= account.outstanding;
                self.orphan_in_flight += account.in_flight;
                self.accounts.remove(id);
                true
            }
            _ => false,
        }
    }

    /// The gateway reports its unmet demand (`wanted`, replacing the previous
    /// value; 0 = none) and gives back `returned` bytes of outstanding credit.
    /// Returning more than is outstanding returns all of it and counts a
    /// violation. Returns the bytes actually returned.
    /// Errors: [`CreditError::NotConnected`].
    pub fn report(&mut self, id: &str, wanted: u64, returned: u64) -> Result<u64, CreditError> {
        let Some(account) = self.accounts.get_mut(id) else {
            return Err(CreditError::NotConnected(id.to_string()));
        };
        let accepted = returned.min(account.outstanding);
        if accepted < returned {
            self.violations += 1;
        }
        account.outstanding -= accepted;
        account.wanted = wanted;
        self.outstanding -= accepted;
        Ok(accepted)
    }

    /// `bytes` of gateway `id` arrived: they move from its outstanding
    /// credit to in-flight. Bytes beyond its credit (or from a gateway that
    /// is not connected) are counted in-flight all the same, and the debit
    /// counts as one violation.
    pub fn debit(&mut self, id: &str, bytes: u64) -> Debit {
        let credited = match self.accounts.get_mut(id) {
            Some(account) => {
                let credited = bytes.min(account.outstanding);
                account.outstanding -= credited;
                account.in_flight += bytes;
                credited
            }
            None => {
                self.orphan_in_flight += bytes;
                0
            }
        };
        self.outstanding -= credited;
        self.in_flight += bytes;
        let overdrawn = bytes - credited;
        if overdrawn > 0 {
            self.violations += 1;
        }
        Debit {
            credited,
            overdrawn,
        }
    }

    /// `bytes` of gateway `id` are fsynced: they leave in-flight and can be
    /// granted again. Returns the bytes released (all of them unless the
    /// caller releases more than it debited, a bug).
    pub fn persisted(&mut self, id: &str, bytes: u64) -> u64 {
        self.release(id, bytes)
    }

    /// `bytes` of gateway `id` were dropped unwritten (their stream failed
    /// or was cancelled): they no longer occupy memory, so they leave
    /// in-flight like [`persisted`](Self::persisted) bytes.
    pub fn discarded(&mut self, id: &str, bytes: u64) -> u64 {
        self.release(id, bytes)
    }

    fn release(&mut self, id: &str, bytes: u64) -> u64 {
        let mut left = bytes;
        if let Some(account) = self.accounts.get_mut(id) {
            let n = left.min(account.in_flight);
            account.in_flight -= n;
            left -= n;
        }
        // Bytes debited under an earlier stream of this gateway.
        let n = left.min(self.orphan_in_flight);
        self.orphan_in_flight -= n;
        left -= n;
        debug_assert_eq!(left, 0, "released more bytes than were in flight");
        let released = bytes - left;
        self.in_flight -= released;
        released
    }

    /// Shares the available bytes among the gateways with demand and
    /// records them as outstanding; returns `(gateway, bytes)` to push, in
    /// gateway id order, without zeros.
    ///
    /// Max-min fair: the bytes are poured into the demanding gateways
    /// lowest [holding](GatewayCredit::holding) first, none above its
    /// holding plus its demand, and no gateway is raised above another that
    /// still wants more (to the byte). Work-conserving: afterwards either
    /// nothing is available or no gateway wants more.
    pub fn grants(&mut self) -> Vec<(GatewayId, u64)> {
        let available = self.available();
        if available == 0 {
            return Vec::new();
        }
        // (holding, cap = holding + wanted) of each demanding gateway.
        let demand: Vec<(u128, u128)> = self
            .accounts
            .values()
            .filter(|a| a.wanted > 0)
            .map(|a| {
                let h = u128::from(a.holding());
                (h, h + u128::from(a.wanted))
            })
            .collect();
        if demand.is_empty() {
            return Vec::new();
        }
        let wanted: u128 = demand.iter().map(|(h, c)| c - h).sum();
        let pour = wanted.min(u128::from(available));
        let filled = |level: u128| -> u128 {
            demand
                .iter()
                .map(|&(h, c)| level.clamp(h, c) - h)
                .sum::<u128>()
        };
        // The highest water level that does not pour more than `pour`.
        let (mut lo, mut hi) = (0u128, demand.iter().map(|&(_, c)| c).max().unwrap_or(0));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if filled(mid) <= pour {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let level = lo;
        // Fewer bytes than gateways still rising at `level`: one each.
        let mut leftover = pour - filled(level);

        let mut out = Vec::new();
        for (id, account) in self.accounts.iter_mut().filter(|(_, a)| a.wanted > 0) {
            let h = u128::from(account.holding());
            let c = h + u128::from(account.wanted);
            let mut grant = level.clamp(h, c) - h;
            if leftover > 0 && h <= level && level < c {
                grant += 1;
                leftover -= 1;
            }
            // grant <= wanted <= u64::MAX.
            let grant = u64::try_from(grant).unwrap_or(account.wanted);
            if grant == 0 {
                continue;
            }
            account.outstanding += grant;
            account.wanted -= grant;
            self.outstanding += grant;
            out.push((id.clone(), grant));
        }
        out
    }

    /// Checks the ledger's internal sums (for tests and debug assertions).
    pub fn check_consistency(&self) -> Result<(), String> {
        let outstanding: u64 = self.accounts.values().map(|a| a.outstanding).sum();
        let in_flight: u64 =
            self.accounts.values().map(|a| a.in_flight).sum::<u64>() + self.orphan_in_flight;
        if outstanding != self.outstanding {
            return Err(format!(
                "Σ outstanding {outstanding} != total {}",
                self.outstanding
            ));
        }
        if in_flight != self.in_flight {
            return Err(format!(
                "Σ in-flight {in_flight} != total {}",
                self.in_flight
            ));
        }
        if self.accounts.len() > MAX_GATEWAYS {
            return Err(format!("{} accounts", self.accounts.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
