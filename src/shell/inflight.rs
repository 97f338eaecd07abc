//! Cancel safety for requests that change a lock.
//!
//! Once an acquire or unlock has been written to the socket, its outcome matters even if
//! the caller stops waiting: an acquire that succeeds after its `lock()` future was
//! dropped would leave a lock held by nobody. [`Completing`] wraps such a request; if it
//! is dropped after it started, the rest of the request runs in a background task, and
//! the outcome goes to an "orphan" handler that undoes it (releases the hold it took).
//! On the normal path it costs one allocation and no extra task.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;

use crate::background::Spawner;

/// What gets a request's outcome when its caller left: a closure returning a future.
/// Kept unboxed in [`Completing`]; only its future is boxed, on that rare path.
pub(crate) trait Orphan<T>: Send + 'static {
    fn take(self, outcome: T) -> BoxFuture<'static, ()>;
}

impl<T, O, OF> Orphan<T> for O
where
    O: FnOnce(T) -> OF + Send + 'static,
    OF: Future<Output = ()> + Send + 'static,
{
    fn take(self, outcome: T) -> BoxFuture<'static, ()> {
        Box::pin(self(outcome))
    }
}

/// A request future that finishes in the background when dropped mid-flight.
pub(crate) struct Completing<T: Send + 'static, O: Orphan<T>> {
    fut: Option<BoxFuture<'static, T>>,
    started: bool,
    /// Set while the inner future is being polled: if `drop` sees it, the poll panicked,
    /// and a future that panicked once is never polled again.
    in_poll: bool,
    orphan: Option<O>,
    spawner: Spawner,
}

impl<T: Send + 'static, O: Orphan<T>> Completing<T, O> {
    /// Wraps `fut`; `orphan` receives its output when nobody waits for it any more.
    pub(crate) fn new<F>(spawner: Spawner, fut: F, orphan: O) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        Completing {
            fut: Some(Box::pin(fut)),
            started: false,
            in_poll: false,
            orphan: Some(orphan),
            spawner,
        }
    }
}

// Nothing in it is pinned in place: the request future is pinned in its box.
impl<T: Send + 'static, O: Orphan<T>> Unpin for Completing<T, O> {}

impl<T: Send + 'static, O: Orphan<T>> Future for Completing<T, O> {
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

impl<T: Send + 'static, O: Orphan<T>> Drop for Completing<T, O> {
    fn drop(&mut self) {
        // A request never polled was never sent: there is nothing to finish.
        if !self.started || self.in_poll {
            return;
        }
        if let (Some(fut), Some(orphan)) = (self.fut.take(), self.orphan.take()) {
            // If the runtime is gone, so is the connection: the lease bounds what is left.
            self.spawner.errand(async move {
                let out = fut.await;
                orphan.take(out).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

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
}
