//! Owners: per-task re-entry by default, scoped owners for futures that run
//! concurrently inside one task, explicit owners, and child tasks.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use redis_rlock::{Client, OwnerId};

async fn client(s: &RedisServer) -> Client {
    common::client_with(&s.url(), Duration::from_secs(5), Duration::from_secs(3)).await
}

/// Enters a section, records the most that were ever inside at once, and leaves.
async fn section(inside: &AtomicUsize, most: &AtomicUsize) {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_futures_in_their_own_scopes_exclude_each_other() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let work = |_: u32| {
        let (lock, inside, most) = (c.lock("own:join"), inside.clone(), most.clone());
        OwnerId::scope(async move {
            for _ in 0..3 {
                let g = lock.lock().await.unwrap();
                section(&inside, &most).await;
                g.unlock().await.unwrap();
            }
        })
    };
    tokio::join!(work(1), work(2), work(3));
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two scopes were inside at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_futures_without_scopes_share_the_task_and_both_enter() {
    // The documented hazard that scopes exist for.
    let s = RedisServer::start();
    let c = client(&s).await;
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let work = || {
        let (lock, inside, most) = (c.lock("own:shared"), inside.clone(), most.clone());
        async move {
            let g = lock.lock().await.unwrap();
            section(&inside, &most).await;
            g.unlock().await.unwrap();
        }
    };
    tokio::join!(work(), work());
    assert_eq!(most.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_locks_inside_one_scope_reenter() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let lock = c.lock("own:nested");
    OwnerId::scope(async {
        let outer = lock.lock().await.unwrap();
        let inner = tokio::time::timeout(Duration::from_secs(2), lock.lock())
            .await
            .expect("a nested lock in one scope waited")
            .unwrap();
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        assert!(outer
            .holder_field()
            .ends_with(&format!(":{}", OwnerId::current())));
        inner.unlock().await.unwrap();
        outer.unlock().await.unwrap();
    })
    .await;
    assert_eq!(lock.hold_count().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_outside_a_scope_waits_for_the_scope_and_an_explicit_owner_reenters() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let lock = c.lock("own:explicit");
    let owner = OwnerId::unique();
    let g = owner.run(lock.lock()).await.unwrap();
    // Same task, other owner: busy.
    assert!(lock.try_lock().await.unwrap().is_none());
    // Same owner from another task: re-enters.
    let again = {
        let lock = lock.clone();
        tokio::spawn(owner.run(async move { lock.try_lock().await }))
            .await
            .unwrap()
            .unwrap()
            .expect("the explicit owner re-enters from another task")
    };
    assert_eq!(owner.run(lock.hold_count()).await.unwrap(), 2);
    again.unlock().await.unwrap();
    g.unlock().await.unwrap();
    let mine = lock.try_lock().await.unwrap().expect("free again");
    mine.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_task_waits_for_a_lock_its_parent_holds() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let lock = c.lock("own:child");
    let parent = lock.lock().await.unwrap();
    let child = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let busy = lock
                .try_lock_for(Duration::from_millis(300), None)
                .await
                .unwrap();
            assert!(busy.is_none(), "the child entered its parent's lock");
            lock.lock().await.unwrap().unlock().await.unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!child.is_finished());
    parent.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), child)
        .await
        .expect("the child got the lock after its parent released it")
        .unwrap();
}

/// A client built over a redis-rs client the caller already has uses its address and
/// credentials for commands and for the pub/sub connection that wakes waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_an_existing_redis_client_locks_and_wakes_waiters() {
    let s = RedisServer::start();
    let _: () = s.cmd(&["CONFIG", "SET", "requirepass", "pw"]);
    let url = format!("redis://:pw@127.0.0.1:{}", s.port);
    let existing = redis_rlock::redis::Client::open(url.as_str()).unwrap();
    let c = Client::from_redis_client(existing)
        .watchdog_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let other = Client::connect(&url).await.unwrap();
    let held = other.lock("own:existing").lock().await.unwrap();
    let waiter = {
        let l = c.lock("own:existing");
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let g = l.lock().await.unwrap();
            (g, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.unlock().await.unwrap();
    let (g, waited) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap();
    // Woken by the unlock message (the holder's TTL was 30 s).
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    g.unlock().await.unwrap();
}

/// The holder field is the client's id and the owner (a write lock's with `:write`),
/// whichever client, kind and owner the same thread asked for last: the client keeps the
/// last field it made on a thread and reuses it only for the same client, owner and kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_fields_follow_the_client_the_owner_and_the_kind() {
    let s = RedisServer::start();
    let (a, b) = (client(&s).await, client(&s).await);
    let rw = a.read_write_lock("fields-rw");
    let steps = [
        (a.lock("fields-a"), a.id(), ""),
        (b.lock("fields-a"), b.id(), ""),
        (rw.write(), a.id(), ":write"),
        (rw.read(), a.id(), ""),
        (a.lock("fields-b"), a.id(), ""),
        (a.lock("fields-b"), a.id(), ""),
    ];
    for (lock, id, suffix) in &steps {
        for scoped in [false, true, false] {
            let take = async {
                let g = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
                assert_eq!(
                    g.holder_field(),
                    format!("{id}:{}{suffix}", OwnerId::current())
                );
                let held: Option<i64> = s.cmd(&["HGET", lock.name(), g.holder_field()]);
                assert_eq!(held, Some(1), "{}", g.holder_field());
                g.unlock().await.unwrap();
            };
            if scoped {
                OwnerId::scope(take).await;
            } else {
                take.await;
            }
        }
    }
}
