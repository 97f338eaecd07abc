//! Test harness: real redis-server processes on free loopback ports, and helpers to run
//! a second OS process from the same test binary.

#![allow(dead_code)]

pub mod cluster_setup;
pub mod marks;
pub mod monitor;
pub mod newcomer;
/// Redisson's scripts typed in once for these tests and the checker (`tests/mc/family/`).
#[path = "../mc/family/peer.rs"]
pub mod peer;
pub mod proxy;
pub mod redisson_fair;
pub mod redisson_permits;
pub mod redisson_rlock;
pub mod redisson_waiter;
pub mod server_bin;
pub mod topology;
pub mod turns;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Log lines of each server printed when a test fails: enough to see the last
/// failover or resync, short enough that six nodes stay readable.
const LOG_TAIL_LINES: usize = 40;

/// Wall-clock time of day (UTC) with milliseconds, the format of redis-server's log
/// lines, so that test steps and server events can be put in one order.
pub fn wall_clock() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let day_ms = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// Prints each step of a test with its offset from the start and the wall clock
/// (to stderr: captured by libtest, shown when the test fails).
pub struct Steps {
    test: &'static str,
    start: Instant,
}

impl Steps {
    pub fn new(test: &'static str) -> Steps {
        let s = Steps {
            test,
            start: Instant::now(),
        };
        s.mark("start");
        s
    }

    pub fn mark(&self, what: impl std::fmt::Display) {
        eprintln!(
            "STEP {} +{:.3}s @{} {what}",
            self.test,
            self.start.elapsed().as_secs_f64(),
            wall_clock()
        );
    }
}

/// Sends the crate's own tracing (lost locks, dropped subscriptions, reconnects) to
/// the captured test output; `RUST_LOG` overrides the default level. Idempotent.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("redis_rlock=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

/// The server binary (see `server_bin.rs`: `REDIS_SERVER`, the PATH, or a Valkey
/// fetched once into `target/`).
pub fn redis_server_bin() -> String {
    server_bin::server_bin()
}

/// A client of `url` with this watchdog timeout and response timeout (and a 500 ms
/// connect timeout).
pub async fn client_with(url: &str, wd: Duration, response: Duration) -> redis_rlock::Client {
    redis_rlock::Client::builder(url)
        .watchdog_timeout(wd)
        .response_timeout(response)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

/// A loopback port free now and not handed out before in this process: a port freed by
/// one test's server (a cluster node killed on purpose, say) and taken by another test's
/// new node would still be gossiped to by the first test's cluster, which then pulls the
/// new node in (`CLUSTER SET-CONFIG-EPOCH` refused: "config epoch is already non-zero",
/// seen once in CI).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..1000 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().unwrap().port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no loopback port left that this process did not use before");
}

/// One redis-server process, killed and cleaned up on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
    /// Its log tail was already printed (by a topology, before any node went down).
    pub log_reported: bool,
    /// `port` is a TLS port and there is no plain one (`start_tls`).
    tls: bool,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments; retries on a port race.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_inner(extra, false)
    }

    /// Starts a server whose only port is a TLS port (`--port 0 --tls-port P`). `extra`
    /// must name the certificates (`--tls-cert-file` ...). Readiness is read from the
    /// log, since a plain PING cannot reach it; `url()`, `cmd()` and friends do not work.
    pub fn start_tls(extra: &[&str]) -> RedisServer {
        Self::start_inner(extra, true)
    }

    fn start_inner(extra: &[&str], tls: bool) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "rlock-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..10 {
            let port = free_port();
            let mut s = RedisServer {
                child: None,
                port,
                dir: dir.clone(),
                extra: extra.clone(),
                log_reported: false,
                tls,
            };
            if s.spawn() {
                return s;
            }
        }
        panic!(
            "could not start redis-server on a free port; see logs under {}",
            dir.display()
        );
    }

    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(redis_server_bin());
        let port = self.port.to_string();
        if self.tls {
            // Readiness is read from the log: an old run's line must not count.
            let _ = std::fs::remove_file(self.log_file());
            cmd.args(["--port", "0", "--tls-port", &port]);
        } else {
            cmd.args(["--port", &port]);
        }
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.log_file())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server not found. Install it (Debian/Ubuntu: `sudo apt-get install -y redis-server`) \
                 or point REDIS_SERVER at a binary."
            ),
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let _ = status;
                self.child = None;
                return false; // most likely the port was taken meanwhile
            }
            if self.ready() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
        false
    }

    fn ready(&self) -> bool {
        if !self.tls {
            return self.ping();
        }
        std::fs::read_to_string(self.log_file())
            .is_ok_and(|log| log.contains("Ready to accept connections"))
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join(format!("redis-{}.log", self.port))
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_millis(500))).ok();
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The last `n` lines of the server's log (it is appended to across restarts).
    pub fn log_tail(&self, n: usize) -> String {
        let path = self.dir.join(format!("redis-{}.log", self.port));
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                // The same long warning at every start; it says nothing about a failure.
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| !l.contains("WARNING Memory overcommit"))
                    .collect();
                lines[lines.len().saturating_sub(n)..].join("\n")
            }
            Err(e) => format!("(no log at {}: {e})", path.display()),
        }
    }

    /// Prints the log tail to stderr (once).
    pub fn report_log(&mut self) {
        if !self.log_reported {
            self.log_reported = true;
            eprintln!(
                "---- redis-server :{} log tail ----\n{}\n---- end :{} ----",
                self.port,
                self.log_tail(LOG_TAIL_LINES),
                self.port
            );
        }
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (after `kill`).
    pub fn restart(&mut self) {
        self.kill();
        let start = Instant::now();
        while !self.spawn() {
            assert!(start.elapsed() < Duration::from_secs(10), "restart failed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server again on the same port with other extra arguments: another
    /// server (an upgrade, say) behind the same address.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// Sends a signal (`STOP`, `CONT`, ...) to the server.
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(st.success(), "kill -{sig} failed");
    }

    /// Runs one raw command, returning errors instead of panicking.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        raw_cmd(&self.url(), args)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// A plain synchronous connection for checking state with raw commands, named
    /// [`HARNESS_NAME`].
    pub fn conn(&self) -> redis::Connection {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .expect("raw connection");
        name_harness(&mut conn);
        conn
    }

    /// Runs one raw command.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// Puts the plain lock's general scripts (`acquire.lua`, `unlock.lua`) in the server's
    /// script cache, as a warm-up lock and unlock does for `take.lua` and `release.lua`:
    /// a test that slows the network then sees a hand-over or a retry run on its first
    /// send, not a `NOSCRIPT` answer and an `EVAL` a round trip later.
    pub fn load_lock_scripts(&self) {
        for file in ["acquire.lua", "unlock.lua"] {
            let src = redis_rlock::protocol::script_source(file).expect("a script");
            let _: String = self.cmd(&["SCRIPT", "LOAD", src]);
        }
    }

    /// Subscribers of `channel` on the server (PUBSUB NUMSUB).
    pub fn numsub(&self, channel: &str) -> i64 {
        let v: Vec<redis::Value> = self.cmd(&["PUBSUB", "NUMSUB", channel]);
        redis::from_redis_value(v[1].clone()).unwrap()
    }

    /// Whether every lock in `names` has exactly `n` subscribers on its channel.
    pub fn all_numsub(&self, names: &[String], n: i64) -> bool {
        names
            .iter()
            .all(|name| self.numsub(&redis_rlock::protocol::channel_name(name)) == n)
    }

    /// Calls of a command since start (INFO commandstats).
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{}:calls=", command.to_lowercase());
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        // The directory goes below; a failing test would take the evidence with it.
        if std::thread::panicking() {
            self.report_log();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs one raw command on a fresh connection to `url`, with 2 s timeouts.
/// The name of the harness's own connections. A test that reads `CLIENT LIST` leaves
/// them out: a closed one may stay listed a moment on a loaded server.
pub const HARNESS_NAME: &str = "rlock-harness";

/// Names a connection of the harness; a server or user that refuses `CLIENT SETNAME`
/// leaves it unnamed.
fn name_harness(conn: &mut redis::Connection) {
    let _: redis::RedisResult<()> = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(HARNESS_NAME)
        .query(conn);
}

pub fn raw_cmd<T: redis::FromRedisValue>(url: &str, args: &[&str]) -> redis::RedisResult<T> {
    raw_cmd_within(url, args, Duration::from_secs(2))
}

/// Runs one raw command on a fresh connection to `url`, with the given timeouts.
pub fn raw_cmd_within<T: redis::FromRedisValue>(
    url: &str,
    args: &[&str],
    limit: Duration,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(limit)?;
    conn.set_read_timeout(Some(limit))?;
    name_harness(&mut conn);
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut conn)
}

/// Spawns `n` tasks that each take `lock()`'s lock `rounds` times (waiting up to 40 s),
/// check with the overlap detector at `referee_url` under `tag` that nobody else is inside,
/// and count each hold in `served`.
pub fn spawn_overlap_waiters(
    n: usize,
    rounds: usize,
    lock: impl Fn() -> redis_rlock::Lock,
    referee_url: &str,
    tag: &str,
    served: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let l = lock();
            let (url, tag, served) = (referee_url.to_string(), tag.to_string(), served.clone());
            tokio::spawn(async move {
                let mut overlap = Overlap::new(&url, &tag).await;
                for k in 0..rounds {
                    let g = l
                        .try_lock_for(Duration::from_secs(40), None)
                        .await
                        .unwrap_or_else(|e| panic!("waiter {i} round {k}: {e}"))
                        .expect("waiter served in time");
                    assert!(overlap.enter(g.fencing_token()).await);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    overlap.leave().await;
                    g.unlock().await.unwrap();
                    served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        })
        .collect()
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Env var that turns a test binary run into a child worker.
pub const CHILD_ENV: &str = "RLOCK_CHILD_ROLE";

/// A child process running `test_name` of the current test binary with `role`.
pub struct ChildProc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ChildProc {
    pub fn spawn(test_name: &str, role: &str, envs: &[(&str, String)]) -> ChildProc {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, role)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child test process");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildProc { child, lines: rx }
    }

    /// Waits for a line containing `prefix` printed by the child; returns it.
    pub fn expect_line(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(prefix) => return l,
                Ok(_) => continue,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(200));
                    panic!(
                        "child closed its output before printing `{prefix}`; status {:?}",
                        self.child.try_wait()
                    )
                }
                Err(_) => panic!("child did not print `{prefix}` within {limit:?}"),
            }
        }
    }

    pub fn wait_success(mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "child failed: {st}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "child did not finish within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`STOP`, `CONT`, ...) to the child; false if it could not be sent.
    pub fn signal(&self, sig: &str) -> bool {
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .is_ok_and(|st| st.success())
    }

    /// The next line the child printed, if one is already there.
    pub fn try_line(&mut self) -> Option<String> {
        self.lines.try_recv().ok()
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes a line the parent can wait for, flushed at once.
pub fn tell_parent(line: &str) {
    let mut out = std::io::stdout().lock();
    // libtest may have left "test name ... " unterminated on this line.
    writeln!(out, "\n{line}").unwrap();
    out.flush().unwrap();
}

/// The overlap detector: inside a critical section the holder INCRs a counter on a
/// separate Redis (untouched by the faults under test), expects 1, records its fencing
/// token, and DECRs on the way out.
pub struct Overlap {
    conn: redis::aio::MultiplexedConnection,
    tag: String,
}

impl Overlap {
    pub async fn new(url: &str, tag: &str) -> Overlap {
        let conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Overlap {
            conn,
            tag: tag.to_string(),
        }
    }

    /// Enters the critical section; returns false if someone else was inside. `token`
    /// is recorded (0 for a plain lock's `None`).
    pub async fn enter(&mut self, token: impl Into<Option<u64>>) -> bool {
        let token = token.into().unwrap_or(0);
        let inside: i64 = redis::cmd("INCR")
            .arg(format!("{}:inside", self.tag))
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let _: i64 = redis::cmd("RPUSH")
            .arg(format!("{}:tokens", self.tag))
            .arg(token)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if inside != 1 {
            let _: i64 = redis::cmd("INCR")
                .arg(format!("{}:overlaps", self.tag))
                .query_async(&mut self.conn)
                .await
                .unwrap();
        }
        inside == 1
    }

    pub async fn leave(&mut self) {
        let _: i64 = redis::cmd("DECR")
            .arg(format!("{}:inside", self.tag))
            .query_async(&mut self.conn)
            .await
            .unwrap();
    }

    /// Overlaps seen, and whether the recorded tokens rose in grant order.
    pub fn report(server: &RedisServer, tag: &str) -> (i64, usize, bool) {
        let overlaps: Option<i64> = server.cmd(&["GET", &format!("{tag}:overlaps")]);
        let tokens: Vec<u64> = server.cmd(&["LRANGE", &format!("{tag}:tokens"), "0", "-1"]);
        let rising = tokens.windows(2).all(|w| w[0] < w[1]);
        (overlaps.unwrap_or(0), tokens.len(), rising)
    }
}

/// Unlocks every guard, then waits (at most 20 s each) for every waiter task to finish.
pub async fn release_and_join(
    guards: Vec<redis_rlock::LockGuard>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    for g in guards {
        g.unlock().await.unwrap();
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a waiter was not served")
            .unwrap();
    }
}

/// Waits (at most 30 s each) for every task to finish; a panic in one fails the test.
pub async fn join_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("a task did not finish in 30 s")
            .unwrap();
    }
}

/// Churn on one name: two tasks per client take the lock with waits of 1 to 19 ms for
/// `run` (at most 5,000 tries each), hold half of their grants 1 ms, and give up the
/// rest of the waits. Panics if two hold it at once. Returns (grants, waits given up).
pub async fn churn(clients: &[&redis_rlock::Client], name: &str, run: Duration) -> (u64, u64) {
    churn_tasks(clients, 2, name, run).await
}

/// [`churn`] with `per` tasks per client.
pub async fn churn_tasks(
    clients: &[&redis_rlock::Client],
    per: u64,
    name: &str,
    run: Duration,
) -> (u64, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Arc;
    let inside = Arc::new(AtomicBool::new(false));
    let (acquired, gave_up) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        for t in 0..per {
            let lock = c.lock(name);
            let (inside, acquired, gave_up) = (inside.clone(), acquired.clone(), gave_up.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until && n < 5_000 {
                    n += 1;
                    let wait = Duration::from_millis(1 + 6 * ((n + t + i as u64) % 4));
                    // Out of time before Redis answered at all is an error of its own.
                    let Ok(Some(g)) = lock.try_lock_for(wait, None).await else {
                        gave_up.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                    if n.is_multiple_of(2) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    inside.store(false, Ordering::SeqCst);
                    acquired.fetch_add(1, Ordering::Relaxed);
                    g.unlock().await.unwrap();
                }
            }));
        }
    }
    join_all(tasks).await;
    (
        acquired.load(Ordering::Relaxed),
        gave_up.load(Ordering::Relaxed),
    )
}
