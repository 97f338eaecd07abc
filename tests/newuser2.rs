//! A second newcomer's programs, each on a real redis-server: plain locks uncontended,
//! leases and re-entries mixed, guards dropped, the watchdog over a long job, a Java
//! service's hold and force unlock on the same name, typed errors, the README's example,
//! and `Client::stats()`. Contended services are in `tests/newuser2_contended.rs`.

mod common;
mod newuser2_peer;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::newcomer::{
    connect_two, gone_soon, shut_down, timed_waiter, tokens_grow, watchdog_client,
};
use common::{client_with, RedisServer};
use newuser2_peer::{java_acquire, java_unlock, keys_without_ttl};
use redis_rlock::protocol::channel_name;
use redis_rlock::{Client, Error, OwnerId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_calls_write_what_redisson_writes_and_leave_nothing() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu2:plain");

    let g = lock.lock().await.unwrap();
    let fields: Vec<(String, i64)> = s.cmd(&["HGETALL", "nu2:plain"]);
    assert_eq!(fields, vec![(g.holder_field().to_string(), 1)]);
    let pttl: i64 = s.cmd(&["PTTL", "nu2:plain"]);
    assert!(pttl > 25_000 && pttl <= 30_000, "watchdog lease: {pttl}");
    assert!(g.is_watchdog() && g.fencing_token().is_none());
    g.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:plain"]), 0);

    let g = lock.try_lock().await.unwrap().expect("free");
    g.unlock().await.unwrap();
    let g = lock
        .try_lock_with_lease(Duration::from_millis(1_500))
        .await
        .unwrap()
        .expect("free");
    let pttl: i64 = s.cmd(&["PTTL", "nu2:plain"]);
    assert!(pttl > 1_000 && pttl <= 1_500, "{pttl}");
    g.unlock().await.unwrap();
    let g = lock.lock_with_lease(Duration::from_secs(2)).await.unwrap();
    assert!(!g.is_watchdog());
    g.unlock().await.unwrap();
    let g = lock
        .try_lock_for(Duration::from_millis(100), None)
        .await
        .unwrap()
        .expect("free");
    assert!(g.is_watchdog());
    g.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(keys_without_ttl(&s, &[]), Vec::<String>::new());
    client.shutdown().await.unwrap();
}

/// A fixed-lease hold taken under a watchdog hold, and the other way round: the README
/// says re-entry never shortens a lease; whichever guard is released first, the one left
/// must still be covered, and the hash must look like Redisson's (one field, count > 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_leases_in_one_task_never_shorten_the_lock() {
    let s = RedisServer::start();
    let client = client_with(&s.url(), Duration::from_secs(3), Duration::from_secs(1)).await;
    let lock = client.lock("nu2:mixed");

    // Watchdog outside, 500 ms lease inside, the inner released first.
    let outer = lock.lock().await.unwrap();
    let inner = lock
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    let count: i64 = s.cmd(&["HGET", "nu2:mixed", outer.holder_field()]);
    assert_eq!(count, 2, "a fixed-lease re-entry goes through Redis");
    let pttl: i64 = s.cmd(&["PTTL", "nu2:mixed"]);
    assert!(
        pttl > 2_000,
        "the 500 ms re-entry shortened the lease: {pttl}"
    );
    inner.unlock().await.unwrap();
    let pttl: i64 = s.cmd(&["PTTL", "nu2:mixed"]);
    assert!(
        pttl > 2_000,
        "the partial release shortened the lease: {pttl}"
    );
    outer.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:mixed"]), 0);

    // 500 ms lease outside, watchdog inside, the outer (fixed) released first: the
    // watchdog hold left must keep the lock past 500 ms.
    let outer = lock
        .lock_with_lease(Duration::from_millis(500))
        .await
        .unwrap();
    let inner = lock.lock().await.unwrap();
    outer.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(
        !inner.is_lost(),
        "the watchdog hold was lost with the fixed lease"
    );
    assert!(lock.is_locked().await.unwrap());
    let count: i64 = s.cmd(&["HGET", "nu2:mixed", inner.holder_field()]);
    assert_eq!(count, 1);
    let other = lock.clone();
    let busy = tokio::spawn(async move { other.try_lock().await.unwrap().is_none() });
    assert!(busy.await.unwrap(), "another task must find it held");
    inner.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:mixed"]), 0);
    assert_eq!(keys_without_ttl(&s, &[]), Vec::<String>::new());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guards_release_and_wake_a_waiter_of_another_client() {
    let s = RedisServer::start();
    let (a, b) = connect_two(&s).await;
    let name = "nu2:dropped";

    let outer = a.lock(name).lock().await.unwrap();
    let inner = a.lock(name).lock().await.unwrap();
    let waiter = timed_waiter(b.lock(name));
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(outer); // out of order: the inner hold keeps the lock
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "a hold is left: the waiter must still wait"
    );
    let t_drop = Instant::now();
    drop(inner);
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter woke within 5 s of the last drop (the lease is 30 s)")
        .unwrap();
    assert!(
        t_drop.elapsed() < Duration::from_secs(2),
        "{:?}",
        t_drop.elapsed()
    );
    assert!(waited >= Duration::from_millis(450), "{waited:?}");
    assert!(gone_soon(&s, name).await);
    shut_down(&[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_job_is_kept_by_the_watchdog_and_counted_in_stats() {
    let s = RedisServer::start();
    let client = watchdog_client(&s, Duration::from_millis(900)).await;
    let other = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu2:job");
    let before = client.stats();

    let g = lock.lock().await.unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(2_700) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!g.is_lost());
        assert!(other.lock("nu2:job").try_lock().await.unwrap().is_none());
        let pttl: i64 = s.cmd(&["PTTL", "nu2:job"]);
        assert!(pttl > 0, "the lease ran out during the job");
    }
    g.unlock().await.unwrap();
    let after = client.stats();
    assert_eq!(after.acquisitions - before.acquisitions, 1);
    assert_eq!(after.releases - before.releases, 1);
    assert_eq!(after.leases_lost, before.leases_lost);
    // Renewed every third of 900 ms for 2.7 s: about 9 renewals.
    let renewals = after.renewals - before.renewals;
    assert!((5..=12).contains(&renewals), "{renewals} renewals");
    let busy = other.stats().busy;
    assert!(busy >= 8, "the other client's tries were busy: {busy}");
    shut_down(&[&client, &other]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_a_small_session_exactly() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu2:stats");
    let zero = client.stats();
    assert_eq!(
        zero.acquisitions + zero.releases + zero.busy + zero.handovers,
        0
    );

    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap(); // served locally, counted all the same
    let other = lock.clone();
    let busy = tokio::spawn(async move { other.try_lock().await.unwrap().is_none() });
    assert!(busy.await.unwrap());
    // A task of the same client waits, and is handed the lock by the last unlock.
    let other = lock.clone();
    let waiter = tokio::spawn(async move { other.lock().await.unwrap().unlock().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    waiter.await.unwrap().unwrap();

    let st = client.stats();
    eprintln!("{st:?}");
    assert_eq!(st.acquisitions, 3, "outer, inner, the waiter");
    assert_eq!(st.releases, 3);
    // The try; the waiter's first attempt, its attempt once subscribed, and one more
    // when the client's pub/sub connection is first made (`Stats::wakeups` says so).
    assert_eq!(st.busy, 4, "{st:?}");
    assert_eq!(st.wakeups, 1, "{st:?}");
    assert_eq!(st.handovers, 1, "the waiter was handed the lock");
    assert_eq!(st.leases_lost, 0);
    assert_eq!(st.pubsub_connects, 1);
    client.shutdown().await.unwrap();
}

/// The Java service holds first: this crate's try_lock is busy, lock() waits and wakes on
/// Redisson's unlock message, and Redisson finds this crate's hold as its own code would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_holder_and_this_crate_hand_the_lock_both_ways() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let name = "nu2:java2";
    assert_eq!(java_acquire(&s, name, 30_000), None);
    let lock = client.lock(name);
    assert!(lock.try_lock().await.unwrap().is_none());
    let r = lock
        .try_lock_for(Duration::from_millis(200), None)
        .await
        .unwrap();
    assert!(r.is_none());
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    assert_eq!(java_unlock(&s, name, 1), Some(1));
    let g = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken by Redisson's 0 well before the 30 s TTL")
        .unwrap();
    eprintln!("woken {:?} after the Java unlock", t0.elapsed());
    let ttl = java_acquire(&s, name, 30_000).expect("Redisson sees it held");
    assert!(ttl > 25_000, "{ttl}");
    // Redisson's unlock of a lock it does not hold answers nil (its IllegalMonitorState).
    assert_eq!(java_unlock(&s, name, 2), None);
    g.unlock().await.unwrap();
    assert_eq!(java_acquire(&s, name, 30_000), None);
    assert_eq!(java_unlock(&s, name, 3), Some(1));
    assert_eq!(keys_without_ttl(&s, &[]), Vec::<String>::new());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_leases_and_waits_get_typed_errors_and_take_nothing() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu2:bad");
    for lease in [Duration::ZERO, Duration::from_micros(999)] {
        let r = lock.try_lock_with_lease(lease).await;
        assert!(
            matches!(r, Err(Error::InvalidLease { .. })),
            "{lease:?}: {r:?}"
        );
        let r = lock
            .try_lock_for(Duration::from_millis(10), Some(lease))
            .await;
        assert!(
            matches!(r, Err(Error::InvalidLease { .. })),
            "{lease:?}: {r:?}"
        );
    }
    let r = lock.lock_with_lease(Duration::MAX).await;
    assert!(matches!(r, Err(Error::DurationOutOfRange { .. })), "{r:?}");
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:bad"]), 0);
    client.shutdown().await.unwrap();
}

/// Two fixed leases nested, the shorter inside: releasing the inner one must leave the
/// outer lease as it was (release.lua's "lease to set if holds remain").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_fixed_reentry_released_leaves_the_longer_outer_lease() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu2:fixed2");
    let outer = lock.lock_with_lease(Duration::from_secs(3)).await.unwrap();
    let inner = lock
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(
        s.cmd::<i64>(&["HGET", "nu2:fixed2", outer.holder_field()]),
        2
    );
    let pttl: i64 = s.cmd(&["PTTL", "nu2:fixed2"]);
    assert!(pttl > 2_000, "the re-entry shortened the lease: {pttl}");
    inner.unlock().await.unwrap();
    let pttl: i64 = s.cmd(&["PTTL", "nu2:fixed2"]);
    assert!(
        pttl > 2_000,
        "the partial release shortened the lease: {pttl}"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!outer.is_lost());
    assert!(lock.is_locked().await.unwrap());
    outer.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:fixed2"]), 0);
    assert_eq!(keys_without_ttl(&s, &[]), Vec::<String>::new());
    client.shutdown().await.unwrap();
}

/// The README's first example, run as written against the harness's server, with its
/// comments checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_does_what_its_comments_say() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("orders:42");

    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2, "hold count 2");
    inner.unlock().await.unwrap();
    assert!(
        lock.is_locked().await.unwrap(),
        "hold count 1, still locked"
    );
    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap(), "released");

    let g = lock
        .try_lock_for(Duration::from_millis(500), Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free");
    let pttl: i64 = s.cmd(&["PTTL", "orders:42"]);
    assert!(!g.is_watchdog() && pttl <= 10_000 && pttl > 9_000, "{pttl}");
    g.unlock().await.unwrap();

    let n = lock.run(|| async { 1 + 1 }).await.unwrap();
    assert_eq!(n, 2);
    // Scoped futures joined in one task exclude each other: never both inside.
    let inside = AtomicBool::new(false);
    let section = || async {
        assert!(
            !inside.swap(true, Ordering::SeqCst),
            "both scopes inside at once"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        inside.store(false, Ordering::SeqCst);
        n
    };
    let (a, b) = tokio::join!(
        OwnerId::scope(lock.run(section)),
        OwnerId::scope(lock.run(section)),
    );
    assert_eq!((a.unwrap(), b.unwrap()), (2, 2));

    tokens_grow(&client.fenced_lock("accounts:7")).await;
    client.shutdown().await.unwrap();
    let hashes: Vec<String> = s.cmd(&["KEYS", "*"]);
    assert!(
        !hashes.iter().any(|k| k == "orders:42" || k == "accounts:7"),
        "{hashes:?}"
    );
    assert_eq!(
        keys_without_ttl(&s, &["redisson_lock_token:{accounts:7}"]),
        Vec::<String>::new()
    );
}

/// A Java service's `forceUnlock()` (`DEL` and `0` on the channel) under our guards: the
/// watchdog guard hears of it by its next renewal, and each unlock then says what
/// happened in a typed error that names the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_force_unlock_is_reported_by_lost_and_typed_errors() {
    let s = RedisServer::start();
    let client = watchdog_client(&s, Duration::from_millis(900)).await;
    let lock = client.lock("nu2:err");
    let java_force_unlock = || {
        let _: i64 = s.cmd(&["DEL", "nu2:err"]);
        let _: i64 = s.cmd(&["PUBLISH", &channel_name("nu2:err"), "0"]);
    };
    let g = lock.lock().await.unwrap();
    java_force_unlock();
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost by the next renewal (every 300 ms)");
    eprintln!("lost after {:?}", t0.elapsed());
    let e = g.unlock().await.unwrap_err();
    assert!(
        matches!(&e, Error::LeaseLost { name } if name == "nu2:err"),
        "{e:?}"
    );
    assert!(e.to_string().contains("nu2:err"), "{e}");

    let g = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
    java_force_unlock();
    let e = g.unlock().await.unwrap_err();
    assert!(
        matches!(&e, Error::NotHeld { name, .. } if name == "nu2:err"),
        "{e:?}"
    );
    assert!(e.to_string().contains("nu2:err"), "{e}");
    assert_eq!(client.stats().leases_lost, 1, "{:?}", client.stats());
    client.shutdown().await.unwrap();
    let e = lock.lock().await.unwrap_err();
    assert!(matches!(e, Error::Closed), "{e:?}");
}
