//! The synchronizer family across OS processes: each test re-runs this test binary as
//! child processes (one service instance each, one client, several tasks) that contend
//! on one fair lock, read-write lock, semaphore or latch of a real Redis. What they did is
//! kept in Redis itself (counters checked inside the critical sections, grant logs), and
//! the parent checks it once they are done.
//!
//! Figures are printed as `FIGURE <name> <value>` lines (`--nocapture`).

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{tell_parent, ChildProc, RedisServer, CHILD_ENV};
use redis::AsyncCommands;
use redis_rlock::Client;

const TASKS: usize = 3;
const PROCS: usize = 3;
/// How long the children contend; every loop is also bounded in rounds.
const RUN_MS: u64 = 2_000;
const MAX_ROUNDS: usize = 2_000;

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Child side: runs the role named in `RLOCK_CHILD_ROLE` against `RLOCK_URL`.
#[test]
fn family_child() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let url = std::env::var("RLOCK_URL").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = Client::builder(&url)
            .watchdog_timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let until = Instant::now() + Duration::from_millis(RUN_MS);
        tell_parent("READY");
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let (client, conn, role) = (client.clone(), conn.clone(), role.clone());
            tasks.push(tokio::spawn(async move {
                match role.as_str() {
                    "fair" => fair_task(&client, conn, until).await,
                    "rw" => rw_task(&client, conn, until, task == 0).await,
                    "semaphore" => semaphore_task(&client, conn, until).await,
                    "permits" => permits_task(&client, conn, until).await,
                    "latch" => latch_task(&client).await,
                    other => panic!("unknown role {other}"),
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        client.shutdown().await.unwrap();
        tell_parent("DONE");
    });
}

/// What a bounded wait at the end of the run gave: a wait cut so short that Redis
/// could not answer in time ends with a transient `Timeout`, which ends the loop too.
fn by_deadline<T>(r: redis_rlock::Result<Option<T>>) -> Option<T> {
    match r {
        Ok(got) => got,
        Err(e) if e.is_transient() => None,
        Err(e) => panic!("{e}"),
    }
}

/// Enters a section counted in Redis: `in:<what>` goes up by one, and the largest value
/// seen is kept in `max:<what>`. Returns the count seen on entry.
async fn enter(conn: &mut redis::aio::MultiplexedConnection, what: &str) -> i64 {
    let n: i64 = conn.incr(format!("in:{what}"), 1).await.unwrap();
    let script = redis::Script::new(
        "if tonumber(redis.call('get', KEYS[1]) or '0') < tonumber(ARGV[1]) then redis.call('set', KEYS[1], ARGV[1]) end",
    );
    let _: () = script
        .key(format!("max:{what}"))
        .arg(n)
        .invoke_async(conn)
        .await
        .unwrap();
    n
}

async fn leave(conn: &mut redis::aio::MultiplexedConnection, what: &str) {
    let _: i64 = conn.decr(format!("in:{what}"), 1).await.unwrap();
}

async fn fair_task(client: &Client, mut conn: redis::aio::MultiplexedConnection, until: Instant) {
    let lock = client.fair_lock("fam:fair");
    for _ in 0..MAX_ROUNDS {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let asked = wall_us();
        let Some(g) = by_deadline(lock.try_lock_for(left, None).await) else {
            break;
        };
        let granted = wall_us();
        enter(&mut conn, "fair").await;
        let _: i64 = conn
            .rpush("log:fair", format!("{asked}:{granted}"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        leave(&mut conn, "fair").await;
        g.unlock().await.unwrap();
    }
}

/// Task 0 of each process writes (a read-modify-write of `rw:value`); the others read.
async fn rw_task(
    client: &Client,
    mut conn: redis::aio::MultiplexedConnection,
    until: Instant,
    writer: bool,
) {
    let rw = client.read_write_lock("fam:rw");
    for _ in 0..MAX_ROUNDS {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let lock = if writer { rw.write() } else { rw.read() };
        let Some(g) = by_deadline(lock.try_lock_for(left, None).await) else {
            break;
        };
        if writer {
            enter(&mut conn, "writers").await;
            let readers: Option<i64> = conn.get("in:readers").await.unwrap();
            if readers.unwrap_or(0) > 0 {
                let _: i64 = conn.incr("bad:rw", 1).await.unwrap();
            }
            let v: Option<i64> = conn.get("rw:value").await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _: () = conn.set("rw:value", v.unwrap_or(0) + 1).await.unwrap();
            let _: i64 = conn.incr("rw:writes", 1).await.unwrap();
            leave(&mut conn, "writers").await;
        } else {
            enter(&mut conn, "readers").await;
            let writers: Option<i64> = conn.get("in:writers").await.unwrap();
            if writers.unwrap_or(0) > 0 {
                let _: i64 = conn.incr("bad:rw", 1).await.unwrap();
            }
            let _: i64 = conn.incr("rw:reads", 1).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            leave(&mut conn, "readers").await;
        }
        g.unlock().await.unwrap();
        // Readers pause between reads, so the writers get their turns too.
        if !writer {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
}

async fn semaphore_task(
    client: &Client,
    mut conn: redis::aio::MultiplexedConnection,
    until: Instant,
) {
    let sem = client.semaphore("fam:sem");
    for _ in 0..MAX_ROUNDS {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || by_deadline(sem.try_acquire_for(1, left).await.map(Some)) != Some(true)
        {
            break;
        }
        enter(&mut conn, "sem").await;
        let _: i64 = conn.incr("count:sem", 1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        leave(&mut conn, "sem").await;
        sem.release(1).await.unwrap();
    }
}

async fn permits_task(
    client: &Client,
    mut conn: redis::aio::MultiplexedConnection,
    until: Instant,
) {
    let sem = client.permit_expirable_semaphore("fam:pes");
    for _ in 0..MAX_ROUNDS {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let Some(permit) = by_deadline(sem.try_acquire(Duration::from_secs(10), left).await) else {
            break;
        };
        enter(&mut conn, "pes").await;
        let _: i64 = conn.incr("count:pes", 1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        leave(&mut conn, "pes").await;
        sem.release(permit.id()).await.unwrap();
    }
}

/// Waits for the latch (at most 10 s) and says when it opened.
async fn latch_task(client: &Client) {
    let latch = client.count_down_latch("fam:latch");
    let opened = latch.wait_for(Duration::from_secs(10)).await.unwrap();
    assert!(opened, "the latch did not open within 10 s");
    tell_parent(&format!("WOKE {}", wall_us()));
}

/// Starts `PROCS` children of `role`, lets them run, and waits for them to finish.
fn run_children(s: &RedisServer, role: &str) -> Vec<ChildProc> {
    let mut children: Vec<ChildProc> = (0..PROCS)
        .map(|_| ChildProc::spawn("family_child", role, &[("RLOCK_URL", s.url())]))
        .collect();
    for c in &mut children {
        c.expect_line("READY", Duration::from_secs(30));
    }
    children
}

fn finish(children: Vec<ChildProc>) {
    for mut c in children {
        c.expect_line("DONE", Duration::from_secs(30));
        c.wait_success(Duration::from_secs(10));
    }
}

fn get(s: &RedisServer, key: &str) -> i64 {
    s.cmd::<Option<i64>>(&["GET", key]).unwrap_or(0)
}

/// Fair lock, 3 processes x 3 tasks: one holder at a time, and grants in the order the
/// waiters asked (a waiter that asked 5 ms before another is served before it).
#[test]
fn fair_lock_across_processes_excludes_and_serves_in_order() {
    let s = RedisServer::start();
    finish(run_children(&s, "fair"));
    let log: Vec<String> = s.cmd(&["LRANGE", "log:fair", "0", "-1"]);
    let grants: Vec<(u64, u64)> = log
        .iter()
        .map(|l| {
            let (a, g) = l.split_once(':').unwrap();
            (a.parse().unwrap(), g.parse().unwrap())
        })
        .collect();
    // The log's order is the order of grants: each entry is pushed inside the critical
    // section, which no two holders share (checked below). The stamps are taken outside
    // it, so a process the scheduler holds up after stamping would reorder a sort by them.
    // Out of order: a grant whose request came clearly after a later grant's request;
    // "clearly" is wider than a loaded 2-core machine's usual scheduling delay between a stamp
    // and the request it times.
    let margin = 20_000;
    let mut out_of_order = 0;
    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            if b.0 + margin < a.0 && b.0 < a.1 {
                out_of_order += 1;
            }
        }
    }
    println!(
        "FIGURE fair_processes grants {} max_holders {} out_of_order {out_of_order}",
        grants.len(),
        get(&s, "max:fair")
    );
    assert!(grants.len() >= 50, "only {} grants", grants.len());
    assert_eq!(get(&s, "max:fair"), 1, "two holders at once");
    assert_eq!(out_of_order, 0, "grants out of the order of asking");
    // No queue entry is left behind.
    let keys: Vec<String> = s.cmd(&["KEYS", "redisson_lock_*fam:fair*"]);
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

/// Read-write lock, 3 processes x (1 writer, 2 readers): a writer is alone, readers
/// overlap, no write is lost, and neither side starves the other (writers that keep
/// coming kept every reader out before the readers' turn).
#[test]
fn read_write_lock_across_processes_keeps_writers_alone() {
    let s = RedisServer::start();
    finish(run_children(&s, "rw"));
    let writes = get(&s, "rw:writes");
    let reads = get(&s, "rw:reads");
    println!(
        "FIGURE rw_processes writes {writes} reads {reads} max_readers {} max_writers {}",
        get(&s, "max:readers"),
        get(&s, "max:writers")
    );
    assert!(writes >= 10, "only {writes} writes");
    assert!(reads >= 10, "only {reads} reads");
    assert_eq!(get(&s, "bad:rw"), 0, "a writer overlapped another holder");
    assert_eq!(get(&s, "max:writers"), 1);
    assert!(get(&s, "max:readers") >= 2, "readers never shared");
    assert_eq!(get(&s, "rw:value"), writes, "writes were lost");
    assert_eq!(s.cmd::<i64>(&["EXISTS", "fam:rw"]), 0);
}

/// Semaphore of 2 permits, 3 processes x 3 tasks: never more than 2 holders, both
/// permits used at once, and both back at the end.
#[test]
fn semaphore_across_processes_bounds_its_holders() {
    let s = RedisServer::start();
    let _: () = s.cmd(&["SET", "fam:sem", "2"]);
    finish(run_children(&s, "semaphore"));
    println!(
        "FIGURE semaphore_processes acquisitions {} max_holders {}",
        get(&s, "count:sem"),
        get(&s, "max:sem")
    );
    assert!(get(&s, "count:sem") >= 50);
    assert_eq!(get(&s, "max:sem"), 2);
    assert_eq!(get(&s, "fam:sem"), 2, "permits leaked");
}

/// The permit-expirable semaphore, the same way.
#[test]
fn expirable_permits_across_processes_bound_their_holders() {
    let s = RedisServer::start();
    let _: () = s.cmd(&["SET", "fam:pes", "2"]);
    finish(run_children(&s, "permits"));
    println!(
        "FIGURE permits_processes acquisitions {} max_holders {}",
        get(&s, "count:pes"),
        get(&s, "max:pes")
    );
    assert!(get(&s, "count:pes") >= 50);
    assert_eq!(get(&s, "max:pes"), 2);
    assert_eq!(get(&s, "fam:pes"), 2, "permits leaked");
    assert_eq!(
        s.cmd::<i64>(&["ZCARD", "{fam:pes}:timeout"]),
        0,
        "a permit is still recorded as taken"
    );
}

/// A latch of 3, waited for by 3 processes x 3 tasks: every waiter wakes once the parent
/// counts it to zero, within a second.
#[test]
fn a_latch_wakes_waiters_in_every_process() {
    let s = RedisServer::start();
    let _: () = s.cmd(&["SET", "fam:latch", "3"]);
    let mut children = run_children(&s, "latch");
    std::thread::sleep(Duration::from_millis(300));
    let url = s.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let zero_at = rt.block_on(async move {
        let c = Client::connect(&url).await.unwrap();
        let latch = c.count_down_latch("fam:latch");
        for _ in 0..3 {
            latch.count_down().await.unwrap();
        }
        wall_us()
    });
    let mut slowest = 0;
    for c in &mut children {
        for _ in 0..TASKS {
            let line = c.expect_line("WOKE", Duration::from_secs(5));
            let at: u64 = line.trim().split(' ').nth(1).unwrap().parse().unwrap();
            slowest = slowest.max(at.saturating_sub(zero_at));
        }
    }
    finish(children);
    println!("FIGURE latch_processes slowest_wake_us {slowest}");
    assert!(slowest < 1_000_000, "a waiter woke {slowest} µs after zero");
}
