//! The read-write lock (Redisson's `RReadWriteLock` layout), on a real redis-server per
//! test.

mod common;

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, RedisServer};
// Redisson's read and write scripts; the peer's holder is `<PEER_ID>:<thread>`.
use common::peer::{
    READ_ACQUIRE as PEER_READ_ACQUIRE, READ_UNLOCK as PEER_READ_UNLOCK,
    WRITE_ACQUIRE as PEER_WRITE_ACQUIRE, WRITE_UNLOCK as PEER_WRITE_UNLOCK,
};
use redis_rlock::{Client, Error, OwnerId};

async fn client(s: &RedisServer) -> Client {
    Client::connect(&s.url()).await.unwrap()
}

async fn client_wd(s: &RedisServer, wd: Duration) -> Client {
    Client::builder(s.url())
        .watchdog_timeout(wd)
        .build()
        .await
        .unwrap()
}

fn keys(s: &RedisServer, pattern: &str) -> Vec<String> {
    s.cmd(&["KEYS", pattern])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_everyone() {
    let s = RedisServer::start();
    let (a, b) = (client(&s).await, client(&s).await);
    let (ra, rb) = (a.read_write_lock("doc"), b.read_write_lock("doc"));

    let r1 = ra.read().try_lock().await.unwrap().expect("first reader");
    let r2 = rb.read().try_lock().await.unwrap().expect("readers share");
    assert_eq!(s.cmd::<String>(&["HGET", "doc", "mode"]), "read");
    // One timeout key per read hold, in Redisson's layout.
    let f1 = r1.holder_field().to_string();
    let t1 = format!("{{doc}}:{f1}:rwlock_timeout:1");
    assert_eq!(s.cmd::<i64>(&["EXISTS", &t1]), 1);
    assert!(!f1.ends_with(":write"));
    // This task holds read locks of both clients: asking either for the write lock is
    // an upgrade. Another task's writer, of either client, waits.
    assert!(matches!(
        rb.write().try_lock().await,
        Err(Error::UpgradeRefused { .. })
    ));
    let (wa, wb) = (ra.write(), rb.write());
    let blocked = tokio::spawn(async move {
        wb.try_lock().await.unwrap().is_none()
            && wa
                .try_lock_for(Duration::from_millis(200), None)
                .await
                .unwrap()
                .is_none()
    });
    assert!(blocked.await.unwrap(), "a writer got in among readers");
    r1.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", &t1]), 0);
    let wa = ra.write();
    let blocked = tokio::spawn(async move { wa.try_lock().await.unwrap().is_none() });
    assert!(blocked.await.unwrap());
    r2.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "doc"]), 0);

    let w = ra
        .write()
        .try_lock()
        .await
        .unwrap()
        .expect("free for a writer");
    assert_eq!(s.cmd::<String>(&["HGET", "doc", "mode"]), "write");
    assert!(w.holder_field().ends_with(":write"));
    assert!(rb.read().try_lock().await.unwrap().is_none());
    assert!(rb.write().try_lock().await.unwrap().is_none());
    // Another owner of the same client is excluded too.
    let other = ra.clone();
    let r = tokio::spawn(async move { other.read().try_lock().await.unwrap().is_none() });
    assert!(
        r.await.unwrap(),
        "another task must not read under a writer"
    );
    w.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "doc"]), 0);
    assert!(keys(&s, "*rwlock_timeout*").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_writers_are_alone_and_readers_overlap() {
    let s = RedisServer::start();
    let clients = [client(&s).await, client(&s).await];
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let max_readers = Arc::new(AtomicI64::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in &clients {
        for i in 0..6 {
            let rw = c.read_write_lock("load");
            let (readers, writers, violations, max_readers, served) = (
                readers.clone(),
                writers.clone(),
                violations.clone(),
                max_readers.clone(),
                served.clone(),
            );
            let write = i < 2;
            tasks.push(tokio::spawn(async move {
                for _ in 0..15 {
                    let lock = if write { rw.write() } else { rw.read() };
                    let g = lock
                        .try_lock_for(Duration::from_secs(20), None)
                        .await
                        .unwrap()
                        .expect("served within 20 s");
                    if write {
                        if writers.fetch_add(1, Ordering::SeqCst) != 0
                            || readers.load(Ordering::SeqCst) != 0
                        {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                    } else {
                        let n = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        max_readers.fetch_max(n, Ordering::SeqCst);
                        if writers.load(Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(4)).await;
                    if write {
                        writers.fetch_sub(1, Ordering::SeqCst);
                    } else {
                        readers.fetch_sub(1, Ordering::SeqCst);
                    }
                    g.unlock().await.unwrap();
                    served.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("load finished")
            .unwrap();
    }
    assert_eq!(served.load(Ordering::SeqCst), 2 * 6 * 15);
    assert_eq!(violations.load(Ordering::SeqCst), 0, "exclusion violated");
    assert!(
        max_readers.load(Ordering::SeqCst) > 1,
        "readers never shared the lock"
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "load"]), 0);
    assert!(keys(&s, "*rwlock_timeout*").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_downgrade_and_upgrade_refused() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let rw = c.read_write_lock("re");

    // Write in write, then read in write (downgrade).
    let w1 = rw.write().lock().await.unwrap();
    let w2 = rw
        .write()
        .lock_with_lease(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(rw.write().hold_count().await.unwrap(), 2);
    let r1 = rw.read().lock().await.unwrap();
    let field = r1.holder_field().to_string();
    assert_eq!(s.cmd::<String>(&["HGET", "re", &field]), "1");
    assert_eq!(s.cmd::<String>(&["HGET", "re", "mode"]), "write");
    w2.unlock().await.unwrap();
    w1.unlock().await.unwrap();
    // The writer's own read hold remains: mode turns read, other readers may enter.
    assert_eq!(s.cmd::<String>(&["HGET", "re", "mode"]), "read");
    let other = rw.clone();
    let shared = tokio::spawn(async move {
        let g = other.read().try_lock().await.unwrap();
        g.is_some()
    });
    assert!(shared.await.unwrap());

    // Read in read, with a fixed lease too: one timeout key per hold in the hash.
    let r2 = rw.read().lock().await.unwrap();
    let r3 = rw
        .read()
        .lock_with_lease(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(rw.read().hold_count().await.unwrap(), 3);

    // Upgrade: refused at once, whatever the call.
    let t = Instant::now();
    let write = rw.write();
    let refused = tokio::time::timeout(Duration::from_secs(2), write.lock());
    match refused
        .await
        .expect("refused at once, not a wait for itself")
    {
        Err(Error::UpgradeRefused { name }) => assert_eq!(name, "re"),
        other => panic!("expected UpgradeRefused, got {other:?}"),
    }
    assert!(matches!(
        rw.write().try_lock_for(Duration::from_secs(5), None).await,
        Err(Error::UpgradeRefused { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(1));
    // Another owner of the client is not refused, it waits.
    let other = rw.clone();
    let waits = tokio::spawn(async move {
        other
            .write()
            .try_lock_for(Duration::from_millis(100), None)
            .await
            .unwrap()
            .is_none()
    });
    assert!(waits.await.unwrap());

    r3.unlock().await.unwrap();
    r2.unlock().await.unwrap();
    r1.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "re"]), 0);
    assert!(keys(&s, "*rwlock_timeout*").is_empty());
    // With no read hold left, the write lock is granted.
    rw.write().lock().await.unwrap().unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_read_lock_and_its_timeout_key() {
    let s = RedisServer::start();
    let wd = Duration::from_secs(1);
    let (c, other) = (client_wd(&s, wd).await, client(&s).await);
    let rw = c.read_write_lock("wd");
    let g = rw.read().lock().await.unwrap();
    let key = format!("{{wd}}:{}:rwlock_timeout:1", g.holder_field());
    tokio::time::sleep(wd * 3 + Duration::from_millis(300)).await;
    assert!(!g.is_lost());
    assert_eq!(s.cmd::<i64>(&["EXISTS", &key]), 1, "timeout key renewed");
    let ttl: i64 = s.cmd(&["PTTL", "wd"]);
    assert!(ttl > 0 && ttl <= 1000, "hash ttl {ttl}");
    assert!(other
        .read_write_lock("wd")
        .write()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    // Another reader's unlock must not find the lock free: the kept timeout key counts.
    let r = other.read_write_lock("wd").read().lock().await.unwrap();
    r.unlock().await.unwrap();
    assert_eq!(s.cmd::<String>(&["HGET", "wd", "mode"]), "read");
    tokio::time::sleep(wd).await;
    assert!(!g.is_lost());
    g.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "wd"]), 0);

    // Loss of a read hold is reported as for a lock.
    let g = rw.read().lock().await.unwrap();
    s.cmd::<i64>(&["DEL", "wd"]);
    tokio::time::timeout(wd * 2, g.lost())
        .await
        .expect("loss reported");
    assert!(matches!(g.unlock().await, Err(Error::LeaseLost { .. })));
}

/// The Redisson peer's client id: a holder field is `<uuid>:<thread id>`, as Redisson's.
const PEER_ID: &str = "5f0c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f";

/// A Redisson client speaking the read-write lock's scripts, holder `<PEER_ID>:<thread>`.
struct Peer {
    conn: redis::aio::MultiplexedConnection,
    name: String,
}

impl Peer {
    async fn new(s: &RedisServer, name: &str) -> Peer {
        let conn = redis::Client::open(s.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Peer {
            conn,
            name: name.to_string(),
        }
    }

    /// `None` when granted, else the PTTL.
    async fn read(&mut self, thread: u32, lease_ms: u64) -> Option<i64> {
        let field = format!("{PEER_ID}:{thread}");
        redis::Script::new(PEER_READ_ACQUIRE)
            .key(&self.name)
            .key(format!("{{{}}}:{field}:rwlock_timeout", self.name))
            .arg(lease_ms)
            .arg(&field)
            .arg(format!("{field}:write"))
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }

    async fn read_unlock(&mut self, thread: u32) -> Option<i64> {
        let field = format!("{PEER_ID}:{thread}");
        redis::Script::new(PEER_READ_UNLOCK)
            .key(&self.name)
            .key(format!("redisson_rwlock:{{{}}}", self.name))
            .key(format!("{{{}}}:{field}:rwlock_timeout", self.name))
            .key(format!("{{{}}}", self.name))
            .arg("0")
            .arg(&field)
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }

    async fn write(&mut self, thread: u32, lease_ms: u64) -> Option<i64> {
        redis::Script::new(PEER_WRITE_ACQUIRE)
            .key(&self.name)
            .arg(lease_ms)
            .arg(format!("{PEER_ID}:{thread}:write"))
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }

    async fn write_unlock(&mut self, thread: u32) -> Option<i64> {
        redis::Script::new(PEER_WRITE_UNLOCK)
            .key(&self.name)
            .key(format!("redisson_rwlock:{{{}}}", self.name))
            .arg("1")
            .arg(30_000)
            .arg(format!("{PEER_ID}:{thread}:write"))
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_a_redisson_peer() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let rw = c.read_write_lock("shared");
    let mut peer = Peer::new(&s, "shared").await;

    // Peer reads; we read too; our writer waits and is woken by the peer's last unlock
    // (the peer's lease is 30 s, so only the message can wake it soon).
    assert_eq!(peer.read(1, 30_000).await, None);
    let r = rw.read().try_lock().await.unwrap().expect("readers share");
    assert!(rw.write().try_lock().await.is_err(), "upgrade refused");
    r.unlock().await.unwrap();
    assert_eq!(s.cmd::<String>(&["HGET", "shared", "mode"]), "read");
    let waiter = {
        let rw = rw.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let g = rw
                .write()
                .try_lock_for(Duration::from_secs(20), None)
                .await
                .unwrap()
                .expect("writer served");
            (g, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    assert_eq!(peer.read_unlock(1).await, Some(1));
    let (w, waited) = waiter.await.unwrap();
    assert!(waited < Duration::from_secs(3), "woken late: {waited:?}");
    // Our writer excludes the peer's readers and writers.
    assert!(peer.read(1, 30_000).await.is_some_and(|t| t > 0));
    assert!(peer.write(2, 30_000).await.is_some_and(|t| t > 0));

    // The peer waits on the channel; our write unlock publishes "1" there.
    let mut sub = redis::Client::open(s.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    sub.subscribe("redisson_rwlock:{shared}").await.unwrap();
    w.unlock().await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), {
        use futures_util::StreamExt;
        let mut stream = sub.on_message();
        async move { stream.next().await.unwrap() }
    })
    .await
    .expect("unlock message");
    assert_eq!(msg.get_payload::<String>().unwrap(), "1");

    // Peer writes; our readers (several, one client) wait and all get in at its unlock.
    assert_eq!(peer.write(2, 30_000).await, None);
    assert_eq!(peer.write(2, 30_000).await, None, "peer re-entry");
    assert!(rw.read().try_lock().await.unwrap().is_none());
    // They are inside together before any leaves: the one message woke all of them.
    let together = Arc::new(tokio::sync::Barrier::new(3));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (rw, together) = (rw.clone(), together.clone());
            tokio::spawn(async move {
                let g = rw
                    .read()
                    .try_lock_for(Duration::from_secs(20), None)
                    .await
                    .unwrap()
                    .expect("reader served");
                let inside = Instant::now();
                tokio::time::timeout(Duration::from_secs(3), together.wait())
                    .await
                    .expect("readers inside together");
                g.unlock().await.unwrap();
                inside
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer.write_unlock(2).await, Some(0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(readers.iter().all(|r| !r.is_finished()));
    let t = Instant::now();
    assert_eq!(peer.write_unlock(2).await, Some(1));
    for r in readers {
        let done = r.await.unwrap();
        assert!(done.duration_since(t) < Duration::from_secs(3));
    }
    assert_eq!(s.cmd::<i64>(&["EXISTS", "shared"]), 0);

    // Peer's downgrade (write then read) keeps our writer out until both are gone.
    assert_eq!(peer.write(3, 30_000).await, None);
    assert_eq!(peer.read(3, 30_000).await, None);
    assert_eq!(peer.write_unlock(3).await, Some(1));
    assert!(rw.write().try_lock().await.unwrap().is_none());
    let r = rw
        .read()
        .try_lock()
        .await
        .unwrap()
        .expect("peer is a reader now");
    r.unlock().await.unwrap();
    assert_eq!(peer.read_unlock(3).await, Some(1));
    rw.write().lock().await.unwrap().unlock().await.unwrap();
    assert!(keys(&s, "*rwlock_timeout*").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_nothing_behind() {
    let s = RedisServer::start();
    let (a, b) = (client(&s).await, client(&s).await);
    let w = a.read_write_lock("gone").write().lock().await.unwrap();
    for write in [false, true] {
        let rw = b.read_write_lock("gone");
        let waiter = tokio::spawn(OwnerId::scope(async move {
            let lock = if write { rw.write() } else { rw.read() };
            lock.lock().await.map(|_| ())
        }));
        assert!(
            eventually(Duration::from_secs(5), || s
                .numsub("redisson_rwlock:{gone}")
                == 1)
            .await
        );
        waiter.abort();
        let _ = waiter.await;
        assert!(
            eventually(Duration::from_secs(5), || s
                .numsub("redisson_rwlock:{gone}")
                == 0)
            .await,
            "subscription dropped with the waiter"
        );
    }
    // Acquires dropped while their request is in flight (writes stall under CLIENT
    // PAUSE): the grants they get when the pause ends are given back.
    w.unlock().await.unwrap();
    for write in [false, true] {
        let _: () = s.cmd(&["CLIENT", "PAUSE", "500", "WRITE"]);
        let rw = b.read_write_lock("gone");
        let t = tokio::spawn(async move {
            let lock = if write { rw.write() } else { rw.read() };
            let g = lock.lock().await.unwrap();
            std::mem::forget(g); // never reached: aborted before the reply
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!t.is_finished());
        t.abort();
        let _ = t.await;
        // The pause ends and the request runs.
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert!(
            eventually(Duration::from_secs(5), || {
                s.cmd::<i64>(&["EXISTS", "gone"]) == 0 && keys(&s, "*rwlock_timeout*").is_empty()
            })
            .await,
            "a hold was left behind (write: {write})"
        );
    }
    a.read_write_lock("gone")
        .write()
        .try_lock()
        .await
        .unwrap()
        .expect("free")
        .unlock()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_half_reports_and_force_unlocks_only_its_own_mode() {
    let s = RedisServer::start();
    let c = redis_rlock::Client::connect(s.url()).await.unwrap();
    let other = redis_rlock::Client::connect(s.url()).await.unwrap();
    let rw = c.read_write_lock("rw:halves");
    let w = rw.write().lock().await.unwrap();
    assert!(rw.write().is_locked().await.unwrap());
    assert!(
        !rw.read().is_locked().await.unwrap(),
        "read half locked by a writer"
    );
    // Forcing the read half leaves a write lock alone.
    assert!(!rw.read().force_unlock().await.unwrap());
    assert_eq!(s.cmd::<i64>(&["EXISTS", "rw:halves"]), 1);
    w.unlock().await.unwrap();
    let r = rw.read().lock().await.unwrap();
    assert!(rw.read().is_locked().await.unwrap());
    assert!(!rw.write().is_locked().await.unwrap());
    assert!(!rw.write().force_unlock().await.unwrap());
    // A writer of another client waits; forcing the read half wakes it.
    let waiter = tokio::spawn({
        let l = other.read_write_lock("rw:halves").write();
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(rw.read().force_unlock().await.unwrap());
    tokio::time::timeout(std::time::Duration::from_secs(3), waiter)
        .await
        .expect("force unlock did not wake the writer")
        .unwrap();
    assert!(
        r.unlock().await.is_err(),
        "the forced read hold still unlocked"
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "rw:halves"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_not_starved_by_readers_that_keep_coming() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..8 {
        let (lock, stop) = (c.read_write_lock("rw:starve").read(), stop.clone());
        readers.push(tokio::spawn(async move {
            // Holds that overlap: the lock never leaves read mode on its own.
            while !stop.load(Ordering::SeqCst) {
                let g = lock.lock().await.unwrap();
                tokio::time::sleep(Duration::from_millis(40)).await;
                g.unlock().await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = client(&s).await;
    let started = Instant::now();
    let w = other
        .read_write_lock("rw:starve")
        .write()
        .try_lock_for(Duration::from_secs(5), None)
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(w.is_some(), "the writer was kept out for 5 s");
    println!("FIGURE writer_waited_ms {}", waited.as_millis());
    // New readers wait for it: it is in once the holds already taken end (40 ms each).
    assert!(
        waited < Duration::from_millis(500),
        "the writer waited {waited:?}"
    );
    w.unwrap().unlock().await.unwrap();
    // A writer that gives up does not keep new readers out after it.
    let g = other
        .read_write_lock("rw:starve")
        .read()
        .lock()
        .await
        .unwrap();
    let gave_up = c
        .read_write_lock("rw:starve")
        .write()
        .try_lock_for(Duration::from_millis(100), None)
        .await
        .unwrap();
    assert!(gave_up.is_none());
    assert!(
        eventually(Duration::from_secs(1), || s.cmd::<i64>(&[
            "EXISTS",
            &redis_rlock::protocol::writer_key("rw:starve")
        ]) == 0)
        .await,
        "the mark of a writer that gave up stayed"
    );
    g.unlock().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .unwrap()
            .unwrap();
    }
}

/// A writer's wait that runs out while its first attempt is on its way: the busy answer
/// that comes later marks a writer waiting; nobody waits, so the mark goes again instead
/// of holding new readers back for its 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_out_of_time_before_its_first_answer_leaves_no_mark() {
    let s = RedisServer::start();
    let reader = client(&s).await;
    let proxy = common::proxy::Proxy::start(s.port).await;
    let slow = Client::connect(proxy.url()).await.unwrap();
    let name = "rw:cut";
    let r = reader.read_write_lock(name).read().lock().await.unwrap();
    proxy.set_latency(Duration::from_millis(150));
    let asked = Instant::now();
    let got = slow
        .read_write_lock(name)
        .write()
        .try_lock_for(Duration::from_millis(30), None)
        .await;
    assert!(asked.elapsed() < Duration::from_millis(140));
    assert!(matches!(got, Ok(None) | Err(Error::Timeout { .. })));
    // The attempt's answer, and what follows it, come meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_latency(Duration::ZERO);
    let mark = redis_rlock::protocol::writer_key(name);
    assert!(
        eventually(Duration::from_secs(1), || s.cmd::<i64>(&["EXISTS", &mark])
            == 0)
        .await,
        "the late busy answer left the writer's mark"
    );
    // So a new reader of this crate is not held back.
    let again = reader
        .read_write_lock(name)
        .read()
        .try_lock_for(Duration::from_millis(200), None)
        .await
        .unwrap()
        .expect("a reader held back by a writer nobody is");
    again.unlock().await.unwrap();
    r.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_also_reads_re_enters_its_write_lock() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let rw = c.read_write_lock("rw:rewrite");
    let w = rw.write().lock().await.unwrap();
    let r = rw.read().lock().await.unwrap();
    let again = rw
        .write()
        .try_lock()
        .await
        .expect("a writer's re-entry is no upgrade")
        .expect("re-entered");
    again.unlock().await.unwrap();
    w.unlock().await.unwrap();
    // Now it only reads: asking for the write lock is an upgrade.
    assert!(matches!(
        rw.write().try_lock().await,
        Err(Error::UpgradeRefused { .. })
    ));
    r.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "rw:rewrite"]), 0);
}

/// A read hold its client found lost (force-unlocked by someone) no longer makes the
/// same task's write lock an upgrade: the write lock is taken, not refused, while the
/// lost read guard still exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_read_hold_does_not_refuse_the_write_lock() {
    let s = RedisServer::start();
    let c = client_wd(&s, Duration::from_millis(600)).await;
    let other = client(&s).await;
    let rw = c.read_write_lock("lost-read");
    let r = rw.read().lock().await.unwrap();
    assert!(matches!(
        rw.write().try_lock().await,
        Err(Error::UpgradeRefused { .. })
    ));
    assert!(other
        .read_write_lock("lost-read")
        .read()
        .force_unlock()
        .await
        .unwrap());
    tokio::time::timeout(Duration::from_secs(3), r.lost())
        .await
        .expect("the watchdog finds the read hold gone");
    let w = rw
        .write()
        .try_lock()
        .await
        .expect("not refused as an upgrade")
        .expect("free");
    assert!(matches!(r.unlock().await, Err(Error::LeaseLost { .. })));
    assert_eq!(s.cmd::<String>(&["HGET", "lost-read", "mode"]), "write");
    w.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "lost-read"]), 0);
}
