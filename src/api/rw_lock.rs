//! The read-write lock handle (Redisson's `RReadWriteLock`): two [`Lock`]s on one hash.

use std::sync::Arc;

use crate::api::client::Client;
use crate::api::lock::Lock;
use crate::identity::Kind;
use crate::shell::services::ClientInner;

/// A named distributed read-write lock in Redisson's `RReadWriteLock` layout: many
/// readers or one writer, across clients and processes, Java services using Redisson
/// included.
///
/// Made by [`Client::read_write_lock`]; cheap to clone. [`read`](Self::read) and
/// [`write`](Self::write) each return a [`Lock`] with every method of a plain lock
/// (`lock`, `try_lock`, `try_lock_for`, `lock_with_lease`, `run`, queries) and the same
/// [`LockGuard`](crate::LockGuard)s: re-entrant per owner, renewed by the watchdog when
/// taken without a lease (read holds too: their per-hold timeout keys are renewed with
/// the hash, which Redisson did not do before 3.8.1, #1604), loss reported through
/// [`LockGuard::lost`](crate::LockGuard::lost), cancel safe.
///
/// - Readers share: a read lock is granted while no writer holds the lock.
/// - A writer excludes readers and writers, other owners of this client included.
/// - The owner that holds the write lock may also take the read lock (a downgrade, as
///   in Redisson); releasing the write lock then leaves it a reader.
/// - The owner that holds the read lock gets [`Error::UpgradeRefused`](crate::Error::UpgradeRefused)
///   at once from any call of `write()` that would take the lock: readers block every
///   writer, that owner too, so it would wait for itself forever.
/// - Between clients of this crate neither side starves: a waiting writer holds new
///   readers back, and a writer's unlock that finds readers waiting gives them the next
///   turn (`docs/protocol.md` 7.4). Redisson's readers and writers look at neither, so
///   against them the lock is as unfair as Redisson's.
/// - No hand-over: every release is published on `redisson_rwlock:{<name>}`, where all
///   waiters of the name sleep on the client's one pub/sub connection (see
///   `docs/protocol.md`, "Read-write lock").
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// let client = redis_rlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let rw = client.read_write_lock("catalog");
///
/// let r = rw.read().lock().await?;           // shared with other readers
/// r.unlock().await?;
///
/// let w = rw.write().lock().await?;          // alone
/// let r = rw.read().lock().await?;           // downgrade: the writer may read
/// w.unlock().await?;                         // still a reader
/// r.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReadWriteLock {
    inner: Arc<ClientInner>,
    name: Arc<str>,
}

impl std::fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("name", &self.name)
            .finish()
    }
}

impl ReadWriteLock {
    /// The lock's name, which is also its Redis key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The read half (Redisson's `readLock()`): held by many owners at once.
    pub fn read(&self) -> Lock {
        Lock::new(self.inner.clone(), self.name.to_string(), false, Kind::Read)
    }

    /// The write half (Redisson's `writeLock()`): held by one owner, with no reader
    /// besides that owner's own.
    pub fn write(&self) -> Lock {
        Lock::new(
            self.inner.clone(),
            self.name.to_string(),
            false,
            Kind::Write,
        )
    }
}

impl Client {
    /// A handle to the read-write lock named `name`, in Redisson's `RReadWriteLock`
    /// layout: the hash `<name>` with a `mode` field, holder fields `<uuid>:<owner>`
    /// (readers) and `<uuid>:<owner>:write` (the writer), a timeout key
    /// `{<name>}:<uuid>:<owner>:rwlock_timeout:<n>` per read hold, and the channel
    /// `redisson_rwlock:{<name>}`. Nothing is sent until it is used. The name must not be
    /// used as a plain [`lock`](Self::lock) at the same time: the layouts differ.
    pub fn read_write_lock(&self, name: impl Into<String>) -> ReadWriteLock {
        ReadWriteLock {
            inner: self.inner.clone(),
            name: name.into().into(),
        }
    }
}
