//! The checker over the lock family (issue 25, goal 2): every interleaving, within small
//! bounds, of this crate's and Redisson's actors on a semaphore, a permit-expirable
//! semaphore, a count-down latch, a read-write lock and a fair lock (its tests in
//! `family_check/fair.rs`), over the crate's real scripts and Redisson's own typed in
//! (`tests/mc/family/`). Each property is also shown broken by a seeded bug, an edit of
//! one script's text. Run with `--nocapture` for each config's state count and time,
//! and the counterexamples' traces.

#[allow(dead_code)]
#[path = "mc/cache.rs"]
mod cache;
mod checker;
#[allow(dead_code)]
#[path = "mc/explore.rs"]
mod explore;
#[path = "mc/family/mod.rs"]
mod family;

use explore::{explore, Report};
use family::latch::{self, Latch, WAKE};
use family::permits::{self, Permits};
use family::rw::{self, Role, Rw, EXCLUDES, READER_BYPASS, SHARE, WRITER_BYPASS};
use family::semaphore::{self, Kind, Sem, EXCEED, ONCE};
use family::{Checked, World};

use Kind::{Crate, Redisson};

/// The fair lock's configs and seeded bugs.
#[path = "family_check/fair.rs"]
mod fair_lock;

const LIMIT: usize = 20_000_000;

fn check<W: World + std::fmt::Debug>(name: &str, world: W) -> Report {
    cache::measured(name, || explore(&Checked(world), LIMIT))
}

/// Every property holds on every state reached.
fn holds<W: World + std::fmt::Debug>(name: &str, world: W) {
    let r = check(name, world);
    assert!(r.found.is_empty(), "{:?}", r.broken());
}

/// Exactly these properties are broken (a seeded bug's).
fn breaks<W: World + std::fmt::Debug>(name: &str, world: W, properties: &[&str]) {
    let mut expected = properties.to_vec();
    expected.sort_unstable();
    assert_eq!(check(name, world).broken(), expected);
}

// --- the semaphore ---------------------------------------------------------------

fn sem(texts: family::Texts, lost_replies: u8) -> Sem {
    Sem::new(semaphore::Config {
        permits: 2,
        takers: vec![
            (Crate, 1, 2),
            (Crate, 2, 1),
            (Crate, 1, 2),
            (Redisson, 1, 2),
        ],
        lost_replies,
        texts,
    })
}

#[test]
fn semaphore_keeps_its_count_with_lost_replies() {
    holds(
        "semaphore: 2, crate takers 1x2 2x1 1x2, Redisson 1x2, 2 lost replies",
        sem(semaphore::texts(), 2),
    );
}

#[test]
fn semaphore_seeded_acquire_without_decrby_exceeds_the_count() {
    let texts = semaphore::texts().edit(
        "semaphore_acquire.lua",
        "redis.call('decrby', KEYS[1], ARGV[1])",
        "",
    );
    breaks(
        "semaphore, seeded: acquire takes nothing",
        sem(texts, 0),
        &[EXCEED, ONCE],
    );
}

#[test]
fn semaphore_seeded_retry_without_its_latch_takes_twice() {
    let texts = semaphore::texts().edit(
        "semaphore_acquire.lua",
        "if ARGV[2] == '1' and redis.call('get', KEYS[2]) then",
        "if false then",
    );
    breaks(
        "semaphore, seeded: retry ignores its latch",
        sem(texts, 1),
        &[ONCE],
    );
}

// --- the permit-expirable semaphore ---------------------------------------------

fn permits(texts: family::Texts, lost_replies: u8) -> Permits {
    Permits::new(permits::Config {
        permits: 2,
        takers: vec![(Crate, 2), (Crate, 2), (Redisson, 2)],
        lease: 2,
        time_bound: 5,
        lost_replies,
        texts,
    })
}

#[test]
fn permits_keep_their_count_with_leases_ending_and_a_lost_reply() {
    holds(
        "permits: 2, crate takers x2 x2, Redisson x2, lease 2 ms, 5 ms, 1 lost reply",
        permits(permits::texts(), 1),
    );
}

#[test]
fn permits_seeded_reclaim_of_live_leases_exceeds_the_count() {
    let texts = permits::texts().edit(
        "permit_acquire.lua",
        "redis.call('zrangebyscore', KEYS[2], 0, now)",
        "redis.call('zrangebyscore', KEYS[2], 0, now + 1)",
    );
    breaks(
        "permits, seeded: acquire reclaims leases 1 ms early",
        permits(texts, 0),
        &[EXCEED],
    );
}

#[test]
fn permits_seeded_give_back_without_the_count_takes_twice() {
    let texts = permits::texts().edit(
        "permit_release.lua",
        "redis.call('incrby', KEYS[1], back)",
        "redis.call('incrby', KEYS[1], back - 1)",
    );
    breaks(
        "permits, seeded: a give-back returns one permit too few",
        permits(texts, 1),
        &[ONCE],
    );
}

// --- the latch --------------------------------------------------------------------

fn latch(texts: family::Texts, waiters: Vec<Kind>, lost_messages: u8) -> Latch {
    Latch::new(latch::Config {
        counters: vec![Crate, Redisson, Crate],
        waiters,
        lost_messages,
        texts,
    })
}

#[test]
fn latch_wakes_every_waiter() {
    holds(
        "latch of 3, 2 crate and 2 Redisson waiters",
        latch(latch::texts(), vec![Crate, Redisson, Crate, Redisson], 0),
    );
}

#[test]
fn latch_wakes_the_crates_waiters_after_a_lost_message() {
    holds(
        "latch of 3, 3 crate waiters, 2 lost messages",
        latch(latch::texts(), vec![Crate, Crate, Crate], 2),
    );
}

#[test]
fn latch_seeded_count_down_without_publish_leaves_a_waiter() {
    let texts = latch::texts().edit(
        "latch_count_down.lua",
        "redis.call(ARGV[2], KEYS[2], ARGV[1])",
        "",
    );
    breaks(
        "latch, seeded: the last count-down publishes nothing",
        latch(texts, vec![Crate, Redisson], 0),
        &[WAKE],
    );
}

// --- the read-write lock ----------------------------------------------------------

const ANY: (u8, u8) = (u8::MAX, u8::MAX);

fn rw(texts: family::Texts, actors: Vec<(Kind, Role, u8)>, bypass: (u8, u8)) -> Rw {
    Rw::new(rw::Config {
        actors,
        time_bound: 6,
        bypass,
        texts,
    })
}

/// A crate writer and reader of two rounds each.
fn crate_pair() -> Vec<(Kind, Role, u8)> {
    vec![(Crate, Role::Write, 2), (Crate, Role::Read, 2)]
}

/// A crate writer of two rounds, readers of two and one.
fn crate_three() -> Vec<(Kind, Role, u8)> {
    vec![
        (Crate, Role::Write, 2),
        (Crate, Role::Read, 2),
        (Crate, Role::Read, 1),
    ]
}

/// Finding B of issue 25, fixed: the writers' mark was one key for all writers, and a
/// writer's grant deleted it while another writer still waited, so new readers passed
/// that writer until it asked again. Each writer now has its own mark (a member of the
/// writers' sorted set), and a grant takes away its own only. Before the fix:
///
/// ```text
/// [0 ms] Crate writer 0 is granted
/// [0 ms] Crate writer 1 is refused            (sets the writers' mark)
/// [0 ms] Crate writer 0 unlocks
/// [0 ms] Crate writer 0 is granted            (deleted the mark)
/// [0 ms] Crate writer 0 unlocks
/// [0 ms] Crate reader 2 is granted            (passed writer 1, woken, not yet asked)
/// ```
///
/// A waiting reader may be passed once here: held back by writer 1's mark on a free
/// lock, it lets writer 0, which did not wait, take the lock before writer 0's unlock
/// starts the readers' turn (N_r = 0 fails on that, 5 steps).
fn writers_and_a_reader() -> Vec<(Kind, Role, u8)> {
    vec![
        (Crate, Role::Write, 2),
        (Crate, Role::Write, 1),
        (Crate, Role::Read, 1),
    ]
}

#[test]
fn rw_crate_writer_is_not_passed_when_another_writer_is_granted() {
    holds(
        "rw, crate writers x2 and x1, reader x1, 6 ms, N_w = 0, N_r = 1",
        rw(rw::texts(), writers_and_a_reader(), (0, 1)),
    );
}

#[test]
fn rw_crate_writer_and_reader_share_exclude_and_pass_nobody() {
    holds(
        "rw, crate writer x2, reader x2, 6 ms",
        rw(rw::texts(), crate_pair(), (0, 0)),
    );
}

/// Finding A of issue 25, fixed: the readers' turn a writer's unlock started for a
/// waiting reader ended with the last reader's unlock, even while that reader, woken by
/// the unlock's message, had not come in yet; a writer then passed it again, as often as
/// the others had rounds. The turn now names the waiting readers it was made for and
/// lasts until each is granted (or it runs out). Before the fix:
///
/// ```text
/// [0 ms] Crate writer 0 is granted
/// [0 ms] Crate reader 1 is refused            (sets the reader's mark)
/// [0 ms] Crate writer 0 unlocks               (finds the mark: the readers' turn)
/// [0 ms] Crate reader 2 is granted (readers' turn)
/// [0 ms] Crate reader 2 unlocks               (the last reader: the turn ended)
/// [0 ms] Crate writer 0 is granted            (reader 1, woken, has not asked yet)
/// ```
#[test]
fn rw_crate_reader_is_not_passed_when_another_reader_leaves_the_turn() {
    holds(
        "rw, crate writer x2, readers x2 and x1, 6 ms, N_w = 0, N_r = 0",
        rw(rw::texts(), crate_three(), (0, 0)),
    );
}

/// A crate writer and reader, a Redisson reader and writer, one round each.
fn mixed() -> Vec<(Kind, Role, u8)> {
    vec![
        (Crate, Role::Write, 1),
        (Crate, Role::Read, 1),
        (Redisson, Role::Read, 1),
        (Redisson, Role::Write, 1),
    ]
}

#[test]
fn rw_with_redisson_actors_share_and_exclude() {
    holds(
        "rw, crate and Redisson reader and writer each, 6 ms",
        rw(rw::texts(), mixed(), ANY),
    );
}

/// Fails, as `docs/protocol.md` 7.4 (7) says: Redisson's readers and writers look at
/// neither mark nor turn, so against them the lock is as unfair as Redisson's, and the
/// issue's "neither starves" does not hold for waiters that meet them. The shortest
/// passes, one each way:
///
/// ```text
/// [0 ms] Crate reader 1 is granted
/// [0 ms] Crate writer 0 is refused            (sets the writer's mark)
/// [0 ms] Redisson reader 2 is granted         (passes the waiting writer)
///
/// [0 ms] Crate writer 0 is granted
/// [0 ms] Crate reader 1 is refused            (sets the reader's mark)
/// [0 ms] Crate writer 0 unlocks               (the readers' turn)
/// [0 ms] Redisson writer 3 is granted (readers' turn)   (passes the waiting reader)
/// ```
#[test]
#[ignore = "fails: Redisson's readers and writers ignore the marks and turns"]
fn rw_redisson_actors_never_pass_crate_waiters() {
    holds(
        "rw, crate and Redisson reader and writer each, 6 ms, N = 0",
        rw(rw::texts(), mixed(), (0, 0)),
    );
}

#[test]
fn rw_seeded_reader_entering_a_write_hold_breaks_exclusion() {
    let texts = rw::texts().edit(
        "read_acquire.lua",
        "(mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2] .. ':write') == 1)",
        "mode == 'write'",
    );
    breaks(
        "rw, seeded: readers enter a write hold",
        rw(texts, crate_pair(), ANY),
        &[EXCLUDES],
    );
}

#[test]
fn rw_seeded_reader_refused_by_readers_breaks_sharing() {
    let texts = rw::texts().edit(
        "read_acquire.lua",
        "if mode == false or mode == 'read'",
        "if mode == false",
    );
    breaks(
        "rw, seeded: a reader refused by readers",
        rw(texts, crate_three(), ANY),
        &[SHARE],
    );
}

#[test]
fn rw_seeded_readers_ignoring_the_writers_mark_pass_it() {
    let texts = rw::texts().edit(
        "read_acquire.lua",
        "local marked = redis.call('zrangebyscore', KEYS[4], '(' .. now, '+inf', 'limit', 0, 1)",
        "local marked = {}",
    );
    breaks(
        "rw, seeded: readers ignore the writer's mark",
        rw(texts, crate_three(), (0, u8::MAX)),
        &[WRITER_BYPASS],
    );
}

#[test]
fn rw_seeded_writer_ignoring_the_readers_turn_passes_a_reader() {
    let texts = rw::texts().edit(
        "write_acquire.lua",
        "local turn = redis.call('pttl', KEYS[4])",
        "local turn = -2",
    );
    breaks(
        "rw, seeded: writers ignore the readers' turn",
        rw(texts, crate_pair(), (0, 0)),
        &[READER_BYPASS],
    );
}

#[test]
fn rw_seeded_writer_grant_clearing_every_mark_lets_a_reader_pass() {
    let texts = rw::texts().edit(
        "write_acquire.lua",
        "redis.call('zrem', KEYS[3], ARGV[2])",
        "redis.call('del', KEYS[3])",
    );
    breaks(
        "rw, seeded: a writer's grant clears every writer's mark (finding B)",
        rw(texts, writers_and_a_reader(), (0, 1)),
        &[WRITER_BYPASS],
    );
}

#[test]
fn rw_seeded_reader_ending_the_whole_turn_lets_a_writer_pass() {
    let texts = rw::texts().edit(
        "read_acquire.lua",
        "redis.call('zrem', KEYS[6], ARGV[2])",
        "redis.call('del', KEYS[6])",
    );
    breaks(
        "rw, seeded: a reader's grant ends the turn for all (finding A)",
        rw(texts, crate_three(), (0, 0)),
        &[READER_BYPASS],
    );
}
