//! Sorted-set commands. A sorted set left empty is deleted with its TTL.

use super::commands::{fmt_double, int_arg, is, Out};
use super::store::{Reply, Score, Store};

macro_rules! or_reply {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Ok(e),
        }
    };
}

/// A score as Redis reads one (`strtod`, `inf` allowed, NaN refused).
fn parse_score(b: &[u8]) -> Option<f64> {
    let d: f64 = std::str::from_utf8(b).ok()?.parse().ok()?;
    (!d.is_nan()).then_some(d)
}

/// `ZADD key score member [score member ...]`, no flags: how many members are new.
pub fn zadd(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let flags = ["nx", "xx", "gt", "lt", "ch", "incr"];
    if flags.iter().any(|f| is(&a[1], f)) {
        return Err("ZADD flags are not modelled".into());
    }
    if a.len().is_multiple_of(2) {
        return Ok(Reply::err("ERR syntax error"));
    }
    let mut pairs = Vec::new();
    for p in a[1..].chunks(2) {
        match parse_score(&p[0]) {
            Some(d) => pairs.push((Score(d), p[1].clone())),
            None => return Ok(Reply::err("ERR value is not a valid float")),
        }
    }
    let z = or_reply!(s.zset_mut(&a[0]));
    let added = pairs
        .into_iter()
        .filter(|(d, m)| z.insert(m.clone(), *d).is_none())
        .count();
    Ok(Reply::Int(added as i64))
}

pub fn zrem(s: &mut Store, a: &[Vec<u8>]) -> Out {
    if or_reply!(s.zset(&a[0])).is_none() {
        return Ok(Reply::Int(0));
    }
    let z = or_reply!(s.zset_mut(&a[0]));
    let removed = a[1..].iter().filter(|m| z.remove(*m).is_some()).count();
    s.drop_if_empty(&a[0]);
    Ok(Reply::Int(removed as i64))
}

pub fn zscore(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let z = or_reply!(s.zset(&a[0]));
    let score = z.and_then(|z| z.get(&a[1]));
    Ok(score.map_or(Reply::Nil, |d| Reply::bulk(fmt_double(d.0))))
}

/// `ZINCRBY key increment member`: the new score (a new member starts from 0).
pub fn zincrby(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let Some(by) = parse_score(&a[1]) else {
        return Ok(Reply::err("ERR value is not a valid float"));
    };
    let z = or_reply!(s.zset_mut(&a[0]));
    let new = z.get(&a[2]).map_or(0.0, |d| d.0) + by;
    if new.is_nan() {
        return Ok(Reply::err("ERR resulting score is not a number (NaN)"));
    }
    z.insert(a[2].clone(), Score(new));
    Ok(Reply::bulk(fmt_double(new)))
}

pub fn zcard(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let z = or_reply!(s.zset(&a[0]));
    Ok(Reply::Int(z.map_or(0, |z| z.len()) as i64))
}

/// `ZRANGE key start stop`, by index only (no options): members in score order, equal
/// scores in member order, the indices clamped as `LRANGE`'s.
pub fn zrange(s: &mut Store, a: &[Vec<u8>]) -> Out {
    if a.len() > 3 {
        return Err("ZRANGE options are not modelled".into());
    }
    let (start, stop) = match (int_arg(&a[1]), int_arg(&a[2])) {
        (Ok(start), Ok(stop)) => (start, stop),
        (Err(e), _) | (_, Err(e)) => return Ok(e),
    };
    let z = or_reply!(s.zset(&a[0]));
    let mut all: Vec<(Score, &Vec<u8>)> = z.into_iter().flatten().map(|(m, d)| (*d, m)).collect();
    all.sort();
    let len = all.len() as i64;
    let at = |i: i64| if i < 0 { i + len } else { i };
    let (start, stop) = (at(start).max(0), at(stop).min(len - 1));
    if start > stop {
        return Ok(Reply::Array(Vec::new()));
    }
    let members = all[start as usize..=stop as usize].iter();
    Ok(Reply::Array(
        members.map(|(_, m)| Reply::bulk(*m)).collect(),
    ))
}

/// One end of a score range: its value and whether it is exclusive (`(`).
fn bound(b: &[u8]) -> Option<(f64, bool)> {
    match b.strip_prefix(b"(") {
        Some(rest) => parse_score(rest).map(|d| (d, true)),
        None => parse_score(b).map(|d| (d, false)),
    }
}

/// The options after `ZRANGEBYSCORE key min max`: with scores, and offset and count.
fn range_options(opts: &[Vec<u8>]) -> Result<(bool, usize, Option<usize>), Out> {
    let (mut scores, mut offset, mut count) = (false, 0, None);
    let mut i = 0;
    while i < opts.len() {
        if is(&opts[i], "withscores") {
            scores = true;
            i += 1;
        } else if is(&opts[i], "limit") && opts.len() >= i + 3 {
            let off = int_arg(&opts[i + 1]).map_err(Ok)?;
            let n = int_arg(&opts[i + 2]).map_err(Ok)?;
            if off < 0 {
                return Err(Err("a negative LIMIT offset is not modelled".into()));
            }
            offset = off as usize;
            count = usize::try_from(n).ok();
            i += 3;
        } else {
            return Err(Ok(Reply::err("ERR syntax error")));
        }
    }
    Ok((scores, offset, count))
}

/// `ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT offset count]`: members in score
/// order, equal scores in member order; a negative count means all.
pub fn zrangebyscore(s: &mut Store, a: &[Vec<u8>]) -> Out {
    let (scores, offset, count) = match range_options(&a[3..]) {
        Ok(o) => o,
        Err(out) => return out,
    };
    let (Some(min), Some(max)) = (bound(&a[1]), bound(&a[2])) else {
        return Ok(Reply::err("ERR min or max is not a float"));
    };
    let above = |d: f64| if min.1 { d > min.0 } else { d >= min.0 };
    let below = |d: f64| if max.1 { d < max.0 } else { d <= max.0 };
    let z = or_reply!(s.zset(&a[0]));
    let mut hits: Vec<(Score, &Vec<u8>)> = z
        .into_iter()
        .flatten()
        .filter(|(_, d)| above(d.0) && below(d.0))
        .map(|(m, d)| (*d, m))
        .collect();
    hits.sort();
    let mut out = Vec::new();
    for (d, m) in hits
        .into_iter()
        .skip(offset)
        .take(count.unwrap_or(usize::MAX))
    {
        out.push(Reply::bulk(m));
        if scores {
            out.push(Reply::bulk(fmt_double(d.0)));
        }
    }
    Ok(Reply::Array(out))
}
