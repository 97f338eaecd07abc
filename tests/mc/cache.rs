//! Script results, remembered: a script is deterministic in its text, keys, arguments
//! and the store it runs on (keys, clock, subscriptions), so a run with the same inputs
//! gives the same reply, store and messages. The explorer meets the same store again in
//! many states that differ only in the actors' own state.
//!
//! Keyed by a 128-bit fingerprint of the inputs (collision odds as in `explore.rs`).
//! One cache per thread, cleared by `clear` between configs.

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use super::explore::Report;
use crate::checker::script;
use crate::checker::store::{Reply, Store};

thread_local! {
    static CACHE: RefCell<HashMap<u128, (Reply, Store)>> = RefCell::new(HashMap::new());
    static COUNTS: RefCell<(u64, u64)> = const { RefCell::new((0, 0)) };
}

/// The script is known by its address: every text is one `Rc<str>` of the config, which
/// lives as long as the exploration, and the cache is cleared between configs.
fn key<K: AsRef<[u8]>, A: AsRef<[u8]>>(
    store: &Store,
    src: &Rc<str>,
    keys: &[K],
    args: &[A],
) -> u128 {
    let mut halves = [0u64; 2];
    for (i, half) in halves.iter_mut().enumerate() {
        let mut h = DefaultHasher::new();
        i.hash(&mut h);
        (Rc::as_ptr(src) as *const u8 as usize).hash(&mut h);
        for k in keys {
            k.as_ref().hash(&mut h);
        }
        0xffu8.hash(&mut h);
        for a in args {
            a.as_ref().hash(&mut h);
        }
        Hash::hash(store, &mut h);
        *half = h.finish();
    }
    (u128::from(halves[0]) << 64) | u128::from(halves[1])
}

/// `script::run`, from the cache when these inputs were run before. `store`'s outbox
/// must be empty (the world drains it after every run).
pub fn run<K: AsRef<[u8]>, A: AsRef<[u8]>>(
    store: &mut Store,
    src: &Rc<str>,
    keys: &[K],
    args: &[A],
) -> Reply {
    let k = key(store, src, keys, args);
    if let Some((reply, after)) = CACHE.with(|c| c.borrow().get(&k).cloned()) {
        COUNTS.with(|n| n.borrow_mut().0 += 1);
        *store = after;
        return reply;
    }
    COUNTS.with(|n| n.borrow_mut().1 += 1);
    let reply = script::run(store, src, keys, args)
        .unwrap_or_else(|why| panic!("the script left the model: {why}"));
    CACHE.with(|c| c.borrow_mut().insert(k, (reply.clone(), store.clone())));
    reply
}

/// Empties the cache; answers (hits, runs) since the last call.
pub fn clear() -> (u64, u64) {
    CACHE.with(|c| c.borrow_mut().clear());
    COUNTS.with(|n| std::mem::take(&mut *n.borrow_mut()))
}

/// Runs one exploration with a cache of its own, and prints its summary (with how many
/// script runs the cache saved) and its counterexamples.
pub fn measured(name: &str, explore: impl FnOnce() -> Report) -> Report {
    clear();
    let report = explore();
    let (hits, runs) = clear();
    let summary = report.summary(name);
    println!("{summary} (scripts: {runs} run, {hits} from the cache)");
    report.print_traces();
    report
}
