//! The blocking permit guards on a real server: a thread that panics or returns early
//! with `?` gives its permits back before it ends (the blocking drop releases before it
//! returns); a watched permit outlives three leases of 1 s while its thread sleeps, and
//! is reported lost within one renewal period once its entry is removed.
//!
//! Run with `cargo test --features blocking --test blocking_permits`.

#![cfg(feature = "blocking")]

mod common;

use std::time::{Duration, Instant};

use common::redisson_permits::unhex;
use common::RedisServer;
use redis_rlock::blocking::{Client, Semaphore};
use redis_rlock::{protocol, Error};

fn client(server: &RedisServer, watchdog: Duration) -> Client {
    Client::builder(server.url())
        .watchdog_timeout(watchdog)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

fn early_return(sem: &Semaphore) -> redis_rlock::Result<()> {
    let _permit = sem.acquire_permits(1)?;
    sem.release(0)?; // InvalidCount: returns here, holding the permit
    unreachable!("release(0) is refused");
}

#[test]
fn a_thread_that_panics_or_returns_early_gives_its_permits_back() {
    let s = RedisServer::start();
    let c = client(&s, Duration::from_secs(30));
    let sem = c.semaphore("bpg:count");
    assert!(sem.try_set_permits(3).unwrap());
    let pes = c.permit_expirable_semaphore("bpg:exp");
    assert!(pes.try_set_permits(2).unwrap());
    let timeout = protocol::permit_timeout_key("bpg:exp");

    let panicked = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let _permits = sem.acquire_permits(2).unwrap();
                let _watched = pes.acquire_permit().unwrap();
                let _leased = pes
                    .acquire_permit_with_lease(Duration::from_secs(30))
                    .unwrap();
                assert_eq!(s.cmd::<i64>(&["ZCARD", &timeout]), 2);
                panic!("the job failed");
            })
            .join()
    });
    assert!(panicked.is_err());
    // Given back while the thread unwound, before join returned.
    assert_eq!(s.cmd::<i64>(&["GET", "bpg:count"]), 3);
    assert_eq!(s.cmd::<i64>(&["ZCARD", &timeout]), 0);
    assert_eq!(pes.available_permits().unwrap(), 2);

    assert!(matches!(
        early_return(&sem),
        Err(Error::InvalidCount { .. })
    ));
    assert_eq!(s.cmd::<i64>(&["GET", "bpg:count"]), 3);

    let ran =
        std::thread::scope(|scope| scope.spawn(|| sem.run(3, || panic!("inside run"))).join());
    assert!(ran.is_err());
    assert_eq!(s.cmd::<i64>(&["GET", "bpg:count"]), 3);
    assert_eq!(
        sem.run(3, || s.cmd::<i64>(&["GET", "bpg:count"])).unwrap(),
        0
    );
    assert_eq!(s.cmd::<i64>(&["GET", "bpg:count"]), 3);
}

#[test]
fn a_watched_permit_lives_while_its_thread_sleeps_and_is_lost_when_removed() {
    let s = RedisServer::start();
    let wd = Duration::from_secs(1);
    let c = client(&s, wd);
    let pes = c.permit_expirable_semaphore("bpg:watch");
    assert!(pes.try_set_permits(1).unwrap());
    let guard = pes.acquire_permit().unwrap();
    assert!(guard.is_watchdog());
    std::thread::sleep(3 * wd + Duration::from_millis(500));
    assert!(!guard.is_lost());
    assert!(pes
        .try_acquire(Duration::from_secs(5), Duration::ZERO)
        .unwrap()
        .is_none());

    let mut conn = s.conn();
    let removed: i64 = redis::cmd("ZREM")
        .arg(protocol::permit_timeout_key("bpg:watch"))
        .arg(unhex(guard.id()))
        .query(&mut conn)
        .unwrap();
    assert_eq!(removed, 1);
    let t = Instant::now();
    assert!(guard.wait_lost(2 * wd).unwrap());
    assert!(
        t.elapsed() <= wd / 3 + Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    assert!(guard.is_lost());
    assert!(matches!(guard.release(), Err(Error::LeaseLost { .. })));
}
