//! A model of a client of this crate on one plain lock: the decisions `src/shell/acquire.rs`,
//! `src/shell/acquire/waiting.rs`, `src/shell/attempt.rs`, `src/shell/release.rs`, `src/state/handover.rs` and
//! `src/shell/acquire/line.rs` make, and the keys, arguments and flags `src/wire/raw.rs` sends for them to
//! the real `lua/take.lua`, `lua/acquire.lua`, `lua/release.lua` and `lua/unlock.lua`
//! (a first send to the small scripts, a retry or a hand-over to the general ones, as
//! `raw::acquire` and `raw::release` choose). It is a model of the decisions, not
//! the client's code: issue 24's sans-IO core will let the checker drive the real one.
//!
//! Simplifications, each a place where the model may miss what the client does:
//! - A request runs and is answered in one step (no time between send and execution,
//!   no late replies); its faults are a lost reply, and a release's first send stuck
//!   in a connection given up, which runs at any later point (`late.rs`). Either is
//!   retried once with `r`, as the client's first retry, and never given up
//!   (`ATTEMPTS` is 3, the budgets here are at most 2).
//! - Every task waits (`lock()` with an explicit lease, no watchdog, no `try_lock`), one
//!   hold per task at a time, no re-entry: every acquire carries `f` and `w`.
//! - A task that starts while others of its client sleep asks Redis anyway (the client
//!   queues it behind them without asking: `Core::behind`); no early subscription.
//! - The client hears the lock's channel from its start to its end or crash,
//!   subscribed at once; its turn messages are ignored as hints (a
//!   waiter woken by "0" asks and meets `TurnBusy` instead of letting the "0" pass); an
//!   unlock message wakes every sleeping task of the client; a turn-busy reply sleeps
//!   for the turn's PTTL (`turn_covered` false).
//! - Hand-over: the oldest sleeping task is offered, on the terms the client's own
//!   `policy::run::Run` gives at the model time (`g` to give way, `e` past the window);
//!   the run's end publishes. The hold-back after a run (`held_back`, the gap) is not
//!   modelled.
//! - The line flag of every acquire is the client's own `policy::line::grant_effect`.
//!   No task gives up, so none leaves its client in line for a waiter counted after it,
//!   and `Core::line_of` (such a waiter's first grant takes the client out) is not
//!   modelled.
//! - Leaving the line (`LREM`) after a hand-over is sent in the same step; the janitor's
//!   latch deletes are not sent (latches carry a TTL).

use super::world::{ClientCfg, Config, World, LOCK};
use crate::checker::store::Reply;
use std::time::Duration;

use redis_rlock::policy::line::{grant_effect, Counted, Line};
use redis_rlock::policy::run::{Next, Run, Terms};
use redis_rlock::protocol::{channel_name, clients_key, turn_key};

/// A message the client heard: only the lock's unlock message is modelled.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Msg {
    Unlock,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    Idle {
        rounds: u8,
    },
    /// Asleep until `wake`, or woken by an unlock message; `offered` by an unlock of
    /// its own client in flight (it then waits for that unlock's outcome).
    Sleeping {
        wake: u64,
        woken: bool,
        offered: bool,
        seq: u8,
        rounds: u8,
    },
    Holding {
        until: u64,
        rounds: u8,
    },
    /// A request whose reply was lost, to be sent again with `r`.
    Retry {
        req: Req,
        rounds: u8,
    },
    Done,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Req {
    Acquire {
        keys: Vec<String>,
        args: Vec<String>,
        seq: u8,
    },
    Release {
        keys: Vec<String>,
        args: Vec<String>,
        /// The task offered the lock, and on which terms.
        offered: Option<(usize, Terms)>,
        sent: u64,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Task {
    pub phase: Phase,
    /// Counted among the client's waiters in line (`InLine::joined`).
    pub joined: bool,
    /// Answered busy at least once in this wait (`Counted::Waiting`).
    pub busy_before: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Client {
    pub idx: usize,
    pub tasks: Vec<Task>,
    pub in_line: u8,
    /// The run of hand-overs (`policy::run`), times as model ms since `EPOCH`.
    pub run: Run,
    pub next_seq: u8,
    pub inbox: super::world::Inbox,
    pub crashed: bool,
    pub requests: u8,
}

/// Client c's id: 36 characters.
pub fn id(c: usize) -> String {
    format!("cccccccc-cccc-4ccc-8ccc-{:012}", c)
}

pub fn field(c: usize, t: usize) -> String {
    format!("{}:{}", id(c), t + 1)
}

impl Client {
    pub fn new(cfg: &Config, c: usize) -> Client {
        let ClientCfg { tasks, rounds, .. } = cfg.clients[c];
        let task = Task {
            phase: Phase::Idle { rounds },
            joined: false,
            busy_before: false,
        };
        Client {
            idx: c,
            tasks: vec![task; tasks],
            in_line: 0,
            run: Run::default(),
            next_seq: 0,
            inbox: Default::default(),
            crashed: false,
            requests: 0,
        }
    }

    pub fn done(&self) -> bool {
        self.crashed || self.tasks.iter().all(|t| t.phase == Phase::Done)
    }

    pub fn listening(&self) -> bool {
        !self.done()
    }

    pub fn crash(&mut self) {
        self.crashed = true;
        self.inbox.clear();
    }

    /// A message published on `channel`: kept if the client listens there.
    /// A turn message (a large integer) is a hint the model leaves out.
    pub fn hear(&mut self, channel: &str, payload: &[u8]) {
        if self.listening() && channel == channel_name(LOCK) && is_unlock_message(payload) {
            self.inbox.push_back(Msg::Unlock);
        }
    }

    pub fn enabled(&self, now: u64) -> Vec<usize> {
        if self.crashed {
            return Vec::new();
        }
        let ready = |t: &Task| match &t.phase {
            Phase::Idle { .. } | Phase::Holding { .. } | Phase::Retry { .. } => true,
            Phase::Sleeping {
                wake,
                woken,
                offered,
                ..
            } => !offered && (*woken || now >= *wake),
            Phase::Done => false,
        };
        (0..self.tasks.len())
            .filter(|&t| ready(&self.tasks[t]))
            .collect()
    }

    /// A first send (not a retry) can lose its reply.
    pub fn may_lose_reply(&self, t: usize) -> bool {
        !matches!(self.tasks[t].phase, Phase::Retry { .. })
    }

    pub fn waiting(&self) -> bool {
        !self.crashed
            && self.tasks.iter().any(|t| {
                matches!(
                    t.phase,
                    Phase::Sleeping { .. }
                        | Phase::Retry {
                            req: Req::Acquire { .. },
                            ..
                        }
                )
            })
    }

    /// The oldest sleeping task not offered already: the one a release offers the lock.
    fn oldest_sleeper(&self) -> Option<usize> {
        (0..self.tasks.len())
            .filter_map(|t| match self.tasks[t].phase {
                Phase::Sleeping {
                    offered: false,
                    seq,
                    ..
                } => Some((seq, t)),
                _ => None,
            })
            .min()
            .map(|(_, t)| t)
    }
}

/// `raw::LATE_COPIES`, in ms.
const LATE_COPIES_MS: u64 = 600_000;

/// What becomes of a first send.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Answered,
    /// The script runs; its reply is lost.
    ReplyLost,
    /// The send is stuck in a connection the client gives up: it runs later, at any
    /// point (`super::late`), and the client sends it again with `r` meanwhile.
    Stuck,
}

/// Client c's task t takes its next step; `lost`: the script runs, its reply is lost.
pub fn step(w: &mut World, c: usize, t: usize, lost: bool) -> String {
    let fate = if lost {
        Fate::ReplyLost
    } else {
        Fate::Answered
    };
    match w.clients[c].tasks[t].phase.clone() {
        Phase::Idle { rounds } => attempt(w, c, t, fate, rounds, None),
        Phase::Sleeping { seq, rounds, .. } => attempt(w, c, t, fate, rounds, Some(seq)),
        Phase::Holding { rounds, .. } => release(w, c, t, fate, rounds),
        Phase::Retry { req, rounds } => retry(w, c, t, req, rounds),
        Phase::Done => unreachable!(),
    }
}

/// Client c's task t, holding, sends its release into a connection that it then gives
/// up: a copy runs later (`super::late`), and the task sends the release again.
pub fn stuck_release(w: &mut World, c: usize, t: usize) -> String {
    match w.clients[c].tasks[t].phase.clone() {
        Phase::Holding { rounds, .. } => release(w, c, t, Fate::Stuck, rounds),
        _ => unreachable!("only a holder's release is held back"),
    }
}

/// Whether task t's next step is a first send of a release.
pub fn may_stick(cl: &Client, t: usize) -> bool {
    matches!(cl.tasks[t].phase, Phase::Holding { .. })
}

fn attempt(w: &mut World, c: usize, t: usize, fate: Fate, rounds: u8, seq: Option<u8>) -> String {
    let cl = &mut w.clients[c];
    if !cl.tasks[t].joined {
        // `InLine::join_before_attempt`: counted before the first attempt is sent.
        cl.tasks[t].joined = true;
        cl.in_line += 1;
    }
    let counted = match cl.tasks[t].busy_before {
        true => Counted::Waiting,
        false => Counted::First,
    };
    let line = grant_effect(true, u32::from(cl.in_line), counted);
    let (keys, args) = match line {
        // `raw::acquire`: a fresh first send by a client not in line is `take.lua`'s, with
        // the line and the turn (the caller waits, turns on).
        Line::Out => (
            vec![LOCK.to_string(), clients_key(LOCK), turn_key(LOCK)],
            vec![w.cfg.clients[c].lease.to_string(), field(c, t)],
        ),
        _ => general_acquire(w, c, t, &format!("fw{}", line_letter(line))),
    };
    let seq = seq.unwrap_or_else(|| {
        let cl = &mut w.clients[c];
        cl.next_seq += 1;
        cl.next_seq
    });
    let req = Req::Acquire { keys, args, seq };
    send(w, c, t, req, fate, rounds)
}

/// The keys and arguments of `acquire.lua` as `raw::acquire` sends them, with a new
/// request's latch. A plain lock names no token counter.
fn general_acquire(w: &mut World, c: usize, t: usize, flags: &str) -> (Vec<String>, Vec<String>) {
    let latch = unlock_latch(w, c);
    let keys = vec![LOCK.to_string(), latch, clients_key(LOCK), turn_key(LOCK)];
    let args = vec![
        w.cfg.clients[c].lease.to_string(),
        field(c, t),
        w.cfg.latch_ttl.to_string(),
        w.cfg.turn_window.to_string(),
        flags.to_string(),
    ];
    (keys, args)
}

/// The request's retry, with `r`: a first send to `take.lua` or `release.lua` is sent
/// again to the general script (`raw::acquire`, `raw::release`).
fn as_retry(w: &mut World, c: usize, t: usize, req: &mut Req) {
    match script_name(req) {
        "take.lua" => {
            let Req::Acquire { keys, args, .. } = req else {
                unreachable!()
            };
            (*keys, *args) = general_acquire(w, c, t, "fw");
        }
        "release.lua" => {
            let Req::Release { args, .. } = req else {
                unreachable!()
            };
            // The same keys; the arguments of `unlock.lua` with nobody to hand over to.
            *args = release_args(w, c, t, "", "0", "");
        }
        _ => {}
    }
    match req {
        Req::Acquire { args, .. } | Req::Release { args, .. } => {
            args.last_mut().expect("flags").insert(0, 'r')
        }
    }
}

fn send(w: &mut World, c: usize, t: usize, req: Req, fate: Fate, rounds: u8) -> String {
    let (reply, flags) = match fate {
        Fate::Stuck => {
            let (keys, args) = match &req {
                Req::Acquire { keys, args, .. } | Req::Release { keys, args, .. } => (keys, args),
            };
            super::late::hold_back(w, script_name(&req), keys, args);
            (Reply::Nil, args.last().cloned().unwrap_or_default())
        }
        _ => run_req(w, &req),
    };
    let what = format!("{} {flags:?}", script_name(&req));
    if fate != Fate::Answered {
        let mut req = req;
        as_retry(w, c, t, &mut req);
        w.clients[c].tasks[t].phase = Phase::Retry { req, rounds };
        if fate == Fate::Stuck {
            return format!("C{c}.t{t}: {what} stuck in a connection given up");
        }
        return format!("C{c}.t{t}: {what} -> {reply:?}, reply lost");
    }
    let outcome = answered(w, c, t, req, reply.clone(), rounds, false);
    format!("C{c}.t{t}: {what} -> {reply:?}{outcome}")
}

/// Runs the request's script on the store: its reply, and the flags it was sent with.
fn run_req(w: &mut World, req: &Req) -> (Reply, String) {
    let (keys, args) = match req {
        Req::Acquire { keys, args, .. } | Req::Release { keys, args, .. } => (keys, args),
    };
    let name = script_name(req);
    let src = w.cfg.scripts.named(name);
    let reply = w.run(&src, keys, args);
    let flags = match name {
        "acquire.lua" | "unlock.lua" => args.last().cloned().unwrap_or_default(),
        _ => String::new(),
    };
    (reply, flags)
}

/// The script a request goes to, told by its arguments' count.
fn script_name(req: &Req) -> &'static str {
    match req {
        Req::Acquire { args, .. } if args.len() == 2 => "take.lua",
        Req::Acquire { .. } => "acquire.lua",
        Req::Release { args, .. } if args.len() == 5 => "release.lua",
        Req::Release { .. } => "unlock.lua",
    }
}

fn retry(w: &mut World, c: usize, t: usize, mut req: Req, rounds: u8) -> String {
    // `attempt.rs`: the lost reply may have been a busy answer that put the client in
    // line, so a waiting call's retry counts as a waiter in line, with the client's
    // other waiters as they are now (only an acquire carries `w`).
    if let Req::Acquire { args, .. } = &mut req {
        let flags = args.last_mut().expect("flags");
        if flags.contains('w') {
            flags.retain(|f| f != 'k' && f != 'l');
            let in_line = u32::from(w.clients[c].in_line);
            flags.push_str(line_letter(grant_effect(true, in_line, Counted::Waiting)));
        }
    }
    let (reply, flags) = run_req(w, &req);
    let what = format!("{} {flags:?} (retry)", script_name(&req));
    let outcome = answered(w, c, t, req, reply.clone(), rounds, true);
    format!("C{c}.t{t}: {what} -> {reply:?}{outcome}")
}

fn answered(
    w: &mut World,
    c: usize,
    t: usize,
    req: Req,
    reply: Reply,
    rounds: u8,
    retry: bool,
) -> String {
    match req {
        Req::Acquire { seq, .. } => super::client_replies::acquire(w, c, t, reply, rounds, seq),
        Req::Release { offered, sent, .. } => {
            super::client_replies::release(w, c, t, reply, rounds, offered, sent, retry)
        }
    }
}

fn release(w: &mut World, c: usize, t: usize, fate: Fate, rounds: u8) -> String {
    let now = Duration::from_millis(w.now() - super::world::EPOCH);
    let limits = w.cfg.handover;
    let cl = &mut w.clients[c];
    // `Core::pick`: the run decides, for the oldest sleeper.
    let sleeper = cl.oldest_sleeper();
    let offer = match cl.run.release(now, &limits, true, sleeper.is_some()) {
        Next::Offer(terms) => sleeper.map(|n| (n, terms)),
        Next::End { .. } | Next::Publish => None,
    };
    let mut flags = String::new();
    let (mut next_field, mut next_lease) = (String::new(), "0".to_string());
    if let Some((n, terms)) = offer {
        cl.run.offered(now, terms);
        if let Phase::Sleeping { offered, .. } = &mut cl.tasks[n].phase {
            *offered = true;
        }
        next_field = field(c, n);
        next_lease = w.cfg.clients[c].lease.to_string();
        match terms {
            Terms::GiveWay => flags.push('g'),
            Terms::EndOfStreak => flags.push('e'),
            Terms::Outright => {}
        }
    }
    let mut keys = release_keys(c);
    keys[2] = unlock_latch(w, c);
    let args = match offer {
        None => plain_release_args(w, c, t),
        Some(_) => release_args(w, c, t, &next_field, &next_lease, &flags),
    };
    let sent = w.now();
    send(
        w,
        c,
        t,
        Req::Release {
            keys,
            args,
            offered: offer,
            sent,
        },
        fate,
        rounds,
    )
}

/// The keys of `unlock.lua` as `raw::plain_release_call` sends them. The latch is per
/// request.
pub fn release_keys(c: usize) -> Vec<String> {
    let _ = c;
    vec![
        LOCK.to_string(),
        channel_name(LOCK),
        String::new(),
        clients_key(LOCK),
        turn_key(LOCK),
    ]
}

/// The arguments of `release.lua` releasing task t's one hold, with nobody to hand over
/// to (`raw::release`'s first send); its keys are `unlock.lua`'s.
pub fn plain_release_args(w: &World, c: usize, t: usize) -> Vec<String> {
    vec![
        field(c, t),
        "1".to_string(),
        "0".to_string(),
        LATE_COPIES_MS.to_string(),
        w.cfg.turn_window.to_string(),
    ]
}

/// The arguments of `unlock.lua` releasing task t's one hold; `next`: a waiter to hand
/// over to, or ''. Also draws the request's latch name into `keys[2]` (see `send`).
pub fn release_args(
    w: &mut World,
    c: usize,
    t: usize,
    next: &str,
    lease: &str,
    flags: &str,
) -> Vec<String> {
    vec![
        "0".to_string(),
        field(c, t),
        // `release.rs`: a release's latch lives as long as late copies are guarded.
        LATE_COPIES_MS.to_string(),
        "1".to_string(),
        next.to_string(),
        lease.to_string(),
        w.cfg.turn_window.to_string(),
        flags.to_string(),
    ]
}

/// A fresh request's unlock latch: `redisson_unlock_latch:{lock}:<request id>`.
pub fn unlock_latch(w: &mut World, c: usize) -> String {
    let cl = &mut w.clients[c];
    cl.requests += 1;
    format!("redisson_unlock_latch:{{{LOCK}}}:c{c}n{}", cl.requests)
}

/// Delivers client c's next message.
pub fn deliver(w: &mut World, c: usize) -> String {
    let msg = w.clients[c].inbox.pop_front().expect("a message");
    match msg {
        Msg::Unlock => {
            for task in &mut w.clients[c].tasks {
                if let Phase::Sleeping { woken, .. } = &mut task.phase {
                    *woken = true;
                }
            }
            format!("C{c}: hears unlock message, wakes its sleepers")
        }
    }
}

/// The acquire script's letter for a line effect (`raw/flags.rs`).
fn line_letter(line: Line) -> &'static str {
    match line {
        Line::Keep => "k",
        Line::Leave => "l",
        Line::Out => "",
    }
}

/// Redisson's two unlock messages, the only ones its subscribers act on.
pub fn is_unlock_message(payload: &[u8]) -> bool {
    payload == b"0" || payload == b"1"
}
