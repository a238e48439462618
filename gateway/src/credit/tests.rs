//! Unit tests of the pure [`Balance`] accounting.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{Balance, Report};

const IDLE: Duration = Duration::from_secs(2);
const PREFETCH: u64 = 64;

fn tokens(served: Vec<(u64, char)>) -> Vec<char> {
    served.into_iter().map(|(_, t)| t).collect()
}

#[test]
fn debits_are_served_in_fifo_order() {
    let now = Instant::now();
    let mut b = Balance::new(now);
    b.connected();
    assert!(tokens(b.grant(100, now)).is_empty());
    assert!(b.try_debit(60, now));
    assert_eq!(b.available(), 40);
    assert!(!b.try_debit(50, now), "not enough");
    b.enqueue(50, 'a', now);
    assert!(!b.try_debit(10, now), "10 would fit, but 'a' is first");
    b.enqueue(10, 'b', now);
    assert_eq!((b.waiting(), b.waiters()), (60, 2));
    assert_eq!(tokens(b.grant(5, now)), Vec::<char>::new());
    assert_eq!(tokens(b.grant(15, now)), vec!['a', 'b']);
    assert_eq!((b.available(), b.waiting(), b.waiters()), (0, 0, 0));
}

#[test]
fn a_cancelled_head_unblocks_the_queue() {
    let now = Instant::now();
    let mut b = Balance::new(now);
    b.connected();
    let a = b.enqueue(100, 'a', now);
    let c = b.enqueue(10, 'c', now);
    assert!(tokens(b.grant(50, now)).is_empty());
    let (queued, served) = b.cancel(a, now);
    assert!(queued);
    assert_eq!(tokens(served), vec!['c']);
    assert_eq!((b.available(), b.waiting()), (40, 0));
    assert!(!b.cancel(c, now).0, "already served");
    assert_eq!(tokens(b.refund(10, now)), Vec::<char>::new());
    assert_eq!(b.available(), 50);
}

#[test]
fn demand_is_reported_when_it_grows() {
    let now = Instant::now();
    let mut b: Balance<char> = Balance::new(now);
    b.enqueue(300, 'a', now);
    assert_eq!(b.plan(now, IDLE, PREFETCH), None, "no stream, no report");
    b.connected();
    b.grant(0, now);
    assert_eq!(
        b.plan(now, IDLE, PREFETCH),
        Some(Report {
            wanted: 300 + PREFETCH,
            returned: 0
        })
    );
    assert_eq!(b.plan(now, IDLE, PREFETCH), None, "already on record");
    // A partial grant lowers both sides alike: nothing new to say.
    assert!(b.grant(200, now).is_empty());
    assert_eq!(b.plan(now, IDLE, PREFETCH), None);
    // More demand: report the new total.
    b.enqueue(100, 'b', now);
    assert_eq!(
        b.plan(now, IDLE, PREFETCH),
        Some(Report {
            wanted: 400 - 200 + PREFETCH,
            returned: 0
        })
    );
    // A failed report is sent again.
    b.report_failed();
    assert_eq!(
        b.plan(now, IDLE, PREFETCH),
        Some(Report {
            wanted: 200 + PREFETCH,
            returned: 0
        })
    );
    assert_eq!(tokens(b.grant(200 + PREFETCH, now)), vec!['a', 'b']);
    assert_eq!(b.available(), PREFETCH);
}

#[test]
fn idle_credit_is_returned_after_the_timeout() {
    let t0 = Instant::now();
    let mut b: Balance<char> = Balance::new(t0);
    b.connected();
    b.grant(500, t0);
    assert_eq!(b.idle_deadline(IDLE), Some(t0 + IDLE));
    assert_eq!(b.plan(t0 + IDLE / 2, IDLE, PREFETCH), None);
    // Spending resets the idle clock.
    let t1 = t0 + IDLE / 2;
    assert!(b.try_debit(100, t1));
    assert_eq!(b.plan(t0 + IDLE, IDLE, PREFETCH), None);
    assert_eq!(
        b.plan(t1 + IDLE, IDLE, PREFETCH),
        Some(Report {
            wanted: 0,
            returned: 400
        })
    );
    assert_eq!(b.available(), 0);
    assert_eq!(b.plan(t1 + 2 * IDLE, IDLE, PREFETCH), None);
    assert_eq!(b.idle_deadline(IDLE), None);
}

#[test]
fn a_broken_stream_forfeits_the_balance_but_keeps_the_queue() {
    let now = Instant::now();
    let mut b = Balance::new(now);
    b.connected();
    b.grant(500, now);
    b.enqueue(600, 'a', now);
    assert_eq!(b.forget(), 500);
    assert!(!b.is_connected());
    assert_eq!((b.available(), b.waiting()), (0, 600));
    assert_eq!(b.plan(now, IDLE, PREFETCH), None);
    b.connected();
    assert_eq!(
        b.plan(now, IDLE, PREFETCH),
        Some(Report {
            wanted: 600 + PREFETCH,
            returned: 0
        })
    );
    assert_eq!(b.drain_waiters(), vec!['a']);
    assert_eq!(b.waiting(), 0);
}

/// Random interleavings of grants, debits, cancellations, reports and
/// broken streams: every byte granted is spent, held, returned or
/// forfeited; returns never exceed the balance; debits are served in order.
#[test]
fn randomized_interleavings_conserve_credit() {
    let seed: u64 = std::env::var("SLUICE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xC4ED17);
    eprintln!("SLUICE_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut b: Balance<u64> = Balance::new(start);
    let (mut granted, mut spent, mut returned, mut forfeited) = (0u64, 0u64, 0u64, 0u64);
    let mut queued: Vec<(u64, u64)> = Vec::new(); // (id, bytes) in order
    let mut last_served: Option<u64> = None;
    let mut clock = Duration::ZERO;
    for _ in 0..20_000 {
        clock += Duration::from_millis(rng.gen_range(0..400));
        let now = start + clock;
        let mut served = Vec::new();
        match rng.gen_range(0..100) {
            0..=24 => {
                let bytes = rng.gen_range(1..=1000);
                if b.try_debit(bytes, now) {
                    spent += bytes;
                } else {
                    let id = b.enqueue(bytes, 0, now);
                    queued.push((id, bytes));
                }
            }
            25..=49 => {
                if b.is_connected() {
                    let bytes = rng.gen_range(0..=1500);
                    granted += bytes;
                    served = b.grant(bytes, now);
                }
            }
            50..=59 => {
                if !queued.is_empty() {
                    let (id, _) = queued.remove(rng.gen_range(0..queued.len()));
                    let (was, s) = b.cancel(id, now);
                    assert!(was, "queued debit {id} not found");
                    served = s;
                }
            }
            60..=84 => {
                let before = b.available();
                if let Some(r) = b.plan(now, IDLE, PREFETCH) {
                    assert!(r.returned <= before, "returned {} of {before}", r.returned);
                    returned += r.returned;
                    if r.wanted > 0 {
                        assert!(b.waiting() > 0, "demand without waiters");
                    }
                }
            }
            85..=89 => forfeited += b.forget(),
            _ => b.connected(),
        }
        // Served debits leave the front of the queue, in order.
        for (bytes, _) in &served {
            let (id, want) = queued.remove(0);
            assert_eq!(*bytes, want, "served out of order");
            assert!(last_served.is_none_or(|l| id > l));
            last_served = Some(id);
            spent += bytes;
        }
        assert_eq!(
            b.available(),
            granted - spent - returned - forfeited,
            "credit leaked or appeared"
        );
        assert_eq!(b.waiting(), queued.iter().map(|(_, n)| n).sum::<u64>());
        if let Some((_, head)) = queued.first() {
            assert!(*head > b.available(), "a servable head waits");
        }
    }
}

#[test]
fn only_failures_to_connect_end_the_wait_for_a_credit_stream() {
    use super::could_not_connect;
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let connect = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
    assert!(could_not_connect(&connect), "{connect:?}");
    let timed_out = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(
        tonic::TimeoutExpired(()),
    ))));
    assert!(could_not_connect(&timed_out), "{timed_out:?}");
    // What a draining connection ends a held attempt with, and what a
    // datanode that is shutting down answers.
    assert!(!could_not_connect(&tonic::Status::cancelled(
        "operation was canceled"
    )));
    assert!(!could_not_connect(&tonic::Status::unavailable(
        "datanode is shutting down"
    )));
}
