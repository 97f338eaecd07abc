//! The blocking API (`redis_rlock::blocking`) on real redis-servers: exclusion between
//! threads, re-entry per thread, bounds, release on drop, the watchdog while the holding
//! thread sleeps, use from `spawn_blocking` and from async runtime threads, shutdown,
//! and a Redisson peer.
//!
//! Run with `cargo test --features blocking --test blocking`.

#![cfg(feature = "blocking")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::blocking::Client;
use redis_rlock::{Error, OwnerId};

/// A blocking client on its own runtime, with this watchdog timeout and short
/// connect and response timeouts.
fn client(server: &RedisServer, watchdog: Duration) -> Client {
    Client::builder(server.url())
        .watchdog_timeout(watchdog)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

const WD: Duration = Duration::from_secs(30);

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", key]) == 1
}

/// Polls `cond` every 10 ms on this thread; whether it held within `limit`.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn threads_exclude_each_other_within_and_across_clients() {
    let server = RedisServer::start();
    let clients = [client(&server, WD), client(&server, WD)];
    let (inside, overlaps, served) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    std::thread::scope(|s| {
        for t in 0..6 {
            let lock = clients[t % 2].lock("bl:excl");
            let (inside, overlaps, served) = (&inside, &overlaps, &served);
            s.spawn(move || {
                for round in 0..8 {
                    let g = lock
                        .try_lock_for(Duration::from_secs(20), None)
                        .unwrap()
                        .unwrap_or_else(|| panic!("thread {t} round {round} not served"));
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.unlock().unwrap();
                    served.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two threads were inside"
    );
    assert_eq!(served.load(Ordering::SeqCst), 48);
    assert!(!exists(&server, "bl:excl"));
}

#[test]
fn reentry_is_per_thread_and_the_holder_field_names_the_thread() {
    let server = RedisServer::start();
    let c = client(&server, WD);
    let lock = c.lock("bl:reenter");
    let outer = lock.lock().unwrap();
    // Bounded: a second owner would wait for the 30 s lease.
    let inner = lock
        .try_lock_for(Duration::from_secs(2), None)
        .unwrap()
        .expect("the same thread re-enters");
    assert_eq!(outer.owner(), OwnerId::current_thread());
    assert_eq!(inner.owner(), outer.owner());
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert!(lock.is_held_by_current_thread().unwrap());
    // Redisson's layout with the thread as owner: `<client uuid>:thread-<n>`.
    let field = format!("{}:{}", c.id(), OwnerId::current_thread());
    assert_eq!(server.cmd::<i64>(&["HEXISTS", "bl:reenter", &field]), 1);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(lock.try_lock().unwrap().is_none(), "another thread entered");
            assert_eq!(lock.hold_count().unwrap(), 0);
            assert!(!lock.is_held_by_current_thread().unwrap());
            assert!(lock.is_locked().unwrap());
        });
    });
    inner.unlock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 1);
    assert!(lock.is_locked().unwrap());
    outer.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
    // A fenced lock's re-entries each get a rising token.
    let fenced = c.fenced_lock("bl:fenced");
    let a = fenced.lock().unwrap();
    let b = fenced.lock().unwrap();
    assert!(a.fencing_token().unwrap() < b.fencing_token().unwrap());
    drop(b);
    drop(a);
    assert!(!exists(&server, "bl:fenced"));
}

#[test]
fn try_lock_for_gives_up_by_its_bound_and_an_unlock_wakes_a_waiter_at_once() {
    let server = RedisServer::start();
    let c = client(&server, WD);
    let lock = c.lock("bl:bound");
    let held = lock.lock().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            assert!(lock.try_lock().unwrap().is_none());
            let got = lock.try_lock_for(Duration::from_millis(300), None).unwrap();
            let took = start.elapsed();
            assert!(got.is_none());
            assert!(
                took >= Duration::from_millis(300) && took < Duration::from_millis(800),
                "try_lock_for(300 ms) returned after {took:?}"
            );
            let start = Instant::now();
            let until = Instant::now() + Duration::from_millis(200);
            assert!(lock.try_lock_until(until, None).unwrap().is_none());
            assert!(start.elapsed() < Duration::from_millis(700));
        });
    });
    // A waiter sleeps on the channel; the unlock wakes it long before the holder's
    // 30 s lease would have.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            let g = lock
                .try_lock_for(Duration::from_secs(10), Some(Duration::from_secs(5)))
                .unwrap()
                .expect("served");
            let ttl = lock.remaining_ttl().unwrap().unwrap();
            assert!(ttl <= Duration::from_secs(5) && !g.is_watchdog());
            (start.elapsed(), g.unlock())
        });
        let channel = lock.channel().to_string();
        assert!(eventually(Duration::from_secs(5), || server
            .numsub(&channel)
            == 1));
        std::thread::sleep(Duration::from_millis(100));
        held.unlock().unwrap();
        let (waited, unlocked) = waiter.join().unwrap();
        unlocked.unwrap();
        assert!(waited < Duration::from_secs(3), "woken after {waited:?}");
    });
}

#[test]
fn dropping_a_guard_releases_before_drop_returns() {
    let server = RedisServer::start();
    let c = client(&server, WD);
    let lock = c.lock("bl:drop");
    for _ in 0..20 {
        let g = lock.lock().unwrap();
        drop(g);
        assert!(!exists(&server, "bl:drop"), "still locked after drop");
    }
    let g = lock.lock_with_lease(Duration::from_secs(10)).unwrap();
    // Sent to another thread and dropped there: the hold it was taken with goes.
    std::thread::spawn(move || drop(g)).join().unwrap();
    assert!(!exists(&server, "bl:drop"));
    // A panic inside `run` releases through the guard's drop.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lock.run(|| panic!("work failed")).unwrap();
    }));
    assert!(panicked.is_err());
    assert!(!exists(&server, "bl:drop"));
    assert_eq!(lock.run(|| 7).unwrap(), 7);
}

#[test]
fn the_watchdog_renews_a_lock_while_its_thread_sleeps() {
    let server = RedisServer::start();
    let wd = Duration::from_millis(300);
    let (holder, other) = (client(&server, wd), client(&server, wd));
    let g = holder.lock("bl:wd").lock().unwrap();
    assert!(g.is_watchdog());
    // Five leases long, with no call of this thread meanwhile.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!g.is_lost(), "lost while the thread slept");
    let ttl: i64 = server.cmd(&["PTTL", "bl:wd"]);
    assert!(ttl > 0, "PTTL {ttl}");
    assert!(other.lock("bl:wd").try_lock().unwrap().is_none());
    g.unlock().unwrap();
    assert!(other.lock("bl:wd").try_lock().unwrap().is_some());
}

#[tokio::test]
async fn spawn_blocking_works_on_a_current_thread_runtime_with_either_runtime() {
    let server = RedisServer::start();
    let url = server.url();
    let handle = tokio::runtime::Handle::current();
    let done = tokio::task::spawn_blocking(move || {
        let own = Client::builder(&url).build().unwrap();
        let given = Client::builder(&url).build_on(handle).unwrap();
        for (c, name) in [(&own, "bl:sb:own"), (&given, "bl:sb:given")] {
            let lock = c.lock(name);
            let g = lock.lock().unwrap();
            // The blocking task is the owner, not its pooled thread (module docs, Owners).
            assert_eq!(g.owner(), OwnerId::current());
            assert!(matches!(g.owner(), OwnerId::Task(_)));
            let again = lock.try_lock().unwrap().expect("re-enters in this closure");
            assert_eq!(lock.hold_count().unwrap(), 2);
            // Another blocking task runs on another thread: it waits.
            let other = lock.clone();
            let h = std::thread::spawn(move || other.try_lock().unwrap().is_none());
            assert!(h.join().unwrap());
            drop(again);
            g.unlock().unwrap();
            assert!(!lock.is_locked().unwrap());
        }
        own.shutdown().unwrap();
        given.shutdown().unwrap();
    });
    tokio::time::timeout(Duration::from_secs(30), done)
        .await
        .expect("spawn_blocking finished")
        .unwrap();
}

#[tokio::test]
async fn a_call_on_a_current_thread_runtime_is_refused_with_a_typed_error() {
    let server = RedisServer::start();
    let url = server.url();
    assert!(matches!(
        Client::builder(&url).build(),
        Err(Error::BlockingNotAllowed)
    ));
    let c = tokio::task::spawn_blocking(move || Client::builder(&url).build())
        .await
        .unwrap()
        .unwrap();
    let lock = c.lock("bl:refused");
    assert!(matches!(lock.lock(), Err(Error::BlockingNotAllowed)));
    assert!(matches!(lock.try_lock(), Err(Error::BlockingNotAllowed)));
    assert!(matches!(lock.is_locked(), Err(Error::BlockingNotAllowed)));
    assert!(matches!(c.shutdown(), Err(Error::BlockingNotAllowed)));
    assert!(
        !exists(&server, "bl:refused"),
        "a refused call sent nothing"
    );
    // A guard taken elsewhere and dropped here is released in the background.
    let l = lock.clone();
    let g = tokio::task::spawn_blocking(move || l.lock().unwrap())
        .await
        .unwrap();
    assert!(exists(&server, "bl:refused"));
    drop(g);
    let start = Instant::now();
    while exists(&server, "bl:refused") {
        assert!(start.elapsed() < Duration::from_secs(5), "not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The last handle goes here too: its runtime stops without blocking (no panic).
    drop(lock);
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_multi_thread_runtime_blocks_in_place() {
    let server = RedisServer::start();
    // On the thread running the test's own future.
    let c = Client::builder(server.url()).build().unwrap();
    let lock = c.lock("bl:mt");
    let g = lock.lock().unwrap();
    assert!(lock.is_locked().unwrap());
    g.unlock().unwrap();
    // On a worker, inside a task.
    let l = lock.clone();
    let in_task = tokio::spawn(async move {
        let g = l.lock().unwrap();
        let locked = l.is_locked().unwrap();
        g.unlock().unwrap();
        locked
    });
    let locked = tokio::time::timeout(Duration::from_secs(10), in_task)
        .await
        .unwrap()
        .unwrap();
    assert!(locked);
    assert!(!exists(&server, "bl:mt"));
    c.shutdown().unwrap();
}

#[test]
fn shutdown_releases_holds_and_turns_waiting_threads_away() {
    let server = RedisServer::start();
    let c = client(&server, WD);
    let lock = c.lock("bl:shut");
    let g = lock.lock().unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            lock.try_lock_for(Duration::from_secs(10), None)
                .map(|g| g.is_some())
        });
        let channel = lock.channel().to_string();
        assert!(eventually(Duration::from_secs(5), || server
            .numsub(&channel)
            == 1));
        c.shutdown().unwrap();
        assert!(matches!(waiter.join().unwrap(), Err(Error::Closed)));
    });
    assert!(!exists(&server, "bl:shut"));
    assert!(g.is_lost());
    assert!(matches!(g.unlock(), Err(Error::Closed)));
    assert!(matches!(lock.try_lock(), Err(Error::Closed)));
}

#[test]
fn a_redisson_holder_excludes_a_thread_and_its_unlock_wakes_it() {
    let server = RedisServer::start();
    // What Redisson's acquire script leaves for Java thread 77 of another client.
    let _: i64 = server.cmd(&[
        "HINCRBY",
        "bl:java",
        "3f1c2c6e-0000-4000-8000-000000000002:77",
        "1",
    ]);
    let _: i64 = server.cmd(&["PEXPIRE", "bl:java", "30000"]);
    let c = client(&server, WD);
    let lock = c.lock("bl:java");
    assert!(lock.try_lock().unwrap().is_none());
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let g = lock
                .try_lock_for(Duration::from_secs(10), None)
                .unwrap()
                .expect("served after the Java unlock");
            let field = format!("{}:{}", c.id(), OwnerId::current_thread());
            let written = server.cmd::<i64>(&["HEXISTS", "bl:java", &field]);
            g.unlock().unwrap();
            written
        });
        let channel = lock.channel().to_string();
        assert_eq!(channel, "redisson_lock__channel:{bl:java}");
        assert!(eventually(Duration::from_secs(5), || server
            .numsub(&channel)
            == 1));
        // Redisson's unlock: DEL, then PUBLISH 0.
        let _: i64 = server.cmd(&["DEL", "bl:java"]);
        let _: i64 = server.cmd(&["PUBLISH", &channel, "0"]);
        assert_eq!(
            waiter.join().unwrap(),
            1,
            "the waiter's thread field was written"
        );
    });
}

#[test]
fn threads_take_a_fair_lock_in_order_and_share_a_read_lock() {
    let server = RedisServer::start();
    let c = client(&server, WD);
    let held = c.fair_lock("bl:fair").lock().unwrap();
    let order = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for i in 0..3 {
        let (lock, order) = (c.fair_lock("bl:fair"), order.clone());
        threads.push(std::thread::spawn(move || {
            let g = lock.lock().unwrap();
            order.lock().push(i);
            g.unlock().unwrap();
        }));
        let queue = redis_rlock::protocol::queue_key("bl:fair");
        assert!(eventually(Duration::from_secs(5), || {
            server
                .cmd::<Vec<String>>(&["LRANGE", &queue, "0", "-1"])
                .len()
                == i + 1
        }));
    }
    held.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*order.lock(), [0, 1, 2]);

    // Two threads read together; a writer waits for both.
    let r1 = c.read_lock("bl:rw").lock().unwrap();
    let r2 = std::thread::spawn({
        let l = c.read_lock("bl:rw");
        move || l.try_lock().unwrap().is_some()
    })
    .join()
    .unwrap();
    assert!(r2, "a second reader was kept out");
    // This thread reads, so its own write is an upgrade, refused at once.
    assert!(matches!(
        c.write_lock("bl:rw").try_lock(),
        Err(Error::UpgradeRefused { .. })
    ));
    let kept_out = std::thread::spawn({
        let l = c.write_lock("bl:rw");
        move || l.try_lock().unwrap().is_none()
    })
    .join()
    .unwrap();
    assert!(kept_out, "a writer got in past a reader");
    r1.unlock().unwrap();
    let w = c
        .write_lock("bl:rw")
        .try_lock()
        .unwrap()
        .expect("free for the writer");
    w.unlock().unwrap();
}

/// The family in blocking form, across threads: a semaphore of 2 never has 3 holders and
/// gets its permits back; an expirable permit comes back when its lease ends; a latch
/// wakes every waiting thread at zero; a read-write lock's readers share while its
/// writer waits; and a guard tells a watching thread that it was lost.
#[test]
fn threads_use_semaphores_latches_read_write_locks_and_the_loss_signal() {
    let s = RedisServer::start();
    let c = client(&s, Duration::from_millis(600));

    let sem = c.semaphore("bl:sem");
    assert!(sem.try_set_permits(2).unwrap());
    let inside = std::sync::Arc::new(AtomicUsize::new(0));
    let most = std::sync::Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    assert!(sem.try_acquire_for(1, Duration::from_secs(10)).unwrap());
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    sem.release(1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 2);
    assert_eq!(sem.available_permits().unwrap(), 2);
    assert!(matches!(sem.acquire(0), Err(Error::InvalidCount { .. })));

    let pes = c.permit_expirable_semaphore("bl:pes");
    assert!(pes.try_set_permits(1).unwrap());
    let taken = pes.acquire(Duration::from_millis(300)).unwrap();
    assert_eq!(taken.id().len(), 32);
    let started = Instant::now();
    let again = pes
        .try_acquire(Duration::from_secs(5), Duration::from_secs(5))
        .unwrap()
        .expect("the first permit's lease ended");
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(!pes.try_release(taken.id()).unwrap());
    pes.release(again.id()).unwrap();

    let latch = c.count_down_latch("bl:latch");
    assert!(latch.try_set_count(2).unwrap());
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let latch = latch.clone();
            std::thread::spawn(move || latch.wait_for(Duration::from_secs(10)).unwrap())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(latch.count_down().unwrap(), 1);
    assert_eq!(latch.count_down().unwrap(), 0);
    for w in waiters {
        assert!(w.join().unwrap(), "a thread was not woken at zero");
    }

    let rw = c.read_write_lock("bl:rw");
    let r1 = rw.read().lock().unwrap();
    let r2 = {
        let rw = rw.clone();
        std::thread::spawn(move || rw.read().try_lock().unwrap().is_some())
    };
    assert!(r2.join().unwrap(), "readers of two threads did not share");
    assert!(matches!(
        rw.write().try_lock(),
        Err(Error::UpgradeRefused { .. })
    ));
    let writer = {
        let rw = rw.clone();
        std::thread::spawn(move || {
            rw.write()
                .try_lock_for(Duration::from_secs(5), None)
                .unwrap()
                .is_some()
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    r1.unlock().unwrap();
    assert!(writer.join().unwrap(), "the writer did not get in");

    let g = c.lock("bl:lost").lock().unwrap();
    assert!(g.holder_field().starts_with(c.id()));
    assert!(!g.wait_lost(Duration::from_millis(100)).unwrap());
    let _: () = s.cmd(&["DEL", "bl:lost"]);
    assert!(
        g.wait_lost(Duration::from_secs(3)).unwrap(),
        "the loss went unnoticed"
    );
    assert!(g.is_lost());
    assert!(matches!(g.unlock(), Err(Error::LeaseLost { .. })));
}
