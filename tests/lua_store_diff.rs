//! The store of `tests/checker/` against a real redis-server: the crate's real scripts
//! (and single commands) run on both, in seeded random sequences shaped as `src/` calls
//! them, and after every step the replies, every key's type, value and TTL, and the
//! messages each subscriber heard must agree (`tests/store_diff/`).
//!
//! `STORE_DIFF_SEED` and `STORE_DIFF_STEPS` rerun a family with another seed or length;
//! `--nocapture` shows what each family ran: how often each script answered what, and
//! which keys scripts left without a TTL. A bug seeded into the store fails three of
//! these tests: an HDEL that leaves an empty hash (the direct test, the plain lock's
//! naming hash at step 652, the single commands), a SET that keeps a TTL (the direct
//! test, the single commands, the synchronizers).

mod checker;
mod common;
mod store_diff;

use std::time::Duration;

use store_diff::twin::{Step, Twin};
use store_diff::{command, fuzz, locks, run_family, rw, seed, steps, sync};

/// Each family's bound: this many steps, or this long, whichever comes first.
const STEPS: usize = 400;
const LIMIT: Duration = Duration::from_secs(40);

#[test]
fn plain_lock_scripts_match_redis() {
    // The longest family: a direct grant needs a naming, a line and subscriptions.
    let stats = run_family("plain", seed(1), steps(3 * STEPS), LIMIT, locks::plain_step);
    assert!(stats.calls > 0);
}

#[test]
fn fair_lock_scripts_match_redis() {
    let stats = run_family("fair", seed(2), steps(STEPS), LIMIT, locks::fair_step);
    assert!(stats.calls > 0);
}

#[test]
fn rw_lock_scripts_match_redis() {
    let stats = run_family("rw", seed(3), steps(STEPS), LIMIT, rw::step);
    assert!(stats.calls > 0);
}

#[test]
fn synchronizer_scripts_match_redis() {
    let stats = run_family("sync", seed(4), steps(STEPS), LIMIT, sync::step);
    assert!(stats.calls > 0);
}

#[test]
fn single_commands_match_redis() {
    let stats = run_family("commands", seed(5), steps(2 * STEPS), LIMIT, fuzz::step);
    assert!(stats.calls > 0);
}

/// Runs `cmds` on both sides, compared after each.
fn on_both(twin: &mut Twin, cmds: &[&[&str]]) {
    for c in cmds {
        twin.step(&Step::Call(command(c)));
    }
}

#[test]
fn an_emptied_collection_goes_with_its_ttl() {
    let mut twin = Twin::start(0);
    let cases: [(&[&str], &[&str]); 3] = [
        (&["hset", "k", "f", "1"], &["hdel", "k", "f"]),
        (&["rpush", "k", "a", "a"], &["lrem", "k", "0", "a"]),
        (&["zadd", "k", "1", "m"], &["zrem", "k", "m", "n"]),
    ];
    for (fill, empty) in cases {
        on_both(&mut twin, &[fill, &["pexpire", "k", "10000"]]);
        if fill[0] == "rpush" {
            on_both(&mut twin, &[&["lpop", "k"]]);
        }
        on_both(&mut twin, &[empty, &["exists", "k"], fill, &["pttl", "k"]]);
        assert_eq!(twin.store.pttl(b"k"), -1, "{fill:?}: a new key, no TTL");
        on_both(&mut twin, &[&["del", "k"]]);
    }
}

#[test]
fn set_clears_a_ttl_and_incr_keeps_it() {
    let mut twin = Twin::start(0);
    on_both(
        &mut twin,
        &[
            &["set", "k", "1", "px", "10000"],
            &["incr", "k"],
            &["decrby", "k", "5"],
            &["set", "k", "2"],
            &["pttl", "k"],
            &["set", "k", "3", "px", "0"],
            &["hset", "h", "f", "x"],
            &["hincrby", "h", "f", "1"],
            &["set", "h", "v"],
            &["type", "h"],
        ],
    );
    assert_eq!(twin.store.pttl(b"k"), -1);
}

#[test]
fn an_expired_key_is_gone_for_every_command() {
    let mut twin = Twin::start(0);
    on_both(
        &mut twin,
        &[
            &["set", "s", "1", "px", "60"],
            &["hset", "h", "f", "1"],
            &["pexpire", "h", "60"],
            &["rpush", "l", "a"],
            &["pexpire", "l", "0"],
            &["exists", "l"],
            &["zadd", "z", "1", "m"],
            &["pexpire", "z", "-5"],
        ],
    );
    twin.step(&Step::Sleep(90));
    on_both(
        &mut twin,
        &[
            &["exists", "s", "h", "l", "z"],
            &["type", "h"],
            &["get", "s"],
            &["incr", "s"],
            &["pttl", "s"],
            &["hlen", "h"],
            &["hset", "h", "g", "2"],
            &["pttl", "h"],
        ],
    );
}
