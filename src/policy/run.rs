//! A run of hand-overs inside one client (`docs/protocol.md` 2.2, 2.6): while tasks of
//! the client sleep waiting for a name, its releases hand the lock to the oldest of them
//! inside the unlock script. A run is bounded, so that waiters of other clients, and
//! waiters nobody can see (a Redisson `tryLock()` loop), get the lock too.
//!
//! Times are durations since an origin the caller picks (the client's clock, or the
//! checker's model clock).

use std::time::Duration;

/// Hand-overs in a row after which the next one gives way to another client of this
/// crate waiting in the lock's line: that client's turn comes first, and this client's
/// waiters follow it. Runs between clients then take turns, so processes share a busy
/// lock evenly, while a run of a few grants keeps most hand-offs inside one process,
/// where they are cheap.
pub const GIVE_WAY_AFTER: u32 = 4;

/// How many windows a run may last when the unlock script finds nobody else waiting at
/// the end of each: then it ends whoever waits, so that a waiter the script cannot
/// count gets a chance at least this often (80 ms with the default window), and not
/// only every `limit` grants, which with long holds is seconds.
pub const RUN_WINDOWS: u32 = 16;

/// A run that ended whoever waits (its count, or `RUN_WINDOWS`) leaves the lock to
/// others for this share of its length: the client's waiters and new calls hold back
/// that long. A waiter nobody can see gets in only if it tries while the lock is free;
/// 1/32 of an 80 ms run is 2.5 ms, in which one that tries every 2 ms does
/// (`tests/redisson_peers.rs`), at a cost of about 3% of the client's grants while
/// nobody else wants the lock.
pub const RUN_GAP_SHARE: u32 = 32;

/// The longest such gap: enough for a waiter that tries every few ms, and no idle lock
/// for long after runs of long holds (1/32 of two 1.6 s holds would be 50 ms).
pub const RUN_GAP_MAX: Duration = Duration::from_millis(5);

/// When the unlock script hands the lock to an offered waiter (`docs/protocol.md` 2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Terms {
    /// Always.
    Outright,
    /// Unless another client waits in line, whose turn then comes first (flag `g`).
    GiveWay,
    /// The run's window is over: only if nobody outside this client may be waiting
    /// for the lock; else the release is published and the run ends (flag `e`).
    EndOfStreak,
}

/// The client's bounds on a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Hand-overs in a run at most; 0: none at all.
    pub limit: u32,
    /// How long a run goes on before Redis is asked whether anyone else waits.
    pub window: Duration,
    /// Whether the unlock script can tell that nobody outside this client waits (it can
    /// count every subscriber of the lock's channel), so that a run past its window may
    /// go on.
    pub asks_at_end: bool,
}

/// What a full release does, with a waiter of the client asleep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Next {
    /// Publish: the client hands nothing over.
    Publish,
    /// Publish, ending the run, and leave the lock to others.
    End {
        /// How long the client's waiters and new calls hold back at least: a share of
        /// the run when it ended whoever waits, else nothing beyond the usual pause.
        gap: Duration,
    },
    /// Offer the lock to the oldest sleeping waiter on these terms.
    Offer(Terms),
}

/// How an offer's release came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Settled {
    /// The waiter holds the lock.
    HandedOver,
    /// The release gave way to another client's turn (`Terms::GiveWay`).
    GaveWay,
    /// Nothing was handed over: published, partial, failed, or withdrawn.
    NotHandedOver,
}

/// One name's run of hand-overs in one client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Run {
    /// Hand-overs in a row since the last published release.
    streak: u32,
    /// When the run's first hand-over was offered.
    began: Option<Duration>,
    /// When its current window began: at its first hand-over, and again at each one
    /// that Redis made past the window because nobody else waited.
    window_began: Option<Duration>,
}

impl Run {
    /// What a full release at `now` does; `asleep`: whether a waiter of the client
    /// sleeps on the name (else the release is published). A run whose window is over
    /// ends with a release that has nobody to hand to, even while other holds of the
    /// name keep its entry: else the next contention, however much later, would find
    /// it and end at its first offer (published and held back, not handed over).
    pub fn release(
        &mut self,
        now: Duration,
        limits: &Limits,
        listening: bool,
        asleep: bool,
    ) -> Next {
        if asleep {
            return self.next(now, limits, listening);
        }
        if self.idle(now, limits.window) {
            *self = Run::default();
        }
        Next::Publish
    }

    /// What a full release at `now` does while a waiter of the client sleeps.
    /// `listening`: the client's own subscription to the lock's channel is confirmed,
    /// so that the one subscriber the script allows is this client. A run that ends
    /// starts afresh.
    pub fn next(&mut self, now: Duration, limits: &Limits, listening: bool) -> Next {
        if limits.limit == 0 {
            return Next::Publish;
        }
        let since = |t: Option<Duration>| t.map_or(Duration::ZERO, |t| now.saturating_sub(t));
        let over = self.streak > 0 && since(self.window_began) >= limits.window;
        let capped = since(self.began) >= limits.window.saturating_mul(RUN_WINDOWS);
        let whoever_waits = self.streak >= limits.limit || (over && capped);
        if whoever_waits || (over && !(limits.asks_at_end && listening)) {
            let gap = match whoever_waits {
                true => (since(self.began) / RUN_GAP_SHARE).min(RUN_GAP_MAX),
                false => Duration::ZERO,
            };
            *self = Run::default();
            return Next::End { gap };
        }
        // Past the window, Redis decides. The count and the first hand-over's time
        // stay, so `limit` and `RUN_WINDOWS` still end the run whoever waits.
        Next::Offer(if over {
            Terms::EndOfStreak
        } else if self.streak >= GIVE_WAY_AFTER {
            Terms::GiveWay
        } else {
            Terms::Outright
        })
    }

    /// A hand-over on `terms` was offered at `now`.
    pub fn offered(&mut self, now: Duration, terms: Terms) {
        if self.streak == 0 {
            self.began = Some(now);
        }
        if self.streak == 0 || terms == Terms::EndOfStreak {
            self.window_began = Some(now);
        }
        self.streak += 1;
    }

    /// The release that carried an offer on `terms` came out so.
    pub fn settled(&mut self, terms: Terms, outcome: Settled) {
        match outcome {
            Settled::HandedOver => {}
            // The next run starts afresh after the other client's turn.
            Settled::GaveWay => *self = Run::default(),
            // Redis published past the window: the run is over.
            Settled::NotHandedOver if terms == Terms::EndOfStreak => *self = Run::default(),
            // As if it had not been offered.
            Settled::NotHandedOver => {
                self.streak = self.streak.saturating_sub(1);
                if self.streak == 0 {
                    *self = Run::default();
                }
            }
        }
    }

    /// Hand-overs in a row so far.
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// No run still counting at `now`: none began, or its window is over.
    pub fn idle(&self, now: Duration, window: Duration) -> bool {
        self.streak == 0 || self.window_began.is_none_or(|t| t + window <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn limits(limit: u32) -> Limits {
        Limits {
            limit,
            window: 5 * MS,
            asks_at_end: true,
        }
    }

    /// Offers at `now` as `next` says, and returns the terms.
    fn offer(run: &mut Run, now: Duration, l: &Limits) -> Next {
        let next = run.next(now, l, true);
        if let Next::Offer(terms) = next {
            run.offered(now, terms);
        }
        next
    }

    #[test]
    fn a_run_gives_way_after_four_and_ends_at_its_count() {
        let (mut run, l) = (Run::default(), limits(6));
        for _ in 0..GIVE_WAY_AFTER {
            assert_eq!(offer(&mut run, MS, &l), Next::Offer(Terms::Outright));
        }
        assert_eq!(offer(&mut run, MS, &l), Next::Offer(Terms::GiveWay));
        assert_eq!(offer(&mut run, MS, &l), Next::Offer(Terms::GiveWay));
        assert!(matches!(offer(&mut run, MS, &l), Next::End { .. }));
        assert_eq!(run.streak(), 0);
    }

    #[test]
    fn a_release_with_nobody_asleep_ends_a_run_only_past_its_window() {
        let (mut run, l) = (Run::default(), limits(6));
        assert_eq!(offer(&mut run, MS, &l), Next::Offer(Terms::Outright));
        // The client's waiters between attempts: the run still counts.
        assert_eq!(run.release(3 * MS, &l, true, false), Next::Publish);
        assert_eq!(run.streak(), 1);
        assert_eq!(run.release(6 * MS, &l, true, false), Next::Publish);
        assert_eq!(run, Run::default());
        // The next contention starts a run of its own, handed over outright.
        assert_eq!(
            run.release(900 * MS, &l, true, true),
            Next::Offer(Terms::Outright)
        );
    }

    #[test]
    fn past_its_window_redis_decides_until_the_cap_ends_it_with_a_gap() {
        let (mut run, l) = (Run::default(), limits(10_000));
        assert_eq!(
            offer(&mut run, Duration::ZERO, &l),
            Next::Offer(Terms::Outright)
        );
        let mut now = Duration::ZERO;
        let ended = loop {
            now += 6 * MS;
            match offer(&mut run, now, &l) {
                Next::Offer(Terms::EndOfStreak) => {}
                Next::End { gap } => break gap,
                other => panic!("{other:?}"),
            }
        };
        assert!(now >= 5 * MS * RUN_WINDOWS, "ended at {now:?}");
        assert!(ended >= now / RUN_GAP_SHARE - MS, "a gap of {ended:?}");
        // Runs of long holds leave no longer gap than `RUN_GAP_MAX`.
        let mut run = Run::default();
        run.offered(Duration::ZERO, Terms::Outright);
        let gap = run.next(Duration::from_secs(2), &l, true);
        assert_eq!(gap, Next::End { gap: RUN_GAP_MAX });
        // Without the count of listeners, the window's end ends it, with no gap.
        let mut run = Run::default();
        run.offered(Duration::ZERO, Terms::Outright);
        assert_eq!(
            run.next(6 * MS, &l, false),
            Next::End {
                gap: Duration::ZERO
            }
        );
    }

    #[test]
    fn a_withdrawn_offer_leaves_the_run_as_it_was() {
        let (mut run, l) = (Run::default(), limits(100));
        offer(&mut run, MS, &l);
        offer(&mut run, MS, &l);
        run.settled(Terms::Outright, Settled::NotHandedOver);
        assert_eq!(run.streak(), 1);
        run.settled(Terms::EndOfStreak, Settled::NotHandedOver);
        assert_eq!(run, Run::default());
        assert_eq!(Run::default().next(MS, &limits(0), true), Next::Publish);
    }
}
