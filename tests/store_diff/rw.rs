//! Steps of the read-write lock (`read_acquire`, `write_acquire`, `read_unlock`,
//! `write_unlock`, `read_renew`, `rw_force_unlock`, and `renew` for write holds), with
//! the keys and argument shapes of `src/wire/raw/rw.rs`.

use redis_rlock::protocol::{read_turn_key, reader_key, rw_channel_name, writer_key};

use super::compare::Shape;
use super::locks::{field, holder, latch, latch_ttl, lease, publish, renew, zero_one};
use super::twin::{Call, Step};
use super::{clobber, command, Rng};
use crate::checker::store::Store;

const NAME: &str = "rw";

/// `{<name>}:<field>:rwlock_timeout`: a reader's hold keys, without the hold number.
fn timeout_prefix(field: &str) -> String {
    format!("{{{NAME}}}:{field}:rwlock_timeout")
}

fn write_field(r: &mut Rng) -> String {
    field(r) + ":write"
}

fn reads(f: &str) -> bool {
    f != "mode" && !f.ends_with(":write")
}

fn writes(f: &str) -> bool {
    f.ends_with(":write")
}

fn read_acquire(r: &mut Rng) -> Call {
    let f = field(r);
    script!("read_acquire")
        .key(NAME)
        .key(timeout_prefix(&f))
        .key(latch("redisson_unlock_latch", NAME, r))
        .key(writer_key(NAME))
        .key(reader_key(NAME))
        .key(read_turn_key(NAME))
        .arg(lease(r))
        .arg(f)
        .arg(latch_ttl(r))
        .arg(zero_one(r, 50))
        .arg(zero_one(r, 20))
        .arg(zero_one(r, 50))
        .arg(r.pick(&["100", "2000"]))
        .shape(Shape::Wait)
}

fn write_acquire(r: &mut Rng) -> Call {
    script!("write_acquire")
        .key(NAME)
        .key(latch("redisson_unlock_latch", NAME, r))
        .key(writer_key(NAME))
        .key(read_turn_key(NAME))
        .arg(lease(r))
        .arg(write_field(r))
        .arg(latch_ttl(r))
        .arg(zero_one(r, 50))
        .arg(zero_one(r, 20))
        .arg(zero_one(r, 50))
        .arg(r.pick(&["100", "2000"]))
        .shape(Shape::Wait)
}

fn read_unlock(r: &mut Rng, s: &Store) -> Call {
    let f = holder(r, s, NAME, reads, field);
    script!("read_unlock")
        .key(NAME)
        .key(rw_channel_name(NAME))
        .key(latch("redisson_unlock_latch", NAME, r))
        .key(timeout_prefix(&f))
        .key(format!("{{{NAME}}}"))
        .arg("0")
        .arg(f)
        .arg(latch_ttl(r))
        .arg(publish(r))
        .arg(r.pick(&["1", "1", "2"]))
        .arg(zero_one(r, 20))
}

fn write_unlock(r: &mut Rng, s: &Store) -> Call {
    let f = holder(r, s, NAME, writes, write_field);
    script!("write_unlock")
        .key(NAME)
        .key(rw_channel_name(NAME))
        .key(latch("redisson_unlock_latch", NAME, r))
        .key(reader_key(NAME))
        .key(read_turn_key(NAME))
        .arg("1")
        .arg(r.pick(&["0", "30000"]))
        .arg(f)
        .arg(latch_ttl(r))
        .arg(publish(r))
        .arg(r.pick(&["1", "1", "2"]))
        .arg(zero_one(r, 20))
        .arg(r.pick(&["50", "200"]))
}

fn read_renew(r: &mut Rng, s: &Store) -> Call {
    let n = 1 + r.below(2);
    let fields: Vec<String> = (0..n).map(|_| holder(r, s, NAME, reads, field)).collect();
    let c = fields.iter().fold(script!("read_renew"), |c, f| {
        c.key(NAME).key(timeout_prefix(f))
    });
    let c = c.arg(lease(r));
    fields.iter().fold(c, |c, f| c.arg(f))
}

fn force(r: &mut Rng) -> Call {
    let (mode, message) = r.pick(&[("read", "0"), ("write", "1")]);
    script!("rw_force_unlock")
        .key(NAME)
        .key(rw_channel_name(NAME))
        .arg(mode)
        .arg(message)
        .arg(publish(r))
        .arg(redis_rlock::protocol::FORCE_UNLOCK_EVENT)
}

/// The next step of the read-write lock's family.
pub fn step(r: &mut Rng, s: &Store) -> Step {
    let call = match r.below(100) {
        0..=21 => read_acquire(r),
        22..=41 => write_acquire(r),
        42..=59 => read_unlock(r, s),
        60..=75 => write_unlock(r, s),
        76..=81 => read_renew(r, s),
        82..=85 => renew(r, s, &[NAME], write_field),
        86..=88 => force(r),
        89..=91 => command(&["del", &writer_key(NAME)]),
        92..=93 => clobber(&["set", NAME, "x"]),
        94..=96 => {
            return Step::Toggle {
                conn: r.below(2),
                channel: rw_channel_name(NAME).into_bytes(),
                sharded: r.chance(30),
            }
        }
        _ => return Step::Sleep(r.pick(&[30, 70, 160])),
    };
    Step::Call(call)
}
