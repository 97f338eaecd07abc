//! A tour of redis-rlock: reentrancy, a try_lock timeout, the watchdog carrying a job
//! past its lease, and many workers incrementing a counter with no lost update.
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway server on a free loopback
//! port and stops it at the end: `REDIS_SERVER`, `redis-server` or `valkey-server` on the
//! PATH, or a Valkey fetched once into `target/valkey/` (see
//! `tests/common/server_bin.rs`).
//!
//!     cargo run --example demo

use std::time::{Duration, Instant};

use redis_rlock::Client;

#[path = "common/throwaway.rs"]
mod throwaway;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = throwaway::url_or_start();
    let prefix = format!("rlock-demo:{}:", std::process::id());
    let name = |n: &str| format!("{prefix}{n}");

    // 1. Reentrancy: nested lock() calls in one task.
    let client = Client::connect(&url).await?;
    let lock = client.lock(name("reentrant"));
    let outer = lock.lock().await?;
    let inner = lock.lock().await?;
    println!(
        "1. reentrancy: hold count after two lock() calls = {}",
        lock.hold_count().await?
    );
    inner.unlock().await?;
    println!(
        "   after one unlock: hold count = {}, locked = {}",
        lock.hold_count().await?,
        lock.is_locked().await?
    );
    outer.unlock().await?;
    println!("   after both: locked = {}", lock.is_locked().await?);

    // 2. try_lock with a wait: another task holds the lock, so we give up after 300 ms.
    let held = lock.lock().await?;
    let contender = lock.clone();
    let (got, waited) = tokio::spawn(async move {
        let start = Instant::now();
        let got = contender
            .try_lock_for(Duration::from_millis(300), None)
            .await;
        (got.map(|g| g.is_some()), start.elapsed())
    })
    .await?;
    println!(
        "2. try_lock_for(300 ms) from another task: acquired = {:?} after {waited:.0?}",
        got?
    );
    held.unlock().await?;

    // 3. The watchdog: a 1 s lease carries a 3 s job.
    let short = Client::builder(&url)
        .watchdog_timeout(Duration::from_secs(1))
        .build()
        .await?;
    let job = short.lock(name("long-job"));
    let guard = job.lock().await?;
    for second in 1..=3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "3. watchdog: {second} s into a job on a 1 s lease: locked = {}, ttl = {:?}, lost = {}",
            job.is_locked().await?,
            job.remaining_ttl().await?.unwrap_or_default(),
            guard.is_lost()
        );
    }
    guard.unlock().await?;
    println!(
        "   renewals sent by the watchdog: {}",
        short.stats().renewals
    );
    // Gives back whatever the client still holds and stops its background tasks.
    short.shutdown().await?;

    // 4. Mutual exclusion: 2 clients x 8 tasks x 25 non-atomic increments.
    let raw = redis::Client::open(url.as_str())?;
    let counter = name("counter");
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let c = Client::connect(&url).await?;
        clients.push(c.clone());
        for _ in 0..8 {
            let lock = c.lock(name("counter-lock"));
            let raw = raw.clone();
            let counter = counter.clone();
            tasks.push(tokio::spawn(async move {
                let mut conn = raw.get_multiplexed_async_connection().await?;
                for _ in 0..25 {
                    let g = lock.lock().await?;
                    let v: Option<i64> = redis::cmd("GET")
                        .arg(&counter)
                        .query_async(&mut conn)
                        .await?;
                    tokio::task::yield_now().await;
                    let _: () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(v.unwrap_or(0) + 1)
                        .query_async(&mut conn)
                        .await?;
                    g.unlock().await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            }));
        }
    }
    let start = Instant::now();
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    for c in clients {
        c.shutdown().await?;
    }
    let mut conn = raw.get_multiplexed_async_connection().await?;
    let total: i64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await?;
    println!(
        "4. 16 workers x 25 increments under the lock: counter = {total} (expected 400) in {:.0?}",
        start.elapsed()
    );
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut conn)
        .await?;
    if total != 400 {
        return Err("lost update".into());
    }
    // What the client counted (with `--features metrics` the same events also go to
    // whichever `metrics` recorder the program installs).
    let st = client.stats();
    println!(
        "5. stats of the first client (steps 1 and 2): {} acquisitions, {} busy replies, {} hand-overs, {} wake-ups, {} lost",
        st.acquisitions, st.busy, st.handovers, st.wakeups, st.leases_lost
    );
    client.shutdown().await?;
    Ok(())
}
