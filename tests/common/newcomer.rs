//! What the newcomers' programs (`tests/newuser2.rs`, `tests/newuser2_contended.rs`,
//! `tests/newuser3.rs`) set up alike: clients of the test server, a waiter of another
//! client timed from its call, the lock's hash gone, and a fenced lock's tokens.

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
