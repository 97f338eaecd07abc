//! A third newcomer's programs after the re-layout into folders (`src/api`, `src/shell`,
//! ...), each on a real redis-server, through the public paths only: the README's quick
//! start with what each line says checked in Redis, a guard dropped without `unlock`,
//! the watchdog over a job longer than the lease and a lock lost under it,
//! `Client::stats()`, bad input, and a Redisson `lock()` waiter behind this crate's
//! clients. The blocking client, semaphores and RedLock are in `tests/newuser3_api.rs`.

mod common;

use std::time::{Duration, Instant};

use common::newcomer::{
    connect_two, gone_soon, shut_down, timed_waiter, tokens_grow, watchdog_client,
};
use common::redisson_waiter::{
    acquire, no_wake_all, sleep_until_unlock_message, subscribed, unlock,
};
use common::RedisServer;
use redis_rlock::{OwnerId, Stats};

const JAVA_FIELD: &str = "0a0b0c0d-3333-4444-5555-666677778888:7";

fn hold_count(s: &RedisServer, name: &str, field: &str) -> Option<i64> {
    s.cmd(&["HGET", name, field])
}

/// The README's first example, line by line, with what each comment says checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_does_what_its_comments_say() {
    let s = RedisServer::start();
    let (client, other) = connect_two(&s).await;
    let lock = client.lock("nu3:orders:42");

    let outer = lock.lock().await.unwrap();
    let pttl: i64 = s.cmd(&["PTTL", "nu3:orders:42"]);
    assert!(pttl > 25_000, "the watchdog's 30 s lease: {pttl}");
    let inner = lock.lock().await.unwrap();
    assert_eq!(
        inner.holder_field(),
        outer.holder_field(),
        "same task, same owner"
    );
    // Re-entry of a watchdog hold is local: Redis keeps count 1, `hold_count` says 2.
    assert_eq!(
        lock.hold_count().await.unwrap(),
        2,
        "re-enters, hold count 2"
    );
    inner.unlock().await.unwrap();
    assert!(
        lock.is_locked().await.unwrap(),
        "hold count 1, still locked"
    );
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    outer.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:orders:42"]), 0, "released");

    // Busy elsewhere: try_lock_for gives up after its wait, with None.
    let elsewhere = other.lock("nu3:orders:42").lock().await.unwrap();
    let t0 = Instant::now();
    let got = lock
        .try_lock_for(Duration::from_millis(500), Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let waited = t0.elapsed();
    assert!(got.is_none());
    assert!(
        waited >= Duration::from_millis(490) && waited < Duration::from_millis(1_500),
        "waited {waited:?} for a 500 ms try"
    );
    elsewhere.unlock().await.unwrap();
    let g = lock
        .try_lock_for(Duration::from_millis(500), Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free now");
    assert!(!g.is_watchdog(), "fixed lease, no watchdog");
    let pttl: i64 = s.cmd(&["PTTL", "nu3:orders:42"]);
    assert!(
        pttl > 9_000 && pttl <= 10_000,
        "held for at most 10 s: {pttl}"
    );
    g.unlock().await.unwrap();

    let n = lock.run(|| async { 1 + 1 }).await.unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", "nu3:orders:42"]),
        0,
        "run released"
    );

    // Two scopes in one task exclude each other: the second waits for the first's work.
    let order = std::sync::Mutex::new(Vec::new());
    let work = |tag: u8| {
        let order = &order;
        move || async move {
            order.lock().unwrap().push((tag, "in"));
            tokio::time::sleep(Duration::from_millis(50)).await;
            order.lock().unwrap().push((tag, "out"));
        }
    };
    let (a, b) = tokio::join!(
        OwnerId::scope(lock.run(work(1))),
        OwnerId::scope(lock.run(work(2))),
    );
    a.unwrap();
    b.unwrap();
    let order = order.into_inner().unwrap();
    assert!(
        order
            .windows(2)
            .all(|w| w[0].0 == w[1].0 || w[0].1 == "out"),
        "the scopes overlapped: {order:?}"
    );

    tokens_grow(&client.fenced_lock("nu3:accounts:7")).await;
    shut_down(&[&client, &other]).await;
}

/// A guard dropped without `unlock` (an early return, a `?`): the lock is given back at
/// once, not when the 30 s lease runs out, and a waiter of another client gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_without_unlock_frees_the_lock_for_a_waiter() {
    let s = RedisServer::start();
    let (a, b) = connect_two(&s).await;
    let guard = a.lock("nu3:drop").lock().await.unwrap();
    let waiter = timed_waiter(b.lock("nu3:drop"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    fn early_return(_g: redis_rlock::LockGuard) -> Result<(), &'static str> {
        Err("gave up")
    }
    assert!(early_return(guard).is_err());
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter still waits 5 s after the drop")
        .unwrap();
    assert!(
        waited < Duration::from_secs(1),
        "the waiter got the lock after {waited:?}"
    );
    assert!(gone_soon(&s, "nu3:drop").await);
    assert!(a.stats().releases >= 1, "the drop counts as a release");
    shut_down(&[&a, &b]).await;
}

/// The watchdog keeps a lock taken without a lease alive through a job three leases
/// long, and counts its renewals; the guard is not lost and the key's TTL stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_long_job_locked_and_counts_it() {
    let s = RedisServer::start();
    let client = watchdog_client(&s, Duration::from_millis(900)).await;
    let g = client.lock("nu3:long").lock().await.unwrap();
    assert!(g.is_watchdog());
    let mut lowest = i64::MAX;
    for _ in 0..27 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lowest = lowest.min(s.cmd::<i64>(&["PTTL", "nu3:long"]));
    }
    assert!(!g.is_lost());
    assert!(lowest > 0, "the key ran out during the job (PTTL {lowest})");
    assert_eq!(
        hold_count(&s, "nu3:long", g.holder_field()),
        Some(1),
        "still ours, count 1"
    );
    let renewals = client.stats().renewals;
    // Renewals come every third of the lease: 2.7 s / 0.3 s is about 9.
    assert!(renewals >= 6, "renewals over 3 leases: {renewals}");
    g.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// `Client::stats()` counts what its doc says, for a short known story: one grant,
/// one local re-entry, busy answers from a try, and one hand-over to a waiting task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_a_known_story() {
    let s = RedisServer::start();
    let (client, other) = connect_two(&s).await;
    assert_eq!(client.stats().acquisitions, 0);
    let lock = client.lock("nu3:stats");

    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    let st = client.stats();
    assert_eq!((st.acquisitions, st.releases), (2, 0), "{st:?}");
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    assert_eq!(client.stats().releases, 2);

    let held = other.lock("nu3:stats").lock().await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_none());
    assert!(client.stats().busy >= 1, "{:?}", client.stats());
    held.unlock().await.unwrap();

    // A task waiting while another task of the same client releases is handed the lock.
    let first = lock.lock().await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before: Stats = client.stats();
    first.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    let after = client.stats();
    assert_eq!(
        after.handovers - before.handovers,
        1,
        "{before:?} -> {after:?}"
    );
    assert_eq!(after.acquisitions - before.acquisitions, 1);
    assert_eq!(after.releases - before.releases, 2);
    shut_down(&[&client, &other]).await;
}

/// A Java service's `lock()` waits behind this crate's clients, as Redisson does:
/// subscribed to the lock's channel, it tries Redisson's acquire script and after a busy
/// answer sleeps until a message or the holder's TTL. A holder of this crate that lets go
/// (by `unlock`, then by dropping its guard) must wake it by a message, long before the
/// 30 s lease would, while another client of this crate waits too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_lock_waiter_behind_this_crates_clients_is_woken_by_the_release() {
    let s = RedisServer::start();
    let name = "nu3:java";
    let (a, b) = connect_two(&s).await;
    for unlock in [true, false] {
        let guard = a.lock(name).lock().await.unwrap();
        let url = s.url();
        let java =
            tokio::task::spawn_blocking(move || redisson_lock(&url, name, Duration::from_secs(10)));
        // A client of this crate waits as well; it must not keep the Java waiter out for long.
        let crate_waiter = {
            let lock = b.lock(name);
            tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                g.unlock().await.unwrap();
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        if unlock {
            guard.unlock().await.unwrap();
        } else {
            drop(guard);
        }
        let (got_at, heard) = java.await.unwrap();
        let got_at = got_at.expect("the Redisson waiter did not get the lock in 10 s");
        let after = got_at.saturating_duration_since(released);
        eprintln!("unlock={unlock}: Java got in {after:?} after the release; heard {heard:?}");
        assert!(
            after < Duration::from_secs(1),
            "unlock={unlock}: the Java waiter got in {after:?} after the release"
        );
        no_wake_all(&heard);
        tokio::time::timeout(Duration::from_secs(10), crate_waiter)
            .await
            .expect("the crate's waiter never got in after the Java holder left")
            .unwrap();
        assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0);
    }
    shut_down(&[&a, &b]).await;
}

/// Redisson's `lock()` on this thread: the instant it got the lock (then held 20 ms and
/// given back with Redisson's unlock script), or `None` by `limit`; and the messages heard.
fn redisson_lock(url: &str, name: &str, limit: Duration) -> (Option<Instant>, Vec<i64>) {
    subscribed(url, name, |conn, pubsub| {
        let t0 = Instant::now();
        let mut heard = Vec::new();
        while t0.elapsed() < limit {
            let Some(ttl) = acquire(conn, name, 30_000, JAVA_FIELD) else {
                let got = Instant::now();
                std::thread::sleep(Duration::from_millis(20));
                let _ = unlock(conn, name, "nu3", JAVA_FIELD);
                let _: () = redis::cmd("DEL")
                    .arg(format!("redisson_unlock_latch:{{{name}}}:nu3"))
                    .query(conn)
                    .unwrap();
                return (Some(got), heard);
            };
            // Until a 0 (a 1 would wake every waiter), at most the holder's TTL and `limit`.
            let ttl_end = Instant::now() + Duration::from_millis(ttl.clamp(1, 30_000) as u64);
            sleep_until_unlock_message(pubsub, ttl_end.min(t0 + limit), &mut heard);
        }
        (None, heard)
    })
}

/// Bad input from a caller new to the crate: each a typed error, with nothing left in
/// Redis, and the client still working afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_and_leaves_nothing() {
    use redis_rlock::{Error, MAX_DURATION, MAX_NAME_LEN};
    let s = RedisServer::start();
    let client = redis_rlock::Client::connect(s.url()).await.unwrap();
    let err = client.lock("").lock().await.unwrap_err();
    assert!(matches!(err, Error::EmptyName), "{err:?}");
    let long = "n".repeat(MAX_NAME_LEN + 1);
    let err = client.lock(long).try_lock().await.unwrap_err();
    assert!(matches!(err, Error::NameTooLong { .. }), "{err:?}");
    let lock = client.lock("nu3:bad");
    let err = lock.lock_with_lease(Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, Error::InvalidLease { .. }), "{err:?}");
    // A wait beyond MAX_DURATION is documented as no deadline; a lease is not.
    let err = lock
        .try_lock_for(
            Duration::from_millis(10),
            Some(MAX_DURATION + Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DurationOutOfRange { .. } | Error::InvalidLease { .. }
        ),
        "{err:?}"
    );
    // A key that is no lock is refused, and left as it was.
    let _: () = s.cmd(&["SET", "nu3:bad", "app data"]);
    let err = lock.try_lock().await.unwrap_err();
    assert!(
        matches!(err, Error::WrongType { .. } | Error::NotALock { .. }),
        "{err:?}"
    );
    assert_eq!(s.cmd::<String>(&["GET", "nu3:bad"]), "app data");
    let _: () = s.cmd(&["DEL", "nu3:bad"]);
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "left behind: {keys:?}");
    lock.lock().await.unwrap().unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// The watchdog tells the holder at once when its lock is gone (the key deleted by
/// hand here): `lost()` completes within a renewal period, `is_lost()` turns true, and
/// `unlock` says `LeaseLost`, as the guard's docs list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_is_reported_lost_by_the_watchdog() {
    let s = RedisServer::start();
    let client = watchdog_client(&s, Duration::from_millis(900)).await;
    let g = client.lock("nu3:gone").lock().await.unwrap();
    assert!(!g.is_lost());
    let _: () = s.cmd(&["DEL", "nu3:gone"]);
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost() still pending 2 s after the key was deleted");
    let after = t0.elapsed();
    // By the next renewal (300 ms) at best; by the lease confirmed before the delete
    // (900 ms) at worst.
    assert!(after < Duration::from_secs(1), "noticed after {after:?}");
    assert!(g.is_lost());
    assert!(client.stats().leases_lost >= 1, "{:?}", client.stats());
    let err = g.unlock().await.unwrap_err();
    assert!(
        matches!(err, redis_rlock::Error::LeaseLost { .. }),
        "{err:?}"
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:gone"]), 0);
    client.shutdown().await.unwrap();
}

/// A guard that outlives its runtime (a test's runtime dropped, a service stopping
/// without `shutdown`): no watchdog renews it any more, so it says it is lost at once
/// (`Stats::leases_lost` lists "runtime gone"), while the key still has lease left;
/// dropping it then does not panic, and the hold expires with its lease.
#[test]
fn a_guard_that_outlives_its_runtime_is_lost_and_drops_quietly() {
    let s = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (client, guard) = rt.block_on(async {
        let c = watchdog_client(&s, Duration::from_secs(1)).await;
        let g = c.lock("nu3:orphan").lock().await.unwrap();
        (c, g)
    });
    assert!(!guard.is_lost());
    drop(rt);
    assert!(guard.is_lost(), "held with no runtime to renew it");
    let pttl: i64 = s.cmd(&["PTTL", "nu3:orphan"]);
    assert!(pttl > 0 && pttl <= 1_000, "the lease left: {pttl}");
    drop(guard);
    drop(client);
    let t0 = Instant::now();
    while s.cmd::<i64>(&["EXISTS", "nu3:orphan"]) == 1 && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", "nu3:orphan"]),
        0,
        "the hold outlived its lease"
    );
}

/// `Lock::run` whose work panics: the panic reaches the caller (here a task's
/// `JoinError`) and the lock is released in the background at once, as its doc says,
/// so that a waiter of another client gets in long before the 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_inside_run_releases_the_lock() {
    let s = RedisServer::start();
    let (a, b) = connect_two(&s).await;
    let lock = a.lock("nu3:panic");
    let (entered, in_work) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        lock.run(|| async move {
            entered.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            panic!("the work failed");
        })
        .await
    });
    in_work.await.unwrap();
    let t0 = Instant::now();
    let g = tokio::time::timeout(Duration::from_secs(5), b.lock("nu3:panic").lock())
        .await
        .expect("the lock was still held 5 s after the work panicked")
        .unwrap();
    let waited = t0.elapsed();
    assert!(worker.await.unwrap_err().is_panic());
    assert!(waited < Duration::from_secs(1), "waited {waited:?}");
    g.unlock().await.unwrap();
    shut_down(&[&a, &b]).await;
}
