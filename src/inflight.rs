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
use tokio::runtime::Handle;

type Orphan<T> = Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send>;

/// A request future that finishes in the background when dropped mid-flight.
pub(crate) struct Completing<T: Send + 'static> {
    fut: Option<BoxFuture<'static, T>>,
    started: bool,
    orphan: Option<Orphan<T>>,
    runtime: Handle,
}

impl<T: Send + 'static> Completing<T> {
    /// Wraps `fut`; `orphan` receives its output when nobody waits for it any more.
    pub(crate) fn new<F, O, OF>(runtime: Handle, fut: F, orphan: O) -> Self
    where
        F: Future<Output = T> + Send + 'static,
        O: FnOnce(T) -> OF + Send + 'static,
        OF: Future<Output = ()> + Send + 'static,
    {
        Completing {
            fut: Some(Box::pin(fut)),
            started: false,
            orphan: Some(Box::new(move |v| Box::pin(orphan(v)))),
            runtime,
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
            .expect("Completing polled after it returned");
        match fut.as_mut().poll(cx) {
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
        if !self.started {
            return;
        }
        if let (Some(fut), Some(orphan)) = (self.fut.take(), self.orphan.take()) {
            // If the runtime is gone, so is the connection: the lease bounds what is left.
            self.runtime.spawn(async move {
                let out = fut.await;
                orphan(out).await;
            });
        }
    }
}
