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
//! therefore re-enter each other's locks. A guard stores the owner id it was taken with,
//! so moving it to another task and unlocking there releases the right hold.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of a lock holder within one client: a tokio task or an OS thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OwnerId {
    /// A tokio task.
    Task(tokio::task::Id),
    /// An OS thread outside any tokio task; the number is this process's own count.
    Thread(u64),
}

impl OwnerId {
    /// The owner id of the caller: its tokio task, or else its thread.
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
        match tokio::task::try_id() {
            Some(id) => OwnerId::Task(id),
            None => OwnerId::Thread(THREAD_NUMBER.with(|n| *n)),
        }
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerId::Task(id) => write!(f, "{id}"),
            OwnerId::Thread(n) => write!(f, "thread-{n}"),
        }
    }
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    // std's ThreadId has no stable numeric form, so threads get numbers of our own.
    static THREAD_NUMBER: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// The hash field for `owner` under client `client_id`.
pub(crate) fn holder_field(client_id: &str, owner: OwnerId) -> String {
    format!("{client_id}:{owner}")
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
    async fn tasks_get_distinct_ids() {
        let a = tokio::spawn(async { OwnerId::current() }).await.unwrap();
        let b = tokio::spawn(async { OwnerId::current() }).await.unwrap();
        assert_ne!(a, b);
        assert!(matches!(a, OwnerId::Task(_)));
        assert!(a.to_string().chars().all(|c| c.is_ascii_digit()));
    }
}
