//! Turns under contention: clients of this crate share a contended lock fairly and
//! cheaply (shares, script calls per acquisition, a client's place kept while its tasks
//! alternate, a run of hand-overs that gives way to the line), and a turn given while a
//! subscriber outside the line listens (a Redisson waiter) yields to it first
//! (`docs/protocol.md` 2.6). Who lines up and who gets a turn: `tests/turns.rs`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::turns::client;
use common::RedisServer;
use redis_rlock::Client;

/// `per` tasks of each client take `name` in a loop for `run`, doing `work` under the
/// lock: the grants of each client and the longest wait.
async fn contend<W, F>(
    clients: &[Client],
    per: usize,
    name: &str,
    run: Duration,
    work: W,
) -> (Vec<u64>, Duration)
where
    W: Fn() -> F + Clone + Send + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let until = Instant::now() + run;
    let longest = Arc::new(AtomicU64::new(0));
    let counts: Vec<Arc<AtomicU64>> = clients.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        for _ in 0..per {
            let (lock, n, longest) = (c.lock(name), counts[i].clone(), longest.clone());
            let work = work.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    let asked = Instant::now();
                    let left = until.saturating_duration_since(asked);
                    let Ok(Some(g)) = lock.try_lock_for(left, None).await else {
                        break;
                    };
                    longest.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
                    n.fetch_add(1, Ordering::Relaxed);
                    work().await;
                    g.unlock().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .unwrap()
            .unwrap();
    }
    (
        counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        Duration::from_micros(longest.load(Ordering::Relaxed)),
    )
}

/// Four clients (as four service instances) of four tasks each on one lock held 1 ms.
async fn shares(s: &RedisServer, window: Duration) -> (Vec<u64>, Duration) {
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(s, window).await);
    }
    let hold = || tokio::time::sleep(Duration::from_millis(1));
    contend(&clients, 4, "tn:share", Duration::from_secs(3), hold).await
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_share_a_contended_lock_fairly() {
    let s = RedisServer::start();
    let (with, longest) = shares(&s, redis_rlock::DEFAULT_TURN_WINDOW).await;
    println!("FIGURE shares_with_turns {with:?} longest wait {longest:?}");
    let (without, longest_without) = shares(&s, Duration::ZERO).await;
    println!("FIGURE shares_without_turns {without:?} longest wait {longest_without:?}");
    let max = *with.iter().max().unwrap() as f64;
    let min = *with.iter().min().unwrap() as f64;
    assert!(min > 0.0 && max / min <= 1.5, "unfair shares {with:?}");
    assert!(longest < Duration::from_secs(1), "a wait of {longest:?}");
}

/// Four clients (four service instances) of two tasks each, each task in a loop of a
/// read-modify-write under the lock. While one task of a client holds the lock, the
/// other waits, and the holder's next call waits again at once: the client must stay
/// in line throughout. It did not when a grant to one of its waiters took it out of the
/// line while the other's first attempt, in flight, found it there (and so did not join):
/// the client then waited without a place until the line ran empty, 230-600 lock cycles.
#[tokio::test(flavor = "multi_thread")]
async fn clients_of_two_tasks_each_keep_their_place_in_line() {
    let s = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&s, redis_rlock::DEFAULT_TURN_WINDOW).await);
    }
    let conn = redis::Client::open(s.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let rmw = move || {
        let mut conn = conn.clone();
        async move {
            let v: Option<u64> = redis::cmd("GET")
                .arg("tn:rmw:n")
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: () = redis::cmd("SET")
                .arg("tn:rmw:n")
                .arg(v.unwrap_or(0) + 1)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    let started = Instant::now();
    let (per, longest) = contend(&clients, 2, "tn:rmw", Duration::from_secs(2), rmw).await;
    let total: u64 = per.iter().sum();
    let counter: u64 = s.cmd(&["GET", "tn:rmw:n"]);
    let cycle = started.elapsed().as_micros() as f64 / total as f64;
    let cycles = longest.as_micros() as f64 / cycle;
    println!("FIGURE two_task_clients {per:?} longest wait {cycles:.1} cycles");
    assert_eq!(counter, total, "lost updates");
    assert!(total > 100, "only {total} grants");
    assert!(
        cycles <= 150.0,
        "a wait of {cycles:.1} lock cycles ({per:?})"
    );
}

/// Eight clients of one task each (eight service instances) take one lock in turn,
/// with no hold and with a 1 ms hold. A release gives the turn to the next client in
/// line, and the waiters of the other clients keep sleeping: per acquisition Redis runs
/// the unlock, the releasing client's next attempt (answered busy) and the acquire of
/// the client whose turn it is (3.0; 9.5 without turns).
#[tokio::test(flavor = "multi_thread")]
async fn contended_clients_cost_few_script_calls_per_acquisition() {
    let s = RedisServer::start();
    let mut clients = Vec::new();
    let window = std::env::var("TW")
        .map(|v| Duration::from_millis(v.parse().unwrap()))
        .unwrap_or(redis_rlock::DEFAULT_TURN_WINDOW);
    for _ in 0..8 {
        clients.push(client(&s, window).await);
    }
    for hold in [Duration::ZERO, Duration::from_millis(1)] {
        let calls_before = s.calls("evalsha") + s.calls("eval");
        let acquired = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let until = started + Duration::from_secs(2);
        let mut tasks = Vec::new();
        for c in &clients {
            let (lock, acquired) = (c.lock("tn:calls"), acquired.clone());
            tasks.push(tokio::spawn(async move {
                let mut mine = 0u64;
                while Instant::now() < until && mine < 2_000 {
                    let left = until.saturating_duration_since(Instant::now());
                    let Ok(Some(g)) = lock.try_lock_for(left, None).await else {
                        break;
                    };
                    mine += 1;
                    acquired.fetch_add(1, Ordering::Relaxed);
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    g.unlock().await.unwrap();
                }
                mine
            }));
        }
        let mut per_client = Vec::new();
        for t in tasks {
            per_client.push(
                tokio::time::timeout(Duration::from_secs(30), t)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        let n = acquired.load(Ordering::Relaxed);
        let calls = s.calls("evalsha") + s.calls("eval") - calls_before;
        let per = calls as f64 / n as f64;
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let deferred: u64 = clients.iter().map(|c| c.stats().turns_deferred).sum();
        println!(
            "FIGURE script_calls_per_acquisition hold {hold:?}: {per:.2} ({calls} calls, {n} acquisitions, {rate:.0}/s, per client {per_client:?}, unlock messages deferred {deferred})"
        );
        assert!(n > 50, "only {n} acquisitions");
        assert!(per <= 4.0, "{per:.2} script calls per acquisition");
    }
}

/// A client whose tasks hand the lock to each other gives way, after a few hand-overs
/// in a row, to another client waiting in line: that client does not wait out the
/// whole run (256 hand-overs, or the client's hand-over window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_hand_overs_gives_way_to_another_client_in_line() {
    let s = RedisServer::start();
    let a = Client::builder(s.url())
        .handover_window(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let b = client(&s, redis_rlock::DEFAULT_TURN_WINDOW).await;
    let name = "tn:give";
    let grants = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (lock, grants, stop) = (a.lock(name), grants.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            // Bounded: the test stops it, or 20 s do.
            let until = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                let g = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
                grants.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.unlock().await.unwrap();
            }
        }));
    }
    while grants.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut behind = Vec::new();
    for _ in 0..5 {
        let before = grants.load(Ordering::Relaxed);
        let g = tokio::time::timeout(Duration::from_secs(5), b.lock(name).lock())
            .await
            .expect("b got the lock within 5 s")
            .unwrap();
        behind.push(grants.load(Ordering::Relaxed) - before);
        g.unlock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    // A few hand-overs before a gives way, and what was in flight when b asked.
    assert!(
        behind.iter().all(|&n| n <= 12),
        "grants of a while b waited, per round: {behind:?}"
    );
}

/// The messages a release publishes on `channel`, heard by one more subscriber.
fn release_heard(
    s: &RedisServer,
    name: &str,
    field: &str,
    strangers: usize,
    window: i64,
) -> Vec<String> {
    let channel = redis_rlock::protocol::channel_name(name);
    let mut listeners: Vec<redis::Connection> = (0..1 + strangers).map(|_| s.conn()).collect();
    for l in &mut listeners {
        redis::cmd("SUBSCRIBE").arg(&channel).exec(l).unwrap();
    }
    let src = redis_rlock::protocol::script_source("release.lua").unwrap();
    let released: i64 = redis::cmd("EVAL")
        .arg(src)
        .arg(5)
        .arg(name)
        .arg(&channel)
        .arg(format!("redisson_unlock_latch:{{{name}}}:r1"))
        .arg(redis_rlock::protocol::clients_key(name))
        .arg(redis_rlock::protocol::turn_key(name))
        .arg(field)
        .arg(1)
        .arg(0)
        .arg(10_000)
        .arg(window)
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(released, 1, "published");
    let mut pubsub = listeners[0].as_pubsub();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    (0..2)
        .map(|_| pubsub.get_message().unwrap().get_payload().unwrap())
        .collect()
}

/// Two client ids: `A` holds, `B` waits in line.
const A: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const B: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";

/// `name` held by client `holder`'s task 1 (its field returned), with `waiting` alone
/// in its line.
fn held_with_line(s: &RedisServer, name: &str, holder: &str, waiting: &str) -> String {
    let field = format!("{holder}:1");
    let _: () = s.cmd(&["HSET", name, &field, "1"]);
    let _: () = s.cmd(&["PEXPIRE", name, "10000"]);
    let line = redis_rlock::protocol::clients_key(name);
    let _: () = s.cmd(&["RPUSH", &line, waiting]);
    let _: () = s.cmd(&["PEXPIRE", &line, "10000"]);
    field
}

/// A release that gives a client the turn while the channel has a subscriber that is no
/// client in the line nor the releasing one (a Redisson waiter, which has no place in
/// the line) asks that client to let it try first: the turn message is 2^49 + n instead
/// of 2^48 + n. The subscriber counted as the turn's client is the test's listener.
#[test]
fn a_turn_given_while_a_stranger_listens_asks_its_client_to_yield() {
    let s = RedisServer::start();
    let (a, b) = (A, B);
    let turn: u64 = redis_rlock::protocol::turn_message(b)
        .unwrap()
        .parse()
        .unwrap();
    // (subscribers besides the turn's client, the window's sign: whether the releasing
    // client says it listens, the turn message expected)
    let cases = [
        (0, 10, turn),
        (1, 10, turn),
        (2, 10, turn + (1 << 48)),
        (0, -10, turn),
        (1, -10, turn + (1 << 48)),
    ];
    for (strangers, window, expected) in cases {
        let name = format!("yield:{strangers}:{window}");
        let field = held_with_line(&s, &name, a, b);
        // Known: b in line, and a (the releasing client, not in line) if it listens.
        let heard = release_heard(&s, &name, &field, strangers, window);
        assert_eq!(
            heard,
            [expected.to_string(), "0".to_string()],
            "{strangers} strangers, window {window}"
        );
        // A turn that yields first lasts 2 ms past the window.
        let longest = if expected == turn { 10 } else { 12 };
        let turn_ttl: i64 = s.cmd(&["PTTL", &redis_rlock::protocol::turn_key(&name)]);
        assert!(
            (1..=longest).contains(&turn_ttl),
            "the turn's window: {turn_ttl}"
        );
    }
}

/// `acquire.lua` as a waiting call of `field` sends it with turns on, its client in
/// line with no other waiter (`l`), and its answer.
fn acquire_in_line(s: &RedisServer, name: &str, field: &str, window: u64) -> redis::Value {
    let mut p = redis::pipe();
    acquire_cmd(&mut p, name, field, window);
    let (answer,): (redis::Value,) = p.query(&mut s.conn()).unwrap();
    answer
}

/// Adds the call of [`acquire_in_line`] to `p`.
fn acquire_cmd(p: &mut redis::Pipeline, name: &str, field: &str, window: u64) {
    p.cmd("EVAL")
        .arg(redis_rlock::protocol::script_source("acquire.lua").unwrap())
        .arg(4)
        .arg(name)
        .arg(format!("redisson_unlock_latch:{{{name}}}:a1"))
        .arg(redis_rlock::protocol::clients_key(name))
        .arg(redis_rlock::protocol::turn_key(name))
        .arg(30_000)
        .arg(field)
        .arg(10_000)
        .arg(window)
        .arg("fwl");
}

/// The yield is Redis's, not only the client's: an acquire of the client whose turn
/// yields first, sent within that first millisecond (its waiter woken by the end of the
/// turn before, or a new call, at the moment of the release, before the turn message
/// reached its client), is answered busy for what is left of it, while a Redisson waiter
/// woken by the same release takes the free lock. Without it, the turn's client took the
/// lock first in 2 of 4 of the longest waits of a Redisson `lock()` waiter against 2
/// clients x 2 tasks (17-19 ms; 9-14 ms with it, `redisson_peers`).
#[test]
fn a_turn_that_yields_first_is_refused_to_its_own_client_until_the_window_is_left() {
    let s = RedisServer::start();
    let (a, b) = (A, B);
    let window = 50;
    for (strangers, yields) in [(2, true), (0, false)] {
        let name = format!("yield-refused:{strangers}");
        let field = held_with_line(&s, &name, a, b);
        let turn_key = redis_rlock::protocol::turn_key(&name);
        let _ = release_heard(&s, &name, &field, strangers, window);
        let turn_ttl: i64 = s.cmd(&["PTTL", &turn_key]);
        // A yielding turn lasts YIELD_MS (2) past the window, read maybe in its first ms.
        let longest = if yields { window + 2 } else { window };
        assert!(turn_ttl <= longest, "the turn's length: {turn_ttl}");
        let answer = if yields {
            // The turn set afresh in one transaction with the acquire, which Redis runs
            // at one time: the release's first millisecond, which a take on another
            // connection would often miss.
            let mut p = redis::pipe();
            p.atomic()
                .cmd("PEXPIRE")
                .arg(&turn_key)
                .arg(window + 2)
                .ignore();
            acquire_cmd(&mut p, &name, &format!("{b}:1"), window as u64);
            let (answer,): (redis::Value,) = p.query(&mut s.conn()).unwrap();
            answer
        } else {
            acquire_in_line(&s, &name, &format!("{b}:1"), window as u64)
        };
        if !yields {
            // No stranger: the turn is the window, and its client takes the lock.
            assert_eq!(answer, redis::Value::Nil, "taken in its turn");
            continue;
        }
        let redis::Value::Array(items) = answer else {
            panic!("the turn's client was answered {answer:?} in the yield");
        };
        let left = match items.as_slice() {
            [redis::Value::Int(0), redis::Value::Int(left), redis::Value::Int(1)] => *left,
            other => panic!("answered {other:?}"),
        };
        assert!(
            (1..=2).contains(&left),
            "busy for the yield's rest: {left} ms"
        );
        // A Redisson waiter takes the free lock meanwhile.
        let redisson: Option<i64> = redis::Script::new(common::redisson_rlock::ACQUIRE)
            .key(&name)
            .arg(30_000)
            .arg("d1b0f1a4-7c2e-4b8a-9f3d-5e6a7b8c9d0e:7")
            .invoke(&mut s.conn())
            .unwrap();
        assert_eq!(redisson, None, "the Redisson waiter takes the lock");
        let _: () = s.cmd(&["DEL", &name]);
        // Once no more than the window is left, the turn is its client's.
        let _: () = s.cmd(&["PEXPIRE", &turn_key, &(window - 5).to_string()]);
        let answer = acquire_in_line(&s, &name, &format!("{b}:1"), window as u64);
        assert_eq!(answer, redis::Value::Nil, "taken once the yield is over");
    }
}
