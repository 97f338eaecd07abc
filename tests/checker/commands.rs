//! The Redis commands the scripts call, with Redis 7.0's semantics and replies, on a
//! [`Store`]. Only the forms the scripts use are modelled: any other option or command
//! answers `Err` (the model does not know), never a guess at what Redis would do.

use super::collections;
use super::store::{Entry, Reply, Store, Value, WRONGTYPE};
use super::zset;

/// A command's reply (Redis errors included), or `Err` when the model does not cover
/// the command or option asked for.
pub type Out = Result<Reply, String>;

type Handler = fn(&mut Store, &[Vec<u8>]) -> Out;

/// Name, Redis arity (counting the name; negative: at least that many), handler.
const COMMANDS: &[(&str, i32, Handler)] = &[
    ("del", -2, del),
    ("exists", -2, exists),
    ("type", 2, type_of),
    ("pexpire", -3, pexpire),
    ("pttl", 2, pttl),
    ("persist", 2, persist),
    ("time", 1, time),
    ("get", 2, get),
    ("set", -3, set),
    ("incr", 2, |s, a| incr_by(s, &a[0], 1)),
    ("decr", 2, |s, a| incr_by(s, &a[0], -1)),
    ("incrby", 3, |s, a| by_arg(s, a, false)),
    ("decrby", 3, |s, a| by_arg(s, a, true)),
    ("publish", 3, |s, a| publish(s, a, false)),
    ("spublish", 3, |s, a| publish(s, a, true)),
    ("pubsub", -2, pubsub),
    ("hget", 3, collections::hget),
    ("hexists", 3, collections::hexists),
    ("hset", -4, collections::hset),
    ("hincrby", 4, collections::hincrby),
    ("hdel", -3, collections::hdel),
    ("hlen", 2, collections::hlen),
    ("hkeys", 2, collections::hkeys),
    ("hvals", 2, collections::hvals),
    ("hgetall", 2, collections::hgetall),
    ("lindex", 3, collections::lindex),
    ("lpop", -2, collections::lpop),
    ("rpush", -3, collections::rpush),
    ("lrem", 4, collections::lrem),
    ("lrange", 4, collections::lrange),
    ("lpos", -3, collections::lpos),
    ("llen", 2, collections::llen),
    ("zadd", -4, zset::zadd),
    ("zrem", -3, zset::zrem),
    ("zscore", 3, zset::zscore),
    ("zincrby", 4, zset::zincrby),
    ("zcard", 2, zset::zcard),
    ("zrangebyscore", -4, zset::zrangebyscore),
    ("zrange", 4, zset::zrange),
];

/// Runs one command (`args[0]` is its name, in any case) on `store`.
pub fn call(store: &mut Store, args: &[Vec<u8>]) -> Out {
    let Some(name) = args.first() else {
        return Err("a command with no name".into());
    };
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    let Some((_, arity, handler)) = COMMANDS.iter().find(|c| c.0 == name) else {
        return Err(format!("command '{name}' is not modelled"));
    };
    let n = args.len() as i32;
    if (*arity > 0 && n != *arity) || (*arity < 0 && n < -*arity) {
        return Ok(Reply::err(format!(
            "ERR wrong number of arguments for '{name}' command"
        )));
    }
    handler(store, &args[1..])
}

/// A Redis integer as `string2ll` reads it: no sign but '-', no leading zeros, no
/// spaces, within i64.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    if b == b"0" {
        return Some(0);
    }
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    let first_ok = digits.first().is_some_and(|d| (b'1'..=b'9').contains(d));
    if !first_ok || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// An integer argument, or the error Redis gives for one that is not.
pub fn int_arg(b: &[u8]) -> Result<i64, Reply> {
    parse_i64(b).ok_or_else(|| Reply::err("ERR value is not an integer or out of range"))
}

/// Formats a double as Redis 7.0 does (`%.17g`): in replies (`ZSCORE`) and for Lua
/// numbers passed as command arguments.
pub fn fmt_double(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "inf" } else { "-inf" }.into();
    }
    if d == d.trunc() && d.abs() < 1e17 {
        return format!("{}", d as i64);
    }
    let sci = format!("{d:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim_zeros(mantissa), exp.abs());
    }
    trim_zeros(&format!("{d:.*}", (16 - exp) as usize))
}

fn trim_zeros(s: &str) -> String {
    if !s.contains('.') {
        return s.to_string();
    }
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Whether `a` is `word`, in any case (options and subcommands).
pub fn is(a: &[u8], word: &str) -> bool {
    a.eq_ignore_ascii_case(word.as_bytes())
}

fn del(s: &mut Store, a: &[Vec<u8>]) -> Out {
    Ok(Reply::Int(a.iter().filter(|k| s.remove(k)).count() as i64))
}

fn exists(s: &mut Store, a: &[Vec<u8>]) -> Out {
    Ok(Reply::Int(
        a.iter().filter(|k| s.entry(k).is_some()).count() as i64,
    ))
}

fn type_of(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let name = s.entry(&a[0]).map_or("none", |e| e.value.type_name());
    Ok(Reply::Status(name.into()))
}

/// `PEXPIRE key ms`: a time at or before now deletes the key (`checkAlreadyExpired`).
fn pexpire(s: &mut Store, a: &[Vec<u8>]) -> Out {
    if a.len() > 2 {
        return Err("PEXPIRE options are not modelled".into());
    }
    let ms = match int_arg(&a[1]) {
        Ok(ms) => ms,
        Err(e) => return Ok(e),
    };
    let Some(when) = (s.now_ms as i64).checked_add(ms) else {
        return Ok(Reply::err("ERR invalid expire time in 'pexpire' command"));
    };
    if s.entry(&a[0]).is_none() {
        return Ok(Reply::Int(0));
    }
    if when <= s.now_ms as i64 {
        s.remove(&a[0]);
    } else if let Some(e) = s.entry_mut(&a[0]) {
        e.expires_at = Some(when as u64);
    }
    Ok(Reply::Int(1))
}

fn pttl(s: &mut Store, a: &[Vec<u8>]) -> Out {
    Ok(Reply::Int(s.pttl(&a[0])))
}

fn persist(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let had = s.entry_mut(&a[0]).and_then(|e| e.expires_at.take());
    Ok(Reply::Int(had.is_some() as i64))
}

/// `TIME` from the model clock: seconds and microseconds, as bulk strings.
fn time(s: &mut Store, _: &[Vec<u8>]) -> Out {
    let secs = s.now_ms / 1000;
    let micros = (s.now_ms % 1000) * 1000;
    Ok(Reply::Array(vec![
        Reply::bulk(secs.to_string()),
        Reply::bulk(micros.to_string()),
    ]))
}

/// The string under `key`: `Ok(None)` when there is no key, `Err` WRONGTYPE for another
/// type.
pub fn read_str<'a>(s: &'a Store, key: &[u8]) -> Result<Option<&'a [u8]>, Reply> {
    match s.entry(key) {
        None => Ok(None),
        Some(Entry {
            value: Value::Str(v),
            ..
        }) => Ok(Some(v)),
        Some(_) => Err(Reply::err(WRONGTYPE)),
    }
}

fn get(s: &mut Store, a: &[Vec<u8>]) -> Out {
    Ok(match read_str(s, &a[0]) {
        Ok(v) => v.map_or(Reply::Nil, Reply::bulk),
        Err(e) => e,
    })
}

/// `SET key value [PX ms]`: any old value and TTL go.
fn set(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let ttl = match &a[2..] {
        [] => None,
        [px, ms] if is(px, "px") => match int_arg(ms) {
            Ok(ms) if ms > 0 => Some(ms as u64),
            Ok(_) => return Ok(Reply::err("ERR invalid expire time in 'set' command")),
            Err(e) => return Ok(e),
        },
        _ => return Err("SET options other than PX are not modelled".into()),
    };
    let expires_at = ttl.map(|ms| s.now_ms + ms);
    s.put(&a[0], Value::Str(a[1].clone()));
    if let Some(e) = s.entry_mut(&a[0]) {
        e.expires_at = expires_at;
    }
    Ok(Reply::Status("OK".into()))
}

fn by_arg(s: &mut Store, a: &[Vec<u8>], negate: bool) -> Out {
    match int_arg(&a[1]) {
        Ok(n) if negate => match n.checked_neg() {
            Some(n) => incr_by(s, &a[0], n),
            None => Ok(Reply::err("ERR decrement would overflow")),
        },
        Ok(n) => incr_by(s, &a[0], n),
        Err(e) => Ok(e),
    }
}

/// `INCRBY` and friends: an absent key counts as 0; the TTL stays.
fn incr_by(s: &mut Store, key: &[u8], by: i64) -> Out {
    let old = match read_str(s, key) {
        Ok(None) => 0,
        Ok(Some(v)) => match parse_i64(v) {
            Some(n) => n,
            None => return Ok(Reply::err("ERR value is not an integer or out of range")),
        },
        Err(e) => return Ok(e),
    };
    let Some(new) = old.checked_add(by) else {
        return Ok(Reply::err("ERR increment or decrement would overflow"));
    };
    let digits = new.to_string().into_bytes();
    match s.entry_mut(key) {
        Some(e) => e.value = Value::Str(digits),
        None => s.put(key, Value::Str(digits)),
    }
    Ok(Reply::Int(new))
}

fn publish(s: &mut Store, a: &[Vec<u8>], sharded: bool) -> Out {
    Ok(Reply::Int(s.publish(&a[0], &a[1], sharded) as i64))
}

/// `PUBSUB NUMSUB|SHARDNUMSUB channel...`: channel and count, for each channel.
fn pubsub(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let sharded = match &a[0] {
        sub if is(sub, "numsub") => false,
        sub if is(sub, "shardnumsub") => true,
        _ => return Err("PUBSUB subcommands but NUMSUB and SHARDNUMSUB are not modelled".into()),
    };
    let mut out = Vec::new();
    for channel in &a[1..] {
        out.push(Reply::bulk(channel));
        out.push(Reply::Int(s.subscriber_count(channel, sharded) as i64));
    }
    Ok(Reply::Array(out))
}
