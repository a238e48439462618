//! What Sluice's integration tests share: waiting for a condition with a
//! deadline, a role (meta node, datanode) run as a task that a test stops
//! ([`RoleTask`]), and deterministic payloads ([`payload`]).
//!
//! Every wait polls every [`POLL`] (or the interval given) and fails with
//! what it waited for, and the last state seen when the probe says why the
//! condition does not hold yet.
//!
//! It depends on no role crate, so every crate's tests can use it.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail};
use tokio::time::Instant;

/// Default interval between two probes.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `probe` every [`POLL`] until it returns `Ok(value)`; `Err(state)`
/// says why the condition does not hold yet. Fails after `timeout` with
/// the last state.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    wait_until_every(what, timeout, POLL, probe).await
}

/// [`wait_until`] probing every `every`.
pub async fn wait_until_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(state) => {
                if Instant::now() >= deadline {
                    bail!("timed out after {timeout:?} waiting for {what}; last state: {state}");
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `check` until it returns `Some(value)`; fails after `timeout`.
pub async fn wait_for_some<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_until(what, timeout, || {
        let fut = check();
        async move { fut.await.ok_or_else(|| "not yet".to_string()) }
    })
    .await
}

/// Polls the synchronous `cond` until it is true; an `Err` from it ends
/// the wait at once. Fails after `timeout`.
pub async fn eventually(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Logs of the code under test to the test's output, at `RUST_LOG`'s
/// levels (when unset: warnings, without openraft's election chatter and
/// s3s's log of every error answer, which tests provoke on purpose); once
/// per process, later calls are no-ops.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,openraft=error,s3s=off")
            }),
        )
        .with_test_writer()
        .try_init();
}

/// How long [`RoleTask::stop`] waits for a role to return.
pub const ROLE_STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The shutdown signal a role's `run(config, listener, shutdown)` gets
/// from [`RoleTask::spawn`]: resolves when [`RoleTask::stop`] is called
/// (or the task's handle is dropped).
pub struct Shutdown(tokio::sync::oneshot::Receiver<()>);

impl Future for Shutdown {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// A role running as a tokio task, and what stops it. [`Default`] is a
/// stopped one (a node a test starts later).
pub struct RoleTask<E> {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::result::Result<(), E>>>,
}

impl<E> Default for RoleTask<E> {
    fn default() -> Self {
        RoleTask {
            stop: None,
            task: None,
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> RoleTask<E> {
    /// Spawns `run(shutdown)`, e.g.
    /// `RoleTask::spawn(|s| sluice_datanode::run(config, listener, s))`.
    pub fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(Shutdown) -> Fut,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        RoleTask {
            stop: Some(stop),
            task: Some(tokio::spawn(run(Shutdown(stopped)))),
        }
    }

    /// Whether the role is running (spawned, not stopped, not returned).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Signals shutdown without waiting for the role to return
    /// ([`stop`](Self::stop) then waits).
    pub fn signal(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Signals shutdown and waits up to [`ROLE_STOP_TIMEOUT`] for the role
    /// to return; its error, a panic or the timeout fail. A no-op when not
    /// running.
    pub async fn stop(&mut self) -> Result<()> {
        self.signal();
        if let Some(task) = self.task.take() {
            match tokio::time::timeout(ROLE_STOP_TIMEOUT, task).await {
                Err(_) => bail!("role did not stop within {ROLE_STOP_TIMEOUT:?}"),
                Ok(Err(join)) => bail!("role task failed: {join}"),
                Ok(Ok(returned)) => returned?,
            }
        }
        Ok(())
    }
}

/// `len` deterministic pseudo-random bytes from `seed` (xorshift64): test
/// payloads that differ per seed and compress like random data.
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_role_task_stops_on_its_signal_and_reports_its_error() {
        let mut idle = RoleTask::<std::io::Error>::default();
        assert!(!idle.is_running());
        idle.stop().await.unwrap();

        let mut ok = RoleTask::spawn(|shutdown| async move {
            shutdown.await;
            Ok::<(), std::io::Error>(())
        });
        assert!(ok.is_running());
        ok.stop().await.unwrap();
        assert!(!ok.is_running());

        let mut failing = RoleTask::spawn(|shutdown| async move {
            shutdown.await;
            Err(std::io::Error::other("disk gone"))
        });
        let err = failing.stop().await.unwrap_err();
        assert!(err.to_string().contains("disk gone"), "{err}");
    }

    #[test]
    fn payloads_are_deterministic_per_seed() {
        assert_eq!(payload(64, 7), payload(64, 7));
        assert_ne!(payload(64, 7), payload(64, 8));
        assert_eq!(payload(10, 7), payload(64, 7)[..10]);
    }

    #[tokio::test]
    async fn a_wait_returns_the_value_once_the_condition_holds() {
        let mut calls = 0;
        let v = wait_until("three calls", Duration::from_secs(1), || {
            calls += 1;
            let n = calls;
            async move {
                if n >= 3 {
                    Ok(n)
                } else {
                    Err(format!("{n} calls"))
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn a_wait_fails_after_its_timeout_with_the_last_state() {
        let err = wait_until("never", Duration::from_millis(100), || async {
            Err::<(), _>("still red".to_string())
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("waiting for never"), "{err}");
        assert!(err.contains("still red"), "{err}");
        let err = eventually("never", Duration::from_millis(100), || Ok(false))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("waiting for never"));
        assert!(
            wait_for_some("never", Duration::from_millis(100), || async { None::<u8> })
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn an_error_from_the_condition_ends_the_wait() {
        let err = eventually("broken", Duration::from_secs(10), || bail!("probe broke"))
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "probe broke");
    }
}
