//! Uncontended lock + unlock pairs, counted for instruction profiles (issue 24's W1).
//!
//! Runs `RLOCK_PAIRS_N` pairs (1,000 by default) of one library on one name, one task,
//! on the runtime W1 uses (`#[tokio::main]`: multi-thread, a worker per core), after
//! `RLOCK_PAIRS_WARM` pairs (100) of warm-up. `RLOCK_PAIRS_LIB` is `ours` or `floor`
//! (Redisson's own acquire and unlock scripts by raw `EVALSHA`, as in
//! `benches/shapes.rs`). Meant to run under `valgrind --tool=callgrind`, twice with two
//! counts: the difference over the difference in pairs is the cost of one pair, without
//! setup. Prints the server's `evalsha` `usec_per_call` and calls.
//!
//!     cargo bench --bench pairs --no-run
//!     RLOCK_PAIRS_LIB=ours valgrind --tool=callgrind target/release/deps/pairs-* --bench
//!
//! `RLOCK_PAIRS_LIB=both` measures wall-clock time instead: this crate's pairs and the
//! floor's alternate in chunks of `RLOCK_PAIRS_CHUNK` pairs (500) for `RLOCK_PAIRS_ROUNDS`
//! rounds (20) on one server, so that a loaded machine's drift falls on both alike; it
//! prints each one's median pair and the ratio (the floor's median over ours: above 1.0
//! is faster than the floor).
//!
//!     RLOCK_PAIRS_LIB=both target/release/deps/pairs-* --bench
//!
//! Uses `REDIS_URL` when set; otherwise starts a redis-server on a free loopback port.

use std::time::Duration;

use redis::aio::ConnectionManager;

#[path = "../tests/common/redisson_rlock.rs"]
mod redisson_rlock;
#[path = "common/server.rs"]
mod server;
use redisson_rlock::{ACQUIRE as REDISSON_ACQUIRE, UNLOCK as REDISSON_UNLOCK};

const LEASE: Duration = Duration::from_secs(10);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One uncontended pair of this crate's, and its wall-clock time in µs.
async fn our_pair(lock: &redis_rlock::Lock) -> f64 {
    let started = std::time::Instant::now();
    lock.lock_with_lease(LEASE)
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    started.elapsed().as_secs_f64() * 1e6
}

/// The floor's pair (Redisson's two scripts by raw `EVALSHA`): the i-th of its run.
struct Floor {
    conn: ConnectionManager,
    acquire: redis::Script,
    unlock: redis::Script,
    name: String,
    channel: String,
    field: String,
}

impl Floor {
    async fn new(url: &str) -> Floor {
        let name = "pairs:0".to_string();
        Floor {
            conn: ConnectionManager::new(redis::Client::open(url).unwrap())
                .await
                .unwrap(),
            acquire: redis::Script::new(REDISSON_ACQUIRE),
            unlock: redis::Script::new(REDISSON_UNLOCK),
            channel: format!("redisson_lock__channel:{{{name}}}"),
            name,
            field: "6f1b9c0e-5d8a-4c52-9a4e-3f7d2b1c8e90:0".to_string(),
        }
    }

    /// One pair, and its wall-clock time in µs.
    async fn pair(&mut self, i: u64) -> f64 {
        let started = std::time::Instant::now();
        let r: Option<i64> = (self.acquire.key(&self.name))
            .arg(LEASE.as_millis() as u64)
            .arg(&*self.field)
            .invoke_async(&mut self.conn)
            .await
            .unwrap();
        assert!(r.is_none(), "uncontended");
        let latch = format!(
            "redisson_unlock_latch:{{{}}}:{}{i:016x}",
            self.name, self.field
        );
        let _: Option<i64> = (self.unlock.key(&self.name))
            .key(&self.channel)
            .key(&latch)
            .arg(0)
            .arg(LEASE.as_millis() as u64)
            .arg(&*self.field)
            .arg("PUBLISH")
            .arg(20_000)
            .invoke_async(&mut self.conn)
            .await
            .unwrap();
        started.elapsed().as_secs_f64() * 1e6
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Both libraries, alternating in chunks: each one's median pair in µs.
async fn both(url: &str, warm: u64) {
    let client = redis_rlock::Client::builder(url).build().await.unwrap();
    let lock = client.lock("pairs:0");
    let mut floor = Floor::new(url).await;
    let chunk = env_u64("RLOCK_PAIRS_CHUNK", 500);
    let rounds = env_u64("RLOCK_PAIRS_ROUNDS", 20);
    for i in 0..warm {
        our_pair(&lock).await;
        floor.pair(i).await;
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut i = warm;
    for _ in 0..rounds {
        for _ in 0..chunk {
            ours.push(our_pair(&lock).await);
        }
        for _ in 0..chunk {
            theirs.push(floor.pair(i).await);
            i += 1;
        }
    }
    let (ours, theirs) = (median(ours), median(theirs));
    println!(
        "W1 interleaved, {rounds} rounds of {chunk} pairs each: ours {ours:.1} µs, floor {theirs:.1} µs a pair (median); {:.2}x of the floor",
        theirs / ours
    );
    client.shutdown().await.unwrap();
}

async fn ours(url: &str, warm: u64, n: u64) {
    let client = redis_rlock::Client::builder(url).build().await.unwrap();
    let lock = client.lock("pairs:0");
    for _ in 0..warm + n {
        our_pair(&lock).await;
    }
    client.shutdown().await.unwrap();
}

async fn floor(url: &str, warm: u64, n: u64) {
    let mut floor = Floor::new(url).await;
    for i in 0..warm + n {
        floor.pair(i).await;
    }
}

/// This crate's scripts as files given by `RLOCK_PAIRS_ACQUIRE` and `RLOCK_PAIRS_UNLOCK`
/// (the full text sent, prelude included), by raw `EVALSHA` with the keys and arguments
/// the client sends on the uncontended path (`take.lua`, `release.lua`): for trying
/// script variants.
async fn scripts(url: &str, warm: u64, n: u64) {
    let mut conn = ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let read = |var: &str| std::fs::read_to_string(std::env::var(var).unwrap()).unwrap();
    let acquire = redis::Script::new(&read("RLOCK_PAIRS_ACQUIRE"));
    let unlock = redis::Script::new(&read("RLOCK_PAIRS_UNLOCK"));
    let name = "pairs:0";
    let field = "6f1b9c0e-5d8a-4c52-9a4e-3f7d2b1c8e90:thread-1";
    let prefix = "aeeb9a660b464c23a875c38df519f58f";
    for i in 0..warm + n {
        // A waiting call's first send (`lua/take.lua`).
        let r: redis::Value = acquire
            .key(name)
            .key(format!("redisson_lock_clients:{{{name}}}"))
            .key(format!("redisson_lock_turn:{{{name}}}"))
            .arg(LEASE.as_millis() as u64)
            .arg(field)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(r, redis::Value::Nil, "uncontended");
        // A release with nobody to hand over to (`lua/release.lua`).
        let r: redis::Value = unlock
            .key(name)
            .key(format!("redisson_lock__channel:{{{name}}}"))
            .key(format!("redisson_unlock_latch:{{{name}}}:{prefix}-{i:x}"))
            .key(format!("redisson_lock_clients:{{{name}}}"))
            .key(format!("redisson_lock_turn:{{{name}}}"))
            .arg(field)
            .arg(1)
            .arg(0)
            .arg(600_000)
            .arg(10)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(r, redis::Value::Int(1));
    }
}

async fn evalsha(url: &str) -> (u64, f64) {
    let mut c = ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    for line in text.lines() {
        if let Some(stats) = line.strip_prefix("cmdstat_evalsha:") {
            let get = |k: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            return (get("calls=") as u64, get("usec_per_call="));
        }
    }
    (0, 0.0)
}

#[tokio::main]
async fn main() {
    let (url, _server) = server::start_server();
    let lib = std::env::var("RLOCK_PAIRS_LIB").unwrap_or_else(|_| "ours".into());
    let warm = env_u64("RLOCK_PAIRS_WARM", 100);
    let n = env_u64("RLOCK_PAIRS_N", 1_000);
    let started = std::time::Instant::now();
    match lib.as_str() {
        "floor" => floor(&url, warm, n).await,
        "both" => return both(&url, warm).await,
        "scripts" => scripts(&url, warm, n).await,
        _ => ours(&url, warm, n).await,
    }
    let took = started.elapsed();
    let (calls, usec) = evalsha(&url).await;
    println!(
        "{lib}: {} pairs in {:?}; evalsha calls {calls}, usec_per_call {usec}",
        warm + n,
        took
    );
}
