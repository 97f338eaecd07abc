//! Core behaviour of the lock, on a real redis-server per test.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{eventually, tell_parent, ChildProc, RedisServer, CHILD_ENV};
use redis_rlock::{Client, Error};

async fn client(s: &RedisServer) -> Client {
    Client::connect(&s.url()).await.unwrap()
}

async fn client_wd(s: &RedisServer, wd: Duration) -> Client {
    Client::builder(s.url())
        .watchdog_timeout(wd)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_locks_count_up_and_down_while_another_task_waits() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let lock = c.lock("orders:42");

    let g1 = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    let g2 = lock.lock().await.unwrap();
    let g3 = lock
        .try_lock()
        .await
        .unwrap()
        .expect("re-entry must succeed");
    assert_eq!(lock.hold_count().await.unwrap(), 3);
    // Watchdog re-entries of a live hold are counted by the client, not in the hash.
    let field = g1.holder_field().to_string();
    assert_eq!(s.cmd::<String>(&["HGET", "orders:42", &field]), "1");
    // A fixed-lease re-entry is counted in the hash, as in Redisson.
    let g4 = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    assert_eq!(s.cmd::<String>(&["HGET", "orders:42", &field]), "2");
    assert_eq!(lock.hold_count().await.unwrap(), 4);
    g4.unlock().await.unwrap();
    assert_eq!(s.cmd::<String>(&["HGET", "orders:42", &field]), "1");

    // Another task contends: it must stay blocked until the count reaches 0.
    let acquired = Arc::new(AtomicBool::new(false));
    let other = {
        let lock = lock.clone();
        let acquired = acquired.clone();
        tokio::spawn(async move {
            assert!(!lock.is_held_by_current_task().await.unwrap());
            assert!(
                lock.try_lock().await.unwrap().is_none(),
                "other task must not re-enter"
            );
            let g = lock.lock().await.unwrap();
            acquired.store(true, Ordering::SeqCst);
            assert_eq!(lock.hold_count().await.unwrap(), 1);
            g.unlock().await.unwrap();
        })
    };

    g3.unlock().await.unwrap();
    g2.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    assert_eq!(s.cmd::<i64>(&["EXISTS", "orders:42"]), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !acquired.load(Ordering::SeqCst),
        "other task got in while a hold remained"
    );

    g1.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), other)
        .await
        .unwrap()
        .unwrap();
    assert!(acquired.load(Ordering::SeqCst));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "orders:42"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_moved_to_another_task_unlocks_its_own_hold() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let lock = c.lock("moved");
    let g = lock.lock().await.unwrap();
    let owner = g.owner();
    tokio::spawn(async move {
        assert_ne!(redis_rlock::OwnerId::current(), owner);
        g.unlock().await.unwrap();
    })
    .await
    .unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "moved"]), 0);
}

/// Child role for the multi-process tests; does nothing in a normal run.
#[test]
fn child_worker() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let url = std::env::var("RLOCK_URL").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let c = Client::connect(&url).await.unwrap();
        match role.as_str() {
            "hold" => {
                let g = c.lock("shared").lock().await.unwrap();
                tell_parent("HELD");
                // Hold until the parent closes our stdin... simpler: a fixed hold.
                tokio::time::sleep(Duration::from_millis(800)).await;
                g.unlock().await.unwrap();
                tell_parent("RELEASED");
            }
            "count" => {
                let tasks: u32 = std::env::var("RLOCK_TASKS").unwrap().parse().unwrap();
                let iters: u32 = std::env::var("RLOCK_ITERS").unwrap().parse().unwrap();
                increment_under_lock(&c, &url, tasks, iters).await;
                tell_parent("DONE");
            }
            other => panic!("unknown role {other}"),
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_contends_for_the_same_name() {
    let s = RedisServer::start();
    let mut child = ChildProc::spawn("child_worker", "hold", &[("RLOCK_URL", s.url())]);
    child.expect_line("HELD", Duration::from_secs(30));
    let c = client(&s).await;
    let lock = c.lock("shared");
    assert!(lock.is_locked().await.unwrap());
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "held by the other process"
    );
    let start = Instant::now();
    let g = lock.lock().await.unwrap();
    // We got it because the child released, not because a lease ran out (30 s).
    assert!(start.elapsed() < Duration::from_secs(15));
    child.expect_line("RELEASED", Duration::from_secs(5));
    g.unlock().await.unwrap();
    child.wait_success(Duration::from_secs(10));
}

/// A non-atomic GET/SET increment of `counter` under the lock, plus an overlap check.
async fn increment_under_lock(c: &Client, url: &str, tasks: u32, iters: u32) {
    let raw = redis::Client::open(url).unwrap();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let lock = c.lock("counter-lock");
        let raw = raw.clone();
        handles.push(tokio::spawn(async move {
            let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..iters {
                let g = tokio::time::timeout(Duration::from_secs(60), lock.lock())
                    .await
                    .expect("lock() hung")
                    .unwrap();
                let inside: i64 = redis::cmd("INCR")
                    .arg("inside")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(inside, 1, "two holders inside the critical section");
                let v: Option<i64> = redis::cmd("GET")
                    .arg("counter")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                let _: () = redis::cmd("SET")
                    .arg("counter")
                    .arg(v.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let _: i64 = redis::cmd("DECR")
                    .arg("inside")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                g.unlock().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_of_eight_tasks_lose_no_update() {
    let s = RedisServer::start();
    let (tasks, iters) = (8u32, 25u32);
    let envs = [
        ("RLOCK_URL", s.url()),
        ("RLOCK_TASKS", tasks.to_string()),
        ("RLOCK_ITERS", iters.to_string()),
    ];
    let mut a = ChildProc::spawn("child_worker", "count", &envs);
    let mut b = ChildProc::spawn("child_worker", "count", &envs);
    a.expect_line("DONE", Duration::from_secs(240));
    b.expect_line("DONE", Duration::from_secs(240));
    a.wait_success(Duration::from_secs(10));
    b.wait_success(Duration::from_secs(10));
    assert_eq!(
        s.cmd::<i64>(&["GET", "counter"]),
        (2 * tasks * iters) as i64
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "counter-lock"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_for_honours_its_wait() {
    let s = RedisServer::start();
    let holder = client(&s).await;
    let g = holder.lock("busy").lock().await.unwrap();
    let c = client(&s).await;
    for wait_ms in [50u64, 300] {
        let wait = Duration::from_millis(wait_ms);
        let start = Instant::now();
        let r = c.lock("busy").try_lock_for(wait, None).await.unwrap();
        let took = start.elapsed();
        assert!(r.is_none());
        assert!(
            took >= wait,
            "returned after {took:?}, before the wait of {wait:?}"
        );
        assert!(
            took < wait + Duration::from_secs(2),
            "returned after {took:?}"
        );
    }
    // A zero wait is one attempt.
    assert!(c
        .lock("busy")
        .try_lock_for(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    g.unlock().await.unwrap();
    let g = c
        .lock("busy")
        .try_lock_for(Duration::from_millis(100), None)
        .await
        .unwrap();
    assert!(g.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_lease_expires_and_frees_the_lock() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let b = client(&s).await;
    let g = a
        .lock("leased")
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(!g.is_watchdog());
    let ttl = a.lock("leased").remaining_ttl().await.unwrap().unwrap();
    assert!(
        ttl <= Duration::from_millis(300) && ttl > Duration::ZERO,
        "ttl {ttl:?}"
    );
    let start = Instant::now();
    let g2 = tokio::time::timeout(Duration::from_secs(10), b.lock("leased").lock())
        .await
        .unwrap()
        .unwrap();
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert!(g.is_lost());
    tokio::time::timeout(Duration::from_secs(1), g.lost())
        .await
        .unwrap();
    // The guard knew its lease had run out: the same answer as a lost watchdog hold.
    match g.unlock().await {
        Err(Error::LeaseLost { name }) => assert_eq!(name, "leased"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // ...and that unlock left the new holder alone.
    assert!(g2.is_watchdog() || !g2.is_lost());
    g2.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_carries_a_long_job_and_stops_after_unlock() {
    let s = RedisServer::start();
    let wd = Duration::from_millis(400);
    let c = client_wd(&s, wd).await;
    let lock = c.lock("long-job");
    let g = lock.lock().await.unwrap();
    assert!(g.is_watchdog());
    tokio::time::sleep(wd * 4).await;
    assert!(lock.is_locked().await.unwrap(), "lease was not renewed");
    assert!(!g.is_lost());
    assert!(lock.remaining_ttl().await.unwrap().unwrap() <= wd);
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    g.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "long-job"]), 0);
    // No renewal runs after the unlock: no script call at all reaches the server.
    let before = s.calls("evalsha") + s.calls("eval");
    tokio::time::sleep(wd * 2).await;
    assert_eq!(
        s.calls("evalsha") + s.calls("eval"),
        before,
        "a renewal ran after unlock"
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "long-job"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_completes_when_the_key_is_deleted_or_taken_over() {
    let s = RedisServer::start();
    let wd = Duration::from_millis(300);
    let c = client_wd(&s, wd).await;

    let g = c.lock("gone").lock().await.unwrap();
    let _: i64 = s.cmd(&["DEL", "gone"]);
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() did not complete after DEL");
    assert!(g.is_lost());
    assert!(matches!(g.unlock().await, Err(Error::LeaseLost { .. })));

    let g = c.lock("taken").lock().await.unwrap();
    let _: i64 = s.cmd(&["DEL", "taken"]);
    let _: i64 = s.cmd(&["HSET", "taken", "someone-else:1", "1"]);
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() did not complete after takeover");
    drop(g);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The usurper's hold is untouched by the lost guard.
    assert_eq!(s.cmd::<String>(&["HGET", "taken", "someone-else:1"]), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_unlock_message_not_the_ttl() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let b = client(&s).await;
    let g = a
        .lock("handoff")
        .lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let g = b.lock("handoff").lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    let channel = redis_rlock::protocol::channel_name("handoff");
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    g.unlock().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    let handoff = acquired.duration_since(released);
    assert!(
        handoff < Duration::from_secs(2),
        "hand-off took {handoff:?}"
    );
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pubsub_connection_serves_waiters_on_many_names() {
    let s = RedisServer::start();
    let holder = client(&s).await;
    let waiter = client(&s).await;
    let names: Vec<String> = (0..20).map(|i| format!("many:{i}")).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(holder.lock(n.as_str()).lock().await.unwrap());
    }
    let done = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for n in &names {
        for _ in 0..3 {
            let lock = waiter.lock(n.as_str());
            let done = done.clone();
            tasks.push(tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                done.fetch_add(1, Ordering::SeqCst);
                g.unlock().await.unwrap();
            }));
        }
    }
    assert!(eventually(Duration::from_secs(10), || s.all_numsub(&names, 1)).await);
    let list: String = s.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    assert_eq!(
        list.lines().count(),
        1,
        "expected one pub/sub connection: {list}"
    );
    common::release_and_join(guards, tasks).await;
    assert_eq!(done.load(Ordering::SeqCst), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_recover_when_the_pubsub_connection_is_killed() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let b = client(&s).await;
    let g = a
        .lock("resub")
        .lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap();
    let lock = b.lock("resub");
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        g.unlock().await.unwrap();
    });
    let channel = redis_rlock::protocol::channel_name("resub");
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    let killed: i64 = s.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 1);
    assert!(
        eventually(Duration::from_secs(10), || s.numsub(&channel) == 1).await,
        "subscription did not come back"
    );
    let released = Instant::now();
    g.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_layout_matches_redisson() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let lock = c.lock("orders:42");
    let g = lock.lock().await.unwrap();

    let all: HashMap<String, String> = s.cmd(&["HGETALL", "orders:42"]);
    assert_eq!(all.len(), 1);
    let (field, count) = all.into_iter().next().unwrap();
    assert_eq!(count, "1");
    let (uuid, owner) = field.rsplit_once(':').unwrap();
    assert_eq!(uuid, c.id());
    assert_eq!(uuid.len(), 36);
    assert_eq!(owner, g.owner().to_string());
    let pttl: i64 = s.cmd(&["PTTL", "orders:42"]);
    assert!(pttl > 25_000 && pttl <= 30_000, "PTTL {pttl}");

    // A raw subscriber on Redisson's channel sees the unlock message "0".
    let raw = redis::Client::open(s.url()).unwrap();
    let mut ps = raw.get_async_pubsub().await.unwrap();
    ps.subscribe("redisson_lock__channel:{orders:42}")
        .await
        .unwrap();
    g.unlock().await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), futures_next(&mut ps))
        .await
        .unwrap();
    assert_eq!(msg, "0");
    assert_eq!(s.cmd::<i64>(&["EXISTS", "orders:42"]), 0);
}

async fn futures_next(ps: &mut redis::aio::PubSub) -> String {
    use futures_util::StreamExt;
    let m = ps.on_message().next().await.unwrap();
    m.get_payload::<String>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_holder_in_redisson_layout_excludes_us_and_its_unlock_wakes_us() {
    let s = RedisServer::start();
    // What Redisson's acquire script leaves behind for a Java thread 77.
    let _: i64 = s.cmd(&[
        "HINCRBY",
        "shared-with-java",
        "3f1c2c6e-0000-4000-8000-000000000001:77",
        "1",
    ]);
    let _: i64 = s.cmd(&["PEXPIRE", "shared-with-java", "30000"]);
    let c = client(&s).await;
    let lock = c.lock("shared-with-java");
    assert!(lock.try_lock().await.unwrap().is_none());
    let waiter =
        tokio::spawn(async move { lock.lock().await.map(|g| g.holder_field().to_string()) });
    let channel = "redisson_lock__channel:{shared-with-java}";
    assert!(eventually(Duration::from_secs(5), || s.numsub(channel) == 1).await);
    // Redisson's unlock: DEL, then PUBLISH 0.
    let _: i64 = s.cmd(&["DEL", "shared-with-java"]);
    let _: i64 = s.cmd(&["PUBLISH", channel, "0"]);
    let field = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(field.starts_with(c.id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_and_changes_nothing() {
    let s = RedisServer::start();
    let c = client(&s).await;

    assert!(matches!(c.lock("").lock().await, Err(Error::EmptyName)));
    assert!(matches!(c.lock("").try_lock().await, Err(Error::EmptyName)));
    assert!(matches!(
        c.lock("").is_locked().await,
        Err(Error::EmptyName)
    ));
    let huge = "x".repeat(redis_rlock::MAX_NAME_LEN + 1);
    assert!(matches!(
        c.lock(huge).lock().await,
        Err(Error::NameTooLong { .. })
    ));

    let lock = c.lock("inputs");
    assert!(matches!(
        lock.lock_with_lease(Duration::ZERO).await,
        Err(Error::InvalidLease { .. })
    ));
    assert!(matches!(
        lock.lock_with_lease(Duration::from_micros(500)).await,
        Err(Error::InvalidLease { .. })
    ));
    assert!(matches!(
        lock.lock_with_lease(Duration::MAX).await,
        Err(Error::DurationOutOfRange { what: "lease", .. })
    ));
    assert!(matches!(
        lock.lock_with_lease(Duration::from_millis(i64::MAX as u64))
            .await,
        Err(Error::DurationOutOfRange { .. })
    ));
    // A wait beyond the largest duration is forever: the free lock is taken.
    lock.try_lock_for(Duration::MAX, None)
        .await
        .unwrap()
        .expect("a free lock")
        .unlock()
        .await
        .unwrap();
    assert!(matches!(
        lock.try_lock_for(Duration::MAX, Some(Duration::MAX)).await,
        Err(Error::DurationOutOfRange { what: "lease", .. })
    ));
    assert!(matches!(
        lock.try_lock_for(Duration::from_secs(1), Some(Duration::ZERO))
            .await,
        Err(Error::InvalidLease { .. })
    ));
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "bad input reached Redis: {keys:?}");

    // A key of another type.
    let _: () = s.cmd(&["SET", "a-string", "v"]);
    match c.lock("a-string").lock().await {
        Err(Error::WrongType { key }) => assert_eq!(key, "a-string"),
        other => panic!("expected WrongType, got {other:?}"),
    }
    assert!(matches!(
        c.lock("a-string").hold_count().await,
        Err(Error::WrongType { .. })
    ));
    // A force unlock deletes only locks.
    assert!(matches!(
        c.lock("a-string").force_unlock().await,
        Err(Error::WrongType { .. })
    ));
    assert_eq!(s.cmd::<String>(&["GET", "a-string"]), "v");

    // Non-owner unlock: our hold was force-unlocked and someone else holds the lock now.
    let g = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    assert!(lock.force_unlock().await.unwrap());
    let other = client(&s).await;
    let og = other.lock("inputs").lock().await.unwrap();
    match g.unlock().await {
        Err(Error::NotHeld { name, owner }) => {
            assert_eq!(name, "inputs");
            assert!(owner.starts_with(c.id()), "{owner}");
        }
        r => panic!("expected NotHeld, got {r:?}"),
    }
    assert_eq!(other.lock("inputs").hold_count().await.unwrap(), 1);
    let from_task = other.lock("inputs");
    let n = tokio::spawn(async move { from_task.hold_count().await.unwrap() })
        .await
        .unwrap();
    assert_eq!(n, 0, "another task holds nothing");
    assert!(og.holder_field().starts_with(other.id()));
    let all: HashMap<String, String> = s.cmd(&["HGETALL", "inputs"]);
    assert_eq!(all.get(og.holder_field()).map(String::as_str), Some("1"));
    og.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_settings_are_rejected() {
    let s = RedisServer::start();
    let r = Client::builder(s.url())
        .watchdog_timeout(Duration::ZERO)
        .build()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))));
    let r = Client::builder(s.url())
        .watchdog_timeout(Duration::MAX)
        .build()
        .await;
    assert!(matches!(r, Err(Error::DurationOutOfRange { .. })));
    let r = Client::builder(s.url())
        .response_timeout(Duration::ZERO)
        .build()
        .await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))));
    let r = Client::builder("not a url").build().await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_fails_within_the_timeouts() {
    // Nothing listens on a port we just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let r = Client::builder(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await;
    assert!(
        matches!(
            r,
            Err(Error::Unavailable { .. }) | Err(Error::Timeout { .. })
        ),
        "{r:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));

    // A server that dies after we connected.
    let mut s = RedisServer::start();
    let c = Client::builder(s.url())
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    s.kill();
    for _ in 0..3 {
        let start = Instant::now();
        let r = c.lock("down").lock().await;
        assert!(r.as_ref().is_err_and(|e| e.is_transient()), "{r:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        let r = c.lock("down").try_lock().await;
        assert!(r.is_err());
    }
    // And it works again once the server is back.
    s.restart();
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(g) = c.lock("down").try_lock().await {
            g.unwrap().unlock().await.unwrap();
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "client did not reconnect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_denial_is_reported_as_permission_denied() {
    let s = RedisServer::start();
    // Scripts declare the channel, the token counter and the unlock latch as keys too
    // (Redisson does), so the key patterns must cover them.
    let _: () = s.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">pw",
        "~app:*",
        "~redisson_*:{app:*",
        "&*",
        "+@all",
    ]);
    let url = format!("redis://locker:pw@127.0.0.1:{}", s.port);
    let c = Client::connect(&url).await.unwrap();
    let g = c.lock("app:allowed").lock().await.unwrap();
    g.unlock().await.unwrap();
    match c.lock("forbidden").lock().await {
        Err(Error::PermissionDenied { message }) => {
            assert!(message.to_uppercase().contains("NOPERM"), "{message}")
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    assert_eq!(s.cmd::<i64>(&["EXISTS", "forbidden"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_futures_leave_no_lock_and_no_subscription() {
    let s = RedisServer::start();
    let holder = client(&s).await;
    let c = client(&s).await;
    let names: Vec<String> = (0..4).map(|i| format!("cancel:{i}")).collect();

    // Waiters dropped while blocked behind a holder.
    let mut guards = Vec::new();
    for n in &names {
        guards.push(holder.lock(n.as_str()).lock().await.unwrap());
    }
    let mut pending = Vec::new();
    for n in &names {
        for _ in 0..5 {
            let lock = c.lock(n.as_str());
            pending.push(tokio::spawn(async move { lock.lock().await }));
        }
    }
    assert!(eventually(Duration::from_secs(5), || s.all_numsub(&names, 1)).await);
    for p in &pending {
        p.abort();
    }
    for p in pending {
        let _ = p.await;
    }
    assert!(eventually(Duration::from_secs(5), || s.all_numsub(&names, 0)).await);
    for g in guards {
        g.unlock().await.unwrap();
    }

    // Acquisitions dropped at arbitrary points, some mid-request, some while waiting.
    let mut seed = 0x9e37_79b9_u64;
    for i in 0..300u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let lock = c.lock(names[(i % 4) as usize].as_str());
        let cut = Duration::from_micros(seed % 400);
        let fut = async move {
            let g = if i % 2 == 0 {
                lock.lock().await
            } else {
                lock.try_lock_for(Duration::from_millis(50), Some(Duration::from_secs(30)))
                    .await
                    .map(|g| g.expect("free lock"))
            };
            g.unwrap()
        };
        if let Ok(g) = tokio::time::timeout(cut, fut).await {
            drop(g);
        }
    }
    let all_free = || names.iter().all(|n| s.cmd::<i64>(&["EXISTS", n]) == 0);
    assert!(
        eventually(Duration::from_secs(5), all_free).await,
        "a cancelled acquire left a lock held"
    );
    assert!(eventually(Duration::from_secs(5), || s.all_numsub(&names, 0)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_releases_in_the_background() {
    let s = RedisServer::start();
    let c = client(&s).await;
    {
        let _g = c.lock("dropped").lock().await.unwrap();
        assert_eq!(s.cmd::<i64>(&["EXISTS", "dropped"]), 1);
    }
    assert!(
        eventually(Duration::from_secs(5), || s
            .cmd::<i64>(&["EXISTS", "dropped"])
            == 0)
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_wakes_a_waiter_and_marks_local_guards_lost() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let b = client(&s).await;
    let g = a.lock("forced").lock().await.unwrap();
    let lock_b = b.lock("forced");
    let waiter = tokio::spawn(async move { lock_b.lock().await.unwrap().unlock().await });
    assert!(
        eventually(Duration::from_secs(5), || s
            .numsub(&redis_rlock::protocol::channel_name("forced"))
            == 1)
        .await
    );
    assert!(a.lock("forced").force_unlock().await.unwrap());
    assert!(g.is_lost());
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!a.lock("forced").force_unlock().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_with_every_acquisition() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let b = client(&s).await;
    let mut last = 0;
    for round in 0..5 {
        let c = if round % 2 == 0 { &a } else { &b };
        let lock = c.fenced_lock("fenced");
        assert!(lock.is_fenced());
        let outer = lock.lock().await.unwrap();
        let again = lock.try_lock().await.unwrap().unwrap();
        let inner = lock
            .try_lock_for(Duration::ZERO, Some(Duration::from_secs(30)))
            .await
            .unwrap()
            .unwrap();
        let (o, g, i) = (
            outer.fencing_token().unwrap(),
            again.fencing_token().unwrap(),
            inner.fencing_token().unwrap(),
        );
        assert!(o > last, "{o} after {last}");
        // Every re-entry of a fenced lock draws its own token, as Redisson's does.
        assert!(g > o && i > g, "{o} {g} {i}");
        assert_eq!(lock.hold_count().await.unwrap(), 3);
        last = i;
        inner.unlock().await.unwrap();
        again.unlock().await.unwrap();
        outer.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
    }
    let key = redis_rlock::protocol::token_key("fenced");
    assert_eq!(key, "redisson_lock_token:{fenced}");
    assert_eq!(s.cmd::<u64>(&["GET", &key]), last);
    // A plain lock writes what Redisson's RLock writes: no counter.
    let plain = a.lock("plain").lock().await.unwrap();
    let nested = a.lock("plain").lock().await.unwrap();
    assert_eq!(
        (plain.fencing_token(), nested.fencing_token()),
        (None, None)
    );
    nested.unlock().await.unwrap();
    plain.unlock().await.unwrap();
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", &redis_rlock::protocol::token_key("plain")]),
        0,
        "a plain lock wrote a token counter"
    );
    assert_eq!(
        s.cmd::<i64>(&["PTTL", &key]),
        -1,
        "the counter must outlive the lock"
    );
    // A counter of the wrong type fails the acquire and writes nothing.
    let _: () = s.cmd(&["SET", "redisson_lock_token:{odd}", "not-a-number"]);
    assert!(a.fenced_lock("odd").lock().await.is_err());
    assert_eq!(s.cmd::<i64>(&["EXISTS", "odd"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_unlock_whose_reply_was_lost_counts_down_once() {
    let s = RedisServer::start();
    let c = Client::builder(s.url())
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let lock = c.lock("idem");
    let outer = lock.lock().await.unwrap();
    // A fixed-lease re-entry goes through Redis (a watchdog one would stay local).
    let inner = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert_eq!(s.cmd::<i64>(&["HGET", "idem", inner.holder_field()]), 2);
    // Writes stall for longer than the response timeout: the first unlock times out, the
    // retry queues behind it, and both run when the pause ends.
    let _: () = s.cmd(&["CLIENT", "PAUSE", "700", "WRITE"]);
    inner
        .unlock()
        .await
        .expect("the retry must replay the first outcome");
    assert_eq!(lock.hold_count().await.unwrap(), 1, "counted down twice");
    outer.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "idem"]), 0);
    // The retried unlock's latch stays, for a late copy of its first send to find
    // (finding 7), and ends with its TTL: at most 10 minutes.
    let latches: Vec<String> = s.cmd(&["KEYS", "redisson_unlock_latch:*"]);
    assert_eq!(latches.len(), 1, "{latches:?}");
    let pttl: i64 = s.cmd(&["PTTL", &latches[0]]);
    assert!(
        (500_000..=600_000).contains(&pttl),
        "the latch's TTL: {pttl} ms"
    );
    // An unlock answered at once leaves none.
    let again = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    let twice = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    twice.unlock().await.unwrap();
    again.unlock().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            s.cmd::<Vec<String>>(&["KEYS", "redisson_unlock_latch:*"])
                .len()
                == 1
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_without_channel_rights_fails_unlock_and_leaves_the_lock_as_it_was() {
    let s = RedisServer::start();
    // Keys allowed, channels not (`resetchannels` is 7.0's default for a new user).
    let _: () = s.cmd(&[
        "ACL",
        "SETUSER",
        "nochan",
        "on",
        ">pw",
        "~app:*",
        "~redisson_*:{app:*",
        "resetchannels",
        "+@all",
    ]);
    let c = Client::connect(&format!("redis://nochan:pw@127.0.0.1:{}", s.port))
        .await
        .unwrap();
    let lock = c.lock("app:nochan");
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    // A partial unlock publishes nothing, so it works.
    inner.unlock().await.unwrap();
    let field = outer.holder_field().to_string();
    match outer.unlock().await {
        Err(Error::PermissionDenied { message }) => {
            assert!(message.contains("channel"), "{message}")
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    // The refused unlock changed nothing: the hold is still there.
    assert_eq!(s.cmd::<i64>(&["HGET", "app:nochan", &field]), 1);
    assert!(matches!(
        lock.force_unlock().await,
        Err(Error::PermissionDenied { .. })
    ));
    assert_eq!(s.cmd::<i64>(&["HGET", "app:nochan", &field]), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_inputs_a_one_mib_name_and_a_one_ms_lease() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let mib = "n".repeat(1 << 20);
    assert!(matches!(
        c.lock(mib).try_lock().await,
        Err(Error::NameTooLong { .. })
    ));
    // 1 ms is the shortest lease Redis can express: valid, and gone almost at once.
    let g = c
        .lock("brief")
        .lock_with_lease(Duration::from_millis(1))
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(2), || s
            .cmd::<i64>(&["EXISTS", "brief"])
            == 0)
        .await
    );
    assert!(matches!(g.unlock().await, Err(Error::LeaseLost { .. })));
    let keys: Vec<String> = s.cmd(&["KEYS", "n*"]);
    assert!(keys.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_while_a_dropped_guards_release_retries_is_kept() {
    // A release retried after a lost reply recognises its first send by the field
    // alone. The same task must not take the lock again in between, or the retry would
    // release that new hold.
    let s = RedisServer::start();
    let proxy = Arc::new(Proxy::start(s.port).await);
    let c = Client::builder(proxy.url())
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let lock = c.lock("ho-inflight");
    let warm = lock.lock().await.unwrap();
    warm.unlock().await.unwrap();
    let g = lock.lock().await.unwrap();
    let field = g.holder_field().to_string();
    // The release runs at 250 ms; its reply would come at 500 ms, after the 300 ms
    // timeout, so it is sent again at about 320 ms, with the delay gone by then.
    let lift = proxy.delay_for(Duration::from_millis(250), Duration::from_millis(280));
    drop(g);
    // Between the release's first run and its retry.
    tokio::time::sleep(Duration::from_millis(260)).await;
    let again = tokio::time::timeout(Duration::from_secs(10), lock.lock())
        .await
        .expect("lock() never returned")
        .unwrap();
    lift.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        s.cmd::<Option<i64>>(&["HGET", "ho-inflight", &field]),
        Some(1),
        "the retried release took the new hold away"
    );
    again.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "ho-inflight"]), 0);
}

/// The commands an uncontended lock+unlock pair makes Redis run inside the two scripts,
/// counted by the server: `EXISTS GET HINCRBY PEXPIRE` and `GET HGET LINDEX PUBLISH DEL`
/// with turns on (the default); Redisson's pair runs 7. No turn bookkeeping is written
/// when nobody waits. The unlock's `GET` reads its own latch, so that a late copy of an
/// unlock that was retried releases nothing (issue 24's finding 7; 8 before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_runs_nine_commands_in_redis() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let lock = c.lock("pair-cost");
    // The first pair loads the scripts.
    lock.lock().await.unwrap().unlock().await.unwrap();
    let data = [
        "exists", "get", "set", "del", "hincrby", "hget", "hexists", "hset", "hdel", "pexpire",
        "pttl", "publish", "lindex", "lpos", "rpush", "lpop", "lrem", "incr",
    ];
    let count = |s: &RedisServer| data.iter().map(|c| s.calls(c)).sum::<u64>();
    let before = count(&s);
    let pairs = 200;
    for _ in 0..pairs {
        lock.lock().await.unwrap().unlock().await.unwrap();
    }
    let per_pair = (count(&s) - before) as f64 / pairs as f64;
    println!("FIGURE commands_per_uncontended_pair {per_pair:.2}");
    assert_eq!(per_pair, 9.0);
}

/// An ACL written for Redisson, which grants its lock channels and nothing else, serves
/// this crate's waiters whole: turn messages travel on the lock's own channel. A waiter
/// of another client hears the unlock at once, not when the 30 s lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_the_turns_channels_still_wakes_waiters() {
    let s = RedisServer::start();
    let _: () = s.cmd(&[
        "ACL",
        "SETUSER",
        "oldacl",
        "on",
        ">pw",
        "~*",
        "resetchannels",
        "&redisson_lock__channel:*",
        "+@all",
    ]);
    let url = format!("redis://oldacl:pw@127.0.0.1:{}", s.port);
    let (a, b) = (
        Client::connect(&url).await.unwrap(),
        Client::connect(&url).await.unwrap(),
    );
    for round in 0..3 {
        let held = a.lock("app:acl-turns").lock().await.unwrap();
        let waiter = tokio::spawn({
            let l = b.lock("app:acl-turns");
            async move {
                let g = l.lock().await.unwrap();
                g.unlock().await.unwrap();
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        held.unlock().await.unwrap();
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter slept through the unlock"))
            .unwrap();
        println!(
            "FIGURE acl_without_turns_wake round {round}: {:?}",
            released.elapsed()
        );
    }
}
