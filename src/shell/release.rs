//! Giving holds back: the release protocol, its retries, and the settlement of a
//! hand-over riding on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::identity::Kind;
use crate::policy::run::Settled;
use crate::shell::services::ClientInner;
use crate::shell::target::{Hold, ATTEMPTS};
use crate::state::{Grant, Offer, Terms, Ticket, Unanswered};
use crate::wire::raw::{self, Release, ReleaseCall, LATE_COPIES};

/// The longest pause of this client's acquires after it ended a run of hand-overs
/// (beyond the run's gap): a slow (retried) unlock says little about the round trip.
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// What the hold-back set before a release is sent counts for the round trip.
const SENT_PAUSE: Duration = Duration::from_millis(2);

/// Releases a hold nobody will use, in the background.
pub(crate) fn release_detached(inner: Arc<ClientInner>, hold: Hold) {
    // In flight from now, not from the task's first poll: an acquire of the same field
    // must wait for it (see `InFlightGuard`).
    let in_flight = inner.core.begin(&hold.name, &hold.field);
    inner.clone().spawner().errand(async move {
        let _in_flight = in_flight;
        let r = release_hold(&inner, &hold, None, 1).await;
        tracing::debug!(lock = %hold.name, outcome = ?r, "released an unused hold");
    });
}

/// An offer riding on a release. Settled by `send_release`; if it is dropped unsettled
/// (the runtime went away), the waiter is freed.
struct Offered {
    ticket: Arc<Ticket>,
    terms: Terms,
    inner: Arc<ClientInner>,
    name: Arc<str>,
    settled: bool,
}

impl Offered {
    /// The release did not hand over; it does not count toward the run either.
    fn withdraw(&mut self, unsure: bool) {
        self.settled = true;
        let core = &self.inner.core;
        core.offer_settled(&self.name, self.terms, Settled::NotHandedOver);
        if unsure {
            self.ticket.unsure()
        } else {
            self.ticket.revert()
        }
    }

    /// The release gave way to another client's turn: nothing was handed over, and the
    /// waiter goes back to sleep without asking Redis (it would only hear "not your turn").
    fn pass(&mut self) {
        self.settled = true;
        self.ticket.pass()
    }
}

impl Drop for Offered {
    fn drop(&mut self) {
        if !self.settled {
            self.withdraw(false);
        }
    }
}

/// Releases everything `field` holds on `name` (the client shuts down), and wakes the
/// lock's waiters if that frees it.
pub(crate) async fn release_field(
    inner: &Arc<ClientInner>,
    name: &Arc<str>,
    field: &Arc<str>,
    kind: Kind,
) -> Result<()> {
    let channel = kind.channel(name);
    let hold = Hold {
        name: name.clone(),
        channel: channel.into(),
        token_key: raw::token_key(name).into(),
        field: field.clone(),
        // No hand-over at shutdown, so the counter is not touched either way.
        fenced: false,
        kind,
    };
    release_hold(inner, &hold, None, u32::MAX).await.map(|_| ())
}

/// Gives back `holds` of the hash's count; when that may be the last hold, hands the lock
/// to the oldest sleeping waiter of this client if there is one (see [`crate::state`]).
pub(crate) async fn release_hold(
    inner: &Arc<ClientInner>,
    hold: &Hold,
    keep: Option<Duration>,
    holds: u32,
) -> Result<Release> {
    // A client shutting down hands nothing to its waiters: they are leaving. A
    // read-write lock never hands over (its release may free it for many readers), nor
    // does a fair lock (its queue in Redis decides who is next).
    let may_offer =
        keep.is_none() && inner.hands_over() && !inner.closed.is_set() && hold.kind == Kind::Plain;
    // Releases of this field that got no answer go first: counted on as run, they
    // would make this one partial, and a late copy of one could hit a later hold.
    let records = inner.core.unanswered(&hold.name, &hold.field);
    if !records.is_empty() {
        let _settling = inner.core.begin(&hold.name, &hold.field);
        // Boxed: rare, and inline it would be most of this future's size.
        Box::pin(settle_unanswered(inner, hold, records)).await?;
    }
    // Read before the table's section: the hub's lock is not taken inside it.
    let listening = may_offer && inner.core.asks_at_end() && inner.pubsub.is_ready(&hold.channel);
    let (_in_flight, plan, _offered) =
        inner
            .core
            .begin_release(&hold.name, &hold.field, may_offer, listening);
    match plan {
        Offer::To(ticket, terms) => {
            let offer = Offered {
                ticket,
                terms,
                inner: inner.clone(),
                name: hold.name.clone(),
                settled: false,
            };
            // Past its window, Redis publishes instead only if someone else waits.
            let ends = (terms == Terms::EndOfStreak).then_some(Duration::ZERO);
            send_release(inner, hold, keep, holds, Some(offer), ends).await
        }
        Offer::EndStreak { gap } => {
            // Held back from before the send, for about a round trip more than the
            // gap: the release's message may wake this client's waiters before its
            // reply comes back. Set again from the reply.
            inner.core.hold_back(&hold.name, gap + SENT_PAUSE);
            send_release(inner, hold, keep, holds, None, Some(gap)).await
        }
        Offer::Publish => send_release(inner, hold, keep, holds, None, None).await,
    }
}

/// Sends again, as a retry, each release of `hold`'s field that got no answer (see
/// [`Unanswered`]), before the field's next acquire or release. Each is forgotten once
/// answered; one that fails again stays recorded, and the caller fails with its error: a
/// new hold must not meet a late copy of it, nor a release count on it having run.
///
/// # Errors
///
/// A retry's own error (Redis unreachable, or a reply lost again).
pub(crate) async fn settle_unanswered(
    inner: &Arc<ClientInner>,
    hold: &Hold,
    records: Vec<Unanswered>,
) -> Result<()> {
    for u in records {
        // Past its latch's life a resend could run the release twice; a copy that late
        // is not guarded (`docs/guarantees.md`).
        if u.sent.elapsed() < LATE_COPIES {
            resend(inner, hold, &u).await?;
        }
        inner
            .core
            .settle_unanswered(&hold.name, &hold.field, &u.latch);
    }
    Ok(())
}

/// One unanswered release sent again as a retry, with the attempts of a first send.
async fn resend(inner: &Arc<ClientInner>, hold: &Hold, u: &Unanswered) -> Result<()> {
    let call = ReleaseCall {
        name: &hold.name,
        channel: &hold.channel,
        token_key: &hold.token_key,
        latch: &u.latch,
        field: &hold.field,
        next: None,
        keep: u.keep,
        holds: u.holds,
        latch_ttl: LATE_COPIES,
        retry: true,
        fenced: hold.fenced,
        kind: hold.kind,
        turn_window: inner.config.turn_window,
        gives_way: false,
        ends_run: false,
        // A retry goes to `unlock.lua`, which counts the releasing client as listening.
        listens: true,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        match raw::release(&inner.conn, &call).await {
            Ok(r) => {
                tracing::debug!(lock = %hold.name, outcome = ?r, "an unanswered release is settled");
                return Ok(());
            }
            Err(e) if e.may_have_run() && attempt < ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends one release and settles the offer riding on it. A transient failure is retried
/// with the same request id, so a retry of an unlock that did run replays its outcome
/// instead of counting down twice (or handing over twice). `ends_streak`: the release
/// may end this client's run of hand-overs; if it is published, the client's waiters
/// then hold back for two round trips, at least this long.
async fn send_release(
    inner: &Arc<ClientInner>,
    hold: &Hold,
    keep: Option<Duration>,
    holds: u32,
    mut offer: Option<Offered>,
    ends_streak: Option<Duration>,
) -> Result<Release> {
    let terms = offer.as_ref().map_or(Terms::Outright, |o| o.terms);
    let sent = Instant::now();
    let latch = raw::fresh_latch_key(&hold.name);
    let mut call = ReleaseCall {
        name: &hold.name,
        channel: &hold.channel,
        token_key: &hold.token_key,
        latch: &latch,
        field: &hold.field,
        next: offer.as_ref().map(|o| (&*o.ticket.field, o.ticket.lease)),
        keep,
        holds,
        // As long as a late copy is guarded: the janitor deletes the latch once the
        // call has its answer, and one that got none is sent again within this.
        latch_ttl: LATE_COPIES,
        retry: false,
        // A fenced waiter's grant needs a token even if the releasing handle is plain.
        fenced: hold.fenced || offer.as_ref().is_some_and(|o| o.ticket.fenced),
        kind: hold.kind,
        turn_window: inner.config.turn_window,
        gives_way: terms == Terms::GiveWay,
        ends_run: terms == Terms::EndOfStreak,
        listens: inner.pubsub.listens(&hold.channel),
    };
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        match raw::release(&inner.conn, &call).await {
            // A published full release writes no latch: the field is gone because the
            // lost first send released it.
            Ok(Release::NotHeld) if call.retry => break Ok(Release::Released),
            Ok(r) => {
                // The latch only matters to other sends of this call. Once one was
                // retried, an earlier send may still be on its way (a dead connection's
                // buffer): the latch is kept, for it to find (`unlock.lua`).
                if !call.retry && matches!(r, Release::StillHeld | Release::HandedOver { .. }) {
                    inner.janitor.discard(latch);
                }
                break Ok(r);
            }
            Err(e) if e.may_have_run() && attempt < ATTEMPTS => {
                tracing::debug!(attempt, error = %e, "unlock reply lost; retrying with the same request id");
                call.retry = true;
                tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
            }
            Err(e) => {
                if e.may_have_run() {
                    let u = Unanswered {
                        latch: latch.clone(),
                        holds,
                        keep,
                        sent,
                    };
                    inner.core.add_unanswered(&hold.name, &hold.field, u);
                }
                break Err(e.during("unlock, every send; the hold may last until its lease ends"));
            }
        }
    };
    let released = outcome.as_ref().is_ok_and(|r| *r == Release::Released);
    match (ends_streak, released) {
        (Some(gap), true) => {
            // Two round trips: the message's way to the other waiters and their acquire.
            // Capped: a slow (retried) unlock says little about the round trip. At
            // least `gap`, for waiters that do not hear the message.
            let period = (sent.elapsed() * 2).min(MAX_PAUSE).max(gap);
            inner.core.hold_back(&hold.name, period);
        }
        // Nothing was published: no reason to hold back.
        (Some(_), false) if offer.is_none() => inner.core.hold_back(&hold.name, Duration::ZERO),
        _ => {}
    }
    if let Some(mut o) = offer.take() {
        match &outcome {
            Ok(Release::HandedOver { token, unacked }) => {
                o.settled = true;
                let mark = inner.core.handing(&hold.name, &o.ticket.field);
                let delivered = o.ticket.deliver(
                    Grant {
                        token: *token,
                        sent,
                        unacked: *unacked,
                    },
                    Box::new(mark),
                );
                if delivered {
                    inner.core.wake_field(&hold.name, &o.ticket.field);
                } else {
                    // The waiter left meanwhile: the hold is ours to give back.
                    release_detached(
                        inner.clone(),
                        Hold {
                            field: o.ticket.field.clone(),
                            ..hold.clone()
                        },
                    );
                }
            }
            Ok(Release::GaveWay) => {
                // The waiter sleeps on, in its place, until its client's turn comes.
                o.pass();
                inner
                    .core
                    .offer_settled(&hold.name, terms, Settled::GaveWay);
            }
            // Published past its window, the run is over (`Run::settled`).
            Ok(_) => o.withdraw(false),
            // Maybe it ran: the waiter adopts what it may have been given.
            Err(_) => o.withdraw(true),
        }
    }
    match outcome {
        Ok(Release::GaveWay) => Ok(Release::Released),
        other => other,
    }
}

/// What `Client::shutdown` does: closes the client to new work, releases every hold,
/// waits for errands and requests, flushes latches and stops the services.
pub(crate) async fn shut_down(inner: &Arc<ClientInner>) -> Result<()> {
    inner.closed.set();
    let limit = inner.offer_bound();
    inner.watchdog.stop();
    let holds = inner.core.drain();
    let permits = inner.watchdog.drain_permits();
    let mut failed = None;
    let work = async {
        // The permits of guards still alive: nothing else would give a plain
        // semaphore's back.
        if let Err(e) = crate::shell::watchdog::give_back(&inner.conn, permits).await {
            failed.get_or_insert(e);
        }
        let releases = holds
            .iter()
            .map(|((name, field), kind)| release_field(inner, name, field, *kind));
        for (outcome, (name, _)) in futures_util::future::join_all(releases)
            .await
            .into_iter()
            .zip(holds.iter().map(|(slot, _)| slot))
        {
            if let Err(e) = outcome {
                tracing::warn!(lock = %name, error = %e, "shutdown could not release a hold; it expires with its lease");
                failed.get_or_insert(e);
            }
        }
        // Errands may start requests and requests errands (a cancelled acquire's
        // undo): wait until both are quiet at once.
        loop {
            inner.background.errands_done().await;
            inner.core.all_settled().await;
            if inner.background.errands_idle() {
                break;
            }
        }
        inner.janitor.flush().await;
    };
    let finished = tokio::time::timeout(limit, work).await.is_ok();
    inner.background.stop_services();
    if !finished {
        return Err(Error::Timeout {
            op: "shutdown",
            after: limit,
        });
    }
    match failed {
        Some(e) => Err(e),
        None => {
            tracing::debug!(released = holds.len(), "client shut down");
            Ok(())
        }
    }
}
