//! One acquire attempt: a local re-entry, or one request to Redis (retried with the same
//! request id when its reply may have been lost), and the guard it yields.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use crate::config::{ReplicaSync, SyncFailure};
use crate::error::{Error, Result};
use crate::identity::OwnerId;
use crate::policy::line::Counted;
use crate::shell::held::{Held, HeldKind};
use crate::shell::inflight::Completing;
use crate::shell::release::{self, release_hold};
use crate::shell::services::ClientInner;
use crate::shell::target::{Hold, Target, ATTEMPTS};
use crate::state::{Begin, InFlightGuard};
use crate::stats::Event;
use crate::wire::raw::{self, Attempt};

/// What one acquire attempt found.
pub(crate) enum Tried {
    /// The lock is taken.
    Held(Held),
    /// Someone else holds it, for this long as far as Redis said (`None`: no expiry).
    Busy(Option<Duration>),
    /// It is free, but another client's turn: sleep this long at most.
    TurnBusy(Duration),
    /// The grant arrived after the lease it granted had run out, so it was given back;
    /// the value is how long the answer took.
    Late(Duration),
}

impl Target {
    /// One acquire: a local re-entry of a live watchdog hold, or else one request to
    /// Redis (retried with the same request id when its reply may have been lost).
    /// `Err(ttl)` (inside `Ok`) when the lock is busy.
    /// `adopt`: a failed unlock may have handed this task the lock; the request is then
    /// sent as a retry, which adopts such a hold instead of taking a second one.
    /// `in_line`: how the caller counts among its client's waiters in the lock's line
    /// (turns).
    pub(crate) async fn attempt(
        &self,
        owner: OwnerId,
        field: &Arc<str>,
        lease: Option<Duration>,
        adopt: bool,
        waits: bool,
        in_line: Counted,
    ) -> Result<Tried> {
        let inner = self.inner().clone();
        let hold = self.hold(field);
        // A fenced re-entry draws a token of its own in Redis, as Redisson's does.
        let reenter = lease.is_none() && !self.fenced;
        // An adopting attempt (its client's unlock offered it the lock and did not say
        // how that ended) waited for that offer already: it does not wait again for
        // the offer's mark on its field.
        let mut waited = adopt;
        let (fresh, in_flight) = loop {
            match inner
                .core
                .begin_acquire(&self.name, field, reenter, waited, adopt)
            {
                Begin::Wait => {
                    // Boxed: rarely taken, and every waiting task carries this future.
                    Box::pin(inner.core.settled(&self.name, field, inner.offer_bound())).await;
                    waited = true;
                }
                Begin::Reentered(entry) => {
                    tracing::debug!(token = entry.token, "re-entered a held lock locally");
                    let token = entry.token;
                    return Ok(Tried::Held(self.guard(
                        hold,
                        owner,
                        token,
                        HeldKind::Watchdog(entry),
                    )));
                }
                Begin::Send {
                    fresh,
                    in_flight,
                    unanswered,
                } => {
                    if !unanswered.is_empty() {
                        // Boxed: rare, and inline it was most of this future's size.
                        Box::pin(release::settle_unanswered(&inner, &hold, unanswered)).await?;
                    }
                    break (fresh, in_flight);
                }
            }
        };
        let effective = lease.unwrap_or(inner.config.watchdog_timeout);
        let request = {
            let (inner, hold) = (inner.clone(), hold.clone());
            // The field stays in flight until the outcome is settled: through an undo
            // of the grant too, in the background if the caller left.
            let outcome = async move {
                let latch = raw::fresh_acquire_latch_key(&hold.name);
                let mut call = raw::AcquireCall {
                    name: &hold.name,
                    token_key: &hold.token_key,
                    latch: &latch,
                    field: &hold.field,
                    lease: effective,
                    latch_ttl: inner.latch_ttl(),
                    fresh,
                    retry: adopt && fresh,
                    fenced: hold.fenced,
                    kind: hold.kind,
                    turn_window: inner.config.turn_window,
                    fair_wait: inner.config.fair_lock_wait_timeout,
                    waits,
                    line: line_flag(&inner, &hold.name, in_line),
                };
                let sync_retries = match inner.conn.sync() {
                    ReplicaSync::Wait {
                        on_failure: SyncFailure::Retry { attempts },
                        ..
                    } => *attempts,
                    _ => 0,
                };
                let (mut attempt, mut unsynced) = (0, 0);
                loop {
                    attempt += 1;
                    // The script that answers starts the lease afresh (a retry that
                    // recognises the first grant renews it), so the lease is counted
                    // from the send that got the answer.
                    let sent = Instant::now();
                    match raw::acquire(&inner.conn, &call).await {
                        Err(e) if e.may_have_run() && attempt < ATTEMPTS => {
                            tracing::debug!(attempt, error = %e, "acquire reply lost; retrying with the same request id");
                            call.retry = true;
                            // The lost reply may have been a busy answer that put the
                            // client in line: the retry counts as a waiter in line, with
                            // the client's other waiters as they are now.
                            if waits {
                                call.line = line_flag(&inner, &hold.name, Counted::Waiting);
                            }
                            tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
                        }
                        // Rolled back, so the same request id starts afresh.
                        Err(Error::NotReplicated { .. }) if unsynced < sync_retries => {
                            unsynced += 1;
                            call.retry = false;
                            tokio::time::sleep(Duration::from_millis(50 * unsynced as u64)).await;
                        }
                        other => {
                            match &other {
                                // A waiting caller's busy answer put the client in line.
                                Ok(Attempt::Busy(_) | Attempt::TurnBusy(_))
                                    if waits
                                        && hold.kind == crate::identity::Kind::Plain
                                        && !inner.config.turn_window.is_zero() =>
                                {
                                    inner.core.set_placed(&hold.name, true)
                                }
                                Ok(Attempt::Acquired { .. }) if call.line == raw::Line::Leave => {
                                    inner.core.set_placed(&hold.name, false)
                                }
                                _ => {}
                            }
                            if let Ok(Attempt::Acquired { latched: true, .. }) = &other {
                                // The latch only matters to retries of this call, which are over.
                                inner.janitor.discard(latch);
                            }
                            if matches!(&other, Ok(Attempt::Acquired { .. }))
                                && inner.closed.is_set()
                            {
                                // The client shut down meanwhile, and released what it
                                // held: this hold would be nobody's.
                                // Boxed, as rare: inline it would double the size
                                // of every acquire's future.
                                Box::pin(undo_grant(&inner, &hold)).await;
                                return Err(Error::Closed);
                            }
                            if matches!(&other, Err(e) if e.may_have_run()) && fresh {
                                // The last send may have granted what nobody will hold: a
                                // first hold is the field itself, so giving it back is safe.
                                Box::pin(undo_grant(&inner, &hold)).await;
                            }
                            return other
                                .map(|a| (a, sent))
                                .map_err(|e| e.during("acquire, every send"));
                        }
                    }
                }
            };
            // Paired by `map`, not in an async block: that would keep `outcome` twice
            // (captured, and as what it awaits), past the allocator's small sizes.
            outcome.map(move |outcome| (outcome, in_flight))
        };
        let orphan = {
            let (inner, hold) = (inner.clone(), hold.clone());
            move |(outcome, in_flight): (Result<(Attempt, Instant)>, InFlightGuard)| async move {
                let _in_flight = in_flight;
                match outcome {
                    Ok((Attempt::Acquired { .. }, _)) => undo_grant(&inner, &hold).await,
                    Ok((Attempt::Busy(_) | Attempt::TurnBusy(_), _)) => {
                        // A busy answer to a waiting caller put the client in the line,
                        // and the caller left before hearing it: unless others of the
                        // client wait there, no turn should go to it.
                        if waits
                            && hold.kind == crate::identity::Kind::Plain
                            && !inner.config.turn_window.is_zero()
                            && inner.core.in_line(&hold.name) == 0
                        {
                            inner.core.set_placed(&hold.name, false);
                            let _ = raw::leave_line(&inner.conn, &hold.name, &inner.id).await;
                        }
                        // A fair lock's busy answer to a waiting caller queued the
                        // field: left there, it would hold every later waiter back until
                        // its deadline. (The next call of the field waits for this to
                        // settle, so its own place is not the one removed.)
                        if waits && hold.kind == crate::identity::Kind::Fair {
                            let _ = raw::fair_leave(
                                &inner.conn,
                                &hold.name,
                                Some(&hold.field),
                                false,
                                inner.config.fair_lock_wait_timeout,
                            )
                            .await;
                        }
                        // A writer's busy answer marked it waiting, which holds new
                        // readers back (a reader's, a turn for it); as when a waiter
                        // gives up.
                        if waits
                            && matches!(
                                hold.kind,
                                crate::identity::Kind::Write | crate::identity::Kind::Read
                            )
                        {
                            let _ =
                                raw::clear_mark(&inner.conn, &hold.name, &hold.field, hold.kind)
                                    .await;
                        }
                    }
                    _ => {}
                }
            }
        };
        let (outcome, in_flight) = Completing::new(inner.spawner(), request, orphan).await;
        let (outcome, sent) = outcome?;
        match outcome {
            Attempt::Busy(ttl) => {
                inner.stats.count(Event::Busy);
                Ok(Tried::Busy(ttl))
            }
            Attempt::TurnBusy(turn) => {
                inner.stats.count(Event::Busy);
                // Where this client heard the turn announced, its hub wakes the waiters
                // if the turn runs out unused, and the unlock after the turn's holder
                // does in any case: the turn's end need not bound the sleep. The lease
                // then stands in for the holder's unknown PTTL.
                let covered = inner.pubsub.turn_covered(&self.channel);
                Ok(Tried::TurnBusy(if covered {
                    inner.config.watchdog_timeout
                } else {
                    turn
                }))
            }
            Attempt::Acquired { .. } if sent + effective <= Instant::now() => {
                // The answer came after the lease it granted had run out (Redis stalled,
                // or this future was not polled): the lock may be someone else's by now,
                // and a guard would be lost on arrival. What is left of the hold goes.
                tracing::debug!(lease = ?effective, "grant arrived after its lease ran out");
                let undo = {
                    let inner = inner.clone();
                    async move {
                        let _in_flight = in_flight;
                        undo_grant(&inner, &hold).await;
                    }
                };
                inner.spawner().errand(undo);
                Ok(Tried::Late(sent.elapsed()))
            }
            Attempt::Acquired { token, .. } => {
                tracing::debug!(lease = ?effective, watchdog = lease.is_none(), token, "lock acquired");
                Ok(Tried::Held(self.held(hold, owner, lease, sent, token)))
            }
        }
    }

    /// The guard of a hold just taken in Redis by a request sent at `sent`: registered
    /// with the watchdog, or counted as a fixed-lease hold.
    pub(crate) fn held(
        &self,
        hold: Hold,
        owner: OwnerId,
        lease: Option<Duration>,
        sent: Instant,
        token: u64,
    ) -> Held {
        let inner = self.inner();
        let kind = match lease {
            None => HeldKind::Watchdog(inner.watchdog.register(
                &self.name,
                &hold.field,
                sent,
                token,
                hold.kind,
            )),
            Some(l) => {
                let expires = sent + l;
                inner
                    .core
                    .add_fixed(&self.name, &hold.field, hold.kind, expires);
                HeldKind::Lease { expires }
            }
        };
        self.guard(hold, owner, token, kind)
    }

    /// `token` is what the script replied: 0 for a plain lock.
    pub(crate) fn guard(&self, hold: Hold, owner: OwnerId, token: u64, kind: HeldKind) -> Held {
        let token = hold.fenced.then_some(token);
        Held::new(self.clone(), hold, owner, token, kind)
    }
}

/// What a grant to this attempt does to its client's place in the lock's line (turns;
/// [`grant_effect`](crate::policy::line::grant_effect)).
fn line_flag(inner: &ClientInner, name: &str, in_line: Counted) -> raw::Line {
    let turns = !inner.config.turn_window.is_zero();
    let (counted, placed) = inner.core.line_of(name);
    // A first attempt that finds its client in line counts as a waiter that put it
    // there (see `Core::line_of`).
    let in_line = match in_line {
        Counted::First if turns && placed => Counted::Waiting,
        in_line => in_line,
    };
    crate::policy::line::grant_effect(turns, counted, in_line)
}

/// Gives back one hold taken by an acquire whose caller will not use it.
pub(crate) async fn undo_grant(inner: &Arc<ClientInner>, hold: &Hold) {
    let keep = inner
        .core
        .watched(&hold.name, &hold.field)
        .then(|| inner.watchdog.lease());
    let undo = release_hold(inner, hold, keep, 1).await;
    tracing::debug!(lock = %hold.name, ?undo, "released a hold nobody will use");
}
