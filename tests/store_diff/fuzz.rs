//! Single commands with random arguments on a few keys, wrong types and bad numbers
//! included: every command the store models, in more shapes than the scripts send.

use super::compare::Shape;
use super::twin::{Call, Step};
use super::{command, Rng};
use crate::checker::store::Store;

const KEYS: [&str; 3] = ["k1", "k2", "k3"];
const FIELDS: [&str; 3] = ["f1", "f2", "f3"];
const VALUES: [&str; 7] = ["1", "-3", "x", "10", "0", "9223372036854775807", "007"];
const INTS: [&str; 7] = ["1", "-2", "0", "x", "2", "-9223372036854775808", "3.5"];
// Scores a double holds exactly: Redis 7.0 formats others with %.17g (0.1 reads back as
// 0.10000000000000001, as the store gives it), Valkey 9 with the shortest digits.
const SCORES: [&str; 8] = [
    "1",
    "2.5",
    "-inf",
    "inf",
    "x",
    "1e3",
    "-0.5",
    "1700000000000",
];
const BOUNDS: [&str; 8] = ["-inf", "+inf", "(1", "1", "2.5", "(2.5", "x", "0"];
const TTLS: [&str; 6] = ["0", "-1", "60", "10000", "x", "100"];

fn hash_cmd(r: &mut Rng, k: &str) -> Call {
    let f = r.pick(&FIELDS);
    match r.below(9) {
        0 => command(&["hset", k, f, r.pick(&VALUES)]),
        1 => command(&["hset", k, f, "1", r.pick(&FIELDS), r.pick(&VALUES)]),
        2 => command(&["hget", k, f]),
        3 => command(&["hexists", k, f]),
        4 => command(&["hdel", k, f, r.pick(&FIELDS)]),
        5 => command(&["hincrby", k, f, r.pick(&INTS)]),
        6 => command(&["hlen", k]),
        7 => command(&[r.pick(&["hkeys", "hvals"]), k]).shape(Shape::Unordered),
        _ => command(&["hgetall", k]).shape(Shape::Pairs),
    }
}

fn list_cmd(r: &mut Rng, k: &str) -> Call {
    let v = r.pick(&VALUES[..4]);
    match r.below(8) {
        0 | 1 => command(&["rpush", k, v, r.pick(&VALUES[..4])]),
        2 => command(&["lpop", k]),
        3 => command(&["lindex", k, r.pick(&["0", "-1", "1", "5", "x"])]),
        4 => command(&["lrem", k, r.pick(&["0", "1", "-1", "2", "x"]), v]),
        5 => command(&[
            "lrange",
            k,
            r.pick(&["0", "-2", "1", "9"]),
            r.pick(&["-1", "0", "1", "-9"]),
        ]),
        6 => command(&["lpos", k, v]),
        _ => command(&["llen", k]),
    }
}

fn zset_cmd(r: &mut Rng, k: &str) -> Call {
    let m = r.pick(&FIELDS);
    match r.below(7) {
        0 | 1 => command(&["zadd", k, r.pick(&SCORES), m]),
        2 => command(&["zrem", k, m, r.pick(&FIELDS)]),
        3 => command(&["zscore", k, m]),
        4 => command(&["zcard", k]),
        5 => command(&[
            "zrange",
            k,
            r.pick(&["0", "1", "-1", "-2", "5"]),
            r.pick(&["0", "-1", "1", "-3"]),
        ]),
        _ => {
            let mut args = vec!["zrangebyscore", k, r.pick(&BOUNDS), r.pick(&BOUNDS)];
            if r.chance(50) {
                args.push("withscores");
            }
            if r.chance(50) {
                args.extend(["limit", r.pick(&["0", "1"]), r.pick(&["1", "-1", "2"])]);
            }
            command(&args)
        }
    }
}

fn key_cmd(r: &mut Rng, k: &str) -> Call {
    let other = r.pick(&KEYS);
    match r.below(12) {
        0 => command(&["set", k, r.pick(&VALUES)]),
        1 => command(&["set", k, r.pick(&VALUES), "px", r.pick(&TTLS)]),
        2 => command(&["get", k]),
        3 => command(&["del", k, other]),
        4 => command(&["exists", k, other, k]),
        5 => command(&["type", k]),
        6 => command(&["pexpire", k, r.pick(&TTLS)]),
        7 => command(&["pttl", k]).shape(Shape::Ttl),
        8 => command(&["persist", k]),
        9 => command(&[r.pick(&["incr", "decr"]), k]),
        10 => command(&[r.pick(&["incrby", "decrby"]), k, r.pick(&INTS)]),
        _ => command(&["pubsub", r.pick(&["numsub", "shardnumsub"]), "ch1", "ch2"]),
    }
}

/// The next step: mostly a command, now and then a subscription, a publish or a sleep.
pub fn step(r: &mut Rng, _: &Store) -> Step {
    let k = r.pick(&KEYS);
    let call = match r.below(100) {
        0..=29 => key_cmd(r, k),
        30..=54 => hash_cmd(r, k),
        55..=74 => list_cmd(r, k),
        75..=89 => zset_cmd(r, k),
        90..=93 => command(&[
            r.pick(&["publish", "spublish"]),
            r.pick(&["ch1", "ch2"]),
            "hi",
        ]),
        94..=96 => {
            return Step::Toggle {
                conn: r.below(2),
                channel: r.pick(&["ch1", "ch2"]).as_bytes().to_vec(),
                sharded: r.chance(50),
            }
        }
        _ => return Step::Sleep(r.pick(&[30, 70])),
    };
    Step::Call(call)
}
