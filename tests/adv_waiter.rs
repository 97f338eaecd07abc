//! Adversarial review of the waiter's shape (one `Waiting`, one `Drop`,
//! `src/shell/acquire/waiting.rs`): acquisitions cancelled at each await point of the
//! waiting flow, against a real redis-server. After each, Redis must show no hold of
//! nobody, no line entry of a client with nobody waiting, no key without a TTL (but the
//! fenced counter), and the next caller must get the lock promptly. With the drop
//! instrumented (not committed), the sweeps cancelled waiters in every phase: first
//! attempt, `sub.ready`, hold-back, later attempts, look, `settled`, asleep, offered,
//! and the leave after a wait ran out. Run: `cargo test --test adv_waiter -- --nocapture`

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{eventually, RedisServer};
use futures_util::StreamExt;
use redis_rlock::{protocol, Client, Error, Lock, LockGuard, OwnerId, DEFAULT_TURN_WINDOW};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn client(s: &RedisServer, turns: bool) -> Client {
    let window = if turns {
        DEFAULT_TURN_WINDOW
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

/// Polls `fut` for `d` (at least once); its output if it finished meanwhile.
async fn poll_for<F: Future + Unpin>(fut: &mut F, d: Duration) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = fut => Some(out),
        _ = tokio::time::sleep(d) => None,
    }
}

fn fields(s: &RedisServer, name: &str) -> Vec<String> {
    s.cmd(&["HKEYS", name])
}

fn line(s: &RedisServer, name: &str) -> Vec<String> {
    members(s, &protocol::clients_key(name))
}

/// The first three members of a list or sorted set (none for a missing key).
fn members(s: &RedisServer, key: &str) -> Vec<String> {
    const LIST: &str = "local t = redis.call('type', KEYS[1]).ok \
        if t == 'list' then return redis.call('lrange', KEYS[1], 0, 2) end \
        if t == 'zset' then return redis.call('zrange', KEYS[1], 0, 2) end return {}";
    s.cmd(&["EVAL", LIST, "1", key])
}

/// Waits up to `limit` for the lock hash to be gone, else fails with `what`; how long
/// that took.
async fn freed(s: &RedisServer, name: &str, limit: Duration, what: &str) -> Duration {
    let t = Instant::now();
    let gone = eventually(limit, || s.cmd::<i64>(&["EXISTS", name]) == 0).await;
    let (state, pttl) = (fields(s, name), s.cmd::<i64>(&["PTTL", name]));
    assert!(
        gone,
        "{what}: still held by {state:?} after {limit:?} (PTTL {pttl} ms)"
    );
    t.elapsed()
}

/// A fresh client's call of the lock `lock` makes gets it within 200 ms, and no key on
/// the server lacks a TTL but the fenced token counter (kept forever, as Redisson's
/// `RFencedLock` does).
async fn ends_clean(s: &RedisServer, lock: &dyn Fn(&Client) -> Lock) {
    let c = client(s, true).await;
    let (l, t) = (lock(&c), Instant::now());
    let g = l.try_lock_for(Duration::from_secs(1), None).await.unwrap();
    let (took, state) = (t.elapsed(), fields(s, l.name()));
    assert!(
        g.is_some() && took < ms(200),
        "the next caller got {} after {took:?}; hash {state:?}",
        g.is_some()
    );
    g.unwrap().unlock().await.unwrap();
    c.shutdown().await.unwrap();
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    let no_ttl: Vec<&String> = keys
        .iter()
        .filter(|k| !k.starts_with("redisson_lock_token") && s.cmd::<i64>(&["PTTL", k]) == -1)
        .collect();
    assert!(no_ttl.is_empty(), "keys without a TTL: {no_ttl:?}");
}

/// A hand-over delivered to a waiter that is then dropped unpolled (its grant arrived but
/// was never taken): the waiter's drop gives the hold back at once, published (a Redisson
/// waiter hears it), instead of leaving it held by nobody for the watchdog's 30 s.
/// Breaks if `Waiting`'s drop loses its queue part (`Waiter::leave`, `release_detached`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_never_taken_is_given_back_when_its_waiter_is_dropped() {
    let s = RedisServer::start();
    let a = client(&s, true).await;
    for round in 0..3 {
        // A name each: a run of hand-overs on one name may end with a published release.
        let name = &format!("adv:waiter:untaken:{round}");
        let holder = waiter(a.lock(name)).await.unwrap();
        let held_by = holder.holder_field().to_string();
        let redis = redis::Client::open(s.url()).unwrap();
        let mut pubsub = redis.get_async_pubsub().await.unwrap();
        pubsub
            .subscribe(protocol::channel_name(name))
            .await
            .unwrap();
        let mut heard = pubsub.on_message();
        let mut w = Box::pin(waiter(a.lock(name)));
        assert!(poll_for(&mut w, ms(150)).await.is_none());
        holder.unlock().await.unwrap();
        let now = fields(&s, name);
        assert!(
            now.len() == 1 && now[0] != held_by,
            "setup: no hand-over ({now:?})"
        );
        drop(w);
        let took = freed(&s, name, ms(2000), "a grant whose waiter was dropped").await;
        let zero = tokio::time::timeout(ms(1000), async {
            while let Some(m) = heard.next().await {
                if m.get_payload::<String>().unwrap() == "0" {
                    return;
                }
            }
        });
        assert!(
            zero.await.is_ok(),
            "round {round}: a Redisson waiter heard no release"
        );
        println!("round {round}: given back in {took:?}");
    }
    ends_clean(&s, &|c| c.lock("adv:waiter:untaken:2")).await;
}

/// The waiter is dropped while offered the lock (the unlock's reply not in yet, Redis
/// stopped): the unlock settles the offer and gives back the grant nobody waits for. The
/// unlock is polled to the end in one run and dropped mid-flight in the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_while_offered_leaves_nothing_held() {
    let s = RedisServer::start();
    s.load_lock_scripts();
    let a = client(&s, true).await;
    for drop_unlock in [false, true] {
        let name = &format!("adv:waiter:offered:{drop_unlock}");
        let holder = waiter(a.lock(name)).await.unwrap();
        let mut w = Box::pin(waiter(a.lock(name)));
        assert!(poll_for(&mut w, ms(150)).await.is_none());
        let scripts = s.calls("evalsha");
        s.signal("STOP");
        let mut u = Box::pin(holder.unlock());
        let early = poll_for(&mut u, ms(30)).await;
        // The waiter sees the offer and waits for its outcome.
        let w_early = poll_for(&mut w, ms(30)).await;
        drop(w);
        if drop_unlock {
            drop(u);
            s.signal("CONT");
        } else {
            s.signal("CONT");
            let r = tokio::time::timeout(ms(3000), &mut u).await;
            assert!(matches!(r, Ok(Ok(()))), "the unlock: {r:?}");
        }
        assert!(
            early.is_none() && w_early.is_none(),
            "setup: Redis answered"
        );
        let what = format!("drop_unlock {drop_unlock}: a waiter dropped while offered");
        let took = freed(&s, name, ms(2000), &what).await;
        // A hand-over and its give-back are two scripts; a published release is one.
        let sent = s.calls("evalsha") - scripts;
        assert!(sent >= 2, "{what}, setup: no hand-over ({sent} scripts)");
        println!("drop_unlock {drop_unlock}: freed in {took:?}");
    }
    ends_clean(&s, &|c| c.lock("adv:waiter:offered:true")).await;
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

/// The keys in which waiters of `kind` keep their places in Redis, the line included.
fn places(kind: &str, name: &str) -> Vec<String> {
    let mut keys = match kind {
        "fair" => vec![protocol::queue_key(name), protocol::timeout_key(name)],
        "rw" => vec![protocol::writer_key(name), protocol::reader_key(name)],
        _ => vec![],
    };
    keys.extend([protocol::read_turn_key(name), protocol::clients_key(name)]);
    keys
}

/// Waits up to `limit` for every place of `kind`'s waiters to be empty, else fails.
async fn places_empty(s: &RedisServer, kind: &str, name: &str, limit: Duration, what: &str) {
    let keys = places(kind, name);
    let empty = eventually(limit, || keys.iter().all(|k| members(s, k).is_empty())).await;
    let state: Vec<Vec<String>> = keys.iter().map(|k| members(s, k)).collect();
    assert!(empty, "{what}: after {limit:?}, {keys:?} hold {state:?}");
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
    for cut in [0u64, 1, 3, 20, 150] {
        let mut w = Box::pin(waiter(lock_of(&b, kind, name, 0)));
        assert!(poll_for(&mut w, ms(cut)).await.is_none());
        drop(w);
        let what = format!("{kind}: B's only waiter dropped after {cut} ms");
        places_empty(&s, kind, name, ms(300), &what).await;
    }
    // Last, B waits first and C behind it; B's waiter is dropped right after the release
    // that makes it next: C is served at once (plain: after B's turn, 10 ms, measured 12-14).
    let c = client(&s, true).await;
    let mut w = Box::pin(waiter(lock_of(&b, kind, name, 0)));
    assert!(poll_for(&mut w, ms(100)).await.is_none());
    let wc = tokio::spawn(waiter(lock_of(&c, kind, name, 0)));
    tokio::time::sleep(ms(100)).await;
    holder.unlock().await.unwrap();
    let t = Instant::now();
    drop(w);
    let (g, took) = (tokio::time::timeout(ms(10_000), wc).await, t.elapsed());
    let Ok(Ok(Ok(g))) = g else {
        panic!("{kind}: C after B's waiter left: {g:?}")
    };
    println!("{kind}: C served {took:?} after B's waiter left");
    assert!(took < ms(200), "{kind}: C served {took:?} after B left");
    g.unlock().await.unwrap();
    ends_clean(&s, &|c| lock_of(c, kind, name, 1)).await;
    ends_clean(&s, &|c| lock_of(c, kind, name, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_plain_fair_and_write_waiters_leave_their_places() {
    for kind in ["plain", "fair", "rw"] {
        dropped_waiters_leave(kind).await;
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
    let name = &format!("adv:waiter:sweep:{kind}:{turns}");
    let inside = Arc::new(AtomicI64::new(0));
    let (both, grants) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let until = Instant::now() + ms(4000);
    let mut tasks = Vec::new();
    for t in 0..6u64 {
        let lock = lock_of(&clients[(t / 2 % 2) as usize], kind, name, t);
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
                    // Cut at, or just after, the wait's own end (its leave).
                    1 => tokio::select! {
                        g = lock.try_lock_for(cut.saturating_sub(Duration::from_micros(i % 4 * 100)), None) =>
                            Some(g.map(|g| g.ok_or(Error::Closed)).and_then(|g| g)),
                        _ = tokio::time::sleep(cut) => None,
                    },
                    _ => {
                        let h = tokio::spawn(waiter(lock.clone()));
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
        let done = tokio::time::timeout(ms(20_000), t).await;
        done.expect("a sweep task hangs").unwrap();
    }
    let took = freed(&s, name, ms(2000), "after the sweep").await;
    let grants = grants.load(SeqCst);
    println!("{kind}, turns {turns}: {grants} grants, freed after {took:?}");
    assert!(grants > 10, "setup: only {grants} grants");
    assert_eq!(both.load(SeqCst), 0, "a writer inside with someone else");
    places_empty(&s, kind, name, ms(500), "after the sweep").await;
    ends_clean(&s, &|c| lock_of(c, kind, name, 0)).await;
    ends_clean(&s, &|c| lock_of(c, kind, name, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_cancel_sweeps_with_and_without_turns_leave_nothing_behind() {
    cancel_sweep("plain", true).await;
    cancel_sweep("plain", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_read_write_cancel_sweeps_leave_nothing_behind() {
    cancel_sweep("fair", true).await;
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
        tokio::time::sleep(ms(150)).await;
        let t = Instant::now();
        let down = tokio::time::timeout(ms(2000), c.shutdown()).await;
        down.expect("shutdown hangs").unwrap();
        for w in waits {
            let r = tokio::time::timeout(ms(1000), w).await;
            let r = r
                .expect("a wait outlives its client's shutdown by 1 s")
                .unwrap();
            assert!(r.is_err(), "a wait got the lock from a closed client");
        }
        println!("waits ended {:?} after the shutdown began", t.elapsed());
        let id = c.id().to_string();
        let out = eventually(ms(300), || !line(&s, name).contains(&id)).await;
        assert!(out, "the shut-down client is in line: {:?}", line(&s, name));
        if std::ptr::eq(c, &b) {
            assert_eq!(fields(&s, name), vec![held_by.clone()], "B's shutdown");
        } else {
            freed(&s, name, ms(1000), "A shut down").await;
        }
    }
    drop(holder);
    ends_clean(&s, &|c| c.lock(name)).await;
}

/// `try_lock` and `try_lock_for` that get no answer fail with the typed `Timeout` and the
/// `op` strings they had before the refactor; once Redis answers again, the acquires they
/// sent leave no hold and no line entry behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_single_tries_keep_their_errors_and_leave_nothing() {
    let s = RedisServer::start();
    let (response, name) = (ms(200), "adv:waiter:stalled");
    let a = Client::builder(s.url()).response_timeout(response);
    let a = a.build().await.unwrap();
    // Warm: scripts loaded, connection up.
    a.lock(name).lock().await.unwrap().unlock().await.unwrap();
    s.signal("STOP");
    let l = a.lock(name);
    let one = OwnerId::unique().run(l.try_lock()).await;
    let wait = OwnerId::unique().run(l.try_lock_for(ms(100), None)).await;
    s.signal("CONT");
    match one {
        Err(Error::Timeout { op, after }) => {
            assert_eq!((op, after), ("try_lock", response));
        }
        other => panic!("try_lock on a stalled Redis: {other:?}"),
    }
    match wait {
        Err(Error::Timeout { op, .. }) => assert_eq!(op, "try_lock_for: its wait ended first"),
        other => panic!("try_lock_for on a stalled Redis: {other:?}"),
    }
    freed(&s, name, ms(2000), "late acquires").await;
    places_empty(&s, "plain", name, ms(500), "calls that failed").await;
    ends_clean(&s, &|c| c.lock(name)).await;
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
        let task = async {
            let (mut f1, mut f2) = (Box::pin(l.lock()), Box::pin(l.lock()));
            assert!(poll_for(&mut f1, ms(100)).await.is_none());
            assert!(poll_for(&mut f2, ms(100)).await.is_none());
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
                let early = poll_for(&mut f3, ms(50)).await;
                drop(f3);
                s.signal("CONT");
                assert!(early.is_none(), "setup: a third call got through");
            }
            let t = Instant::now();
            let g = tokio::time::timeout(ms(2000), &mut f2).await;
            let took = t.elapsed();
            let Ok(Ok(g)) = g else {
                panic!("round {round}: the other future {g:?} after {took:?}");
            };
            let count: i64 = s.cmd(&["HGET", name, g.holder_field()]);
            assert_eq!(count, 1, "round {round}: hash {:?}", fields(s, name));
            let other = b.lock(name).try_lock().await.unwrap();
            assert!(other.is_none(), "round {round}: another client got in");
            tokio::time::sleep(ms(50)).await;
            assert_eq!(fields(s, name), vec![g.holder_field().to_string()]);
            g.unlock().await.unwrap();
            println!("round {round}: handed {handed:?}; the other took it in {took:?}");
        };
        OwnerId::unique().run(task).await;
        freed(s, name, ms(1000), &format!("round {round}")).await;
    }
    ends_clean(&s, &|c| c.lock("adv:waiter:joined:2")).await;
}

/// A grant delivered to a waiter that is not polled again until the grant's lease has
/// run out (the lock then taken by another client): the waiter does not take the stale
/// grant for a hold, nor does its give-back touch the new holder; it gets the lock
/// after that holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_taken_up_after_its_lease_ran_out_is_not_a_hold() {
    let s = RedisServer::start();
    let (a, b) = (client(&s, true).await, client(&s, true).await);
    let name = "adv:waiter:late";
    let holder = waiter(a.lock(name)).await.unwrap();
    let (l, lease) = (a.lock(name), ms(300));
    let mut w = Box::pin(OwnerId::unique().run(async move { l.lock_with_lease(lease).await }));
    assert!(poll_for(&mut w, ms(150)).await.is_none());
    holder.unlock().await.unwrap();
    let handed = fields(&s, name);
    tokio::time::sleep(lease + ms(150)).await;
    let gb = b.lock(name).try_lock().await.unwrap();
    let gb = gb.unwrap_or_else(|| panic!("setup: the grant {handed:?} outlived its lease"));
    let early = poll_for(&mut w, ms(100)).await;
    assert!(
        early.is_none(),
        "the waiter took a stale grant while B holds: {early:?}"
    );
    assert_eq!(fields(&s, name), vec![gb.holder_field().to_string()]);
    gb.unlock().await.unwrap();
    let got = tokio::time::timeout(ms(1000), &mut w).await;
    let Ok(Ok(got)) = got else {
        panic!("after B's unlock: {got:?}");
    };
    got.unlock().await.unwrap();
    freed(&s, name, ms(1000), "after the waiter's unlock").await;
    ends_clean(&s, &|c| c.lock(name)).await;
}
