//! The waiting loop of the semaphores and the latch: try, subscribe, confirm, try again,
//! then sleep until a message, a bound or the deadline, and try again.
//!
//! Every waiter joins its channel under a name of its own, so that a message wakes each
//! local waiter (a lock's message wakes one waiter per lock name; see
//! [`crate::wire::pubsub`]). A release of `n` permits may serve several waiters, and a latch
//! at zero frees all of them; each woken waiter tries once and sleeps again if it got
//! nothing.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::shell::services::ClientInner;

/// What one try found.
pub(crate) enum Try<T> {
    /// Done: what the caller gets.
    Done(T),
    /// Not yet. Worth another try after at most this long even without a message (the
    /// earliest lease end of a permit-expirable semaphore); `None`: when woken.
    NotYet(Option<Duration>),
}

/// How long a call may wait.
#[derive(Clone, Copy)]
pub(crate) enum Until {
    /// One try, bounded by one response timeout.
    Once,
    /// Until this instant.
    At(Instant),
    /// Without limit.
    Forever,
}

impl Until {
    /// `Until` for a wait of `wait` from now (zero: one try).
    pub(crate) fn after(wait: Duration) -> Until {
        if wait.is_zero() {
            return Until::Once;
        }
        match Instant::now().checked_add(wait) {
            Some(at) => Until::At(at),
            None => Until::Forever,
        }
    }
}

/// A name of its own for one waiter on a channel (see the module's note).
fn waiter_name() -> Arc<str> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("#waiter-{}", NEXT.fetch_add(1, Ordering::Relaxed)).into()
}

/// Runs `attempt` until it is done or the time is up (`Ok(None)`), sleeping on `channel`
/// in between. Each try is bounded by the deadline (by one response timeout for
/// [`Until::Once`]); a try cut off there is dropped, so it must be cancel safe itself.
/// `op` names the call in a timeout error.
pub(crate) async fn wait_for<T, F, Fut>(
    inner: &Arc<ClientInner>,
    channel: &Arc<str>,
    until: Until,
    op: &'static str,
    mut attempt: F,
) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Try<T>>>,
{
    inner.check_open()?;
    let started = Instant::now();
    let deadline = match until {
        Until::Once => Instant::now().checked_add(inner.config.response_timeout),
        Until::At(at) => Some(at),
        Until::Forever => None,
    };
    let first = match bounded(deadline, attempt()).await {
        Some(r) => r?,
        // Redis gave no answer at all before the deadline: that is not "not yet".
        None => {
            return Err(Error::Timeout {
                op,
                after: started.elapsed(),
            })
        }
    };
    let mut hint = match first {
        Try::Done(v) => return Ok(Some(v)),
        Try::NotYet(hint) => hint,
    };
    if matches!(until, Until::Once) {
        return Ok(None);
    }
    let mut sub = inner.pubsub.subscribe(channel, false, &waiter_name());
    // A release between the first try and the subscription is covered by the try right
    // after the SUBSCRIBE is confirmed.
    let Some(bound) = sleep_bound(inner, hint, deadline) else {
        return Ok(None);
    };
    sub.ready(bound).await;
    let mut failing_since: Option<Instant> = None;
    loop {
        inner.check_open()?;
        match bounded(deadline, attempt()).await {
            None => return Ok(None),
            Some(Ok(Try::Done(v))) => {
                sub.wake_used();
                return Ok(Some(v));
            }
            Some(Ok(Try::NotYet(h))) => {
                sub.wake_used();
                failing_since = None;
                hint = h;
            }
            Some(Err(e)) if e.is_transient() => {
                // A waiter rides out a failover or reconnect for the retry window.
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= inner.config.retry_window {
                    return Err(e);
                }
                tracing::debug!(error = %e, "transient error while waiting; retrying");
                hint = Some(
                    Duration::from_millis(50)
                        .max(since.elapsed() / 4)
                        .min(Duration::from_millis(500)),
                );
            }
            Some(Err(e)) => return Err(e),
        }
        let Some(bound) = sleep_bound(inner, hint, deadline) else {
            return Ok(None);
        };
        tokio::select! {
            _ = sub.woken(bound) => {}
            _ = inner.closed.wait() => return Err(Error::Closed),
        }
    }
}

/// `fut`, cut off at `deadline`: `None` when the deadline came first.
async fn bounded<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        None => Some(fut.await),
        Some(at) => tokio::time::timeout_at(at, fut).await.ok(),
    }
}

/// How long to sleep before the next try: the hint, or without one the client's watchdog
/// timeout (a message may be lost while the subscriber reconnects; a look now and then
/// costs little), capped by the deadline. `None` when the deadline has passed.
fn sleep_bound(
    inner: &ClientInner,
    hint: Option<Duration>,
    deadline: Option<Instant>,
) -> Option<Duration> {
    let nap = hint
        .unwrap_or(inner.config.watchdog_timeout)
        .max(Duration::from_millis(1));
    match deadline {
        None => Some(nap),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| nap.min(left))
        }
    }
}
