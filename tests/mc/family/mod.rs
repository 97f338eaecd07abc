//! The checker over the lock family (issue 25, goal 2): the semaphores, the latch, the
//! read-write lock and the fair lock, each a world of its own over the crate's real scripts and
//! Redisson's own scripts typed in (`peer.rs`), explored by `explore.rs`.
//!
//! Each world is small: one store on a model clock, a few actors whose steps are script
//! runs, pub/sub messages on their way, and a budget of faults. What they share is here:
//! the script texts of a config (a seeded bug edits one), a script run that hands back
//! its messages, and the adapter that makes a world a `Model`.

pub mod fair;
pub mod latch;
pub mod peer;
pub mod permits;
pub mod rw;
pub mod semaphore;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use crate::checker::store::{Message, Reply, Store, Value};
use crate::explore::Model;

/// The model clock starts here (ms), so that `TIME` answers a plausible epoch.
pub const EPOCH: u64 = 1_000_000;

/// The texts a world runs, by name: the crate's files (`"semaphore_acquire.lua"`) and
/// Redisson's (`"redisson:..."`), or a seeded bug's edit of one.
#[derive(Clone)]
pub struct Texts(BTreeMap<&'static str, Rc<str>>);

impl Texts {
    /// The crate's `files` as it sends them, beside Redisson's scripts.
    pub fn of(files: &[&'static str]) -> Texts {
        let mut map: BTreeMap<&'static str, Rc<str>> =
            peer::ALL.iter().map(|(n, t)| (*n, (*t).into())).collect();
        for f in files {
            let text = redis_rlock::protocol::script_source(f).expect("a script of the crate");
            map.insert(f, text.into());
        }
        Texts(map)
    }

    pub fn get(&self, name: &str) -> &Rc<str> {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no script {name}"))
    }

    /// These texts with `name`'s edited (a seeded bug); `from` must occur in it.
    pub fn edit(mut self, name: &str, from: &str, to: &str) -> Texts {
        let (key, text) = self
            .0
            .iter_mut()
            .find(|(k, _)| **k == name)
            .expect("a script");
        assert!(
            text.contains(from),
            "{key}: the seeded bug's text is not in it: {from}"
        );
        *text = text.replacen(from, to, 1).into();
        self
    }
}

/// What every state of a world shares (its config and texts): left out of hashing and
/// equality, so that only what changes identifies a state.
pub struct Fixed<T>(pub Rc<T>);

impl<T> Clone for Fixed<T> {
    fn clone(&self) -> Self {
        Fixed(self.0.clone())
    }
}

impl<T> std::ops::Deref for Fixed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
impl<T> Hash for Fixed<T> {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}
impl<T> PartialEq for Fixed<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<T> Eq for Fixed<T> {}
impl<T> std::fmt::Debug for Fixed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fixed")
    }
}

/// Runs one script on `store` (from the cache when these inputs ran before) and hands
/// back its reply and the messages it published.
pub fn run<K: AsRef<[u8]>, A: AsRef<[u8]>>(
    store: &mut Store,
    src: &Rc<str>,
    keys: &[K],
    args: &[A],
) -> (Reply, Vec<Message>) {
    let reply = crate::cache::run(store, src, keys, args);
    (reply, store.drain_outbox())
}

/// The integer a string key holds (0 when absent).
pub fn count(store: &Store, key: &str) -> i64 {
    match store.entry(key.as_bytes()).map(|e| &e.value) {
        Some(Value::Str(s)) => std::str::from_utf8(s).unwrap().parse().unwrap(),
        None => 0,
        Some(v) => panic!("{key} holds {v:?}"),
    }
}

/// A reply's integer: `Int`, or the first element of an array.
pub fn int(r: &Reply) -> i64 {
    match r {
        Reply::Int(n) => *n,
        Reply::Array(a) if !a.is_empty() => int(&a[0]),
        other => panic!("not an integer reply: {other:?}"),
    }
}

/// The model clock moves on by 1 ms; the trace's line for it.
pub fn tick(store: &mut Store) -> String {
    store.now_ms += 1;
    "tick".into()
}

/// `World::store` and `World::store_mut` for a world that keeps its store in `store`.
macro_rules! store_in_field {
    () => {
        fn store(&self) -> &Store {
            &self.store
        }
        fn store_mut(&mut self) -> &mut Store {
            &mut self.store
        }
    };
}
pub(crate) use store_in_field;

/// One of the family's worlds: its actions, their effects and its properties.
pub trait World: Clone + Hash {
    type Action: Copy + std::fmt::Debug;
    fn actions(&self) -> Vec<Self::Action>;
    /// Takes `a`; says what happened.
    fn apply(&mut self, a: Self::Action) -> String;
    /// The properties this state breaks.
    fn violations(&self) -> Vec<&'static str>;
    fn store(&self) -> &Store;
    fn store_mut(&mut self) -> &mut Store;
}

/// A world as a model for the explorer, from its initial state.
pub struct Checked<W>(pub W);

impl<W: World> Model for Checked<W> {
    type State = W;
    type Action = W::Action;

    fn init(&self) -> W {
        self.0.clone()
    }

    fn actions(&self, s: &W) -> Vec<W::Action> {
        s.actions()
    }

    fn step(&self, s: &W, a: &W::Action) -> (W, String) {
        let mut next = s.clone();
        let line = next.apply(*a);
        next.store_mut().purge_expired();
        let at = next.store().now_ms - EPOCH;
        (next, format!("[{at} ms] {line}"))
    }

    fn violations(&self, s: &W) -> Vec<&'static str> {
        s.violations()
    }

    fn describe(&self, s: &W) -> String {
        let now = s.store().now_ms;
        let keys: Vec<String> = (s.store().live())
            .map(|(k, e)| {
                let ttl = e.expires_at.map_or(-1, |t| t as i64 - now as i64);
                format!("{} = {} (PTTL {ttl})", text(k), show(&e.value))
            })
            .collect();
        format!("keys [{}]", keys.join(", "))
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A value as text, for traces: strings as such, collections as their elements.
fn show(v: &Value) -> String {
    match v {
        Value::Str(s) => text(s),
        Value::Hash(h) => format!(
            "{:?}",
            h.iter()
                .map(|(f, v)| (text(f), text(v)))
                .collect::<Vec<_>>()
        ),
        Value::ZSet(z) => format!(
            "{:?}",
            z.iter().map(|(m, s)| (text(m), s.0)).collect::<Vec<_>>()
        ),
        Value::List(l) => format!("{:?}", l.iter().map(|i| text(i)).collect::<Vec<_>>()),
    }
}
