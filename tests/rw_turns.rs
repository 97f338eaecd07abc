//! The read-write lock's marks and turns on a real redis-server: the two bounded-bypass
//! findings of issue 25's family checker (`tests/family_check.rs`), each played with a
//! waiter whose client sits behind a slow proxy, so that it asks again well after the
//! message that woke it. Another client meanwhile does what the checker's trace did.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, proxy::Proxy, RedisServer};
use redis_rlock::protocol::{reader_key, writer_key};
use redis_rlock::Client;

/// How late the slow waiter hears anything, each way.
const LATENCY: Duration = Duration::from_millis(150);

async fn client(s: &RedisServer) -> Client {
    Client::connect(&s.url()).await.unwrap()
}

/// A client whose every byte takes [`LATENCY`] each way.
async fn slow(proxy: &Proxy) -> Client {
    let c = Client::connect(proxy.url()).await.unwrap();
    proxy.set_latency(LATENCY);
    c
}

/// Finding A: a writer's unlock that finds a reader waiting starts the readers' turn;
/// another reader comes in on that turn and leaves before the woken reader has asked.
/// The turn was ended by that reader's unlock, and the writer took the lock again,
/// passing the waiting reader (as often as it liked). Now the turn names the reader it
/// was made for and outlasts the other reader: the writer is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_leaves_the_turn_does_not_end_it_for_a_woken_reader() {
    let s = RedisServer::start();
    let fast = client(&s).await;
    let proxy = Proxy::start(s.port).await;
    let slow = slow(&proxy).await;
    let name = "rw:turn";
    let rw = fast.read_write_lock(name);
    // The turn lasts 50 ms at most: a round slower than that (a loaded machine) proves
    // nothing either way and is played again.
    for round in 0..5 {
        let w = rw.write().lock().await.unwrap();
        let waiting = slow.read_write_lock(name).read();
        let reader = tokio::spawn(async move {
            let g = waiting.try_lock_for(Duration::from_secs(5), None).await;
            g.unwrap().map(|g| (g, Instant::now()))
        });
        assert!(
            eventually(Duration::from_secs(2), || s
                .cmd::<i64>(&["EXISTS", &reader_key(name)])
                == 1)
            .await,
            "the slow reader never waited"
        );
        w.unlock().await.unwrap();
        let unlocked = Instant::now();
        let other = rw
            .read()
            .try_lock()
            .await
            .unwrap()
            .expect("the readers' turn");
        other.unlock().await.unwrap();
        let again = rw.write().try_lock().await.unwrap();
        let quick = unlocked.elapsed() < Duration::from_millis(40);
        let passed = again.is_some();
        if let Some(g) = again {
            g.unlock().await.unwrap();
        }
        let (g, granted) = tokio::time::timeout(Duration::from_secs(6), reader)
            .await
            .expect("the slow reader's wait ends")
            .unwrap()
            .expect("the slow reader gets the lock");
        assert!(granted.duration_since(unlocked) >= 2 * LATENCY);
        g.unlock().await.unwrap();
        if quick {
            assert!(
                !passed,
                "round {round}: a writer took the lock while the readers' turn still \
                 waited for a woken reader"
            );
            return;
        }
        assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0);
    }
    panic!("no round was quick enough to judge");
}

/// Finding B: the writers' mark was one key for all writers, and a writer's grant
/// deleted it while another writer still waited; a new reader then passed that writer
/// before it asked again. Now each writer has its own mark: the reader is refused, and
/// the waiting writer is in before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_grant_keeps_another_waiting_writers_mark() {
    let s = RedisServer::start();
    let fast = client(&s).await;
    let proxy = Proxy::start(s.port).await;
    let slow = slow(&proxy).await;
    let name = "rw:marks";
    let rw = fast.read_write_lock(name);
    let w = rw.write().lock().await.unwrap();
    let waiting = slow.read_write_lock(name).write();
    let writer = tokio::spawn(async move {
        let g = waiting.try_lock_for(Duration::from_secs(5), None).await;
        g.unwrap().map(|g| (g, Instant::now()))
    });
    assert!(
        eventually(Duration::from_secs(2), || s
            .cmd::<i64>(&["EXISTS", &writer_key(name)])
            == 1)
        .await,
        "the slow writer never waited"
    );
    w.unlock().await.unwrap();
    // The woken writer asks again only after two latencies: this one is in first.
    let w = rw.write().try_lock().await.unwrap().expect("a free lock");
    w.unlock().await.unwrap();
    let reader = rw.read().try_lock().await.unwrap();
    let passed = reader.is_some();
    if let Some(g) = reader {
        g.unlock().await.unwrap();
    }
    assert!(
        !passed,
        "a new reader passed a writer whose mark another writer's grant cleared"
    );
    let (g, _) = tokio::time::timeout(Duration::from_secs(6), writer)
        .await
        .expect("the slow writer's wait ends")
        .unwrap()
        .expect("the slow writer gets the lock");
    g.unlock().await.unwrap();
    let r = rw
        .read()
        .try_lock_for(Duration::from_secs(2), None)
        .await
        .unwrap()
        .expect("readers get in once nobody waits");
    r.unlock().await.unwrap();
}
