//! Lock benchmarks, each reported as a ratio to the Redis round trip measured in the same
//! run. Starts its own redis-server (unless REDIS_URL is set), prints a table, and writes
//! it to docs/benchmarks.md.
//!
//!     cargo bench --bench locks               # full run (about a minute)
//!     RLOCK_BENCH_QUICK=1 cargo bench --bench locks
//!
//! The run also re-executes itself as a second process for the contended workload (W3).

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use redis_rlock::Client;

/// Counts live heap bytes, so W5 can report what waiters keep, not the allocator's
/// high-water mark that RSS shows.
#[path = "common/cpu.rs"]
mod cpu;

struct Counting;

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live_bytes() -> isize {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

const TRIVIAL: &str = "return redis.call('exists', KEYS[1])";

fn quick() -> bool {
    std::env::var("RLOCK_BENCH_QUICK").is_ok()
}

/// `RLOCK_BENCH_ONLY=W2,W3` runs only those workloads (for profiling).
fn wanted(w: &str) -> bool {
    match std::env::var("RLOCK_BENCH_ONLY") {
        Ok(list) => list.split(',').any(|x| x.trim().eq_ignore_ascii_case(w)),
        Err(_) => true,
    }
}

/// `RLOCK_BENCH_LIBS=ours` runs W3 for those crates only (for profiling; `ours`,
/// `rslock`, `rlock`).
fn lib_wanted(lib: Lib) -> bool {
    match std::env::var("RLOCK_BENCH_LIBS") {
        Ok(list) => list.split(',').any(|x| x.trim() == lib.arg()),
        Err(_) => true,
    }
}

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

struct Server {
    child: Option<std::process::Child>,
    dir: std::path::PathBuf,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server() -> Server {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Server {
            child: None,
            dir: std::env::temp_dir().join("rlock-bench-none"),
            url,
        };
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("rlock-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server not found: `sudo apt-get install -y redis-server`, or set REDIS_URL");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Server {
        child: Some(child),
        dir,
        url: format!("redis://127.0.0.1:{port}"),
    }
}

async fn manager(url: &str) -> ConnectionManager {
    ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap()
}

async fn raw(url: &str, args: &[&str]) -> redis::Value {
    let mut c = manager(url).await;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut c).await.unwrap()
}

/// Mean time of one raw EVALSHA of a trivial one-key script, sequential.
async fn rtt(url: &str, n: usize) -> Duration {
    let mut c = manager(url).await;
    let script = redis::Script::new(TRIVIAL);
    let _: i64 = script.key("warm").invoke_async(&mut c).await.unwrap();
    let start = Instant::now();
    for _ in 0..n {
        let _: i64 = script.key("rtt").invoke_async(&mut c).await.unwrap();
    }
    start.elapsed() / n as u32
}

/// Throughput of `tasks` tasks each doing sequential raw EVALSHA pairs on one connection.
async fn parallel_limit(url: &str, tasks: usize, pairs: usize) -> f64 {
    let c = manager(url).await;
    let start = Instant::now();
    let mut hs = Vec::new();
    for t in 0..tasks {
        let mut c = c.clone();
        hs.push(tokio::spawn(async move {
            let script = redis::Script::new(TRIVIAL);
            let key = format!("par:{t}");
            for _ in 0..pairs {
                let _: i64 = script.key(&key).invoke_async(&mut c).await.unwrap();
                let _: i64 = script.key(&key).invoke_async(&mut c).await.unwrap();
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    (tasks * pairs) as f64 / start.elapsed().as_secs_f64()
}

struct Row {
    workload: &'static str,
    subject: String,
    measured: String,
    ratio: String,
    target: &'static str,
    met: Option<bool>,
}

fn row(
    workload: &'static str,
    subject: &str,
    measured: String,
    ratio: String,
    target: &'static str,
    met: Option<bool>,
) -> Row {
    Row {
        workload,
        subject: subject.to_string(),
        measured,
        ratio,
        target,
        met,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Lib {
    Ours,
    Rslock,
    Rlock,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Ours => "redis-rlock",
            Lib::Rslock => "rslock 0.10",
            Lib::Rlock => "rlock 0.2",
        }
    }
    fn parse(s: &str) -> Lib {
        match s {
            "rslock" => Lib::Rslock,
            "rlock" => Lib::Rlock,
            _ => Lib::Ours,
        }
    }
    fn arg(self) -> &'static str {
        match self {
            Lib::Ours => "ours",
            Lib::Rslock => "rslock",
            Lib::Rlock => "rlock",
        }
    }
}

/// One uniform lock interface over the three crates, for the shared workloads.
enum Locker {
    Ours(Client),
    Rslock(rslock::LockManager),
    Rlock(rlock::async_lock::RLock),
}

enum Held {
    Ours(redis_rlock::LockGuard),
    Rslock(rslock::Lock),
    Rlock(rlock::async_lock::RLockGuard),
}

impl Locker {
    async fn new(lib: Lib, url: &str) -> Locker {
        match lib {
            Lib::Ours => Locker::Ours(Client::connect(url).await.unwrap()),
            Lib::Rslock => Locker::Rslock(rslock::LockManager::new(vec![url.to_string()])),
            Lib::Rlock => Locker::Rlock(rlock::async_lock::RLock::new(url).await.unwrap()),
        }
    }

    async fn lock(&self, name: &str) -> Held {
        match self {
            Locker::Ours(c) => Held::Ours(c.lock(name).lock().await.unwrap()),
            Locker::Rslock(m) => Held::Rslock(
                m.acquire_no_guard(name.as_bytes(), Duration::from_secs(30))
                    .await
                    .unwrap(),
            ),
            Locker::Rlock(r) => Held::Rlock(r.acquire_mutex(name).await.unwrap()),
        }
    }

    async fn unlock(&self, held: Held) {
        match (self, held) {
            (_, Held::Ours(g)) => g.unlock().await.unwrap(),
            (Locker::Rslock(m), Held::Rslock(l)) => m.unlock(&l).await,
            (_, Held::Rlock(mut g)) => g.release().await.unwrap(),
            _ => unreachable!(),
        }
    }
}

/// Time of `n` sequential raw pairs (two EVALSHA of a trivial script) on `c`.
async fn raw_pairs(c: &mut ConnectionManager, n: usize) -> Duration {
    let script = redis::Script::new(TRIVIAL);
    let start = Instant::now();
    for _ in 0..n {
        let _: i64 = script.key("rtt").invoke_async(c).await.unwrap();
        let _: i64 = script.key("rtt").invoke_async(c).await.unwrap();
    }
    start.elapsed()
}

/// Time of `n` sequential lock+unlock pairs on one name.
async fn lock_pairs(l: &Locker, name: &str, n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        let h = l.lock(name).await;
        l.unlock(h).await;
    }
    start.elapsed()
}

/// W1: blocks of raw pairs and of each crate's lock+unlock pairs, interleaved so that
/// every crate and the limit see the same machine noise. Returns per crate the mean
/// time per pair and its ratio to the raw pair.
async fn w1(url: &str, n: usize) -> Vec<(Lib, Duration, f64)> {
    let rounds = 10;
    let block = (n / rounds).max(1);
    let mut c = manager(url).await;
    let libs = [Lib::Ours, Lib::Rslock, Lib::Rlock];
    let mut lockers = Vec::new();
    for lib in libs {
        let l = Locker::new(lib, url).await;
        lock_pairs(&l, &format!("w1:{}", lib.arg()), 10).await;
        lockers.push(l);
    }
    raw_pairs(&mut c, 10).await;
    let mut raw_total = Duration::ZERO;
    let mut totals = vec![Duration::ZERO; libs.len()];
    for _ in 0..rounds {
        raw_total += raw_pairs(&mut c, block).await;
        for (i, lib) in libs.iter().enumerate() {
            totals[i] += lock_pairs(&lockers[i], &format!("w1:{}", lib.arg()), block).await;
        }
    }
    let per = (rounds * block) as u32;
    libs.iter()
        .zip(totals)
        .map(|(lib, t)| (*lib, t / per, raw_total.as_secs_f64() / t.as_secs_f64()))
        .collect()
}

/// W2: 64 tasks on one client, each its own name; pairs per second.
async fn w2(c: &Client, tasks: usize, pairs: usize) -> f64 {
    let start = Instant::now();
    let mut hs = Vec::new();
    for t in 0..tasks {
        let lock = c.lock(format!("w2:{t}"));
        hs.push(tokio::spawn(async move {
            for _ in 0..pairs {
                lock.lock().await.unwrap().unlock().await.unwrap();
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    (tasks * pairs) as f64 / start.elapsed().as_secs_f64()
}

/// W3 worker: `tasks` tasks looping lock/unlock on one name from `start_ns` for `dur`.
/// Returns per task the (acquired, release-started) wall-clock times of each hold.
async fn w3_worker(
    lib: Lib,
    url: &str,
    tasks: usize,
    start_ns: u128,
    dur: Duration,
) -> Vec<Vec<(u128, u128)>> {
    let l = Arc::new(Locker::new(lib, url).await);
    let wait = start_ns.saturating_sub(wall_ns());
    tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
    let stop = Instant::now() + dur;
    let out = Arc::new(Mutex::new(vec![Vec::new(); tasks]));
    let mut hs = Vec::new();
    for t in 0..tasks {
        let (l, out) = (l.clone(), out.clone());
        hs.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while Instant::now() < stop {
                let h = l.lock("w3").await;
                let acquired = wall_ns();
                let released = wall_ns();
                l.unlock(h).await;
                mine.push((acquired, released));
            }
            out.lock()[t] = mine;
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    let v = out.lock().clone();
    v
}

struct W3 {
    per_sec: f64,
    handoff_p50: Duration,
    handoff_p99: Duration,
    fairness: f64,
}

/// W3: this process and a child process, 8 tasks each, one name, zero hold time.
async fn w3(lib: Lib, url: &str, dur: Duration) -> W3 {
    let start_ns = wall_ns() + 1_500_000_000;
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args([
            "--w3-child",
            lib.arg(),
            url,
            &start_ns.to_string(),
            &dur.as_millis().to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mine = w3_worker(lib, url, 8, start_ns, dur).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut theirs: Vec<Vec<(u128, u128)>> = vec![Vec::new(); 8];
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some("HOLD") {
            continue;
        }
        let t: usize = it.next().unwrap().parse().unwrap();
        let a: u128 = it.next().unwrap().parse().unwrap();
        let r: u128 = it.next().unwrap().parse().unwrap();
        theirs[t].push((a, r));
    }
    let mut all: Vec<(u128, u128)> = Vec::new();
    let mut counts = Vec::new();
    for task in mine.iter().chain(theirs.iter()) {
        counts.push(task.len());
        all.extend(task.iter().copied());
    }
    all.sort();
    let mut handoffs: Vec<f64> = all
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1) as f64)
        .collect();
    handoffs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let max = *counts.iter().max().unwrap_or(&0) as f64;
    let min = *counts.iter().min().unwrap_or(&0) as f64;
    W3 {
        per_sec: all.len() as f64 / dur.as_secs_f64(),
        handoff_p50: Duration::from_nanos(pct(&handoffs, 0.5) as u64),
        handoff_p99: Duration::from_nanos(pct(&handoffs, 0.99) as u64),
        fairness: if min > 0.0 { max / min } else { f64::INFINITY },
    }
}

/// redis-server's CPU seconds so far (INFO cpu).
async fn redis_cpu(url: &str) -> f64 {
    let text: String = redis::from_redis_value(raw(url, &["INFO", "cpu"]).await).unwrap();
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn evalsha_calls(info: &redis::Value) -> u64 {
    let text: String = redis::from_redis_value(info.clone()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .map(|r| r.split(',').next().unwrap().parse().unwrap())
        .unwrap_or(0)
}

/// W4: `n` held watchdog locks; script calls per renewal period and CPU share.
async fn w4(url: &str, n: usize) -> (f64, f64) {
    let wd = Duration::from_secs(3);
    let c = Client::builder(url)
        .watchdog_timeout(wd)
        .build()
        .await
        .unwrap();
    let mut guards = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let futs = chunk.iter().map(|i| {
            let lock = c.lock(format!("w4:{i}"));
            async move { lock.lock().await.unwrap() }
        });
        guards.extend(futures_util::future::join_all(futs).await);
    }
    let periods = 3u32;
    tokio::time::sleep(wd / 6).await; // between two renewal passes
    let before_calls = evalsha_calls(&raw(url, &["INFO", "commandstats"]).await);
    let before_cpu = cpu::cpu_ticks();
    let start = Instant::now();
    tokio::time::sleep(wd / 3 * periods).await;
    let after_cpu = cpu::cpu_ticks();
    let elapsed = start.elapsed();
    let after_calls = evalsha_calls(&raw(url, &["INFO", "commandstats"]).await);
    // Two INFO calls are not EVALSHA; nothing else runs now.
    let calls_per_period = (after_calls - before_calls) as f64 / periods as f64;
    let ticks_per_sec = 100.0;
    let cpu_share = (after_cpu - before_cpu) as f64 / ticks_per_sec / elapsed.as_secs_f64();
    let futs = guards.into_iter().map(|g| g.unlock());
    futures_util::future::join_all(futs).await;
    (calls_per_period, cpu_share)
}

/// W4 permits: `n` watched permits of one permit-expirable semaphore, held in watchdog
/// mode; script calls per renewal period and CPU share, measured as W4.
async fn w4_permits(url: &str, n: usize) -> (f64, f64) {
    let wd = Duration::from_secs(3);
    let c = Client::builder(url)
        .watchdog_timeout(wd)
        .build()
        .await
        .unwrap();
    let pes = c.permit_expirable_semaphore("w4p");
    pes.try_set_permits(n as u32).await.unwrap();
    let mut guards = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let futs = chunk
            .iter()
            .map(|_| async { pes.acquire_permit().await.unwrap() });
        guards.extend(futures_util::future::join_all(futs).await);
    }
    let periods = 3u32;
    tokio::time::sleep(wd / 6).await; // between two renewal passes
    let before_calls = evalsha_calls(&raw(url, &["INFO", "commandstats"]).await);
    let before_cpu = cpu::cpu_ticks();
    let start = Instant::now();
    tokio::time::sleep(wd / 3 * periods).await;
    let after_cpu = cpu::cpu_ticks();
    let elapsed = start.elapsed();
    let after_calls = evalsha_calls(&raw(url, &["INFO", "commandstats"]).await);
    let calls_per_period = (after_calls - before_calls) as f64 / periods as f64;
    let ticks_per_sec = 100.0;
    let cpu_share = (after_cpu - before_cpu) as f64 / ticks_per_sec / elapsed.as_secs_f64();
    assert!(
        guards.iter().all(|g| !g.is_lost()),
        "a watched permit was lost"
    );
    let futs = guards.into_iter().map(|g| g.release());
    for r in futures_util::future::join_all(futs).await {
        r.unwrap();
    }
    let _ = raw(url, &["DEL", "w4p", "{w4p}:timeout"]).await;
    (calls_per_period, cpu_share)
}

/// W5: `waiters` tasks waiting on `names` names; pub/sub connections, memory per waiter,
/// and time until all are served after release.
async fn w5(url: &str, names: usize, waiters: usize) -> (usize, f64, f64, Duration, usize) {
    let holder = Client::connect(url).await.unwrap();
    let mut guards = Vec::new();
    for i in 0..names {
        guards.push(holder.lock(format!("w5:{i}")).lock().await.unwrap());
    }
    let c = Client::connect(url).await.unwrap();
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rss_before = rss_kib();
    let live_before = live_bytes();
    let mut hs = Vec::with_capacity(waiters);
    for w in 0..waiters {
        let lock = c.lock(format!("w5:{}", w % names));
        let served = served.clone();
        hs.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            g.unlock().await.unwrap();
        }));
    }
    // Wait until every name is subscribed.
    let start = Instant::now();
    loop {
        let v = raw(url, &["PUBSUB", "NUMPAT"]).await;
        let _ = v;
        let chans: Vec<String> = redis::from_redis_value(
            raw(url, &["PUBSUB", "CHANNELS", "redisson_lock__channel:{w5:*"]).await,
        )
        .unwrap();
        if chans.len() == names || start.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_after = rss_kib();
    let live_after = live_bytes();
    let list: String =
        redis::from_redis_value(raw(url, &["CLIENT", "LIST", "TYPE", "pubsub"]).await).unwrap();
    let pubsub_conns = list.lines().count();
    let rss_per_waiter = (rss_after.saturating_sub(rss_before)) as f64 * 1024.0 / waiters as f64;
    let per_waiter = (live_after - live_before) as f64 / waiters as f64;
    let released = Instant::now();
    for g in guards {
        g.unlock().await.unwrap();
    }
    for h in hs {
        h.await.unwrap();
    }
    let all_served = released.elapsed();
    (
        pubsub_conns,
        per_waiter,
        rss_per_waiter,
        all_served,
        served.load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// W6: nested lock+unlock at depth 1 and 3, interleaved with raw round trips. Returns
/// the mean time of each and the mean round trip.
async fn w6(url: &str, n: usize) -> (Duration, Duration, Duration) {
    let c = Client::connect(url).await.unwrap();
    let mut raw = manager(url).await;
    let lock = c.lock("w6");
    let rounds = 10;
    let block = (n / rounds).max(1);
    let (mut t1, mut t3, mut rt) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        rt += raw_pairs(&mut raw, block).await;
        let start = Instant::now();
        for _ in 0..block {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }
        t1 += start.elapsed();
        let start = Instant::now();
        for _ in 0..block {
            let a = lock.lock().await.unwrap();
            let b = lock.lock().await.unwrap();
            let d = lock.lock().await.unwrap();
            d.unlock().await.unwrap();
            b.unlock().await.unwrap();
            a.unlock().await.unwrap();
        }
        t3 += start.elapsed();
    }
    let per = (rounds * block) as u32;
    (t1 / per, t3 / per, rt / (2 * per))
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if args.get(1).map(String::as_str) == Some("--w3-child") {
        let lib = Lib::parse(&args[2]);
        let url = args[3].clone();
        let start_ns: u128 = args[4].parse().unwrap();
        let dur = Duration::from_millis(args[5].parse().unwrap());
        let per_task = rt.block_on(w3_worker(lib, &url, 8, start_ns, dur));
        let mut out = String::new();
        for (t, holds) in per_task.iter().enumerate() {
            for (a, r) in holds {
                writeln!(out, "HOLD {t} {a} {r}").unwrap();
            }
        }
        print!("{out}");
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass nothing useful.
    let server = start_server();
    let url = server.url.clone();
    let q = quick();
    let rows = rt.block_on(async move { run_all(&url, q).await });
    let version: String = rt.block_on(async {
        let info = raw(&server.url, &["INFO", "server"]).await;
        let text: String = redis::from_redis_value(info).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_string()
    });
    let table = render(&rows.1, rows.0, &version, q);
    println!("{table}");
    // Only a full run of every workload replaces the published table.
    if !q
        && std::env::var("RLOCK_BENCH_ONLY").is_err()
        && std::env::var("RLOCK_BENCH_LIBS").is_err()
    {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md");
        std::fs::write(path, &table).unwrap();
        println!("written to docs/benchmarks.md");
    }
}

async fn run_all(url: &str, q: bool) -> (Duration, Vec<Row>) {
    let scale = if q { 10 } else { 1 };
    let mut rows = Vec::new();
    let rtt1 = rtt(url, 5000 / scale).await;
    println!("limit: raw EVALSHA round trip {}", us(rtt1));

    // W1
    if wanted("W1") {
        for (lib, pair, ratio) in w1(url, 3000 / scale).await {
            let (target, met) = if lib == Lib::Ours {
                (">= 0.9x", Some(ratio >= 0.9))
            } else {
                ("", None)
            };
            rows.push(row(
                "W1 uncontended",
                lib.name(),
                format!("{} per pair", us(pair)),
                format!("{ratio:.2}x of 2 RTT"),
                target,
                met,
            ));
        }
    }

    // W2
    if wanted("W2") {
        let pairs = 100 / scale;
        let c = Client::connect(url).await.unwrap();
        let (mut limit, mut ours) = (0.0, 0.0);
        // Redis's own CPU share in each phase: says whether the server or the client is
        // the bottleneck.
        let (mut cpu_limit, mut cpu_ours) = (0.0, 0.0);
        for _ in 0..3 {
            let (c0, t0) = (redis_cpu(url).await, Instant::now());
            limit += parallel_limit(url, 64, pairs).await;
            let (c1, t1) = (redis_cpu(url).await, Instant::now());
            ours += w2(&c, 64, pairs).await;
            let (c2, t2) = (redis_cpu(url).await, Instant::now());
            cpu_limit += (c1 - c0) / (t1 - t0).as_secs_f64() / 3.0;
            cpu_ours += (c2 - c1) / (t2 - t1).as_secs_f64() / 3.0;
        }
        let (limit, ours) = (limit / 3.0, ours / 3.0);
        let ratio = ours / limit;
        rows.push(row(
            "W2 parallel (64 tasks)",
            "redis-rlock",
            format!(
                "{ours:.0} pairs/s (limit {limit:.0}); redis-server CPU {:.0}% (limit phase {:.0}%)",
                cpu_ours * 100.0,
                cpu_limit * 100.0
            ),
            format!("{ratio:.2}x"),
            ">= 0.8x",
            Some(ratio >= 0.8),
        ));
    }

    // W3
    if wanted("W3") {
        let dur = Duration::from_millis(if q { 800 } else { 3000 });
        let mut w3s = Vec::new();
        for lib in [Lib::Ours, Lib::Rslock, Lib::Rlock] {
            if !lib_wanted(lib) {
                continue;
            }
            // The round trip right around the run, so hand-off ratios share its noise.
            let before = rtt(url, 500 / scale).await;
            let r = w3(lib, url, dur).await;
            let after = rtt(url, 500 / scale).await;
            w3s.push((lib, r, (before + after) / 2));
        }
        let best_peer = w3s
            .iter()
            .filter(|(l, _, _)| *l != Lib::Ours)
            .map(|(_, r, _)| r.per_sec)
            .fold(0.0, f64::max);
        for (lib, r, rt) in &w3s {
            let handoff_ratio = r.handoff_p50.as_secs_f64() / rt.as_secs_f64();
            let ours = *lib == Lib::Ours;
            rows.push(row(
                "W3 contended (2 proc x 8 tasks)",
                lib.name(),
                format!(
                    "{:.0} acq/s; hand-off p50 {} p99 {}; fairness max/min {:.2}",
                    r.per_sec,
                    us(r.handoff_p50),
                    us(r.handoff_p99),
                    r.fairness
                ),
                format!("hand-off p50 {handoff_ratio:.2} RTT"),
                if ours {
                    "p50 <= 2 RTT; acq/s >= peers; fairness <= 2"
                } else {
                    ""
                },
                ours.then_some(handoff_ratio <= 2.0 && r.per_sec >= best_peer && r.fairness <= 2.0),
            ));
        }
    }

    // W4
    if wanted("W4") {
        let (calls, cpu) = w4(url, 10_000 / scale).await;
        rows.push(row(
            "W4 watchdog (10,000 held)",
            "redis-rlock",
            format!(
                "{calls:.1} renew calls/period; CPU {:.2}% of a core",
                cpu * 100.0
            ),
            format!(
                "{:.2} calls per 100 locks",
                calls / (100.0 / scale as f64).max(1.0)
            ),
            "<= 100 calls/period; CPU < 5%",
            Some(calls <= 100.0 && cpu < 0.05),
        ));
    }

    // W4, for watched permits of a permit-expirable semaphore
    if wanted("W4P") {
        let (calls, cpu) = w4_permits(url, 10_000 / scale).await;
        rows.push(row(
            "W4 watchdog (10,000 watched permits)",
            "redis-rlock",
            format!(
                "{calls:.1} renew calls/period; CPU {:.2}% of a core",
                cpu * 100.0
            ),
            format!(
                "{:.2} calls per 100 permits",
                calls / (100.0 / scale as f64).max(1.0)
            ),
            "<= 100 calls/period; CPU < 5%",
            Some(calls <= 100.0 && cpu < 0.05),
        ));
    }

    // W5
    if wanted("W5") {
        let (conns, per_waiter, rss_per_waiter, served_in, served) =
            w5(url, 1000 / scale, 10_000 / scale).await;
        rows.push(row(
            "W5 waiters (10,000 on 1,000 names)",
            "redis-rlock",
            format!(
                "{conns} pub/sub conn; {:.0} B/waiter live heap ({:.0} B RSS); all {served} served {} after release",
                per_waiter,
                rss_per_waiter,
                us(served_in)
            ),
            format!(
                "{:.0} RTT to serve all",
                served_in.as_secs_f64() / rtt1.as_secs_f64()
            ),
            "1 conn; <= 2 KiB/waiter; all served",
            Some(conns == 1 && per_waiter <= 2048.0 && served == 10_000 / scale),
        ));
    }

    // W6
    if wanted("W6") {
        let (t1, t3, rt) = w6(url, 2000 / scale).await;
        let per_level = (t3.as_secs_f64() - t1.as_secs_f64()) / 2.0 / rt.as_secs_f64();
        rows.push(row(
            "W6 reentrancy (depth 3)",
            "redis-rlock",
            format!("depth 1 {}; depth 3 {}; RTT {}", us(t1), us(t3), us(rt)),
            format!("{per_level:.2} RTT per nested level"),
            "<= 1 RTT per level",
            Some(per_level <= 1.0),
        ));
    }

    (rtt1, rows)
}

fn render(rows: &[Row], rtt1: Duration, version: &str, q: bool) -> String {
    let mut s = String::new();
    writeln!(s, "# Benchmarks\n").unwrap();
    writeln!(
        s,
        "Reproduce: `cargo bench --bench locks` (starts its own redis-server on loopback). \
         Machine: {} cores, {}; Redis {version}{}.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::env::consts::ARCH,
        if q {
            " (quick run, scaled down 10x)"
        } else {
            ""
        }
    )
    .unwrap();
    writeln!(
        s,
        "The limit is the raw EVALSHA round trip of a trivial one-key script through a \
         ConnectionManager, measured in the same run: **{}**. Every ratio is relative to it.\n",
        us(rtt1)
    )
    .unwrap();
    writeln!(s, "| workload | crate | measured | ratio | target | met |").unwrap();
    writeln!(s, "|---|---|---|---|---|---|").unwrap();
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.workload, r.subject, r.measured, r.ratio, r.target, met
        )
        .unwrap();
    }
    s.push_str(NOTES);
    s
}

/// Reading the table; the profile behind each missed target.
const NOTES: &str = "
## Reading the table

Ratios move by about 10% between runs on this 2-core machine, where redis-server, the
client and (in W3) a second client process share the cores; compare rows of one run.

- **W6 (reentrancy), met.** A nested `lock()` of a watchdog hold that the client knows is
  live is served locally, with no round trip; only the first lock and the last unlock go
  to Redis (`docs/protocol.md` 1.3). A nested level now costs about 0 round trips (it was
  2.5 with one `HINCRBY` script each way). Fixed-lease re-entries still go through Redis.
- **W1 (latency), at the edge.** A pair is one acquire and one unlock script, one round
  trip each, as in Redisson. The common path runs `EXISTS INCR HINCRBY PEXPIRE` and
  `HGET PUBLISH DEL`; latches are written only where a retry could not otherwise tell
  what happened, and request ids cost no `getrandom` call. strace counts the same system
  calls per pair as the raw loop (futex, epoll_wait, writev, recvfrom within 3%). What is
  left is server time for 5 commands more than the trivial scripts, the fencing counter's
  `INCR` among them, and client work between the two round trips (guard, watchdog
  registry, building the calls). Runs on this machine give 0.78-0.98x, so some meet
  the target and some do not; the row above is one run.
- **W2 (throughput), missed.** With 64 tasks both phases keep redis-server near one core
  and the client on the other. Redis spends about 2x more CPU per lock+unlock pair than
  per raw pair of 1-command scripts (7 commands against 2); Redisson's own scripts run 7
  as well (`EXISTS HINCRBY PEXPIRE`, `HEXISTS HINCRBY DEL PUBLISH`), so no
  Redisson-compatible protocol reaches 0.8x of this limit on a shared 2-core machine.
  Dropping the latches from the common path moved the ratio from 0.34-0.38x to
  0.37-0.54x (runs vary widely here). The plain lock no longer draws a fencing token
  (only `fenced_lock` does, as Redisson's `RFencedLock`): one `INCR` less per pair. In
  three alternating runs of both builds on one busy machine, W2 went from 0.39-0.42x to
  0.42-0.51x; W1 stayed at 0.76-0.82x of 2 RTT (0.80-0.81x before), within the noise.
- **W3 (contention), met.** A release goes straight to the oldest sleeping waiter of the
  same client inside the unlock script (`docs/protocol.md` 2.2): no message and no
  acquire. A task that starts waiting while others of its client sleep queues behind them
  without a round trip. A run of hand-overs ends after 5 ms or 256 grants; the release
  that ends it is published, and the releasing client holds back for two round trips so
  that both processes race on equal terms. Each step, measured on one day on this machine
  (acq/s; hand-off p50; fairness): publish every release 10,201, 1.34 RTT, 1.27;
  hand-over in runs of 16 grants 11,300-11,700, 1.27-1.42 RTT, 1.03-1.26; new waiters
  queue behind sleeping ones 17,950-18,440, 0.56-0.81 RTT, 1.10-1.12; runs of 64 grants
  or 5 ms 20,800-23,300, 0.26-0.29 RTT, 1.07-1.17, against rslock's 22,500-24,600 in the
  same runs; runs of 5 ms or 256 grants 28,700-28,800, against rslock's 23,100-23,400.
  Making hand-overs safe against lost replies costs one latch `SET` per grant (its `DEL`
  goes in batches gathered over 20 ms): 26,500-27,100 against rslock's 23,700-24,100,
  fairness 1.08-1.11 against rslock's 2.9-4.5 (its waiters poll, and the task that just
  released takes the lock again at once). Two ways of settling offers cost far more and
  were dropped: a task spawned per hand-over (so that an unlock future left unpolled
  cannot hold its waiter) halved the grants per second, and deleting latches every 2 ms
  took a quarter. Of the hand-offs 62% take under 30 µs and 32% 30-100 µs (a worker
  thread woken from sleep on the way); during the run the machine is about a third idle,
  with the client processes' time mostly in the kernel's wake-up path: what is left is
  latency, not CPU.
- **Module split (no import circle, the acquire loop as a state machine).** Measured with
  both builds alternating, three runs each, on one busy day (W1 ratio to 2 RTT; W2 ratio to
  the limit; W3 acq/s with `RLOCK_BENCH_LIBS=ours,rslock`): before 0.79-0.82x, 0.43-0.50x,
  7,814-9,324; after 0.73-0.88x, 0.42-0.52x, 9,399-9,555. No change beyond the noise.
- **W4.** One script call renews 100 locks; 10,000 locks cost 100 calls per period.
  Watched permits are renewed the same way: one call per semaphore and 100 permits
  (`lua/permit_renew.lua`).
- **W5.** Live heap per waiter is counted by a counting allocator in the benchmark binary
  (the task, its future, its share of the channel entry and its hand-over ticket). RSS is
  shown too; it keeps the allocator's high-water mark from the burst of 10,000 first
  attempts, and reads 0 when the waiters fit in memory freed by the workloads before.
";
