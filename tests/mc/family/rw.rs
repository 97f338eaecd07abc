//! The read-write lock (`RReadWriteLock`): readers and writers of this crate and of
//! Redisson on one lock, on a model clock, under the crate's marks and turns.
//!
//! A crate actor sends `read_acquire.lua` / `write_acquire.lua` as a waiting call does
//! (`src/wire/raw/rw.rs`: the wait flag on, the mark's length `MARK`), and while it waits asks
//! again within the client's own bound, `policy::wait::sleep_bound` asked with the
//! model's mark (half of it, `MARK / 2` ms); the clock does not pass that. It releases with `read_unlock.lua` /
//! `write_unlock.lua` (the readers' turn `TURN` ms). A Redisson actor runs Redisson's
//! four scripts and asks again whenever it likes (a message or its PTTL bound). Holds
//! are released by their holder at any time; leases outlast the clock, so no hold ends
//! by itself. Retries of lost replies are the plain lock's (`tests/model_check.rs`) and
//! left out here.

use std::collections::BTreeSet;
use std::time::Duration;

use redis_rlock::policy::wait::{sleep_bound, Waits};
use redis_rlock::protocol::{read_turn_key, reader_key, rw_channel_name, writer_key};

use super::{int, run, Fixed, Texts, World, EPOCH};
use crate::checker::store::{Reply, Store, Value};

pub use super::semaphore::Kind;

pub const NAME: &str = "rw";
const LEASE: &str = "1000";
const LATCH_TTL: &str = "1000";
/// The writer's and reader's marks (ms); a waiter asks again within half.
pub const MARK: u64 = 4;
/// The readers' turn at most (ms).
pub const TURN: u64 = 2;

pub const EXCLUDES: &str = "a writer excludes everyone";
pub const SHARE: &str = "readers share";
/// A waiting writer is passed by at most `Config::bypass.0` grants to readers outside
/// the readers' turn.
pub const WRITER_BYPASS: &str = "bounded bypass of a waiting writer";
/// A waiting reader is passed by at most `Config::bypass.1` grants to writers.
pub const READER_BYPASS: &str = "bounded bypass of a waiting reader";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Role {
    Read,
    Write,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Refused; asked last at this time. `rank`: its place among the waiters by when
    /// they began waiting (0 first), kept dense.
    Waiting {
        at: u64,
        rank: u8,
    },
    Holds,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Actor {
    kind: Kind,
    role: Role,
    rounds: u8,
    phase: Phase,
    /// Grants to the other role since it began waiting, outside the readers' turn.
    passed: u8,
    /// An unlock's message reached it while it waited: it asks again before the clock
    /// moves (a message takes well under the model's 1 ms).
    woken: bool,
    requests: u8,
}

pub struct Config {
    /// (kind, role, rounds)
    pub actors: Vec<(Kind, Role, u8)>,
    pub time_bound: u64,
    /// Bounded bypass: a waiting writer, and a waiting reader, is passed by at most
    /// this many grants to the other role (made to one that began waiting after it,
    /// or did not wait; readers' grants in the readers' turn are not counted).
    pub bypass: (u8, u8),
    pub texts: Texts,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Rw {
    store: Store,
    actors: Vec<Actor>,
    /// Properties judged on a step, once broken.
    broken: BTreeSet<&'static str>,
    cfg: Fixed<Config>,
}

pub fn texts() -> Texts {
    Texts::of(&[
        "read_acquire.lua",
        "write_acquire.lua",
        "read_unlock.lua",
        "write_unlock.lua",
    ])
}

/// Actor i's holder field: a crate's `<uuid>:<owner>` or Redisson's `<uuid>:<thread>`.
fn field(i: usize, kind: Kind) -> String {
    let uuid = match kind {
        Kind::Crate => "00000000-0000-4000-8000",
        Kind::Redisson => "5f0c1d2e-3a4b-4c5d-8e6f",
    };
    format!("{uuid}-{i:012}:1")
}

fn timeout_prefix(field: &str) -> String {
    format!("{{{NAME}}}:{field}:rwlock_timeout")
}

impl Rw {
    pub fn new(cfg: Config) -> Rw {
        let actors = (cfg.actors.iter())
            .map(|&(kind, role, rounds)| Actor {
                kind,
                role,
                rounds,
                phase: Phase::Idle,
                passed: 0,
                woken: false,
                requests: 0,
            })
            .collect();
        Rw {
            store: Store::new(EPOCH),
            actors,
            broken: BTreeSet::new(),
            cfg: Fixed(cfg.into()),
        }
    }

    fn now(&self) -> u64 {
        self.store.now_ms
    }

    fn mode(&self) -> Option<Vec<u8>> {
        match self.store.entry(NAME.as_bytes()).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.get(b"mode".as_slice()).cloned(),
            _ => None,
        }
    }

    /// Some waiter's mark in the sorted set `key` has not ended (its score, the time it
    /// ends, is later than now), as `read_acquire.lua` asks.
    fn live(&self, key: &str) -> bool {
        let now = self.now() as f64;
        match self.store.entry(key.as_bytes()).map(|e| &e.value) {
            Some(Value::ZSet(z)) => z.iter().any(|(_, s)| s.0 > now),
            _ => false,
        }
    }

    /// The readers' turn is on: its key exists (`read_acquire.lua` asks `EXISTS`, which
    /// still sees a key at PTTL 0); it goes when the last reader it names is granted.
    fn turn(&self) -> bool {
        self.store.entry(read_turn_key(NAME).as_bytes()).is_some()
    }

    fn acquire(&mut self, i: usize) -> bool {
        let a = &self.actors[i];
        let f = field(i, a.kind);
        let latch = format!("redisson_unlock_latch:{{{NAME}}}:acq-a{i}n{}", a.requests);
        let mark = MARK.to_string();
        let name = match (a.kind, a.role) {
            (Kind::Crate, Role::Read) => "read_acquire.lua",
            (Kind::Crate, Role::Write) => "write_acquire.lua",
            (Kind::Redisson, Role::Read) => "redisson:read_acquire",
            (Kind::Redisson, Role::Write) => "redisson:write_acquire",
        };
        let src = self.cfg.texts.get(name).clone();
        let (wf, tp) = (format!("{f}:write"), timeout_prefix(&f));
        let reply = match (a.kind, a.role) {
            (Kind::Crate, Role::Read) => {
                let keys = [
                    NAME.into(),
                    tp,
                    latch,
                    writer_key(NAME),
                    reader_key(NAME),
                    read_turn_key(NAME),
                ];
                run(
                    &mut self.store,
                    &src,
                    &keys,
                    &[LEASE, &f, LATCH_TTL, "1", "0", "1", &mark],
                )
                .0
            }
            (Kind::Crate, Role::Write) => {
                let keys = [NAME.into(), latch, writer_key(NAME), read_turn_key(NAME)];
                run(
                    &mut self.store,
                    &src,
                    &keys,
                    &[LEASE, &wf, LATCH_TTL, "1", "0", "1", &mark],
                )
                .0
            }
            (Kind::Redisson, Role::Read) => {
                run(&mut self.store, &src, &[NAME.into(), tp], &[LEASE, &f, &wf]).0
            }
            (Kind::Redisson, Role::Write) => run(&mut self.store, &src, &[NAME], &[LEASE, &wf]).0,
        };
        match a.kind {
            Kind::Crate => int(&reply) == 1,
            Kind::Redisson => reply == Reply::Nil,
        }
    }

    /// Actor i's unlock; wakes the waiters its message reaches.
    fn release(&mut self, i: usize) {
        let a = &self.actors[i];
        let f = field(i, a.kind);
        let (wf, tp, channel) = (
            format!("{f}:write"),
            timeout_prefix(&f),
            rw_channel_name(NAME),
        );
        let latch = format!("redisson_unlock_latch:{{{NAME}}}:a{i}n{}", a.requests);
        let texts = &self.cfg.texts;
        let (reply, sent) = match (a.kind, a.role) {
            (Kind::Crate, Role::Read) => {
                let src = texts.get("read_unlock.lua").clone();
                let keys = [NAME.into(), channel, latch, tp, format!("{{{NAME}}}")];
                run(
                    &mut self.store,
                    &src,
                    &keys,
                    &["0", &f, LATCH_TTL, "publish", "1", "0"],
                )
            }
            (Kind::Crate, Role::Write) => {
                let src = texts.get("write_unlock.lua").clone();
                let keys = [
                    NAME.into(),
                    channel,
                    latch,
                    reader_key(NAME),
                    read_turn_key(NAME),
                ];
                let turn = TURN.to_string();
                let args = ["1", "0", &wf, LATCH_TTL, "publish", "1", "0", &turn];
                run(&mut self.store, &src, &keys, &args)
            }
            (Kind::Redisson, Role::Read) => {
                let src = texts.get("redisson:read_unlock").clone();
                let keys = [NAME.into(), channel, tp, format!("{{{NAME}}}")];
                run(&mut self.store, &src, &keys, &["0", &f])
            }
            (Kind::Redisson, Role::Write) => {
                let src = texts.get("redisson:write_unlock").clone();
                run(
                    &mut self.store,
                    &src,
                    &[NAME.into(), channel],
                    &["1", LEASE, &wf],
                )
            }
        };
        assert_ne!(
            reply,
            Reply::Nil,
            "actor {i} released a hold it does not have"
        );
        if !sent.is_empty() {
            for a in self
                .actors
                .iter_mut()
                .filter(|a| matches!(a.phase, Phase::Waiting { .. }))
            {
                a.woken = true;
            }
        }
    }

    /// Whether a refusal of reader i is one the lock may give: a writer holds, or (to a
    /// reader of this crate) a crate writer's mark holds it back outside the readers'
    /// turn.
    fn may_refuse_reader(&self, i: usize) -> bool {
        let write = self.mode().as_deref() == Some(b"write".as_slice());
        let marked = self.live(&writer_key(NAME)) && !self.turn();
        write || (self.actors[i].kind == Kind::Crate && marked)
    }
}

fn rank(p: Phase) -> Option<u8> {
    match p {
        Phase::Waiting { rank, .. } => Some(rank),
        _ => None,
    }
}

impl Rw {
    /// The waiters' ranks made dense again (0..n in the same order), so that states
    /// that differ only by who left the line are one.
    fn rerank(&mut self) {
        let mut ranks: Vec<u8> = self.actors.iter().filter_map(|a| rank(a.phase)).collect();
        ranks.sort_unstable();
        for a in &mut self.actors {
            if let Phase::Waiting { rank, .. } = &mut a.phase {
                *rank = ranks.iter().position(|r| r == rank).unwrap() as u8;
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Act {
    Tick,
    Step(usize),
}

impl World for Rw {
    type Action = Act;

    fn actions(&self) -> Vec<Act> {
        let now = self.now();
        // A crate waiter asks again within half its mark (the client's own cadence,
        // `policy::wait`, at the model's mark): time waits for it.
        let mark = Waits::ReadWrite {
            mark: Duration::from_millis(MARK),
        };
        let cadence = sleep_bound(mark, None, Duration::MAX).as_millis() as u64;
        let due = (self.actors.iter()).any(|a| {
            let due = matches!(a.phase, Phase::Waiting { at, .. } if now + 1 - at > cadence);
            a.kind == Kind::Crate && (due || a.woken)
        });
        let mut out = Vec::new();
        if now < EPOCH + self.cfg.time_bound && !due {
            out.push(Act::Tick);
        }
        out.extend(
            (0..self.actors.len())
                .filter(|i| self.actors[*i].rounds > 0)
                .map(Act::Step),
        );
        out
    }

    fn apply(&mut self, a: Act) -> String {
        let i = match a {
            Act::Tick => return super::tick(&mut self.store),
            Act::Step(i) => i,
        };
        let (kind, role) = (self.actors[i].kind, self.actors[i].role);
        let who = format!(
            "{kind:?} {} {i}",
            if role == Role::Read {
                "reader"
            } else {
                "writer"
            }
        );
        if self.actors[i].phase == Phase::Holds {
            self.release(i);
            let a = &mut self.actors[i];
            (a.phase, a.rounds, a.requests) = (Phase::Idle, a.rounds - 1, a.requests + 1);
            return format!("{who} unlocks");
        }
        let may_refuse = role == Role::Write || self.may_refuse_reader(i);
        let turn = self.turn();
        let now = self.now();
        self.actors[i].woken = false;
        let before = self.actors[i].phase;
        if self.acquire(i) {
            let a = &mut self.actors[i];
            (a.phase, a.requests, a.passed) = (Phase::Holds, a.requests + 1, 0);
            // Readers that come during the readers' turn pass a waiting writer: the
            // turn bounds them in time (TURN), not in number. A waiter is passed only by
            // one that began waiting after it, or did not wait.
            let counted = !(role == Role::Read && turn);
            let mine = rank(before);
            for other in self.actors.iter_mut().filter(|o| o.role != role) {
                if counted && matches!(rank(other.phase), Some(r) if mine.is_none_or(|m| m > r)) {
                    other.passed += 1;
                }
            }
            self.rerank();
            return format!(
                "{who} is granted{}",
                if turn { " (readers' turn)" } else { "" }
            );
        }
        if !may_refuse {
            self.broken.insert(SHARE);
        }
        // A refused waiter keeps its place; it began waiting at its first refusal.
        let last = self.actors.iter().filter_map(|a| rank(a.phase)).max();
        let rank = rank(before).unwrap_or_else(|| last.map_or(0, |r| r + 1));
        self.actors[i].phase = Phase::Waiting { at: now, rank };
        format!("{who} is refused")
    }

    fn violations(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = self.broken.iter().copied().collect();
        let holds = |r: Role| {
            (self.actors.iter())
                .filter(|a| a.phase == Phase::Holds && a.role == r)
                .count()
        };
        let writers = holds(Role::Write);
        if writers > 1 || (writers == 1 && holds(Role::Read) > 0) {
            out.push(EXCLUDES);
        }
        let over = |r: Role, n: u8| self.actors.iter().any(|a| a.role == r && a.passed > n);
        if over(Role::Write, self.cfg.bypass.0) {
            out.push(WRITER_BYPASS);
        }
        if over(Role::Read, self.cfg.bypass.1) {
            out.push(READER_BYPASS);
        }
        out
    }

    super::store_in_field!();
}
