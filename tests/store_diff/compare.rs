//! What the differential test compares: every key's value and TTL in one normal form
//! for the server and the store, and replies, with a tolerance only where a value is a
//! time (the server's clock moves while a step runs; the store's stands still).

use std::collections::BTreeMap;

use crate::checker::store::{Reply, Score, Store, Value};

/// How far two times may differ, in ms: a PTTL, a wait in a reply, a deadline.
pub const TOL_MS: i64 = 40;

/// Anything at or above this is a time in ms since the epoch (about 2001 on), not a
/// count: only such numbers inside values are compared within [`TOL_MS`].
const EPOCH_MS: i64 = 1_000_000_000_000;

/// A key's value in a form both sides give alike.
#[derive(Clone, Debug, PartialEq)]
pub enum Norm {
    Str(Vec<u8>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    List(Vec<Vec<u8>>),
    /// Member -> score.
    ZSet(BTreeMap<Vec<u8>, f64>),
}

#[derive(Clone, Debug)]
pub struct Snap {
    pub value: Norm,
    /// -1: no TTL.
    pub pttl: i64,
}

/// Every live key of one side.
pub type State = BTreeMap<Vec<u8>, Snap>;

/// How to compare one reply.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    Exact,
    /// `{0, ms, ...}`: the ms is a time (a PTTL or a wait); so is a bare integer
    /// (`take.lua`'s busy answer).
    Wait,
    /// An integer that is a time (`PTTL`).
    Ttl,
    /// An array whose order Redis does not define (`HKEYS`, `HVALS`).
    Unordered,
    /// A flat array of pairs whose order Redis does not define (`HGETALL`).
    Pairs,
}

pub fn norm(v: &Value) -> Norm {
    match v {
        Value::Str(s) => Norm::Str(s.clone()),
        Value::Hash(h) => Norm::Hash(h.clone()),
        Value::List(l) => Norm::List(l.iter().cloned().collect()),
        Value::ZSet(z) => Norm::ZSet(z.iter().map(|(m, d)| (m.clone(), d.0)).collect()),
    }
}

pub fn denorm(n: &Norm) -> Value {
    match n {
        Norm::Str(s) => Value::Str(s.clone()),
        Norm::Hash(h) => Value::Hash(h.clone()),
        Norm::List(l) => Value::List(l.iter().cloned().collect()),
        Norm::ZSet(z) => Value::ZSet(z.iter().map(|(m, d)| (m.clone(), Score(*d))).collect()),
    }
}

/// The store's live keys, with PTTLs at its clock.
pub fn store_state(s: &Store) -> State {
    s.live()
        .map(|(k, e)| {
            let snap = Snap {
                value: norm(&e.value),
                pttl: s.pttl(k),
            };
            (k.clone(), snap)
        })
        .collect()
}

/// Absolute times (ms) in a state read at `read_ms`: expiries, and times inside values
/// (deadlines in sorted sets, the validity of a naming in a hash).
pub fn marks(state: &State, read_ms: i64) -> Vec<i64> {
    let mut out = Vec::new();
    for snap in state.values() {
        if snap.pttl >= 0 {
            out.push(read_ms + snap.pttl);
        }
        match &snap.value {
            Norm::Str(s) => out.extend(times_in(s)),
            Norm::Hash(h) => h.values().for_each(|v| out.extend(times_in(v))),
            Norm::List(l) => l.iter().for_each(|v| out.extend(times_in(v))),
            Norm::ZSet(z) => out.extend(
                z.values()
                    .filter(|d| **d >= EPOCH_MS as f64)
                    .map(|d| *d as i64),
            ),
        }
    }
    out
}

fn times_in(b: &[u8]) -> impl Iterator<Item = i64> + '_ {
    b.split(|c| *c == b' ').filter_map(time_token)
}

fn time_token(t: &[u8]) -> Option<i64> {
    let n: i64 = std::str::from_utf8(t).ok()?.parse().ok()?;
    (n >= EPOCH_MS).then_some(n)
}

/// Equal, or equal but for times within the tolerance (space-separated tokens).
fn close_bytes(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    let (ta, tb): (Vec<_>, Vec<_>) = (
        a.split(|c| *c == b' ').collect(),
        b.split(|c| *c == b' ').collect(),
    );
    ta.len() == tb.len()
        && ta.iter().zip(&tb).all(|(x, y)| {
            x == y || matches!((time_token(x), time_token(y)), (Some(p), Some(q)) if (p - q).abs() <= TOL_MS)
        })
}

fn close_score(a: f64, b: f64) -> bool {
    a == b || (a >= EPOCH_MS as f64 && b >= EPOCH_MS as f64 && (a - b).abs() <= TOL_MS as f64)
}

fn close_norm(a: &Norm, b: &Norm) -> bool {
    match (a, b) {
        (Norm::Str(x), Norm::Str(y)) => close_bytes(x, y),
        (Norm::Hash(x), Norm::Hash(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && close_bytes(vx, vy))
        }
        (Norm::List(x), Norm::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| close_bytes(p, q))
        }
        (Norm::ZSet(x), Norm::ZSet(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((mx, dx), (my, dy))| mx == my && close_score(*dx, *dy))
        }
        _ => false,
    }
}

fn close_ttl(a: i64, b: i64) -> bool {
    a == b || (a >= 0 && b >= 0 && (a - b).abs() <= TOL_MS)
}

/// Every difference between the server's state and the store's, one line each.
pub fn state_diff(server: &State, store: &State) -> Vec<String> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<_> = server.keys().chain(store.keys()).collect();
    for k in keys {
        let name = show(k);
        match (server.get(k), store.get(k)) {
            (Some(a), None) => out.push(format!("{name}: only on the server: {a:?}")),
            (None, Some(b)) => out.push(format!("{name}: only in the store: {b:?}")),
            (Some(a), Some(b)) if !close_norm(&a.value, &b.value) => {
                out.push(format!("{name}: server {:?}, store {:?}", a.value, b.value))
            }
            (Some(a), Some(b)) if !close_ttl(a.pttl, b.pttl) => {
                out.push(format!("{name}: PTTL server {}, store {}", a.pttl, b.pttl))
            }
            _ => {}
        }
    }
    out
}

/// Whether two replies agree: errors by their code (the first word; the server adds
/// where a script failed), times within the tolerance.
pub fn close_reply(server: &Reply, store: &Reply, shape: Shape) -> bool {
    match (server, store, shape) {
        (Reply::Error(a), Reply::Error(b), _) => a.split(' ').next() == b.split(' ').next(),
        (Reply::Int(a), Reply::Int(b), Shape::Ttl | Shape::Wait) => close_ttl(*a, *b),
        (Reply::Array(a), Reply::Array(b), Shape::Wait)
            if a.len() == b.len()
                && a.len() >= 2
                && a[0] == Reply::Int(0)
                && b[0] == Reply::Int(0) =>
        {
            close_reply(&a[1], &b[1], Shape::Ttl) && a[2..] == b[2..]
        }
        (Reply::Array(a), Reply::Array(b), Shape::Unordered) => sorted(a, 1) == sorted(b, 1),
        (Reply::Array(a), Reply::Array(b), Shape::Pairs) => sorted(a, 2) == sorted(b, 2),
        _ => server == store,
    }
}

fn sorted(items: &[Reply], chunk: usize) -> Vec<&[Reply]> {
    let mut v: Vec<&[Reply]> = items.chunks(chunk).collect();
    v.sort();
    v
}

/// Bytes for a message: printable ASCII as is, the rest escaped.
pub fn show(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}
