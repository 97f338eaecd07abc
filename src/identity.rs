//! Who holds a lock: the client's UUID and the owner id of the caller.
//!
//! The holder field stored in the lock hash is `<client uuid>:<owner id>`, Redisson's
//! layout. Redisson uses the Java thread id as owner id; an async Rust program moves a
//! task between threads, so the owner here is the tokio task:
//!
//! - inside a tokio task, the owner id is the task's id ([`tokio::task::try_id`]), printed
//!   as a number;
//! - outside any task (plain threads, or the future given to `Runtime::block_on`, which
//!   is not a task), the owner id is `thread-<n>`, with `n` unique per OS thread of this
//!   process.
//!
//! Consequences: nested `lock()` calls in one task re-enter; a task started with
//! `tokio::spawn` is a different owner, so it contends with its parent (a child that
//! waits for a lock its parent holds, while the parent awaits the child, deadlocks).
//! Futures joined with `join!`/`select!` inside one task share its owner id and
//! therefore re-enter each other's locks, unless each runs in its own
//! [`OwnerId::scope`]. A guard stores the owner id it was taken with, so moving it to
//! another task and unlocking there releases the right hold.
//!
//! Task ids and reuse: tokio documents that a task's id may be given to a new task once
//! the old one has exited and no `JoinHandle` of it remains, which a guard can outlive.
//! A reused id would then re-enter the old task's hold. Tokio 1.x (checked up to 1.54)
//! draws ids from one process-wide 64-bit counter and never gives one out twice; the test
//! `task_ids_are_not_reused` pins that down, and scoped owners use a counter of this
//! crate's own, which never repeats.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

tokio::task_local! {
    /// The owner set by [`OwnerId::run`] for the future it runs.
    static SCOPED: OwnerId;
}

/// The identity of a lock holder within one client: a tokio task, an OS thread, or a
/// scope of its own.
///
/// By default the owner is the calling tokio task, so nested `lock()` calls in one task
/// re-enter, and a spawned task is another owner. Futures run *concurrently inside one
/// task* (`join!`, `select!`, `FuturesUnordered`) share that owner, so they do not
/// exclude each other:
///
/// ```no_run
/// # async fn demo(lock: redis_rlock::Lock) -> redis_rlock::Result<()> {
/// use redis_rlock::OwnerId;
/// let work = |i: u32| {
///     let lock = lock.clone();
///     // Each future is its own owner: the two exclude each other.
///     OwnerId::scope(async move {
///         let guard = lock.lock().await?;
///         println!("{i} inside");
///         guard.unlock().await
///     })
/// };
/// let (a, b) = tokio::join!(work(1), work(2));
/// a?;
/// b?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OwnerId {
    /// A tokio task.
    Task(tokio::task::Id),
    /// An OS thread outside any tokio task; the number is this process's own count.
    Thread(u64),
    /// An owner made by [`OwnerId::unique`] (or [`OwnerId::scope`]); the number is this
    /// process's own count.
    Scoped(u64),
}

impl OwnerId {
    /// The owner id of the caller: the owner of the innermost [`run`](Self::run) or
    /// [`scope`](Self::scope) it is in, else its tokio task, else its thread.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use redis_rlock::OwnerId;
    /// let here = OwnerId::current();
    /// let there = tokio::spawn(async { OwnerId::current() }).await.unwrap();
    /// assert_ne!(here, there);
    /// # }
    /// ```
    pub fn current() -> OwnerId {
        if let Ok(scoped) = SCOPED.try_with(|owner| *owner) {
            return scoped;
        }
        match tokio::task::try_id() {
            Some(id) => OwnerId::Task(id),
            None => OwnerId::current_thread(),
        }
    }

    /// The owner id of the calling OS thread, `thread-<n>`, whatever task or scope the
    /// caller is in: the owner Redisson would use. The same thread always gets the same
    /// id. The blocking API (`redis_rlock::blocking`, feature `blocking`) runs every call
    /// as this owner; a future runs as it with [`OwnerId::run`].
    ///
    /// ```
    /// use redis_rlock::OwnerId;
    /// let here = OwnerId::current_thread();
    /// assert_eq!(here, OwnerId::current_thread());
    /// assert_ne!(here, std::thread::spawn(OwnerId::current_thread).join().unwrap());
    /// ```
    pub fn current_thread() -> OwnerId {
        OwnerId::Thread(THREAD_NUMBER.with(|n| *n))
    }
}

impl OwnerId {
    /// A new owner id, equal to no other this process has made or will make.
    pub fn unique() -> OwnerId {
        OwnerId::Scoped(NEXT_SCOPED.fetch_add(1, Ordering::Relaxed))
    }

    /// Runs `fut` as a new owner ([`OwnerId::unique`]): locks taken inside it, however
    /// deep, belong to that owner, so nested `lock()` calls inside it re-enter, and
    /// other futures of the same task (outside the scope, or in scopes of their own)
    /// wait. Tasks spawned inside it are owners of their own, as everywhere.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `fut`.
    pub fn scope<F: Future>(fut: F) -> impl Future<Output = F::Output> {
        OwnerId::unique().run(fut)
    }

    /// Runs `fut` with `self` as its owner id, for a caller that manages owners itself:
    /// two calls with the same id are one owner (they re-enter each other's locks) even
    /// in different tasks.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `fut`.
    pub fn run<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        SCOPED.scope(self, fut)
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerId::Task(id) => write!(f, "{id}"),
            OwnerId::Thread(n) => write!(f, "thread-{n}"),
            OwnerId::Scoped(n) => write!(f, "scope-{n}"),
        }
    }
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
static NEXT_SCOPED: AtomicU64 = AtomicU64::new(1);

thread_local! {
    // std's ThreadId has no stable numeric form, so threads get numbers of our own.
    static THREAD_NUMBER: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// The hash field for `owner` under client `client_id`.
pub(crate) fn holder_field(client_id: &str, owner: OwnerId) -> String {
    use std::fmt::Write;
    let mut field = String::with_capacity(client_id.len() + 24);
    field.push_str(client_id);
    field.push(':');
    let _ = write!(field, "{owner}");
    field
}

/// Which of Redisson's lock layouts a call speaks: it selects the acquire, unlock and
/// renew scripts, the holder field and the channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `RLock` (and `RFencedLock`): the hash `<name>` of holder fields.
    Plain,
    /// The read half of `RReadWriteLock`: field `<uuid>:<owner>`, a timeout key per hold.
    Read,
    /// The write half of `RReadWriteLock`: field `<uuid>:<owner>:write`.
    Write,
    /// `RFairLock`: the plain lock's hash and field, taken in the order of a queue.
    Fair,
}

impl Kind {
    /// A half of a read-write lock (`mode` field, `redisson_rwlock` channel).
    pub(crate) fn is_rw(self) -> bool {
        matches!(self, Kind::Read | Kind::Write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_get_distinct_ids() {
        let a = OwnerId::current();
        let b = std::thread::spawn(OwnerId::current).join().unwrap();
        assert_ne!(a, b);
        assert_eq!(a, OwnerId::current());
        assert!(a.to_string().starts_with("thread-"));
    }

    #[tokio::test]
    async fn task_ids_are_not_reused() {
        // Tasks that ended with their handles dropped are the ones whose ids tokio's
        // docs allow to come back; the owner of a guard that outlived its task must
        // not be one of them.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20_000 {
            let id = tokio::spawn(async { tokio::task::id() }).await.unwrap();
            assert!(seen.insert(id), "task id {id} given out twice");
        }
    }

    #[tokio::test]
    async fn scopes_override_the_task_and_nest() {
        let task = OwnerId::current();
        let (a, b) = tokio::join!(
            OwnerId::scope(async { OwnerId::current() }),
            OwnerId::scope(async { OwnerId::current() })
        );
        assert_ne!(a, b);
        assert_ne!(a, task);
        assert!(a.to_string().starts_with("scope-"));
        let outer = OwnerId::unique();
        outer
            .run(async {
                assert_eq!(OwnerId::current(), outer);
                let inner = OwnerId::scope(async { OwnerId::current() }).await;
                assert_ne!(inner, outer);
                assert_eq!(OwnerId::current(), outer);
                // A spawned task is its own owner, scope or not.
                let child = tokio::spawn(async { OwnerId::current() }).await.unwrap();
                assert!(matches!(child, OwnerId::Task(_)));
            })
            .await;
        assert_eq!(OwnerId::current(), task);
    }

    #[tokio::test]
    async fn tasks_get_distinct_ids() {
        let a = tokio::spawn(async { OwnerId::current() }).await.unwrap();
        let b = tokio::spawn(async { OwnerId::current() }).await.unwrap();
        assert_ne!(a, b);
        assert!(matches!(a, OwnerId::Task(_)));
        assert!(a.to_string().chars().all(|c| c.is_ascii_digit()));
    }
}
