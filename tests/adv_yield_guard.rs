//! Adversarial review of the guard split (`LockGuard` a thin wrapper of
//! `shell::held::Held`, whose `Drop` releases): a guard dropped on another task, in
//! `spawn_blocking`, on a thread without a runtime, after `Client::shutdown`, after its
//! runtime shut down, after its client's last handle, lost, or re-entered through
//! `LockGuard::lock` releases once or not at all, never a hold of someone else.

mod common;

use std::time::{Duration, Instant};

use common::turns::client;
use common::RedisServer;
use redis_rlock::Client;

/// Whether `name` is held by anyone (its hash exists).
fn held(s: &RedisServer, name: &str) -> bool {
    s.cmd::<i64>(&["EXISTS", name]) == 1
}

/// Polls until `name` is free, for at most `limit`.
fn freed_within(s: &RedisServer, name: &str, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if !held(s, name) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    !held(s, name)
}

/// A `LockGuard` dropped on another task, inside `spawn_blocking`, and on a thread that
/// has no runtime at all: each releases the lock promptly, once (a hold of another
/// client taken right after is left alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_anywhere_releases_once() {
    let s = RedisServer::start();
    let c = client(&s, Duration::from_millis(10)).await;
    let other = client(&s, Duration::from_millis(10)).await;
    for place in ["task", "spawn_blocking", "plain thread"] {
        let name = format!("ay:drop:{place}");
        let g = c.lock(&name).lock().await.unwrap();
        assert!(held(&s, &name));
        match place {
            "task" => tokio::spawn(async move { drop(g) }).await.unwrap(),
            "spawn_blocking" => tokio::task::spawn_blocking(move || drop(g)).await.unwrap(),
            _ => std::thread::spawn(move || drop(g)).join().unwrap(),
        }
        assert!(
            freed_within(&s, &name, Duration::from_secs(2)),
            "{place}: the dropped guard's lock is still held after 2 s"
        );
        let g2 = other.lock(&name).try_lock().await.unwrap().expect("free");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let count: Option<i64> = s.cmd(&["HGET", &name, g2.holder_field()]);
        assert_eq!(count, Some(1), "{place}: released twice");
        g2.unlock().await.unwrap();
    }
}

/// After `Client::shutdown` released every hold, a guard of that client dropped later
/// does not touch the lock, now another client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_after_shutdown_leaves_the_next_holder_alone() {
    let s = RedisServer::start();
    let c = client(&s, Duration::from_millis(10)).await;
    let other = client(&s, Duration::from_millis(10)).await;
    let name = "ay:drop:shutdown";
    let g = c.lock(name).lock().await.unwrap();
    c.shutdown().await.unwrap();
    assert!(!held(&s, name), "shutdown released the hold");
    let g2 = other.lock(name).try_lock().await.unwrap().expect("free");
    drop(g);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let count: Option<i64> = s.cmd(&["HGET", name, g2.holder_field()]);
    assert_eq!(count, Some(1));
    g2.unlock().await.unwrap();
}

/// A guard whose client's runtime was shut down, dropped on a plain thread: no panic,
/// and the hold ends with its lease (nobody is left to renew it).
#[test]
fn a_guard_dropped_after_its_runtime_shut_down_does_not_panic() {
    let s = RedisServer::start();
    let name = "ay:drop:runtime";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let g = rt.block_on(async {
        let c = Client::builder(s.url())
            .watchdog_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        c.lock(name).lock().await.unwrap()
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    std::thread::spawn(move || drop(g))
        .join()
        .expect("the drop did not panic");
    assert!(
        freed_within(&s, name, Duration::from_secs(3)),
        "the lease ran out"
    );
}

/// A watchdog guard whose key was deleted behind its back learns it is lost (`lost()`
/// completes); dropped after another client and another task of the same client took
/// the lock in turn, it releases neither hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_guard_dropped_late_leaves_the_new_holders_alone() {
    let s = RedisServer::start();
    let build = || async {
        Client::builder(s.url())
            .watchdog_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap()
    };
    let (c, other) = (build().await, build().await);
    let name = "ay:lost";
    let g = c.lock(name).lock().await.unwrap();
    let _: () = s.cmd(&["DEL", name]);
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("the guard learned it was lost within 3 s");
    assert!(g.is_lost());
    for (who, taker) in [("another client", &other), ("another task", &c)] {
        let g2 = tokio::spawn({
            let l = taker.lock(name);
            async move { l.try_lock().await.unwrap().expect("free") }
        })
        .await
        .unwrap();
        assert_ne!(g2.holder_field(), g.holder_field());
        if who == "another task" {
            drop(g);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let count: Option<i64> = s.cmd(&["HGET", name, g2.holder_field()]);
            assert_eq!(count, Some(1), "{who}: the lost guard's drop released it");
            g2.unlock().await.unwrap();
            break;
        }
        let count: Option<i64> = s.cmd(&["HGET", name, g2.holder_field()]);
        assert_eq!(count, Some(1), "{who}");
        g2.unlock().await.unwrap();
    }
}

/// The last handle of the client dropped while one of its guards lives: the guard's
/// drop later still releases the lock promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_outliving_its_client_handle_releases_on_drop() {
    let s = RedisServer::start();
    let c = client(&s, Duration::from_millis(10)).await;
    let name = "ay:drop:client";
    let g = c.lock(name).lock().await.unwrap();
    drop(c);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(held(&s, name), "still held while its guard lives");
    drop(g);
    assert!(
        freed_within(&s, name, Duration::from_secs(2)),
        "the guard's lock is still held 2 s after its drop"
    );
}

/// `LockGuard::lock` re-entered by the same task: two holds of one field (counted in
/// the client; Redis keeps 1); the first guard dropped leaves the second's hold, the
/// second's drop frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_through_lockguard_lock_is_released_once_per_guard() {
    let s = RedisServer::start();
    let c = client(&s, Duration::from_millis(10)).await;
    let name = "ay:reenter";
    let g1 = c.lock(name).lock().await.unwrap();
    let g2 = redis_rlock::LockGuard::lock(&g1).lock().await.unwrap();
    let field = g1.holder_field().to_string();
    assert_eq!(s.cmd::<Option<i64>>(&["HGET", name, &field]), Some(1));
    drop(g1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.cmd::<Option<i64>>(&["HGET", name, &field]), Some(1));
    drop(g2);
    assert!(freed_within(&s, name, Duration::from_secs(2)));
}
