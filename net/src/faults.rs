//! Fault injection for cluster gRPC: a [`FaultLayer`] in front of a
//! server's routes fails, delays or swallows the answer of the calls its
//! [`Faults`] name, the way neon's `simulate_failures` and object_store's
//! `ThrottledStore` wrap a real client. Every server on a
//! [`crate::net::MemNet`] runs one (with the net's faults), so a test can
//! say "drop meta's answer to the second PutObject" or "fail datanode 3's
//! PutShard" and watch the real client code react.
//!
//! A rule matches a call by method name (the last segment of the gRPC
//! path, e.g. `PutObject`) and, optionally, by the server's address (the
//! request's `:authority`, e.g. `dn-3:7100`). Of the matching calls it
//! lets [`Rule::after`] through, then acts on the next [`Rule::times`]
//! (every one after that when `None`):
//! * [`Action::Fail`]: answers with the status code at once; the handler
//!   never runs (a crashed or partitioned server);
//! * [`Action::Drop`]: runs the handler to its answer, throws the answer
//!   away and answers `UNAVAILABLE` (the server did the work, the
//!   connection broke before the client heard: the case exactly-once
//!   retries and idempotent writes exist for);
//! * [`Action::Delay`]: waits, then runs the handler (a slow link or a
//!   paused process).
//!
//! The first matching rule that acts decides a call. At most
//! [`MAX_RULES`] rules are held.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{BoxFuture, Either};

/// Most rules one [`Faults`] holds.
pub const MAX_RULES: usize = 64;

/// What a rule does to a call it acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Answer with this status code without running the handler.
    Fail(tonic::Code),
    /// Run the handler, discard its answer, answer `UNAVAILABLE`.
    Drop,
    /// Wait this long, then run the handler.
    Delay(Duration),
}

/// Which calls a fault applies to, and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The method name: the gRPC path's last segment (`PutObject`).
    pub method: String,
    /// Only calls to the server at this address (`host:port`, as dialed);
    /// `None` for every server.
    pub server: Option<String>,
    /// Matching calls let through before the rule acts.
    pub after: u32,
    /// Matching calls acted on, then the rule is spent; `None`: every one.
    pub times: Option<u32>,
    /// What happens to them.
    pub action: Action,
}

impl Rule {
    /// A rule acting on every call of `method`, on every server.
    pub fn new(method: &str, action: Action) -> Self {
        Rule {
            method: method.to_string(),
            server: None,
            after: 0,
            times: None,
            action,
        }
    }

    /// Only on the server at `addr` (scheme and path ignored).
    pub fn on(mut self, addr: &str) -> Self {
        let rest = addr
            .strip_prefix("https://")
            .or_else(|| addr.strip_prefix("http://"))
            .unwrap_or(addr);
        self.server = Some(rest.split('/').next().unwrap_or(rest).to_string());
        self
    }

    /// Let `n` matching calls through first.
    pub fn after(mut self, n: u32) -> Self {
        self.after = n;
        self
    }

    /// Act on `n` calls, then stop.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &str, server: Option<&str>) -> bool {
        self.method == method && self.server.as_deref().is_none_or(|s| Some(s) == server)
    }
}

/// A rule and its counters.
#[derive(Debug)]
pub struct Armed {
    rule: Rule,
    /// Matching calls seen.
    seen: AtomicU32,
    /// Calls acted on.
    fired: AtomicU32,
}

impl Armed {
    /// Calls the rule acted on so far.
    pub fn fired(&self) -> u32 {
        self.fired.load(Ordering::SeqCst)
    }

    /// Matching calls seen so far (acted on or let through).
    pub fn seen(&self) -> u32 {
        self.seen.load(Ordering::SeqCst)
    }

    /// Counts one matching call; the action when the rule acts on it.
    fn decide(&self) -> Option<Action> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst);
        if n < self.rule.after {
            return None;
        }
        if let Some(times) = self.rule.times
            && n - self.rule.after >= times
        {
            return None;
        }
        self.fired.fetch_add(1, Ordering::SeqCst);
        Some(self.rule.action)
    }
}

/// A set of armed rules, shared by the servers that apply it.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Mutex<Vec<Arc<Armed>>>,
}

impl Faults {
    /// Arms `rule`; the handle counts what it did. Panics past
    /// [`MAX_RULES`] (a test that arms that many is broken).
    pub fn add(&self, rule: Rule) -> Arc<Armed> {
        let mut rules = self.rules.lock().expect("faults lock");
        assert!(rules.len() < MAX_RULES, "more than {MAX_RULES} fault rules");
        let armed = Arc::new(Armed {
            rule,
            seen: AtomicU32::new(0),
            fired: AtomicU32::new(0),
        });
        rules.push(Arc::clone(&armed));
        armed
    }

    /// Disarms every rule.
    pub fn clear(&self) {
        self.rules.lock().expect("faults lock").clear();
    }

    /// The action for a call of `path` to `server`, counting it against
    /// every matching rule up to the first that acts.
    pub fn decide(&self, path: &str, server: Option<&str>) -> Option<Action> {
        let method = path.rsplit('/').next().unwrap_or(path);
        let rules = self.rules.lock().expect("faults lock");
        rules
            .iter()
            .filter(|r| r.rule.matches(method, server))
            .find_map(|r| r.decide())
    }
}

/// Applies a [`Faults`] to every call of the server it wraps.
#[derive(Clone, Debug, Default)]
pub struct FaultLayer {
    faults: Option<Arc<Faults>>,
}

impl FaultLayer {
    /// Applies `faults`.
    pub fn new(faults: Arc<Faults>) -> Self {
        FaultLayer {
            faults: Some(faults),
        }
    }

    /// Lets every call through (servers on TCP).
    pub fn none() -> Self {
        FaultLayer { faults: None }
    }
}

impl<S> tower::Layer<S> for FaultLayer {
    type Service = FaultService<S>;
    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService {
            inner,
            faults: self.faults.clone(),
        }
    }
}

/// The service [`FaultLayer`] wraps around a server's routes.
#[derive(Clone, Debug)]
pub struct FaultService<S> {
    inner: S,
    faults: Option<Arc<Faults>>,
}

impl<S, B> tower::Service<http::Request<B>> for FaultService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Self::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let action = self
            .faults
            .as_ref()
            .and_then(|f| f.decide(req.uri().path(), req.uri().authority().map(|a| a.as_str())));
        let Some(action) = action else {
            return Either::Left(self.inner.call(req));
        };
        let path = req.uri().path().to_string();
        tracing::debug!(%path, ?action, "injected fault");
        match action {
            Action::Fail(code) => {
                let status = tonic::Status::new(code, format!("{path}: injected fault"));
                Either::Right(Box::pin(async move { Ok(status.into_http()) }))
            }
            Action::Drop => {
                let answer = self.inner.call(req);
                Either::Right(Box::pin(async move {
                    let _discarded = answer.await?;
                    Ok(tonic::Status::unavailable(format!(
                        "{path}: answer dropped (injected fault)"
                    ))
                    .into_http())
                }))
            }
            Action::Delay(d) => {
                // The clone serves this call after the wait; `self.inner`
                // was made ready for it by poll_ready, so swap them (tower's
                // rule for services called from a later future).
                let clone = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, clone);
                Either::Right(Box::pin(async move {
                    tokio::time::sleep(d).await;
                    ready.call(req).await
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_lets_after_through_then_acts_times_times() {
        let faults = Faults::default();
        let drop = faults.add(
            Rule::new("PutObject", Action::Drop)
                .on("http://meta-1:7001")
                .after(1)
                .times(2),
        );
        let p = "/sluice.meta.Meta/PutObject";
        let on = Some("meta-1:7001");
        assert_eq!(faults.decide(p, on), None);
        assert_eq!(faults.decide(p, on), Some(Action::Drop));
        // Another server or method does not count.
        assert_eq!(faults.decide(p, Some("meta-2:7001")), None);
        assert_eq!(faults.decide("/sluice.meta.Meta/GetObject", on), None);
        assert_eq!(faults.decide(p, on), Some(Action::Drop));
        assert_eq!(faults.decide(p, on), None);
        assert_eq!((drop.seen(), drop.fired()), (4, 2));
    }

    #[test]
    fn the_first_rule_that_acts_decides() {
        let faults = Faults::default();
        let first =
            faults.add(Rule::new("PutShard", Action::Fail(tonic::Code::Unavailable)).times(1));
        let second = faults.add(Rule::new("PutShard", Action::Drop));
        let p = "/sluice.datanode.Datanode/PutShard";
        assert_eq!(
            faults.decide(p, None),
            Some(Action::Fail(tonic::Code::Unavailable))
        );
        assert_eq!(faults.decide(p, None), Some(Action::Drop));
        assert_eq!((first.fired(), second.fired()), (1, 1));
        faults.clear();
        assert_eq!(faults.decide(p, None), None);
    }
}
