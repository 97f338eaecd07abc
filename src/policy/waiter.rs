//! One waiting acquisition as one state, [`Step`], and what each thing that happens to
//! it makes it do next: an attempt answered ([`after_attempt`]), a sleep ended
//! ([`after_wake`]), a look at the lock's PTTL ([`after_look`]). No IO and no clock: the
//! shell (`acquire.rs`, `acquire/waiting.rs`) reads Redis, the pub/sub hub and the
//! hand-over queue, says what happened in the terms below, and carries out the step it
//! gets back. Every way a wait ends is a [`Step::Done`] built here.
//!
//! Generic over what a granted waiter holds (`G`, the guard) and the error (`E`), so
//! that the checker's model drives the same functions with its own stand-ins.

use std::time::Duration;

/// Where one waiting acquisition stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<G, E> {
    /// Ask Redis. `adopt`: the last hand-over's outcome is unknown, so a hold of the
    /// field found there is taken as the one handed over, not counted again.
    Attempt { adopt: bool },
    /// Ask the lock's PTTL before asking for it: woken by the end of another client's
    /// turn, which that client may have used ([`after_look`]).
    Look,
    /// Sleep until woken, offered the lock, or `ttl` (cut by the deadline) has passed.
    /// `lease_known`: `ttl` is the holder's lease left, as Redis has just said.
    Sleep {
        ttl: Option<Duration>,
        lease_known: bool,
    },
    /// Give back the hold just handed over (no replica acknowledged it, or it came after
    /// its lease), then ask Redis.
    GiveBack,
    /// Finished: the lock, out of time (`None`), or an error.
    Done(Result<Option<G>, E>),
}

impl<G, E> Step<G, E> {
    /// The same step, holding `f(g)` where it would hold `g`: the shell turns a
    /// hand-over's grant into the guard it returns only once the step says to take it.
    pub fn map_held<H>(self, f: impl FnOnce(G) -> H) -> Step<H, E> {
        match self {
            Step::Attempt { adopt } => Step::Attempt { adopt },
            Step::Look => Step::Look,
            Step::Sleep { ttl, lease_known } => Step::Sleep { ttl, lease_known },
            Step::GiveBack => Step::GiveBack,
            Step::Done(r) => Step::Done(r.map(|held| held.map(f))),
        }
    }
}

/// How an attempt came out.
#[derive(Debug)]
pub enum Answer<G, E> {
    /// The call's deadline came before any answer.
    NoAnswer,
    /// Granted.
    Held(G),
    /// Held by another, for this long (`None`: a key without expiry); or, with turns,
    /// free but another client's turn, for this long.
    Busy(Option<Duration>),
    /// Granted after its lease ran out, and given back already.
    Late,
    /// A transient error (a failover, a reconnect), after failing for this long in a row.
    Transient { error: E, failing_for: Duration },
    /// Any other error.
    Failed(E),
}

/// After an attempt: hold, sleep on the holder's lease, or end. A waiter rides out
/// transient errors for `retry_window`, asking again after a pause that grows with the
/// outage.
pub fn after_attempt<G, E>(answer: Answer<G, E>, retry_window: Duration) -> Step<G, E> {
    match answer {
        Answer::NoAnswer => Step::Done(Ok(None)),
        Answer::Held(g) => Step::Done(Ok(Some(g))),
        Answer::Busy(ttl) => Step::Sleep {
            ttl,
            lease_known: true,
        },
        // Given back already: ask again as soon as the holder's lease allows.
        Answer::Late => Step::Sleep {
            ttl: Some(Duration::ZERO),
            lease_known: false,
        },
        Answer::Transient { error, failing_for } if failing_for >= retry_window => {
            Step::Done(Err(error))
        }
        Answer::Transient { failing_for, .. } => Step::Sleep {
            ttl: Some(transient_pause(failing_for)),
            lease_known: false,
        },
        Answer::Failed(e) => Step::Done(Err(e)),
    }
}

/// The pause before asking again during an outage: a quarter of it so far, between
/// 50 ms and 500 ms.
pub fn transient_pause(failing_for: Duration) -> Duration {
    (failing_for / 4).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// What ended a sleep, as far as the waiter can tell.
#[derive(Debug)]
pub enum Woken<G, E> {
    /// Not handed the lock: a release heard, or the bound. `lapse`: woken by the end of
    /// another client's turn rather than a release.
    Free { lapse: bool },
    /// The unlock that offered the lock failed after it may have handed it over, or its
    /// outcome never came: ask, adopting a hold of the field that may be there.
    Unsure,
    /// The unlock gave way to another client's turn. `covered`: this client heard the
    /// turn announced, and will be woken if it lapses unused.
    Passed { covered: bool },
    /// Offered the lock, and the offer's outcome did not come within its limit, which
    /// was the call's deadline ([`offer_limit`]).
    OfferOutOfTime,
    /// Handed the lock. `unacked`: no replica acknowledged the hand-over; `late`: its
    /// lease ran out before it arrived; `closed`: the client shut down meanwhile (and
    /// released the field whole), with the error to end on.
    Handed {
        hold: G,
        unacked: bool,
        late: bool,
        closed: Option<E>,
    },
}

/// The pauses a waiter's sleep is cut to, in the client's settings.
#[derive(Clone, Copy, Debug)]
pub struct Pauses {
    /// The longest sleep without a lease to go by (the watchdog timeout).
    pub backstop: Duration,
    /// The turn window.
    pub turn_window: Duration,
}

/// After a sleep: take the lock handed over, ask Redis, or sleep on.
pub fn after_wake<G, E>(woken: Woken<G, E>, pauses: Pauses) -> Step<G, E> {
    match woken {
        // A guard would be lost on arrival, or could vanish in a failover: the hold
        // goes back and the wait goes on, as for an acquire of the waiter's own.
        Woken::Handed { unacked: true, .. } | Woken::Handed { late: true, .. } => Step::GiveBack,
        Woken::Handed {
            closed: Some(e), ..
        } => Step::Done(Err(e)),
        Woken::Handed { hold, .. } => Step::Done(Ok(Some(hold))),
        Woken::Unsure => Step::Attempt { adopt: true },
        Woken::Free { lapse: true } => Step::Look,
        Woken::Free { lapse: false } => Step::Attempt { adopt: false },
        Woken::OfferOutOfTime => Step::Done(Ok(None)),
        // Another client's turn came first; this client's own turn, or a hand-over
        // from it, wakes the waiter. Where the client heard that turn announced, its
        // lapse wakes the waiter too, and the bound is only a backstop; otherwise it
        // asks again once the turn is over, as after a busy answer for a turn.
        Woken::Passed { covered } => Step::Sleep {
            ttl: Some(if covered {
                pauses.backstop
            } else {
                pauses.turn_window
            }),
            lease_known: false,
        },
    }
}

/// How long an offered waiter waits for the offer's outcome: the unlock's reply settles
/// it within `bound` (the unlock's own timeouts) as long as its future is polled, but
/// never past the call's deadline (`left`, `None` for none). Returns the limit, and
/// whether reaching it ends the call (the deadline came first) rather than leaving the
/// offer to ask Redis on its own.
pub fn offer_limit(left: Option<Duration>, bound: Duration) -> (Duration, bool) {
    match left {
        Some(l) if l <= bound => (l, true),
        _ => (bound, false),
    }
}

/// After a look at the lock's PTTL (`None`: the look failed): a free lock is asked
/// for, a held one slept on until its holder's release, which will be heard.
pub fn after_look<G, E>(pttl: Option<i64>) -> Step<G, E> {
    match pttl {
        None | Some(-2) => Step::Attempt { adopt: false },
        Some(ms) => Step::Sleep {
            ttl: u64::try_from(ms).ok().map(Duration::from_millis),
            lease_known: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    type S = Step<&'static str, &'static str>;

    fn sleep(ttl: Option<Duration>, lease_known: bool) -> S {
        Step::Sleep { ttl, lease_known }
    }

    #[test]
    fn an_attempt_ends_the_wait_or_sleeps_on_the_lease() {
        let w = 1000 * MS;
        assert_eq!(after_attempt(Answer::NoAnswer, w), S::Done(Ok(None)));
        assert_eq!(after_attempt(Answer::Held("g"), w), S::Done(Ok(Some("g"))));
        assert_eq!(
            after_attempt::<&str, &str>(Answer::Busy(Some(70 * MS)), w),
            sleep(Some(70 * MS), true)
        );
        assert_eq!(
            after_attempt::<&str, &str>(Answer::Busy(None), w),
            sleep(None, true)
        );
        assert_eq!(
            after_attempt::<&str, &str>(Answer::Late, w),
            sleep(Some(Duration::ZERO), false)
        );
        assert_eq!(
            after_attempt::<&str, &str>(Answer::Failed("e"), w),
            S::Done(Err("e"))
        );
    }

    #[test]
    fn transient_errors_are_ridden_out_for_the_retry_window() {
        let w = 1000 * MS;
        let t = |f| {
            after_attempt::<&str, &str>(
                Answer::Transient {
                    error: "e",
                    failing_for: f,
                },
                w,
            )
        };
        assert_eq!(t(Duration::ZERO), sleep(Some(50 * MS), false));
        assert_eq!(t(800 * MS), sleep(Some(200 * MS), false));
        assert_eq!(
            t(999 * MS),
            sleep(Some(249 * MS + 750 * Duration::from_micros(1)), false)
        );
        assert_eq!(t(w), S::Done(Err("e")));
        assert_eq!(transient_pause(10_000 * MS), 500 * MS);
    }

    #[test]
    fn a_hand_over_is_taken_unless_unacknowledged_late_or_closed() {
        let p = Pauses {
            backstop: 30_000 * MS,
            turn_window: 10 * MS,
        };
        let handed = |unacked, late, closed| Woken::Handed {
            hold: "g",
            unacked,
            late,
            closed,
        };
        assert_eq!(
            after_wake(handed(false, false, None), p),
            S::Done(Ok(Some("g")))
        );
        assert_eq!(after_wake(handed(true, false, None), p), S::GiveBack);
        assert_eq!(
            after_wake(handed(false, true, Some("closed")), p),
            S::GiveBack
        );
        assert_eq!(
            after_wake(handed(false, false, Some("closed")), p),
            S::Done(Err("closed"))
        );
        assert_eq!(
            after_wake::<&str, &str>(Woken::Unsure, p),
            S::Attempt { adopt: true }
        );
        assert_eq!(
            after_wake::<&str, &str>(Woken::Free { lapse: false }, p),
            S::Attempt { adopt: false }
        );
        assert_eq!(
            after_wake::<&str, &str>(Woken::Free { lapse: true }, p),
            S::Look
        );
        assert_eq!(
            after_wake::<&str, &str>(Woken::OfferOutOfTime, p),
            S::Done(Ok(None))
        );
        assert_eq!(
            after_wake::<&str, &str>(Woken::Passed { covered: true }, p),
            sleep(Some(p.backstop), false)
        );
        assert_eq!(
            after_wake::<&str, &str>(Woken::Passed { covered: false }, p),
            sleep(Some(p.turn_window), false)
        );
    }

    #[test]
    fn an_offer_waits_for_its_unlock_but_never_past_the_deadline() {
        assert_eq!(offer_limit(None, 100 * MS), (100 * MS, false));
        assert_eq!(offer_limit(Some(500 * MS), 100 * MS), (100 * MS, false));
        assert_eq!(offer_limit(Some(100 * MS), 100 * MS), (100 * MS, true));
        assert_eq!(offer_limit(Some(30 * MS), 100 * MS), (30 * MS, true));
    }

    #[test]
    fn a_look_asks_for_a_free_lock_and_sleeps_on_a_held_one() {
        assert_eq!(after_look::<&str, &str>(None), S::Attempt { adopt: false });
        assert_eq!(
            after_look::<&str, &str>(Some(-2)),
            S::Attempt { adopt: false }
        );
        assert_eq!(after_look::<&str, &str>(Some(-1)), sleep(None, true));
        assert_eq!(
            after_look::<&str, &str>(Some(40)),
            sleep(Some(40 * MS), true)
        );
    }
}
