//! The count-down latch (`RCountDownLatch`): counters and waiters of this crate and of
//! Redisson on one latch set to the number of count-downs.
//!
//! A waiter looks (`GET`); at zero it is done. Otherwise it subscribes, and once the
//! subscription is confirmed looks again (a count-down in between published to nobody),
//! then sleeps until a message and looks again. That is both `CountDownLatch::wait`
//! (`src/api/latch.rs` over `src/shell/sync_wait.rs`) and Redisson's `await()`. The crate's waiter
//! also looks again when its sleep bound (the watchdog timeout) runs out; Redisson's
//! waits for a message only. That timer is modelled as a look that may come at any
//! time, offered only where it would find zero: a look that finds the count above zero
//! puts the waiter back to sleep, the same state.
//!
//! "Every waiter wakes at zero" is judged where the run ends: in a state with no action
//! left (every count-down made, every message delivered or lost), every waiter is done.
//! Nothing here makes a cycle, so every run ends.

use super::{count, run, Fixed, Texts, World, EPOCH};
use crate::checker::store::Store;

pub use super::semaphore::Kind;

pub const LATCH: &str = "l";

pub const WAKE: &str = "every waiter wakes at zero";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Phase {
    /// Before its first look.
    Start,
    /// Subscribed; looks again once that is confirmed.
    Subscribed,
    Asleep,
    Done,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Waiter {
    kind: Kind,
    phase: Phase,
    /// Messages on their way to it.
    pending: u8,
}

pub struct Config {
    /// Who counts down (once each); the latch is set to their number.
    pub counters: Vec<Kind>,
    pub waiters: Vec<Kind>,
    pub lost_messages: u8,
    pub texts: Texts,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Latch {
    store: Store,
    /// Per counter: whether it has counted down.
    counted: Vec<bool>,
    waiters: Vec<Waiter>,
    lost_messages: u8,
    cfg: Fixed<Config>,
}

pub fn texts() -> Texts {
    Texts::of(&["latch_set.lua", "latch_count_down.lua"])
}

fn channel() -> String {
    redis_rlock::protocol::latch_channel(LATCH)
}

impl Latch {
    pub fn new(cfg: Config) -> Latch {
        let mut store = Store::new(EPOCH);
        let set = cfg.texts.get("latch_set.lua").clone();
        let n = cfg.counters.len().to_string();
        run(
            &mut store,
            &set,
            &[LATCH, &channel()],
            &["1", n.as_str(), "publish"],
        );
        Latch {
            store,
            counted: vec![false; cfg.counters.len()],
            waiters: (cfg.waiters.iter())
                .map(|&kind| Waiter {
                    kind,
                    phase: Phase::Start,
                    pending: 0,
                })
                .collect(),
            lost_messages: cfg.lost_messages,
            cfg: Fixed(cfg.into()),
        }
    }

    fn zero(&self) -> bool {
        count(&self.store, LATCH) <= 0
    }

    /// Waiter w looks at the count: done at zero, else asleep (or, on its first look,
    /// subscribed).
    fn look(&mut self, w: usize) -> String {
        let zero = self.zero();
        let waiter = &mut self.waiters[w];
        waiter.phase = match (zero, waiter.phase) {
            (true, _) => Phase::Done,
            (false, Phase::Start) => Phase::Subscribed,
            (false, _) => Phase::Asleep,
        };
        if waiter.phase == Phase::Done {
            waiter.pending = 0;
        }
        format!(
            "{:?} waiter {w} looks: zero {zero}, now {:?}",
            waiter.kind, waiter.phase
        )
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Act {
    CountDown(usize),
    Look(usize),
    /// Deliver (or, `lost`, drop) waiter w's next message.
    Deliver(usize, bool),
    /// The crate waiter's sleep bound ran out.
    Timer(usize),
}

impl World for Latch {
    type Action = Act;

    fn actions(&self) -> Vec<Act> {
        let mut out: Vec<Act> = (0..self.counted.len())
            .filter(|c| !self.counted[*c])
            .map(Act::CountDown)
            .collect();
        for (w, waiter) in self.waiters.iter().enumerate() {
            match waiter.phase {
                Phase::Start | Phase::Subscribed => out.push(Act::Look(w)),
                Phase::Asleep if waiter.kind == Kind::Crate && self.zero() => {
                    out.push(Act::Timer(w))
                }
                _ => {}
            }
            if waiter.pending > 0 {
                out.push(Act::Deliver(w, false));
                if self.lost_messages > 0 {
                    out.push(Act::Deliver(w, true));
                }
            }
        }
        out
    }

    fn apply(&mut self, a: Act) -> String {
        match a {
            Act::CountDown(c) => {
                self.counted[c] = true;
                let kind = self.cfg.counters[c];
                let name = match kind {
                    Kind::Crate => "latch_count_down.lua",
                    Kind::Redisson => "redisson:latch_count_down",
                };
                let src = self.cfg.texts.get(name).clone();
                let (_, sent) = run(
                    &mut self.store,
                    &src,
                    &[LATCH, &channel()],
                    &["0", "publish"],
                );
                let heard = sent
                    .iter()
                    .filter(|m| m.channel == channel().as_bytes())
                    .count() as u8;
                for w in &mut self.waiters {
                    if matches!(w.phase, Phase::Subscribed | Phase::Asleep) {
                        w.pending += heard;
                    }
                }
                format!("{kind:?} counter {c} counts down; {heard} message(s)")
            }
            Act::Look(w) | Act::Timer(w) => self.look(w),
            Act::Deliver(w, lost) => {
                self.waiters[w].pending -= 1;
                if lost {
                    self.lost_messages -= 1;
                    return format!("waiter {w}: message lost");
                }
                match self.waiters[w].phase {
                    Phase::Asleep => self.look(w),
                    // Heard before its look after subscribing: that look comes anyway.
                    _ => format!("waiter {w} hears a message before its look"),
                }
            }
        }
    }

    fn violations(&self) -> Vec<&'static str> {
        let ended = self.actions().is_empty();
        if ended && self.waiters.iter().any(|w| w.phase != Phase::Done) {
            return vec![WAKE];
        }
        Vec::new()
    }

    super::store_in_field!();
}
