//! A real redis-server and a [`Store`] driven in lockstep: each step runs on both, then
//! the replies, every key (value and TTL) and the messages heard are compared.
//!
//! The server's clock moves; the store's is set from the server's `TIME` before each
//! step. So that no step depends on which side of an expiry or a deadline the two
//! clocks fall, a step waits until no such time is near (see [`Twin::settle`]).

use std::time::Duration;

use super::compare::{self, close_reply, marks, show, Shape, Snap, State};
use super::subscriber::{Heard, Subscriber};
use crate::checker::script;
use crate::checker::store::{Reply, Store};
use crate::common::RedisServer;

/// A step does not start while an expiry or a deadline is this close (ms): both sides
/// then see the same side of it, as long as a step runs within this long.
const GUARD_MS: i64 = 40;

/// One script call, on both sides.
#[derive(Clone, Debug)]
pub struct Call {
    pub script: &'static str,
    pub source: &'static str,
    pub keys: Vec<Vec<u8>>,
    pub args: Vec<Vec<u8>>,
    pub shape: Shape,
}

impl Call {
    pub fn new(script: &'static str, source: &'static str) -> Call {
        Call {
            script,
            source,
            keys: Vec::new(),
            args: Vec::new(),
            shape: Shape::Exact,
        }
    }

    pub fn key(mut self, k: impl AsRef<[u8]>) -> Call {
        self.keys.push(k.as_ref().to_vec());
        self
    }

    /// `k` if `present`, as the client's optional last key.
    pub fn key_if(self, present: bool, k: impl AsRef<[u8]>) -> Call {
        if present {
            self.key(k)
        } else {
            self
        }
    }

    pub fn arg(mut self, a: impl AsRef<[u8]>) -> Call {
        self.args.push(a.as_ref().to_vec());
        self
    }

    pub fn shape(mut self, shape: Shape) -> Call {
        self.shape = shape;
        self
    }

    fn describe(&self) -> String {
        let list = |v: &[Vec<u8>]| v.iter().map(|b| show(b)).collect::<Vec<_>>().join(" ");
        format!(
            "{} KEYS[{}] ARGV[{}]",
            self.script,
            list(&self.keys),
            list(&self.args)
        )
    }
}

/// What one step of a sequence does.
#[derive(Clone, Debug)]
pub enum Step {
    Call(Call),
    /// Lets model and server time pass.
    Sleep(u64),
    /// Flips whether subscriber `conn` listens on the channel (sharded or not).
    Toggle {
        conn: usize,
        channel: Vec<u8>,
        sharded: bool,
    },
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub steps: usize,
    pub calls: usize,
    /// Steps that ran longer than the guard: not compared, the store reloaded.
    pub slow: usize,
    pub slept_ms: u64,
}

pub struct Twin {
    /// Kept for its process, which ends when it drops.
    _server: RedisServer,
    conn: redis::Connection,
    pub store: Store,
    subs: Vec<Subscriber>,
    pub stats: Stats,
    /// The server's state after the last step, and when it was read.
    last: (State, i64),
    history: Vec<String>,
}

impl Twin {
    pub fn start(subscribers: usize) -> Twin {
        let server = RedisServer::start();
        let conn = server.conn();
        let subs = (0..subscribers)
            .map(|_| Subscriber::connect(server.port))
            .collect();
        Twin {
            _server: server,
            conn,
            store: Store::default(),
            subs,
            stats: Stats::default(),
            last: (State::new(), 0),
            history: Vec::new(),
        }
    }

    /// Runs one step on both sides; a call's reply (the server's).
    pub fn step(&mut self, step: &Step) -> Option<Reply> {
        self.stats.steps += 1;
        match step {
            Step::Call(c) => return Some(self.call(c)),
            Step::Sleep(ms) => {
                self.history.push(format!("sleep {ms} ms"));
                std::thread::sleep(Duration::from_millis(*ms));
                self.stats.slept_ms += ms;
            }
            Step::Toggle {
                conn,
                channel,
                sharded,
            } => self.toggle(*conn, channel, *sharded),
        }
        None
    }

    /// The server's clock, in ms.
    fn server_ms(&mut self) -> i64 {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut self.conn).unwrap();
        secs * 1000 + micros / 1000
    }

    /// Waits until no expiry or deadline of either side lies within the guard of now,
    /// then sets the store's clock to the server's.
    fn settle(&mut self) -> i64 {
        let mut times = marks(&self.last.0, self.last.1);
        times.extend(marks(
            &compare::store_state(&self.store),
            self.store.now_ms as i64,
        ));
        loop {
            let now = self.server_ms();
            let near = times
                .iter()
                .filter(|t| (now - 5..=now + GUARD_MS).contains(*t));
            match near.max() {
                Some(t) => {
                    let wait = (t - now + 6) as u64;
                    std::thread::sleep(Duration::from_millis(wait));
                    self.stats.slept_ms += wait;
                }
                None => {
                    self.store.now_ms = now as u64;
                    return now;
                }
            }
        }
    }

    /// Runs `c` on both sides and compares; panics with the difference.
    pub fn call(&mut self, c: &Call) -> Reply {
        self.history.push(c.describe());
        let before = self.settle();
        let server = self.eval(c);
        let store = script::run(&mut self.store, c.source, &c.keys, &c.args)
            .unwrap_or_else(|why| self.fail(c, &format!("the store left its model: {why}")));
        let now = self.server_ms();
        let state = self.server_state();
        // The state's PTTLs are read after `now`: a pause there counts too.
        let read = self.server_ms();
        let heard: Vec<Vec<Heard>> = self.subs.iter_mut().map(|s| s.drain()).collect();
        let sent = self.store.drain_outbox();
        self.stats.calls += 1;
        if read - before > GUARD_MS - 10 {
            // Too slow (by the server's clock, so a pause of this process between the
            // two readings counts too) to tell which side of an expiry each clock fell:
            // not compared.
            self.stats.slow += 1;
            self.reload(&state, now);
        } else {
            self.compare(c, &server, &store, &state, &heard, &sent);
        }
        self.last = (state, now);
        server
    }

    fn compare(
        &self,
        c: &Call,
        server: &Reply,
        store: &Reply,
        state: &State,
        heard: &[Vec<Heard>],
        sent: &[crate::checker::store::Message],
    ) {
        if !close_reply(server, store, c.shape) {
            self.fail(
                c,
                &format!("replies differ: server {server:?}, store {store:?}"),
            );
        }
        let diff = compare::state_diff(state, &compare::store_state(&self.store));
        if !diff.is_empty() {
            self.fail(
                c,
                &format!("states differ (reply {server:?}):\n  {}", diff.join("\n  ")),
            );
        }
        for (sub, heard) in self.subs.iter().zip(heard) {
            let want: Vec<Heard> = sent
                .iter()
                .filter(|m| sub.channels.contains(&(m.channel.clone(), m.sharded)))
                .map(|m| (m.channel.clone(), m.payload.clone(), m.sharded))
                .collect();
            if *heard != want {
                self.fail(
                    c,
                    &format!("messages differ: heard {heard:?}, the store sent {want:?}"),
                );
            }
        }
    }

    fn fail(&self, c: &Call, what: &str) -> ! {
        let recent = self.history.iter().rev().take(12).rev().cloned();
        panic!(
            "step {} ({}): {what}\nrecent steps:\n  {}",
            self.stats.steps,
            c.describe(),
            recent.collect::<Vec<_>>().join("\n  ")
        )
    }

    fn eval(&mut self, c: &Call) -> Reply {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(c.source).arg(c.keys.len());
        for k in &c.keys {
            cmd.arg(&k[..]);
        }
        for a in &c.args {
            cmd.arg(&a[..]);
        }
        match cmd.query::<redis::Value>(&mut self.conn) {
            Ok(v) => reply(v),
            Err(e) => Reply::Error(format!(
                "{} {}",
                e.code().unwrap_or("?"),
                e.detail().unwrap_or("")
            )),
        }
    }

    /// Every key on the server, with its value and PTTL.
    pub fn server_state(&mut self) -> State {
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut self.conn).unwrap();
        let mut state = State::new();
        for k in keys {
            let (kind, pttl): (String, i64) = redis::pipe()
                .cmd("TYPE")
                .arg(&k[..])
                .cmd("PTTL")
                .arg(&k[..])
                .query(&mut self.conn)
                .unwrap();
            if let Some(value) = self.read_value(&k, &kind) {
                state.insert(k, Snap { value, pttl });
            }
        }
        state
    }

    fn read_value(&mut self, k: &[u8], kind: &str) -> Option<compare::Norm> {
        use compare::Norm;
        let c = &mut self.conn;
        Some(match kind {
            "string" => Norm::Str(redis::cmd("GET").arg(k).query(c).unwrap()),
            "hash" => Norm::Hash(redis::cmd("HGETALL").arg(k).query(c).unwrap()),
            "list" => Norm::List(redis::cmd("LRANGE").arg(k).arg(0).arg(-1).query(c).unwrap()),
            "zset" => Norm::ZSet(
                redis::cmd("ZRANGE")
                    .arg(k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(c)
                    .unwrap(),
            ),
            "none" => return None,
            other => panic!("a key of type {other} on the server"),
        })
    }

    /// Makes the store hold what the server holds (read at `now`).
    fn reload(&mut self, state: &State, now: i64) {
        let mut fresh = Store::new(now as u64);
        fresh.subscribers = std::mem::take(&mut self.store.subscribers);
        fresh.shard_subscribers = std::mem::take(&mut self.store.shard_subscribers);
        for (k, snap) in state {
            fresh.put(k, compare::denorm(&snap.value));
            if snap.pttl >= 0 {
                fresh.entry_mut(k).unwrap().expires_at = Some((now + snap.pttl) as u64);
            }
        }
        self.store = fresh;
    }

    fn toggle(&mut self, conn: usize, channel: &[u8], sharded: bool) {
        let sub = &mut self.subs[conn];
        let on = !sub.channels.contains(&(channel.to_vec(), sharded));
        let verb = if on { "subscribe" } else { "unsubscribe" };
        let kind = if sharded { "sharded " } else { "" };
        self.history
            .push(format!("subscriber {conn}: {verb} {kind}{}", show(channel)));
        sub.set(channel, sharded, on);
        let map = if sharded {
            &mut self.store.shard_subscribers
        } else {
            &mut self.store.subscribers
        };
        let n = map.entry(channel.to_vec()).or_insert(0);
        *n = if on { *n + 1 } else { *n - 1 };
        if *n == 0 {
            map.remove(channel);
        }
    }
}

/// A server reply as the store gives it.
fn reply(v: redis::Value) -> Reply {
    match v {
        redis::Value::Nil => Reply::Nil,
        redis::Value::Int(n) => Reply::Int(n),
        redis::Value::BulkString(b) => Reply::Bulk(b),
        redis::Value::SimpleString(s) => Reply::Status(s),
        redis::Value::Okay => Reply::Status("OK".into()),
        redis::Value::Array(items) => Reply::Array(items.into_iter().map(reply).collect()),
        redis::Value::ServerError(e) => {
            Reply::Error(format!("{} {}", e.code(), e.details().unwrap_or("")))
        }
        other => panic!("a RESP3 reply from a RESP2 connection: {other:?}"),
    }
}
