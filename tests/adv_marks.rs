//! Adversarial review of the listeners' marks (`docs/protocol.md` 1.4, 1.6, 2.6): a
//! listening client of this crate holds an `SSUBSCRIBE` of a plain lock's channel, and a
//! release yields its turn only to a plain subscriber beyond the marks. These tests kill
//! the marked connection, refuse it for a moment, listen as ACL users that may not mark,
//! count, or name, and put a stray mark next to a Redisson waiter.

mod common;

use std::time::{Duration, Instant};

use common::marks::{
    acl, contend_beside_redisson, counts, held_elsewhere, kills_while_waiting,
    release_with_one_in_line, released_elsewhere, subscribed_raw, subscriptions, url_as,
    wait_and_count,
};
#[cfg(feature = "sentinel")]
use common::topology::SentinelTopology;
use common::turns::take_and_release;
use common::RedisServer;
use redis_rlock::protocol::channel_name;
use redis_rlock::Client;

/// A server that answers RESP3's greeting with an error for a while (here the client's
/// ACL user disabled and enabled again, as an operator may while rotating passwords)
/// must not cost the client its marks for the rest of its life: once the greeting is
/// accepted again, a waiter's subscription carries its mark. Before the fix the listener
/// latched RESP2 on that refusal and never marked again (`(1, 0)`: one plain
/// subscriber, no mark), so each turn it was given with another of its kind listening
/// yielded 2 ms to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greeting_refused_for_a_while_does_not_end_the_marks() {
    let s = RedisServer::start();
    let mut admin = s.conn();
    acl(&mut admin, &["app", "on", ">pw", "~*", "&*", "+@all"]);
    let client = Client::connect(url_as(&s, "app")).await.unwrap();
    let ((plain, marks), _) = wait_and_count(&s, &client, "am:user:before").await;
    assert_eq!((plain, marks), (1, 1), "marked before");
    // The user is refused while its listener reconnects for a waiter.
    acl(&mut admin, &["app", "off"]);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut admin)
        .unwrap();
    let name = "am:user:off";
    held_elsewhere(&mut admin, name, 30_000);
    let waiter = take_and_release(client.lock(name));
    tokio::time::sleep(Duration::from_millis(300)).await;
    acl(&mut admin, &["app", "on"]);
    let ch = channel_name(name);
    let subscribed = common::eventually(Duration::from_secs(5), || s.numsub(&ch) == 1).await;
    assert!(subscribed, "the waiter never subscribed");
    released_elsewhere(&mut admin, name);
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was served")
        .unwrap();
    let ((plain, marks), after) = wait_and_count(&s, &client, "am:user:after").await;
    assert!(after < Duration::from_secs(1), "{after:?}");
    assert_eq!(
        (plain, marks),
        (1, 1),
        "a refusal of a while ended the marks for good"
    );
    client.shutdown().await.unwrap();
}

/// The listener killed again and again (`CLIENT KILL TYPE pubsub`, and by id) while two
/// clients' waiters wait and a third client releases: every waiter is served within
/// 1 s of its release, no connection holds a plain subscription without its mark (or
/// the reverse) in two samples 150 ms apart, and once the kills stop and the waits are
/// over, neither a subscription nor a mark is left on the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_listener_again_and_again_misses_no_release_and_leaves_no_mark() {
    kills_while_waiting(RedisServer::start(), true).await;
}

/// The same on a server without `HELLO` (RESP2) and one without `SSUBSCRIBE`: served
/// as well, and never a mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_listener_of_an_older_server_misses_no_release_either() {
    for old in ["HELLO", "SSUBSCRIBE"] {
        kills_while_waiting(
            RedisServer::start_with(&["--rename-command", old, ""]),
            false,
        )
        .await;
    }
}

/// Claims (b) and (c), and what a stray mark costs: a release yields its turn to a
/// plain subscriber beyond the line (a Redisson waiter), not to a marked one, nor to a
/// client of this crate that lingers beside the line; and a stray `SSUBSCRIBE` of the
/// channel by another program hides a Redisson waiter, which is then not yielded to
/// (the turn's client is served first, as if no Redisson waiter were there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_subscriber_is_yielded_to_and_a_stray_mark_hides_it() {
    let s = RedisServer::start();
    let holder = Client::connect(s.url()).await.unwrap();
    let waiter = Client::connect(s.url()).await.unwrap();
    let lingerer = Client::connect(s.url()).await.unwrap();
    let plain = release_with_one_in_line(&s, (&holder, &waiter, None), "am:y:plain", false);
    assert!(plain.await, "a Redisson waiter was not yielded to");
    let marked = release_with_one_in_line(&s, (&holder, &waiter, None), "am:y:marked", true);
    assert!(
        !marked.await,
        "a subscriber with a mark beside it was yielded to"
    );
    let ours = (&holder, &waiter, Some(&lingerer));
    let lingering = release_with_one_in_line(&s, ours, "am:y:ours", true);
    assert!(!lingering.await, "a client of this crate was yielded to");
    // A Redisson waiter (plain) and another program's mark on the channel.
    let stray = subscribed_raw(&s, "am:y:stray", &["SSUBSCRIBE"]);
    let hidden = release_with_one_in_line(&s, (&holder, &waiter, None), "am:y:stray", false);
    let mut admin = s.conn();
    assert_eq!(
        counts(&mut admin, "am:y:stray").1,
        1,
        "the stray mark stands"
    );
    assert!(
        !hidden.await,
        "a stray mark did not hide the Redisson waiter (a finding if it did)"
    );
    drop(stray);
    for c in [holder, waiter, lingerer] {
        c.shutdown().await.unwrap();
    }
}

/// Claim (d), as ACL users whose clients cannot do all of it: each user's waiter is
/// served within 1 s of a release and its listener marks where it may; a Redisson-like
/// plain subscriber is yielded to except where the releasing user may not count
/// subscribers at all (`-pubsub`: the count refused is taken as no, as before the
/// marks); and a lingering client of the same user is yielded to (2 ms for nobody)
/// where that user cannot mark (`-ssubscribe`) or the script cannot count marks
/// (`-pubsub|shardnumsub`), as before the marks, and not otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_that_cannot_mark_count_or_name_are_still_served() {
    let s = RedisServer::start();
    let mut admin = s.conn();
    // (user, its rule, marks while waiting, yields to a plain subscriber, to its own)
    let users = [
        ("full", "+@all", 1, true, false),
        ("nossub", "-ssubscribe", 0, true, true),
        ("nopubsub", "-pubsub", 1, false, false),
        ("noshardnumsub", "-pubsub|shardnumsub", 1, true, true),
        ("nosetname", "-client|setname", 1, true, false),
        // HELLO is not refused to an ACL user denied it: the listener marks.
        ("nohello", "-hello", 1, true, false),
    ];
    for (user, rule, marks, to_plain, to_own) in users {
        acl(&mut admin, &[user, "on", ">pw", "~*", "&*", "+@all", rule]);
        let url = url_as(&s, user);
        let holder = Client::connect(&url).await.unwrap();
        let waiter = Client::connect(&url).await.unwrap();
        let lingerer = Client::connect(&url).await.unwrap();
        let ((plain, marked), after) = wait_and_count(&s, &waiter, &format!("am:acl:{user}")).await;
        assert!(
            after < Duration::from_secs(1),
            "{user}: served {after:?} after"
        );
        assert_eq!((plain, marked), (1, marks), "{user}: (subscribers, marks)");
        let name = format!("am:acl:{user}:plain");
        let yields = release_with_one_in_line(&s, (&holder, &waiter, None), &name, false);
        assert_eq!(
            yields.await,
            to_plain,
            "{user}: yields to a plain subscriber"
        );
        let name = format!("am:acl:{user}:own");
        let ours = (&holder, &waiter, Some(&lingerer));
        let yields = release_with_one_in_line(&s, ours, &name, true);
        assert_eq!(
            yields.await,
            to_own,
            "{user}: yields to its own lingering client"
        );
        for c in [holder, waiter, lingerer] {
            c.shutdown().await.unwrap();
        }
    }
}

/// The mark is dropped in the same round trip as the plain subscription, on the same
/// connection: once a waiter's linger is over both are gone within 1 s, and the
/// listener that held them is still connected (an `SUNSUBSCRIBE` whose reply redis-rs
/// did not match would end in a timeout and a reconnect, the connection's id gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mark_goes_with_the_subscription_on_the_same_connection() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let mut admin = s.conn();
    for round in 0..3 {
        let name = format!("am:same:{round}");
        let held = Client::connect(s.url()).await.unwrap();
        let guard = held.lock(&name).lock().await.unwrap();
        let waiter = take_and_release(client.lock(&name));
        let ch = channel_name(&name);
        let up = common::eventually(Duration::from_secs(5), || s.numsub(&ch) == 1).await;
        assert!(up, "round {round}: never subscribed");
        let marked: Vec<u64> = subscriptions(&mut admin)
            .into_iter()
            .filter(|&(_, p, m)| (p, m) == (1, 1))
            .map(|(id, _, _)| id)
            .collect();
        assert_eq!(marked.len(), 1, "round {round}: one marked listener");
        guard.unlock().await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("served")
            .unwrap();
        let since = Instant::now();
        let gone = common::eventually(Duration::from_secs(1), || {
            counts(&mut admin, &name) == (0, 0)
        })
        .await;
        assert!(gone, "round {round}: {:?} left", counts(&mut admin, &name));
        let listed = subscriptions(&mut admin);
        let still = listed.iter().find(|c| c.0 == marked[0]);
        assert_eq!(
            still.map(|c| (c.1, c.2)),
            Some((0, 0)),
            "round {round}: the listener reconnected ({:?} after the release)",
            since.elapsed()
        );
        held.shutdown().await.unwrap();
    }
    client.shutdown().await.unwrap();
}

/// Claim (a) at a Sentinel failover: a waiter marked on the old master is marked on
/// the new one after the failover (its plain subscription with it), nothing of it is
/// left on the old master, and a release on the new master serves it within 5 s.
#[cfg(feature = "sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sentinel_failover_the_mark_is_on_the_new_master_only() {
    let topo = tokio::task::spawn_blocking(SentinelTopology::start)
        .await
        .unwrap();
    let waiter = Client::sentinel(&topo.sentinel_urls(), &topo.master_name)
        .response_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let name = "am:sentinel";
    let old = topo.current_master_port();
    let node = |port: u16| topo.nodes().into_iter().find(|n| n.port == port).unwrap();
    let mut on_old = node(old).conn();
    held_elsewhere(&mut on_old, name, 60_000);
    // On every replica before the failover, so the new master has the hold.
    let _: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(2000)
        .query(&mut on_old)
        .unwrap();
    let served = take_and_release(waiter.lock(name));
    let up = common::eventually(Duration::from_secs(5), || {
        counts(&mut on_old, name) == (1, 1)
    })
    .await;
    assert!(
        up,
        "not marked on the old master: {:?}",
        counts(&mut on_old, name)
    );
    let new = tokio::task::block_in_place(|| topo.failover());
    let mut on_new = node(new).conn();
    let moved = common::eventually(Duration::from_secs(10), || {
        counts(&mut on_new, name) == (1, 1)
    })
    .await;
    assert!(moved, "on the new master: {:?}", counts(&mut on_new, name));
    let mut on_old = node(old).conn();
    let left = common::eventually(Duration::from_secs(5), || {
        counts(&mut on_old, name) == (0, 0)
    })
    .await;
    assert!(
        left,
        "left on the old master: {:?}",
        counts(&mut on_old, name)
    );
    let released = Instant::now();
    released_elsewhere(&mut on_new, name);
    let got = tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("the waiter was served after the failover")
        .unwrap();
    eprintln!(
        "served {:?} after the release on the new master",
        got.saturating_duration_since(released)
    );
    waiter.shutdown().await.unwrap();
}

/// What a stray mark, or an ACL user that cannot mark or count, costs a Redisson
/// `lock()` waiter among two clients' four contending tasks (1 ms holds, 3 s): with a
/// stray mark or `-pubsub` it is not yielded to, and waits longer, but is not starved:
/// woken by every release, it still wins some races, and no wait reaches 1 s. Debug
/// build, 4-5 runs: default 269-311 wins, longest wait 12-24 ms; a stray mark 189-214,
/// 46-67 ms; `-ssubscribe` 271-303, 11-26 ms; `-pubsub` 160-195, 34-54 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_waiter_is_not_starved_by_a_stray_mark_or_an_acl_user() {
    let s = RedisServer::start();
    let mut admin = s.conn();
    acl(
        &mut admin,
        &["nossub", "on", ">pw", "~*", "&*", "+@all", "-ssubscribe"],
    );
    acl(
        &mut admin,
        &["nopubsub", "on", ">pw", "~*", "&*", "+@all", "-pubsub"],
    );
    let cases = [
        ("default", s.url(), false),
        ("default, a stray mark", s.url(), true),
        ("nossub", url_as(&s, "nossub"), false),
        ("nopubsub", url_as(&s, "nopubsub"), false),
    ];
    for (round, (what, url, stray)) in cases.into_iter().enumerate() {
        let name = format!("am:starve:{round}");
        let _mark = stray.then(|| subscribed_raw(&s, &name, &["SSUBSCRIBE"]));
        let (got, longest, grants) = contend_beside_redisson(&s, &url, &name).await;
        eprintln!("{what}: the Redisson waiter got it {got} times, longest wait {longest:?}; the tasks {grants}");
        assert!(
            got >= 10,
            "{what}: the Redisson waiter got it {got} times in 3 s"
        );
        assert!(
            longest < Duration::from_secs(1),
            "{what}: waited {longest:?}"
        );
    }
}

/// Claim (a) over TLS: a server with a plain port (for the checks) and a TLS one (for
/// the client, its certificate self-signed by `openssl`): the listener marks over TLS,
/// and its waiter is served within 1 s of a release. Runs with `--features tls-rustls`.
#[cfg(feature = "tls-rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_listener_marks_too() {
    let dir = std::env::temp_dir().join(format!("adv-marks-tls-{}", std::process::id()));
    let (cert, key) = common::marks::self_signed(&dir);
    let tls_port = common::free_port().to_string();
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    let s = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &c,
        "--tls-key-file",
        &k,
        "--tls-ca-cert-file",
        &c,
        "--tls-auth-clients",
        "no",
    ]);
    let client = Client::builder(format!("rediss://127.0.0.1:{tls_port}"))
        .tls_root_cert(std::fs::read(&cert).unwrap())
        .build()
        .await
        .unwrap();
    let ((plain, marks), after) = wait_and_count(&s, &client, "am:tls").await;
    assert_eq!((plain, marks), (1, 1), "over TLS");
    assert!(after < Duration::from_secs(1), "{after:?}");
    client.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server without `HELLO` replaced by one with it behind the same address (an
/// upgrade in place; a Sentinel failover to an upgraded replica is the same to the
/// listener): after the reconnect the listener speaks RESP3 and marks. Before the fix
/// it had latched RESP2 at the old server for the client's life (`(1, 0)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_upgraded_behind_the_same_address_is_marked_after_the_reconnect() {
    let mut s = RedisServer::start_with(&["--rename-command", "HELLO", ""]);
    let client = Client::connect(s.url()).await.unwrap();
    let ((plain, marks), _) = wait_and_count(&s, &client, "am:upgrade:before").await;
    assert_eq!((plain, marks), (1, 0), "no marks without HELLO");
    s.restart_with(&[]);
    let ((plain, marks), after) = wait_and_count(&s, &client, "am:upgrade:after").await;
    assert!(after < Duration::from_secs(1), "{after:?}");
    assert_eq!((plain, marks), (1, 1), "RESP2 latched at the old server");
    client.shutdown().await.unwrap();
}

/// A client dropped without `shutdown`, its waiter cancelled mid-wait, leaves neither
/// its subscription nor its mark behind (a mark left for good would hide every
/// Redisson waiter of the channel): both gone within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dropped_mid_wait_leaves_no_mark() {
    let s = RedisServer::start();
    let mut admin = s.conn();
    let name = "am:dropped";
    held_elsewhere(&mut admin, name, 30_000);
    let client = Client::connect(s.url()).await.unwrap();
    let waiter = take_and_release(client.lock(name));
    let marked = common::eventually(Duration::from_secs(5), || {
        counts(&mut admin, name) == (1, 1)
    })
    .await;
    assert!(marked, "never marked: {:?}", counts(&mut admin, name));
    waiter.abort();
    drop(client);
    let gone = common::eventually(Duration::from_secs(2), || {
        counts(&mut admin, name) == (0, 0)
    })
    .await;
    assert!(gone, "left behind: {:?}", counts(&mut admin, name));
}
