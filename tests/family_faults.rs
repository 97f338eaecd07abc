//! Faults for each synchronizer of the family on a real Redis: a holder's process
//! SIGKILLed, Redis restarted under waiters, and the pub/sub connection killed under
//! sleeping waiters. Every wait is bounded; figures are printed as `FIGURE` lines.

mod common;

use std::time::{Duration, Instant};

use common::{tell_parent, ChildProc, RedisServer, CHILD_ENV};
use redis_rlock::Client;

/// The watchdog lease of the children, so that a killed holder's lock ends soon.
const CHILD_LEASE: Duration = Duration::from_millis(1_000);

async fn client(s: &RedisServer) -> Client {
    Client::builder(s.url())
        .watchdog_timeout(Duration::from_secs(30))
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

/// Child side: takes what its role names, says `HELD`, and waits to be killed.
#[test]
fn fault_child() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let url = std::env::var("RLOCK_URL").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let c = Client::builder(&url)
            .watchdog_timeout(CHILD_LEASE)
            .build()
            .await
            .unwrap();
        // Kept alive until the process dies.
        let mut held = Vec::new();
        match role.as_str() {
            "fair" => held.push(c.fair_lock("ff:fair").lock().await.unwrap()),
            "write" => held.push(c.read_write_lock("ff:rw").write().lock().await.unwrap()),
            "permit" => {
                let p = c
                    .permit_expirable_semaphore("ff:pes")
                    .acquire(CHILD_LEASE)
                    .await
                    .unwrap();
                std::mem::forget(p);
            }
            "semaphore" => c.semaphore("ff:sem").acquire(1).await.unwrap(),
            other => panic!("unknown role {other}"),
        }
        tell_parent("HELD");
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(held);
    });
}

fn killed_holder(s: &RedisServer, role: &str) -> Instant {
    let mut child = ChildProc::spawn("fault_child", role, &[("RLOCK_URL", s.url())]);
    child.expect_line("HELD", Duration::from_secs(30));
    assert!(child.signal("KILL"));
    child.kill();
    Instant::now()
}

/// A holder SIGKILLed: a fair lock, a write lock and an expirable permit come back when
/// the dead holder's lease ends (no queue left stuck); a plain semaphore's permit does
/// not, since permits carry no holder (as in Redisson).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_leaves_nothing_stuck_but_a_plain_permit() {
    let s = RedisServer::start();
    let c = client(&s).await;

    let killed = killed_holder(&s, "fair");
    let g = c
        .fair_lock("ff:fair")
        .try_lock_for(Duration::from_secs(10), None)
        .await
        .unwrap()
        .expect("the fair lock after the dead holder's lease");
    let fair_after = killed.elapsed();
    g.unlock().await.unwrap();
    let left: Vec<String> = s.cmd(&["KEYS", "*ff:fair*"]);
    assert!(left.is_empty(), "fair lock keys left: {left:?}");

    let killed = killed_holder(&s, "write");
    let g = c
        .read_write_lock("ff:rw")
        .read()
        .try_lock_for(Duration::from_secs(10), None)
        .await
        .unwrap()
        .expect("the read lock after the dead writer's lease");
    let rw_after = killed.elapsed();
    g.unlock().await.unwrap();

    let pes = c.permit_expirable_semaphore("ff:pes");
    assert!(pes.try_set_permits(1).await.unwrap());
    let killed = killed_holder(&s, "permit");
    let p = pes
        .try_acquire(Duration::from_secs(5), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the dead holder's permit, back at its lease's end");
    let pes_after = killed.elapsed();
    pes.release(p.id()).await.unwrap();

    let sem = c.semaphore("ff:sem");
    assert!(sem.try_set_permits(1).await.unwrap());
    killed_holder(&s, "semaphore");
    assert!(!sem
        .try_acquire_for(1, Duration::from_millis(1_500))
        .await
        .unwrap());
    assert_eq!(sem.available_permits().await.unwrap(), 0);

    println!(
        "FIGURE killed_holder_recovery fair {fair_after:?} rw {rw_after:?} permit {pes_after:?} (child lease {CHILD_LEASE:?})"
    );
    for after in [fair_after, rw_after, pes_after] {
        assert!(after < CHILD_LEASE * 6, "recovered after {after:?}");
    }
}

/// Redis restarted (without persistence) under waiters of each kind: lock waiters get
/// the lock (it is gone with the data), a latch waiter finds the latch open (gone
/// counts as zero, as in Redisson), and semaphore waiters keep their bound with nothing
/// to take; all of them within a few seconds, none hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_ride_out_a_redis_restart() {
    let mut s = RedisServer::start();
    let (holder, waiter) = (client(&s).await, client(&s).await);
    let fair = holder.fair_lock("fr:fair").lock().await.unwrap();
    let write = holder
        .read_write_lock("fr:rw")
        .write()
        .lock()
        .await
        .unwrap();
    assert!(holder.semaphore("fr:sem").try_set_permits(0).await.unwrap());
    assert!(holder
        .count_down_latch("fr:latch")
        .try_set_count(1)
        .await
        .unwrap());
    let w = waiter.clone();
    let fair_wait = tokio::spawn(async move {
        w.fair_lock("fr:fair")
            .try_lock_for(Duration::from_secs(15), None)
            .await
            .map(|g| g.is_some())
    });
    let w = waiter.clone();
    let read_wait = tokio::spawn(async move {
        w.read_write_lock("fr:rw")
            .read()
            .try_lock_for(Duration::from_secs(15), None)
            .await
            .map(|g| g.is_some())
    });
    let w = waiter.clone();
    let sem_wait = tokio::spawn(async move {
        w.semaphore("fr:sem")
            .try_acquire_for(1, Duration::from_secs(4))
            .await
    });
    let w = waiter.clone();
    let latch_wait = tokio::spawn(async move {
        w.count_down_latch("fr:latch")
            .wait_for(Duration::from_secs(15))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = Instant::now();
    s.restart();
    let bound = Duration::from_secs(20);
    let got_fair = tokio::time::timeout(bound, fair_wait)
        .await
        .unwrap()
        .unwrap();
    let got_read = tokio::time::timeout(bound, read_wait)
        .await
        .unwrap()
        .unwrap();
    let got_latch = tokio::time::timeout(bound, latch_wait)
        .await
        .unwrap()
        .unwrap();
    let all_locks = restarted.elapsed();
    let got_sem = tokio::time::timeout(bound, sem_wait)
        .await
        .unwrap()
        .unwrap();
    println!("FIGURE restart_recovery locks and latch within {all_locks:?}");
    assert!(matches!(got_fair, Ok(true)), "fair waiter: {got_fair:?}");
    assert!(matches!(got_read, Ok(true)), "read waiter: {got_read:?}");
    assert!(matches!(got_latch, Ok(true)), "latch waiter: {got_latch:?}");
    // Nothing to take: false at its bound, or a transient error, never a hang.
    assert!(
        matches!(got_sem, Ok(false)) || matches!(&got_sem, Err(e) if e.is_transient()),
        "semaphore waiter: {got_sem:?}"
    );
    assert!(all_locks < Duration::from_secs(10), "{all_locks:?}");
    // The old holder's guards went with the data. Their unlocks end in time: the first
    // send may meet the broken connection, and a retry that finds the field gone cannot
    // tell that from its own first send having released it, so either answer is fine.
    for g in [fair, write] {
        let r = tokio::time::timeout(Duration::from_secs(5), g.unlock()).await;
        assert!(r.is_ok(), "an unlock after the restart hung");
    }
}

/// The pub/sub connection killed (`CLIENT KILL TYPE pubsub`) while waiters of each kind
/// sleep: the release that follows still wakes them, at once, not at their TTL bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_after_their_pubsub_connection_was_killed() {
    let s = RedisServer::start();
    let (holder, waiter) = (client(&s).await, client(&s).await);
    let fair = holder.fair_lock("fp:fair").lock().await.unwrap();
    let write = holder
        .read_write_lock("fp:rw")
        .write()
        .lock()
        .await
        .unwrap();
    let sem = holder.semaphore("fp:sem");
    assert!(sem.try_set_permits(0).await.unwrap());
    let pes = holder.permit_expirable_semaphore("fp:pes");
    assert!(pes.try_set_permits(1).await.unwrap());
    let taken = pes.acquire(Duration::from_secs(60)).await.unwrap();
    let latch = holder.count_down_latch("fp:latch");
    assert!(latch.try_set_count(1).await.unwrap());

    let w = waiter.clone();
    let fair_wait = tokio::spawn(async move {
        let g = w.fair_lock("fp:fair").lock().await.unwrap();
        g.unlock().await.unwrap();
        Instant::now()
    });
    let w = waiter.clone();
    let read_wait = tokio::spawn(async move {
        let g = w.read_write_lock("fp:rw").read().lock().await.unwrap();
        g.unlock().await.unwrap();
        Instant::now()
    });
    let w = waiter.clone();
    let sem_wait = tokio::spawn(async move {
        w.semaphore("fp:sem").acquire(1).await.unwrap();
        Instant::now()
    });
    let w = waiter.clone();
    let pes_wait = tokio::spawn(async move {
        let p = w
            .permit_expirable_semaphore("fp:pes")
            .acquire(Duration::from_secs(5))
            .await
            .unwrap();
        std::mem::forget(p);
        Instant::now()
    });
    let w = waiter.clone();
    let latch_wait = tokio::spawn(async move {
        w.count_down_latch("fp:latch").wait().await.unwrap();
        Instant::now()
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let killed: i64 = s.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed >= 1, "no pub/sub connection to kill");
    // Let the hubs notice and subscribe again (the waiters retry once meanwhile).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    fair.unlock().await.unwrap();
    write.unlock().await.unwrap();
    sem.release(1).await.unwrap();
    pes.release(taken.id()).await.unwrap();
    latch.count_down().await.unwrap();
    let mut slowest = Duration::ZERO;
    for (what, t) in [
        ("fair", fair_wait),
        ("read", read_wait),
        ("semaphore", sem_wait),
        ("permit", pes_wait),
        ("latch", latch_wait),
    ] {
        let at = tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .unwrap_or_else(|_| panic!("{what} waiter slept through the release"))
            .unwrap();
        slowest = slowest.max(at.saturating_duration_since(released));
    }
    println!("FIGURE pubsub_killed_wake slowest {slowest:?}");
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
}
