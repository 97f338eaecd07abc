//! The smaller pieces of the API: `run`, the one-shot and deadline forms, a guard's lock,
//! and RedLock/MultiLock sharing `Lock`'s method names.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::{Client, Error, LockGuard, MultiLock, RedLock};

async fn client(s: &RedisServer, wd: Duration) -> Client {
    common::client_with(&s.url(), wd, Duration::from_secs(3)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_holds_the_lock_for_the_work_and_stops_it_when_the_lock_is_lost() {
    let s = RedisServer::start();
    let c = client(&s, Duration::from_millis(900)).await;
    let lock = c.lock("api:run");
    let seen = lock
        .run(|| async { s.cmd::<i64>(&["EXISTS", "api:run"]) })
        .await
        .unwrap();
    assert_eq!(seen, 1, "the work ran while the lock was held");
    assert_eq!(s.cmd::<i64>(&["EXISTS", "api:run"]), 0, "released after");

    // Lost during the work: the work is dropped and the call says so.
    let other = client(&s, Duration::from_secs(5)).await;
    let work = {
        let lock = lock.clone();
        tokio::spawn(async move {
            lock.run(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "finished"
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(other.lock("api:run").force_unlock().await.unwrap());
    let r = tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .expect("run() went on after its lock was lost")
        .unwrap();
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_and_deadline_forms() {
    let s = RedisServer::start();
    let a = client(&s, Duration::from_secs(5)).await;
    let b = client(&s, Duration::from_secs(5)).await;
    let la = a.lock("api:forms");
    let lb = b.lock("api:forms");

    let g = la
        .try_lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap()
        .expect("free");
    assert!(!g.is_watchdog());
    let pttl: i64 = s.cmd(&["PTTL", "api:forms"]);
    assert!((0..=300).contains(&pttl), "{pttl}");
    assert!(lb
        .try_lock_with_lease(Duration::from_secs(1))
        .await
        .unwrap()
        .is_none());

    // A deadline already passed makes one attempt.
    assert!(lb
        .try_lock_until(Instant::now(), None)
        .await
        .unwrap()
        .is_none());
    // A deadline after the lease ends: granted when it runs out.
    let t = Instant::now();
    let g2 = lb
        .try_lock_until(t + Duration::from_secs(3), None)
        .await
        .unwrap()
        .expect("granted once the 300 ms lease ran out");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // A deadline before anything frees it: `None` by the deadline.
    let t = Instant::now();
    assert!(la
        .try_lock_until(
            tokio::time::Instant::now() + Duration::from_millis(200),
            None
        )
        .await
        .unwrap()
        .is_none());
    assert!(
        t.elapsed() < Duration::from_millis(600),
        "{:?}",
        t.elapsed()
    );

    // A guard gives back the lock it holds.
    let same = LockGuard::lock(&g2);
    assert_eq!(same.name(), "api:forms");
    assert!(same.is_held_by_current_task().await.unwrap());
    drop(g);
    g2.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_and_multilock_share_the_lock_methods() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut parts = Vec::new();
    let mut others = Vec::new();
    for s in &servers {
        parts.push(client(s, Duration::from_secs(5)).await.lock("api:rl"));
        others.push(client(s, Duration::from_secs(5)).await.lock("api:rl"));
    }
    let rl = RedLock::new(parts).unwrap();
    let rl2 = RedLock::new(others).unwrap();
    let g = rl.try_lock().await.unwrap().expect("a majority is free");
    assert!(rl2.try_lock().await.unwrap().is_none());
    assert!(rl2
        .try_lock_with_lease(Duration::from_secs(1))
        .await
        .unwrap()
        .is_none());
    g.unlock().await.unwrap();
    let g = rl2
        .try_lock_with_lease(Duration::from_secs(2))
        .await
        .unwrap()
        .expect("free again");
    g.unlock().await.unwrap();

    let c = client(&servers[0], Duration::from_secs(5)).await;
    let d = client(&servers[0], Duration::from_secs(5)).await;
    let ml = MultiLock::new(vec![c.lock("api:m1"), c.lock("api:m2")]).unwrap();
    let ml2 = MultiLock::new(vec![d.lock("api:m2"), d.lock("api:m3")]).unwrap();
    let g = ml.try_lock().await.unwrap().expect("both free");
    assert!(ml2.try_lock().await.unwrap().is_none());
    // The part ml2 could take was given back.
    assert_eq!(servers[0].cmd::<i64>(&["EXISTS", "api:m3"]), 0);
    g.unlock().await.unwrap();
    let g = ml2
        .try_lock_with_lease(Duration::from_secs(2))
        .await
        .unwrap()
        .expect("free now");
    g.unlock().await.unwrap();
}
