//! Steps of the synchronizers: the semaphore, the permit-expirable semaphore and the
//! count-down latch, with the keys and argument shapes of `src/wire/sync_raw.rs`.

use redis_rlock::protocol::{latch_channel, permit_timeout_key, semaphore_channel};

use super::compare::Shape;
use super::locks::{latch, latch_ttl, lease, publish, zero_one};
use super::twin::{Call, Step};
use super::{clobber as clobber_call, command, Rng};
use crate::checker::store::Store;

const SEM: &str = "s";
const PERMITS: &str = "p";
const LATCH: &str = "l";

/// Permit ids are 16 raw bytes: binary strings through Lua and the store.
const IDS: [[u8; 16]; 4] = [
    [0x00; 16],
    [0xff; 16],
    *b"\x01\x02 {x}\x80\x81\xfe\r\n\t\"'\\a",
    *b"0123456789abcdef",
];

fn semaphore_acquire(r: &mut Rng) -> Call {
    let latch = latch("redisson_semaphore_latch", SEM, r);
    script!("semaphore_acquire")
        .key(SEM)
        .key(latch)
        .arg((1 + r.below(3)).to_string())
        .arg(zero_one(r, 20))
        .arg(latch_ttl(r))
}

fn semaphore_release(r: &mut Rng) -> Call {
    let (mode, n) = if r.chance(50) {
        ("release", (1 + r.below(3)) as i64)
    } else {
        ("add", r.below(6) as i64 - 2)
    };
    script!("semaphore_release")
        .key(SEM)
        .key(semaphore_channel(SEM))
        .arg(n.to_string())
        .arg(publish(r))
        .arg(mode)
}

fn semaphore_set(r: &mut Rng) -> Call {
    let name = r.pick(&[SEM, PERMITS]);
    script!("semaphore_set")
        .key(name)
        .key(semaphore_channel(name))
        .arg(r.below(4).to_string())
        .arg(publish(r))
}

/// The permit-expirable semaphore's three keys.
fn permit_call(c: Call) -> Call {
    c.key(PERMITS)
        .key(permit_timeout_key(PERMITS))
        .key(semaphore_channel(PERMITS))
}

fn ids(r: &mut Rng) -> Vec<[u8; 16]> {
    let first = r.below(IDS.len());
    let n = 1 + r.below(2);
    (0..n).map(|i| IDS[(first + i) % IDS.len()]).collect()
}

fn permit_acquire(r: &mut Rng) -> Call {
    let ids = ids(r);
    let c = permit_call(script!("permit_acquire"))
        .arg(ids.len().to_string())
        .arg(lease(r))
        .arg(publish(r));
    ids.iter().fold(c, |c, id| c.arg(id)).shape(Shape::Wait)
}

fn permit_release(r: &mut Rng) -> Call {
    let c = permit_call(script!("permit_release")).arg(publish(r));
    ids(r).iter().fold(c, |c, id| c.arg(id))
}

fn permit_update(r: &mut Rng) -> Call {
    permit_call(script!("permit_update"))
        .arg(publish(r))
        .arg(r.pick(&IDS))
        .arg(lease(r))
}

fn latch_set(r: &mut Rng) -> Call {
    script!("latch_set")
        .key(LATCH)
        .key(latch_channel(LATCH))
        .arg("1")
        .arg((1 + r.below(3)).to_string())
        .arg(publish(r))
}

fn latch_count_down(r: &mut Rng) -> Call {
    script!("latch_count_down")
        .key(LATCH)
        .key(latch_channel(LATCH))
        .arg("0")
        .arg(publish(r))
}

/// A delete of one of the three, as each handle sends it.
fn count_delete(r: &mut Rng) -> Call {
    match r.below(3) {
        0 => script!("count_delete")
            .key(SEM)
            .key(semaphore_channel(SEM))
            .arg("")
            .arg(""),
        1 => script!("count_delete")
            .key(PERMITS)
            .key(semaphore_channel(PERMITS))
            .key(permit_timeout_key(PERMITS))
            .arg("")
            .arg(""),
        _ => script!("count_delete")
            .key(LATCH)
            .key(latch_channel(LATCH))
            .arg(publish(r))
            .arg("1"),
    }
}

/// A value of another type, or no count, or a count at the edge of 64 bits.
fn clobber(r: &mut Rng) -> Call {
    match r.below(5) {
        0 => clobber_call(&["set", SEM, "abc"]),
        1 => clobber_call(&["set", SEM, "9223372036854775806"]),
        2 => clobber_call(&["hset", SEM, "f", "1"]),
        3 => clobber_call(&["set", PERMITS, "x"]),
        _ => command(&["set", LATCH, "2", "px", "100"]),
    }
}

/// The next step of the synchronizers' family.
pub fn step(r: &mut Rng, _: &Store) -> Step {
    let call = match r.below(100) {
        0..=11 => semaphore_acquire(r),
        12..=21 => semaphore_release(r),
        22..=29 => semaphore_set(r),
        30..=33 => script!("semaphore_drain").key(SEM),
        34..=47 => permit_acquire(r),
        48..=57 => permit_release(r),
        58..=63 => permit_update(r),
        64..=66 => permit_call(script!("permit_available")).arg(publish(r)),
        67..=68 => count_delete(r),
        69..=75 => latch_set(r),
        76..=83 => latch_count_down(r),
        84..=86 => clobber(r),
        87..=92 => {
            let channels = [
                semaphore_channel(SEM),
                semaphore_channel(PERMITS),
                latch_channel(LATCH),
            ];
            return Step::Toggle {
                conn: r.below(2),
                channel: r.pick(&channels).into_bytes(),
                sharded: r.chance(30),
            };
        }
        _ => return Step::Sleep(r.pick(&[30, 70, 160])),
    };
    Step::Call(call)
}
