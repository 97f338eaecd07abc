//! The listeners' marks seen from outside (`docs/protocol.md` 1.4, 2.6): counts of
//! plain subscriptions and marks, holds and releases as Redisson's scripts leave them,
//! raw subscribers, and the turn message a release sends (`tests/adv_marks.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_rlock::protocol::channel_name;
use redis_rlock::Client;

use super::turns::{lined_up, take_and_release};
use super::RedisServer;

/// A holder of another client (Redisson's field layout) for `ms`.
pub fn held_elsewhere(conn: &mut redis::Connection, name: &str, ms: u64) {
    let field = "d1b0f1a4-7c2e-4b8a-9f3d-5e6a7b8c9d0e:1";
    let _: i64 = redis::cmd("HSET")
        .arg(name)
        .arg(field)
        .arg(1)
        .query(conn)
        .unwrap();
    let _: i64 = redis::cmd("PEXPIRE").arg(name).arg(ms).query(conn).unwrap();
}

/// That holder's release as Redisson's unlock sends it.
pub fn released_elsewhere(conn: &mut redis::Connection, name: &str) {
    let _: i64 = redis::cmd("DEL").arg(name).query(conn).unwrap();
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel_name(name))
        .arg("0")
        .query(conn)
        .unwrap();
}

pub fn count(conn: &mut redis::Connection, sub: &str, channel: &str) -> i64 {
    let v: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg(sub)
        .arg(channel)
        .query(conn)
        .unwrap();
    redis::from_redis_value(v[1].clone()).unwrap()
}

/// (plain subscribers, marks) of `name`'s channel.
pub fn counts(conn: &mut redis::Connection, name: &str) -> (i64, i64) {
    let ch = channel_name(name);
    (count(conn, "NUMSUB", &ch), count(conn, "SHARDNUMSUB", &ch))
}

/// A `client` waiter on `name`, held elsewhere, counted once it subscribed and then
/// released elsewhere: (plain subscribers, marks) while it waited, and how long after
/// the release it got the lock (panics past 5 s).
pub async fn wait_and_count(
    s: &RedisServer,
    client: &Client,
    name: &str,
) -> ((i64, i64), Duration) {
    let mut admin = s.conn();
    held_elsewhere(&mut admin, name, 30_000);
    let waiter = take_and_release(client.lock(name));
    let ch = channel_name(name);
    let subscribed = super::eventually(Duration::from_secs(5), || s.numsub(&ch) == 1).await;
    assert!(subscribed, "{name}: the waiter never subscribed");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let seen = counts(&mut admin, name);
    let released = Instant::now();
    released_elsewhere(&mut admin, name);
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap_or_else(|_| panic!("{name}: the waiter was not served within 5 s"))
        .unwrap();
    (seen, got.saturating_duration_since(released))
}

/// `s`'s address as ACL user `user` (password `pw`).
pub fn url_as(s: &RedisServer, user: &str) -> String {
    s.url()
        .replacen("redis://", &format!("redis://{user}:pw@"), 1)
}

/// Every connection's (id, plain subscriptions, shard subscriptions), from CLIENT LIST.
pub fn subscriptions(conn: &mut redis::Connection) -> Vec<(u64, i64, i64)> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    list.lines()
        .map(|line| {
            let field = |k: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(k))
                    .unwrap_or("0")
                    .to_string()
            };
            (
                field("id=").parse().unwrap(),
                field("sub=").parse().unwrap(),
                field("ssub=").parse().unwrap(),
            )
        })
        .collect()
}

pub fn acl(conn: &mut redis::Connection, args: &[&str]) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(args)
        .query(conn)
        .unwrap();
}

/// A plain subscriber of `name`'s channel played on a raw connection
/// (Redisson's waiter subscribes so), holding a mark beside it when `mark` (a stray
/// `SSUBSCRIBE` by another program). Subscribed when this returns.
pub fn observer(s: &RedisServer, name: &str, mark: bool) -> redis::Connection {
    let sends: &[&str] = if mark {
        &["SSUBSCRIBE", "SUBSCRIBE"]
    } else {
        &["SUBSCRIBE"]
    };
    subscribed_raw(s, name, sends)
}

/// A raw connection to `s` that sent each of `sends` for `name`'s channel.
pub fn subscribed_raw(s: &RedisServer, name: &str, sends: &[&str]) -> redis::Connection {
    let mut conn = s.conn();
    let ch = channel_name(name);
    for send in sends {
        let packed = redis::cmd(send).arg(&ch).get_packed_command();
        conn.send_packed_command(&packed).unwrap();
        let _: redis::Value = conn.recv_response().unwrap();
    }
    conn
}

/// The numbers `conn` (an [`observer`]) hears up to the unlock message `0`, within 5 s.
pub fn heard_until_unlock(mut conn: redis::Connection) -> Vec<i64> {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut heard = Vec::new();
    while heard.last() != Some(&0) {
        let Ok(redis::Value::Array(parts)) = conn.recv_response() else {
            panic!("no unlock message within 5 s; heard {heard:?}");
        };
        let payload: String = redis::from_redis_value(parts[2].clone()).unwrap();
        heard.push(payload.parse().unwrap());
    }
    heard
}

/// Whether the turn message heard asks its client to yield (`lua/published.lua`: from
/// 2^49 on); panics without a turn message.
pub fn turn_yields(heard: &[i64]) -> bool {
    let turn = heard
        .iter()
        .find(|n| **n >= 1 << 48)
        .unwrap_or_else(|| panic!("no turn message: {heard:?}"));
    *turn >= 1 << 49
}

/// `holder` (not listening) releases `name` with `waiter`'s waiter first in line,
/// `lingering` (if any) subscribed to the channel without standing in line, and an
/// observer listening (marked when `mark`): whether the turn given to `waiter` yields.
/// The waiter must be served within 1 s of the release either way.
pub async fn release_with_one_in_line(
    s: &RedisServer,
    (holder, waiter, lingering): (&Client, &Client, Option<&Client>),
    name: &str,
    mark: bool,
) -> bool {
    let ch = channel_name(name);
    let obs = observer(s, name, mark);
    let held = holder.lock(name).lock().await.unwrap();
    if let Some(l) = lingering {
        // Gives up in line and lingers on the channel (`timers::LINGER`, 200 ms).
        let gave_up = l
            .lock(name)
            .try_lock_for(Duration::from_millis(20), None)
            .await;
        assert!(gave_up.unwrap().is_none(), "{name}: the lock was held");
    }
    let served = take_and_release(waiter.lock(name));
    lined_up(s, name, waiter.id()).await;
    let listeners = 2 + i64::from(lingering.is_some());
    let all = super::eventually(Duration::from_secs(2), || s.numsub(&ch) == listeners).await;
    assert!(
        all,
        "{name}: {} subscribers, not {listeners}",
        s.numsub(&ch)
    );
    let hearing = tokio::task::spawn_blocking(move || heard_until_unlock(obs));
    let released = Instant::now();
    held.unlock().await.unwrap();
    let heard = hearing.await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(1), served)
        .await
        .unwrap_or_else(|_| panic!("{name}: the waiter was not served within 1 s"))
        .unwrap();
    assert!(got.saturating_duration_since(released) < Duration::from_secs(1));
    turn_yields(&heard)
}

/// Redisson's `lock()` on `name` in a loop for `run`: the acquire script; when busy, a
/// wait for `0`/`1` on the channel or the returned TTL; a 1 ms hold, Redisson's unlock.
/// Returns (times it got the lock, its longest wait).
pub fn redisson_lock_loop(url: &str, name: &str, run: Duration) -> (u64, Duration) {
    use super::redisson_waiter::{acquire, subscribed, unlock};
    let field = "d1b0f1a4-7c2e-4b8a-9f3d-5e6a7b8c9d0e:7";
    subscribed(url, name, |conn, pubsub| {
        let end = Instant::now() + run;
        let (mut got, mut longest, mut req) = (0, Duration::ZERO, 0u64);
        'run: while Instant::now() < end {
            let since = Instant::now();
            while let Some(ttl) = acquire(conn, name, 30_000, field) {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    longest = longest.max(since.elapsed());
                    break 'run;
                }
                let until = Instant::now() + Duration::from_millis(ttl.max(1) as u64).min(left);
                let mut heard = Vec::new();
                super::redisson_waiter::sleep_until_unlock_message(pubsub, until, &mut heard);
            }
            got += 1;
            longest = longest.max(since.elapsed());
            std::thread::sleep(Duration::from_millis(1));
            req += 1;
            assert_eq!(unlock(conn, name, &format!("{req:032x}"), field), Some(1));
            std::thread::sleep(Duration::from_millis(2));
        }
        (got, longest)
    })
}

/// Two clients of `url`, two tasks each, contend for `name` (1 ms holds) while a
/// Redisson `lock()` waiter loops for 3 s: (its wins, its longest wait, the tasks' wins).
pub async fn contend_beside_redisson(
    s: &RedisServer,
    url: &str,
    name: &str,
) -> (u64, Duration, u64) {
    let clients = [
        Client::connect(url).await.unwrap(),
        Client::connect(url).await.unwrap(),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in clients.iter().chain(clients.iter()) {
        let (lock, stop) = (c.lock(name), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && n < 20_000 {
                let g = lock.lock().await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.unlock().await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let (peer_url, peer_name) = (s.url(), name.to_string());
    let peer = tokio::task::spawn_blocking(move || {
        redisson_lock_loop(&peer_url, &peer_name, Duration::from_secs(3))
    });
    let (got, longest) = peer.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut grants = 0;
    for t in tasks {
        grants += t.await.unwrap();
    }
    for c in clients {
        c.shutdown().await.unwrap();
    }
    (got, longest, grants)
}

/// A certificate for 127.0.0.1 signed by its own key (`openssl`), written in `dir`:
/// (certificate, key).
pub fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = (dir.join("c.pem"), dir.join("k.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(made.status.success(), "openssl: {made:?}");
    (cert, key)
}

/// Kills `s`'s subscriber connections while waiters wait and holders release
/// (`adv_marks::killing_the_listener_again_and_again_misses_no_release_and_leaves_no_mark`);
/// `marks`: whether the server takes them.
pub async fn kills_while_waiting(s: RedisServer, marks: bool) {
    let holder = Client::connect(s.url()).await.unwrap();
    let a = Client::connect(s.url()).await.unwrap();
    let b = Client::connect(s.url()).await.unwrap();
    let name = "am:kills";
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (stop, mut conn, with_marks) = (stop.clone(), s.conn(), marks);
        tokio::task::spawn_blocking(move || {
            let (mut kills, mut odd, mut marked, mut tries) = (0u32, Vec::new(), 0u32, 0u64);
            // When each connection was first seen with its counts apart.
            let mut apart: HashMap<u64, Instant> = HashMap::new();
            let end = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                let subs = subscriptions(&mut conn);
                let now = Instant::now();
                marked += u32::from(subs.iter().any(|(_, _, m)| *m > 0));
                // Marked servers: a mark with each plain subscription; others: none.
                let fine = |p: i64, m: i64| if with_marks { p == m } else { m == 0 };
                apart.retain(|id, _| subs.iter().any(|&(i, p, m)| i == *id && !fine(p, m)));
                for &(id, plain, marks) in &subs {
                    if fine(plain, marks) {
                        continue;
                    }
                    let since = *apart.entry(id).or_insert(now);
                    if now - since > Duration::from_millis(150) {
                        odd.push((id, plain, marks));
                    }
                }
                let victim = subs.iter().find(|(_, p, _)| *p > 0).map(|s| s.0);
                tries += 1;
                let by_id = tries % 2 == 1;
                let mut kill = redis::cmd("CLIENT");
                kill.arg("KILL");
                match victim.filter(|_| by_id) {
                    Some(id) => kill.arg("ID").arg(id),
                    None => kill.arg("TYPE").arg("pubsub"),
                };
                let killed: i64 = kill.query(&mut conn).unwrap_or(0);
                kills += u32::from(killed > 0);
                std::thread::sleep(Duration::from_millis(5 + tries % 4 * 10));
            }
            (kills, odd, marked)
        })
    };
    let (mut slowest, mut rounds) = (Duration::ZERO, 0);
    let end = Instant::now() + Duration::from_secs(8);
    while rounds < 150 && Instant::now() < end {
        let held = holder.lock(name).lock().await.unwrap();
        let waiters = [
            take_and_release(a.lock(name)),
            take_and_release(b.lock(name)),
        ];
        // Waiting, listening or not (a kill may have just cut their listener).
        tokio::time::sleep(Duration::from_millis(3 + (rounds % 5) * 4)).await;
        let released = Instant::now();
        held.unlock().await.unwrap();
        for w in waiters {
            let got = tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .unwrap_or_else(|_| panic!("round {rounds}: a waiter not served within 1 s"))
                .unwrap();
            slowest = slowest.max(got.saturating_duration_since(released));
        }
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (kills, odd, marked) = killer.await.unwrap();
    eprintln!(
        "{rounds} rounds, {kills} kills ({marked} with a mark listed), slowest served \
         {slowest:?} after its release"
    );
    assert!(
        rounds >= 20 && kills >= 20,
        "{rounds} rounds, {kills} kills"
    );
    if marks {
        assert!(marked > 0, "no mark was ever listed: the check saw nothing");
    } else {
        assert_eq!(marked, 0, "a server without marks listed one");
    }
    assert!(
        odd.is_empty(),
        "(id, plain, marks) apart for 150 ms: {odd:?}"
    );
    let ch = channel_name(name);
    let mut admin = s.conn();
    let gone = super::eventually(Duration::from_secs(5), || {
        count(&mut admin, "NUMSUB", &ch) == 0 && count(&mut admin, "SHARDNUMSUB", &ch) == 0
    })
    .await;
    assert!(gone, "left on the channel: {:?}", counts(&mut admin, name));
    for c in [holder, a, b] {
        c.shutdown().await.unwrap();
    }
}
