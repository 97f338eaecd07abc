//! The properties, judged on every state the explorer reaches (and two on every script
//! run, recorded in the state once broken).

use super::client::{self, Phase};
use super::redisson;
use super::world::{World, LOCK};
use crate::checker::store::{Store, Value};
use redis_rlock::protocol::{clients_key, token_key, turn_key};

pub const MUTEX: &str = "mutual exclusion";
pub const TTL: &str = "every key carries a TTL";
pub const CLEAN: &str = "nothing left after the last unlock";
pub const BYPASS: &str = "bounded bypass";
pub const PLACES: &str = "a join never shortens places";

pub fn check(w: &World) -> Vec<&'static str> {
    let mut broken: Vec<&'static str> = w.broken.iter().copied().collect();
    let now = w.now();
    let holders = w.redisson.iter().filter(|a| a.holds_live(now)).count()
        + w.clients
            .iter()
            .filter(|c| !c.crashed)
            .flat_map(|c| &c.tasks)
            .filter(|t| matches!(t.phase, Phase::Holding { until, .. } if now < until))
            .count();
    if holders > 1 {
        broken.push(MUTEX);
    }
    if let Some(p) = clean(w) {
        broken.push(p);
    }
    if w.passed.iter().any(|(_, n)| *n > w.cfg.bypass) {
        broken.push(BYPASS);
    }
    broken
}

/// Once every actor has finished, none crashed and no fault touched the store, the
/// lock, its line and its turn are gone (latches are the janitor's, and
/// carry a TTL).
fn clean(w: &World) -> Option<&'static str> {
    let crashed = w.clients.iter().any(|c| c.crashed) || w.redisson.iter().any(|a| a.crashed);
    if !w.all_done() || crashed {
        return None;
    }
    let left = [LOCK.to_string(), clients_key(LOCK), turn_key(LOCK)];
    left.iter()
        .any(|k| w.store.entry(k.as_bytes()).is_some())
        .then_some(CLEAN)
}

/// Properties of one script run: every key it leaves has a TTL (but Redisson's fencing
/// counter), and the line, if it was there before, is not cut shorter (a join must not
/// take places from clients already waiting).
pub fn on_step(before: &Store, after: &Store) -> Vec<&'static str> {
    let mut broken = Vec::new();
    let token = token_key(LOCK);
    if after
        .live()
        .any(|(k, e)| e.expires_at.is_none() && k.as_slice() != token.as_bytes())
    {
        broken.push(TTL);
    }
    let line = clients_key(LOCK);
    let at = |s: &Store| s.entry(line.as_bytes()).and_then(|e| e.expires_at);
    if let (Some(b), Some(a)) = (at(before), at(after)) {
        if a < b {
            broken.push(PLACES);
        }
    }
    broken
}

/// The owner of a holder field: its client id (the first 36 characters).
fn owner(field: &[u8]) -> Vec<u8> {
    field[..36.min(field.len())].to_vec()
}

fn holders(s: &Store) -> Vec<Vec<u8>> {
    match s.entry(LOCK.as_bytes()).map(|e| &e.value) {
        Some(Value::Hash(h)) => h.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Waiting owners: Redisson actor i as i, crate client c as 100 + c, with their ids.
fn waiting(w: &World) -> Vec<(u8, Vec<u8>)> {
    let r = w.redisson.iter().enumerate().filter(|(_, a)| a.waiting());
    let r = r.map(|(i, _)| (i as u8, redisson::uuid(i).into_bytes()));
    let c = w.clients.iter().enumerate().filter(|(_, c)| c.waiting());
    r.chain(c.map(|(i, _)| (100 + i as u8, client::id(i).into_bytes())))
        .collect()
}

/// A grant to another owner while the lock was held (a hand-over across owners, which
/// the protocol never makes): every other waiting owner is passed over once more. A hand-over
/// inside one client is its run of hand-overs, bounded by its window, not counted.
pub fn count_bypass(w: &mut World, before: &Store) {
    let (old, new) = (holders(before), holders(&w.store));
    if old.is_empty() {
        return;
    }
    let olds: Vec<Vec<u8>> = old.iter().map(|f| owner(f)).collect();
    let Some(to) = new
        .iter()
        .filter(|f| !old.contains(f))
        .map(|f| owner(f))
        .find(|o| !olds.contains(o))
    else {
        return;
    };
    for (who, id) in waiting(w) {
        if id == to {
            continue;
        }
        match w.passed.iter_mut().find(|(o, _)| *o == who) {
            Some((_, n)) => *n += 1,
            None => w.passed.push((who, 1)),
        }
    }
}

/// The lock is free (every waiter may take it now), or an owner no longer waits: its
/// count starts over.
pub fn reset_bypass_if_free(w: &mut World) {
    if w.store.entry(LOCK.as_bytes()).is_none() {
        w.passed.clear();
        return;
    }
    let still: Vec<u8> = waiting(w).into_iter().map(|(o, _)| o).collect();
    w.passed.retain(|(o, _)| still.contains(o));
}
