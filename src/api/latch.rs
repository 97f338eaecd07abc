//! The count-down latch handle (Redisson's `RCountDownLatch`, same key, channel and
//! messages).

use std::sync::Arc;
use std::time::Duration;

use crate::config::MAX_DURATION;
use crate::error::Result;
use crate::shell::services::ClientInner;
use crate::shell::sync_wait::{wait_for, Try, Until};
use crate::wire::sync_raw::{self, check_count};

/// A named distributed count-down latch, wire-compatible with Redisson's
/// `RCountDownLatch`: the key `<name>` holds the count; the count-down that reaches 0
/// deletes it and publishes `0` on `redisson_countdownlatch__channel__{<name>}`, and
/// setting a count publishes `1`. Every waiter, of this client or any other, wakes at 0.
///
/// A latch that does not exist counts 0: waiting on it returns at once.
///
/// Made by [`Client::count_down_latch`](crate::Client::count_down_latch); cheap to clone.
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use std::time::Duration;
/// let client = redis_rlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let ready = client.count_down_latch("workers-ready");
/// ready.try_set_count(3).await?;
/// // ... each of 3 workers calls ready.count_down().await? ...
/// if ready.wait_for(Duration::from_secs(10)).await? {
///     // all 3 are ready
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CountDownLatch {
    inner: Arc<ClientInner>,
    name: Arc<str>,
    channel: Arc<str>,
}

impl std::fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("name", &self.name)
            .finish()
    }
}

impl CountDownLatch {
    pub(crate) fn new(inner: Arc<ClientInner>, name: String) -> CountDownLatch {
        CountDownLatch {
            channel: sync_raw::latch_channel(&name).into(),
            name: name.into(),
            inner,
        }
    }

    /// The latch's name, which is also its Redis key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its channel: `redisson_countdownlatch__channel__{<name>}` (braces always, as
    /// Redisson writes it).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    fn check(&self) -> Result<()> {
        sync_raw::check_name(&self.name, self.inner.conn.is_cluster(), &[&self.channel])?;
        self.inner.check_open()
    }

    /// Sets the count if the latch does not exist (Redisson's `trySetCount`); returns
    /// whether it was set. Setting publishes `1` (Redisson's "new count").
    ///
    /// `false` means the latch was there already, at whatever count an earlier run left
    /// it, and nothing was written: waiting on it would open after that many
    /// count-downs, not `count`. Do not let a `?` hide it. To start a new round over
    /// that state, delete it first:
    ///
    /// ```no_run
    /// # async fn demo(client: redis_rlock::Client) -> redis_rlock::Result<()> {
    /// let done = client.count_down_latch("batch-done");
    /// if !done.try_set_count(10).await? {
    ///     done.delete().await?;                 // the earlier run's count goes
    ///     assert!(done.try_set_count(10).await?); // unless another process set it first
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCount`](crate::Error::InvalidCount) for 0 (a latch at 0 does not
    /// exist), name errors ([`Error::NameNotClusterSafe`](crate::Error::NameNotClusterSafe)
    /// for a name with its own hash tag on a cluster: Redisson's channel for it lands in
    /// another slot), all before anything is sent;
    /// [`Error::WrongType`](crate::Error::WrongType) when the key holds something else
    /// than a count (nothing written); [`Error::Closed`](crate::Error::Closed) after
    /// shutdown; transient errors as they come.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the set sent or not.
    pub async fn try_set_count(&self, count: u32) -> Result<bool> {
        check_count("count", count)?;
        self.check()?;
        sync_raw::latch_set(&self.inner.conn, &self.name, &self.channel, count).await
    }

    /// Counts down by one and returns the count left. At 0 the latch is deleted and
    /// every waiter woken. Counting down a latch that does not exist changes nothing
    /// and answers 0.
    ///
    /// # Errors
    ///
    /// Name errors; [`Error::WrongType`](crate::Error::WrongType) when the key holds
    /// something else than a count (nothing written);
    /// [`Error::Closed`](crate::Error::Closed); transient errors (the count-down may then
    /// have happened or not).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the count-down sent or not.
    pub async fn count_down(&self) -> Result<i64> {
        self.check()?;
        sync_raw::latch_count_down(&self.inner.conn, &self.name, &self.channel).await
    }

    /// Deletes the latch, as Redisson's `delete`, and returns whether it existed. A
    /// delete publishes `1` (Redisson's "new count"), as Redisson's does.
    ///
    /// A latch that does not exist counts 0, so a deleted latch is open: this client's
    /// waiters, woken by the message, return as if the count had reached 0 ([`wait`](Self::wait)
    /// returns, [`wait_for`](Self::wait_for) answers `true`). Count-downs of the earlier
    /// round change nothing until a count is set again; after that they count the new
    /// round down, so stop the earlier round's workers first.
    ///
    /// # Errors
    ///
    /// Name errors; [`Error::WrongType`](crate::Error::WrongType) when the key holds
    /// something else than a count (nothing deleted; Redisson's delete would take any
    /// key); [`Error::Closed`](crate::Error::Closed); transient errors (the delete may
    /// then have happened or not).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the delete sent or not.
    pub async fn delete(&self) -> Result<bool> {
        self.check()?;
        sync_raw::count_delete(
            &self.inner.conn,
            &self.name,
            &self.channel,
            None,
            Some(sync_raw::LATCH_NEW_COUNT_MESSAGE),
        )
        .await
    }

    /// The current count (0 when the latch does not exist).
    ///
    /// # Errors
    ///
    /// Name errors; [`Error::WrongType`](crate::Error::WrongType) when the key holds no
    /// integer; [`Error::Closed`](crate::Error::Closed); transient errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn count(&self) -> Result<i64> {
        self.check()?;
        sync_raw::read_count(&self.inner.conn, &self.name).await
    }

    /// Waits until the count is 0, without limit (Redisson's `await()`).
    ///
    /// # Errors
    ///
    /// As [`count`](Self::count). The first look reports transient errors at once; a
    /// waiting call rides them out for the client's
    /// [`retry_window`](crate::ClientBuilder::retry_window).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves no subscription behind.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn wait(&self) -> Result<()> {
        loop {
            if self.wait_within(Until::Forever).await? {
                return Ok(());
            }
        }
    }

    /// Waits at most `timeout` until the count is 0 (Redisson's `await(time, unit)`);
    /// returns whether it is. A zero `timeout` looks once.
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait) (a `timeout` beyond
    /// [`MAX_DURATION`](crate::MAX_DURATION) waits as it does);
    /// [`Error::Timeout`](crate::Error::Timeout) when Redis gave no answer at all before
    /// the deadline.
    ///
    /// # Time
    ///
    /// Returns by `now + timeout` plus a few ms.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`wait`](Self::wait).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let timeout = timeout.min(MAX_DURATION);
        self.wait_within(Until::after(timeout)).await
    }

    async fn wait_within(&self, until: Until) -> Result<bool> {
        self.check()?;
        let zero = wait_for(&self.inner, &self.channel, until, "latch wait", || async {
            Ok(
                match sync_raw::read_count(&self.inner.conn, &self.name).await? {
                    n if n <= 0 => Try::Done(()),
                    _ => Try::NotYet(None),
                },
            )
        })
        .await?;
        Ok(zero.is_some())
    }
}
