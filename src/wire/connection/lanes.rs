//! Connections of their own for writes followed by `WAIT`.
//!
//! `WAIT` holds the connection it runs on until the replicas acknowledge or its timeout
//! passes. On the client's one multiplexed connection every command queued behind it
//! would wait too: one lagging replica would hold up every lock call of the client, one
//! `WAIT` timeout after another. So a synced write takes a lane, a connection that
//! carries one synced call at a time, opened on demand and kept for the next call. The
//! write and its `WAIT` go on the same lane, as `WAIT` only counts the writes of the
//! connection it is sent on.

use std::future::Future;

use parking_lot::Mutex;
use redis::RedisResult;
use tokio::sync::{Semaphore, SemaphorePermit};

/// At most this many lanes are open at once per node; further synced calls wait for one.
pub(crate) const MAX_LANES: usize = 32;

/// The lanes to one server (or one cluster).
pub(crate) struct Lanes<C> {
    idle: Mutex<Vec<C>>,
    open: Semaphore,
}

/// A lane in use. [`keep`](Lane::keep) returns it for the next call; dropped otherwise
/// (after an error its state is unknown), it is closed.
pub(crate) struct Lane<'a, C> {
    conn: Option<C>,
    lanes: &'a Lanes<C>,
    _permit: SemaphorePermit<'a>,
}

impl<C> Lanes<C> {
    pub(crate) fn new() -> Lanes<C> {
        Lanes {
            idle: Mutex::new(Vec::new()),
            open: Semaphore::new(MAX_LANES),
        }
    }

    /// An idle lane, or a new one made by `open` if none is idle.
    pub(crate) async fn take<F, Fut>(&self, open: F) -> RedisResult<Lane<'_, C>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RedisResult<C>>,
    {
        let permit = self
            .open
            .acquire()
            .await
            .expect("the lanes' semaphore is never closed");
        let idle = self.idle.lock().pop();
        let conn = match idle {
            Some(c) => c,
            None => open().await?,
        };
        Ok(Lane {
            conn: Some(conn),
            lanes: self,
            _permit: permit,
        })
    }

    /// Lanes open and idle now.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().len()
    }
}

impl<C> Lane<'_, C> {
    pub(crate) fn conn(&mut self) -> &mut C {
        self.conn.as_mut().expect("present until kept")
    }

    /// Returns the lane for the next synced call.
    pub(crate) fn keep(mut self) {
        if let Some(c) = self.conn.take() {
            self.lanes.idle.lock().push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_kept_lane_is_reused_and_a_dropped_one_closed() {
        let lanes: Lanes<usize> = Lanes::new();
        let opened = AtomicUsize::new(0);
        let open = || async { Ok(opened.fetch_add(1, Ordering::SeqCst)) };
        let a = lanes.take(open).await.unwrap();
        let b = lanes.take(open).await.unwrap();
        assert_eq!(
            opened.load(Ordering::SeqCst),
            2,
            "a busy lane is not shared"
        );
        a.keep();
        drop(b);
        assert_eq!(lanes.idle(), 1);
        let mut c = lanes.take(open).await.unwrap();
        assert_eq!(*c.conn(), 0, "the kept lane is reused");
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }
}
