//! What the newcomers' programs (`tests/newuser2.rs`, `tests/newuser2_contended.rs`,
//! `tests/newuser3.rs`, `tests/newuser4.rs`, `tests/newuser4_again.rs`) set up alike:
//! clients of the test server, a waiter of another client timed from its call, the
//! lock's hash gone, a fenced lock's tokens, and what a client left in Redis.

use std::time::{Duration, Instant};

use redis_rlock::{Client, Lock};

use super::RedisServer;

/// Two clients of `s` with the default settings.
pub async fn connect_two(s: &RedisServer) -> (Client, Client) {
    let a = Client::connect(s.url()).await.unwrap();
    let b = Client::connect(s.url()).await.unwrap();
    (a, b)
}

/// A client of `s` with this watchdog timeout and a 500 ms response timeout.
pub async fn watchdog_client(s: &RedisServer, wd: Duration) -> Client {
    super::client_with(&s.url(), wd, Duration::from_millis(500)).await
}

/// Shuts the clients down in order; a failed shutdown fails the test.
pub async fn shut_down(clients: &[&Client]) {
    for c in clients {
        c.shutdown().await.unwrap();
    }
}

/// A task that waits for `lock`, releases it at once, and returns how long it waited.
pub fn timed_waiter(lock: Lock) -> tokio::task::JoinHandle<Duration> {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let g = lock.lock().await.unwrap();
        let waited = t0.elapsed();
        g.unlock().await.unwrap();
        waited
    })
}

/// Whether the hash of `name` is gone within 2 s (polled every 10 ms).
pub async fn gone_soon(s: &RedisServer, name: &str) -> bool {
    super::eventually(Duration::from_secs(2), || {
        s.cmd::<i64>(&["EXISTS", name]) == 0
    })
    .await
}

/// Takes `fenced` twice in a row: the second token is above the first.
pub async fn tokens_grow(fenced: &Lock) {
    let g = fenced.lock().await.unwrap();
    let first = g.fencing_token().expect("a fenced guard has a token");
    g.unlock().await.unwrap();
    let g = fenced.lock().await.unwrap();
    assert!(g.fencing_token().unwrap() > first, "tokens grow");
    g.unlock().await.unwrap();
}

/// Every key on the server with its PTTL and every member it holds (hash fields, list,
/// set and sorted set members, a string's value), one string per key.
pub fn dump(s: &RedisServer) -> Vec<(String, i64, String)> {
    const DUMP: &str = "local out = {} \
        for _, k in ipairs(redis.call('keys', '*')) do \
          local t = redis.call('type', k).ok local m = {} \
          if t == 'hash' then m = redis.call('hkeys', k) \
          elseif t == 'list' then m = redis.call('lrange', k, 0, -1) \
          elseif t == 'zset' then m = redis.call('zrange', k, 0, -1) \
          elseif t == 'set' then m = redis.call('smembers', k) \
          elseif t == 'string' then m = {redis.call('get', k)} end \
          table.insert(out, {k, redis.call('pttl', k), table.concat(m, ' ')}) \
        end return out";
    s.cmd(&["EVAL", DUMP, "0"])
}

/// The keys that name `client` (its id in the key or among its members), and the keys
/// without a TTL; both empty once the client left nothing behind.
pub fn left_behind(s: &RedisServer, client: &str) -> (Vec<String>, Vec<String>) {
    let all = dump(s);
    let named = all
        .iter()
        .filter(|(k, _, m)| k.contains(client) || m.contains(client))
        .map(|(k, p, m)| format!("{k} (PTTL {p}): {m}"))
        .collect();
    // A fenced lock's token counter is kept forever, as Redisson keeps it.
    let forever = all
        .iter()
        .filter(|(k, p, _)| *p == -1 && !k.starts_with("redisson_lock_token:"))
        .map(|(k, _, m)| format!("{k}: {m}"))
        .collect();
    (named, forever)
}

/// Waits up to `limit` until nothing on the server names `client` and every key has a
/// TTL; fails with what is left otherwise.
pub async fn nothing_left(s: &RedisServer, client: &str, limit: Duration, what: &str) {
    let clean = super::eventually(limit, || left_behind(s, client) == (vec![], vec![])).await;
    let (named, forever) = left_behind(s, client);
    assert!(
        clean,
        "{what}: after {limit:?}, keys naming the client: {named:?}; keys without a TTL: {forever:?}"
    );
}
