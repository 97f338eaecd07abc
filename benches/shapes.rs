//! Issue #14's service shapes, every row side by side with rslock 0.10 in the same run.
//!
//! A service runs `#[tokio::main]` (a multi-thread runtime with one worker per core) and
//! either shares one client between its tasks, or, scaled out, is one instance per
//! worker, or several OS processes. Each workload below is measured in each of these
//! shapes, on one redis-server:
//!
//! - W1: one task, lock + unlock pairs on its own name; p50 of a pair.
//! - W2: N tasks, one name each, lock + unlock pairs; pairs per second (N = 8 and 64).
//! - W3: 8 tasks on one name, no hold and a 1 ms hold; grants per second, fairness.
//! - W4: 8 tasks on one name, a read-modify-write of a counter under the lock (`GET`,
//!   then `SET` of the value plus one); lost updates are counted.
//!
//! Shapes: `shared` (one process, one client for all tasks), `per-task` (one process,
//! one client per task) and `procs` (`RLOCK_SHAPES_PROCS` OS processes, 4 by default,
//! each with one shared client and its share of the tasks).
//!
//! Two rows without a lock frame W1 and W2: `limit`, a pair of trivial one-key scripts
//! by `EVALSHA`, and `floor`, a pair of Redisson's own acquire and unlock scripts by
//! `EVALSHA` (the commands its protocol runs, without the client's latch `DEL`).
//! Every client uses a fixed 10 s lease and waits without a bound.
//!
//!     cargo bench --bench shapes
//!     RLOCK_SHAPES_SECS=3 RLOCK_SHAPES_ONLY=W3 cargo bench --bench shapes
//!
//! Per acquisition, the Redis side is read from `INFO`: script calls, all commands and
//! the server's CPU time. Uses `REDIS_URL` when set; otherwise starts a redis-server on
//! a free loopback port.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/server.rs"]
mod server;

const LEASE: Duration = Duration::from_secs(10);
const TRIVIAL: &str = "return redis.call('exists', KEYS[1])";

// Redisson's acquire and unlock scripts, as `docs/protocol.md` 1.x states them (the
// same commands, written here for the floor row).
#[path = "../tests/common/redisson_rlock.rs"]
mod redisson_rlock;
use redisson_rlock::{ACQUIRE as REDISSON_ACQUIRE, UNLOCK as REDISSON_UNLOCK};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Lib {
    Ours,
    Rslock,
    Floor,
    Limit,
    /// This crate's own scripts by raw `EVALSHA`, with the arguments of the common path.
    Scripts,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Ours => "ours",
            Lib::Rslock => "rslock",
            Lib::Floor => "floor",
            Lib::Limit => "limit",
            Lib::Scripts => "scripts",
        }
    }

    fn parse(s: &str) -> Lib {
        match s {
            "ours" => Lib::Ours,
            "rslock" => Lib::Rslock,
            "floor" => Lib::Floor,
            "scripts" => Lib::Scripts,
            _ => Lib::Limit,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Shape {
    Shared,
    PerTask,
    Procs,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Shared => "shared",
            Shape::PerTask => "per-task",
            Shape::Procs => "procs",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    W1,
    W2,
    W3,
    W4,
}

/// One measurement: a workload with its task count and hold.
#[derive(Clone, Copy)]
struct Work {
    kind: Kind,
    tasks: usize,
    hold: Duration,
}

/// The connection one or more tasks lock through.
#[derive(Clone)]
enum Conn {
    Ours(redis_rlock::Client),
    Rslock(Arc<rslock::LockManager>),
    Raw(ConnectionManager),
}

async fn connect(lib: Lib, url: &str) -> Conn {
    match lib {
        Lib::Ours => {
            let mut b = redis_rlock::Client::builder(url);
            // Knobs for experiments; the table uses the defaults.
            if let Ok(ms) = std::env::var("RLOCK_HANDOVER_WINDOW_MS") {
                b = b.handover_window(Duration::from_millis(ms.parse().unwrap()));
            }
            if let Ok(ms) = std::env::var("RLOCK_TURN_WINDOW_MS") {
                b = b.turn_window(Duration::from_millis(ms.parse().unwrap()));
            }
            Conn::Ours(b.build().await.unwrap())
        }
        Lib::Rslock => Conn::Rslock(Arc::new(rslock::LockManager::new(vec![url.to_string()]))),
        Lib::Floor | Lib::Limit | Lib::Scripts => Conn::Raw(
            ConnectionManager::new(redis::Client::open(url).unwrap())
                .await
                .unwrap(),
        ),
    }
}

/// One task's lock on `name`, through its connection.
enum Locker {
    Ours(redis_rlock::Lock),
    Rslock(Arc<rslock::LockManager>, Vec<u8>),
    Floor {
        conn: ConnectionManager,
        keys: [String; 3],
        field: String,
        n: u64,
    },
    Limit(ConnectionManager, String),
    Scripts(ConnectionManager, String, String),
}

enum Held {
    Ours(redis_rlock::LockGuard),
    Rslock(rslock::Lock),
    Raw,
}

/// The text the client sends for `lua/<file>`.
fn our_script(file: &str) -> &'static str {
    redis_rlock::protocol::script_source(file).expect("a script of the crate")
}

thread_local! {
    static ACQUIRE: redis::Script = redis::Script::new(REDISSON_ACQUIRE);
    static UNLOCK: redis::Script = redis::Script::new(REDISSON_UNLOCK);
    static TRIVIAL_SCRIPT: redis::Script = redis::Script::new(TRIVIAL);
    static OUR_TAKE: redis::Script = redis::Script::new(our_script("take.lua"));
    static OUR_RELEASE: redis::Script = redis::Script::new(our_script("release.lua"));
}

impl Locker {
    fn new(conn: &Conn, name: &str, task: usize) -> Locker {
        match conn {
            Conn::Ours(c) => Locker::Ours(c.lock(name)),
            Conn::Rslock(m) => Locker::Rslock(m.clone(), name.as_bytes().to_vec()),
            Conn::Raw(c) if name.starts_with("limit") => Locker::Limit(c.clone(), name.into()),
            Conn::Raw(c) if name.starts_with("scripts") => Locker::Scripts(
                c.clone(),
                name.into(),
                format!("6f1b9c0e-5d8a-4c52-9a4e-3f7d2b1c8e90:{task}"),
            ),
            Conn::Raw(c) => Locker::Floor {
                conn: c.clone(),
                keys: [
                    name.to_string(),
                    format!("redisson_lock__channel:{{{name}}}"),
                    String::new(),
                ],
                field: format!("6f1b9c0e-5d8a-4c52-9a4e-3f7d2b1c8e90:{task}"),
                n: 0,
            },
        }
    }

    async fn acquire(&mut self) -> Held {
        match self {
            Locker::Ours(l) => Held::Ours(l.lock_with_lease(LEASE).await.unwrap()),
            Locker::Rslock(m, name) => {
                Held::Rslock(m.acquire_no_guard(&*name, LEASE).await.unwrap())
            }
            Locker::Floor {
                conn, keys, field, ..
            } => {
                let script = ACQUIRE.with(|s| s.clone());
                loop {
                    let r: Option<i64> = script
                        .key(&keys[0])
                        .arg(LEASE.as_millis() as u64)
                        .arg(&*field)
                        .invoke_async(conn)
                        .await
                        .unwrap();
                    if r.is_none() {
                        return Held::Raw;
                    }
                }
            }
            Locker::Limit(conn, key) => {
                let script = TRIVIAL_SCRIPT.with(|s| s.clone());
                let _: i64 = script.key(&*key).invoke_async(conn).await.unwrap();
                Held::Raw
            }
            Locker::Scripts(conn, name, field) => {
                // As the client sends a waiting call's first attempt (`raw::acquire`).
                let script = OUR_TAKE.with(|s| s.clone());
                let _: redis::Value = script
                    .key(&*name)
                    .key(format!("redisson_lock_clients:{{{name}}}"))
                    .key(format!("redisson_lock_turn:{{{name}}}"))
                    .arg(LEASE.as_millis() as u64)
                    .arg(&*field)
                    .invoke_async(conn)
                    .await
                    .unwrap();
                Held::Raw
            }
        }
    }

    async fn release(&mut self, held: Held) {
        match (self, held) {
            (Locker::Ours(_), Held::Ours(g)) => g.unlock().await.unwrap(),
            (Locker::Rslock(m, _), Held::Rslock(l)) => m.unlock(&l).await,
            (
                Locker::Floor {
                    conn,
                    keys,
                    field,
                    n,
                },
                _,
            ) => {
                *n += 1;
                keys[2] = format!("redisson_unlock_latch:{{{}}}:{field}{n:016x}", keys[0]);
                let script = UNLOCK.with(|s| s.clone());
                let _: Option<i64> = script
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .arg(0)
                    .arg(LEASE.as_millis() as u64)
                    .arg(&*field)
                    .arg("PUBLISH")
                    .arg(20_000)
                    .invoke_async(conn)
                    .await
                    .unwrap();
            }
            (Locker::Limit(conn, key), _) => {
                let script = TRIVIAL_SCRIPT.with(|s| s.clone());
                let _: i64 = script.key(&*key).invoke_async(conn).await.unwrap();
            }
            (Locker::Scripts(conn, name, field), _) => {
                // As the client sends a release with nobody to hand over to.
                let script = OUR_RELEASE.with(|s| s.clone());
                let _: redis::Value = script
                    .key(&*name)
                    .key(format!("redisson_lock__channel:{{{name}}}"))
                    .key(format!("redisson_unlock_latch:{{{name}}}:0123456789abcdef"))
                    .key(format!("redisson_lock_clients:{{{name}}}"))
                    .key(format!("redisson_lock_turn:{{{name}}}"))
                    .arg(&*field)
                    .arg(1)
                    .arg(0)
                    .arg(20_000)
                    .arg(10)
                    .invoke_async(conn)
                    .await
                    .unwrap();
            }
            _ => unreachable!("a hold of another library"),
        }
    }
}

/// What one process measured.
#[derive(Default)]
struct Tally {
    /// Grants per task.
    grants: Vec<u64>,
    longest_us: u64,
    /// The longest time between two grants in a row in this process, in µs.
    gap_us: u64,
    /// Pair times in µs (W1 only).
    pairs_us: Vec<f64>,
    overlaps: u64,
}

/// Runs `work.tasks` tasks (numbered from `first`) of `lib` in this process for `secs`
/// from `start`, sharing one connection or each with its own.
async fn run_here(
    url: &str,
    lib: Lib,
    work: Work,
    first: usize,
    per_task: bool,
    start: Option<u64>,
    secs: f64,
) -> Tally {
    let shared = connect(lib, url).await;
    let data = ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let mut conns = Vec::new();
    for _ in 0..work.tasks {
        conns.push(if per_task {
            (connect(lib, url).await, Some(data.clone()))
        } else {
            (shared.clone(), None)
        });
    }
    if let Some(wall_ms) = start {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let at = Duration::from_millis(wall_ms);
        if at > now {
            tokio::time::sleep(at - now).await;
        }
    }
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let inside = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let base = Instant::now();
    let last_grant = Arc::new(AtomicU64::new(0));
    let gap = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for (i, (conn, own_data)) in conns.into_iter().enumerate() {
        let task = first + i;
        let name = match (work.kind, lib) {
            (Kind::W1 | Kind::W2, Lib::Limit) => format!("limit:{task}"),
            (Kind::W1 | Kind::W2, Lib::Scripts) => format!("scripts:{task}"),
            (Kind::W1 | Kind::W2, _) => format!("shapes:{task}"),
            _ => "shapes:one".to_string(),
        };
        let mut data = own_data.unwrap_or_else(|| data.clone());
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        let (last_grant, gap) = (last_grant.clone(), gap.clone());
        let job = async move {
            let mut locker = Locker::new(&conn, &name, task);
            let (mut grants, mut longest, mut pairs) = (0u64, 0u64, Vec::new());
            while Instant::now() < until {
                let asked = Instant::now();
                let held = locker.acquire().await;
                let waited = asked.elapsed();
                if Instant::now() >= until {
                    locker.release(held).await;
                    break;
                }
                if inside.fetch_add(1, Ordering::SeqCst) != 0 && work.kind != Kind::W2 {
                    overlaps.fetch_add(1, Ordering::Relaxed);
                }
                grants += 1;
                let at = base.elapsed().as_micros() as u64;
                let before = last_grant.swap(at, Ordering::SeqCst);
                if before != 0 {
                    gap.fetch_max(at.saturating_sub(before), Ordering::Relaxed);
                }
                if waited.as_micros() as u64 > longest
                    && std::env::var("RLOCK_SHAPES_WHERE").is_ok()
                {
                    eprintln!(
                        "task {task}: waited {:?}, grant {grants}, {:?} before the end",
                        waited,
                        until - Instant::now()
                    );
                }
                longest = longest.max(waited.as_micros() as u64);
                if work.kind == Kind::W4 {
                    let v: Option<u64> = redis::cmd("GET")
                        .arg("shapes:counter")
                        .query_async(&mut data)
                        .await
                        .unwrap();
                    let _: () = redis::cmd("SET")
                        .arg("shapes:counter")
                        .arg(v.unwrap_or(0) + 1)
                        .query_async(&mut data)
                        .await
                        .unwrap();
                }
                if !work.hold.is_zero() {
                    tokio::time::sleep(work.hold).await;
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                locker.release(held).await;
                if work.kind == Kind::W1 {
                    pairs.push(asked.elapsed().as_secs_f64() * 1e6);
                }
            }
            (grants, longest, pairs)
        };
        handles.push(tokio::spawn(async move {
            // Bounded: a run that has not ended 30 s after its end is a bug to report.
            tokio::time::timeout(Duration::from_secs_f64(secs + 30.0), job)
                .await
                .expect("a task ended within 30 s of the run's end")
        }));
    }
    let mut tally = Tally::default();
    for h in handles {
        let (g, l, p) = h.await.unwrap();
        tally.grants.push(g);
        tally.longest_us = tally.longest_us.max(l);
        tally.pairs_us.extend(p);
    }
    tally.overlaps = overlaps.load(Ordering::Relaxed);
    tally.gap_us = gap.load(Ordering::Relaxed);
    if let Conn::Ours(c) = shared {
        let _ = c.shutdown().await;
    }
    tally
}

/// What the server did during a run, per `INFO`.
struct ServerUse {
    scripts: u64,
    commands: u64,
    cpu_s: f64,
}

async fn server_use(c: &mut ConnectionManager) -> ServerUse {
    let text: String = redis::cmd("INFO").arg("all").query_async(c).await.unwrap();
    let mut u = ServerUse {
        scripts: 0,
        commands: 0,
        cpu_s: 0.0,
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (cmd, stats) = rest.split_once(':').unwrap();
            let calls: u64 = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if cmd != "info" && cmd != "config" {
                u.commands += calls;
            }
            if cmd.starts_with("eval") || cmd.starts_with("fcall") {
                u.scripts += calls;
            }
        } else if let Some(v) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            u.cpu_s += v.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    u
}

/// One cell of the table.
struct Figures {
    per_sec: f64,
    p50_us: f64,
    /// Max/min grants across tasks (or across processes in `procs`).
    fairness: f64,
    /// The longest wait, in mean lock cycles (the run's time over its grants).
    longest_cycles: f64,
    /// The longest time with no grant at all, in mean lock cycles (one process only).
    gap_cycles: f64,
    gap_us: u64,
    scripts_per_acq: f64,
    commands_per_acq: f64,
    cpu_us_per_acq: f64,
    /// The client process's CPU per acquisition (in-process shapes only).
    client_us_per_acq: f64,
    lost: i64,
    overlaps: u64,
}

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn measure(url: &str, lib: Lib, work: Work, shape: Shape, secs: f64) -> Figures {
    let mut admin = ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("shapes:counter")
        .arg(0)
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .unwrap();
    let before = server_use(&mut admin).await;
    let ticks = cpu::cpu_ticks();
    // Grants per counted unit (task, or process), the longest wait, pair times.
    let mut gap_us = 0;
    let (units, longest_us, mut pairs, overlaps) = match shape {
        Shape::Shared | Shape::PerTask => {
            let t = run_here(url, lib, work, 0, shape == Shape::PerTask, None, secs).await;
            gap_us = t.gap_us;
            (t.grants, t.longest_us, t.pairs_us, t.overlaps)
        }
        Shape::Procs => {
            let procs = env_f64("RLOCK_SHAPES_PROCS", 4.0) as usize;
            let per = work.tasks / procs;
            let start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                + 1500;
            let me = std::env::current_exe().unwrap();
            let children: Vec<_> = (0..procs)
                .map(|p| {
                    let spec = format!(
                        "{} {:?} {per} {} {secs} {start} {}",
                        lib.name(),
                        work.kind,
                        work.hold.as_micros(),
                        p * per
                    );
                    Command::new(&me)
                        .env("RLOCK_SHAPES_CHILD", url)
                        .env("RLOCK_SHAPES_SPEC", spec)
                        .stdout(Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            let (mut units, mut longest, mut overlaps) = (Vec::new(), 0, 0);
            for c in children {
                let out = c.wait_with_output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text
                    .lines()
                    .find_map(|l| l.strip_prefix("RESULT "))
                    .expect("a child reported");
                let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
                units.push(v[0]);
                longest = longest.max(v[1]);
                overlaps += v[2];
            }
            (units, longest, Vec::new(), overlaps)
        }
    };
    let client_ticks = cpu::cpu_ticks() - ticks;
    let after = server_use(&mut admin).await;
    if std::env::var("RLOCK_SHAPES_STATS").is_ok() {
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut admin)
            .await
            .unwrap();
        eprintln!("{} {:?} {:?}:", lib.name(), work.kind, shape);
        for line in text.lines().filter(|l| l.starts_with("cmdstat_")) {
            eprintln!("  {line}");
        }
    }
    let counter: u64 = redis::cmd("GET")
        .arg("shapes:counter")
        .query_async(&mut admin)
        .await
        .unwrap();
    let total: u64 = units.iter().sum();
    let max = units.iter().copied().max().unwrap_or(0) as f64;
    let min = units.iter().copied().min().unwrap_or(0) as f64;
    pairs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let acq = total.max(1) as f64;
    let cycle_us = secs * 1e6 / acq;
    Figures {
        per_sec: total as f64 / secs,
        p50_us: pairs.get(pairs.len() / 2).copied().unwrap_or(0.0),
        fairness: if min > 0.0 { max / min } else { f64::INFINITY },
        longest_cycles: longest_us as f64 / cycle_us,
        gap_cycles: gap_us as f64 / cycle_us,
        gap_us,
        scripts_per_acq: (after.scripts - before.scripts) as f64 / acq,
        commands_per_acq: (after.commands - before.commands) as f64 / acq,
        cpu_us_per_acq: (after.cpu_s - before.cpu_s) * 1e6 / acq,
        client_us_per_acq: client_ticks as f64 * 1e4 / acq,
        lost: if work.kind == Kind::W4 {
            total as i64 - counter as i64
        } else {
            0
        },
        overlaps,
    }
}

/// A child process of the `procs` shape: runs its share and prints
/// `RESULT <grants> <longest wait µs> <overlaps>`.
fn child(url: &str, spec: &str) {
    let v: Vec<&str> = spec.split(' ').collect();
    let kind = match v[1] {
        "W1" => Kind::W1,
        "W2" => Kind::W2,
        "W3" => Kind::W3,
        _ => Kind::W4,
    };
    let work = Work {
        kind,
        tasks: v[2].parse().unwrap(),
        hold: Duration::from_micros(v[3].parse().unwrap()),
    };
    let secs: f64 = v[4].parse().unwrap();
    let start: u64 = v[5].parse().unwrap();
    let first: usize = v[6].parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = rt.block_on(run_here(
        url,
        Lib::parse(v[0]),
        work,
        first,
        false,
        Some(start),
        secs,
    ));
    println!(
        "RESULT {} {} {}",
        t.grants.iter().sum::<u64>(),
        t.longest_us,
        t.overlaps
    );
}

fn main() {
    if let (Ok(url), Ok(spec)) = (
        std::env::var("RLOCK_SHAPES_CHILD"),
        std::env::var("RLOCK_SHAPES_SPEC"),
    ) {
        child(&url, &spec);
        return;
    }
    let (url, _server) = server::start_server();
    let secs = env_f64("RLOCK_SHAPES_SECS", 2.0);
    let only = std::env::var("RLOCK_SHAPES_ONLY").unwrap_or_default();
    // A service's runtime: multi-thread, one worker per core.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rtt = rt.block_on(rtt_us(&url));
    println!("round trip (trivial EVALSHA, p50): {rtt:.1} µs; {secs} s per cell");
    println!();
    println!(
        "| workload | shape | redis-rlock | rslock 0.10 | ratio to rslock | other ratio | met |"
    );
    println!("|---|---|---|---|---|---|---|");
    let ms = Duration::from_millis(1);
    let rows: Vec<(&str, Work, Vec<Shape>)> = vec![
        (
            "W1",
            Work {
                kind: Kind::W1,
                tasks: 1,
                hold: Duration::ZERO,
            },
            vec![Shape::Shared],
        ),
        (
            "W2 8 tasks",
            Work {
                kind: Kind::W2,
                tasks: 8,
                hold: Duration::ZERO,
            },
            vec![Shape::Shared, Shape::PerTask, Shape::Procs],
        ),
        (
            "W2 64 tasks",
            Work {
                kind: Kind::W2,
                tasks: 64,
                hold: Duration::ZERO,
            },
            vec![Shape::Shared, Shape::PerTask, Shape::Procs],
        ),
        (
            "W3 no hold",
            Work {
                kind: Kind::W3,
                tasks: 8,
                hold: Duration::ZERO,
            },
            vec![Shape::Shared, Shape::PerTask, Shape::Procs],
        ),
        (
            "W3 1 ms hold",
            Work {
                kind: Kind::W3,
                tasks: 8,
                hold: ms,
            },
            vec![Shape::Shared, Shape::PerTask, Shape::Procs],
        ),
        (
            "W4 read-modify-write",
            Work {
                kind: Kind::W4,
                tasks: 8,
                hold: Duration::ZERO,
            },
            vec![Shape::Shared, Shape::PerTask, Shape::Procs],
        ),
    ];
    for (label, work, shapes) in rows {
        if !only.is_empty() && !label.starts_with(&only) {
            continue;
        }
        for shape in shapes {
            if std::env::var("RLOCK_SHAPES_PROFILE").is_ok() {
                // Only this crate, for a profiler attached to the process.
                let lib = Lib::parse(&std::env::var("RLOCK_SHAPES_PROFILE").unwrap());
                let f = rt.block_on(measure(&url, lib, work, shape, secs));
                println!(
                    "{label} {} {}: {:.0} µs p50, {:.0}/s; {:.1} µs Redis CPU, {:.1} µs client CPU, {:.1} scripts per acq; max/min {:.2}, longest wait {:.1} cycles, longest gap {:.1} cycles",
                    lib.name(),
                    shape.name(),
                    f.p50_us,
                    f.per_sec,
                    f.cpu_us_per_acq,
                    f.client_us_per_acq,
                    f.scripts_per_acq,
                    f.fairness,
                    f.longest_cycles,
                    f.gap_cycles
                );
                continue;
            }
            let ours = rt.block_on(measure(&url, Lib::Ours, work, shape, secs));
            let theirs = rt.block_on(measure(&url, Lib::Rslock, work, shape, secs));
            let frame = match work.kind {
                Kind::W1 | Kind::W2 => Some((
                    rt.block_on(measure(&url, Lib::Floor, work, shape, secs)),
                    rt.block_on(measure(&url, Lib::Limit, work, shape, secs)),
                )),
                _ => None,
            };
            println!(
                "{}",
                cell(label, work, shape, &ours, &theirs, frame.as_ref(), rtt)
            );
        }
    }
}

/// One table row, with its targets from issue #14.
fn cell(
    label: &str,
    work: Work,
    shape: Shape,
    ours: &Figures,
    theirs: &Figures,
    frame: Option<&(Figures, Figures)>,
    rtt: f64,
) -> String {
    let show = |f: &Figures| {
        match work.kind {
        Kind::W1 => format!(
            "{:.0} µs per pair; {:.1} scripts, {:.1} commands, {:.1} µs Redis CPU per pair",
            f.p50_us, f.scripts_per_acq, f.commands_per_acq, f.cpu_us_per_acq
        ),
        Kind::W2 => format!(
            "{:.0} pairs/s; {:.1} commands, {:.1} µs Redis CPU per pair",
            f.per_sec, f.commands_per_acq, f.cpu_us_per_acq
        ),
        Kind::W3 | Kind::W4 => format!(
            "{:.0} acq/s; max/min {:.2}; longest wait {:.1} cycles{}; {:.1} scripts, {:.1} commands, {:.0} µs Redis CPU per acq{}",
            f.per_sec,
            f.fairness,
            f.longest_cycles,
            if shape == Shape::Procs {
                String::new()
            } else {
                format!(" (no grant at all for {:.1})", f.gap_cycles)
            },
            f.scripts_per_acq,
            f.commands_per_acq,
            f.cpu_us_per_acq,
            if work.kind == Kind::W4 {
                format!("; {} lost updates, {} overlaps", f.lost, f.overlaps)
            } else {
                format!("; {} overlaps", f.overlaps)
            }
        ),
    }
    };
    let ratio = if work.kind == Kind::W1 {
        theirs.p50_us / ours.p50_us.max(1e-9)
    } else {
        ours.per_sec / theirs.per_sec.max(1e-9)
    };
    let safe = ours.lost == 0 && ours.overlaps == 0;
    let (other, met) = match (work.kind, frame) {
        (Kind::W1, Some((floor, limit))) => {
            let to_rtt = 2.0 * rtt / ours.p50_us.max(1e-9);
            (
                format!(
                    "{to_rtt:.2}x of 2 RTT; {:.2}x of the Redisson-script pair ({:.0} µs); trivial pair {:.0} µs",
                    floor.p50_us / ours.p50_us.max(1e-9),
                    floor.p50_us,
                    limit.p50_us
                ),
                // The floor where two scripts cannot match rslock's `SET NX`.
                ratio >= 0.95,
            )
        }
        (Kind::W2, Some((floor, limit))) => {
            let to_floor = ours.per_sec / floor.per_sec.max(1e-9);
            (
                format!(
                    "{to_floor:.2}x of the Redisson-script floor ({:.0}/s); {:.2}x of the trivial limit ({:.0}/s, which once finished no pair for {:.1} ms)",
                    floor.per_sec,
                    ours.per_sec / limit.per_sec.max(1e-9),
                    limit.per_sec,
                    limit.gap_us as f64 / 1e3
                ),
                ratio >= 1.0 && (work.tasks < 64 || to_floor >= 0.9),
            )
        }
        _ => (
            String::new(),
            ratio >= 1.0 && ours.fairness <= 1.5 && ours.longest_cycles <= 20.0,
        ),
    };
    format!(
        "| {label} | {} | {} | {} | {ratio:.2}x | {other} | {} |",
        shape.name(),
        show(ours),
        show(theirs),
        if met && safe { "yes" } else { "**no**" }
    )
}

/// The median round trip of a trivial script by `EVALSHA`, in µs.
async fn rtt_us(url: &str) -> f64 {
    let mut c = ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let script = redis::Script::new(TRIVIAL);
    let mut t = Vec::new();
    for _ in 0..500 {
        let at = Instant::now();
        let _: i64 = script.key("rtt").invoke_async(&mut c).await.unwrap();
        t.push(at.elapsed().as_secs_f64() * 1e6);
    }
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}
