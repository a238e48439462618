//! What Sluice's integration tests share: waiting for a condition with a
//! deadline. Every wait polls every [`POLL`] (or the interval given) and
//! fails with what it waited for, and the last state seen when the probe
//! says why the condition does not hold yet.
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

#[cfg(test)]
mod tests {
    use super::*;

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
