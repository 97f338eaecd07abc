//! The client's background work, kept track of so that it can be waited for and stopped.
//!
//! Two kinds: *errands*, short tasks that finish what a caller left behind (the release
//! of a dropped guard, a request whose future was dropped mid-flight, the undo of a grant
//! nobody will use), which [`Client::shutdown`](crate::Client::shutdown) waits for; and
//! *services*, the long-lived tasks of a client (watchdog timer, pub/sub actor, janitor,
//! failover followers), which are aborted when the client shuts down or its last handle
//! is dropped, so that none outlives the client by a sleep.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// A one-way flag that can be awaited.
#[derive(Default)]
pub(crate) struct Signal {
    flag: AtomicBool,
    notify: Notify,
}

impl Signal {
    /// Sets the flag and wakes every waiter. Returns whether it was set before.
    pub(crate) fn set(&self) -> bool {
        let was = self.flag.swap(true, Ordering::SeqCst);
        self.notify.notify_waiters();
        was
    }

    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a set() in between is not missed.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Default)]
pub(crate) struct Background {
    errands: AtomicUsize,
    idle: Notify,
    services: Mutex<Vec<AbortHandle>>,
}

/// Counts one errand until dropped. Made before the errand's task is spawned and moved
/// into it, so it is dropped with the task even if the runtime never polls it.
struct Errand(Arc<Background>);

impl Drop for Errand {
    fn drop(&mut self) {
        if self.0.errands.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Background {
    /// Runs `fut` as an errand on `runtime`.
    pub(crate) fn errand<F>(self: &Arc<Self>, runtime: &Handle, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.errands.fetch_add(1, Ordering::SeqCst);
        let errand = Errand(self.clone());
        runtime.spawn(async move {
            let _errand = errand;
            fut.await;
        });
    }

    /// Runs `fut` as a service on `runtime`.
    pub(crate) fn service<F>(&self, runtime: &Handle, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let task = runtime.spawn(fut);
        let mut services = self.services.lock();
        services.retain(|s| !s.is_finished());
        services.push(task.abort_handle());
    }

    /// Waits until no errand runs.
    pub(crate) async fn errands_done(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.errands.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Whether no errand runs now.
    pub(crate) fn errands_idle(&self) -> bool {
        self.errands() == 0
    }

    /// Errands running now.
    pub(crate) fn errands(&self) -> usize {
        self.errands.load(Ordering::SeqCst)
    }

    /// Aborts every service.
    pub(crate) fn stop_services(&self) {
        for service in self.services.lock().drain(..) {
            service.abort();
        }
    }
}

/// Where a client's errands go: its tracker and the runtime to run them on.
#[derive(Clone)]
pub(crate) struct Spawner {
    pub(crate) background: Arc<Background>,
    pub(crate) runtime: Handle,
}

impl Spawner {
    pub(crate) fn errand<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.background.errand(&self.runtime, fut);
    }
}
