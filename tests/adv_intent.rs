//! Adversarial review of the plain lock's scripts by intent (`lua/take.lua`,
//! `lua/release.lua`) and of the turn's yield (`docs/protocol.md` 2.6, "A subscriber
//! outside the line goes first"), against real redis-server. Other clients of the lock
//! are driven by the crate's own scripts, sent as the client sends them, so that their
//! interleaving with the client under test is exact.
//!
//! Run: `cargo test --test adv_intent -- --nocapture`

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::protocol::{channel_name, clients_key, script_source, turn_key, turn_message};
use redis_rlock::Client;

const C: &str = "cccccccc-cccc-4ccc-8ccc-cccccccccccc";
const E: &str = "eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee";
const X: &str = "99999999-9999-4999-8999-999999999999";
const D: &str = "dddddddd-dddd-4ddd-8ddd-dddddddddddd";

/// `take.lua` as a waiting call with turns on sends it (lock, line, turn).
fn take_waiting(p: &mut redis::Pipeline, name: &str, field: &str) {
    p.cmd("EVAL")
        .arg(script_source("take.lua").unwrap())
        .arg(3)
        .arg(name)
        .arg(clients_key(name))
        .arg(turn_key(name))
        .arg(30_000)
        .arg(field);
}

/// `take.lua` as a single try sends it (the lock only).
fn take_try(p: &mut redis::Pipeline, name: &str, field: &str) {
    p.cmd("EVAL")
        .arg(script_source("take.lua").unwrap())
        .arg(1)
        .arg(name)
        .arg(30_000)
        .arg(field);
}

/// `release.lua` with turns on, a turn window of `window` ms.
fn release(p: &mut redis::Pipeline, name: &str, field: &str, request: &str, window: u64) {
    p.cmd("EVAL")
        .arg(script_source("release.lua").unwrap())
        .arg(5)
        .arg(name)
        .arg(channel_name(name))
        .arg(format!("redisson_unlock_latch:{{{name}}}:{request}"))
        .arg(clients_key(name))
        .arg(turn_key(name))
        .arg(field)
        .arg(1)
        .arg(0)
        .arg(10_000)
        .arg(window);
}

/// Puts `client` at the back of the line unless it is in it (as a refused waiter does).
fn join_line(p: &mut redis::Pipeline, name: &str, client: &str) {
    p.cmd("EVAL")
        .arg(
            "if not redis.call('lpos', KEYS[1], ARGV[1]) then \
             redis.call('rpush', KEYS[1], ARGV[1]) end \
             redis.call('pexpire', KEYS[1], 60000)",
        )
        .arg(1)
        .arg(clients_key(name))
        .arg(client);
}

fn line(s: &RedisServer, name: &str) -> Vec<String> {
    s.cmd(&["LRANGE", &clients_key(name), "0", "-1"])
}

/// Connections subscribed to the lock's channel that are no client in the line: what a
/// Redisson `lock()` waiter is to the release's count.
fn strangers(s: &RedisServer, name: &str, n: usize) -> Vec<redis::Connection> {
    (0..n)
        .map(|_| {
            let mut c = s.conn();
            redis::cmd("SUBSCRIBE")
                .arg(channel_name(name))
                .exec(&mut c)
                .unwrap();
            c
        })
        .collect()
}

/// Finding 1: a turn given with `yields` set, and another client's turn announced
/// within the yield's millisecond (the lock taken by a single try, which ignores turns as
/// Redisson's `tryLock()` does, and released at once), voided the yield's timer (it is
/// keyed by the channel's message count, which a turn message also moves on) while the
/// unlock message behind that other turn woke nobody here (it is the other client's).
/// The waiter of the client whose turn it was was never woken: not in the line any more
/// (a turn takes its client out of it), it got no further turn while other clients
/// took theirs one after another, and slept until the PTTL of its last busy answer (the
/// watchdog lease here, 30 s). Without the yield, the unlock message woke it at once, and
/// its refused attempt put it back in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yield_voided_by_another_turn_still_wakes_the_waiter() {
    let s = RedisServer::start();
    // Turns long enough that no lapse timer wakes the waiter while the others go on.
    let window = Duration::from_millis(300);
    let a = Client::builder(s.url())
        .turn_window(window)
        .build()
        .await
        .unwrap();
    let name = "adv:yield-void";
    let x_field = format!("{X}:1");
    let _: () = s.cmd(&["HSET", name, &x_field, "1"]);
    let _: () = s.cmd(&["PEXPIRE", name, "30000"]);
    let waiter = tokio::spawn({
        let l = a.lock(name);
        async move {
            let g = l.lock().await.unwrap();
            let at = Instant::now();
            g.unlock().await.unwrap();
            at
        }
    });
    assert!(
        common::eventually(Duration::from_secs(5), || line(&s, name) == [a.id()]).await,
        "setup: the waiter is in line"
    );
    let _strangers = strangers(&s, name, 3);
    let mut setup = redis::pipe();
    join_line(&mut setup, name, C);
    let _: () = setup.query(&mut s.conn()).unwrap();
    let mut conn = s.conn();
    // X's release gives a the turn, asking it to yield (3 strangers listen); within the
    // yield, a single try of D takes the free lock and releases it: the turn goes to C.
    let started = Instant::now();
    let mut p = redis::pipe();
    p.atomic();
    release(&mut p, name, &x_field, "x1", window.as_millis() as u64);
    take_try(&mut p, name, &format!("{D}:1"));
    release(
        &mut p,
        name,
        &format!("{D}:1"),
        "d1",
        window.as_millis() as u64,
    );
    let replies: Vec<redis::Value> = p.query(&mut conn).unwrap();
    assert_eq!(
        replies[0],
        redis::Value::Int(1),
        "setup: X's release published"
    );
    let turn: Option<String> = s.cmd(&["GET", &turn_key(name)]);
    assert_eq!(turn.as_deref(), Some(C), "setup: the turn went on to C");
    // C and E take their turns one after another, each joining the line again before
    // its release (as a client with waiters of its own does): every release gives the
    // turn to the first in line.
    let deadline = started + Duration::from_secs(3);
    let mut cycles = 0u32;
    let mut got = None;
    while Instant::now() < deadline {
        if waiter.is_finished() {
            got = Some(waiter.await.unwrap());
            break;
        }
        let (holder, next) = if cycles.is_multiple_of(2) {
            (C, E)
        } else {
            (E, C)
        };
        let field = format!("{holder}:1");
        let mut p = redis::pipe();
        p.atomic();
        take_waiting(&mut p, name, &field);
        join_line(&mut p, name, next);
        release(
            &mut p,
            name,
            &field,
            &format!("c{cycles}"),
            window.as_millis() as u64,
        );
        let _: Vec<redis::Value> = p.query(&mut conn).unwrap();
        cycles += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Some(at) = got else {
        panic!(
            "the waiter of the client whose turn it was slept {:?} while the others took \
             {cycles} turns; line now {:?}, a's id {}",
            started.elapsed(),
            line(&s, name),
            a.id()
        );
    };
    let waited = at - started;
    eprintln!("a's waiter took the lock {waited:?} after its voided yield, {cycles} cycles");
    assert!(
        waited < Duration::from_secs(1),
        "the waiter took the lock only after {waited:?}"
    );
}

/// Finding 2: the release's count of subscribers counted the releasing client as one
/// whenever it was not in line, as if it listened on the channel. A client that took the
/// lock without waiting (a first `lock()` that found it free, or a `try_lock`) and has no
/// waiter of its own does not: a Redisson waiter, the only subscriber outside the line,
/// then went uncounted, and the turn's client took the lock at once instead of yielding
/// to it. Fixed: the client tells `release.lua` whether it listens (the window's sign).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_behind_a_holder_that_never_waited_is_yielded_to() {
    let s = RedisServer::start();
    let (a, b) = (
        Client::builder(s.url()).build().await.unwrap(),
        Client::builder(s.url()).build().await.unwrap(),
    );
    let name = "adv:yield-count";
    let channel = channel_name(name);
    let held = a.lock(name).try_lock().await.unwrap().expect("free");
    let waiter = tokio::spawn({
        let l = b.lock(name);
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    assert!(
        common::eventually(Duration::from_secs(5), || line(&s, name) == [b.id()]).await,
        "setup: b waits in line"
    );
    // b's waiter subscribes after its busy answer put it in line.
    assert!(
        common::eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await,
        "setup: only b's client listens"
    );
    // The stranger: a Redisson waiter's subscription, here the test's listener.
    let mut listener = strangers(&s, name, 1).pop().unwrap();
    held.unlock().await.unwrap();
    let mut pubsub = listener.as_pubsub();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let heard: String = pubsub.get_message().unwrap().get_payload().unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("b's waiter hangs")
        .unwrap();
    let plain: u64 = turn_message(b.id()).unwrap().parse().unwrap();
    assert_eq!(
        heard,
        (plain + (1 << 48)).to_string(),
        "a stranger listened (NUMSUB 2: b and it; the releasing client a never \
         subscribed), yet the turn message asked b for no yield ({plain} is a plain turn)"
    );
}

/// Application data at the line or the turn key, met by `take.lua` (a waiting call's
/// first send: the line when the lock is busy, the turn when it is free) and by
/// `release.lua` (a published release reads the line): each call answers a typed error
/// or goes on, never `Error::Redis`, a panic or a hang, and a release that refuses
/// leaves no hold behind it that nobody would give back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_at_the_line_or_turn_key_gets_a_typed_answer() {
    let s = RedisServer::start();
    let c = Client::builder(s.url()).build().await.unwrap();
    let other = Client::builder(s.url()).build().await.unwrap();
    let t = Duration::from_secs(5);
    let mut bad = Vec::new();
    let untyped = |e: &redis_rlock::Error| {
        matches!(
            e,
            redis_rlock::Error::Redis(_) | redis_rlock::Error::Timeout { .. }
        )
    };
    let foreign: [(&str, &[&str]); 3] = [
        ("text", &["SET", "K", "abc"]),
        ("hash", &["HSET", "K", "f", "1"]),
        ("zset", &["ZADD", "K", "1", "m"]),
    ];
    for (kind, make) in foreign {
        for (what, key_of) in [
            ("line", clients_key as fn(&str) -> String),
            ("turn", turn_key),
        ] {
            let name = format!("adv:foreign:{what}:{kind}");
            let key = key_of(&name);
            let mut cmd: Vec<&str> = make.to_vec();
            cmd[1] = &key;
            let _: () = s.cmd(&cmd);
            // A waiting call on a busy lock (take.lua joins the line).
            // (A string at the turn key, which has no TTL, used to hold every waiting
            // call off for ever: each try answered "another client's turn", PTTL -1.)
            let held = match tokio::time::timeout(t, other.lock(&name).lock()).await {
                Ok(Ok(g)) => g,
                Ok(Err(e)) => {
                    if untyped(&e) {
                        bad.push(format!("{what} {kind}: lock() on a free lock {e:?}"));
                    }
                    continue;
                }
                Err(_) => {
                    bad.push(format!("{what} {kind}: lock() on a free lock hangs"));
                    continue;
                }
            };
            let r = tokio::time::timeout(
                t,
                c.lock(&name).try_lock_for(Duration::from_millis(50), None),
            )
            .await;
            match r {
                Err(_) => bad.push(format!("{what} {kind}: busy wait hangs")),
                Ok(Err(e)) if untyped(&e) => bad.push(format!("{what} {kind}: busy {e:?}")),
                _ => {}
            }
            // The release of a lock whose line or turn key is foreign (release.lua).
            match tokio::time::timeout(t, held.unlock()).await {
                Err(_) => bad.push(format!("{what} {kind}: unlock hangs")),
                Ok(Err(e)) if untyped(&e) => bad.push(format!("{what} {kind}: unlock {e:?}")),
                Ok(Err(_)) => {
                    if s.cmd::<i64>(&["EXISTS", &name]) == 1 {
                        let ttl = s.cmd::<i64>(&["PTTL", &name]);
                        bad.push(format!(
                            "{what} {kind}: unlock refused, the hold stays (PTTL {ttl} ms)"
                        ));
                        let _: i64 = s.cmd(&["DEL", &name]);
                    }
                }
                Ok(Ok(())) => {}
            }
            // A waiting call on a free lock (take.lua reads the turn).
            let r = tokio::time::timeout(
                t,
                c.lock(&name).try_lock_for(Duration::from_millis(50), None),
            )
            .await;
            match r {
                Err(_) => bad.push(format!("{what} {kind}: free wait hangs")),
                Ok(Err(e)) if untyped(&e) => bad.push(format!("{what} {kind}: free {e:?}")),
                Ok(Ok(Some(g))) => g.unlock().await.unwrap_or_else(|e| {
                    bad.push(format!("{what} {kind}: unlock after free grant {e:?}"))
                }),
                _ => {}
            }
            let after: String = s.cmd(&["TYPE", &key]);
            let expected = match kind {
                "text" => "string",
                k => k,
            };
            if after != expected {
                bad.push(format!("{what} {kind}: the foreign key became a {after}"));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Foreign data at the line key while one client's tasks take the lock in turn: every
/// call succeeds or answers a typed error, and no hold is left behind. A waiter cannot
/// join such a line: its attempt answers `WrongType` (naming the lock rather than the
/// line key). Before published.lua's pcall every published unlock failed with
/// `WrongType` and left its hold for the lease. Before acquire.lua's pcall, a grant to a
/// client that believed itself in line wrote the hold, then failed on the line's `LREM`:
/// the call answered `WrongType` and its hold (count 1, PTTL 30 s, the watchdog lease)
/// was nobody's; one of the 40 rounds here ended so by round 2-23 in every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_at_the_line_key_during_hand_overs_strands_no_hold() {
    let s = RedisServer::start();
    let c = Client::builder(s.url()).build().await.unwrap();
    let started = Instant::now();
    for round in 0..40 {
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
        let name = format!("adv:foreign:handover:{round}");
        let _: () = s.cmd(&["SET", &clients_key(&name), "abc"]);
        let tasks: Vec<_> = (0..3)
            .map(|_| {
                let l = c.lock(&name);
                tokio::spawn(async move {
                    let mut errors = Vec::new();
                    for _ in 0..10 {
                        let g = match tokio::time::timeout(Duration::from_secs(5), l.lock()).await {
                            Ok(Ok(g)) => g,
                            // Typed: the waiter cannot join the line.
                            Ok(Err(redis_rlock::Error::WrongType { .. })) => continue,
                            Ok(Err(e)) => {
                                errors.push(format!("lock: {e:?}"));
                                continue;
                            }
                            Err(_) => {
                                errors.push("lock hangs".to_string());
                                break;
                            }
                        };
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if let Err(e) = g.unlock().await {
                            errors.push(format!("unlock: {e:?}"));
                        }
                    }
                    errors
                })
            })
            .collect();
        let mut errors: Vec<String> = Vec::new();
        for t in tasks {
            errors.extend(t.await.unwrap());
        }
        let left: i64 = s.cmd(&["EXISTS", &name]);
        let pttl: i64 = s.cmd(&["PTTL", &name]);
        let holds: Vec<String> = s.cmd(&["HGETALL", &name]);
        let after: String = s.cmd(&["TYPE", &clients_key(&name)]);
        assert!(
            errors.is_empty() && left == 0,
            "round {round}: errors {errors:?}; lock left held: {left} (PTTL {pttl} ms, \
             {holds:?}), client {}",
            c.id()
        );
        assert_eq!(after, "string", "the foreign key was changed");
    }
}

/// A hand-over whose terms read the line (`g`: give way to another client in line; `e`:
/// the run is over, hand over only if nobody else waits) over foreign data at the line's
/// key: the release goes on (handed over, or published), where a `WRONGTYPE` failed the
/// unlock and left the hold to run out with its lease.
#[test]
fn a_hand_over_reading_foreign_data_at_the_line_still_releases() {
    let s = RedisServer::start();
    let (a, b) = (
        "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa:1",
        "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa:2",
    );
    for (i, flags) in ["g", "e"].into_iter().enumerate() {
        let name = format!("adv:foreign-line:{flags}");
        let _: () = s.cmd(&["HSET", &name, a, "1"]);
        let _: () = s.cmd(&["PEXPIRE", &name, "30000"]);
        let _: () = s.cmd(&["SET", &clients_key(&name), "not a list"]);
        let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg(script_source("unlock.lua").unwrap())
            .arg(5)
            .arg(&name)
            .arg(channel_name(&name))
            .arg(format!("redisson_unlock_latch:{{{name}}}:r{i}"))
            .arg(clients_key(&name))
            .arg(turn_key(&name))
            .arg(0)
            .arg(a)
            .arg(10_000)
            .arg(1)
            .arg(b)
            .arg(30_000)
            .arg(10)
            .arg(flags)
            .query(&mut s.conn());
        let reply = reply.unwrap_or_else(|e| panic!("{flags}: the unlock failed: {e}"));
        assert!(
            matches!(&reply, redis::Value::Array(v) if v.first() == Some(&redis::Value::Int(2)))
                || reply == redis::Value::Int(1),
            "{flags}: {reply:?}"
        );
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", &name, a]),
            None,
            "{flags}: the releasing hold is gone"
        );
        assert_eq!(s.cmd::<String>(&["GET", &clients_key(&name)]), "not a list");
    }
}
