//! Fairness and throughput across OS processes contending on one lock, as services run:
//! each process is one service instance with one shared `Client` on a multi-thread
//! runtime (default workers) and several tasks taking the same lock in a loop, holding
//! it for a fixed time. Reports grants per second, each process's share, the max/min
//! ratio of grants between processes, and the longest wait.
//!
//!     cargo bench --bench procs          # this crate, then rslock 0.10, same server
//!     RLOCK_PROCS=4 RLOCK_TASKS=8 RLOCK_HOLD_US=1000 RLOCK_SECS=5 cargo bench --bench procs
//!
//! `RLOCK_HANDOVER_LIMIT=0` turns hand-over off, `RLOCK_TURN_WINDOW_MS=0` turns.
//! `RLOCK_PROCS_KIND=fair` takes this crate's fair lock instead (rslock has none, so only
//! this crate runs). Each grant is also logged with wall-clock times, which all processes
//! of one machine share: the hand-off from one holder's unlock to the next holder's grant
//! (p50, p99, in round trips) and, for a fair lock, how often a process was served out of
//! turn. Uses `REDIS_URL` when set; otherwise starts a redis-server on a free loopback
//! port.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_rlock::Client;

#[path = "common/server.rs"]
mod server;

use server::start_server;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The same loop with rslock 0.10 (one shared `LockManager`; its acquire retries until
/// it gets the lock).
async fn child_rslock(url: String, name: String, tasks: u64, hold: Duration, secs: u64) {
    let manager = Arc::new(rslock::LockManager::new(vec![url]));
    let grants = Arc::new(AtomicU64::new(0));
    let longest = Arc::new(AtomicU64::new(0));
    let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let until = start_together(secs).await;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (m, name) = (manager.clone(), name.clone());
        let (grants, longest, log) = (grants.clone(), longest.clone(), log.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                let asked = Instant::now();
                let Ok(l) = m
                    .acquire_no_guard(name.as_bytes(), Duration::from_secs(30))
                    .await
                else {
                    break;
                };
                let granted = wall_us();
                let counted = Instant::now() < until;
                if counted {
                    longest.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
                    grants.fetch_add(1, Ordering::Relaxed);
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                }
                let released = wall_us();
                m.unlock(&l).await;
                if counted {
                    log.lock().push((granted, released));
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    println!(
        "RESULT {} {}",
        grants.load(Ordering::Relaxed),
        longest.load(Ordering::Relaxed)
    );
    for (granted, released) in log.lock().iter() {
        println!("GRANT {granted} {released}");
    }
}

/// Microseconds of the wall clock, which every process of the machine reads alike.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Sleeps until the next whole second plus one of the wall clock, so that every
/// process starts together; returns when the run ends.
async fn start_together(secs: u64) -> Instant {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let next = Duration::from_secs(now.as_secs() + 2);
    tokio::time::sleep(next - now).await;
    Instant::now() + Duration::from_secs(secs)
}

/// One process: `tasks` tasks on one shared client take `name` in a loop until `until`.
/// Prints `RESULT <grants> <longest wait µs>`.
async fn child(url: String, name: String, tasks: u64, hold: Duration, secs: u64) {
    let mut builder = Client::builder(&url);
    if let Ok(limit) = std::env::var("RLOCK_HANDOVER_LIMIT") {
        builder = builder.handover_limit(limit.parse().unwrap());
    }
    if let Ok(ms) = std::env::var("RLOCK_TURN_WINDOW_MS") {
        builder = builder.turn_window(Duration::from_millis(ms.parse().unwrap()));
    }
    let client = builder.build().await.unwrap();
    let fair = std::env::var("RLOCK_PROCS_KIND").as_deref() == Ok("fair");
    let grants = Arc::new(AtomicU64::new(0));
    let longest = Arc::new(AtomicU64::new(0));
    let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let until = start_together(secs).await;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let lock = if fair {
            client.fair_lock(name.clone())
        } else {
            client.lock(name.clone())
        };
        let (grants, longest, log) = (grants.clone(), longest.clone(), log.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                let asked = Instant::now();
                let left = until.saturating_duration_since(asked);
                let Ok(Some(g)) = lock.try_lock_for(left, None).await else {
                    break;
                };
                let granted = wall_us();
                let waited = asked.elapsed();
                longest.fetch_max(waited.as_micros() as u64, Ordering::Relaxed);
                grants.fetch_add(1, Ordering::Relaxed);
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                let released = wall_us();
                g.unlock().await.unwrap();
                log.lock().push((granted, released));
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    println!(
        "RESULT {} {}",
        grants.load(Ordering::Relaxed),
        longest.load(Ordering::Relaxed)
    );
    for (granted, released) in log.lock().iter() {
        println!("GRANT {granted} {released}");
    }
    eprintln!("{:?}", client.stats());
    let _ = client.shutdown().await;
}

fn main() {
    let procs = env_u64("RLOCK_PROCS", 4);
    let tasks = env_u64("RLOCK_TASKS", 8);
    let hold = Duration::from_micros(env_u64("RLOCK_HOLD_US", 1000));
    let secs = env_u64("RLOCK_SECS", 5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Ok(url) = std::env::var("RLOCK_PROCS_CHILD") {
        let name = "procs:one".to_string();
        match std::env::var("RLOCK_PROCS_LIB").as_deref() {
            Ok("rslock") => rt.block_on(child_rslock(url, name, tasks, hold, secs)),
            _ => rt.block_on(child(url, name, tasks, hold, secs)),
        }
        return;
    }
    let (url, _server) = start_server();
    let fair = std::env::var("RLOCK_PROCS_KIND").as_deref() == Ok("fair");
    let default_libs = if fair { "ours" } else { "ours,rslock" };
    let libs = std::env::var("RLOCK_PROCS_LIBS").unwrap_or_else(|_| default_libs.into());
    let mut per_sec = Vec::new();
    for lib in libs.split(',') {
        per_sec.push((lib.to_string(), run(&url, lib, procs, tasks, hold, secs)));
    }
    if let [(_, ours), rest @ ..] = &per_sec[..] {
        for (lib, theirs) in rest {
            println!("grants/s ours / {lib}: {:.2}x", ours / theirs.max(1.0));
        }
    }
}

/// Runs `procs` child processes of `lib` and prints their figures; returns grants/s.
fn run(url: &str, lib: &str, procs: u64, tasks: u64, hold: Duration, secs: u64) -> f64 {
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&me)
                .env("RLOCK_PROCS_CHILD", url)
                .env("RLOCK_PROCS_LIB", lib)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut rows = Vec::new();
    // (granted, released, process) of every grant, from every process.
    let mut log = Vec::new();
    for (proc_no, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.starts_with("RESULT "))
            .expect("a child reported");
        let v: Vec<u64> = line[7..].split(' ').map(|x| x.parse().unwrap()).collect();
        rows.push((v[0], v[1]));
        for g in text.lines().filter_map(|l| l.strip_prefix("GRANT ")) {
            let t: Vec<u64> = g.split(' ').map(|x| x.parse().unwrap()).collect();
            log.push((t[0], t[1], proc_no));
        }
    }
    let total: u64 = rows.iter().map(|r| r.0).sum();
    let max = rows.iter().map(|r| r.0).max().unwrap_or(0) as f64;
    let min = rows.iter().map(|r| r.0).min().unwrap_or(0) as f64;
    let shares: Vec<String> = rows
        .iter()
        .map(|r| format!("{:.0}%", 100.0 * r.0 as f64 / total.max(1) as f64))
        .collect();
    let longest = rows.iter().map(|r| r.1).max().unwrap_or(0);
    // A task's mean cycle: the time between two of its own grants, on average.
    let cycle_us = secs as f64 * 1e6 * (procs * tasks) as f64 / total.max(1) as f64;
    println!(
        "{lib}: {procs} processes x {tasks} tasks, hold {hold:?}, {secs} s: {:.0} grants/s; shares {}; max/min {:.2}; longest wait {:.1} ms = {:.1} mean task cycles",
        total as f64 / secs as f64,
        shares.join(" "),
        if min > 0.0 { max / min } else { f64::INFINITY },
        longest as f64 / 1000.0,
        longest as f64 / cycle_us
    );
    if !log.is_empty() {
        handoffs(url, &mut log, procs as usize);
    }
    total as f64 / secs as f64
}

/// Hand-off times across processes (from a release to the next grant, wherever it
/// happened) and, in windows of `procs` grants in a row, how often one process was
/// served twice while another had tasks waiting.
fn handoffs(url: &str, log: &mut [(u64, u64, usize)], procs: usize) {
    log.sort();
    let mut gaps: Vec<u64> = log
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1))
        .collect();
    gaps.sort();
    let pct = |p: f64| gaps[((gaps.len() - 1) as f64 * p) as usize];
    let rtt = rtt_us(url);
    let order: Vec<usize> = log.iter().map(|g| g.2).collect();
    let windows = order.windows(procs).count().max(1);
    let out_of_turn = order
        .windows(procs)
        .filter(|w| {
            let mut v = w.to_vec();
            v.sort();
            v.dedup();
            v.len() < procs
        })
        .count();
    println!(
        "  hand-off across processes p50 {} µs ({:.1} RTT), p99 {} µs ({:.1} RTT); a process served twice in {:.1}% of windows of {procs} grants (RTT {rtt:.0} µs)",
        pct(0.5),
        pct(0.5) as f64 / rtt,
        pct(0.99),
        pct(0.99) as f64 / rtt,
        100.0 * out_of_turn as f64 / windows as f64
    );
}

/// The median round trip of a trivial script (`return 1` by `EVALSHA`) through a
/// multiplexed connection on a tokio runtime, in µs: the round trip as a lock call sees
/// it, and the unit `benches/locks.rs` uses too.
fn rtt_us(url: &str) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let script = redis::Script::new("return 1");
        let mut t = Vec::new();
        for _ in 0..300 {
            let at = Instant::now();
            let _: i64 = script.invoke_async(&mut conn).await.unwrap();
            t.push(at.elapsed().as_secs_f64() * 1e6);
        }
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        t[t.len() / 2]
    })
}
