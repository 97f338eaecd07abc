//! Direct grants (`docs/protocol.md` 2.7): a release goes straight to the waiter that
//! the client first in line named, inside the unlock script, and that waiter sends
//! nothing. Checked here: the grant itself, what turns it off (a subscriber outside this
//! crate, a client that no longer listens), a waiter that gives up while named, fenced
//! tokens and leases, and exclusion under churn.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::protocol::{channel_name, clients_key, next_key};
use redis_rlock::{Client, LockGuard};

async fn client(s: &RedisServer) -> Client {
    Client::builder(s.url()).build().await.unwrap()
}

/// Waits until `client` is named to take a direct grant of `name`, and a moment more, so
/// that its waiter has settled into its sleep (its attempts are over).
async fn named(s: &RedisServer, name: &str, client: &Client) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let v: Option<String> = s.cmd(&["HGET", &next_key(name), client.id()]);
        if v.is_some() {
            break;
        }
        assert!(Instant::now() < until, "the waiter was never named");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// The guard a waiting task got, at most 2 s after the release.
async fn granted(waiter: tokio::task::JoinHandle<LockGuard>) -> LockGuard {
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter got the lock at once")
        .unwrap()
}

fn script_calls(s: &RedisServer) -> u64 {
    s.calls("evalsha") + s.calls("eval")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_next_client_in_line_which_sends_nothing() {
    let s = RedisServer::start();
    let (a, b) = (client(&s).await, client(&s).await);
    let name = "dg:basic";
    // The scripts loaded, so that a first use's NOSCRIPT and EVAL do not count.
    a.lock(name).lock().await.unwrap().unlock().await.unwrap();
    let held = a.lock(name).lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = b.lock(name);
        async move { l.lock_with_lease(Duration::from_secs(5)).await.unwrap() }
    });
    named(&s, name, &b).await;
    let before = script_calls(&s);
    held.unlock().await.unwrap();
    let g = granted(waiter).await;
    assert_eq!(
        script_calls(&s) - before,
        1,
        "the unlock was the one script call of the hand-off"
    );
    assert_eq!(b.stats().direct_grants, 1);
    assert!(!g.is_lost());
    let field: Option<i64> = s.cmd(&["HGET", name, g.holder_field()]);
    assert_eq!(field, Some(1), "the waiter's field holds it once");
    let pttl: i64 = s.cmd(&["PTTL", name]);
    assert!(
        (3_000..=5_000).contains(&pttl),
        "the waiter's own lease, {pttl} ms"
    );
    let line: Vec<String> = s.cmd(&["LRANGE", &clients_key(name), "0", "-1"]);
    assert!(
        line.is_empty(),
        "the granted client left the line: {line:?}"
    );
    let next: Vec<String> = s.cmd(&["HKEYS", &next_key(name)]);
    assert!(next.is_empty(), "no naming is left: {next:?}");
    g.unlock().await.unwrap();
    let exists: i64 = s.cmd(&["EXISTS", name]);
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_waiter_gets_a_larger_token_by_direct_grant() {
    let s = RedisServer::start();
    let (a, b) = (client(&s).await, client(&s).await);
    let name = "dg:fenced";
    let held = a.fenced_lock(name).lock().await.unwrap();
    let first = held.fencing_token().unwrap();
    let waiter = tokio::spawn({
        let l = b.fenced_lock(name);
        async move { l.lock().await.unwrap() }
    });
    named(&s, name, &b).await;
    held.unlock().await.unwrap();
    let g = granted(waiter).await;
    assert_eq!(b.stats().direct_grants, 1);
    assert!(
        g.fencing_token().unwrap() > first,
        "{:?} after {first}",
        g.fencing_token()
    );
    g.unlock().await.unwrap();
}

/// A subscriber of the lock's channel that is not a client of this crate (a Redisson
/// waiter) hears only published releases: while it listens, releases are published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_subscriber_of_the_lock_channel_gets_published_releases() {
    let s = RedisServer::start();
    let (a, b) = (client(&s).await, client(&s).await);
    let name = "dg:foreign";
    let mut foreign = redis::Client::open(s.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut pubsub = foreign.as_pubsub();
    pubsub.subscribe(channel_name(name)).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let held = a.lock(name).lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = b.lock(name);
        async move { l.lock().await.unwrap() }
    });
    named(&s, name, &b).await;
    held.unlock().await.unwrap();
    let msg = pubsub.get_message().expect("the release was published");
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
    let g = granted(waiter).await;
    assert_eq!(b.stats().direct_grants, 0, "nothing was granted directly");
    g.unlock().await.unwrap();
}

/// A client named first in line that no longer listens (it died) is not granted the
/// lock: the release is published, and the lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_client_that_no_longer_listens_is_not_granted() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let name = "dg:dead";
    let dead = "00000000-0000-0000-0000-00000000dead";
    // A pattern subscriber hears every channel, the dead client's too: it is not the
    // client, and a PUBLISH reply would count it.
    let mut pattern = redis::Client::open(s.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut pattern = pattern.as_pubsub();
    pattern.psubscribe("redisson_lock_turns:*").unwrap();
    let held = a.lock(name).lock().await.unwrap();
    let far = 4_000_000_000_000u64;
    let _: i64 = s.cmd(&["RPUSH", &clients_key(name), dead]);
    let _: i64 = s.cmd(&[
        "HSET",
        &next_key(name),
        dead,
        &format!("{far} 30000 - - 1 {} {name}{dead}:t1", name.len()),
    ]);
    held.unlock().await.unwrap();
    let exists: i64 = s.cmd(&["EXISTS", name]);
    assert_eq!(
        exists, 0,
        "the lock was not granted to a client nobody hears"
    );
}

/// A waiter that gives up while named withdraws the naming at once: a release right
/// after it (its client still listens: the channel lingers) does not grant the lock to
/// a field nobody waits on, which would hold it for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_is_not_granted_afterwards() {
    let s = RedisServer::start();
    let (a, b, c) = (client(&s).await, client(&s).await, client(&s).await);
    let name = "dg:gaveup";
    for round in 0..5 {
        let held = a.lock(name).lock().await.unwrap();
        let got = b
            .lock(name)
            .try_lock_for(Duration::from_millis(100), None)
            .await
            .unwrap();
        assert!(got.is_none());
        // The withdrawal runs in the background: give it a moment, well inside the
        // channel's linger.
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.unlock().await.unwrap();
        let g = tokio::time::timeout(
            Duration::from_secs(2),
            c.lock(name).try_lock_for(Duration::from_secs(1), None),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(g.is_some(), "round {round}: the lock was left to nobody");
        g.unwrap().unlock().await.unwrap();
    }
    assert_eq!(b.stats().direct_grants, 0);
}

/// A churn (see `common::churn_tasks`) of `clients` clients of `per` tasks each on
/// `name`: never two holders, and once the background withdrawals and give-backs are in
/// (a moment, far below a lease) nothing holds the lock and no naming is left. Returns
/// (grants, waits given up, direct grants).
async fn churn_leaves_nothing(
    s: &RedisServer,
    clients: usize,
    per: u64,
    name: &str,
) -> (u64, u64, u64) {
    common::init_tracing();
    let mut owned = Vec::new();
    for _ in 0..clients {
        owned.push(client(s).await);
    }
    let clients: Vec<&Client> = owned.iter().collect();
    let (acquired, gave_up) =
        common::churn_tasks(&clients, per, name, Duration::from_secs(3)).await;
    let direct: u64 = clients.iter().map(|c| c.stats().direct_grants).sum();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let exists: i64 = s.cmd(&["EXISTS", name]);
        let named: i64 = s.cmd(&["EXISTS", &next_key(name)]);
        if exists == 0 && named == 0 {
            break;
        }
        let holders: Vec<String> = s.cmd(&["HGETALL", name]);
        let namings: Vec<String> = s.cmd(&["HGETALL", &next_key(name)]);
        assert!(
            Instant::now() < deadline,
            "left: holds {holders:?}, namings {namings:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (acquired, gave_up, direct)
}

/// Clients of two tasks each, some waits short enough to give up often, holds of 0 to
/// 1 ms: never two holders, and when it is over nothing holds the lock (no grant left to
/// a waiter that was gone).
#[tokio::test(flavor = "multi_thread")]
async fn churn_keeps_exclusion_and_leaves_no_orphan_hold() {
    let s = RedisServer::start();
    let (acquired, gave_up, direct) = churn_leaves_nothing(&s, 6, 2, "dg:churn").await;
    println!("FIGURE churn: {acquired} acquired, {gave_up} gave up, {direct} direct grants");
    assert!(acquired > 100);
    assert!(gave_up > 0, "no waiter gave up");
}

/// Clients of six tasks each, waits short enough to give up often: runs of hand-overs
/// inside each client, which give way to other clients (naming the waiter passed over,
/// `docs/protocol.md` 2.7), while named waiters give up, some with an offer of their own
/// client in flight (an offer that a release of a hold given back in the background
/// makes, too). Never two holders, and at the end nothing holds the lock and nobody is
/// named.
#[tokio::test(flavor = "multi_thread")]
async fn waiters_giving_up_around_a_hand_over_that_gave_way_leave_no_orphan_hold() {
    let s = RedisServer::start();
    let (acquired, gave_up, direct) = churn_leaves_nothing(&s, 3, 6, "dg:churn6").await;
    println!("FIGURE churn of 3 x 6 tasks: {acquired} acquired, {gave_up} gave up, {direct} direct grants");
    assert!(acquired > 100);
    assert!(gave_up > 0, "no waiter gave up");
    assert!(direct > 0, "no direct grant");
}

/// The ACL that `docs/protocol.md` gave before direct grants (no `TIME`, no `PUBSUB`)
/// costs the direct grants, not the lock: releases are published as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_time_and_pubsub_gets_published_releases() {
    let s = RedisServer::start();
    let mut setuser = vec![
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">pw",
        "~app:*",
        "~redisson_*:{app:*",
        "resetchannels",
        "&redisson_lock__channel:*",
        "&redisson_lock_turns:*",
    ];
    let commands = "+evalsha +eval +subscribe +unsubscribe +exists +hget +pttl +ping \
        +hexists +hincrby +hset +hdel +pexpire +del +publish +get +set +incr +type +lpos \
        +rpush +lindex +lpop +lrem";
    setuser.extend(commands.split_whitespace());
    let _: () = s.cmd(&setuser);
    let url = format!("redis://locker:pw@127.0.0.1:{}", s.port);
    let (a, b) = (
        Client::connect(&url).await.unwrap(),
        Client::connect(&url).await.unwrap(),
    );
    let name = "app:dg-acl";
    for round in 0..3 {
        let held = a.lock(name).lock().await.unwrap();
        let waiter = tokio::spawn({
            let l = b.lock(name);
            async move { l.lock().await.unwrap().unlock().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.unlock().await.unwrap();
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter slept through the unlock"))
            .unwrap();
    }
    assert_eq!(b.stats().direct_grants, 0);
}

/// A task that holds a fixed-lease lock and asks for it again (a re-entry, sent to
/// Redis) is never named for a direct grant: a call cut off at any point leaves the
/// first hold in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_reentry_leaves_the_first_hold() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let name = "dg:reenter";
    let lock = a.lock(name);
    let first = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    for i in 0..60u64 {
        let cut = Duration::from_micros(50 * (i % 12));
        let again = tokio::time::timeout(cut, lock.lock_with_lease(Duration::from_secs(30))).await;
        if let Ok(g) = again {
            g.unwrap().unlock().await.unwrap();
        }
    }
    // Background give-backs settle within a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let count: Option<i64> = s.cmd(&["HGET", name, first.holder_field()]);
    assert_eq!(count, Some(1), "the first hold is intact");
    first.unlock().await.unwrap();
}

/// A client `a` of several waiting tasks, and a client `b` in line behind it. `a`'s run
/// of hand-overs gives way to `b` after four grants, and the waiter it would have served
/// next sleeps on: that unlock names it, so that `b`'s release can grant it the lock
/// directly.
struct GaveWay {
    a: Client,
    b: Client,
    name: &'static str,
    /// `a`'s waiters, in the order they started waiting.
    a_waiters: Vec<tokio::task::JoinHandle<()>>,
    /// `b`'s guard, once `a`'s run gave way to it.
    b_held: Option<LockGuard>,
    /// Who got the lock, in order: `a1`.. for `a`'s waiters, `b`.
    order: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl GaveWay {
    /// `a_tasks` waiters of `a` queue behind its holder (hand-overs: four, then the
    /// fifth gives way), one waiter of `b` lines up behind `a`; returns once `b` holds.
    /// Every grant's fencing token goes into `order` too (`a1 7`), 0 for a plain lock.
    async fn start(s: &RedisServer, name: &'static str, a_tasks: usize, fenced: bool) -> GaveWay {
        // A long window: only the count of hand-overs in a row ends a's run here.
        let a = Client::builder(s.url())
            .handover_window(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let b = client(s).await;
        let order = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let lock = |c: &Client| {
            if fenced {
                c.fenced_lock(name)
            } else {
                c.lock(name)
            }
        };
        let held = lock(&a).lock().await.unwrap();
        let mut a_waiters = Vec::new();
        for i in 1..=a_tasks {
            let (l, order) = (lock(&a), order.clone());
            a_waiters.push(tokio::spawn(async move {
                let g = l.lock().await.unwrap();
                let token = g.fencing_token().unwrap_or(0);
                order.lock().push(format!("a{i} {token}"));
                g.unlock().await.unwrap();
            }));
            if i == 1 {
                named(s, name, &a).await;
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn({
            let (l, order) = (lock(&b), order.clone());
            async move {
                let g = l.lock().await.unwrap();
                let token = g.fencing_token().unwrap_or(0);
                order.lock().push(format!("b {token}"));
                let _ = tx.send(g);
            }
        });
        named(s, name, &b).await;
        let line: Vec<String> = s.cmd(&["LRANGE", &clients_key(name), "0", "-1"]);
        assert_eq!(line, vec![a.id().to_string(), b.id().to_string()]);
        held.unlock().await.unwrap();
        let b_held = tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("b got the lock after a's run")
            .unwrap();
        GaveWay {
            a,
            b,
            name,
            a_waiters,
            b_held: Some(b_held),
            order,
        }
    }

    /// `a`'s naming in Redis, if any.
    fn a_naming(&self, s: &RedisServer) -> Option<String> {
        s.cmd(&["HGET", &next_key(self.name), self.a.id()])
    }

    /// `b` releases, and `a`'s last waiter (`a5`, the one passed over) gets the lock at
    /// once, by one direct grant since `direct_before` was read.
    async fn b_releases_to_a5(&mut self, direct_before: u64) {
        self.b_held.take().unwrap().unlock().await.unwrap();
        for w in self.a_waiters.drain(..) {
            tokio::time::timeout(Duration::from_secs(2), w)
                .await
                .expect("a's last waiter got the lock at once")
                .unwrap();
        }
        assert_eq!(self.order(), ["a1", "a2", "a3", "a4", "b", "a5"]);
        assert_eq!(self.a.stats().direct_grants - direct_before, 1);
    }

    /// Who got the lock, in order, without the tokens.
    fn order(&self) -> Vec<String> {
        let order = self.order.lock();
        order
            .iter()
            .map(|o| o.split(' ').next().unwrap().to_string())
            .collect()
    }

    /// The fencing tokens of the grants, in order.
    fn tokens(&self) -> Vec<u64> {
        let order = self.order.lock();
        order
            .iter()
            .map(|o| o.split(' ').nth(1).unwrap().parse().unwrap())
            .collect()
    }
}

/// The waiter that a client's run of hand-overs passed over, when it gave way to
/// another client, takes the lock by direct grant when that client releases: no
/// published release, no acquire of its own. (Before, its client had nobody named, and
/// the lock went back to it only by a published release and the waiter's acquire.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_passed_over_when_its_client_gave_way_is_granted_directly() {
    let s = RedisServer::start();
    let name = "dg:gaveway";
    let mut t = GaveWay::start(&s, name, 5, false).await;
    assert_eq!(t.order(), ["a1", "a2", "a3", "a4", "b"]);
    let naming = t.a_naming(&s).expect("the waiter passed over is named");
    assert!(naming.contains(name), "{naming}");
    let before = script_calls(&s);
    let direct_before = t.a.stats().direct_grants;
    t.b_releases_to_a5(direct_before).await;
    assert_eq!(
        script_calls(&s) - before,
        2,
        "b's unlock, then a5's unlock: a5 sent no acquire"
    );
    let exists: i64 = s.cmd(&["EXISTS", name]);
    assert_eq!(exists, 0);
    let next: Vec<String> = s.cmd(&["HKEYS", &next_key(name)]);
    assert!(next.is_empty(), "no naming is left: {next:?}");
    drop(t.b);
}

/// The same with a fenced lock: the waiter named by its client's unlock is named fenced,
/// so its direct grant draws a token larger than every one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_waiter_passed_over_when_its_client_gave_way_gets_a_larger_token() {
    let s = RedisServer::start();
    let name = "dg:gaveway-fenced";
    let mut t = GaveWay::start(&s, name, 5, true).await;
    let direct_before = t.a.stats().direct_grants;
    t.b_releases_to_a5(direct_before).await;
    let tokens = t.tokens();
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]) && tokens[0] > 0,
        "tokens in grant order: {tokens:?}"
    );
}

/// The waiter so named gives up (its task is cancelled) while the other client holds
/// the lock: its naming is withdrawn, and the release goes to the client's next waiter,
/// not to a field nobody waits on (which would hold the lock until its lease ran out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_named_when_its_client_gave_way_that_gives_up_is_not_granted() {
    let s = RedisServer::start();
    let name = "dg:gaveway-left";
    let mut t = GaveWay::start(&s, name, 6, false).await;
    assert_eq!(t.order(), ["a1", "a2", "a3", "a4", "b"]);
    let naming = t.a_naming(&s).expect("the waiter passed over is named");
    // a5, the waiter named, gives up.
    t.a_waiters[4].abort();
    let until = Instant::now() + Duration::from_secs(2);
    while t.a_naming(&s).as_ref() == Some(&naming) {
        assert!(
            Instant::now() < until,
            "the naming of a waiter gone was left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t.b_held.take().unwrap().unlock().await.unwrap();
    let last = t.a_waiters.pop().unwrap();
    tokio::time::timeout(Duration::from_secs(2), last)
        .await
        .expect("a's next waiter got the lock")
        .unwrap();
    assert_eq!(t.order(), ["a1", "a2", "a3", "a4", "b", "a6"]);
    let exists: i64 = s.cmd(&["EXISTS", name]);
    assert_eq!(exists, 0, "nothing holds the lock");
}
