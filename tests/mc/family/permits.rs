//! The permit-expirable semaphore (`RPermitExpirableSemaphore`): takers of this crate
//! and of Redisson, each permit under an id of its own with a lease, on a model clock.
//!
//! A crate taker sends `permit_acquire.lua` with a fresh id; when the reply is lost it
//! gives that id back with `permit_release.lua` before it tries again under a new one,
//! as `PermitExpirableSemaphore::try_once` does (`src/api/permits.rs`). It believes it holds
//! the permit until the send's time plus the lease, then releases it, or lets the lease
//! end (a dropped `Permit` releases nothing). A Redisson taker runs Redisson's scripts
//! with its own clock (the model's). A refused try under the same id is the same state
//! (its id never entered the set), so an id is new only after a grant or a lost reply.

use super::{count, int, run, Fixed, Texts, World, EPOCH};
use crate::checker::store::{Store, Value};

pub use super::semaphore::{Kind, EXCEED, ONCE};

pub const SEM: &str = "p";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Phase {
    Idle,
    /// The acquire's reply was lost: give its id back.
    GiveBack,
    /// Holds its id until this time (the send's time plus the lease).
    Holds(u64),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Taker {
    kind: Kind,
    rounds: u8,
    phase: Phase,
    /// Ids used so far: the current one is the next.
    ids: u8,
}

pub struct Config {
    pub permits: i64,
    /// (kind, rounds)
    pub takers: Vec<(Kind, u8)>,
    pub lease: u64,
    pub time_bound: u64,
    pub lost_replies: u8,
    pub texts: Texts,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Permits {
    store: Store,
    takers: Vec<Taker>,
    lost_replies: u8,
    cfg: Fixed<Config>,
}

pub fn texts() -> Texts {
    Texts::of(&[
        "permit_acquire.lua",
        "permit_release.lua",
        "semaphore_set.lua",
    ])
}

/// Taker i's id number n: 16 bytes, as the crate's and Redisson's ids are.
fn id(i: usize, n: u8) -> String {
    format!("{:<16}", format!("t{i}n{n}"))
}

fn keys() -> [String; 3] {
    let timeout = redis_rlock::protocol::permit_timeout_key(SEM);
    [
        SEM.into(),
        timeout,
        redis_rlock::protocol::semaphore_channel(SEM),
    ]
}

impl Permits {
    pub fn new(cfg: Config) -> Permits {
        let mut store = Store::new(EPOCH);
        let [sem, _, channel] = keys();
        let set = cfg.texts.get("semaphore_set.lua").clone();
        run(
            &mut store,
            &set,
            &[&sem, &channel],
            &[cfg.permits.to_string().as_str(), "publish"],
        );
        let takers = (cfg.takers.iter())
            .map(|&(kind, rounds)| Taker {
                kind,
                rounds,
                phase: Phase::Idle,
                ids: 0,
            })
            .collect();
        Permits {
            store,
            takers,
            lost_replies: cfg.lost_replies,
            cfg: Fixed(cfg.into()),
        }
    }

    fn now(&self) -> u64 {
        self.store.now_ms
    }

    /// The set's ids and their lease ends.
    fn leases(&self) -> Vec<(String, u64)> {
        match self.store.entry(keys()[1].as_bytes()).map(|e| &e.value) {
            Some(Value::ZSet(z)) => (z.iter())
                .map(|(id, s)| (String::from_utf8_lossy(id).into_owned(), s.0 as u64))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn acquire(&mut self, i: usize) -> bool {
        let t = &self.takers[i];
        let (lease, id) = (self.cfg.lease.to_string(), id(i, t.ids));
        let reply = match t.kind {
            Kind::Crate => {
                let src = self.cfg.texts.get("permit_acquire.lua").clone();
                run(
                    &mut self.store,
                    &src,
                    &keys(),
                    &["1", &lease, "publish", &id],
                )
                .0
            }
            Kind::Redisson => {
                let src = self.cfg.texts.get("redisson:permit_acquire").clone();
                let (ends, now) = (
                    (self.now() + self.cfg.lease).to_string(),
                    self.now().to_string(),
                );
                run(&mut self.store, &src, &keys(), &["1", &ends, &now, &id]).0
            }
        };
        int(&reply) == 1
    }

    fn release(&mut self, i: usize) -> i64 {
        let t = &self.takers[i];
        let id = id(i, t.ids);
        let reply = match t.kind {
            Kind::Crate => {
                let src = self.cfg.texts.get("permit_release.lua").clone();
                run(&mut self.store, &src, &keys(), &["publish", &id]).0
            }
            Kind::Redisson => {
                let (src, now) = (
                    self.cfg.texts.get("redisson:permit_release").clone(),
                    self.now(),
                );
                run(&mut self.store, &src, &keys(), &[id, now.to_string()]).0
            }
        };
        int(&reply)
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Act {
    Tick,
    /// Taker i's next step; `lost`: its reply never comes (the script ran).
    Step(usize, bool),
    /// Taker i lets its ended lease be (releases nothing).
    Drop(usize),
}

impl World for Permits {
    type Action = Act;

    fn actions(&self) -> Vec<Act> {
        let mut out = Vec::new();
        if self.now() < EPOCH + self.cfg.time_bound {
            out.push(Act::Tick);
        }
        for (i, t) in self.takers.iter().enumerate() {
            if t.rounds == 0 {
                continue;
            }
            out.push(Act::Step(i, false));
            if self.lost_replies > 0 && t.kind == Kind::Crate && t.phase == Phase::Idle {
                out.push(Act::Step(i, true));
            }
            if matches!(t.phase, Phase::Holds(until) if until <= self.now()) {
                out.push(Act::Drop(i));
            }
        }
        out
    }

    fn apply(&mut self, a: Act) -> String {
        let (i, lost) = match a {
            Act::Tick => return super::tick(&mut self.store),
            Act::Drop(i) => {
                let t = &mut self.takers[i];
                (t.phase, t.rounds, t.ids) = (Phase::Idle, t.rounds - 1, t.ids + 1);
                return format!("taker {i} lets its ended lease be");
            }
            Act::Step(i, lost) => (i, lost),
        };
        let who = format!(
            "{:?} taker {i} (id {})",
            self.takers[i].kind,
            id(i, self.takers[i].ids).trim_end()
        );
        match self.takers[i].phase {
            Phase::Holds(_) => {
                let live = self.release(i);
                let t = &mut self.takers[i];
                (t.phase, t.rounds, t.ids) = (Phase::Idle, t.rounds - 1, t.ids + 1);
                format!("{who} releases: held live {live}")
            }
            Phase::GiveBack => {
                let live = self.release(i);
                let t = &mut self.takers[i];
                (t.phase, t.ids) = (Phase::Idle, t.ids + 1);
                format!("{who} gives back the lost reply's id: held live {live}")
            }
            Phase::Idle => {
                let (now, taken) = (self.now(), self.acquire(i));
                let t = &mut self.takers[i];
                if lost {
                    self.lost_replies -= 1;
                    t.phase = Phase::GiveBack;
                    return format!("{who} acquires: taken {taken}, reply lost");
                }
                if taken {
                    t.phase = Phase::Holds(now + self.cfg.lease);
                }
                format!("{who} acquires: taken {taken}")
            }
        }
    }

    fn violations(&self) -> Vec<&'static str> {
        let now = self.now();
        let believed: Vec<String> = (self.takers.iter().enumerate())
            .filter(|(_, t)| matches!(t.phase, Phase::Holds(until) if now < until))
            .map(|(i, t)| id(i, t.ids))
            .collect();
        let leases = self.leases();
        let (available, permits) = (count(&self.store, SEM), self.cfg.permits);
        let mut out = Vec::new();
        if believed.len() as i64 > permits || available + leases.len() as i64 > permits {
            out.push(EXCEED);
        }
        // Once every lost reply's id is given back, each permit is available or in the
        // set, and every live lease in the set is one its taker believes it holds.
        let giving_back = self.takers.iter().any(|t| t.phase == Phase::GiveBack);
        let orphan = (leases.iter()).any(|(id, ends)| *ends > now && !believed.contains(id));
        if !giving_back && (available + leases.len() as i64 != permits || orphan) {
            out.push(ONCE);
        }
        out
    }

    super::store_in_field!();
}
