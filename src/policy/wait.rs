//! How long a waiting call may sleep before it asks Redis again, when no message wakes
//! it first. Besides the holder's lease (the PTTL of a busy answer), the family's waiters
//! keep something of theirs alive in Redis by asking: a fair lock's waiter its deadline
//! in the queue, a read-write waiter its mark. The checker's models ask here with their
//! own (model) lengths, so their cadence is the client's.

use std::time::Duration;

/// A fair lock's waiter asks again at least every third of this or of the wait timeout,
/// whichever is shorter. Only the head of the queue is told when the lock is released,
/// so a waiter behind a head that crashed learns that its turn came by asking.
pub const FAIR_RECHECK: Duration = Duration::from_secs(5);

/// How long a read-write waiter's mark lasts (a writer's holds new readers back; a
/// reader's names it for the readers' turn); the waiter asks again within half of it,
/// so the mark lasts while it waits.
pub const RW_MARK: Duration = Duration::from_secs(2);

/// What the waiter waits for, with what it keeps alive by asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waits {
    /// A plain lock: nothing but the holder's lease.
    Plain,
    /// A fair lock whose clients use this wait timeout.
    Fair { wait_timeout: Duration },
    /// A read-write lock's reader or writer, whose mark lasts this long.
    ReadWrite { mark: Duration },
}

/// The longest sleep before the next ask: the holder's lease left (`ttl`; `no_ttl` for a
/// key without expiry, which no lease lock wrote), cut to what the waiter must keep
/// alive, and at least 1 ms.
pub fn sleep_bound(waits: Waits, ttl: Option<Duration>, no_ttl: Duration) -> Duration {
    let ttl = ttl.unwrap_or(no_ttl).max(Duration::from_millis(1));
    let keep = match waits {
        Waits::Plain => return ttl,
        Waits::Fair { wait_timeout } => wait_timeout.min(FAIR_RECHECK) / 3,
        Waits::ReadWrite { mark } => mark / 2,
    };
    ttl.min(keep).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_plain_waiter_sleeps_the_lease_left() {
        assert_eq!(
            sleep_bound(Waits::Plain, Some(700 * MS), 30_000 * MS),
            700 * MS
        );
        assert_eq!(sleep_bound(Waits::Plain, None, 30_000 * MS), 30_000 * MS);
        assert_eq!(sleep_bound(Waits::Plain, Some(Duration::ZERO), MS), MS);
    }

    #[test]
    fn a_fair_waiter_asks_within_a_third_of_the_shorter_of_its_timeouts() {
        let fair = |w| Waits::Fair { wait_timeout: w };
        let long = Some(60_000 * MS);
        assert_eq!(sleep_bound(fair(300_000 * MS), long, MS), FAIR_RECHECK / 3);
        assert_eq!(sleep_bound(fair(3 * MS), long, MS), MS);
        assert_eq!(sleep_bound(fair(300_000 * MS), Some(10 * MS), MS), 10 * MS);
    }

    #[test]
    fn a_read_write_waiter_asks_within_half_its_mark() {
        let rw = Waits::ReadWrite { mark: RW_MARK };
        assert_eq!(sleep_bound(rw, Some(30_000 * MS), MS), RW_MARK / 2);
        assert_eq!(
            sleep_bound(Waits::ReadWrite { mark: 4 * MS }, Some(30_000 * MS), MS),
            2 * MS
        );
    }
}
