//! Trust at the edges: a lost lease is reported at once whatever stopped the renewals, a
//! wait keeps its bound while Redis stalls, every unlock message reaches a waiter of each
//! lock name on its channel, and errors are typed with nothing left behind.
//!
//! Measured figures are printed as `FIGURE <name> <value>` lines (`--nocapture`).

mod common;

use std::time::{Duration, Instant};

use common::{client_with, RedisServer};
use redis_rlock::{Client, Error};

fn figure(name: &str, value: impl std::fmt::Debug) {
    println!("FIGURE {name} {value:?}");
}

/// The holder's thread is blocked past its lease (a long synchronous call on a
/// current-thread runtime, so the watchdog cannot run): `is_lost()` is true as soon as
/// the thread runs again, before any task had a chance to, and `lost()` is ready.
#[test]
fn is_lost_is_true_once_the_confirmed_lease_has_passed_even_if_no_renewal_ran() {
    let s = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let wd = Duration::from_millis(1000);
        let c = client_with(&s.url(), wd, Duration::from_millis(500)).await;
        let other = client_with(&s.url(), wd, Duration::from_millis(500)).await;
        let lock = c.lock("edge:blocked");
        let g = lock.lock().await.unwrap();
        assert!(!g.is_lost());
        // Another process takes the lock while this thread is blocked.
        let url = s.url();
        let taker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1400));
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let taken: i64 = redis::cmd("HSETNX")
                .arg("edge:blocked")
                .arg("someone-else:1")
                .arg(1)
                .query(&mut conn)
                .unwrap();
            taken
        });
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(
            taker.join().unwrap(),
            1,
            "the lease did not run out in Redis"
        );
        // No await in between: the watchdog has had no chance to run.
        assert!(g.is_lost(), "is_lost() false after the lease ran out");
        let ready = tokio::time::timeout(Duration::from_millis(1), g.lost()).await;
        assert!(ready.is_ok(), "lost() not ready after the lease ran out");
        assert!(matches!(g.unlock().await, Err(Error::LeaseLost { .. })));
        // The other holder was not disturbed by the lost guard's unlock.
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", "edge:blocked", "someone-else:1"]),
            Some(1)
        );
        drop(other);
    });
}

/// Redis stalls while `lock()` is retried; the answer comes after its first send's lease
/// would have run out. The lease is counted from the send that was answered, so the
/// guard returned is live, and it is released by its unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_answered_after_a_stall_returns_a_live_guard_or_none() {
    let s = RedisServer::start();
    let c = client_with(
        &s.url(),
        Duration::from_millis(2000),
        Duration::from_millis(1000),
    )
    .await;
    let lock = c.lock("edge:stall");
    // Warm the connection and the scripts.
    lock.lock().await.unwrap().unlock().await.unwrap();
    s.signal("STOP");
    let stopped = Instant::now();
    let resume = {
        let pid = s.pid();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(4000));
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        })
    };
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let got = tokio::time::timeout(Duration::from_secs(15), lock.lock())
        .await
        .expect("lock() hung");
    resume.join().unwrap();
    figure("stall_lock_returned_after", stopped.elapsed());
    match got {
        Ok(g) => {
            assert!(!g.is_lost(), "lock() returned a guard already lost");
            let field = g.holder_field().to_string();
            assert_eq!(
                s.cmd::<Option<i64>>(&["HGET", "edge:stall", &field]),
                Some(1)
            );
            g.unlock().await.expect("unlock of the returned guard");
        }
        Err(e) => assert!(e.is_transient(), "{e}"),
    }
    // Nothing is left held either way.
    let freed = common::eventually(Duration::from_secs(3), || {
        s.cmd::<i64>(&["EXISTS", "edge:stall"]) == 0
    })
    .await;
    assert!(freed, "a hold was left behind");
}

/// During a Redis stall, a waiting call returns at its deadline and a single try within
/// one response timeout; what they sent finishes in the background and leaves no hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_keep_their_bound_while_redis_stalls() {
    let s = RedisServer::start();
    let response = Duration::from_millis(1000);
    let c = client_with(&s.url(), Duration::from_secs(5), response).await;
    let lock = c.lock("edge:bound");
    lock.lock().await.unwrap().unlock().await.unwrap();
    s.signal("STOP");
    let cont = scopeguard(s.pid());

    let t = Instant::now();
    let r = lock.try_lock_for(Duration::from_millis(200), None).await;
    let waited = t.elapsed();
    figure("stall_try_lock_for_200ms_returned_after", waited);
    // No answer at all is not "busy": a transient timeout, by the deadline.
    assert!(
        matches!(&r, Err(e @ Error::Timeout { .. }) if e.is_transient()),
        "{r:?}"
    );
    assert!(waited < Duration::from_millis(450), "{waited:?}");

    let t = Instant::now();
    let r = lock.try_lock().await;
    let took = t.elapsed();
    figure("stall_try_lock_returned_after", took);
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(took < response + Duration::from_millis(250), "{took:?}");

    let t = Instant::now();
    let r = lock
        .try_lock_for(Duration::from_millis(300), Some(Duration::from_secs(10)))
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(550),
        "{:?}",
        t.elapsed()
    );

    drop(cont);
    // The attempts finish in the background after the stall, and give back what they got.
    let freed = common::eventually(Duration::from_secs(10), || {
        s.cmd::<i64>(&["EXISTS", "edge:bound"]) == 0
    })
    .await;
    assert!(freed, "an attempt left a hold behind");
    let g = lock
        .try_lock()
        .await
        .unwrap()
        .expect("free after the stall");
    g.unlock().await.unwrap();
}

/// SIGCONTs the process when dropped (also when an assertion fails).
fn scopeguard(pid: u32) -> impl Drop {
    struct Cont(u32);
    impl Drop for Cont {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.0.to_string()])
                .status();
        }
    }
    Cont(pid)
}

/// `coll` and `{coll}` share the channel `redisson_lock__channel:{coll}`. Releasing one
/// wakes its waiter even when a waiter of the other, still held, name waits too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_wakes_a_waiter_of_its_own_name_on_a_shared_channel() {
    let s = RedisServer::start();
    let wd = Duration::from_secs(10);
    let holder = client_with(&s.url(), wd, Duration::from_secs(1)).await;
    let z = client_with(&s.url(), wd, Duration::from_secs(1)).await;
    assert_eq!(
        redis_rlock::protocol::channel_name("coll"),
        redis_rlock::protocol::channel_name("{coll}")
    );
    let long = holder.lock("coll").lock().await.unwrap();
    let short = holder.lock("{coll}").lock().await.unwrap();

    let w1 = {
        let l = z.lock("coll");
        tokio::spawn(async move { l.try_lock_for(Duration::from_secs(12), None).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let w2 = {
        let l = z.lock("{coll}");
        tokio::spawn(async move {
            let t = Instant::now();
            let g = l.try_lock_for(Duration::from_secs(12), None).await;
            (g, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    short.unlock().await.unwrap();
    let (g, _) = tokio::time::timeout(Duration::from_secs(15), w2)
        .await
        .unwrap()
        .unwrap();
    let after = released.elapsed();
    figure("shared_channel_other_name_served_after", after);
    let g = g.unwrap().expect("the {coll} waiter got its lock");
    assert!(
        after < Duration::from_secs(2),
        "{after:?}: slept out its TTL"
    );
    g.unlock().await.unwrap();
    assert!(
        !w1.is_finished(),
        "the coll waiter cannot have its lock yet"
    );
    long.unlock().await.unwrap();
    let g1 = tokio::time::timeout(Duration::from_secs(5), w1)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("the coll waiter got its lock");
    g1.unlock().await.unwrap();
}

/// A message on a lock channel that no unlock sent (`"1"`, garbage) costs at most one
/// attempt per lock name, however many waiters there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_message_costs_one_attempt_per_name_not_per_waiter() {
    let s = RedisServer::start();
    let wd = Duration::from_secs(10);
    let holder = client_with(&s.url(), wd, Duration::from_secs(1)).await;
    let z = client_with(&s.url(), wd, Duration::from_secs(1)).await;
    let a = holder.lock("stray").lock().await.unwrap();
    let b = holder.lock("{stray}").lock().await.unwrap();
    let mut waiters = Vec::new();
    for name in [
        "stray", "stray", "stray", "stray", "stray", "stray", "{stray}",
    ] {
        let l = z.lock(name);
        waiters.push(tokio::spawn(async move {
            let g = l.try_lock_for(Duration::from_secs(20), None).await.unwrap();
            match g {
                Some(g) => g.unlock().await.is_ok(),
                None => false,
            }
        }));
    }
    let channel = redis_rlock::protocol::channel_name("stray");
    let settled = common::eventually(Duration::from_secs(3), || s.numsub(&channel) == 1).await;
    assert!(settled);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for payload in ["1", "garbage"] {
        let before = s.calls("evalsha");
        let _: i64 = s.cmd(&["PUBLISH", &channel, payload]);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let attempts = s.calls("evalsha") - before;
        figure(&format!("stray_message_{payload}_attempts"), attempts);
        assert!(
            attempts <= 2,
            "{attempts} attempts for one `{payload}` message on 2 names"
        );
    }
    a.unlock().await.unwrap();
    b.unlock().await.unwrap();
    for w in waiters {
        let served = tokio::time::timeout(Duration::from_secs(25), w)
            .await
            .unwrap()
            .unwrap();
        assert!(served, "a waiter was not served");
    }
}

/// Credentials are checked when the client is built, and a refusal is permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_is_checked_at_build_and_typed() {
    let s = RedisServer::start();
    let _: () = s.cmd(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let build = |url: String| async move {
        Client::builder(&url)
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .build()
            .await
    };
    let t = Instant::now();
    for url in [
        s.url(),
        format!("redis://:wrong@127.0.0.1:{}", s.port),
        format!("redis://nobody:s3cret@127.0.0.1:{}", s.port),
    ] {
        match build(url.clone()).await {
            Err(e @ Error::AuthFailed { .. }) => assert!(!e.is_transient(), "{url}: {e}"),
            other => panic!("{url}: expected AuthFailed, got {other:?}"),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let c = build(format!("redis://:s3cret@127.0.0.1:{}", s.port))
        .await
        .unwrap();
    c.lock("auth").lock().await.unwrap().unlock().await.unwrap();
}

/// A fencing token counter that cannot issue a positive token makes a fenced lock's
/// acquisition fail with an error naming the counter, and takes no hold. A plain lock
/// never touches the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_token_counter_fails_typed_and_takes_no_hold() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), Duration::from_secs(5), Duration::from_secs(1)).await;
    let key = redis_rlock::protocol::token_key("tok");
    for corrupt in [
        &["SET", key.as_str(), "-3"][..],
        &["SET", key.as_str(), "abc"][..],
        &["HSET", key.as_str(), "f", "1"][..],
    ] {
        let _: () = s.cmd(&["DEL", &key]);
        let _: redis::Value = s.cmd(corrupt);
        let lock = c.fenced_lock("tok");
        for r in [
            lock.lock_with_lease(Duration::from_secs(20)).await.err(),
            lock.lock().await.err(),
            lock.try_lock().await.err(),
        ] {
            match r {
                Some(Error::BadTokenCounter { key: k }) => assert_eq!(k, key),
                other => panic!("{corrupt:?}: expected BadTokenCounter, got {other:?}"),
            }
        }
        assert_eq!(
            s.cmd::<i64>(&["EXISTS", "tok"]),
            0,
            "{corrupt:?} left a hold"
        );
        // The plain lock of the same name works, and leaves the counter as it was.
        let before: redis::Value = s.cmd(&["DUMP", &key]);
        let g = c.lock("tok").lock().await.unwrap();
        assert_eq!(g.fencing_token(), None);
        g.unlock().await.unwrap();
        assert_eq!(s.cmd::<redis::Value>(&["DUMP", &key]), before);
    }
    let _: () = s.cmd(&["DEL", &key]);
    let g = c.fenced_lock("tok").lock().await.unwrap();
    assert_eq!(g.fencing_token(), Some(1));
    g.unlock().await.unwrap();
}

/// The runtime a client was built in shuts down; the client is used from another one.
/// Its watchdog then runs where the locks are taken: a held lock stays held and is not
/// reported lost.
#[test]
fn a_client_outliving_its_runtime_keeps_renewing_locks_taken_elsewhere() {
    let s = RedisServer::start();
    let wd = Duration::from_millis(1500);
    let first = tokio::runtime::Runtime::new().unwrap();
    let c = first.block_on(client_with(&s.url(), wd, Duration::from_millis(500)));
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let g = match c.lock("edge:rt").lock().await {
            Ok(g) => g,
            // The command connection's driver died with the first runtime; the first
            // call may find it broken, the next one reconnects.
            Err(e) if e.is_transient() => c.lock("edge:rt").lock().await.unwrap(),
            Err(e) => panic!("{e}"),
        };
        tokio::time::sleep(wd * 3).await;
        assert!(!g.is_lost(), "lost although the client could renew");
        let field = g.holder_field().to_string();
        assert_eq!(s.cmd::<Option<i64>>(&["HGET", "edge:rt", &field]), Some(1));
        g.unlock().await.unwrap();
        assert_eq!(s.cmd::<i64>(&["EXISTS", "edge:rt"]), 0);
    });
}

/// A guard held while the runtime that ran the watchdog shuts down is reported lost at
/// that moment, not silently left to expire.
#[test]
fn a_guard_is_told_when_the_runtime_running_its_watchdog_goes_away() {
    let s = RedisServer::start();
    let wd = Duration::from_secs(20);
    let first = tokio::runtime::Runtime::new().unwrap();
    let (c, g) = first.block_on(async {
        let c = client_with(&s.url(), wd, Duration::from_millis(500)).await;
        let g = c.lock("edge:rt2").lock().await.unwrap();
        (c, g)
    });
    assert!(!g.is_lost());
    drop(first);
    assert!(
        g.is_lost(),
        "no renewal can happen, yet the guard was not told"
    );
    drop(g);
    drop(c);
}

/// Redis restarts without persistence right after a renewal. The next renewal finds the
/// old connection dead, is sent again at once on a new one, and reports the loss within
/// about one renewal period, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_is_reported_within_one_period() {
    let mut s = RedisServer::start();
    let wd = Duration::from_millis(1500);
    let period = wd / 3;
    let c = client_with(&s.url(), wd, Duration::from_millis(300)).await;
    let mut worst = Duration::ZERO;
    for trial in 0..3 {
        let name = format!("edge:restart:{trial}");
        let g = c.lock(name.as_str()).lock().await.unwrap();
        // Wait for a renewal: the PTTL jumps back up.
        let mut last: i64 = s.cmd(&["PTTL", &name]);
        let deadline = Instant::now() + wd;
        loop {
            tokio::time::sleep(Duration::from_millis(3)).await;
            let now: i64 = s.cmd(&["PTTL", &name]);
            if now > last + 50 {
                break;
            }
            last = now;
            assert!(Instant::now() < deadline, "no renewal seen");
        }
        s.restart();
        let restarted = Instant::now();
        tokio::time::timeout(wd * 2, g.lost())
            .await
            .expect("loss not reported");
        let took = restarted.elapsed();
        figure(&format!("restart_lost_after_trial_{trial}"), took);
        worst = worst.max(took);
    }
    figure("restart_lost_after_worst", worst);
    assert!(
        worst < period + period / 2,
        "{worst:?} with a {period:?} renewal period"
    );
}

/// The key is deleted, or taken over by another holder, under a held guard: the next
/// renewal finds it, so `lost()` completes within one renewal period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_taken_over_key_is_reported_within_one_period() {
    let s = RedisServer::start();
    let wd = Duration::from_millis(1500);
    let period = wd / 3;
    let c = client_with(&s.url(), wd, Duration::from_millis(500)).await;
    for (trial, takeover) in [(0, false), (1, true), (2, false), (3, true)] {
        let name = format!("edge:gone:{trial}");
        let g = c.lock(name.as_str()).lock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100 * trial)).await;
        let _: i64 = s.cmd(&["DEL", &name]);
        if takeover {
            let _: i64 = s.cmd(&["HSET", &name, "someone-else:1", "1"]);
        }
        let gone = Instant::now();
        tokio::time::timeout(wd * 2, g.lost())
            .await
            .expect("loss not reported");
        let took = gone.elapsed();
        let cause = if takeover { "taken_over" } else { "deleted" };
        figure(&format!("{cause}_lost_after_trial_{trial}"), took);
        assert!(took < period + period / 2, "{took:?}");
        assert!(matches!(g.unlock().await, Err(Error::LeaseLost { .. })));
        if takeover {
            // The lost guard's unlock left the new holder alone.
            assert_eq!(
                s.cmd::<Option<i64>>(&["HGET", &name, "someone-else:1"]),
                Some(1)
            );
        }
    }
}

/// A guard dropped and the lock taken again at once by the same owner with a fixed
/// lease: the drop's release goes first, so the new hold has its own lease, not the
/// dropped watchdog hold's.
#[tokio::test]
async fn a_lock_taken_right_after_a_drop_gets_its_own_lease() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), Duration::from_secs(30), Duration::from_secs(1)).await;
    let lock = c.lock("edge:redrop");
    for round in 0..3 {
        drop(lock.lock().await.unwrap());
        let g = lock
            .lock_with_lease(Duration::from_millis(200))
            .await
            .unwrap();
        let pttl: i64 = s.cmd(&["PTTL", "edge:redrop"]);
        assert!(
            (0..=200).contains(&pttl),
            "round {round}: PTTL {pttl} ms for a 200 ms lease"
        );
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(g.is_lost());
        assert_eq!(s.cmd::<i64>(&["EXISTS", "edge:redrop"]), 0, "round {round}");
        assert!(matches!(g.unlock().await, Err(Error::LeaseLost { .. })));
    }
}

/// A fixed-lease guard whose lease ran out, unlocked or dropped after the same owner took
/// the lock again: the newer hold is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_guard_leaves_a_newer_hold_of_its_owner_alone() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), Duration::from_secs(5), Duration::from_secs(1)).await;
    let other = client_with(&s.url(), Duration::from_secs(5), Duration::from_secs(1)).await;
    let lock = c.lock("edge:newer");
    for (round, by_drop) in [(0, false), (1, true)] {
        let old = lock
            .lock_with_lease(Duration::from_millis(100))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let newer = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
        if by_drop {
            drop(old);
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else {
            assert!(matches!(old.unlock().await, Err(Error::LeaseLost { .. })));
        }
        assert_eq!(
            s.cmd::<i64>(&["EXISTS", "edge:newer"]),
            1,
            "round {round}: the newer hold was released"
        );
        assert!(other.lock("edge:newer").try_lock().await.unwrap().is_none());
        newer.unlock().await.unwrap();
    }
}

/// A fixed lease taken inside a watchdog hold of the same task: the watchdog keeps the
/// key alive past the inner lease, so the inner guard is not lost while the outer hold
/// lives, its unlock gives back its hold, and the outer unlock frees the lock for others.
/// Taken the other way round, an inner watchdog hold that outlives an outer fixed lease
/// keeps it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_inside_a_watchdog_hold_lives_as_long_as_the_watchdog_hold() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), Duration::from_millis(900), Duration::from_secs(1)).await;
    let other = client_with(&s.url(), Duration::from_secs(5), Duration::from_secs(1)).await;
    let lock = c.lock("edge:nested-lease");
    let outer = lock.lock().await.unwrap();
    let inner = lock
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!outer.is_lost());
    assert!(
        !inner.is_lost(),
        "the inner lease is covered by the watchdog hold"
    );
    let ready = tokio::time::timeout(Duration::from_millis(50), inner.lost()).await;
    assert!(
        ready.is_err(),
        "lost() ready while the watchdog holds the key"
    );
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "edge:nested-lease"]), 0);
    assert!(other
        .lock("edge:nested-lease")
        .try_lock()
        .await
        .unwrap()
        .is_some());

    // The outer hold goes first: the inner lease is on its own again, and once it has
    // run out by the clock, the inner guard is lost and its unlock deletes what is left.
    let outer = lock.lock().await.unwrap();
    let inner = lock
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    outer.unlock().await.unwrap();
    assert!(!inner.is_lost());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(inner.is_lost());
    assert!(
        tokio::time::timeout(Duration::from_millis(50), inner.lost())
            .await
            .is_ok()
    );
    assert!(matches!(inner.unlock().await, Err(Error::LeaseLost { .. })));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "edge:nested-lease"]), 0);

    // A fixed lease first, a watchdog hold inside it taken before the lease ran out.
    let outer = lock
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    let inner = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!outer.is_lost() && !inner.is_lost());
    outer.unlock().await.unwrap();
    inner.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "edge:nested-lease"]), 0);
}

/// Replica sync asked of a single server: without a replica, no call waits out the
/// `WAIT` timeout (nothing is sent to wait for), and once a replica has attached, grants
/// wait for it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sync_on_a_server_without_replicas_costs_no_wait_timeout() {
    use redis_rlock::{ReplicaSync, SyncFailure};
    let s = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let c = Client::builder(s.url())
        .replica_sync(ReplicaSync::Wait {
            timeout: Duration::from_secs(1),
            acks: 1,
            on_failure: SyncFailure::Retry { attempts: 3 },
        })
        .build()
        .await
        .unwrap();
    let lock = c.lock("edge:sync-alone");
    let started = Instant::now();
    for _ in 0..5 {
        let g = lock
            .try_lock_for(Duration::from_millis(500), None)
            .await
            .unwrap()
            .expect("a free lock is granted");
        g.unlock().await.unwrap();
    }
    let took = started.elapsed();
    figure("sync_alone_5_pairs", took);
    assert!(took < Duration::from_millis(900), "{took:?}");
    assert_eq!(s.calls("wait"), 0, "WAIT sent to a server without replicas");

    // A replica attaches: grants wait for it again, and are acknowledged.
    let r = RedisServer::start_with(&["--replicaof", "127.0.0.1", &s.port.to_string()]);
    // Online at the master, and done loading at the replica (which acknowledges
    // nothing while it loads).
    let online = || {
        s.try_cmd::<String>(&["INFO", "replication"])
            .is_ok_and(|i| i.contains("state=online"))
            && r.try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
    };
    assert!(common::eventually(Duration::from_secs(20), online).await);
    let g = lock.lock().await.unwrap();
    assert!(s.calls("wait") >= 1, "no WAIT once a replica attached");
    assert_eq!(
        r.cmd::<i64>(&["EXISTS", "edge:sync-alone"]),
        1,
        "granted unsynced"
    );
    g.unlock().await.unwrap();
}
