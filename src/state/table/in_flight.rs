//! The requests of each field in flight: one at a time per field, so that a retry can
//! tell what its lost first send did (see [`InFlightGuard`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{Core, Holder};

impl Core {
    /// Records a request of `(name, field)` in flight until the guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>, name: &Arc<str>, field: &Arc<str>) -> InFlightGuard {
        self.with_holder(name, field, |h, _| self.start(h));
        self.guard(name, field)
    }

    pub(super) fn start(&self, h: &mut Holder) {
        h.in_flight += 1;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn guard(self: &Arc<Self>, name: &Arc<str>, field: &Arc<str>) -> InFlightGuard {
        InFlightGuard {
            core: self.clone(),
            name: name.clone(),
            field: field.clone(),
        }
    }

    fn end(&self, name: &Arc<str>, field: &Arc<str>) {
        self.with_holder(name, field, |h, _| {
            h.in_flight = h.in_flight.saturating_sub(1);
            if h.in_flight == 0 {
                if let Some(n) = h.settled.take() {
                    n.notify_waiters();
                }
            }
        });
        // Both orders are `SeqCst`: if this misses a waiter's `awaited`, that waiter's
        // next look at `in_flight` comes after this decrement and finds it settled.
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 && self.awaited.load(Ordering::SeqCst)
        {
            self.none.notify_waiters();
        }
    }

    /// Waits until no request of `(name, field)` is in flight, at most `limit`: a request
    /// whose future is kept but no longer polled must not stall the field for good.
    pub(crate) async fn settled(&self, name: &Arc<str>, field: &Arc<str>, limit: Duration) {
        let wait = async {
            loop {
                let notify = {
                    let mut names = self.names.lock();
                    let h = names.get_mut(name).and_then(|e| e.holders.get_mut(field));
                    match h {
                        Some(h) if h.in_flight > 0 => h.settled.get_or_insert_default().clone(),
                        _ => return,
                    }
                };
                let done = notify.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                let now = self.peek(name, field, |h| {
                    let ours = h.settled.as_ref().is_some_and(|n| Arc::ptr_eq(n, &notify));
                    (h.in_flight, ours)
                });
                match now {
                    None | Some((0, _)) => return,
                    // Settled and started again in between: wait on the new round's signal.
                    Some((_, false)) => continue,
                    Some((_, true)) => done.await,
                }
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }

    /// Waits until no request of any field is in flight.
    pub(crate) async fn all_settled(&self) {
        self.awaited.store(true, Ordering::SeqCst);
        loop {
            let none = self.none.notified();
            tokio::pin!(none);
            none.as_mut().enable();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            none.await;
        }
    }

    /// Whether a request of `(name, field)` is in flight.
    pub(crate) fn in_flight(&self, name: &str, field: &str) -> bool {
        self.peek(name, field, |h| h.in_flight > 0).unwrap_or(false)
    }
}

/// One request of a field in flight; dropping it settles it.
///
/// A retry recognises what its lost first send did by the holder field alone where no
/// latch was written (a first grant, a published release; see `docs/protocol.md` 2.1,
/// 2.2). That is only sound while no other request of the same field runs in between,
/// and one could: a guard dropped in the background, or a cancelled `lock()` finishing
/// there, while the same task takes the lock again. So an acquire of a field waits until
/// the field's earlier requests are settled, retries and undos included.
pub(crate) struct InFlightGuard {
    pub(super) core: Arc<Core>,
    pub(super) name: Arc<str>,
    pub(super) field: Arc<str>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.core.end(&self.name, &self.field);
    }
}
