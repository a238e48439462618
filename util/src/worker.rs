//! Background workers: one small abstraction every role's background loop
//! runs under, so starting, stopping and logging them is uniform and
//! `sluice admin status` can list each one's state and last error.
//!
//! A [`Workers`] registry spawns named loops (`async fn(WorkerHandle)`),
//! logs `worker started` / `worker stopped` / `worker failed` with a
//! `worker = <name>` field, records each one's [`WorkerStatus`], cancels
//! them all on [`Workers::shutdown`] and waits for them. A loop keeps its
//! own timers (every interval stays configuration) and tells its handle
//! how its passes went: [`WorkerHandle::ran`], [`WorkerHandle::idle`],
//! [`WorkerHandle::report_error`].
//!
//! The set of workers of a process is fixed when it starts (about a dozen
//! named loops: meta's sweepers, reclaimer, snapshot schedule and
//! leadership watch; a datanode's GC, scrubber and membership; a gateway's
//! heal, epoch renewal and block-store refresh), so the registry holds at
//! most [`MAX_WORKERS`] entries; a name spawned again (a restarted loop)
//! reuses its entry.
//!
//! Self-contained on purpose (tokio, tokio-util, futures, tracing only): it
//! can move to another low crate by moving this file.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::FutureExt;
use tokio::task::JoinHandle;
pub use tokio_util::sync::CancellationToken;

/// Most workers one registry lists (a process runs a fixed, small set);
/// workers spawned past it still run but are not listed.
pub const MAX_WORKERS: usize = 32;
/// Longest error text kept per worker, bytes (the rest is cut).
pub const MAX_ERROR_LEN: usize = 512;

/// What a worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerState {
    /// Started, or its last pass succeeded.
    #[default]
    Running,
    /// Running but with nothing to do on this node (e.g. not the leader).
    Idle,
    /// Its last pass failed (see `last_error`); it keeps running.
    Failed,
    /// Ended (cancelled, or returned on its own).
    Stopped,
}

impl WorkerState {
    /// `running`, `idle`, `failed` or `stopped` (the wire and CLI text).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Idle => "idle",
            WorkerState::Failed => "failed",
            WorkerState::Stopped => "stopped",
        }
    }
}

impl fmt::Display for WorkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A worker's state as [`Workers::snapshot`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkerStatus {
    pub name: String,
    pub state: WorkerState,
    /// The last error reported, kept after later passes succeed.
    pub last_error: Option<String>,
    /// Wall clock of `last_error`, ms since the Unix epoch; 0 = none.
    pub last_error_at_ms: i64,
    /// Passes reported (successful, idle or failed).
    pub iterations: u64,
}

#[derive(Debug)]
struct Slot {
    status: Mutex<WorkerStatus>,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, WorkerStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Default)]
struct Inner {
    slots: Mutex<Vec<Arc<Slot>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    cancel: CancellationToken,
}

/// The background workers of one process (or one role in `sluice dev`).
/// Cheap to clone; clones share the registry.
#[derive(Debug, Clone, Default)]
pub struct Workers {
    inner: Arc<Inner>,
}

/// What a running worker holds: its cancellation and its status.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    name: Arc<str>,
    slot: Arc<Slot>,
    cancel: CancellationToken,
}

impl Workers {
    /// A registry whose workers stop when `cancel` is cancelled (by
    /// [`Workers::shutdown`] or by its owner).
    pub fn new(cancel: CancellationToken) -> Self {
        Workers {
            inner: Arc::new(Inner {
                cancel,
                ..Default::default()
            }),
        }
    }

    /// The token the workers stop on.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    /// [`Workers::spawn`] for a loop that runs until dropped: it is
    /// dropped when the worker is cancelled.
    pub fn spawn_loop<F, Fut>(&self, name: &str, work: F)
    where
        F: FnOnce(WorkerHandle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn(name, move |w| {
            let stop = w.clone();
            let fut = work(w);
            async move {
                stop.until_cancelled(fut).await;
            }
        });
    }

    /// Runs `work` as worker `name` on a new task. `work` must return
    /// once [`WorkerHandle::cancelled`] fires (a loop that runs until
    /// dropped: [`Workers::spawn_loop`]). A panic marks it failed.
    pub fn spawn<F, Fut>(&self, name: &str, work: F)
    where
        F: FnOnce(WorkerHandle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let slot = self.slot(name);
        let handle = WorkerHandle {
            name: Arc::from(name),
            slot: Arc::clone(&slot),
            cancel: self.inner.cancel.clone(),
        };
        let fut = work(handle.clone());
        tracing::info!(worker = name, "worker started");
        let task = tokio::spawn(async move {
            let outcome = AssertUnwindSafe(fut).catch_unwind().await;
            let name = &*handle.name;
            let mut s = handle.slot.lock();
            s.state = WorkerState::Stopped;
            match outcome {
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<&str>()
                        .map(|m| m.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panic".to_string());
                    s.last_error = Some(cut(format!("panicked: {msg}")));
                    s.last_error_at_ms = crate::clock::wall_clock_ms();
                    s.state = WorkerState::Failed;
                    tracing::error!(worker = name, error = %msg, "worker panicked");
                }
                Ok(()) if handle.cancel.is_cancelled() => {
                    tracing::info!(worker = name, "worker stopped");
                }
                // Its owner went away (a store or epoch set dropped or
                // stopped on its own), or it gave up.
                Ok(()) => tracing::info!(worker = name, "worker ended"),
            }
        });
        let mut tasks = self
            .inner
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// The entry of `name`, reset to running (new, or reused).
    fn slot(&self, name: &str) -> Arc<Slot> {
        let fresh = WorkerStatus {
            name: name.to_string(),
            ..Default::default()
        };
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = slots.iter().find(|s| s.lock().name == name) {
            *slot.lock() = fresh;
            return Arc::clone(slot);
        }
        let slot = Arc::new(Slot {
            status: Mutex::new(fresh),
        });
        if slots.len() < MAX_WORKERS {
            slots.push(Arc::clone(&slot));
        } else {
            tracing::warn!(
                worker = name,
                max = MAX_WORKERS,
                "too many workers to list; this one runs unlisted"
            );
        }
        slot
    }

    /// Every listed worker's status, in the order they were first spawned.
    pub fn snapshot(&self) -> Vec<WorkerStatus> {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|s| s.lock().clone())
            .collect()
    }

    /// Cancels every worker and waits until each has ended.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.join().await;
    }

    /// Waits until every worker spawned so far has ended (after their
    /// token was cancelled).
    pub async fn join(&self) {
        let tasks = std::mem::take(
            &mut *self
                .inner
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl WorkerHandle {
    /// The worker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The worker's cancellation (shared by the registry).
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Completes once the worker must stop.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// Whether the worker must stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Runs `fut` until it ends or the worker is cancelled (for loops that
    /// run until dropped).
    pub async fn until_cancelled<T>(&self, fut: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            _ = self.cancel.cancelled() => None,
            r = fut => Some(r),
        }
    }

    /// A pass succeeded: the worker is running (again).
    pub fn ran(&self) {
        let mut s = self.slot.lock();
        s.iterations += 1;
        s.state = WorkerState::Running;
    }

    /// A pass found nothing to do on this node (e.g. not the leader).
    pub fn idle(&self) {
        let mut s = self.slot.lock();
        s.iterations += 1;
        s.state = WorkerState::Idle;
    }

    /// A pass failed with `error`: logged once here, kept as the last
    /// error; the worker keeps running.
    pub fn report_error(&self, error: impl fmt::Display) {
        let text = cut(error.to_string());
        tracing::warn!(worker = %self.name, error = %text, "worker failed");
        self.failed(text);
    }

    /// [`report_error`](Self::report_error) without the log line, for a
    /// loop that rate-limits its own warnings (a node retrying meta).
    pub fn note_error(&self, error: impl fmt::Display) {
        self.failed(cut(error.to_string()));
    }

    fn failed(&self, text: String) {
        let mut s = self.slot.lock();
        s.iterations += 1;
        s.state = WorkerState::Failed;
        s.last_error = Some(text);
        s.last_error_at_ms = crate::clock::wall_clock_ms();
    }
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn state(workers: &Workers, name: &str) -> WorkerStatus {
        workers
            .snapshot()
            .into_iter()
            .find(|s| s.name == name)
            .expect("listed")
    }

    #[tokio::test]
    async fn fails_once_then_runs_and_stops_on_cancel() {
        let workers = Workers::new(CancellationToken::new());
        let (step_tx, mut step_rx) = mpsc::channel::<Result<(), String>>(1);
        let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
        workers.spawn("flaky", move |h| async move {
            loop {
                tokio::select! {
                    _ = h.cancelled() => return,
                    step = step_rx.recv() => match step {
                        Some(Ok(())) => h.ran(),
                        Some(Err(e)) => h.report_error(e),
                        None => return,
                    },
                }
                let _ = done_tx.send(()).await;
            }
        });
        workers.spawn("forever", |h| async move {
            h.until_cancelled(std::future::pending::<()>()).await;
        });
        assert_eq!(state(&workers, "flaky").state, WorkerState::Running);

        step_tx.send(Err("disk on fire".into())).await.unwrap();
        done_rx.recv().await.unwrap();
        let s = state(&workers, "flaky");
        assert_eq!(s.state, WorkerState::Failed);
        assert_eq!(s.last_error.as_deref(), Some("disk on fire"));
        assert!(s.last_error_at_ms > 0);

        step_tx.send(Ok(())).await.unwrap();
        done_rx.recv().await.unwrap();
        let s = state(&workers, "flaky");
        assert_eq!(s.state, WorkerState::Running);
        assert_eq!(s.iterations, 2);
        assert_eq!(
            s.last_error.as_deref(),
            Some("disk on fire"),
            "the last error is kept"
        );

        let names: Vec<String> = workers.snapshot().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["flaky", "forever"]);

        workers.shutdown().await;
        for s in workers.snapshot() {
            assert_eq!(s.state, WorkerState::Stopped, "{}", s.name);
        }
    }

    #[tokio::test]
    async fn a_panic_is_a_failure_and_names_are_bounded() {
        let workers = Workers::new(CancellationToken::new());
        workers.spawn("boom", |_h| async move { panic!("bad state") });
        workers.join().await;
        let s = state(&workers, "boom");
        assert_eq!(s.state, WorkerState::Failed);
        assert_eq!(s.last_error.as_deref(), Some("panicked: bad state"));

        // Respawning a name reuses its entry.
        workers.spawn("boom", |h| async move { h.ran() });
        workers.join().await;
        assert_eq!(workers.snapshot().len(), 1);
        assert_eq!(state(&workers, "boom").iterations, 1);

        for i in 0..MAX_WORKERS + 5 {
            workers.spawn(&format!("w{i}"), |_h| async {});
        }
        workers.shutdown().await;
        assert_eq!(workers.snapshot().len(), MAX_WORKERS);
    }
}
