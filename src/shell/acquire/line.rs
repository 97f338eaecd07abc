//! An acquisition's part in its client's place in a lock's line in Redis (turns,
//! `docs/protocol.md` 2.6), or, for a fair lock, its own place in the lock's queue.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::identity::Kind;
use crate::policy::line::Counted;
use crate::shell::inflight::Completing;
use crate::shell::target::Target;
use crate::wire::raw;

/// How long a caller that gives up waits for its leave to be confirmed (see
/// [`InLine::leave`]): many round trips on any sound network, and little next to a wait.
const LEAVE_BUDGET: Duration = Duration::from_millis(5);

/// This acquisition's part in its client's place in the lock's line in Redis
/// (`docs/protocol.md` 2.6): joined at its first busy reply, or, for a plain lock's
/// caller that will wait, before its first attempt is sent. When the client's last such
/// acquisition ends without the lock from Redis (out of time, cancelled, or handed the
/// lock by a task of its own), the client leaves the line, so that no turn is given to
/// a client with nobody waiting. A grant from Redis took it out already.
pub(super) struct InLine<'a> {
    target: &'a Target,
    field: Arc<str>,
    joined: bool,
    /// The acquisition ended with a grant from Redis, which took the client out of the
    /// line already.
    pub(super) granted_by_redis: bool,
}

impl<'a> InLine<'a> {
    pub(super) fn new(target: &'a Target, field: Arc<str>) -> InLine<'a> {
        InLine {
            target,
            field,
            joined: false,
            granted_by_redis: false,
        }
    }

    /// How an attempt of this acquisition counts in its client's line: `first` for the
    /// attempt before any answer.
    pub(super) fn counted(&self, first: bool) -> Counted {
        match (self.joined, first) {
            (false, _) => Counted::No,
            (true, true) => Counted::First,
            (true, false) => Counted::Waiting,
        }
    }

    /// A plain lock's caller that will wait, before its first attempt (turns on): it
    /// counts among the client's waiters in line from now on.
    pub(super) fn join_before_attempt(&mut self) {
        if self.target.kind == Kind::Plain {
            self.busy();
        }
    }

    /// The acquisition was answered busy: the client is in line from now on.
    pub(super) fn busy(&mut self) {
        let t = self.target;
        if self.joined {
            return;
        }
        match t.kind {
            Kind::Plain if !t.inner().config.turn_window.is_zero() => {
                self.joined = true;
                t.inner().core.join_line(&t.name);
            }
            // Each waiter of a fair lock has its own place in the lock's queue, a
            // waiting writer holds new readers back, and a waiting reader may be named
            // in a readers' turn that holds writers back.
            Kind::Fair | Kind::Write | Kind::Read => self.joined = true,
            _ => {}
        }
    }
}

impl InLine<'_> {
    /// Leaves, and waits a moment for Redis to confirm it: a caller that returns empty
    /// handed should no longer be in line when it returns, or a release right after
    /// (in another client, say) would give the turn, or the fair queue's head, to a
    /// waiter that has left. Bounded by [`LEAVE_BUDGET`]: on a slow or stalled Redis the
    /// caller's time bound matters more, and the leave finishes in the background.
    pub(super) async fn leave(&mut self) {
        let Some(leave) = self.leaving() else {
            return;
        };
        let inner = self.target.inner().clone();
        let request = Completing::new(inner.spawner(), leave, |()| async {});
        let _ = tokio::time::timeout(LEAVE_BUDGET, request).await;
    }

    /// Leaves without waiting: what leaving sends goes on in the background (the
    /// waiter is being dropped, see `Waiting`'s drop).
    pub(super) fn leave_detached(&mut self) {
        if let Some(leave) = self.leaving() {
            self.target.inner().clone().spawner().errand(leave);
        }
    }

    /// What leaving sends, if anything; once.
    fn leaving(&mut self) -> Option<BoxFuture<'static, ()>> {
        if !self.joined {
            return None;
        }
        self.joined = false;
        let t = self.target;
        let inner = t.inner().clone();
        let name = t.name.clone();
        if t.kind == Kind::Plain {
            // The client's count of waiters in line drops however this one ended: the
            // flag of the next grant, and of the next waiter's, is read from it. Only
            // a client that keeps no waiter in line, and was not taken out by a grant,
            // has to take itself out.
            if !inner.core.leave_line(&name) || self.granted_by_redis {
                return None;
            }
            return Some(Box::pin(async move {
                // A waiter of the client that counted itself since is in line: its
                // attempt may have found the client there and not joined again.
                if inner.core.in_line(&name) > 0 {
                    return;
                }
                inner.core.set_placed(&name, false);
                if let Err(e) = raw::leave_line(&inner.conn, &name, &inner.id).await {
                    tracing::debug!(lock = %name, error = %e, "could not leave the line; a turn may wait for nobody once");
                }
            }));
        }
        if self.granted_by_redis {
            return None;
        }
        if matches!(t.kind, Kind::Write | Kind::Read) {
            // Readers need not wait out the mark of a writer that stopped waiting, nor
            // writers a readers' turn named for a reader that left.
            let (field, kind) = (self.field.clone(), t.kind);
            return Some(Box::pin(async move {
                if let Err(e) = raw::clear_mark(&inner.conn, &name, &field, kind).await {
                    tracing::debug!(lock = %name, error = %e, "could not clear the waiter's mark; it ends by itself");
                }
            }));
        }
        if t.kind == Kind::Fair {
            // A waiter that gives up leaves the queue at once: the waiters behind it do
            // not wait for its deadline (Redisson #1104, #2960, #3730, #6150).
            let field = self.field.clone();
            return Some(Box::pin(async move {
                if let Err(e) = raw::fair_leave(
                    &inner.conn,
                    &name,
                    Some(&field),
                    false,
                    inner.config.fair_lock_wait_timeout,
                )
                .await
                {
                    tracing::debug!(lock = %name, error = %e, "could not leave the fair lock's queue; the place ends with its deadline");
                }
            }));
        }
        None
    }
}
