//! Cancel safety for requests that change a lock.
//!
//! Once an acquire or unlock has been written to the socket, its outcome matters even if
//! the caller stops waiting: an acquire that succeeds after its `lock()` future was
//! dropped would leave a lock held by nobody. [`Completing`] wraps such a request; if it
//! is dropped after it started, the rest of the request runs in a background task, and
//! the outcome goes to an "orphan" handler that undoes it (releases the hold it took).
//! On the normal path it costs one allocation and no extra task.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::background::Spawner;
use crate::watchdog::SlotKey;

type Orphan<T> = Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send>;

/// A request future that finishes in the background when dropped mid-flight.
pub(crate) struct Completing<T: Send + 'static> {
    fut: Option<BoxFuture<'static, T>>,
    started: bool,
    /// Set while the inner future is being polled: if `drop` sees it, the poll panicked,
    /// and a future that panicked once is never polled again.
    in_poll: bool,
    orphan: Option<Orphan<T>>,
    spawner: Spawner,
}

impl<T: Send + 'static> Completing<T> {
    /// Wraps `fut`; `orphan` receives its output when nobody waits for it any more.
    pub(crate) fn new<F, O, OF>(spawner: Spawner, fut: F, orphan: O) -> Self
    where
        F: Future<Output = T> + Send + 'static,
        O: FnOnce(T) -> OF + Send + 'static,
        OF: Future<Output = ()> + Send + 'static,
    {
        Completing {
            fut: Some(Box::pin(fut)),
            started: false,
            in_poll: false,
            orphan: Some(Box::new(move |v| Box::pin(orphan(v)))),
            spawner,
        }
    }
}

impl<T: Send + 'static> Future for Completing<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        this.started = true;
        let fut = this
            .fut
            .as_mut()
            .expect("Completing polled after it returned (a bug of this crate)");
        this.in_poll = true;
        let polled = fut.as_mut().poll(cx);
        this.in_poll = false;
        match polled {
            Poll::Ready(v) => {
                this.fut = None;
                this.orphan = None;
                Poll::Ready(v)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for Completing<T> {
    fn drop(&mut self) {
        // A request never polled was never sent: there is nothing to finish.
        if !self.started || self.in_poll {
            return;
        }
        if let (Some(fut), Some(orphan)) = (self.fut.take(), self.orphan.take()) {
            // If the runtime is gone, so is the connection: the lease bounds what is left.
            self.spawner.errand(async move {
                let out = fut.await;
                orphan(out).await;
            });
        }
    }
}

/// Requests that change a lock, in flight per `(name, holder field)`.
///
/// A retry recognises what its lost first send did by the holder field alone where no
/// latch was written (a first grant, a published release; see `docs/protocol.md` 2.1,
/// 2.2). That is only sound while no other request of the same field runs in between,
/// and one could: a guard dropped in the background, or a cancelled `lock()` finishing
/// there, while the same task takes the lock again. So a request of a field waits until
/// the field's earlier requests are settled, retries included.
#[derive(Default)]
pub(crate) struct InFlight {
    fields: Mutex<HashMap<SlotKey, (u32, Arc<Notify>)>>,
    /// Told when the last request in flight settles.
    none: Notify,
}

/// One request in flight; dropping it settles it.
pub(crate) struct InFlightGuard {
    registry: Arc<InFlight>,
    key: SlotKey,
}

impl InFlight {
    /// Records a request of `(name, field)` until the guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>, name: &Arc<str>, field: &Arc<str>) -> InFlightGuard {
        let key = (name.clone(), field.clone());
        self.fields.lock().entry(key.clone()).or_default().0 += 1;
        InFlightGuard {
            registry: self.clone(),
            key,
        }
    }

    /// Whether a request of `(name, field)` is in flight.
    pub(crate) fn busy(&self, name: &Arc<str>, field: &Arc<str>) -> bool {
        self.fields
            .lock()
            .contains_key(&(name.clone(), field.clone()))
    }

    /// Waits until no request of any field is in flight.
    pub(crate) async fn all_settled(&self) {
        loop {
            let none = self.none.notified();
            tokio::pin!(none);
            none.as_mut().enable();
            if self.fields.lock().is_empty() {
                return;
            }
            none.await;
        }
    }

    /// Waits until no request of `(name, field)` is in flight, at most `limit`: a request
    /// whose future is kept but no longer polled must not stall the field for good.
    pub(crate) async fn settled(&self, name: &Arc<str>, field: &Arc<str>, limit: Duration) {
        let key = (name.clone(), field.clone());
        let wait = async {
            loop {
                let Some(notify) = self.fields.lock().get(&key).map(|e| e.1.clone()) else {
                    return;
                };
                let done = notify.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if !self.fields.lock().contains_key(&key) {
                    return;
                }
                done.await;
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut fields = self.registry.fields.lock();
        if let Some(entry) = fields.get_mut(&self.key) {
            entry.0 -= 1;
            if entry.0 == 0 {
                let (_, notify) = fields.remove(&self.key).expect("present");
                notify.notify_waiters();
                if fields.is_empty() {
                    self.registry.none.notify_waiters();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_future_that_panicked_is_not_finished_in_the_background() {
        use futures_util::FutureExt;
        let polls = Arc::new(AtomicUsize::new(0));
        struct Panicky(Arc<AtomicUsize>);
        impl Future for Panicky {
            type Output = ();
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
                self.0.fetch_add(1, Ordering::SeqCst);
                panic!("poll panics");
            }
        }
        let fut = Panicky(polls.clone());
        let spawner = Spawner {
            background: Default::default(),
            runtime: tokio::runtime::Handle::current(),
        };
        let completing = Completing::new(spawner, fut, |_: ()| async {});
        let caught = std::panic::AssertUnwindSafe(completing)
            .catch_unwind()
            .await;
        assert!(caught.is_err());
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "polled again after a panic"
        );
    }

    #[tokio::test]
    async fn a_field_is_settled_when_its_last_request_ends() {
        let reg = Arc::new(InFlight::default());
        let (n, f): (Arc<str>, Arc<str>) = ("n".into(), "f".into());
        let long = Duration::from_secs(60);
        reg.settled(&n, &f, long).await; // nothing in flight
        let a = reg.begin(&n, &f);
        let b = reg.begin(&n, &f);
        let waiting = {
            let (reg, n, f) = (reg.clone(), n.clone(), f.clone());
            tokio::spawn(async move { reg.settled(&n, &f, long).await })
        };
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
        // A request never settled stalls the field only for the limit.
        let _stuck = reg.begin(&n, &f);
        reg.settled(&n, &f, Duration::from_millis(10)).await;
    }
}
