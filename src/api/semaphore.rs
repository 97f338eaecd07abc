//! The semaphore handle (Redisson's `RSemaphore`, same key, channel and messages).

use std::sync::Arc;
use std::time::Duration;

use crate::config::MAX_DURATION;
use crate::error::{Error, Result};
use crate::shell::inflight::Completing;
use crate::shell::services::ClientInner;
use crate::shell::sync_wait::{wait_for, Try, Until};
use crate::wire::sync_raw::{self, check_count, Give};

/// A named distributed counting semaphore, wire-compatible with Redisson's `RSemaphore`:
/// the key `<name>` holds the number of available permits as an integer string, and a
/// release publishes the new count on `redisson_sc:{<name>}`. A Java service using
/// Redisson and a Rust service using this handle share one semaphore by name.
///
/// Made by [`Client::semaphore`](crate::Client::semaphore); cheap to clone. Permits have
/// no owner and no lease, as with Redisson: a holder that crashes keeps its permits
/// forever. Where that matters, use a
/// [`PermitExpirableSemaphore`](crate::PermitExpirableSemaphore).
///
/// Take permits with [`acquire_permits`](Self::acquire_permits) (or
/// [`run`](Self::run)): the [`SemaphorePermit`](crate::SemaphorePermit) it returns gives
/// them back when dropped, so a task that panics, returns early or is cancelled leaks
/// none. [`acquire`](Self::acquire) and [`release`](Self::release) count only, as
/// Redisson's: use them for permits taken in one place and given back in another (a Java
/// peer, another process).
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use std::time::Duration;
/// let client = redis_rlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let slots = client.semaphore("exports");
/// slots.try_set_permits(3).await?;           // only if it does not exist yet
/// if let Some(_permit) = slots.try_acquire_permits_for(1, Duration::from_secs(2)).await? {
///     // ... at most 3 of these run at a time, across processes ...
/// }                                           // given back here
/// # Ok(()) }
/// ```
///
/// # Cancellation
///
/// Every method is cancel safe: a dropped `acquire` or `try_acquire_for` leaves no
/// permit taken and no subscription behind. An acquire already sent finishes in the
/// background and gives back what it took; a release already sent finishes there too.
#[derive(Clone)]
pub struct Semaphore {
    pub(crate) inner: Arc<ClientInner>,
    pub(crate) name: Arc<str>,
    pub(crate) channel: Arc<str>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .finish()
    }
}

impl Semaphore {
    pub(crate) fn new(inner: Arc<ClientInner>, name: String) -> Semaphore {
        Semaphore {
            channel: sync_raw::semaphore_channel(&name).into(),
            name: name.into(),
            inner,
        }
    }

    /// The semaphore's name, which is also its Redis key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its channel: `redisson_sc:{<name>}` (`redisson_sc:<name>` when the name carries
    /// its own hash tag).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    fn check(&self) -> Result<()> {
        sync_raw::check_name(&self.name, self.inner.conn.is_cluster(), &[&self.channel])?;
        self.inner.check_open()
    }

    /// Sets the number of permits if the semaphore does not exist yet (Redisson's
    /// `trySetPermits`); returns whether it was set. A count above 0 is published, so
    /// waiters (of Redisson too) try at once.
    ///
    /// `false` means the semaphore was there already, with whatever count an earlier
    /// run left in it (permits it leaked included), and nothing was written. To start a
    /// new round over that state, delete it first:
    ///
    /// ```no_run
    /// # async fn demo(client: redis_rlock::Client) -> redis_rlock::Result<()> {
    /// let slots = client.semaphore("exports");
    /// if !slots.try_set_permits(3).await? {
    ///     slots.delete().await?;                 // the earlier run's count goes
    ///     assert!(slots.try_set_permits(3).await?); // unless another process set it first
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Name errors ([`Error::EmptyName`], [`Error::NameTooLong`],
    /// [`Error::NameNotClusterSafe`]) before anything is sent; [`Error::WrongType`] when
    /// the key holds something else than a count (nothing written); [`Error::Closed`]
    /// after shutdown; [`Error::PermissionDenied`]; transient errors as they come.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the set sent or not.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.check()?;
        sync_raw::semaphore_set(&self.inner.conn, &self.name, &self.channel, permits).await
    }

    /// Waits until `permits` permits are available and takes them, all at once.
    ///
    /// Waits without limit; a semaphore that does not exist has no permits, so this
    /// waits for one to be set. Use [`try_acquire_for`](Self::try_acquire_for) to bound
    /// the wait.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCount`] for 0 permits (Redisson answers "done" at once), name
    /// errors as [`try_set_permits`](Self::try_set_permits), all before anything is sent;
    /// [`Error::WrongType`] when the key holds no integer; [`Error::Closed`] when the
    /// client shuts down meanwhile; transient errors: the first try reports them at once,
    /// a waiting call rides them out for the client's
    /// [`retry_window`](crate::ClientBuilder::retry_window).
    /// [`Error::NotReplicated`] when replica sync is on and no replica acknowledged the
    /// take: the permits were given back.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves no permit taken and no subscription
    /// behind. An acquire already sent finishes in the background and gives back what
    /// it took.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn acquire(&self, permits: u32) -> Result<()> {
        loop {
            if self.acquire_within(permits, Until::Forever).await? {
                return Ok(());
            }
        }
    }

    /// One try, no waiting: takes `permits` permits if that many are available.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::Timeout`] when Redis did not answer
    /// within one response timeout (the try then finishes in the background and gives
    /// back what it took).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_acquire(&self, permits: u32) -> Result<bool> {
        self.acquire_within(permits, Until::Once).await
    }

    /// Tries for at most `wait` (measured on the monotonic clock) to take `permits`
    /// permits, as Redisson's `tryAcquire(permits, wait)`. A zero `wait` makes one try,
    /// as [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) (a `wait` beyond
    /// [`MAX_DURATION`](crate::MAX_DURATION) waits as it does). [`Error::Timeout`] when Redis gave
    /// no answer at all before the deadline; `Ok(false)` means it answered that too few
    /// permits were available, and kept doing so until the deadline.
    ///
    /// # Time
    ///
    /// Returns by `now + wait` plus a few ms, even with a try in flight at the deadline:
    /// that try finishes in the background and gives back what it took.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_acquire_for(&self, permits: u32, wait: Duration) -> Result<bool> {
        let wait = wait.min(MAX_DURATION);
        self.acquire_within(permits, Until::after(wait)).await
    }

    pub(crate) async fn acquire_within(&self, permits: u32, until: Until) -> Result<bool> {
        check_count("permits", permits)?;
        self.check()?;
        let got = wait_for(
            &self.inner,
            &self.channel,
            until,
            "semaphore acquire",
            || self.try_once(permits),
        )
        .await?;
        Ok(got.is_some())
    }

    /// One acquire request, finished in the background if dropped once sent; permits it
    /// took for nobody are given back there.
    async fn try_once(&self, permits: u32) -> Result<Try<()>> {
        let inner = self.inner.clone();
        let (name, channel) = (self.name.clone(), self.channel.clone());
        let request = {
            let (inner, name, channel) = (inner.clone(), name.clone(), channel.clone());
            async move {
                // Sent again with the same request id while its reply may have been lost:
                // the latch makes the first send's take count, and only once.
                let latch = sync_raw::semaphore_latch(&name, &crate::wire::raw::request_id());
                let mut retry = false;
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let sent = sync_raw::semaphore_acquire(
                        &inner.conn,
                        &name,
                        &channel,
                        permits,
                        (&latch, inner.latch_ttl(), retry),
                    )
                    .await;
                    match sent {
                        Err(e) if e.may_have_run() && attempt < crate::shell::target::ATTEMPTS => {
                            tracing::debug!(attempt, error = %e, "semaphore acquire reply lost; retrying with the same request id");
                            retry = true;
                            tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt)))
                                .await;
                        }
                        other => {
                            if let Ok(true) = other {
                                inner.janitor.discard(latch);
                            }
                            return other;
                        }
                    }
                }
            }
        };
        let orphan = {
            let inner = inner.clone();
            move |taken: Result<bool>| async move {
                if let Ok(true) = taken {
                    let back = sync_raw::semaphore_release(
                        &inner.conn,
                        &name,
                        &channel,
                        i64::from(permits),
                        Give::Release,
                    )
                    .await;
                    tracing::debug!(semaphore = %name, permits, ?back, "gave back permits nobody will use");
                }
            }
        };
        let taken = Completing::new(inner.spawner(), request, orphan).await?;
        Ok(if taken {
            Try::Done(())
        } else {
            Try::NotYet(None)
        })
    }

    /// Gives back `permits` permits and wakes waiters (Redisson's `release`, publishing
    /// the new count), but only into a semaphore that exists.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCount`] for 0 permits and name errors, before anything is sent;
    /// [`Error::NoSuchSemaphore`] when the key does not exist (nothing written; Redisson
    /// would create it); [`Error::WrongType`] when the key holds no integer;
    /// [`Error::InvalidCount`] when the sum would leave the `i64` range (nothing
    /// written); [`Error::Closed`] after shutdown; transient errors as they come (the release may
    /// then have happened or not).
    ///
    /// # Cancel safety
    ///
    /// Once sent, the release finishes in the background if the future is dropped.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn release(&self, permits: u32) -> Result<()> {
        check_count("permits", permits)?;
        self.check()?;
        let inner = self.inner.clone();
        let request = {
            let (inner, name, channel) = (inner.clone(), self.name.clone(), self.channel.clone());
            async move {
                sync_raw::semaphore_release(
                    &inner.conn,
                    &name,
                    &channel,
                    i64::from(permits),
                    Give::Release,
                )
                .await
            }
        };
        let name = self.name.clone();
        let orphan = move |out: Result<Option<i64>>| async move {
            tracing::debug!(semaphore = %name, ?out, "release finished after its caller left");
        };
        match Completing::new(inner.spawner(), request, orphan).await? {
            Some(_) => Ok(()),
            None => Err(Error::NoSuchSemaphore {
                name: self.name.to_string(),
            }),
        }
    }

    /// The number of available permits (0 when the semaphore does not exist; negative
    /// after [`add_permits`](Self::add_permits) took more than there were).
    ///
    /// # Errors
    ///
    /// Name errors; [`Error::WrongType`] when the key holds no integer; [`Error::Closed`];
    /// transient errors as they come.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn available_permits(&self) -> Result<i64> {
        self.check()?;
        sync_raw::read_count(&self.inner.conn, &self.name).await
    }

    /// Takes every available permit and returns how many there were (Redisson's
    /// `drainPermits`; the key is set to 0 and loses any TTL). An absent semaphore
    /// answers 0 and stays absent.
    ///
    /// # Errors
    ///
    /// As [`available_permits`](Self::available_permits).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the drain done or not; its count is then lost.
    pub async fn drain_permits(&self) -> Result<i64> {
        self.check()?;
        sync_raw::semaphore_drain(&self.inner.conn, &self.name).await
    }

    /// Adds `permits` (negative: removes them, possibly below 0) and creates the
    /// semaphore if it does not exist, as Redisson's `addPermits` (the key loses any
    /// TTL). A new count above 0 is published.
    ///
    /// # Errors
    ///
    /// As [`available_permits`](Self::available_permits), and [`Error::InvalidCount`]
    /// when the sum would leave the `i64` range (nothing written; Redisson would store a
    /// rounded float that no client can read back as a count).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the change made or not.
    pub async fn add_permits(&self, permits: i64) -> Result<()> {
        self.check()?;
        sync_raw::semaphore_release(
            &self.inner.conn,
            &self.name,
            &self.channel,
            permits,
            Give::Add,
        )
        .await?;
        Ok(())
    }

    /// Deletes the semaphore's key, as Redisson's `delete`, and returns whether it
    /// existed. Nothing is published (Redisson publishes nothing either).
    ///
    /// Permits taken before are not owed back: a later [`release`](Self::release)
    /// answers [`Error::NoSuchSemaphore`] and creates nothing, until the semaphore is set
    /// again; after that, such a release would add to the new count, so stop the
    /// earlier round's holders first. Waiters stay until their bound: a deleted
    /// semaphore has no permits, so [`try_acquire_for`](Self::try_acquire_for) returns
    /// `false` at its deadline and [`acquire`](Self::acquire) waits until permits are
    /// set again ([`try_set_permits`](Self::try_set_permits) and
    /// [`add_permits`](Self::add_permits) publish, and wake it).
    ///
    /// # Errors
    ///
    /// Name errors; [`Error::WrongType`] when the key holds something else than a
    /// count (nothing deleted; Redisson's delete would take any key); [`Error::Closed`];
    /// transient errors (the delete may then have happened or not).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the delete sent or not.
    pub async fn delete(&self) -> Result<bool> {
        self.check()?;
        sync_raw::count_delete(&self.inner.conn, &self.name, &self.channel, None, None).await
    }
}
