//! What a client of this crate does with each answer (the model of `src/shell/attempt.rs`,
//! `src/shell/acquire/waiting.rs` and `src/shell/release.rs`'s reply handling; see `client.rs` for
//! the simplifications).

use super::client::{id, Phase, Task};
use super::world::{World, LOCK};
use crate::checker::store::Reply;
use redis_rlock::policy::run::{Settled, Terms};
use redis_rlock::policy::wait::{sleep_bound, Waits};
use redis_rlock::policy::waiter::{self, Answer, Pauses, Step, Woken};
use redis_rlock::protocol::clients_key;
use std::rc::Rc;
use std::time::Duration;

thread_local! {
    // `LREM <line> 0 <client id>`, the plain command `raw::leave_line` sends.
    static LEAVE_LINE: Rc<str> = "return redis.call('lrem', KEYS[1], 0, ARGV[1])".into();
}

fn after_hold(rounds: u8) -> Phase {
    if rounds <= 1 {
        Phase::Done
    } else {
        Phase::Idle { rounds: rounds - 1 }
    }
}

/// The task now holds until `until`; `by_redis`: a grant of Redis's (an acquire), which
/// took the client out of the line already if it was its last.
fn hold(w: &mut World, c: usize, t: usize, until: u64, rounds: u8, by_redis: bool) {
    let cl = &mut w.clients[c];
    let task = &mut cl.tasks[t];
    task.phase = Phase::Holding { until, rounds };
    task.busy_before = false;
    if task.joined {
        task.joined = false;
        cl.in_line -= 1;
        if !by_redis && cl.in_line == 0 {
            let keys = [clients_key(LOCK)];
            let src = LEAVE_LINE.with(Rc::clone);
            w.run(&src, &keys, &[id(c)]);
        }
    }
}

fn sleep(task: &mut Task, wake: u64, seq: u8, rounds: u8) {
    task.phase = Phase::Sleeping {
        wake,
        woken: false,
        offered: false,
        seq,
        rounds,
    };
}

pub fn acquire(w: &mut World, c: usize, t: usize, reply: Reply, rounds: u8, seq: u8) -> String {
    let now = w.now();
    let lease = w.cfg.clients[c].lease;
    let items = match reply {
        Reply::Array(items) => items,
        // A plain lock's fresh first grant.
        Reply::Nil => vec![Reply::Int(1), Reply::Int(0), Reply::Int(0)],
        // `take.lua`'s busy answer: the PTTL alone.
        Reply::Int(pttl) => vec![Reply::Int(0), Reply::Int(pttl)],
        other => panic!("acquire.lua answered {other:?}"),
    };
    // The client's own decision on the answer (`policy::waiter`), at model lengths.
    let (answer, turn) = match items.as_slice() {
        [Reply::Int(1), ..] => (Answer::Held(()), false),
        [Reply::Int(0), Reply::Int(pttl), rest @ ..] => {
            let ttl = u64::try_from(*pttl).ok().map(Duration::from_millis);
            (Answer::Busy(ttl), !rest.is_empty())
        }
        other => panic!("acquire.lua answered {other:?}"),
    };
    match waiter::after_attempt::<(), ()>(answer, Duration::from_millis(RETRY_WINDOW_MS)) {
        Step::Done(Ok(Some(()))) => {
            hold(w, c, t, now + lease, rounds, true);
            format!(": holds until {} ms", now + lease - super::world::EPOCH)
        }
        Step::Sleep { ttl, .. } => {
            let task = &mut w.clients[c].tasks[t];
            task.busy_before = true;
            let wake = now
                + ms(sleep_bound(
                    Waits::Plain,
                    ttl,
                    Duration::from_millis(BACKSTOP_MS),
                ));
            sleep(task, wake, seq, rounds);
            let why = if turn {
                "another client's turn"
            } else {
                "busy"
            };
            format!(": {why}, sleeps until {} ms", wake - super::world::EPOCH)
        }
        step => panic!("an answered attempt came to {step:?}"),
    }
}

/// Longer than any model run: a transient error is not modelled, nor a key without
/// expiry.
const RETRY_WINDOW_MS: u64 = 1_000_000;
const BACKSTOP_MS: u64 = 1_000_000;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What a waiter offered the lock makes of the unlock's outcome (`policy::waiter`).
fn woken(w: &World, outcome: &str, sent: u64, lease: u64) -> Step<(), ()> {
    let woken = match outcome {
        "handed over" => Woken::Handed {
            hold: (),
            unacked: false,
            late: sent + lease <= w.now(),
            closed: None,
        },
        "gave way" => Woken::Passed { covered: false },
        _ => Woken::Free { lapse: false },
    };
    let pauses = Pauses {
        backstop: Duration::from_millis(BACKSTOP_MS),
        turn_window: Duration::from_millis(w.cfg.turn_window),
    };
    waiter::after_wake(woken, pauses)
}

#[allow(clippy::too_many_arguments)]
pub fn release(
    w: &mut World,
    c: usize,
    t: usize,
    reply: Reply,
    rounds: u8,
    offered: Option<(usize, Terms)>,
    sent: u64,
    retry: bool,
) -> String {
    w.clients[c].tasks[t].phase = after_hold(rounds);
    let lease = w.cfg.clients[c].lease;
    let outcome = match (&reply, retry) {
        (Reply::Nil, true) | (Reply::Int(1), _) => "released",
        (Reply::Nil, false) => "held nothing",
        (Reply::Int(3), _) => "gave way",
        // Only where a seeded bug wrote the field behind the task's back.
        (Reply::Int(0), _) => "holds remain",
        (Reply::Array(_), _) => "handed over",
        _ => panic!("unlock.lua answered {reply:?}"),
    };
    let Some((n, terms)) = offered else {
        return format!(": {outcome}");
    };
    let cl = &mut w.clients[c];
    // `send_release`: how the offer came out, for the run (`Run::settled`).
    cl.run.settled(
        terms,
        match outcome {
            "handed over" => Settled::HandedOver,
            "gave way" => Settled::GaveWay,
            _ => Settled::NotHandedOver,
        },
    );
    let still_sleeping = matches!(cl.tasks[n].phase, Phase::Sleeping { .. });
    let step = woken(w, outcome, sent, lease);
    let cl = &mut w.clients[c];
    match (outcome, step) {
        ("handed over", Step::Done(Ok(Some(())))) if still_sleeping => {
            let rounds = match cl.tasks[n].phase {
                Phase::Sleeping { rounds, .. } => rounds,
                _ => 1,
            };
            hold(w, c, n, sent + lease, rounds, false);
            format!(": handed over to t{n}")
        }
        // The waiter left meanwhile: the hold goes back.
        ("handed over", _) => format!(
            ": handed over to t{n}, who holds already{}",
            give_back(w, c, n)
        ),
        (_, Step::Sleep { ttl, .. }) => {
            let now = w.store.now_ms;
            let task = &mut cl.tasks[n];
            if let Phase::Sleeping {
                wake,
                offered,
                woken,
                ..
            } = &mut task.phase
            {
                *offered = false;
                *woken = false;
                *wake = now + ttl.map_or(BACKSTOP_MS, ms);
            }
            format!(": gave way; t{n} sleeps on")
        }
        (_, Step::Attempt { .. }) => {
            // Withdrawn: the offered waiter asks Redis itself.
            if let Phase::Sleeping { offered, woken, .. } = &mut cl.tasks[n].phase {
                *offered = false;
                *woken = true;
            }
            format!(": {outcome}; offer to t{n} withdrawn")
        }
        (_, step) => panic!("an offer's outcome came to {step:?}"),
    }
}

/// Releases a hold of task n that nobody will use (`release_detached`).
fn give_back(w: &mut World, c: usize, n: usize) -> String {
    if matches!(w.clients[c].tasks[n].phase, Phase::Holding { .. }) {
        return String::new();
    }
    let mut keys = super::client::release_keys(c);
    keys[2] = super::client::unlock_latch(w, c);
    let args = super::client::plain_release_args(w, c, n);
    let src = w.cfg.scripts.release.clone();
    let r = w.run(&src, &keys, &args);
    format!("; gives it back -> {r:?}")
}
