//! A small TCP proxy on loopback for fault tests: it can add latency, swallow traffic
//! (black hole), and cut every live connection.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Default)]
struct Faults {
    latency_ms: AtomicU64,
    blackhole: AtomicBool,
}

/// A running proxy in front of `127.0.0.1:<upstream>`.
pub struct Proxy {
    pub port: u16,
    faults: Arc<Faults>,
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Faults::default());
        let (cuts, cut_rx) = watch::channel(0u64);
        let f = faults.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, f.clone(), cut_rx.clone()));
                tokio::spawn(pump(sr, cw, f.clone(), cut_rx.clone()));
            }
        });
        Proxy {
            port,
            faults,
            cuts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Delay added to every chunk, each direction.
    pub fn set_latency(&self, d: Duration) {
        self.faults
            .latency_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Adds `latency` now and takes it away after `lift_after`; the handle finishes once
    /// it is gone. For a request whose reply must come too late while its retry does not.
    pub fn delay_for(
        self: &Arc<Self>,
        latency: Duration,
        lift_after: Duration,
    ) -> tokio::task::JoinHandle<()> {
        self.set_latency(latency);
        let proxy = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(lift_after).await;
            proxy.set_latency(Duration::ZERO);
        })
    }

    /// While on, bytes are held back (connections stay open but silent).
    pub fn set_blackhole(&self, on: bool) {
        self.faults.blackhole.store(on, Ordering::SeqCst);
    }

    /// Closes every connection open now.
    pub fn cut(&self) {
        self.cuts.send_modify(|g| *g += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    f: Arc<Faults>,
    mut cut: watch::Receiver<u64>,
) {
    // Remember the cut generation at the start, so only later cuts close this connection.
    let generation = *cut.borrow_and_update();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = cut.changed() => break,
        };
        let lat = f.latency_ms.load(Ordering::SeqCst);
        if lat > 0 {
            tokio::time::sleep(Duration::from_millis(lat)).await;
        }
        while f.blackhole.load(Ordering::SeqCst) {
            if *cut.borrow() != generation {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if *cut.borrow() != generation || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
