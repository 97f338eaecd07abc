//! Adversarial review of issue 26: every synchronizer method over a key of another type
//! answers a typed error (never `Error::Redis`, a panic or a hang), and changes nothing.
//!
//! Run: `cargo test --test wrongtype_all -- --nocapture`

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::{Client, Error};

fn typed(what: &str, e: &Error) -> Option<String> {
    match e {
        Error::Redis(_) | Error::Timeout { .. } => Some(format!("{what}: {e:?}")),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_synchronizer_method_over_a_foreign_key_answers_a_typed_error() {
    let s = RedisServer::start();
    let c = Client::builder(s.url()).build().await.unwrap();
    let mut bad = Vec::new();
    let t = Duration::from_secs(5);
    // Each key of each foreign type, made anew before each call.
    let kinds: [(&str, &[&str]); 4] = [
        ("list", &["RPUSH", "K", "x"]),
        ("hash", &["HSET", "K", "f", "1"]),
        ("zset", &["ZADD", "K", "1", "m"]),
        ("text", &["SET", "K", "abc"]),
    ];
    macro_rules! probe {
        ($label:expr, $key:expr, $call:expr) => {{
            for (kind, make) in kinds.iter() {
                // A sorted set is the lease set's own type.
                if *kind == "zset" && $key.ends_with(":timeout") {
                    continue;
                }
                s.cmd::<i64>(&["DEL", $key]);
                let make: Vec<&str> = make
                    .iter()
                    .map(|a| if *a == "K" { $key } else { a })
                    .collect();
                let _ = s.cmd::<redis::Value>(&make);
                let what = format!("{} on a {kind}", $label);
                match tokio::time::timeout(t, $call).await {
                    Err(_) => bad.push(format!("{what}: hangs")),
                    Ok(Err(e)) => bad.extend(typed(&what, &e)),
                    Ok(Ok(v)) => {
                        let after = s.cmd::<String>(&["TYPE", $key]);
                        if after != *kind && !(after == "string" && *kind == "text") {
                            bad.push(format!("{what}: Ok({v:?}) and the key is now a {after}"));
                        } else {
                            println!("{what}: Ok({v:?}) (key kept)");
                        }
                    }
                }
            }
        }};
    }
    let sem = c.semaphore("ws");
    probe!("semaphore.try_set_permits", "ws", sem.try_set_permits(3));
    probe!("semaphore.try_acquire", "ws", sem.try_acquire(1));
    probe!(
        "semaphore.try_acquire_for",
        "ws",
        sem.try_acquire_for(1, Duration::from_millis(50))
    );
    probe!("semaphore.release", "ws", sem.release(1));
    probe!("semaphore.available_permits", "ws", sem.available_permits());
    probe!("semaphore.drain_permits", "ws", sem.drain_permits());
    probe!("semaphore.add_permits", "ws", sem.add_permits(2));
    probe!("semaphore.delete", "ws", sem.delete());
    let pes = c.permit_expirable_semaphore("wp");
    probe!("permits.try_set_permits", "wp", pes.try_set_permits(3));
    probe!(
        "permits.try_acquire",
        "wp",
        pes.try_acquire(Duration::from_secs(5), Duration::from_millis(50))
    );
    probe!("permits.available_permits", "wp", pes.available_permits());
    probe!(
        "permits.try_release",
        "wp",
        pes.try_release("0123456789abcdef0123456789abcdef")
    );
    probe!(
        "permits.update_lease_time",
        "wp",
        pes.update_lease_time("0123456789abcdef0123456789abcdef", Duration::from_secs(1))
    );
    probe!("permits.delete", "wp", pes.delete());
    // The lease set ({wp}:timeout) of another type, with a good count.
    let tkey = pes.timeout_key().to_string();
    for (label, key) in [("permits lease set", tkey.as_str())] {
        probe!(format!("{label}: try_acquire"), key, async {
            s.cmd::<()>(&["SET", "wp", "3"]);
            pes.try_acquire(Duration::from_secs(5), Duration::from_millis(50))
                .await
        });
        probe!(format!("{label}: available_permits"), key, async {
            s.cmd::<()>(&["SET", "wp", "3"]);
            pes.available_permits().await
        });
    }
    let latch = c.count_down_latch("wl");
    probe!("latch.try_set_count", "wl", latch.try_set_count(2));
    probe!("latch.count_down", "wl", latch.count_down());
    probe!("latch.count", "wl", latch.count());
    probe!(
        "latch.wait_for",
        "wl",
        latch.wait_for(Duration::from_millis(50))
    );
    probe!("latch.delete", "wl", latch.delete());
    let lock = c.lock("wk");
    probe!("lock.try_lock", "wk", async {
        lock.try_lock().await.map(|g| g.is_some())
    });
    probe!("lock.force_unlock", "wk", lock.force_unlock());
    let fair = c.fair_lock("wf");
    probe!("fair.try_lock", "wf", async {
        fair.try_lock().await.map(|g| g.is_some())
    });
    probe!("fair.try_lock_for", "wf", async {
        fair.try_lock_for(Duration::from_millis(50), None)
            .await
            .map(|g| g.is_some())
    });
    let rw = c.read_write_lock("wr");
    probe!("read.try_lock", "wr", async {
        rw.read().try_lock().await.map(|g| g.is_some())
    });
    probe!("write.try_lock", "wr", async {
        rw.write().try_lock().await.map(|g| g.is_some())
    });
    probe!("rw.force_unlock", "wr", rw.write().force_unlock());
    assert!(
        bad.is_empty(),
        "untyped, hanging or destructive:\n{}",
        bad.join("\n")
    );
}
