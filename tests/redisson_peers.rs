//! Redisson peers sharing a name with contending clients of this crate (issue 24,
//! finding 1): a `tryLock()` poller, which only ever sends Redisson's acquire script,
//! and a `lock()` waiter, which waits on the lock's channel. Neither may be starved.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redisson_rlock::{ACQUIRE, UNLOCK};
use common::RedisServer;
use redis_rlock::protocol::channel_name;
use redis_rlock::Client;

const NAME: &str = "peers:lock";

/// `clients` clients of the crate, `tasks_each` tasks each: lock, hold `hold`, unlock,
/// for `run`. Returns the count of their grants and the tasks.
fn contend(
    s: &RedisServer,
    rt: &tokio::runtime::Runtime,
    (clients, tasks_each): (usize, usize),
    hold: Duration,
    run: Duration,
) -> (Arc<AtomicU64>, Vec<tokio::task::JoinHandle<()>>) {
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = rt.block_on(Client::builder(s.url()).build()).unwrap();
        for _ in 0..tasks_each {
            let (client, grants) = (client.clone(), grants.clone());
            tasks.push(rt.spawn(async move {
                let lock = client.lock(NAME);
                let end = Instant::now() + run;
                while Instant::now() < end {
                    let guard = lock.lock().await.unwrap();
                    grants.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(hold).await;
                    guard.unlock().await.unwrap();
                }
            }));
        }
    }
    (grants, tasks)
}

fn redisson_field(thread: u32) -> String {
    format!("d1b0f1a4-7c2e-4b8a-9f3d-5e6a7b8c9d0e:{thread}")
}

fn redisson_unlock(conn: &mut redis::Connection, field: &str, req: u64) {
    let released: Option<i64> = redis::Script::new(UNLOCK)
        .key(NAME)
        .key(channel_name(NAME))
        .key(format!("redisson_unlock_latch:{{{NAME}}}:{req:032x}"))
        .arg(0)
        .arg(30_000)
        .arg(field)
        .arg("publish")
        .arg(10_000)
        .invoke(conn)
        .unwrap();
    assert_eq!(released, Some(1), "the Redisson peer held the lock");
}

/// The longest any one wait of the peer lasted, in time and in grants to the crate's
/// tasks meanwhile, and how many times it got the lock.
#[derive(Debug, Default)]
struct PeerWaits {
    got: u64,
    longest: Duration,
    most_grants: u64,
}

impl PeerWaits {
    fn waited(&mut self, since: Instant, grants_then: u64, grants_now: u64) {
        self.got += 1;
        self.longest = self.longest.max(since.elapsed());
        self.most_grants = self.most_grants.max(grants_now - grants_then);
    }
}

/// Redisson's `tryLock()` in a loop: the acquire script every `every`, holding 1 ms
/// when it gets the lock.
fn poll(s: &RedisServer, grants: &AtomicU64, every: Duration, run: Duration) -> PeerWaits {
    let mut conn = s.conn();
    let field = redisson_field(1);
    let end = Instant::now() + run;
    let mut waits = PeerWaits::default();
    let (mut since, mut grants_then) = (Instant::now(), grants.load(Ordering::Relaxed));
    let mut req = 0;
    while Instant::now() < end {
        let busy: Option<i64> = redis::Script::new(ACQUIRE)
            .key(NAME)
            .arg(30_000)
            .arg(&field)
            .invoke(&mut conn)
            .unwrap();
        if busy.is_none() {
            waits.waited(since, grants_then, grants.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(1));
            req += 1;
            redisson_unlock(&mut conn, &field, req);
            (since, grants_then) = (Instant::now(), grants.load(Ordering::Relaxed));
        }
        std::thread::sleep(every);
    }
    // A wait still going at the end counts as long as it lasted.
    let (longest, most) = (
        since.elapsed(),
        grants.load(Ordering::Relaxed) - grants_then,
    );
    waits.longest = waits.longest.max(longest);
    waits.most_grants = waits.most_grants.max(most);
    waits
}

/// Finding 1 of issue 24: in 3 s of two clients' contention the poller got nothing
/// (1,408 grants went to the crate's tasks). Redisson promises a poller no order, only a
/// free moment now and then: here every release between the clients is one. The issue's
/// target is 100 ms or 256 grants; measured 64-166 grants.
#[test]
fn a_redisson_try_lock_poller_gets_in_while_clients_contend() {
    poller_gets_in((2, 2), 256);
}

/// The same against one client's four tasks, whose releases hand the lock over to each
/// other inside the client: a run of hand-overs that ends whoever waits leaves the lock
/// free for a share of its length (`handover::RUN_GAP_SHARE`). Measured 34-65 grants;
/// 198-542 before the gap (2 ms of free lock at most every 80 ms, a poller every 2 ms).
#[test]
fn a_redisson_try_lock_poller_gets_in_while_one_clients_tasks_contend() {
    poller_gets_in((1, 4), 150);
}

/// The same with no hold at all: the client's tasks trade the lock as fast as hand-overs
/// go, so a run reaches its count (`handover_limit`) long before its window.
#[test]
fn a_redisson_try_lock_poller_gets_in_while_one_clients_tasks_loop_without_holding() {
    poller_gets_in_holding((1, 4), Duration::ZERO, 256);
}

/// Runs `peer` for most of a 3 s contention of `shape` (1 ms holds) and returns the
/// crate's grants and the peer's waits.
fn against_contention(
    shape: (usize, usize),
    hold: Duration,
    peer: impl FnOnce(&RedisServer, &AtomicU64, Duration) -> PeerWaits,
) -> (u64, PeerWaits) {
    let s = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let run = Duration::from_secs(3);
    let (grants, tasks) = contend(&s, &rt, shape, hold, run);
    std::thread::sleep(Duration::from_millis(100));
    let waits = peer(&s, &grants, run - Duration::from_millis(300));
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    let total = grants.load(Ordering::Relaxed);
    eprintln!("crate grants {total}, peer {waits:?}");
    assert!(total > 200, "the crate's tasks contended: {total} grants");
    (total, waits)
}

/// The poller's longest wait is at most `bound` grants to the crate's tasks (1 ms holds).
fn poller_gets_in(shape: (usize, usize), bound: u64) {
    poller_gets_in_holding(shape, Duration::from_millis(1), bound);
}

fn poller_gets_in_holding(shape: (usize, usize), hold: Duration, bound: u64) {
    let every = Duration::from_millis(2);
    let (total, waits) =
        against_contention(shape, hold, |s, grants, run| poll(s, grants, every, run));
    assert!(
        waits.got > 0,
        "the poller never got the lock in {total} grants"
    );
    assert!(
        waits.most_grants <= bound,
        "the poller waited through more than {bound} grants: {waits:?}"
    );
}

/// Redisson's `lock()`: the acquire script; when busy, wait for the channel's message or
/// the returned TTL, and try again. Holds 1 ms.
fn redisson_waiter(s: &RedisServer, grants: &AtomicU64, run: Duration) -> PeerWaits {
    let mut conn = s.conn();
    let mut sub = s.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(channel_name(NAME)).unwrap();
    let field = redisson_field(2);
    let end = Instant::now() + run;
    let mut waits = PeerWaits::default();
    let mut req = 1000;
    while Instant::now() < end {
        let (since, grants_then) = (Instant::now(), grants.load(Ordering::Relaxed));
        loop {
            let ttl: Option<i64> = redis::Script::new(ACQUIRE)
                .key(NAME)
                .arg(30_000)
                .arg(&field)
                .invoke(&mut conn)
                .unwrap();
            let Some(ttl) = ttl else { break };
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let most = grants.load(Ordering::Relaxed) - grants_then;
                waits.longest = waits.longest.max(since.elapsed());
                waits.most_grants = waits.most_grants.max(most);
                return waits;
            }
            // Redisson's `LockPubSub` acts on `0` and `1` only: a turn message of this
            // crate's on the channel wakes nobody.
            let until = Instant::now() + Duration::from_millis(ttl.max(1) as u64).min(left);
            while let Some(nap) = until
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
            {
                pubsub.set_read_timeout(Some(nap)).unwrap();
                match pubsub.get_message() {
                    Ok(m) if matches!(m.get_payload::<String>().as_deref(), Ok("0" | "1")) => break,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        waits.waited(since, grants_then, grants.load(Ordering::Relaxed));
        std::thread::sleep(Duration::from_millis(1));
        req += 1;
        redisson_unlock(&mut conn, &field, req);
        std::thread::sleep(Duration::from_millis(2));
    }
    waits
}

/// A Redisson `lock()` waiter is woken by the crate's releases and gets the lock in
/// turn with the crate's clients, not after a long line of them: at most 3-4 grants,
/// 9-15 ms, in most debug and release runs (7-8 grants, 17-19 ms in release before a
/// turn that yields first was kept from its own client in Redis too).
#[test]
fn a_redisson_lock_waiter_gets_in_while_clients_contend() {
    let (_, waits) = against_contention((2, 2), Duration::from_millis(1), redisson_waiter);
    assert!(
        waits.got > 10,
        "the Redisson waiter got the lock {} times",
        waits.got
    );
    assert!(
        waits.most_grants <= 16,
        "a Redisson waiter was passed over too often: {waits:?}"
    );
}
