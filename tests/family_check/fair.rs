//! The fair lock in the family checker: crate and Redisson waiters in one queue
//! (`tests/mc/family/fair.rs`).

use super::family::fair::{self, Fair, EMPTY, EXCLUDES, FIFO, NO_PURGE};
use super::family::Texts;
use super::{breaks, holds, Crate, Kind, Redisson};

/// W = 3 ms (a crate waiter asks again every 1 ms), holds shorter than a 3 ms lease.
fn fair(texts: Texts, actors: Vec<(Kind, u8)>, time_bound: u64, faults: (u8, u8)) -> Fair {
    Fair::new(fair::Config {
        actors,
        wait: 3,
        lease: 3,
        time_bound,
        crashes: faults.0,
        give_ups: faults.1,
        texts,
    })
}

/// The queues, either kind first: a waiter of each kind behind one of each.
fn fair_mixed() -> Vec<(Kind, u8)> {
    vec![(Redisson, 1), (Crate, 1), (Redisson, 1), (Crate, 1)]
}

#[test]
fn keeps_the_order_of_both_kinds_and_purges_no_live_waiter() {
    holds(
        "fair: Redisson, crate, Redisson, crate, 1 round each; W 3 ms, lease 3 ms, 7 ms",
        fair(fair::texts(), fair_mixed(), 7, (0, 0)),
    );
}

#[test]
fn passes_a_crashed_waiter_and_empties_its_keys() {
    let actors = vec![(Crate, 1), (Redisson, 1), (Crate, 1)];
    holds(
        "fair: crate, Redisson, crate; a crash and a give-up; W 3 ms, lease 3 ms, 7 ms",
        fair(fair::texts(), actors, 7, (1, 1)),
    );
}

#[test]
fn keeps_the_order_over_second_rounds_and_a_give_up() {
    holds(
        "fair: crate x2, Redisson x2, crate x1; a give-up; W 3 ms, lease 3 ms, 7 ms",
        fair(
            fair::texts(),
            vec![(Crate, 2), (Redisson, 2), (Crate, 1)],
            7,
            (0, 1),
        ),
    );
}

/// Redisson 1 holds; crate 0's acquire joins it (2 steps).
#[test]
fn seeded_grant_of_a_held_lock_breaks_exclusion() {
    let texts = fair::texts().edit(
        "fair_acquire.lua",
        "if redis.call('exists', KEYS[1]) == 0 then",
        "if true then",
    );
    breaks(
        "fair, seeded: a held lock is granted",
        fair(texts, vec![(Crate, 1), (Redisson, 1)], 2, (0, 0)),
        &[EXCLUDES],
    );
}

/// Crate 3 joins behind crate 1 and takes the free lock (5 steps). The grant also takes
/// W off crate 1's deadline while it stays behind: it is purged at its next ask (9
/// steps), as the floor's argument counts on grants going to the head only.
#[test]
fn seeded_grant_to_any_waiter_breaks_fifo() {
    let texts = fair::texts().edit(
        "fair_acquire.lua",
        "if not head or head == field then
        if head then
            redis.call('lpop', KEYS[2])
        end",
        "if not head or redis.call('lpos', KEYS[2], field) then
        redis.call('lrem', KEYS[2], 0, field)",
    );
    breaks(
        "fair, seeded: a free lock goes to any waiter in the queue",
        fair(texts, fair_mixed(), 3, (0, 0)),
        &[FIFO, NO_PURGE],
    );
}

/// Issue 25's case in model time (12 steps): Redisson 2 joins with the holder's PTTL + W
/// (6 ms), crate 1 behind it with 6 + W (9, below its floor 5 + 2W = 11); Redisson 2's
/// grant takes W off (6), and crate 1's own next ask, 1 ms later, purges it.
#[test]
fn seeded_crate_waiter_without_its_floor_is_purged() {
    let texts = fair::texts().edit(
        "fair_acquire.lua",
        "deadline = math.max(deadline, now + (place + 1) * wait)",
        "",
    );
    breaks(
        "fair, seeded: a crate waiter's deadline is not raised",
        fair(
            texts,
            vec![(Redisson, 1), (Crate, 1), (Redisson, 1)],
            7,
            (0, 0),
        ),
        &[NO_PURGE],
    );
}

/// Crate 0 gives up behind Redisson 1 and takes W off its deadline (3 ms, where
/// Redisson's arithmetic gives 6): crate 2's ask purges it and takes the lock (9 steps).
#[test]
fn seeded_leave_shortening_waiters_ahead_purges_a_redisson_waiter() {
    let texts = fair::texts().edit(
        "fair_leave.lua",
        "if behind and redis.call('zscore', KEYS[3], other) then",
        "if redis.call('zscore', KEYS[3], other) then",
    );
    breaks(
        "fair, seeded: a waiter that leaves takes W off those ahead of it too",
        fair(
            texts,
            vec![(Crate, 2), (Redisson, 1), (Crate, 1)],
            3,
            (0, 1),
        ),
        &[FIFO, NO_PURGE],
    );
}

/// Crate 2 waits, is granted and unlocks: its deadline stays in the set (7 steps).
#[test]
fn seeded_grant_keeping_its_deadline_leaves_the_timeout_set() {
    let texts = fair::texts().edit("fair_acquire.lua", "redis.call('zrem', KEYS[3], field)", "");
    breaks(
        "fair, seeded: a grant leaves its deadline behind",
        fair(
            texts,
            vec![(Crate, 1), (Redisson, 1), (Crate, 1)],
            3,
            (0, 0),
        ),
        &[EMPTY],
    );
}
