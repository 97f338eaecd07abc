//! Steps of the plain lock (`acquire`, `unlock`, `renew`, `force_unlock`) and of the fair
//! lock (`fair_acquire`, `fair_unlock`, `fair_leave`), with the keys and argument shapes
//! of `src/wire/raw.rs`, `src/wire/raw/turns.rs` and `src/wire/raw/fair.rs`. Flags and options are
//! drawn at random, not only in the combinations a client sends, so that every branch
//! of the scripts reaches the store.

use redis_rlock::protocol::{
    channel_name, clients_key, queue_key, timeout_key, token_key, turn_key, FORCE_UNLOCK_EVENT,
};

use super::compare::Shape;
use super::twin::{Call, Step};
use super::{clobber as clobber_call, command, fields, Rng};
use crate::checker::store::Store;

/// Client ids: 36 characters, as the scripts cut them from a holder field.
pub const CLIENTS: [&str; 3] = [
    "11111111-1111-4111-8111-111111111111",
    "22222222-2222-4222-8222-222222222222",
    "33333333-3333-4333-8333-333333333333",
];

/// `a` and `{a}` share every key but the lock hash (issue 24, finding 3).
const NAMES: [&str; 2] = ["a", "{a}"];

/// A holder field: `<client id>:<owner id>`.
pub fn field(r: &mut Rng) -> String {
    format!("{}:{}", r.pick(&CLIENTS), 1 + r.below(2))
}

/// A per-request latch key: `<prefix>:{<name>}:<request id>`, from a few request ids
/// so that retries find their latches.
pub fn latch(prefix: &str, name: &str, r: &mut Rng) -> String {
    let tagged = token_key(name).replacen("redisson_lock_token", prefix, 1);
    format!("{tagged}:r{}", r.below(3))
}

/// Mostly a field that holds `name` now (one that `keep` accepts), else `fallback`'s:
/// releases and renewals of holds that exist reach further into the scripts.
pub fn holder(
    r: &mut Rng,
    s: &Store,
    name: &str,
    keep: fn(&str) -> bool,
    fallback: fn(&mut Rng) -> String,
) -> String {
    let holders: Vec<String> = fields(s, name).into_iter().filter(|f| keep(f)).collect();
    if !holders.is_empty() && r.chance(70) {
        r.pick(&holders)
    } else {
        fallback(r)
    }
}

pub fn any(_: &str) -> bool {
    true
}

pub fn lease(r: &mut Rng) -> &'static str {
    r.pick(&["60", "150", "30000"])
}

pub fn latch_ttl(r: &mut Rng) -> &'static str {
    r.pick(&["80", "10000"])
}

pub fn publish(r: &mut Rng) -> &'static str {
    if r.chance(25) {
        "spublish"
    } else {
        "publish"
    }
}

pub fn zero_one(r: &mut Rng, percent: u64) -> &'static str {
    if r.chance(percent) {
        "1"
    } else {
        "0"
    }
}

/// Letters drawn each with its chance, in the order given (the order `Flags` sets).
fn letters(r: &mut Rng, odds: &[(char, u64)]) -> String {
    odds.iter()
        .filter(|(_, p)| r.chance(*p))
        .map(|(c, _)| *c)
        .collect()
}

fn acquire(r: &mut Rng) -> Call {
    let name = r.pick(&NAMES);
    let mut flags = letters(r, &[('f', 50), ('r', 20), ('F', 25), ('w', 70)]);
    flags += r.pick(&["k", "l", ""]);
    let fenced = flags.contains('F');
    script!("acquire")
        .key(name)
        .key(latch("redisson_unlock_latch", name, r))
        .key(clients_key(name))
        .key(turn_key(name))
        .key_if(fenced, token_key(name))
        .arg(lease(r))
        .arg(field(r))
        .arg(latch_ttl(r))
        .arg(r.pick(&["0", "100", "3000", "3000"]))
        .arg(flags)
        .shape(Shape::Wait)
}

/// `take.lua`: the line and the turn named or not, as a waiting call with turns on or a
/// single try sends it.
fn take(r: &mut Rng) -> Call {
    let name = r.pick(&NAMES);
    let c = script!("take").key(name);
    let c = if r.chance(70) {
        c.key(clients_key(name)).key(turn_key(name))
    } else {
        c
    };
    c.arg(lease(r)).arg(field(r)).shape(Shape::Wait)
}

/// `release.lua`, with `PUBLISH` or `SPUBLISH` as its first line, turns on or off.
fn release(r: &mut Rng, s: &Store) -> Call {
    static SHARDED: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    let name = r.pick(&NAMES);
    let holding = holder(r, s, name, any, field);
    let mut c = script!("release");
    if r.chance(25) {
        c.source = SHARDED.get_or_init(|| {
            let plain = c.source.replacen("'publish'", "'spublish'", 1);
            Box::leak(plain.into_boxed_str())
        });
    }
    let turns = r.chance(70);
    let c = c
        .key(name)
        .key(channel_name(name))
        .key(latch("redisson_unlock_latch", name, r));
    let c = match turns {
        true => c.key(clients_key(name)).key(turn_key(name)),
        false => c,
    };
    let c = (c.arg(holding))
        .arg(r.pick(&["1", "1", "2"]))
        .arg(r.pick(&["0", "30000"]))
        .arg(latch_ttl(r));
    match turns {
        // A negative window: the releasing client does not listen.
        true => c.arg(r.pick(&["100", "3000", "-100"])),
        false => c,
    }
}

fn unlock_flags(r: &mut Rng) -> String {
    let mut flags = letters(r, &[('r', 15), ('F', 25), ('g', 25), ('e', 20)]);
    flags += publish(r).strip_suffix("publish").unwrap_or("");
    flags
}

fn unlock(r: &mut Rng, s: &Store) -> Call {
    let name = r.pick(&NAMES);
    let holding = holder(r, s, name, any, field);
    let flags = unlock_flags(r);
    let c = script!("unlock")
        .key(name)
        .key(channel_name(name))
        .key(latch("redisson_unlock_latch", name, r))
        .key(clients_key(name))
        .key(turn_key(name))
        .key_if(flags.contains('F'), token_key(name));
    let holds = r.pick(&["1", "1", "2"]);
    let next = if r.chance(50) {
        field(r)
    } else {
        String::new()
    };
    c.arg(r.pick(&["0", "30000"]))
        .arg(holding)
        .arg(latch_ttl(r))
        .arg(holds)
        .arg(next)
        .arg(lease(r))
        .arg(r.pick(&["0", "100", "3000", "3000"]))
        .arg(flags)
}

/// The watchdog's batch: one to three (name, field) pairs, mostly of holders.
pub fn renew(r: &mut Rng, s: &Store, names: &[&str], field_of: fn(&mut Rng) -> String) -> Call {
    let n = 1 + r.below(3);
    let pairs: Vec<(&str, String)> = (0..n)
        .map(|_| {
            let name = r.pick(names);
            (name, holder(r, s, name, any, field_of))
        })
        .collect();
    let c = pairs.iter().fold(script!("renew"), |c, p| c.key(p.0));
    let c = c.arg(lease(r));
    pairs.iter().fold(c, |c, p| c.arg(&p.1))
}

fn force_unlock(r: &mut Rng) -> Call {
    let name = r.pick(&NAMES);
    script!("force_unlock")
        .key(name)
        .key(channel_name(name))
        .arg("0")
        .arg(publish(r))
        .arg(FORCE_UNLOCK_EVENT)
}

/// A key of the lock's written by someone else, with another type or a value that is
/// no count: the scripts' error paths.
fn clobber(r: &mut Rng) -> Call {
    let name = r.pick(&NAMES);
    let f = field(r);
    match r.below(4) {
        0 => clobber_call(&["set", name, "x"]),
        1 => clobber_call(&["hset", name, &f, "x"]),
        2 => clobber_call(&["set", &clients_key(name), "x"]),
        _ => clobber_call(&["set", &token_key(name), "x"]),
    }
}

fn toggle(r: &mut Rng, channels: &[String]) -> Step {
    Step::Toggle {
        conn: r.below(2),
        channel: r.pick(channels).into_bytes(),
        sharded: r.chance(30),
    }
}

#[derive(Clone, Copy)]
enum Plain {
    Acquire,
    Take,
    Unlock,
    Release,
    Renew,
    Force,
    Leave,
    Toggle,
    Sleep,
    Clobber,
}

/// The next step of the plain lock's family.
pub fn plain_step(r: &mut Rng, s: &Store) -> Step {
    use Plain::*;
    let kind = r.weighted(&[
        (20, Acquire),
        (15, Take),
        (18, Unlock),
        (12, Release),
        (8, Renew),
        (3, Force),
        (3, Leave),
        (10, Toggle),
        (6, Sleep),
        (2, Clobber),
    ]);
    match kind {
        Acquire => Step::Call(acquire(r)),
        Take => Step::Call(take(r)),
        Unlock => Step::Call(unlock(r, s)),
        Release => Step::Call(release(r, s)),
        Renew => Step::Call(renew(r, s, &NAMES, field)),
        Force => Step::Call(force_unlock(r)),
        Leave => Step::Call(command(&["lrem", &clients_key("a"), "0", r.pick(&CLIENTS)])),
        Toggle => {
            let channels = vec![channel_name("a")];
            toggle(r, &channels)
        }
        Sleep => Step::Sleep(r.pick(&[30, 70, 160])),
        Clobber => Step::Call(clobber(r)),
    }
}

const FAIR: &str = "f";

fn fair_acquire(r: &mut Rng) -> Call {
    script!("fair_acquire")
        .key(FAIR)
        .key(queue_key(FAIR))
        .key(timeout_key(FAIR))
        .key(latch("redisson_unlock_latch", FAIR, r))
        .arg(lease(r))
        .arg(field(r))
        .arg(r.pick(&["80", "5000"]))
        .arg(latch_ttl(r))
        .arg(zero_one(r, 50))
        .arg(zero_one(r, 20))
        .arg(zero_one(r, 60))
        .shape(Shape::Wait)
}

fn fair_unlock(r: &mut Rng, s: &Store) -> Call {
    let holding = holder(r, s, FAIR, any, field);
    script!("fair_unlock")
        .key(FAIR)
        .key(queue_key(FAIR))
        .key(timeout_key(FAIR))
        .key(latch("redisson_unlock_latch", FAIR, r))
        .arg("0")
        .arg(r.pick(&["0", "30000"]))
        .arg(holding)
        .arg(latch_ttl(r))
        .arg(publish(r))
        .arg(r.pick(&["1", "1", "2"]))
        .arg(zero_one(r, 20))
        .arg(channel_name(FAIR))
}

fn fair_leave(r: &mut Rng) -> Call {
    let leaving = if r.chance(80) {
        field(r)
    } else {
        String::new()
    };
    script!("fair_leave")
        .key(FAIR)
        .key(queue_key(FAIR))
        .key(timeout_key(FAIR))
        .arg(leaving)
        .arg(zero_one(r, 15))
        .arg("0")
        .arg(publish(r))
        .arg(channel_name(FAIR))
        .arg(FORCE_UNLOCK_EVENT)
        .arg(r.pick(&["80", "5000"]))
}

/// The next step of the fair lock's family.
pub fn fair_step(r: &mut Rng, s: &Store) -> Step {
    match r.below(100) {
        0..=39 => Step::Call(fair_acquire(r)),
        40..=66 => Step::Call(fair_unlock(r, s)),
        67..=76 => Step::Call(fair_leave(r)),
        77..=82 => Step::Call(renew(r, s, &[FAIR], field)),
        83..=92 => {
            let waiter = field(r);
            let channels = [format!("{}:{waiter}", channel_name(FAIR))];
            toggle(r, &channels)
        }
        _ => Step::Sleep(r.pick(&[30, 70, 160])),
    }
}
