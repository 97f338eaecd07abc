//! adv8: adversarial review. Each test attacks one promise of the crate; a test that
//! reproduces a bug is `#[ignore]`d with the figures seen, so the suite stays green.

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::{Client, Error};

/// PTTL of every key in the server but `skip`, as (key, pttl).
fn pttls(s: &RedisServer, skip: &[&str]) -> Vec<(String, i64)> {
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    keys.into_iter()
        .filter(|k| !skip.contains(&k.as_str()))
        .map(|k| {
            let t: i64 = s.cmd(&["PTTL", &k]);
            (k, t)
        })
        .collect()
}

/// A lease at the documented limit (`MAX_DURATION`, 2^62 ms) or just under it is
/// accepted. A waiting call joins the line, whose TTL is twice the lease: 2^63 ms and
/// more, beyond what Redis' PEXPIRE takes.
async fn huge_lease_waiter_leaves_no_key_without_ttl(lease: Duration) {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    let b = Client::connect(s.url()).await.unwrap();
    let name = "adv8:huge";
    let g = a.lock(name).lock().await.unwrap();
    let waiter = b.lock(name);
    let res = tokio::time::timeout(
        Duration::from_millis(500),
        waiter.try_lock_for(Duration::from_millis(300), Some(lease)),
    )
    .await;
    eprintln!("lease {lease:?}: the waiting call gave {res:?}");
    eprintln!("keys while held: {:?}", pttls(&s, &[]));
    g.unlock().await.unwrap();
    let left = pttls(&s, &[]);
    eprintln!("keys left: {left:?}");
    for (k, t) in &left {
        assert!(
            *t != -1,
            "{k} has no TTL (lease {lease:?}); call gave {res:?}"
        );
    }
    // And the call itself: a typed input error, or a timeout, never a server error.
    match res {
        Ok(Ok(_)) | Err(_) | Ok(Err(Error::DurationOutOfRange { .. })) => {}
        Ok(Err(e)) => panic!("lease {lease:?}: a server error for an accepted lease: {e:?}"),
    }
}

// Finding 1. Seen on Redis 7.0.15: a lease of 2^62 - 1000 ms passes `check_lease`
// (`MAX_DURATION` is 2^62 ms), the first attempt finds the lock busy, and
// `try_lock_for(300 ms, Some(lease))` returns
// `Err(Redis(ResponseError: invalid expire time in 'pexpire' command script: ..., on
// @user_script:87.))` at once: `join_line` (lua/line.lua:15) sets the line's TTL to
// 2 * lease = 2^63 - 2000 ms (2^63 - 2048 as a Lua double), and PEXPIRE refuses a time
// past 2^63 - 1 ms since the epoch. Every lease above about 2^62 - 0.9e12 ms (half of
// i64::MAX minus now) fails the same way whenever the lock is busy; a client whose
// watchdog timeout is that long fails every contended `lock()`. At exactly 2^62 the
// double 2^63 formats with '%d' as i64::MIN, PEXPIRE then deletes the line, and the
// waiter silently stands in no line (the test below passes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_lease_just_under_the_limit_leaves_no_line_without_ttl() {
    huge_lease_waiter_leaves_no_key_without_ttl(Duration::from_millis((1 << 62) - 1000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_lease_at_the_limit_leaves_no_line_without_ttl() {
    huge_lease_waiter_leaves_no_key_without_ttl(Duration::from_millis(1 << 62)).await;
}

/// Odd names: braces that do or do not make a hash tag, glob characters (which must not
/// reach a pattern command), control bytes, the longest name and one byte more. For
/// each: a holder, a waiter of another client woken by its release, and a fair lock, a
/// read-write lock and a semaphore of the same name; every answer typed, every key left
/// with a TTL but Redisson's own counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_work_or_get_typed_errors_and_leave_no_key_without_ttl() {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    let b = Client::connect(s.url()).await.unwrap();
    let long = "n".repeat(redis_rlock::MAX_NAME_LEN);
    let too_long = "n".repeat(redis_rlock::MAX_NAME_LEN + 1);
    let names: Vec<&str> = vec![
        "{", "}", "{}", "a{", "{a", "}{", "a}b", "{}x", "a{b}c{d}", "*", "?", "[a-z]*", "\\",
        "a\0b", "é🔒", " ", "\n", "a:t", "{a}:t", &long,
    ];
    for name in names {
        let shown: String = name.chars().take(20).collect();
        let g = a
            .lock(name)
            .lock()
            .await
            .unwrap_or_else(|e| panic!("{shown:?}: {e:?}"));
        let waiter = b.lock(name);
        let w = tokio::spawn(async move {
            waiter
                .try_lock_for(Duration::from_secs(3), None)
                .await
                .map(|g| g.is_some())
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = std::time::Instant::now();
        g.unlock().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(4), w).await;
        assert!(
            matches!(got, Ok(Ok(Ok(true)))),
            "{shown:?}: the waiter gave {got:?}"
        );
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{shown:?}: woken after {:?}",
            t0.elapsed()
        );
        // b's hold is released when its guard was dropped in the task: wait for the key.
        let gone = common::eventually(Duration::from_secs(2), || {
            s.cmd::<i64>(&["EXISTS", name]) == 0
        })
        .await;
        assert!(gone, "{shown:?}: the lock stayed held");
        // The other kinds of the same name, one after the other.
        let f = a
            .fair_lock(name)
            .lock()
            .await
            .unwrap_or_else(|e| panic!("{shown:?}: {e:?}"));
        f.unlock().await.unwrap();
        let rw = a.read_write_lock(name);
        let r = rw
            .read()
            .lock()
            .await
            .unwrap_or_else(|e| panic!("{shown:?}: {e:?}"));
        r.unlock().await.unwrap();
        let wg = rw.write().lock().await.unwrap();
        wg.unlock().await.unwrap();
        let left = pttls(&s, &[]);
        for (k, t) in &left {
            assert!(
                *t != -1,
                "{shown:?}: {:?} has no TTL",
                k.chars().take(60).collect::<String>()
            );
        }
    }
    for bad in ["", too_long.as_str()] {
        let r = a.lock(bad).try_lock().await;
        assert!(
            matches!(r, Err(Error::EmptyName) | Err(Error::NameTooLong { .. })),
            "{:?}",
            r.map(|g| g.is_some())
        );
        let r = a.semaphore(bad).try_set_permits(1).await;
        assert!(
            matches!(r, Err(Error::EmptyName) | Err(Error::NameTooLong { .. })),
            "{r:?}"
        );
    }
}

/// Puts the server over its memory limit (`noeviction`): writes that may grow memory are
/// refused with `OOM`.
fn out_of_memory(s: &RedisServer) {
    let _: () = s.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: () = s.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let refused = s.try_cmd::<()>(&["SET", "probe", "x"]).unwrap_err();
    assert_eq!(refused.code(), Some("OOM"), "{refused}");
}

/// The kinds `tests/oom.rs` leaves out: a fenced lock, a fair lock, a read and a write
/// lock (with a waiter of the other half, so that marks and turns are in play), each
/// released out of memory while another client waits. The release must succeed and
/// free the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kinds_unlock_frees_the_lock_out_of_memory() {
    for kind in [
        "fenced",
        "fair",
        "write-with-reader",
        "read-with-writer",
        "fenced-own",
    ] {
        let s = RedisServer::start();
        let a = Client::connect(s.url()).await.unwrap();
        let b = Client::connect(s.url()).await.unwrap();
        let name = format!("adv8:oom:{kind}");
        let (holder, waiter) = match kind {
            "fenced" => (a.fenced_lock(&name), b.fenced_lock(&name)),
            "fenced-own" => (a.fenced_lock(&name), a.fenced_lock(&name)),
            "fair" => (a.fair_lock(&name), b.fair_lock(&name)),
            "write-with-reader" => (
                a.read_write_lock(&name).write(),
                b.read_write_lock(&name).read(),
            ),
            _ => (
                a.read_write_lock(&name).read(),
                b.read_write_lock(&name).write(),
            ),
        };
        let g = holder.lock().await.unwrap();
        let w = tokio::spawn(async move {
            let r = waiter.try_lock_for(Duration::from_secs(3), None).await;
            r.map(|g| g.is_some())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        out_of_memory(&s);
        let field = g.holder_field().to_string();
        let released = g.unlock().await;
        let left: std::collections::BTreeMap<String, String> = s.cmd(&["HGETALL", &name]);
        let _: () = s.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        let waited = tokio::time::timeout(Duration::from_secs(5), w).await;
        eprintln!("{kind}: unlock {released:?}, hash after {left:?}, waiter {waited:?}");
        assert!(released.is_ok(), "{kind}: the unlock failed: {released:?}");
        assert!(
            !left.keys().any(|k| k.starts_with(&field)),
            "{kind}: still held: {left:?}"
        );
    }
}

// Finding 2. Seen on Redis 7.0.15: with the server out of memory (`maxmemory 1`,
// `noeviction`) and a sound counter (`redisson_lock_token:{adv8:fence}` = "5"), a fenced
// `try_lock()` of the free lock returns `Err(BadTokenCounter { key:
// "redisson_lock_token:{adv8:fence}" })`, whose message says the counter is corrupt and
// tells the operator to fix or delete it; deleting it restarts tokens from 1, below
// tokens already issued. The cause is the OOM refusal of the INCR, which
// `lua/acquire.lua` (the `redis.pcall('incr', KEYS[5])` lines 78-81 and 134-137) reads as
// a bad counter; `unlock.lua`'s hand-over does the same, so a waiter of a fenced lock
// meets the same error (seen in `every_kinds_unlock_frees_the_lock_out_of_memory`:
// `fenced: ... waiter Ok(Ok(Err(BadTokenCounter { .. })))`). An ACL that denies INCR
// would read the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_incr_of_a_sound_counter_is_not_reported_as_a_corrupt_counter() {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    let _: () = s.cmd(&["SET", "redisson_lock_token:{adv8:fence}", "5"]);
    out_of_memory(&s);
    let r = a.fenced_lock("adv8:fence").try_lock().await;
    let _: () = s.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    let counter: String = s.cmd(&["GET", "redisson_lock_token:{adv8:fence}"]);
    eprintln!(
        "fenced try_lock out of memory: {:?}; counter {counter}",
        r.as_ref().map(|g| g.is_some())
    );
    assert_eq!(counter, "5");
    assert!(
        !matches!(r, Err(Error::BadTokenCounter { .. })),
        "a sound counter reported corrupt: {:?}",
        r.map(|g| g.is_some())
    );
}

/// Cancellation of the kinds `tests/cancel_churn.rs` leaves out: a waiter of client B is
/// aborted at 0-4 ms after the holder of client A lets go (so some aborts land while
/// B's grant is in flight), 40 rounds per kind; then A must get the whole thing back,
/// and no key may be left without a TTL (the semaphores' count keys are Redisson's and
/// have none by design).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_of_rw_and_semaphores_leave_nothing_taken() {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    let b = Client::connect(s.url()).await.unwrap();
    let (sem_a, sem_b) = (a.semaphore("adv8:sem"), b.semaphore("adv8:sem"));
    assert!(sem_a.try_set_permits(1).await.unwrap());
    let (per_a, per_b) = (
        a.permit_expirable_semaphore("adv8:per"),
        b.permit_expirable_semaphore("adv8:per"),
    );
    assert!(per_a.try_set_permits(1).await.unwrap());
    for kind in [
        "write/write",
        "write/read",
        "read/write",
        "semaphore",
        "permits",
    ] {
        for i in 0..40u64 {
            let rw_a = a.read_write_lock("adv8:rw");
            let rw_b = b.read_write_lock("adv8:rw");
            let (sem_b, per_b) = (sem_b.clone(), per_b.clone());
            // A takes the thing.
            let mut held_lock = None;
            let mut held_permit = None;
            match kind {
                "write/write" | "write/read" => {
                    held_lock = Some(rw_a.write().lock().await.unwrap())
                }
                "read/write" => held_lock = Some(rw_a.read().lock().await.unwrap()),
                "semaphore" => sem_a.acquire(1).await.unwrap(),
                _ => held_permit = Some(per_a.acquire(Duration::from_secs(5)).await.unwrap()),
            }
            let kind2 = kind.to_string();
            // Whether B ended holding semaphore permits (then given back below).
            let w = tokio::spawn(async move {
                match kind2.as_str() {
                    "write/write" | "read/write" => drop(rw_b.write().lock().await),
                    "write/read" => drop(rw_b.read().lock().await),
                    "semaphore" => return sem_b.acquire(1).await.is_ok(),
                    // A guard: dropping it gives the permit back.
                    _ => drop(per_b.acquire_permit().await),
                }
                false
            });
            tokio::time::sleep(Duration::from_millis(5 + i % 7)).await;
            match kind {
                "semaphore" => sem_a.release(1).await.unwrap(),
                "permits" => {
                    let p = held_permit.take().unwrap();
                    per_a.release(p.id()).await.unwrap()
                }
                _ => held_lock.take().unwrap().unlock().await.unwrap(),
            }
            tokio::time::sleep(Duration::from_millis(i % 5)).await;
            w.abort();
            if let Ok(true) = w.await {
                sem_a.release(1).await.unwrap();
            }
        }
        // Everything back: A takes it within 2 s.
        let t0 = std::time::Instant::now();
        let mut back_id = None;
        let back = match kind {
            "semaphore" => sem_a
                .try_acquire_for(1, Duration::from_secs(2))
                .await
                .unwrap()
                .then_some(()),
            "permits" => per_a
                .try_acquire(Duration::from_secs(5), Duration::from_secs(2))
                .await
                .unwrap()
                .map(|p| back_id = Some(p.id().to_string())),
            _ => a
                .read_write_lock("adv8:rw")
                .write()
                .try_lock_for(Duration::from_secs(2), None)
                .await
                .unwrap()
                .map(drop),
        };
        eprintln!("{kind}: taken back after {:?}", t0.elapsed());
        assert!(
            back.is_some(),
            "{kind}: something stayed taken; keys {:?}",
            pttls(&s, &[])
        );
        if kind == "semaphore" {
            sem_a.release(1).await.unwrap();
        }
        if let (Some(id), "permits") = (&back_id, kind) {
            per_a.release(id).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (k, t) in pttls(&s, &["adv8:sem", "adv8:per"]) {
            assert!(t != -1, "{kind}: {k} has no TTL");
        }
    }
    let sem: i64 = s.cmd(&["GET", "adv8:sem"]);
    let per: i64 = s.cmd(&["GET", "adv8:per"]);
    assert_eq!((sem, per), (1, 1), "permits lost or made");
}

// Finding 1 through the client's setting: `watchdog_timeout((2^62 - 1000) ms)` is
// accepted by `build()`, and every `lock()` that finds the lock busy fails at once with
// the same raw PEXPIRE error (seen: `Err(Redis(ResponseError: invalid expire time in
// 'pexpire' command script: ...))`), since its line TTL is twice the watchdog lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_timeout_just_under_the_limit_lets_a_contended_lock_wait() {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    let b = Client::builder(s.url())
        .watchdog_timeout(Duration::from_millis((1 << 62) - 1000))
        .build()
        .await
        .unwrap();
    let g = a.lock("adv8:wd").lock().await.unwrap();
    let waiter = b.lock("adv8:wd");
    let w = tokio::spawn(async move { waiter.lock().await.map(drop) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let early = w.is_finished();
    g.unlock().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), w).await;
    eprintln!("waiter ended before the release: {early}; gave {got:?}");
    assert!(matches!(got, Ok(Ok(Ok(())))), "{got:?}");
}

/// Bad input battery: every answer within 2 s, none a panic; printed for the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_battery() {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    let t = Duration::from_secs(2);
    macro_rules! probe {
        ($what:expr, $fut:expr) => {{
            let r = tokio::time::timeout(t, $fut).await;
            eprintln!("{:<40} {:?}", $what, r);
            assert!(r.is_ok(), "{} hung", $what);
        }};
    }
    probe!("fair_lock('').try_lock", async {
        a.fair_lock("").try_lock().await.map(|g| g.is_some())
    });
    probe!("rw('').read().try_lock", async {
        a.read_write_lock("")
            .read()
            .try_lock()
            .await
            .map(|g| g.is_some())
    });
    probe!(
        "permits('').try_set",
        a.permit_expirable_semaphore("").try_set_permits(1)
    );
    probe!("latch('').count", a.count_down_latch("").count());
    probe!("lock lease 500us", async {
        a.lock("adv8:b")
            .lock_with_lease(Duration::from_micros(500))
            .await
            .map(drop)
    });
    probe!("lock lease MAX", async {
        a.lock("adv8:b")
            .lock_with_lease(Duration::MAX)
            .await
            .map(drop)
    });
    probe!("try_lock_for(MAX wait, 1ms)", async {
        a.lock("adv8:b")
            .try_lock_for(Duration::MAX, Some(Duration::from_millis(1)))
            .await
            .map(|g| g.is_some())
    });
    probe!("sem acquire 0", a.semaphore("adv8:s").acquire(0));
    let _ = a.semaphore("adv8:s").try_set_permits(1).await;
    probe!(
        "sem try_acquire_for u32::MAX 100ms",
        a.semaphore("adv8:s")
            .try_acquire_for(u32::MAX, Duration::from_millis(100))
    );
    probe!(
        "sem add i64::MAX",
        a.semaphore("adv8:s").add_permits(i64::MAX)
    );
    probe!(
        "sem add 1 past i64::MAX",
        a.semaphore("adv8:s").add_permits(1)
    );
    probe!(
        "sem release u32::MAX",
        a.semaphore("adv8:s").release(u32::MAX)
    );
    probe!("sem available", a.semaphore("adv8:s").available_permits());
    probe!(
        "sem add i64::MIN",
        a.semaphore("adv8:s").add_permits(i64::MIN)
    );
    probe!("sem available", a.semaphore("adv8:s").available_permits());
    probe!("permits try_acquire lease 0", async {
        a.permit_expirable_semaphore("adv8:p")
            .try_acquire(Duration::ZERO, Duration::ZERO)
            .await
            .map(|p| p.is_some())
    });
    probe!(
        "permits release bad id",
        a.permit_expirable_semaphore("adv8:p").release("zz")
    );
    probe!(
        "permits release 32 hex unheld",
        a.permit_expirable_semaphore("adv8:p")
            .release("0123456789abcdef0123456789abcdef")
    );
    probe!("latch try_set u32::MAX?", async {
        a.count_down_latch("adv8:l").try_set_count(u32::MAX).await
    });
}

/// A fair waiter whose future is dropped together with the last handle of its client
/// (no shutdown, the process lives on): its place in Redisson's queue must go, or the
/// waiter behind it waits out the head's deadline (W, 300 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_dropped_with_its_client_leaves_the_queue() {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    let b = Client::connect(s.url()).await.unwrap();
    let c = Client::connect(s.url()).await.unwrap();
    let name = "adv8:fair-drop";
    let g = a.fair_lock(name).lock().await.unwrap();
    let wb = {
        let l = b.fair_lock(name);
        tokio::spawn(async move { l.lock().await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let wc = {
        let l = c.fair_lock(name);
        tokio::spawn(async move { l.lock().await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let queue: Vec<String> = s.cmd(&["LRANGE", "redisson_lock_queue:{adv8:fair-drop}", "0", "-1"]);
    assert_eq!(queue.len(), 2, "{queue:?}");
    wb.abort();
    let _ = wb.await;
    drop(b);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = std::time::Instant::now();
    g.unlock().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(4), wc).await;
    let queue: Vec<String> = s.cmd(&["LRANGE", "redisson_lock_queue:{adv8:fair-drop}", "0", "-1"]);
    eprintln!("C after {:?}: {got:?}; queue {queue:?}", t0.elapsed());
    assert!(
        matches!(got, Ok(Ok(Ok(())))),
        "C waited on behind the dropped waiter: queue {queue:?}"
    );
}

// Finding 1, at exactly the limit: a waiter with a lease of 2^62 ms (accepted) wipes the
// line of every other client. Seen on Redis 7.0.15: the line
// `redisson_lock_clients:{adv8:wipe}` held the ids of clients X and Y (TTL twice their 30 s watchdog lease) and was
// gone right after client Z's `try_lock_for(300 ms, Some(2^62 ms))` found the lock busy:
// `join_line` (lua/line.lua:7) formats 2 * 2^62 = 2^63 with '%d' as i64::MIN, and a
// negative PEXPIRE deletes the key. X and Y then have no place, so the next release
// gives nobody the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_the_longest_lease_keeps_the_other_clients_places() {
    let s = RedisServer::start();
    let holder = Client::connect(s.url()).await.unwrap();
    let line_key = "redisson_lock_clients:{adv8:wipe}";
    let g = holder.lock("adv8:wipe").lock().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let c = Client::connect(s.url()).await.unwrap();
        let l = c.lock("adv8:wipe");
        tasks.push(tokio::spawn(async move {
            let _keep = c;
            l.try_lock_for(Duration::from_secs(3), None)
                .await
                .map(|g| g.is_some())
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before: Vec<String> = s.cmd(&["LRANGE", line_key, "0", "-1"]);
    let z = Client::connect(s.url()).await.unwrap();
    let r = z
        .lock("adv8:wipe")
        .try_lock_for(
            Duration::from_millis(300),
            Some(Duration::from_millis(1 << 62)),
        )
        .await;
    let after: Vec<String> = s.cmd(&["LRANGE", line_key, "0", "-1"]);
    eprintln!(
        "line before {before:?}, after {after:?}; Z's call {:?}",
        r.map(|g| g.is_some())
    );
    g.unlock().await.unwrap();
    for t in tasks {
        let _ = t.await;
    }
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(
        before.iter().all(|id| after.contains(id)),
        "places lost: before {before:?}, after {after:?}"
    );
}
