//! Adversarial review of the waiter's shape (one `Waiting`, one `Drop`,
//! `src/shell/acquire/waiting.rs`): acquisitions cancelled at each await point of the
//! waiting flow, against a real redis-server. After each, Redis must show no hold of
//! nobody, no line entry of a client with nobody waiting, no key without a TTL (but the
//! fenced counter), and the next caller must get the lock promptly.
//!
//! Run: `cargo test --test adv_waiter -- --nocapture`

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{eventually, RedisServer};
use redis_rlock::{protocol, Client, Error, Lock, LockGuard, OwnerId};

async fn client(s: &RedisServer, turns: bool) -> Client {
    let window = if turns {
        redis_rlock::DEFAULT_TURN_WINDOW
    } else {
        Duration::ZERO
    };
    Client::builder(s.url())
        .turn_window(window)
        .build()
        .await
        .unwrap()
}

/// A `lock()` call of a fresh owner, owning its handle.
fn waiter(l: Lock) -> impl Future<Output = redis_rlock::Result<LockGuard>> + Send + 'static {
    OwnerId::unique().run(async move { l.lock().await })
}

/// Polls `fut` for `d`; its output if it finished meanwhile.
async fn poll_for<F: Future + Unpin>(fut: &mut F, d: Duration) -> Option<F::Output> {
    tokio::select! {
        out = fut => Some(out),
        _ = tokio::time::sleep(d) => None,
    }
}

fn fields(s: &RedisServer, name: &str) -> Vec<String> {
    s.cmd(&["HKEYS", name])
}

fn line(s: &RedisServer, name: &str) -> Vec<String> {
    s.cmd(&["LRANGE", &protocol::clients_key(name), "0", "-1"])
}

/// Waits up to `limit` for the lock hash to be gone; how long that took, if it did.
async fn freed_within(s: &RedisServer, name: &str, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    eventually(limit, || s.cmd::<i64>(&["EXISTS", name]) == 0)
        .await
        .then(|| t.elapsed())
}

/// Keys on the server without a TTL, but the fenced token counter (kept forever, as
/// Redisson's `RFencedLock` does).
fn keys_without_ttl(s: &RedisServer) -> Vec<String> {
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    keys.into_iter()
        .filter(|k| !k.starts_with("redisson_lock_token"))
        .filter(|k| s.cmd::<i64>(&["PTTL", k]) == -1)
        .collect()
}

/// The members of a list or sorted set (none for a missing key).
fn members(s: &RedisServer, key: &str) -> Vec<String> {
    const LIST: &str = "local t = redis.call('type', KEYS[1]).ok \
        if t == 'list' then return redis.call('lrange', KEYS[1], 0, -1) end \
        if t == 'zset' then return redis.call('zrange', KEYS[1], 0, -1) end return {}";
    s.cmd(&["EVAL", LIST, "1", key])
}

/// A fresh client's call of the lock `lock` makes gets it within 200 ms.
async fn next_is_prompt(s: &RedisServer, lock: &dyn Fn(&Client) -> Lock) {
    let c = client(s, true).await;
    let l = lock(&c);
    let t = Instant::now();
    let g = l.try_lock_for(Duration::from_secs(1), None).await.unwrap();
    let (took, state) = (t.elapsed(), fields(s, l.name()));
    assert!(
        g.is_some() && took < Duration::from_millis(200),
        "the next caller got {} after {took:?}; hash {state:?}",
        g.is_some()
    );
    g.unwrap().unlock().await.unwrap();
    c.shutdown().await.unwrap();
}

/// A hand-over delivered to a waiter that is then dropped unpolled (its grant arrived but
/// was never taken): the waiter's drop gives the hold back at once, instead of leaving it
/// held by nobody for the watchdog's 30 s. Breaks if `Waiting`'s drop loses its queue
/// part (`Waiter::leave` and `release_detached`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_never_taken_is_given_back_when_its_waiter_is_dropped() {
    let s = RedisServer::start();
    let a = client(&s, true).await;
    for round in 0..3 {
        // A name each: a run of hand-overs on one name may end with a published release.
        let name = &format!("adv:waiter:untaken:{round}");
        let holder = waiter(a.lock(name)).await.unwrap();
        let held_by = holder.holder_field().to_string();
        let mut w = Box::pin(waiter(a.lock(name)));
        assert!(poll_for(&mut w, Duration::from_millis(150)).await.is_none());
        holder.unlock().await.unwrap();
        let now = fields(&s, name);
        assert!(
            now.len() == 1 && now[0] != held_by,
            "round {round}, setup: the unlock handed nothing over ({now:?})"
        );
        drop(w);
        let freed = freed_within(&s, name, Duration::from_secs(2)).await;
        let pttl: i64 = s.cmd(&["PTTL", name]);
        assert!(
            freed.is_some(),
            "round {round}: a grant nobody took still holds {:?} 2 s after its waiter was dropped (PTTL {pttl} ms)",
            fields(&s, name)
        );
        println!("round {round}: given back in {:?}", freed.unwrap());
    }
    next_is_prompt(&s, &|c| c.lock("adv:waiter:untaken:2")).await;
    assert_eq!(keys_without_ttl(&s), Vec::<String>::new());
}

/// The waiter is dropped while offered the lock (the unlock's reply not in yet, Redis
/// stopped): the unlock settles the offer and gives back the grant nobody waits for. The
/// unlock is polled to the end in one run and dropped mid-flight in the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_while_offered_leaves_nothing_held() {
    let s = RedisServer::start();
    s.load_lock_scripts();
    let a = Client::builder(s.url())
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    for drop_unlock in [false, true] {
        let name = &format!("adv:waiter:offered:{drop_unlock}");
        let holder = waiter(a.lock(name)).await.unwrap();
        let mut w = Box::pin(waiter(a.lock(name)));
        assert!(poll_for(&mut w, Duration::from_millis(150)).await.is_none());
        let scripts = s.calls("evalsha");
        s.signal("STOP");
        let mut u = Box::pin(holder.unlock());
        let early = poll_for(&mut u, Duration::from_millis(30)).await;
        // The waiter sees the offer and waits for its outcome.
        let w_early = poll_for(&mut w, Duration::from_millis(30)).await;
        drop(w);
        if drop_unlock {
            drop(u);
            s.signal("CONT");
        } else {
            s.signal("CONT");
            let r = tokio::time::timeout(Duration::from_secs(3), &mut u).await;
            assert!(matches!(r, Ok(Ok(()))), "the unlock: {r:?}");
        }
        assert!(
            early.is_none() && w_early.is_none(),
            "setup: Redis answered while stopped"
        );
        let freed = freed_within(&s, name, Duration::from_secs(2)).await;
        assert!(
            freed.is_some(),
            "drop_unlock {drop_unlock}: the lock is still held by {:?} 2 s after the offered waiter left",
            fields(&s, name)
        );
        // A hand-over and its give-back are two scripts; a published release is one.
        let sent = s.calls("evalsha") - scripts;
        assert!(
            sent >= 2,
            "drop_unlock {drop_unlock}, setup: no hand-over ({sent} scripts)"
        );
        println!("drop_unlock {drop_unlock}: freed in {:?}", freed.unwrap());
    }
    next_is_prompt(&s, &|c| c.lock("adv:waiter:offered:true")).await;
    assert_eq!(keys_without_ttl(&s), Vec::<String>::new());
}

/// A waiter of client B, cut short before its first reply or asleep behind A's hold, is
/// dropped: B leaves the lock's line at once (turns on), a fair waiter its place in the
/// queue, a writer its mark (they share `Waiting` and `InLine`). Breaks if `Waiting`'s
/// drop loses its line part (`InLine::leave_detached`).
async fn dropped_waiters_leave(kind: &str) {
    let s = RedisServer::start();
    let (a, b) = (client(&s, true).await, client(&s, true).await);
    let name = &format!("adv:waiter:leave:{kind}");
    let holder = waiter(lock_of(&a, kind, name, 0)).await.unwrap();
    let mut keys = places(kind, name);
    keys.push(protocol::clients_key(name));
    for cut in [0u64, 1, 3, 20, 150] {
        let mut w = Box::pin(waiter(lock_of(&b, kind, name, 0)));
        assert!(poll_for(&mut w, Duration::from_millis(cut)).await.is_none());
        drop(w);
        let gone = eventually(Duration::from_millis(300), || {
            keys.iter().all(|k| members(&s, k).is_empty())
        })
        .await;
        let state: Vec<Vec<String>> = keys.iter().map(|k| members(&s, k)).collect();
        assert!(
            gone,
            "{kind}, cut {cut} ms: 300 ms after B's only waiter was dropped: {keys:?} hold {state:?}"
        );
    }
    holder.unlock().await.unwrap();
    for t in 0..2 {
        let lock = |c: &Client| lock_of(c, kind, name, t);
        next_is_prompt(&s, &lock).await;
    }
    assert_eq!(keys_without_ttl(&s), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_plain_waiter_takes_its_client_out_of_the_line() {
    dropped_waiters_leave("plain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_fair_waiter_leaves_the_queue() {
    dropped_waiters_leave("fair").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_writer_clears_its_mark() {
    dropped_waiters_leave("rw").await;
}

/// The lock of `kind` ("plain", "fair", or "rw": even tasks write, odd ones read).
fn lock_of(c: &Client, kind: &str, name: &str, t: u64) -> Lock {
    match (kind, t % 2) {
        ("fair", _) => c.fair_lock(name),
        ("rw", 0) => c.read_write_lock(name).write(),
        ("rw", _) => c.read_write_lock(name).read(),
        _ => c.lock(name),
    }
}

/// The keys in which waiters of `kind` keep their places (besides the line).
fn places(kind: &str, name: &str) -> Vec<String> {
    match kind {
        "fair" => vec![protocol::queue_key(name), protocol::timeout_key(name)],
        "rw" => vec![
            protocol::writer_key(name),
            protocol::reader_key(name),
            protocol::read_turn_key(name),
        ],
        _ => vec![],
    }
}

/// Many tasks of two clients take and cancel `lock()`/`try_lock_for` at varied points
/// (`timeout`, `select!`, `JoinHandle::abort`), turns on or off. Afterwards: the lock
/// free, the line and the waiters' places empty, every key with a TTL, the next caller
/// served at once, and never a writer inside with anyone else.
async fn cancel_sweep(kind: &'static str, turns: bool) {
    use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
    use std::sync::Arc;
    let s = RedisServer::start();
    let clients = [client(&s, turns).await, client(&s, turns).await];
    let name = format!("adv:waiter:sweep:{kind}:{turns}");
    let inside = Arc::new(AtomicI64::new(0));
    let (both, grants) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let until = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for t in 0..6u64 {
        let lock = lock_of(&clients[(t / 2 % 2) as usize], kind, &name, t);
        // A writer counts 1000, a reader 1: a writer enters only where nobody is.
        let weight = if kind == "rw" && t % 2 == 1 { 1 } else { 1000 };
        let (inside, both, grants) = (inside.clone(), both.clone(), grants.clone());
        tasks.push(tokio::spawn(OwnerId::unique().run(async move {
            for i in 0..400u64 {
                if Instant::now() > until {
                    break;
                }
                let cut = Duration::from_micros((i * 7919 + t * 3571) % 4_000);
                let got = match (i + t) % 3 {
                    0 => tokio::time::timeout(cut, lock.lock()).await.ok(),
                    1 => tokio::select! {
                        g = lock.try_lock_for(Duration::from_millis(30), None) =>
                            Some(g.map(|g| g.ok_or(Error::Closed)).and_then(|g| g)),
                        _ = tokio::time::sleep(cut) => None,
                    },
                    _ => {
                        let l = lock.clone();
                        let h = tokio::spawn(
                            OwnerId::unique().run(async move { l.lock().await.map(drop) }),
                        );
                        tokio::time::sleep(cut).await;
                        h.abort();
                        let _ = h.await;
                        None
                    }
                };
                if let Some(Ok(g)) = got {
                    grants.fetch_add(1, SeqCst);
                    let before = inside.fetch_add(weight, SeqCst);
                    if (weight == 1000 && before != 0) || before >= 1000 {
                        both.fetch_add(1, SeqCst);
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    inside.fetch_sub(weight, SeqCst);
                    if i % 2 == 0 {
                        let _ = g.unlock().await;
                    }
                }
            }
        })));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a sweep task hangs")
            .unwrap();
    }
    let freed = freed_within(&s, &name, Duration::from_secs(2)).await;
    let grants = grants.load(SeqCst);
    println!("{kind}, turns {turns}: {grants} grants, freed after {freed:?}");
    assert!(grants > 10, "setup: only {grants} grants");
    assert_eq!(both.load(SeqCst), 0, "a writer inside with someone else");
    assert!(freed.is_some(), "still held by {:?}", fields(&s, &name));
    let out = eventually(Duration::from_millis(500), || line(&s, &name).is_empty()).await;
    assert!(
        out,
        "the line names clients nobody waits in: {:?}",
        line(&s, &name)
    );
    let left = places(kind, &name);
    let gone = eventually(Duration::from_millis(500), || {
        left.iter().all(|k| members(&s, k).is_empty())
    })
    .await;
    let state: Vec<Vec<String>> = left.iter().map(|k| members(&s, k)).collect();
    assert!(gone, "waiters' places left: {state:?}");
    assert_eq!(keys_without_ttl(&s), Vec::<String>::new());
    for t in 0..2 {
        let lock = |c: &Client| lock_of(c, kind, &name, t);
        next_is_prompt(&s, &lock).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sweep_with_turns_leaves_nothing_behind() {
    cancel_sweep("plain", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sweep_without_turns_leaves_nothing_behind() {
    cancel_sweep("plain", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_cancel_sweep_leaves_nothing_behind() {
    cancel_sweep("fair", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_cancel_sweep_leaves_nothing_behind() {
    cancel_sweep("rw", true).await;
}

/// A client shut down while its tasks wait: every wait ends with an error at once, the
/// client leaves the line, and it holds nothing. Its waiters queued behind its own holder
/// (hand-over queue) end too, and the holder's hold goes with the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_during_waits_ends_them_and_leaves_nothing() {
    let s = RedisServer::start();
    let (a, b) = (client(&s, true).await, client(&s, true).await);
    let name = "adv:waiter:shutdown";
    let holder = waiter(a.lock(name)).await.unwrap();
    let held_by = holder.holder_field().to_string();
    for c in [&b, &a] {
        let waits: Vec<_> = (0..3).map(|_| tokio::spawn(waiter(c.lock(name)))).collect();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let t = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), c.shutdown())
            .await
            .expect("shutdown hangs")
            .unwrap();
        for w in waits {
            let r = tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .expect("a wait outlives its client's shutdown by 1 s")
                .unwrap();
            assert!(r.is_err(), "a wait got the lock from a closed client");
        }
        println!("waits ended {:?} after the shutdown began", t.elapsed());
        let gone = eventually(Duration::from_millis(300), || {
            !line(&s, name).contains(&c.id().to_string())
        })
        .await;
        assert!(
            gone,
            "the shut-down client is still in line: {:?}",
            line(&s, name)
        );
        let now = fields(&s, name);
        if std::ptr::eq(c, &b) {
            assert_eq!(
                now,
                vec![held_by.clone()],
                "B's shutdown changed the holders"
            );
        } else {
            let freed = freed_within(&s, name, Duration::from_secs(1)).await;
            assert!(freed.is_some(), "A shut down; still held by {now:?}");
        }
    }
    drop(holder);
    next_is_prompt(&s, &|c| c.lock(name)).await;
    assert_eq!(keys_without_ttl(&s), Vec::<String>::new());
}

/// `try_lock` and `try_lock_for` that get no answer fail with the typed `Timeout` and the
/// `op` strings they had before the refactor; once Redis answers again, the acquires they
/// sent leave no hold and no line entry behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_single_tries_keep_their_errors_and_leave_nothing() {
    let s = RedisServer::start();
    let response = Duration::from_millis(200);
    let a = Client::builder(s.url())
        .response_timeout(response)
        .build()
        .await
        .unwrap();
    let name = "adv:waiter:stalled";
    // Warm: scripts loaded, connection up.
    a.lock(name).lock().await.unwrap().unlock().await.unwrap();
    s.signal("STOP");
    let one = OwnerId::unique().run(a.lock(name).try_lock()).await;
    let wait = OwnerId::unique()
        .run(a.lock(name).try_lock_for(Duration::from_millis(100), None))
        .await;
    s.signal("CONT");
    match one {
        Err(Error::Timeout { op, after }) => {
            assert_eq!(op, "try_lock");
            assert_eq!(after, response);
        }
        other => panic!("try_lock on a stalled Redis: {other:?}"),
    }
    match wait {
        Err(Error::Timeout { op, .. }) => assert_eq!(op, "try_lock_for: its wait ended first"),
        other => panic!("try_lock_for on a stalled Redis: {other:?}"),
    }
    let freed = freed_within(&s, name, Duration::from_secs(2)).await;
    assert!(
        freed.is_some(),
        "late acquires left {:?} held",
        fields(&s, name)
    );
    let out = eventually(Duration::from_millis(500), || line(&s, name).is_empty()).await;
    assert!(
        out,
        "a call that failed left its client in line: {:?}",
        line(&s, name)
    );
    next_is_prompt(&s, &|c| c.lock(name)).await;
    assert_eq!(keys_without_ttl(&s), Vec::<String>::new());
}

/// Two `lock()` futures of one task (one field) wait behind a holder of their client;
/// the one handed the lock is dropped before it takes it. The other gets the lock within
/// a bound, holds it alone (count 1, another client shut out), and its unlock frees it.
/// In the last round Redis is stopped while the untaken grant is given back, and a third
/// call of the field, which waits for that give-back (`Core::settled`) before it sleeps,
/// is cancelled meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_futures_of_one_task_survive_one_dropped_with_a_grant() {
    let s = RedisServer::start();
    let (a, b) = (client(&s, true).await, client(&s, true).await);
    for round in 0..3 {
        let name = &format!("adv:waiter:joined:{round}");
        let holder = waiter(a.lock(name)).await.unwrap();
        let (l, s) = (a.lock(name), &s);
        OwnerId::unique()
            .run(async {
                let mut f1 = Box::pin(l.lock());
                let mut f2 = Box::pin(l.lock());
                assert!(poll_for(&mut f1, Duration::from_millis(100))
                    .await
                    .is_none());
                assert!(poll_for(&mut f2, Duration::from_millis(100))
                    .await
                    .is_none());
                holder.unlock().await.unwrap();
                let handed = fields(s, name);
                assert_eq!(handed.len(), 1, "round {round}, setup: nothing handed over");
                let stalled = round == 2;
                if stalled {
                    s.signal("STOP");
                }
                drop(f1);
                if stalled {
                    let mut f3 = Box::pin(l.lock());
                    let early = poll_for(&mut f3, Duration::from_millis(50)).await;
                    drop(f3);
                    s.signal("CONT");
                    assert!(early.is_none(), "setup: a third call got through");
                }
                let t = Instant::now();
                let g = tokio::time::timeout(Duration::from_secs(2), &mut f2).await;
                let took = t.elapsed();
                let g = match g {
                    Ok(Ok(g)) => g,
                    other => panic!("round {round}: the other future {other:?} after {took:?}"),
                };
                let count: i64 = s.cmd(&["HGET", name, g.holder_field()]);
                assert_eq!(count, 1, "round {round}: hash {:?}", fields(s, name));
                let other = b.lock(name).try_lock().await.unwrap();
                assert!(other.is_none(), "round {round}: another client got in");
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert_eq!(fields(s, name), vec![g.holder_field().to_string()]);
                g.unlock().await.unwrap();
                println!("round {round}: handed {handed:?}; the other took it in {took:?}");
            })
            .await;
        let freed = freed_within(&s, name, Duration::from_secs(1)).await;
        assert!(
            freed.is_some(),
            "round {round}: still held by {:?}",
            fields(&s, name)
        );
    }
    assert_eq!(keys_without_ttl(&s), Vec::<String>::new());
}
