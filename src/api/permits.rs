//! The permit-expirable semaphore handle (Redisson's `RPermitExpirableSemaphore`, same
//! keys, channel, ids and messages) and its [`Permit`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{check_lease, MAX_DURATION};
use crate::error::{Error, Result};
use crate::shell::inflight::Completing;
use crate::shell::services::ClientInner;
use crate::shell::sync_wait::{wait_for, Try, Until};
use crate::wire::sync_raw::{self, PermitKeys, PermitTry};

/// A counting semaphore whose permits each carry an id and a lease, wire-compatible with
/// Redisson's `RPermitExpirableSemaphore`: the key `<name>` holds the available count,
/// the sorted set `{<name>}:timeout` maps each taken permit's id (16 bytes) to the end
/// of its lease in ms since the epoch, and releases publish the new count on
/// `redisson_sc:{<name>}`.
///
/// A permit whose lease ends comes back by itself: a holder that crashed does not keep
/// it. Waiters sleep until a release or the earliest lease end, whichever comes first.
/// Lease ends are counted on the Redis server's clock (Redisson counts on its clients').
///
/// Made by [`Client::permit_expirable_semaphore`](crate::Client::permit_expirable_semaphore);
/// cheap to clone.
///
/// Take a permit with [`acquire_permit`](Self::acquire_permit) when the code that takes
/// it also gives it back: its [`PermitGuard`](crate::PermitGuard) gives it back when
/// dropped, and the client's watchdog keeps its lease alive meanwhile. The methods by id
/// below are Redisson's, for a permit handed to other code by its id.
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use std::time::Duration;
/// let client = redis_rlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let seats = client.permit_expirable_semaphore("seats");
/// seats.try_set_permits(10).await?;
/// {
///     let seat = seats.acquire_permit().await?;   // renewed while `seat` lives
///     // ... before recording the work: `if seat.is_lost() { /* give up */ }` ...
/// }                                                // given back here
/// // By id, as Redisson's methods:
/// let permit = seats.acquire(Duration::from_secs(30)).await?;   // back by itself after 30 s
/// seats.update_lease_time(permit.id(), Duration::from_secs(30)).await?;
/// seats.release(permit.id()).await?;
/// # Ok(()) }
/// ```
///
/// # Cancellation
///
/// A dropped `acquire` or `try_acquire` leaves no permit taken and no subscription
/// behind: an acquire already sent finishes in the background and gives back what it
/// took.
#[derive(Clone)]
pub struct PermitExpirableSemaphore {
    pub(crate) inner: Arc<ClientInner>,
    pub(crate) name: Arc<str>,
    pub(crate) timeout: Arc<str>,
    pub(crate) channel: Arc<str>,
}

/// One permit taken from a [`PermitExpirableSemaphore`]: its id and lease.
///
/// Dropping it releases nothing (as with Redisson, the permit is a plain id); the permit
/// comes back at the end of its lease unless released or renewed before. For a permit
/// that goes back on drop, see [`PermitGuard`](crate::PermitGuard).
#[derive(Clone, PartialEq, Eq)]
pub struct Permit {
    id: String,
    lease: Duration,
    expires: Instant,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("id", &self.id)
            .field("lease", &self.lease)
            .finish()
    }
}

impl Permit {
    /// The permit's id: 32 lowercase hex digits, as Redisson's ids are written (the set
    /// holds the 16 bytes they stand for). A Java peer can release it by this id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lease it was taken with.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// When the lease ends at the latest, on this process's monotonic clock (counted
    /// from when the acquire was sent; a later [`update_lease_time`] is not reflected).
    ///
    /// [`update_lease_time`]: PermitExpirableSemaphore::update_lease_time
    pub fn expires_at(&self) -> Instant {
        self.expires
    }
}

impl std::fmt::Debug for PermitExpirableSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermitExpirableSemaphore")
            .field("name", &self.name)
            .finish()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The 16 bytes an id stands for. Ids of this crate and of Redisson are 32 hex digits;
/// anything else could never name a permit, so it is refused as input, not answered
/// "not held".
pub(crate) fn unhex(id: &str) -> Result<[u8; 16]> {
    let bad = || Error::InvalidPermitId { id: id.to_string() };
    if id.len() != 32 {
        return Err(bad());
    }
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = id
            .get(2 * i..2 * i + 2)
            .and_then(|d| u8::from_str_radix(d, 16).ok())
            .ok_or_else(bad)?;
    }
    Ok(raw)
}

impl PermitExpirableSemaphore {
    pub(crate) fn new(inner: Arc<ClientInner>, name: String) -> PermitExpirableSemaphore {
        PermitExpirableSemaphore {
            timeout: sync_raw::permit_timeout_key(&name).into(),
            channel: sync_raw::semaphore_channel(&name).into(),
            name: name.into(),
            inner,
        }
    }

    /// The semaphore's name, which is also the key of its available count.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key of its lease set: `{<name>}:timeout` (`<name>:timeout` when the name
    /// carries its own hash tag).
    pub fn timeout_key(&self) -> &str {
        &self.timeout
    }

    /// Its channel: `redisson_sc:{<name>}`, as for [`Semaphore`](crate::Semaphore).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    pub(crate) fn keys(&self) -> PermitKeys<'_> {
        PermitKeys {
            name: &self.name,
            timeout: &self.timeout,
            channel: &self.channel,
        }
    }

    fn check(&self) -> Result<()> {
        sync_raw::check_name(
            &self.name,
            self.inner.conn.is_cluster(),
            &[&self.channel, &self.timeout],
        )?;
        self.inner.check_open()
    }

    /// Sets the number of permits if the semaphore does not exist yet (Redisson's
    /// `trySetPermits`); returns whether it was set.
    ///
    /// `false` means the semaphore was there already, with whatever count and leases an
    /// earlier run left, and nothing was written. To start a new round over that state,
    /// delete it first:
    ///
    /// ```no_run
    /// # async fn demo(client: redis_rlock::Client) -> redis_rlock::Result<()> {
    /// let slots = client.permit_expirable_semaphore("exports");
    /// if !slots.try_set_permits(3).await? {
    ///     slots.delete().await?;                 // count and leases of the earlier run go
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
    /// after shutdown; transient errors as they come.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the set sent or not.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.check()?;
        sync_raw::semaphore_set(&self.inner.conn, &self.name, &self.channel, permits).await
    }

    /// Waits until a permit is available and takes it with `lease`. Waits without
    /// limit, sleeping until a release or the earliest lease end of the permits held.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLease`] or [`Error::DurationOutOfRange`] for a lease under 1 ms
    /// or beyond [`MAX_DURATION`](crate::MAX_DURATION), name errors, before anything is
    /// sent; [`Error::WrongType`] when a key holds another type; [`Error::Closed`] when
    /// the client shuts down meanwhile; transient errors: the first try reports them at
    /// once, a waiting call rides them out for the client's
    /// [`retry_window`](crate::ClientBuilder::retry_window) (a try whose reply was lost
    /// gives its permit back by id before it reports).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves no permit taken and no subscription
    /// behind.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn acquire(&self, lease: Duration) -> Result<Permit> {
        loop {
            if let Some(p) = self.acquire_within(lease, Until::Forever).await? {
                return Ok(p);
            }
        }
    }

    /// Tries for at most `wait` to take a permit with `lease` (Redisson's
    /// `tryAcquire(waitTime, leaseTime)`); a zero `wait` makes one try. `Ok(None)` when
    /// none became available in time.
    ///
    /// The lease comes first, then the wait: the other way round from Redisson's
    /// `tryAcquire(waitTime, leaseTime)` and from [`Lock::try_lock_for`](crate::Lock::try_lock_for),
    /// and both are a `Duration`, so code ported from Java compiles with them swapped.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) (a `wait` beyond
    /// [`MAX_DURATION`](crate::MAX_DURATION) waits as it does).
    /// [`Error::Timeout`] when Redis gave no answer at all before the deadline (within
    /// one response timeout for a zero `wait`).
    ///
    /// # Time
    ///
    /// Returns by `now + wait` plus a few ms; a try in flight at the deadline finishes
    /// in the background and gives back what it took.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_acquire(&self, lease: Duration, wait: Duration) -> Result<Option<Permit>> {
        let wait = wait.min(MAX_DURATION);
        self.acquire_within(lease, Until::after(wait)).await
    }

    pub(crate) async fn acquire_within(
        &self,
        lease: Duration,
        until: Until,
    ) -> Result<Option<Permit>> {
        check_lease(lease)?;
        self.check()?;
        wait_for(&self.inner, &self.channel, until, "permit acquire", || {
            self.try_once(lease)
        })
        .await
    }

    /// One acquire request under a fresh id. Finished in the background if dropped
    /// once sent; a permit it took for nobody is given back there. A request whose reply
    /// was lost gives its id back before it reports the error.
    async fn try_once(&self, lease: Duration) -> Result<Try<Permit>> {
        let inner = self.inner.clone();
        let id = uuid::Uuid::new_v4().into_bytes();
        let this = self.clone();
        let request = {
            let this = this.clone();
            async move {
                let keys = this.keys();
                let sent = Instant::now();
                let out = sync_raw::permit_acquire(&this.inner.conn, &keys, lease, &[id]).await;
                if matches!(&out, Err(e) if e.may_have_run()) {
                    let back = sync_raw::permit_release(&this.inner.conn, &keys, &[id]).await;
                    tracing::debug!(semaphore = %this.name, ?back, "acquire reply lost; its permit id given back");
                }
                out.map(|t| (t, sent))
            }
        };
        let orphan = move |out: Result<(PermitTry, Instant)>| async move {
            if let Ok((PermitTry::Taken, _)) = out {
                let back = sync_raw::permit_release(&this.inner.conn, &this.keys(), &[id]).await;
                tracing::debug!(semaphore = %this.name, ?back, "gave back a permit nobody will use");
            }
        };
        let (tried, sent) = Completing::new(inner.spawner(), request, orphan).await?;
        match tried {
            PermitTry::Busy(next) => Ok(Try::NotYet(next)),
            PermitTry::Taken if sent + lease <= Instant::now() => {
                // The answer came after the lease it granted: the permit is no longer
                // this caller's to use. What is left of it goes back.
                let this = self.clone();
                inner.spawner().errand(async move {
                    let _ = sync_raw::permit_release(&this.inner.conn, &this.keys(), &[id]).await;
                });
                Ok(Try::NotYet(Some(Duration::ZERO)))
            }
            PermitTry::Taken => Ok(Try::Done(Permit {
                id: hex(&id),
                lease,
                expires: sent + lease,
            })),
        }
    }

    /// Gives back the permit `id` (Redisson's `tryRelease`): `true` when it was held
    /// with a live lease. `false` when it is unknown, was released already, or its lease
    /// had ended (it is back among the available permits then, as with Redisson).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPermitId`] for an id that is not 32 hex digits, name errors, before
    /// anything is sent; [`Error::Closed`]; transient errors as they come (the release
    /// may then have happened or not).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the release sent or not.
    pub async fn try_release(&self, id: &str) -> Result<bool> {
        let raw = unhex(id)?;
        self.check()?;
        let keys = self.keys();
        Ok(sync_raw::permit_release(&self.inner.conn, &keys, &[raw]).await? == 1)
    }

    /// Gives back the permit `id`, as [`try_release`](Self::try_release), and fails
    /// when it was not held (Redisson's `release`).
    ///
    /// # Errors
    ///
    /// As [`try_release`](Self::try_release), and [`Error::PermitNotHeld`] for its
    /// `false`.
    ///
    /// # Cancel safety
    ///
    /// As [`try_release`](Self::try_release).
    pub async fn release(&self, id: &str) -> Result<()> {
        if self.try_release(id).await? {
            Ok(())
        } else {
            Err(Error::PermitNotHeld {
                name: self.name.to_string(),
                id: id.to_string(),
            })
        }
    }

    /// Gives the held permit `id` a new lease counted from now (on the server's clock);
    /// returns whether it was held. A permit whose lease has ended cannot be renewed.
    ///
    /// # Errors
    ///
    /// As [`try_release`](Self::try_release), and [`Error::InvalidLease`] or
    /// [`Error::DurationOutOfRange`] for the lease.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the renewal sent or not.
    pub async fn update_lease_time(&self, id: &str, lease: Duration) -> Result<bool> {
        check_lease(lease)?;
        let raw = unhex(id)?;
        self.check()?;
        sync_raw::permit_update(&self.inner.conn, &self.keys(), &raw, lease).await
    }

    /// The number of available permits, after giving back those whose lease ended (0
    /// when the semaphore does not exist).
    ///
    /// # Errors
    ///
    /// Name errors; [`Error::WrongType`]; [`Error::Closed`]; transient errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: what it may write (ended leases given back) is right either way.
    pub async fn available_permits(&self) -> Result<i64> {
        self.check()?;
        sync_raw::permit_available(&self.inner.conn, &self.keys()).await
    }

    /// Deletes the semaphore's count and its lease set `{<name>}:timeout`, as
    /// Redisson's `delete`, and returns whether either existed. Nothing is published.
    ///
    /// The permits held go with it: [`release`](Self::release) of one answers
    /// [`Error::PermitNotHeld`] and [`update_lease_time`](Self::update_lease_time)
    /// `false`. Waiters stay until their bound: a deleted semaphore has no permits, so
    /// [`try_acquire`](Self::try_acquire) returns `None` at its deadline and
    /// [`acquire`](Self::acquire) waits until permits are set again
    /// ([`try_set_permits`](Self::try_set_permits) publishes, and wakes it).
    ///
    /// # Errors
    ///
    /// Name errors; [`Error::WrongType`] when the count or the lease set holds another
    /// type (nothing deleted; Redisson's delete would take any key); [`Error::Closed`];
    /// transient errors (the delete may then have happened or not).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the delete sent or not.
    pub async fn delete(&self) -> Result<bool> {
        self.check()?;
        let keys = self.keys();
        sync_raw::count_delete(
            &self.inner.conn,
            keys.name,
            keys.channel,
            Some(keys.timeout),
            None,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_as_hex() {
        let id = [
            0u8, 1, 0xab, 0xff, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 255,
        ];
        let h = hex(&id);
        assert_eq!(h.len(), 32);
        assert_eq!(unhex(&h).unwrap(), id);
        assert_eq!(unhex(&h.to_uppercase()).unwrap(), id);
        assert!(unhex("abcd").is_err(), "too short to be an id");
        assert!(unhex(&format!("{h}00")).is_err(), "too long to be an id");
        assert!(unhex(&format!("{}zz", &h[..30])).is_err());
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
        assert!(unhex("").is_err());
        assert!(unhex("é1").is_err());
    }
}
