//! Permit guards on a real server: the permits of a task that panics, is cancelled while
//! holding, or returns early with `?` come back; a watched expirable permit outlives
//! many of its leases, is reported lost within one renewal period once its entry is
//! removed, and a Redisson peer (its scripts typed in) sees only its score move and
//! cannot take it meanwhile.

mod common;

use std::time::{Duration, Instant};

use common::redisson_permits::{now_ms, redisson_permit_acquire, unhex};
use common::{client_with, eventually, RedisServer};
use redis_rlock::{protocol, Error, PermitExpirableSemaphore, Semaphore};

const LONG: Duration = Duration::from_secs(30);
/// The watchdog lease of the renewal tests; the watchdog renews every third of it.
const WD: Duration = Duration::from_secs(1);

async fn back_to(limit: Duration, want: i64, available: impl Fn() -> i64) -> bool {
    eventually(limit, || available() == want).await
}

/// Takes one permit and fails with `?` before giving it back by hand.
async fn early_return(sem: &Semaphore) -> redis_rlock::Result<()> {
    let _permit = sem.acquire_permits(1).await?;
    sem.release(0).await?; // InvalidCount: returns here, holding the permit
    unreachable!("release(0) is refused");
}

async fn early_return_expirable(pes: &PermitExpirableSemaphore) -> redis_rlock::Result<()> {
    let _permit = pes.acquire_permit().await?;
    pes.update_lease_time("not an id", WD).await?;
    unreachable!("a bad id is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_of_a_panicking_a_cancelled_and_an_early_returning_task_come_back() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let sem = c.semaphore("pg:count");
    assert!(sem.try_set_permits(3).await.unwrap());
    let count = || s.cmd::<i64>(&["GET", "pg:count"]);

    // Panics while holding 2.
    let panicking = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let _permits = sem.acquire_permits(2).await.unwrap();
            panic!("the job failed");
        })
    };
    assert!(panicking.await.unwrap_err().is_panic());
    assert!(
        back_to(Duration::from_secs(5), 3, count).await,
        "{}",
        count()
    );

    // Cancelled while holding.
    let holding = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let _permit = sem.acquire_permits(1).await.unwrap();
            std::future::pending::<()>().await;
        })
    };
    assert!(back_to(Duration::from_secs(5), 2, count).await);
    holding.abort();
    assert!(holding.await.unwrap_err().is_cancelled());
    assert!(
        back_to(Duration::from_secs(5), 3, count).await,
        "{}",
        count()
    );

    // Returns early with `?`.
    assert!(matches!(
        early_return(&sem).await,
        Err(Error::InvalidCount { .. })
    ));
    assert!(
        back_to(Duration::from_secs(5), 3, count).await,
        "{}",
        count()
    );

    // `run` gives them back when its work panics, and after it returns.
    let ran = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.run(3, || async { panic!("inside run") }).await })
    };
    assert!(ran.await.unwrap_err().is_panic());
    assert!(
        back_to(Duration::from_secs(5), 3, count).await,
        "{}",
        count()
    );
    assert_eq!(sem.run(3, || async { count() }).await.unwrap(), 0);
    assert_eq!(count(), 3, "run gave its permits back before it returned");

    // An explicit release reports, and gives back once: no drop release follows it.
    let p = sem.acquire_permits(2).await.unwrap();
    p.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(count(), 3);
    // A forgotten guard keeps its permits for a release by count.
    assert_eq!(sem.acquire_permits(1).await.unwrap().forget(), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(count(), 2);
    sem.release(1).await.unwrap();

    // The same three endings for expirable permits, watched and with a fixed lease.
    let pes = c.permit_expirable_semaphore("pg:exp");
    assert!(pes.try_set_permits(2).await.unwrap());
    let timeout = protocol::permit_timeout_key("pg:exp");
    let held = || s.cmd::<i64>(&["ZCARD", &timeout]);
    let panicking = {
        let pes = pes.clone();
        tokio::spawn(async move {
            let _a = pes.acquire_permit().await.unwrap();
            let _b = pes.acquire_permit_with_lease(LONG).await.unwrap();
            panic!("the job failed");
        })
    };
    assert!(panicking.await.unwrap_err().is_panic());
    assert!(back_to(Duration::from_secs(5), 0, held).await, "{}", held());
    let holding = {
        let pes = pes.clone();
        tokio::spawn(async move {
            let _a = pes.acquire_permit().await.unwrap();
            std::future::pending::<()>().await;
        })
    };
    assert!(back_to(Duration::from_secs(5), 1, held).await);
    holding.abort();
    assert!(back_to(Duration::from_secs(5), 0, held).await, "{}", held());
    assert!(matches!(
        early_return_expirable(&pes).await,
        Err(Error::InvalidPermitId { .. })
    ));
    assert!(back_to(Duration::from_secs(5), 0, held).await, "{}", held());
    assert_eq!(pes.available_permits().await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_permit_outlives_three_leases_of_one_second() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), WD, Duration::from_secs(1)).await;
    let pes = c.permit_expirable_semaphore("pg:long");
    assert!(pes.try_set_permits(1).await.unwrap());
    let timeout = protocol::permit_timeout_key("pg:long");
    let guard = pes.acquire_permit().await.unwrap();
    assert!(guard.is_watchdog());
    let other = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let rival = other.permit_expirable_semaphore("pg:long");
    let mut conn = s.conn();
    let t = Instant::now();
    while t.elapsed() < 3 * WD + Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(!guard.is_lost(), "lost after {:?}", t.elapsed());
        let score: Option<u64> = redis::cmd("ZSCORE")
            .arg(&timeout)
            .arg(unhex(guard.id()))
            .query(&mut conn)
            .unwrap();
        let score = score.expect("the permit left the lease set");
        assert!(score > now_ms(), "its lease ended at {score}");
    }
    // Nobody else gets it meanwhile (their acquire gives back every ended lease first).
    assert!(rival
        .try_acquire(LONG, Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    assert_eq!(pes.available_permits().await.unwrap(), 1);
    assert_eq!(s.cmd::<i64>(&["ZCARD", &timeout]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_removed_from_redis_is_reported_lost_within_one_renewal_period() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), WD, Duration::from_secs(1)).await;
    let pes = c.permit_expirable_semaphore("pg:lost");
    assert!(pes.try_set_permits(2).await.unwrap());
    let guard = pes.acquire_permit().await.unwrap();
    let kept = pes.acquire_permit().await.unwrap();
    let mut conn = s.conn();
    let removed: i64 = redis::cmd("ZREM")
        .arg(protocol::permit_timeout_key("pg:lost"))
        .arg(unhex(guard.id()))
        .query(&mut conn)
        .unwrap();
    assert_eq!(removed, 1);
    let t = Instant::now();
    tokio::time::timeout(2 * WD, guard.lost())
        .await
        .expect("the removed permit was not reported lost");
    let took = t.elapsed();
    eprintln!("reported lost {took:?} after the removal");
    let period = WD / 3;
    assert!(took <= period + Duration::from_millis(150), "{took:?}");
    assert!(guard.is_lost());
    assert!(!kept.is_lost(), "the other permit of the batch is held");
    assert!(matches!(
        guard.release().await,
        Err(Error::LeaseLost { .. })
    ));
    kept.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_peer_sees_the_lease_move_and_cannot_take_the_permit() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), WD, Duration::from_secs(1)).await;
    let name = "pg:peer";
    let pes = c.permit_expirable_semaphore(name);
    assert!(pes.try_set_permits(1).await.unwrap());
    let guard = pes.acquire_permit().await.unwrap();
    let timeout = protocol::permit_timeout_key(name);
    let mut peer = s.conn();
    let id = unhex(guard.id());
    let score = |peer: &mut redis::Connection| -> Option<u64> {
        redis::cmd("ZSCORE")
            .arg(&timeout)
            .arg(&id)
            .query(peer)
            .unwrap()
    };
    let first = score(&mut peer).expect("our permit is in the lease set");
    let mut last = first;
    let mut moves = 0;
    let t = Instant::now();
    while t.elapsed() < 2 * WD + Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_millis(150)).await;
        // The peer acquires with its own clock: it reclaims every lease that ended.
        let busy = redisson_permit_acquire(&mut peer, name, &[9u8; 16], 5_000)
            .expect("a busy semaphore answers its earliest lease end");
        assert!(busy.starts_with(':'), "the peer took a permit: {busy}");
        let now = score(&mut peer).expect("our permit left the lease set");
        assert!(now >= last, "the lease moved back: {last} -> {now}");
        moves += usize::from(now > last);
        last = now;
        // Only the score moves: the count, the members and the keys stay as they were.
        assert_eq!(s.cmd::<i64>(&["GET", name]), 0);
        assert_eq!(s.cmd::<i64>(&["ZCARD", &timeout]), 1);
        let mut keys: Vec<String> = s.cmd(&["KEYS", "*"]);
        keys.sort();
        let mut want = vec![timeout.clone(), name.to_string()];
        want.sort();
        assert_eq!(keys, want);
    }
    eprintln!("the lease moved {moves} times, by {} ms", last - first);
    assert!(last > first + 1000, "{first} -> {last}");
    assert!(moves >= 4, "renewed {moves} times in 2.5 s");
    drop(guard);
    assert!(eventually(Duration::from_secs(5), || s.cmd::<i64>(&["GET", name]) == 1).await);
    assert_eq!(
        redisson_permit_acquire(&mut peer, name, &[9u8; 16], 5_000).as_deref(),
        Some("OK")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_back_the_permits_of_live_guards_once() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let sem = c.semaphore("pg:down");
    assert!(sem.try_set_permits(3).await.unwrap());
    let pes = c.permit_expirable_semaphore("pg:down:exp");
    assert!(pes.try_set_permits(2).await.unwrap());
    let timeout = protocol::permit_timeout_key("pg:down:exp");
    let counted = sem.acquire_permits(2).await.unwrap();
    let dropped_later = sem.acquire_permits(1).await.unwrap();
    let watched = pes.acquire_permit().await.unwrap();
    let leased = pes.acquire_permit_with_lease(LONG).await.unwrap();
    c.shutdown().await.unwrap();
    // Back when shutdown returns.
    assert_eq!(s.cmd::<i64>(&["GET", "pg:down"]), 3);
    assert_eq!(s.cmd::<i64>(&["GET", "pg:down:exp"]), 2);
    assert_eq!(s.cmd::<i64>(&["ZCARD", &timeout]), 0);
    assert!(watched.is_lost() && leased.is_lost());
    // And not a second time.
    assert!(matches!(counted.release().await, Err(Error::Closed)));
    assert!(matches!(watched.release().await, Err(Error::Closed)));
    drop(dropped_later);
    drop(leased);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.cmd::<i64>(&["GET", "pg:down"]), 3);
    assert_eq!(s.cmd::<i64>(&["GET", "pg:down:exp"]), 2);
}
