//! An in-memory model of the Redis state the crate's scripts touch: keys with values of
//! the four types they use, absolute expiry times on a clock the caller sets (model
//! time), pub/sub subscriber counts the caller sets and an outbox of published messages.
//!
//! Everything is a `BTreeMap` or a `VecDeque`, so a whole store hashes and orders: a
//! checker state can hold it. Expiry is lazy, as in Redis: a key past its expiry time
//! simply does not exist for any command; [`Store::purge_expired`] drops such keys for
//! a checker that wants equal states to compare equal.

use std::collections::{BTreeMap, VecDeque};

/// A sorted-set score. Redis scores are doubles; this wrapper gives them the total
/// order and hash a state needs (the scripts only ever write integral scores).
#[derive(Clone, Copy, Debug)]
pub struct Score(pub f64);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl std::hash::Hash for Score {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}

/// The value of one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Str(Vec<u8>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    List(VecDeque<Vec<u8>>),
    /// Member -> score; ordered by score only when a range asks for it.
    ZSet(BTreeMap<Vec<u8>, Score>),
}

impl Value {
    /// The name `TYPE` answers.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::List(_) => "list",
            Value::ZSet(_) => "zset",
        }
    }

    /// A collection with no elements: Redis deletes such a key (and its TTL) at once.
    fn is_empty_collection(&self) -> bool {
        match self {
            Value::Str(_) => false,
            Value::Hash(h) => h.is_empty(),
            Value::List(l) => l.is_empty(),
            Value::ZSet(z) => z.is_empty(),
        }
    }
}

/// A key's value and its absolute expiry time in model milliseconds, if any.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub value: Value,
    pub expires_at: Option<u64>,
}

/// One message published by a script.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Message {
    pub channel: Vec<u8>,
    pub payload: Vec<u8>,
    /// Sent with `SPUBLISH` (heard by `SSUBSCRIBE`rs only), else `PUBLISH`.
    pub sharded: bool,
}

/// A reply as Redis gives it, to a script (converted to Lua) or to the client.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Array(Vec<Reply>),
    Error(String),
}

impl Reply {
    pub fn err(msg: impl Into<String>) -> Reply {
        Reply::Error(msg.into())
    }

    pub fn bulk(b: impl AsRef<[u8]>) -> Reply {
        Reply::Bulk(b.as_ref().to_vec())
    }
}

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// A typed reader and writer of one value type: the reader answers `Ok(None)` for no
/// key, the writer makes an empty value for no key; both answer WRONGTYPE for a key of
/// another type.
macro_rules! typed_access {
    ($read:ident, $write:ident, $variant:ident, $ty:ty) => {
        pub fn $read(&self, key: &[u8]) -> Result<Option<&$ty>, Reply> {
            match self.entry(key).map(|e| &e.value) {
                None => Ok(None),
                Some(Value::$variant(v)) => Ok(Some(v)),
                Some(_) => Err(Reply::err(WRONGTYPE)),
            }
        }

        pub fn $write(&mut self, key: &[u8]) -> Result<&mut $ty, Reply> {
            if self.entry_mut(key).is_none() {
                self.put(key, Value::$variant(Default::default()));
            }
            match self.entry_mut(key).map(|e| &mut e.value) {
                Some(Value::$variant(v)) => Ok(v),
                _ => Err(Reply::err(WRONGTYPE)),
            }
        }
    };
}

/// The Redis state: keys, the model clock, subscriber counts and the outbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Store {
    keys: BTreeMap<Vec<u8>, Entry>,
    /// Model time in ms since the epoch; `TIME` and every expiry read it.
    pub now_ms: u64,
    /// Channel -> how many clients `SUBSCRIBE`d to it (`PUBSUB NUMSUB`, `PUBLISH`).
    pub subscribers: BTreeMap<Vec<u8>, u64>,
    /// Channel -> how many clients `SSUBSCRIBE`d to it (`SHARDNUMSUB`, `SPUBLISH`).
    pub shard_subscribers: BTreeMap<Vec<u8>, u64>,
    outbox: Vec<Message>,
}

impl Store {
    typed_access!(hash, hash_mut, Hash, BTreeMap<Vec<u8>, Vec<u8>>);
    typed_access!(list, list_mut, List, VecDeque<Vec<u8>>);
    typed_access!(zset, zset_mut, ZSet, BTreeMap<Vec<u8>, Score>);

    pub fn new(now_ms: u64) -> Store {
        Store {
            now_ms,
            ..Store::default()
        }
    }

    /// Whether an entry is past its expiry. Redis: a key expires once now > when, so a
    /// key whose expiry is exactly now still exists (`keyIsExpired`).
    fn expired(&self, e: &Entry) -> bool {
        e.expires_at.is_some_and(|t| self.now_ms > t)
    }

    /// The live entry of `key`.
    pub fn entry(&self, key: &[u8]) -> Option<&Entry> {
        self.keys.get(key).filter(|e| !self.expired(e))
    }

    /// The live entry of `key`, for writing; an expired one is dropped first.
    pub fn entry_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        if self.keys.get(key).is_some_and(|e| self.expired(e)) {
            self.keys.remove(key);
        }
        self.keys.get_mut(key)
    }

    /// Writes `value` under `key` with no TTL (SET semantics: the old TTL goes).
    pub fn put(&mut self, key: &[u8], value: Value) {
        let entry = Entry {
            value,
            expires_at: None,
        };
        self.keys.insert(key.to_vec(), entry);
    }

    /// Deletes `key`; whether a live key was there.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        let live = self.entry(key).is_some();
        self.keys.remove(key);
        live
    }

    /// Deletes `key` if it holds an empty hash, list or sorted set, as Redis does after
    /// every removal from a collection.
    pub fn drop_if_empty(&mut self, key: &[u8]) {
        if self
            .keys
            .get(key)
            .is_some_and(|e| e.value.is_empty_collection())
        {
            self.keys.remove(key);
        }
    }

    /// `PTTL`: -2 when there is no key, -1 when it has no expiry, else ms left.
    pub fn pttl(&self, key: &[u8]) -> i64 {
        match self.entry(key) {
            None => -2,
            Some(Entry {
                expires_at: None, ..
            }) => -1,
            Some(Entry {
                expires_at: Some(t),
                ..
            }) => (*t as i64) - (self.now_ms as i64),
        }
    }

    /// Every live key with its entry, in key order.
    pub fn live(&self) -> impl Iterator<Item = (&Vec<u8>, &Entry)> {
        self.keys.iter().filter(|(_, e)| !self.expired(e))
    }

    /// The same state with every key, field, member, value and channel passed through
    /// `rename` (the checker's symmetry reduction renames interchangeable clients).
    pub fn renamed(&self, rename: &dyn Fn(&[u8]) -> Vec<u8>) -> Store {
        let value = |v: &Value| match v {
            Value::Str(b) => Value::Str(rename(b)),
            Value::Hash(h) => Value::Hash(h.iter().map(|(f, v)| (rename(f), rename(v))).collect()),
            Value::List(l) => Value::List(l.iter().map(|i| rename(i)).collect()),
            Value::ZSet(z) => {
                Value::ZSet(z.iter().map(|(m, sc)| (rename(m), Score(sc.0))).collect())
            }
        };
        let channels =
            |m: &BTreeMap<Vec<u8>, u64>| m.iter().map(|(c, n)| (rename(c), *n)).collect();
        Store {
            keys: self
                .keys
                .iter()
                .map(|(k, e)| {
                    let entry = Entry {
                        value: value(&e.value),
                        expires_at: e.expires_at,
                    };
                    (rename(k), entry)
                })
                .collect(),
            now_ms: self.now_ms,
            subscribers: channels(&self.subscribers),
            shard_subscribers: channels(&self.shard_subscribers),
            outbox: self.outbox.clone(),
        }
    }

    /// Drops every expired key (they are invisible anyway): two states that differ only
    /// in dead keys then compare and hash equal.
    pub fn purge_expired(&mut self) {
        let now = self.now_ms;
        self.keys
            .retain(|_, e| e.expires_at.is_none_or(|t| now <= t));
    }

    /// Records a published message and answers how many subscribers heard it.
    pub fn publish(&mut self, channel: &[u8], payload: &[u8], sharded: bool) -> u64 {
        self.outbox.push(Message {
            channel: channel.to_vec(),
            payload: payload.to_vec(),
            sharded,
        });
        self.subscriber_count(channel, sharded)
    }

    pub fn subscriber_count(&self, channel: &[u8], sharded: bool) -> u64 {
        let map = if sharded {
            &self.shard_subscribers
        } else {
            &self.subscribers
        };
        map.get(channel).copied().unwrap_or(0)
    }

    /// Takes every message published since the last drain, oldest first.
    pub fn drain_outbox(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.outbox)
    }
}
