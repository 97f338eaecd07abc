//! Redisson's side: its own acquire and unlock scripts for `RLock` (typed here from the
//! description in words of `RedissonLock.tryLockInnerAsync` and `unlockInnerAsync`), a
//! `lock()` waiter and a `tryLock()` poller, each a small deterministic state machine
//! whose Redis effects go only through those scripts.

use super::world::{World, LOCK};
use crate::checker::store::Reply;

#[path = "../common/redisson_rlock.rs"]
mod scripts;
pub use scripts::{ACQUIRE, UNLOCK};

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Kind {
    /// `lock()`: waits for an unlock message or the holder's PTTL, then tries again.
    Waiter,
    /// `tryLock()` called again at each model tick, this many times at most.
    Poller(u8),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    Start,
    /// Subscribed (Redisson subscribes after a busy first attempt) and tries again.
    Subscribed,
    /// Asleep until an unlock message gives a permit, or this time passes.
    Waiting {
        until: u64,
    },
    /// A poller's next try, at this model time or later.
    Polling {
        at: u64,
        left: u8,
    },
    Holding {
        until: u64,
    },
    Done,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Actor {
    pub kind: Kind,
    pub lease: u64,
    pub phase: Phase,
    /// Unlock messages on the lock's channel not yet delivered to it.
    pub pending: u8,
    /// Redisson's latch semaphore: a message delivered with nobody waiting stays.
    pub permit: bool,
    pub crashed: bool,
}

impl Actor {
    pub fn new(kind: Kind, lease: u64) -> Actor {
        Actor {
            kind,
            lease,
            phase: Phase::Start,
            pending: 0,
            permit: false,
            crashed: false,
        }
    }

    /// Subscribed to the lock's channel (from its first busy reply until it holds).
    pub fn subscribed(&self) -> bool {
        !self.crashed && matches!(self.phase, Phase::Subscribed | Phase::Waiting { .. })
    }

    /// Waits for the lock: it asked, was answered busy, and will ask again.
    pub fn waiting(&self) -> bool {
        !self.crashed
            && matches!(
                self.phase,
                Phase::Subscribed | Phase::Waiting { .. } | Phase::Polling { .. }
            )
    }

    pub fn holds_live(&self, now: u64) -> bool {
        !self.crashed && matches!(self.phase, Phase::Holding { until } if now < until)
    }

    /// Whether its next step may run now.
    pub fn enabled(&self, now: u64) -> bool {
        if self.crashed {
            return false;
        }
        match self.phase {
            Phase::Start | Phase::Subscribed | Phase::Holding { .. } => true,
            Phase::Waiting { until } => self.permit || now >= until,
            Phase::Polling { at, .. } => now >= at,
            Phase::Done => false,
        }
    }

    pub fn done(&self) -> bool {
        self.crashed || self.phase == Phase::Done
    }
}

/// A Redisson client id: 36 characters, as the crate's scripts cut client ids.
pub fn uuid(i: usize) -> String {
    format!("aaaaaaaa-aaaa-4aaa-8aaa-{:012}", i)
}

fn field(i: usize) -> String {
    format!("{}:1", uuid(i))
}

/// Runs actor `i`'s next step on `w`; a line saying what it did.
pub fn step(w: &mut World, i: usize) -> String {
    let a = w.redisson[i].clone();
    let now = w.store.now_ms;
    let (phase, what) = match a.phase {
        Phase::Holding { .. } => {
            let latch = format!("redisson_unlock_latch:{{{LOCK}}}:r{i}");
            let args = [
                "0".to_string(),
                a.lease.to_string(),
                field(i),
                "publish".into(),
                w.cfg.latch_ttl.to_string(),
            ];
            let keys = [LOCK.to_string(), w.lock_channel(), latch];
            let r = w.run(&w.cfg.scripts.r_unlock.clone(), &keys, &args);
            (Phase::Done, format!("unlock -> {r:?}"))
        }
        Phase::Waiting { .. } | Phase::Start | Phase::Subscribed | Phase::Polling { .. } => {
            let args = [a.lease.to_string(), field(i)];
            let r = w.run(&w.cfg.scripts.r_acquire.clone(), &[LOCK], &args);
            let next = match (&r, &a.phase, a.kind) {
                (Reply::Nil, _, _) => Phase::Holding {
                    until: now + a.lease,
                },
                (_, Phase::Start, Kind::Waiter) => Phase::Subscribed,
                (Reply::Int(ttl), _, Kind::Waiter) if *ttl >= 0 => Phase::Waiting {
                    until: now + *ttl as u64,
                },
                (_, _, Kind::Waiter) => Phase::Waiting { until: u64::MAX },
                (_, Phase::Polling { left, .. }, Kind::Poller(_)) if *left <= 1 => Phase::Done,
                (_, Phase::Polling { left, .. }, Kind::Poller(_)) => Phase::Polling {
                    at: now + 1,
                    left: left - 1,
                },
                (_, _, Kind::Poller(n)) if n <= 1 => Phase::Done,
                (_, _, Kind::Poller(n)) => Phase::Polling {
                    at: now + 1,
                    left: n - 1,
                },
            };
            (next, format!("acquire -> {r:?}"))
        }
        Phase::Done => unreachable!("a finished actor takes no step"),
    };
    let actor = &mut w.redisson[i];
    if matches!(a.phase, Phase::Waiting { .. }) {
        actor.permit = false;
    }
    actor.phase = phase;
    let who = match a.kind {
        Kind::Waiter => "Redisson lock()",
        Kind::Poller(_) => "Redisson tryLock()",
    };
    format!("{who} R{i}: {what}")
}
