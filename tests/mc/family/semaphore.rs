//! The semaphore (`RSemaphore`): takers of this crate and of Redisson over one count.
//!
//! A crate taker sends `semaphore_acquire.lua` under a request latch of its own; when
//! the reply is lost it sends it again with the same latch and the retry flag, as
//! `Semaphore::try_once` does (`src/api/semaphore.rs`), then releases with
//! `semaphore_release.lua`. A Redisson taker runs Redisson's `tryAcquire` and `release`.
//! A refused try writes nothing, so trying again is the same state: the waiting between
//! tries (`src/shell/sync_wait.rs`) adds no state and is left out; only what is taken counts.

use super::{count, int, run, Fixed, Texts, World, EPOCH};
use crate::checker::store::Store;

pub const SEM: &str = "s";
/// How long a request latch is kept (ms): the model's retries all come well within it.
const LATCH_TTL: &str = "10000";

/// Permits held (by what their takers were told) plus those available exceed the count.
pub const EXCEED: &str = "permits never exceed the count";
/// With no retry pending, permits held and available do not add up to the count: a lost
/// reply's retry took them again (or gave them to nobody).
pub const ONCE: &str = "a lost reply takes permits once";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Kind {
    Crate,
    Redisson,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Phase {
    Idle,
    /// The last acquire's reply was lost: send it again with the retry flag.
    Retry,
    Holds,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Taker {
    kind: Kind,
    want: u8,
    rounds: u8,
    phase: Phase,
    /// The request id of the current acquire (its latch's name).
    request: u8,
}

pub struct Config {
    pub permits: i64,
    /// (kind, permits per acquire, rounds)
    pub takers: Vec<(Kind, u8, u8)>,
    pub lost_replies: u8,
    pub texts: Texts,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Sem {
    store: Store,
    takers: Vec<Taker>,
    lost_replies: u8,
    cfg: Fixed<Config>,
}

pub fn texts() -> Texts {
    Texts::of(&[
        "semaphore_acquire.lua",
        "semaphore_release.lua",
        "semaphore_set.lua",
    ])
}

impl Sem {
    pub fn new(cfg: Config) -> Sem {
        let mut store = Store::new(EPOCH);
        let channel = redis_rlock::protocol::semaphore_channel(SEM);
        let set = cfg.texts.get("semaphore_set.lua").clone();
        let permits = cfg.permits.to_string();
        run(
            &mut store,
            &set,
            &[SEM, &channel],
            &[permits.as_str(), "publish"],
        );
        let takers = (cfg.takers.iter())
            .map(|&(kind, want, rounds)| Taker {
                kind,
                want,
                rounds,
                phase: Phase::Idle,
                request: 0,
            })
            .collect();
        Sem {
            store,
            takers,
            lost_replies: cfg.lost_replies,
            cfg: Fixed(cfg.into()),
        }
    }

    fn held(&self) -> i64 {
        (self.takers.iter())
            .filter(|t| t.phase == Phase::Holds)
            .map(|t| i64::from(t.want))
            .sum()
    }

    /// The taker's acquire; true when taken.
    fn acquire(&mut self, i: usize) -> bool {
        let t = self.takers[i].clone();
        let want = t.want.to_string();
        let reply = match t.kind {
            Kind::Crate => {
                let latch = format!("redisson_semaphore_latch:{{{SEM}}}:t{i}n{}", t.request);
                let retry = if t.phase == Phase::Retry { "1" } else { "0" };
                let src = self.cfg.texts.get("semaphore_acquire.lua").clone();
                run(
                    &mut self.store,
                    &src,
                    &[SEM, &latch],
                    &[&want, retry, LATCH_TTL],
                )
                .0
            }
            Kind::Redisson => {
                let src = self.cfg.texts.get("redisson:sem_acquire").clone();
                run(&mut self.store, &src, &[SEM], &[&want]).0
            }
        };
        int(&reply) == 1
    }

    fn release(&mut self, i: usize) {
        let t = &self.takers[i];
        let (want, channel) = (
            t.want.to_string(),
            redis_rlock::protocol::semaphore_channel(SEM),
        );
        match t.kind {
            Kind::Crate => {
                let src = self.cfg.texts.get("semaphore_release.lua").clone();
                run(
                    &mut self.store,
                    &src,
                    &[SEM, &channel],
                    &[&want, "publish", "release"],
                );
            }
            Kind::Redisson => {
                let src = self.cfg.texts.get("redisson:sem_release").clone();
                run(&mut self.store, &src, &[SEM, &channel], &[&want]);
            }
        }
    }
}

/// Taker i's next step; `lost`: its reply never comes (the script ran).
#[derive(Clone, Copy, Debug)]
pub struct Step(usize, bool);

impl World for Sem {
    type Action = Step;

    fn actions(&self) -> Vec<Step> {
        let mut out = Vec::new();
        for (i, t) in self.takers.iter().enumerate() {
            if t.rounds == 0 {
                continue;
            }
            out.push(Step(i, false));
            // Only the crate's acquire has a retry path to check; a Redisson retry of a
            // lost `tryAcquire` is Redisson's own (it would take twice).
            if self.lost_replies > 0 && t.kind == Kind::Crate && t.phase != Phase::Holds {
                out.push(Step(i, true));
            }
        }
        out
    }

    fn apply(&mut self, Step(i, lost): Step) -> String {
        let t = self.takers[i].clone();
        let who = format!("{:?} taker {i}", t.kind);
        if t.phase == Phase::Holds {
            self.release(i);
            let t = &mut self.takers[i];
            t.phase = Phase::Idle;
            t.rounds -= 1;
            t.request += 1;
            return format!("{who} releases {}", t.want);
        }
        let taken = self.acquire(i);
        let retry = if t.phase == Phase::Retry {
            " (retry)"
        } else {
            ""
        };
        let t = &mut self.takers[i];
        if lost {
            self.lost_replies -= 1;
            t.phase = Phase::Retry;
            return format!(
                "{who} acquire{retry} of {}: taken {taken}, reply lost",
                t.want
            );
        }
        t.phase = if taken { Phase::Holds } else { Phase::Idle };
        format!("{who} acquire{retry} of {}: taken {taken}", t.want)
    }

    fn violations(&self) -> Vec<&'static str> {
        let (held, available) = (self.held(), count(&self.store, SEM));
        let mut out = Vec::new();
        if held + available > self.cfg.permits || held > self.cfg.permits {
            out.push(EXCEED);
        }
        let retrying = self.takers.iter().any(|t| t.phase == Phase::Retry);
        if !retrying && held + available != self.cfg.permits {
            out.push(ONCE);
        }
        out
    }

    super::store_in_field!();
}
