//! Fault injection with real processes: SIGKILL, SIGSTOP, restarts, CLIENT KILL, and a
//! TCP proxy that cuts or black-holes connections. An overlap detector on a separate
//! redis-server checks that no two holders run the critical section at once.
//!
//! Measured figures are printed as `FIGURE <name> <value>` lines (`--nocapture`).

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{eventually, tell_parent, ChildProc, Overlap, RedisServer, CHILD_ENV};
use redis_rlock::{Client, Error};

fn figure(name: &str, value: impl std::fmt::Debug) {
    println!("FIGURE {name} {value:?}");
}

async fn client_with(url: &str, wd_ms: u64, response_ms: u64) -> Client {
    Client::builder(url)
        .watchdog_timeout(Duration::from_millis(wd_ms))
        .response_timeout(Duration::from_millis(response_ms))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

/// Child role: take `fault-lock` with a short watchdog and hold it until killed.
#[test]
fn child_worker() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    assert_eq!(role, "hold-forever");
    let url = std::env::var("RLOCK_URL").unwrap();
    let wd: u64 = std::env::var("RLOCK_WD_MS").unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let c = client_with(&url, wd, 1000).await;
        let g = c.fenced_lock("fault-lock").lock().await.unwrap();
        tell_parent(&format!("HELD {}", g.fencing_token().unwrap()));
        tokio::time::sleep(Duration::from_secs(600)).await;
        drop(g);
    });
}

/// 1. A holder process is SIGKILLed: the lock frees when its lease ends, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f1_sigkilled_holder_frees_the_lock_after_its_lease() {
    let s = RedisServer::start();
    let wd = 1000u64;
    let mut child = ChildProc::spawn(
        "child_worker",
        "hold-forever",
        &[("RLOCK_URL", s.url()), ("RLOCK_WD_MS", wd.to_string())],
    );
    let held = child.expect_line("HELD", Duration::from_secs(30));
    let child_token: u64 = held.split_whitespace().last().unwrap().parse().unwrap();
    // Let the watchdog renew a few times, then kill the holder.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", "fault-lock"]),
        1,
        "watchdog did not carry the lock"
    );
    let ttl_at_kill = Duration::from_millis(s.cmd::<i64>(&["PTTL", "fault-lock"]).max(0) as u64);
    child.kill();
    let killed = Instant::now();
    let c = client_with(&s.url(), 30_000, 1000).await;
    let g = tokio::time::timeout(Duration::from_secs(10), c.fenced_lock("fault-lock").lock())
        .await
        .unwrap()
        .unwrap();
    let took = killed.elapsed();
    figure("f1_reacquire_after_sigkill", took);
    figure("f1_ttl_at_kill", ttl_at_kill);
    assert!(
        took + Duration::from_millis(50) >= ttl_at_kill,
        "acquired after {took:?}, before the lease ({ttl_at_kill:?}) ran out"
    );
    assert!(
        took <= ttl_at_kill + Duration::from_millis(1500),
        "acquired only after {took:?}"
    );
    assert!(g.fencing_token().unwrap() > child_token);
    g.unlock().await.unwrap();
}

/// Runs `tasks` tasks on each client, looping lock / critical section / unlock until
/// `stop`. Errors are counted, not fatal. Returns (completed sections, errors).
async fn contend(
    clients: Vec<Client>,
    tasks: usize,
    detector_url: String,
    tag: &'static str,
    stop: Instant,
) -> (usize, usize) {
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let mut hs = Vec::new();
    for c in clients {
        for _ in 0..tasks {
            let lock = c.fenced_lock("contended");
            let (done, errors, url) = (done.clone(), errors.clone(), detector_url.clone());
            hs.push(tokio::spawn(async move {
                let mut det = Overlap::new(&url, tag).await;
                while Instant::now() < stop {
                    match lock.try_lock_for(Duration::from_secs(2), None).await {
                        Ok(Some(g)) => {
                            det.enter(g.fencing_token()).await;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            det.leave().await;
                            if g.unlock().await.is_err() {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => {}
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            }));
        }
    }
    for h in hs {
        h.await.unwrap();
    }
    (done.load(Ordering::Relaxed), errors.load(Ordering::Relaxed))
}

/// 2. Redis is SIGSTOPped for less than the lease: no second holder, and holders keep
/// their locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f2_sigstop_shorter_than_the_lease_keeps_holders() {
    let s = RedisServer::start();
    let det = RedisServer::start();
    let (wd, resp) = (3000, 1500);
    let a = client_with(&s.url(), wd, resp).await;
    let b = client_with(&s.url(), wd, resp).await;
    let held = a.fenced_lock("kept").lock().await.unwrap();
    let stop = Instant::now() + Duration::from_millis(2500);
    let work = tokio::spawn(contend(
        vec![a.clone(), b.clone()],
        4,
        det.url(),
        "f2",
        stop,
    ));
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.signal("STOP");
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.signal("CONT");
    let (done, errors) = work.await.unwrap();
    let (overlaps, sections, rising) = Overlap::report(&det, "f2");
    figure("f2_sections", done);
    figure("f2_errors", errors);
    figure("f2_overlaps", overlaps);
    assert_eq!(overlaps, 0);
    assert!(rising, "fencing tokens did not rise in grant order");
    assert!(sections > 10 && done > 10, "too little work: {done}");
    assert!(
        !held.is_lost(),
        "a pause shorter than the lease cost the lock"
    );
    assert_eq!(s.cmd::<i64>(&["HGET", "kept", held.holder_field()]), 1);
    held.unlock().await.unwrap();
}

/// 3a. Redis is SIGSTOPped for longer than the lease: the holder is told it lost the
/// lock, and the next holder's token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f3_sigstop_longer_than_the_lease_reports_lost() {
    let s = RedisServer::start();
    let (wd, resp) = (600, 300);
    let a = client_with(&s.url(), wd, resp).await;
    let g = a.fenced_lock("stalled").lock().await.unwrap();
    let old_token = g.fencing_token();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = Instant::now();
    s.signal("STOP");
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() did not fire while Redis was stopped");
    let lost_after = stopped.elapsed();
    figure("f3_lost_after_stop", lost_after);
    assert!(
        lost_after <= Duration::from_millis(wd + 300),
        "lost only after {lost_after:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(stopped.elapsed())).await;
    s.signal("CONT");
    let b = client_with(&s.url(), 30_000, 1000).await;
    let g2 = tokio::time::timeout(Duration::from_secs(5), b.fenced_lock("stalled").lock())
        .await
        .unwrap()
        .unwrap();
    assert!(g2.fencing_token() > old_token);
    assert!(matches!(g.unlock().await, Err(Error::LeaseLost { .. })));
    assert_eq!(
        s.cmd::<i64>(&["HGET", "stalled", g2.holder_field()]),
        1,
        "old holder touched the new lock"
    );
    g2.unlock().await.unwrap();
}

/// 3b. The holder is black-holed by the proxy: it learns of the loss no later than the
/// next holder gets the lock, and a fenced resource refuses its stale token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f3_blackholed_holder_is_told_and_fenced_off() {
    let s = RedisServer::start();
    let det = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let wd = 600;
    let a = client_with(&proxy.url(), wd, 300).await;
    let b = client_with(&s.url(), 30_000, 1000).await;
    let g = a.fenced_lock("partitioned").lock().await.unwrap();
    let mut res_a = Overlap::new(&det.url(), "f3b").await;
    assert!(res_a.enter(g.fencing_token()).await);
    let cut_at = Instant::now();
    proxy.set_blackhole(true);
    let lost_at = {
        let g = &g;
        async move {
            g.lost().await;
            Instant::now()
        }
    };
    let lock_b = b.fenced_lock("partitioned");
    let (lost_at, g2) = tokio::join!(lost_at, async {
        tokio::time::timeout(Duration::from_secs(5), lock_b.lock())
            .await
            .unwrap()
            .unwrap()
    });
    let acquired_at = Instant::now();
    figure("f3b_lost_after_blackhole", lost_at.duration_since(cut_at));
    figure(
        "f3b_next_holder_after_blackhole",
        acquired_at.duration_since(cut_at),
    );
    assert!(
        lost_at <= acquired_at,
        "the old holder was told only after the new one started"
    );
    assert!(g2.fencing_token() > g.fencing_token());
    // Both "inside" at once: the detector sees the overlap that lost() reported...
    let mut res_b = Overlap::new(&det.url(), "f3b").await;
    assert!(
        !res_b.enter(g2.fencing_token()).await,
        "overlap not detected"
    );
    // ...and a resource that keeps the highest token refuses the stale holder.
    let highest: u64 = det
        .cmd::<Vec<u64>>(&["LRANGE", "f3b:tokens", "-1", "-1"])
        .into_iter()
        .next()
        .unwrap_or(0);
    assert!(g.fencing_token().unwrap() < highest);
    res_b.leave().await;
    res_a.leave().await;
    proxy.set_blackhole(false);
    g2.unlock().await.unwrap();
}

/// 4. CLIENT KILL TYPE pubsub while 100 tasks wait on 10 names: every waiter is served
/// long before a TTL, and the subscription comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f4_pubsub_kill_with_a_hundred_waiters() {
    let s = RedisServer::start();
    let holder = Client::connect(&s.url()).await.unwrap();
    let waiter = Client::connect(&s.url()).await.unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("f4:{i}")).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(holder.lock(n.as_str()).lock().await.unwrap());
    }
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let lock = waiter.lock(names[i % 10].as_str());
        let served = served.clone();
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            served.fetch_add(1, Ordering::SeqCst);
            g.unlock().await.unwrap();
        }));
    }
    let all_subscribed = || s.all_numsub(&names, 1);
    assert!(eventually(Duration::from_secs(10), all_subscribed).await);
    let killed: i64 = s.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 1);
    let killed_at = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), all_subscribed).await,
        "subscriptions did not come back"
    );
    figure("f4_resubscribed_after", killed_at.elapsed());
    let released = Instant::now();
    common::release_and_join(guards, tasks).await;
    let all_served = released.elapsed();
    figure("f4_all_100_served_after_release", all_served);
    assert_eq!(served.load(Ordering::SeqCst), 100);
    // The holders' TTL was the 30 s watchdog lease: nobody waited for it.
    assert!(all_served < Duration::from_secs(15));
    assert!(eventually(Duration::from_secs(5), || s.all_numsub(&names, 0)).await);
}

/// 5. Connections are killed and cut during lock, unlock and renew. Calls succeed or
/// fail with an error; nobody overlaps; nothing stays locked past one lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f5_connection_kills_and_cuts_during_operations() {
    let s = RedisServer::start();
    let det = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let wd = 600;
    let a = client_with(&proxy.url(), wd, 300).await;
    let b = client_with(&s.url(), wd, 300).await;
    let stop = Instant::now() + Duration::from_millis(3000);
    let work = tokio::spawn(contend(
        vec![a.clone(), b.clone()],
        3,
        det.url(),
        "f5",
        stop,
    ));
    // Reentrant holds across the chaos: an unlock must never count down twice.
    let reentrant = {
        let lock = a.fenced_lock("f5-nested");
        let twice = Arc::new(AtomicU64::new(0));
        let t2 = twice.clone();
        let s_url = s.url();
        let h = tokio::spawn(async move {
            let raw = redis::Client::open(s_url).unwrap();
            while Instant::now() < stop {
                let Ok(outer) = lock.lock().await else {
                    continue;
                };
                let Ok(inner) = lock.lock().await else {
                    let _ = outer.unlock().await;
                    continue;
                };
                let field = inner.holder_field().to_string();
                if inner.unlock().await.is_ok() {
                    if let Ok(mut c) = raw.get_connection_with_timeout(Duration::from_secs(1)) {
                        let n: Option<i64> = redis::cmd("HGET")
                            .arg("f5-nested")
                            .arg(&field)
                            .query(&mut c)
                            .unwrap_or(Some(1));
                        if n != Some(1) && !outer.is_lost() {
                            t2.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                let _ = outer.unlock().await;
            }
        });
        (h, twice)
    };
    let mut chaos = 0;
    while Instant::now() < stop {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if chaos % 2 == 0 {
            proxy.cut();
        } else {
            let _ = s.try_cmd::<i64>(&["CLIENT", "KILL", "TYPE", "normal"]);
        }
        chaos += 1;
    }
    let (done, errors) = work.await.unwrap();
    reentrant.0.await.unwrap();
    let (overlaps, _, rising) = Overlap::report(&det, "f5");
    figure("f5_faults_injected", chaos);
    figure("f5_sections", done);
    figure("f5_errors", errors);
    figure("f5_overlaps", overlaps);
    figure("f5_double_countdowns", reentrant.1.load(Ordering::SeqCst));
    assert_eq!(overlaps, 0);
    assert!(rising);
    assert!(done > 20, "too little work got through: {done}");
    assert_eq!(
        reentrant.1.load(Ordering::SeqCst),
        0,
        "an unlock counted down twice"
    );
    // Anything an interrupted acquire left behind expires within one lease.
    let free = || {
        s.try_cmd::<i64>(&["EXISTS", "contended", "f5-nested"])
            .map(|n| n == 0)
            .unwrap_or(false)
    };
    assert!(
        eventually(Duration::from_millis(wd + 1500), free).await,
        "a lock stayed held"
    );
}

/// 6. Redis restarts without persistence while locks are held: the guards report lost
/// within about one renewal period, and new acquisitions work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f6_restart_without_persistence_reports_lost() {
    let mut s = RedisServer::start();
    let wd = 900;
    let c = client_with(&s.url(), wd, 300).await;
    let mut guards = Vec::new();
    for i in 0..5 {
        guards.push(c.lock(format!("f6:{i}")).lock().await.unwrap());
    }
    s.restart();
    let restarted = Instant::now();
    for g in &guards {
        tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("no lost signal");
    }
    let took = restarted.elapsed();
    figure("f6_lost_after_restart", took);
    assert!(took <= Duration::from_millis(wd + 500), "{took:?}");
    let g = tokio::time::timeout(Duration::from_secs(5), c.lock("f6:0").lock())
        .await
        .unwrap()
        .unwrap();
    g.unlock().await.unwrap();
}

/// 7. Redis is down: lock() and try_lock() fail within the configured timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f7_redis_down_fails_within_the_timeouts() {
    let mut s = RedisServer::start();
    let c = client_with(&s.url(), 30_000, 300).await;
    s.kill();
    let mut worst = Duration::ZERO;
    for _ in 0..3 {
        for op in 0..3 {
            let start = Instant::now();
            let r = match op {
                0 => c.lock("f7").lock().await.map(|_| ()),
                1 => c.lock("f7").try_lock().await.map(|_| ()),
                _ => c
                    .lock("f7")
                    .try_lock_for(Duration::from_secs(30), None)
                    .await
                    .map(|_| ()),
            };
            assert!(r.is_err());
            worst = worst.max(start.elapsed());
        }
    }
    figure("f7_worst_error_latency", worst);
    // connect 500 ms, one retry, response 300 ms: well under 3 s.
    assert!(worst < Duration::from_secs(3), "{worst:?}");
}

/// 8. A thousand lock() and try_lock() futures dropped at random points: no lock is left
/// and no channel keeps a subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f8_a_thousand_dropped_futures_leave_nothing_behind() {
    let s = RedisServer::start();
    let holder = Client::connect(&s.url()).await.unwrap();
    let c = Client::connect(&s.url()).await.unwrap();
    let names: Vec<String> = (0..5).map(|i| format!("f8:{i}")).collect();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut holder_guard = None;
    for i in 0..1000u64 {
        // Every 50 rounds, a holder takes or drops one name, so some drops hit waiters.
        if i % 50 == 0 {
            holder_guard = match holder_guard.take() {
                Some(g) => {
                    drop(g);
                    None
                }
                None => Some(
                    holder
                        .lock(names[(i / 50 % 5) as usize].as_str())
                        .lock()
                        .await
                        .unwrap(),
                ),
            };
        }
        let lock = c.lock(names[(next() % 5) as usize].as_str());
        let cut = Duration::from_micros(next() % 1500);
        let kind = next() % 3;
        let fut = async move {
            match kind {
                0 => lock.lock().await.map(Some),
                1 => lock.try_lock().await,
                _ => lock.try_lock_for(Duration::from_millis(20), None).await,
            }
        };
        if let Ok(r) = tokio::time::timeout(cut, fut).await {
            drop(r.unwrap());
        }
    }
    drop(holder_guard);
    let free = || names.iter().all(|n| s.cmd::<i64>(&["EXISTS", n]) == 0);
    assert!(
        eventually(Duration::from_secs(5), free).await,
        "a dropped future left a lock"
    );
    let unsubscribed = || s.all_numsub(&names, 0);
    assert!(
        eventually(Duration::from_secs(5), unsubscribed).await,
        "a dropped future left a subscription"
    );
}

/// Renewal under latency: a renewal slower than the lease's remaining time marks the
/// guard lost rather than assuming the lock is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_slower_than_the_lease_marks_the_guard_lost() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let wd = 600;
    let c = client_with(&proxy.url(), wd, 2000).await;
    let g = c.lock("slow").lock().await.unwrap();
    // Moderate latency: renewals still make it in time.
    proxy.set_latency(Duration::from_millis(40));
    tokio::time::sleep(Duration::from_millis(wd * 2)).await;
    assert!(
        !g.is_lost(),
        "a renewal that arrived in time was not trusted"
    );
    // Latency beyond the lease: every renewal answer comes too late.
    proxy.set_latency(Duration::from_millis(wd));
    let slow_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("not marked lost");
    figure("renewal_latency_lost_after", slow_at.elapsed());
    proxy.set_latency(Duration::ZERO);
}
