//! RedLock over independent masters and MultiLock over several names, on real
//! redis-server processes.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Overlap, RedisServer};
use redis_rlock::{Client, Error, MultiLock, RedLock};

async fn client(url: &str) -> Client {
    Client::builder(url)
        .watchdog_timeout(Duration::from_millis(900))
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap()
}

struct Masters {
    servers: Vec<RedisServer>,
}

impl Masters {
    fn start(n: usize) -> Masters {
        Masters {
            servers: (0..n).map(|_| RedisServer::start()).collect(),
        }
    }

    async fn redlock(&self, name: &str) -> RedLock {
        let mut locks = Vec::new();
        for s in &self.servers {
            locks.push(client(&s.url()).await.lock(name));
        }
        RedLock::new(locks).unwrap()
    }

    fn holders(&self, name: &str) -> usize {
        self.servers
            .iter()
            .filter(|s| s.try_cmd::<i64>(&["EXISTS", name]).unwrap_or(0) == 1)
            .count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_grants_with_two_of_five_down_and_refuses_with_three() {
    let mut masters = Masters::start(5);
    let a = masters.redlock("rl:orders").await;
    assert_eq!(a.quorum(), 3);

    // All up: granted on all five; a second RedLock over the same masters is refused.
    let g = a
        .try_lock_for(Duration::from_secs(2), None)
        .await
        .unwrap()
        .expect("granted with 5 of 5");
    assert_eq!(g.parts().len(), 5);
    assert_eq!(masters.holders("rl:orders"), 5);
    let b = masters.redlock("rl:orders").await;
    assert!(b
        .try_lock_for(Duration::from_millis(300), None)
        .await
        .unwrap()
        .is_none());
    g.unlock().await.unwrap();
    assert_eq!(masters.holders("rl:orders"), 0);

    // Two masters killed: still a majority.
    masters.servers[0].kill();
    masters.servers[1].kill();
    let g = a
        .try_lock_for(Duration::from_secs(3), None)
        .await
        .unwrap()
        .expect("granted with 3 of 5");
    assert_eq!(g.parts().len(), 3);
    assert!(!g.is_lost());
    // The watchdog of each client renews its part: still held after 3 leases.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    assert!(!g.is_lost());
    assert_eq!(masters.holders("rl:orders"), 3);
    g.unlock().await.unwrap();

    // A third one killed: no majority, refused, and nothing is left behind.
    masters.servers[2].kill();
    let refused = a
        .try_lock_for(Duration::from_millis(800), None)
        .await
        .unwrap();
    assert!(refused.is_none(), "granted with only 2 of 5");
    assert_eq!(masters.holders("rl:orders"), 0);
    assert_eq!(masters.servers[3].cmd::<i64>(&["PTTL", "rl:orders"]), -2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_excludes_concurrent_holders() {
    let masters = Masters::start(3);
    let referee = RedisServer::start();
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let rl = masters.redlock("rl:shared").await;
        let url = referee.url();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let mut overlap = Overlap::new(&url, "rl").await;
            let mut done = 0;
            while done < 10 {
                if let Some(g) = rl
                    .try_lock_for(Duration::from_secs(5), Some(Duration::from_secs(5)))
                    .await
                    .unwrap()
                {
                    assert!(overlap.enter(done).await, "two RedLock holders at once");
                    inside.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    overlap.leave().await;
                    g.unlock().await.unwrap();
                    done += 1;
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("bounded")
            .unwrap();
    }
    assert_eq!(inside.load(Ordering::SeqCst), 40);
    assert_eq!(Overlap::report(&referee, "rl").0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_rejects_bad_setups() {
    let s = RedisServer::start();
    let c = client(&s.url()).await;
    assert!(matches!(RedLock::new(vec![]), Err(Error::InvalidConfig(_))));
    let same = RedLock::new(vec![c.lock("x"), c.lock("x")]);
    assert!(matches!(same, Err(Error::InvalidConfig(_))));
    let one = RedLock::new(vec![c.lock("x")]).unwrap();
    assert!(matches!(
        one.try_lock_for(Duration::from_secs(1), Some(Duration::ZERO))
            .await,
        Err(Error::InvalidLease { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_fixed_lease_reports_validity_end() {
    let masters = Masters::start(3);
    let rl = masters.redlock("rl:lease").await;
    let g = rl
        .try_lock_for(Duration::from_secs(1), Some(Duration::from_millis(400)))
        .await
        .unwrap()
        .unwrap();
    assert!(!g.is_lost());
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("validity ends within the lease");
    assert!(g.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_takes_all_or_nothing() {
    let s1 = RedisServer::start();
    let s2 = RedisServer::start();
    let c1 = client(&s1.url()).await;
    let c2 = client(&s2.url()).await;
    let both = MultiLock::new(vec![c1.lock("acct:1"), c2.lock("acct:2")]).unwrap();
    let g = both.lock().await.unwrap();
    assert_eq!(g.parts().len(), 2);
    assert_eq!(s1.cmd::<i64>(&["EXISTS", "acct:1"]), 1);
    assert_eq!(s2.cmd::<i64>(&["EXISTS", "acct:2"]), 1);

    // Another task: acct:1 is free after the unlock below, acct:2 stays taken by a
    // third holder, so the multi-lock must give up and leave acct:1 free.
    g.unlock().await.unwrap();
    let other = tokio::spawn({
        let c2 = c2.clone();
        async move {
            let g2 = c2.lock("acct:2").lock().await.unwrap();
            tokio::time::sleep(Duration::from_millis(800)).await;
            g2.unlock().await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = both
        .try_lock_for(Duration::from_millis(300), None)
        .await
        .unwrap();
    assert!(got.is_none());
    assert_eq!(
        s1.cmd::<i64>(&["EXISTS", "acct:1"]),
        0,
        "partial hold left behind"
    );
    // Once acct:2 is released the multi-lock gets both.
    let g = both
        .try_lock_for(Duration::from_secs(5), None)
        .await
        .unwrap()
        .expect("both free again");
    other.await.unwrap();
    g.unlock().await.unwrap();
    assert_eq!(s1.cmd::<i64>(&["EXISTS", "acct:1"]), 0);
    assert_eq!(s2.cmd::<i64>(&["EXISTS", "acct:2"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilocks_over_overlapping_sets_do_not_deadlock() {
    let s = RedisServer::start();
    let c = client(&s.url()).await;
    let ab = MultiLock::new(vec![c.lock("m:a"), c.lock("m:b")]).unwrap();
    let ba = MultiLock::new(vec![c.lock("m:b"), c.lock("m:a")]).unwrap();
    let mut tasks = Vec::new();
    for ml in [ab, ba] {
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let g = ml.lock().await.unwrap();
                g.unlock().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("deadlock")
            .unwrap();
    }
}
