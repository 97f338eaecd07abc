//! The fair lock (`RFairLock`): waiters of this crate and of Redisson in one queue, on a
//! model clock with a wait timeout W of a few model ms.
//!
//! A crate waiter sends `fair_acquire.lua` as a waiting call does (`src/shell/attempt.rs`:
//! fresh, waits), and while it waits asks again within the client's own bound,
//! `policy::wait::sleep_bound` asked with the model's W (min(W, 5 s)/3, so W/3 ms): the
//! clock does not pass that. It
//! may give up, and then leaves with `fair_leave.lua` (`src/shell/acquire/line.rs`), or crash: it then
//! neither asks again nor leaves. It releases with `fair_unlock.lua`. A Redisson waiter
//! runs Redisson's acquire and unlock (`peer.rs`, shared with
//! `tests/common/redisson_fair.rs`) with the model's clock as its own, and asks again
//! whenever it likes (a message, or the wait it was told): messages only make a waiter
//! ask sooner, and every ask is already offered, so they are left out. A hold ends before
//! its lease (the clock does not pass it while held): leases ending and the watchdog are
//! the plain lock's, not modelled here.
//!
//! The model keeps its own line: who joined the queue, in the order they did. A Redisson
//! waiter that Redisson's arithmetic drops (its deadline as Redisson's scripts alone
//! would have set it, tracked beside the store's) leaves that line, and joins at the
//! back when it asks again, as under Redisson; any other waiter dropped keeps its place
//! in the line, and breaks "no live waiter purged".

use std::collections::BTreeSet;
use std::time::Duration;

use redis_rlock::policy::wait::{sleep_bound, Waits};
use redis_rlock::protocol::{channel_name, queue_key, timeout_key, FORCE_UNLOCK_EVENT};

use super::{int, run, Fixed, Texts, World, EPOCH};
use crate::checker::store::{Reply, Store, Value};

pub use super::semaphore::Kind;

pub const NAME: &str = "f";
const LATCH_TTL: &str = "1000";

/// At most one actor holds the lock (by what each was told).
pub const EXCLUDES: &str = "one holder at a time";
/// A grant goes to nobody who joined the line after a live waiter still in it (nor to
/// one who never joined while such a waiter waits).
pub const FIFO: &str = "grants in queue order among live waiters";
/// A crate waiter that keeps its cadence is never dropped from the queue; a Redisson
/// waiter only once the deadline Redisson's own arithmetic gives it has passed.
pub const NO_PURGE: &str = "no live waiter purged";
/// Once every actor is done or crashed, the queue and the timeout set hold only crashed
/// waiters (so both keys are gone when nobody crashed).
pub const EMPTY: &str = "queue and timeout set gone once everyone has left";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Refused; asked last at this time (model ms).
    Waiting(u64),
    /// Holds since this time.
    Holds(u64),
    Crashed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Actor {
    kind: Kind,
    rounds: u8,
    phase: Phase,
    /// The deadline Redisson's arithmetic gives it while in the line (model ms).
    redisson_deadline: Option<i64>,
}

pub struct Config {
    /// (kind, rounds)
    pub actors: Vec<(Kind, u8)>,
    /// W, the wait timeout (model ms; a multiple of 3).
    pub wait: u64,
    pub lease: u64,
    pub time_bound: u64,
    /// How many crate waiters may crash, and give up.
    pub crashes: u8,
    pub give_ups: u8,
    pub texts: Texts,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Fair {
    store: Store,
    actors: Vec<Actor>,
    /// Actor indices in the order they joined the queue.
    line: Vec<usize>,
    crashes: u8,
    give_ups: u8,
    /// Properties judged on a step, once broken.
    broken: BTreeSet<&'static str>,
    cfg: Fixed<Config>,
}

pub fn texts() -> Texts {
    Texts::of(&["fair_acquire.lua", "fair_unlock.lua", "fair_leave.lua"])
}

/// Actor i's holder field: a crate's `<uuid>:<owner>` or Redisson's `<uuid>:<thread>`.
fn field(i: usize, kind: Kind) -> String {
    let uuid = match kind {
        Kind::Crate => "00000000-0000-4000-8000",
        Kind::Redisson => "11111111-2222-4333-8444",
    };
    format!("{uuid}-{i:012}:1")
}

fn keys() -> [String; 3] {
    [NAME.into(), queue_key(NAME), timeout_key(NAME)]
}

impl Fair {
    pub fn new(cfg: Config) -> Fair {
        assert!(cfg.wait.is_multiple_of(3) && cfg.wait > 0);
        let actors = (cfg.actors.iter())
            .map(|&(kind, rounds)| Actor {
                kind,
                rounds,
                phase: Phase::Idle,
                redisson_deadline: None,
            })
            .collect();
        Fair {
            store: Store::new(EPOCH),
            actors,
            line: Vec::new(),
            crashes: cfg.crashes,
            give_ups: cfg.give_ups,
            broken: BTreeSet::new(),
            cfg: Fixed(cfg.into()),
        }
    }

    /// Model time (ms since the start).
    fn now(&self) -> u64 {
        self.store.now_ms - EPOCH
    }

    fn field(&self, i: usize) -> String {
        field(i, self.actors[i].kind)
    }

    /// The store's queue, as actor indices.
    fn queue(&self) -> Vec<usize> {
        let Some(Value::List(l)) = self.store.entry(keys()[1].as_bytes()).map(|e| &e.value) else {
            return Vec::new();
        };
        (l.iter())
            .map(|f| {
                (0..self.actors.len())
                    .find(|&i| self.field(i).as_bytes() == f.as_slice())
                    .expect("a field of an actor")
            })
            .collect()
    }

    /// Whether every member of the timeout set is a crashed waiter's.
    fn only_crashed_deadlines(&self) -> bool {
        let crashed = |m: &Vec<u8>| {
            (0..self.actors.len()).any(|i| {
                self.actors[i].phase == Phase::Crashed && self.field(i).as_bytes() == m.as_slice()
            })
        };
        match self.store.entry(keys()[2].as_bytes()).map(|e| &e.value) {
            Some(Value::ZSet(z)) => z.keys().all(crashed),
            _ => true,
        }
    }

    fn live(&self, i: usize) -> bool {
        matches!(self.actors[i].phase, Phase::Waiting(_))
    }

    fn script(&mut self, name: &str, keys: &[String], args: &[String]) -> Reply {
        let src = self.cfg.texts.get(name).clone();
        run(&mut self.store, &src, keys, args).0
    }

    /// Actor i's attempt; true when granted.
    fn acquire(&mut self, i: usize) -> bool {
        let (f, lease, wait) = (
            self.field(i),
            self.cfg.lease.to_string(),
            self.cfg.wait.to_string(),
        );
        match self.actors[i].kind {
            Kind::Crate => {
                let mut k = keys().to_vec();
                k.push(format!("redisson_unlock_latch:{{{NAME}}}:acq-a{i}"));
                let args = [&lease, &f, &wait, LATCH_TTL, "1", "0", "1"].map(String::from);
                int(&self.script("fair_acquire.lua", &k, &args)) == 1
            }
            Kind::Redisson => {
                let now = self.store.now_ms.to_string();
                let args = [lease, f, wait, now];
                self.script("redisson:fair_acquire", &keys(), &args) == Reply::Nil
            }
        }
    }

    fn unlock(&mut self, i: usize) {
        let f = self.field(i);
        match self.actors[i].kind {
            Kind::Crate => {
                let mut k = keys().to_vec();
                k.push(format!("redisson_unlock_latch:{{{NAME}}}:a{i}"));
                let args = ["0", "0", &f, LATCH_TTL, "publish", "1", "0"];
                let mut args = args.map(String::from).to_vec();
                args.push(channel_name(NAME));
                self.script("fair_unlock.lua", &k, &args);
            }
            Kind::Redisson => {
                let mut k = keys().to_vec();
                k.push(channel_name(NAME));
                let args = ["0".into(), self.cfg.lease.to_string(), f];
                let mut args = args.to_vec();
                args.push(self.store.now_ms.to_string());
                self.script("redisson:fair_unlock", &k, &args);
            }
        }
    }

    fn leave(&mut self, i: usize) {
        let args = [
            self.field(i),
            "0".into(),
            "0".into(),
            "publish".into(),
            channel_name(NAME),
            FORCE_UNLOCK_EVENT.into(),
            self.cfg.wait.to_string(),
        ];
        self.script("fair_leave.lua", &keys(), &args);
    }

    /// Takes W off the Redisson deadline of each actor in `who`.
    fn shorten(&mut self, who: &[usize]) {
        for &b in who {
            if let Some(d) = &mut self.actors[b].redisson_deadline {
                *d -= self.cfg.wait as i64;
            }
        }
    }

    /// After a script: the line loses whoever the store's queue dropped (but `exempt`,
    /// the actor granted or leaving), each drop judged.
    fn drops(&mut self, exempt: Option<usize>) {
        let queue = self.queue();
        for b in self.line.clone() {
            if queue.contains(&b) || Some(b) == exempt {
                continue;
            }
            self.dropped(b);
        }
    }

    /// Actor b left the queue by a purge: it leaves the line if Redisson's arithmetic
    /// (or a crash) says it may; else it keeps its place, and breaks `NO_PURGE`.
    fn dropped(&mut self, b: usize) {
        let (a, now) = (&self.actors[b], self.now() as i64);
        let legit = match (a.kind, a.phase) {
            (_, Phase::Crashed) => true,
            (Kind::Redisson, _) => a.redisson_deadline.is_some_and(|d| d <= now),
            (Kind::Crate, _) => false,
        };
        if legit {
            self.out_of_line(b);
        } else {
            self.broken.insert(NO_PURGE);
        }
    }

    fn out_of_line(&mut self, b: usize) {
        self.line.retain(|&x| x != b);
        self.actors[b].redisson_deadline = None;
    }

    /// After a script: a waiter that entered the queue joins the line, with the deadline
    /// Redisson's arithmetic would give it (W after the one before it, or after the
    /// lock's PTTL).
    fn joins(&mut self) {
        let (queue, now) = (self.queue(), self.now() as i64);
        for (at, &j) in queue.iter().enumerate() {
            if self.line.contains(&j) {
                continue;
            }
            let deadline = match at.checked_sub(1).map(|p| queue[p]) {
                Some(prev) => self.actors[prev].redisson_deadline.expect("in the line"),
                None => now + self.store.pttl(NAME.as_bytes()),
            };
            self.actors[j].redisson_deadline = Some(deadline + self.cfg.wait as i64);
            self.line.push(j);
        }
    }

    /// Whether a live waiter is ahead of actor i in the line (anywhere in it, if actor i
    /// is not in it).
    fn passed_by(&self, i: usize) -> bool {
        let ahead = self.line.iter().take_while(|&&b| b != i);
        ahead.copied().any(|b| self.live(b))
    }

    fn tick_allowed(&self) -> bool {
        // The client's own cadence (`policy::wait`), at the model's wait timeout.
        let waits = Waits::Fair {
            wait_timeout: Duration::from_millis(self.cfg.wait),
        };
        let cadence = sleep_bound(waits, None, Duration::MAX).as_millis() as u64;
        let next = self.now() + 1;
        self.now() < self.cfg.time_bound
            && self.actors.iter().all(|a| match a.phase {
                Phase::Waiting(at) if a.kind == Kind::Crate => next - at <= cadence,
                Phase::Holds(since) => next < since + self.cfg.lease,
                _ => true,
            })
    }

    /// Actor i's deadline in the store (model ms).
    fn deadline(&self, i: usize) -> Option<i64> {
        match self.store.entry(keys()[2].as_bytes()).map(|e| &e.value) {
            Some(Value::ZSet(z)) => z
                .get(self.field(i).as_bytes())
                .map(|d| d.0 as i64 - EPOCH as i64),
            _ => None,
        }
    }

    /// Whether the script actor i just ran took it out of the queue and put it back at
    /// the end (it was overdue, and the purge reached it: everyone ahead of it left).
    fn rejoined(&self, i: usize, before: &[usize], overdue: bool) -> bool {
        let after = self.queue();
        let Some(at) = before.iter().position(|&b| b == i) else {
            return false;
        };
        overdue && after.contains(&i) && before[..at].iter().all(|b| !after.contains(b))
    }

    fn ask(&mut self, i: usize) -> String {
        let before = self.queue();
        let overdue = self.deadline(i).is_none_or(|d| d <= self.now() as i64);
        let granted = self.acquire(i);
        let now = self.now();
        if granted {
            self.drops(Some(i));
            if self.passed_by(i) {
                self.broken.insert(FIFO);
            }
            self.out_of_line(i);
            let others = self.line.clone();
            self.shorten(&others);
            self.actors[i].phase = Phase::Holds(now);
            return "is granted".into();
        }
        self.actors[i].phase = Phase::Waiting(now);
        let rejoined = self.rejoined(i, &before, overdue);
        self.drops(None);
        if rejoined {
            self.dropped(i);
        }
        self.joins();
        let place = self.queue().iter().position(|&b| b == i);
        format!("is refused (place {place:?})")
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Act {
    Tick,
    /// Actor i asks (first, or again).
    Ask(usize),
    Unlock(usize),
    /// A crate waiter gives up and leaves the queue.
    GiveUp(usize),
    Crash(usize),
}

impl World for Fair {
    type Action = Act;

    fn actions(&self) -> Vec<Act> {
        let mut out = Vec::new();
        if self.tick_allowed() {
            out.push(Act::Tick);
        }
        for (i, a) in self.actors.iter().enumerate() {
            match a.phase {
                Phase::Idle if a.rounds > 0 => out.push(Act::Ask(i)),
                Phase::Waiting(_) => {
                    out.push(Act::Ask(i));
                    if a.kind == Kind::Crate && self.give_ups > 0 {
                        out.push(Act::GiveUp(i));
                    }
                    if a.kind == Kind::Crate && self.crashes > 0 {
                        out.push(Act::Crash(i));
                    }
                }
                Phase::Holds(_) => out.push(Act::Unlock(i)),
                _ => {}
            }
        }
        out
    }

    fn apply(&mut self, a: Act) -> String {
        let i = match a {
            Act::Tick => return super::tick(&mut self.store),
            Act::Ask(i) | Act::Unlock(i) | Act::GiveUp(i) | Act::Crash(i) => i,
        };
        let who = format!("{:?} {i}", self.actors[i].kind);
        let what = match a {
            Act::Ask(i) => self.ask(i),
            Act::Unlock(i) => {
                self.unlock(i);
                let actor = &mut self.actors[i];
                (actor.phase, actor.rounds) = (Phase::Idle, actor.rounds - 1);
                self.drops(None);
                "unlocks".into()
            }
            Act::GiveUp(i) => {
                self.give_ups -= 1;
                let queue = self.queue();
                let behind: Vec<usize> =
                    queue.into_iter().skip_while(|&b| b != i).skip(1).collect();
                self.leave(i);
                self.shorten(&behind);
                let actor = &mut self.actors[i];
                (actor.phase, actor.rounds) = (Phase::Idle, actor.rounds - 1);
                self.drops(Some(i));
                self.out_of_line(i);
                "gives up and leaves".into()
            }
            _ => {
                self.crashes -= 1;
                self.actors[i].phase = Phase::Crashed;
                "crashes".into()
            }
        };
        format!("{who} {what}")
    }

    fn violations(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = self.broken.iter().copied().collect();
        let holders = (self.actors.iter())
            .filter(|a| matches!(a.phase, Phase::Holds(_)))
            .count();
        if holders > 1 {
            out.push(EXCLUDES);
        }
        let left =
            |a: &Actor| a.phase == Phase::Crashed || (a.phase == Phase::Idle && a.rounds == 0);
        if self.actors.iter().all(left) {
            let crashed = |i: &usize| self.actors[*i].phase == Phase::Crashed;
            if !self.queue().iter().all(crashed) || !self.only_crashed_deadlines() {
                out.push(EMPTY);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    super::store_in_field!();
}
