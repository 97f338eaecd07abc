//! Several OS processes contend on one lock while the parent SIGSTOPs holders past their
//! lease and SIGKILLs some. The lock lives on redis-server A; the protected resource, a
//! fenced counter, and the bookkeeping live on redis-server B, which no fault touches.
//!
//! Each child process (the test binary again, role `contender`) runs a current-thread
//! runtime with one client and two tasks looping: acquire, enter (a fenced read of the
//! counter on B), report `HOLD` to the parent, dwell, check `is_lost()`, write the counter
//! back through the fence, leave, unlock. The parent answers some `HOLD` lines with a
//! SIGSTOP for 2.5 leases (then SIGCONT or SIGKILL) and others with an immediate SIGKILL,
//! and respawns killed children so contention goes on.
//!
//! Measured figures are printed as `FIGURE <name> <value>` lines (`--nocapture`).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{tell_parent, ChildProc, RedisServer, CHILD_ENV};
use redis_rlock::{Client, LockGuard};

const LOCK: &str = "proc-lock";
const WD_MS: u64 = 1000;
const RESPONSE_MS: u64 = 300;
const CONNECT_MS: u64 = 500;
/// Time a holder spends inside, reporting every 10 ms: the window the parent acts in.
const DWELL_MS: u64 = 250;
const PAUSE_MS: u64 = WD_MS * 5 / 2;
const RUN_MS: u64 = 16_000;
const PROCS: usize = 4;
const TASKS: usize = 2;
const MAX_ROUNDS: usize = 200;
const MAX_PAUSES: usize = 6;
const MAX_KILLS: usize = 4;
const MAX_STOPPED_AT_ONCE: usize = 2;
/// A gap this long in a holder's own timeline, on a current-thread runtime, means the
/// watchdog could not send anything either: the lease the client last confirmed is over.
/// The 500 ms margin covers a renewal sent just after the holder's last look at the clock.
const LEASE_SURELY_GONE_MS: u64 = WD_MS + 500;
/// A shorter gap still leaves the lease alive (renewals every WD/3), so a holder is only
/// "undisturbed" below this.
const DISTURBED_MS: u64 = 600;

fn figure(name: &str, value: impl std::fmt::Debug) {
    println!("FIGURE {name} {value:?}");
}

// Keys on B. `p:fence` is the resource's highest token; `p:highest` is the test's own
// record of the highest token that entered, kept apart so the fence's decisions can be
// checked against it.
const INSIDE: &str = "p:inside";
const FENCE: &str = "p:fence";
const HIGHEST: &str = "p:highest";
const COUNTER: &str = "p:counter";
const PAIRS: &str = "p:pairs";
const STATS: &str = "p:stats";
const ENTERED: &str = "p:entered";

fn cs_key(member: &str) -> String {
    format!("p:cs:{member}")
}

/// Odd while the parent is stopping or has stopped the process; bumped on kill too.
fn gen_key(pid: u32) -> String {
    format!("p:gen:{pid}")
}

/// Enter: note who else is inside (the overlap detector), claim the fence and read the
/// counter. The read must claim the fence: a stale holder's write that lands between a
/// newer holder's read and write would otherwise be accepted and then overwritten, a lost
/// update that a write-only fence cannot see.
const ENTER_LUA: &str = r"
local member, token = ARGV[1], tonumber(ARGV[2])
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  redis.call('RPUSH', KEYS[4], m .. '|' .. member)
end
redis.call('SADD', KEYS[1], member)
redis.call('SADD', KEYS[8], member)
if tonumber(redis.call('GET', KEYS[2]) or '0') < token then
  redis.call('SET', KEYS[2], ARGV[2])
end
if tonumber(redis.call('GET', KEYS[7]) or '0') < token then
  redis.call('SET', KEYS[7], ARGV[2])
end
redis.call('HINCRBY', KEYS[6], 'entered', 1)
redis.call('HSET', KEYS[5], 'gen_in', redis.call('GET', KEYS[9]) or '0')
return tonumber(redis.call('GET', KEYS[3]) or '0')
";

/// Write: refuse when a newer token has claimed the resource, else store the value read
/// plus one. Staleness is judged separately from `p:highest`, to check the fence.
const WRITE_LUA: &str = r"
local token = tonumber(ARGV[1])
local stale = tonumber(redis.call('GET', KEYS[3]) or '0') > token
redis.call('HINCRBY', KEYS[4], 'attempts', 1)
if stale then redis.call('HINCRBY', KEYS[4], 'stale', 1) end
redis.call('HSET', KEYS[5], 'lost', ARGV[3], 'gap', ARGV[4])
if tonumber(redis.call('GET', KEYS[1]) or '0') > token then
  redis.call('HINCRBY', KEYS[4], 'refused', 1)
  if stale then redis.call('HINCRBY', KEYS[4], 'stale_refused', 1) end
  redis.call('HSET', KEYS[5], 'write', 'refused')
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[4], 'accepted', 1)
redis.call('HSET', KEYS[5], 'write', 'accepted')
return 1
";

const LEAVE_LUA: &str = r"
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'lost_out', ARGV[2], 'gap_out', ARGV[3],
  'gen_out', redis.call('GET', KEYS[3]) or '0')
return 1
";

/// The longest stretch a task went without running, since the grant.
struct Gaps {
    last: Instant,
    max: Duration,
}

impl Gaps {
    fn new() -> Gaps {
        Gaps {
            last: Instant::now(),
            max: Duration::ZERO,
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        self.max = self.max.max(now - self.last);
        self.last = now;
    }

    fn max_ms(&self) -> u64 {
        self.max.as_millis() as u64
    }
}

struct Scripts {
    enter: redis::Script,
    write: redis::Script,
    leave: redis::Script,
}

/// Child role: contend on the lock until the run's end.
#[test]
fn child_worker() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    assert_eq!(role, "contender");
    let url_a = std::env::var("RLOCK_URL_A").unwrap();
    let url_b = std::env::var("RLOCK_URL_B").unwrap();
    let run_ms: u64 = std::env::var("RLOCK_RUN_MS").unwrap().parse().unwrap();
    let until = Instant::now() + Duration::from_millis(run_ms);
    // One thread for everything: a stall of the holder's task is then a stall of the
    // watchdog too, which is what lets a gap in its timeline prove the lease is over.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = Client::builder(&url_a)
            .watchdog_timeout(Duration::from_millis(WD_MS))
            .response_timeout(Duration::from_millis(RESPONSE_MS))
            .connect_timeout(Duration::from_millis(CONNECT_MS))
            .build()
            .await
            .unwrap();
        let b = redis::Client::open(url_b)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| tokio::spawn(holder_loop(client.fenced_lock(LOCK), b.clone(), i, until)))
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

async fn holder_loop(
    lock: redis_rlock::Lock,
    mut b: redis::aio::MultiplexedConnection,
    task: usize,
    until: Instant,
) {
    let scripts = Scripts {
        enter: redis::Script::new(ENTER_LUA),
        write: redis::Script::new(WRITE_LUA),
        leave: redis::Script::new(LEAVE_LUA),
    };
    for _ in 0..MAX_ROUNDS {
        if Instant::now() >= until {
            break;
        }
        // Both ways of waiting, both with the watchdog lease; every wait is bounded.
        let got = if task.is_multiple_of(2) {
            match tokio::time::timeout(Duration::from_secs(3), lock.lock()).await {
                Ok(Ok(g)) => Some(g),
                _ => None,
            }
        } else {
            lock.try_lock_for(Duration::from_secs(2), None)
                .await
                .ok()
                .flatten()
        };
        match got {
            Some(g) => critical_section(g, &mut b, &scripts).await,
            None => {
                let _: i64 = redis::cmd("HINCRBY")
                    .arg(STATS)
                    .arg("no_grant")
                    .arg(1)
                    .query_async(&mut b)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

async fn critical_section(
    g: LockGuard,
    b: &mut redis::aio::MultiplexedConnection,
    scripts: &Scripts,
) {
    // Every gap since the grant: a section with a long one is not counted as undisturbed.
    let mut gaps = Gaps::new();
    let pid = std::process::id();
    let token = g.fencing_token().expect("a fenced lock");
    let member = format!("{pid}:{token}");
    let cs = cs_key(&member);
    let read: u64 = scripts
        .enter
        .key(INSIDE)
        .key(FENCE)
        .key(COUNTER)
        .key(PAIRS)
        .key(&cs)
        .key(STATS)
        .key(HIGHEST)
        .key(ENTERED)
        .key(gen_key(pid))
        .arg(&member)
        .arg(token)
        .invoke_async(b)
        .await
        .unwrap();
    gaps.tick();
    // Only gaps across waits that need nothing but this thread (a blocking print, short
    // sleeps): a slow reply from B lets the watchdog run meanwhile and proves nothing.
    let mut stalls = Gaps::new();
    tell_parent(&format!("HOLD {pid} {token}"));
    gaps.tick();
    stalls.tick();
    // Counted in steps, not by a deadline, so a pause cannot cut the dwell short; a
    // holder that finds it was paused goes straight on to its write, as a program that
    // knew nothing of the pause would, before other tasks get another turn.
    for _ in 0..DWELL_MS / 10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        gaps.tick();
        stalls.tick();
        if stalls.max_ms() >= LEASE_SURELY_GONE_MS {
            break;
        }
    }
    let gap_before = stalls.max_ms();
    // Nothing may await between this check and the write.
    let lost = g.is_lost();
    let _: i64 = scripts
        .write
        .key(FENCE)
        .key(COUNTER)
        .key(HIGHEST)
        .key(STATS)
        .key(&cs)
        .arg(token)
        .arg(read + 1)
        .arg(u8::from(lost))
        .arg(gap_before)
        .invoke_async(b)
        .await
        .unwrap();
    gaps.tick();
    let lost_out = g.is_lost();
    let _: i64 = scripts
        .leave
        .key(INSIDE)
        .key(&cs)
        .key(gen_key(pid))
        .arg(&member)
        .arg(u8::from(lost_out))
        .arg(gaps.max_ms())
        .invoke_async(b)
        .await
        .unwrap();
    // A lost lease makes unlock fail; that is expected here and not what is measured.
    let _ = g.unlock().await;
}

struct Slot {
    proc: Option<ChildProc>,
    pid: u32,
    /// When to end the pause, and whether to SIGKILL instead of SIGCONT then.
    stopped: Option<(Instant, bool)>,
}

struct Parent {
    a_url: String,
    b_url: String,
    b: redis::Connection,
    until: Instant,
    slots: Vec<Slot>,
    spawned: usize,
    holds: usize,
    pauses: usize,
    kills: usize,
    planned_kills: usize,
}

impl Parent {
    fn spawn(&mut self) {
        let left = self.until.saturating_duration_since(Instant::now());
        let child = ChildProc::spawn(
            "child_worker",
            "contender",
            &[
                ("RLOCK_URL_A", self.a_url.clone()),
                ("RLOCK_URL_B", self.b_url.clone()),
                ("RLOCK_RUN_MS", left.as_millis().to_string()),
            ],
        );
        self.spawned += 1;
        self.slots.push(Slot {
            pid: child.pid(),
            proc: Some(child),
            stopped: None,
        });
    }

    fn bump_gen(&mut self, pid: u32) {
        let _: i64 = redis::cmd("INCR")
            .arg(gen_key(pid))
            .query(&mut self.b)
            .unwrap();
    }

    fn pause(&mut self, i: usize) {
        let pid = self.slots[i].pid;
        // Marked before the signal: a section that spans the stop, or that starts while
        // the signal is on its way, sees an odd or changed mark.
        self.bump_gen(pid);
        let proc = self.slots[i].proc.as_ref().unwrap();
        assert!(proc.signal("STOP"), "SIGSTOP {pid} failed");
        self.pauses += 1;
        let kill = self.pauses.is_multiple_of(3) && self.planned_kills < MAX_KILLS;
        if kill {
            self.planned_kills += 1;
        }
        self.slots[i].stopped = Some((Instant::now() + Duration::from_millis(PAUSE_MS), kill));
    }

    fn resume(&mut self, i: usize) {
        let pid = self.slots[i].pid;
        self.slots[i].stopped = None;
        let proc = self.slots[i].proc.as_ref().unwrap();
        assert!(proc.signal("CONT"), "SIGCONT {pid} failed");
        self.bump_gen(pid);
    }

    /// SIGKILLs the child, takes its sections out of the detector's "inside" set (a dead
    /// holder never leaves), and starts a replacement while the run has time left.
    fn kill(&mut self, i: usize) {
        let pid = self.slots[i].pid;
        self.bump_gen(pid);
        if let Some(mut p) = self.slots[i].proc.take() {
            p.kill();
        }
        self.slots[i].stopped = None;
        self.kills += 1;
        let inside: Vec<String> = redis::cmd("SMEMBERS")
            .arg(INSIDE)
            .query(&mut self.b)
            .unwrap();
        let prefix = format!("{pid}:");
        for m in inside.iter().filter(|m| m.starts_with(&prefix)) {
            let _: i64 = redis::cmd("SREM")
                .arg(INSIDE)
                .arg(m)
                .query(&mut self.b)
                .unwrap();
        }
        if self.until.saturating_duration_since(Instant::now()) > Duration::from_secs(3) {
            self.spawn();
        }
    }

    fn on_hold(&mut self, i: usize) {
        if self.slots[i].proc.is_none() || self.slots[i].stopped.is_some() {
            return; // a line buffered before the kill or the stop
        }
        self.holds += 1;
        let stopped = self.slots.iter().filter(|s| s.stopped.is_some()).count();
        match self.holds % 4 {
            1 if self.pauses < MAX_PAUSES && stopped < MAX_STOPPED_AT_ONCE => self.pause(i),
            3 if self.planned_kills < MAX_KILLS => {
                self.planned_kills += 1;
                self.kill(i);
            }
            _ => {}
        }
    }

    fn step(&mut self) {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            if let Some((at, kill)) = self.slots[i].stopped {
                if at <= now {
                    if kill {
                        self.kill(i);
                    } else {
                        self.resume(i);
                    }
                }
            }
        }
        for i in 0..self.slots.len() {
            // Bounded: a child prints far fewer lines per step than this.
            for _ in 0..100 {
                let Some(line) = self.slots[i].proc.as_mut().and_then(|p| p.try_line()) else {
                    break;
                };
                if line.starts_with("HOLD ") {
                    self.on_hold(i);
                }
            }
        }
    }
}

fn hget_u64(h: &HashMap<String, String>, field: &str) -> Option<u64> {
    h.get(field).and_then(|v| v.parse().ok())
}

/// A section whose holder was neither stopped nor killed nor stalled, and saw its lock
/// held both before its write and before it left.
fn undisturbed(h: &HashMap<String, String>) -> bool {
    let (Some(gen_in), Some(gen_out)) = (hget_u64(h, "gen_in"), hget_u64(h, "gen_out")) else {
        return false; // never left: killed inside
    };
    gen_in == gen_out
        && gen_in.is_multiple_of(2)
        && h.get("lost").map(String::as_str) == Some("0")
        && h.get("lost_out").map(String::as_str) == Some("0")
        && hget_u64(h, "gap_out").is_some_and(|g| g < DISTURBED_MS)
}

#[test]
fn p1_processes_stopped_and_killed_around_one_lock() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let started = Instant::now();
    let a = RedisServer::start();
    let b_server = RedisServer::start();
    let b = b_server.conn();
    b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut p = Parent {
        a_url: a.url(),
        b_url: b_server.url(),
        b,
        until: Instant::now() + Duration::from_millis(RUN_MS),
        slots: Vec::new(),
        spawned: 0,
        holds: 0,
        pauses: 0,
        kills: 0,
        planned_kills: 0,
    };
    for _ in 0..PROCS {
        p.spawn();
    }
    while Instant::now() < p.until {
        p.step();
        std::thread::sleep(Duration::from_millis(5));
    }
    // Pauses still running end now, as planned; then every child must finish on its own.
    for i in 0..p.slots.len() {
        match p.slots[i].stopped {
            Some((_, true)) => p.kill(i),
            Some((_, false)) => p.resume(i),
            None => {}
        }
    }
    let finish_by = Instant::now() + Duration::from_secs(15);
    for slot in &mut p.slots {
        if let Some(child) = slot.proc.take() {
            let left = finish_by.saturating_duration_since(Instant::now());
            child.wait_success(left.max(Duration::from_secs(1)));
        }
    }

    let b = &b_server;
    let stats: HashMap<String, u64> = b.cmd(&["HGETALL", STATS]);
    let stat = |k: &str| stats.get(k).copied().unwrap_or(0);
    let counter: u64 = b.cmd::<Option<u64>>(&["GET", COUNTER]).unwrap_or(0);
    let members: Vec<String> = b.cmd(&["SMEMBERS", ENTERED]);
    let mut sections: HashMap<String, HashMap<String, String>> = HashMap::new();
    for m in members {
        let h: HashMap<String, String> = b.cmd(&["HGETALL", &cs_key(&m)]);
        sections.insert(m, h);
    }
    // Holders that resumed from a stop longer than their lease before checking is_lost().
    let resumed: Vec<(&String, &HashMap<String, String>)> = sections
        .iter()
        .filter(|(_, h)| hget_u64(h, "gap").is_some_and(|g| g >= LEASE_SURELY_GONE_MS))
        .collect();
    let not_lost: Vec<String> = resumed
        .iter()
        .filter(|(_, h)| h.get("lost").map(String::as_str) == Some("0"))
        .map(|(m, h)| format!("{m} (gap {} ms)", h["gap"]))
        .collect();
    let pairs: Vec<String> = b.cmd(&["LRANGE", PAIRS, "0", "-1"]);
    let clean = |m: &str| sections.get(m).is_some_and(undisturbed);
    let overlaps: Vec<&String> = pairs
        .iter()
        .filter(|pair| {
            let (x, y) = pair.split_once('|').unwrap();
            clean(x) && clean(y)
        })
        .collect();
    let undisturbed_sections = sections.values().filter(|h| undisturbed(h)).count();

    figure("p1_processes", p.spawned);
    figure("p1_holds_reported", p.holds);
    figure("p1_sections_entered", stat("entered"));
    figure("p1_sections_undisturbed", undisturbed_sections);
    figure("p1_no_grant_rounds", stat("no_grant"));
    figure("p1_pauses", p.pauses);
    figure("p1_kills", p.kills);
    figure("p1_write_attempts", stat("attempts"));
    figure("p1_stale_writes_attempted", stat("stale"));
    figure("p1_stale_writes_refused", stat("stale_refused"));
    figure("p1_writes_refused", stat("refused"));
    figure("p1_writes_accepted", stat("accepted"));
    figure("p1_counter_on_b", counter);
    figure("p1_resumed_after_pause_past_lease", resumed.len());
    figure("p1_is_lost_false_after_pause", not_lost.len());
    figure("p1_pairs_inside_at_once", pairs.len());
    figure("p1_overlaps_undisturbed", overlaps.len());
    figure("p1_elapsed", started.elapsed());

    assert!(p.pauses >= 1, "no holder was paused");
    assert!(p.kills >= 1, "no holder was killed");
    assert!(
        stat("accepted") >= 10,
        "too little work: {} accepted writes",
        stat("accepted")
    );
    assert_eq!(
        stat("stale_refused"),
        stat("stale"),
        "a stale write got through the fence"
    );
    assert_eq!(
        stat("refused"),
        stat("stale"),
        "the fence refused a current holder"
    );
    assert_eq!(counter, stat("accepted"), "an accepted update was lost");
    assert!(
        overlaps.is_empty(),
        "two undisturbed holders inside at once: {overlaps:?}"
    );
    assert!(
        !resumed.is_empty(),
        "no paused holder resumed inside its section"
    );
    assert!(
        not_lost.is_empty(),
        "{} of {} holders resumed after a pause past their lease and saw is_lost() false: {not_lost:?}",
        not_lost.len(),
        resumed.len()
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}
