//! A small TCP proxy on loopback for fault tests: it can add latency, swallow traffic
//! (black hole), cut every live connection, and stall the connections open now: hold
//! back what their clients send, close them on the client's side, and deliver what was
//! held back to the server later (a dead connection's buffer after a partition heals).

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// One proxied connection's stall (see [`Proxy::stall`]).
struct Stall {
    on: AtomicBool,
    held: Mutex<Vec<u8>>,
    /// Set when the client's side is closed: both pumps stop reading from their side.
    closed: watch::Sender<bool>,
    deliver: tokio::sync::Notify,
}

impl Default for Stall {
    fn default() -> Stall {
        Stall {
            on: AtomicBool::new(false),
            held: Mutex::default(),
            closed: watch::channel(false).0,
            deliver: tokio::sync::Notify::new(),
        }
    }
}

/// A running proxy in front of `127.0.0.1:<upstream>`.
pub struct Proxy {
    pub port: u16,
    faults: Arc<Faults>,
    stalls: Arc<Mutex<Vec<Arc<Stall>>>>,
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
        let stalls: Arc<Mutex<Vec<Arc<Stall>>>> = Arc::default();
        let all = stalls.clone();
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
                let stall = Arc::new(Stall::default());
                all.lock().unwrap().push(stall.clone());
                tokio::spawn(pump(
                    cr,
                    sw,
                    f.clone(),
                    cut_rx.clone(),
                    Side::ToServer(stall.clone()),
                ));
                tokio::spawn(pump(
                    sr,
                    cw,
                    f.clone(),
                    cut_rx.clone(),
                    Side::ToClient(stall),
                ));
            }
        });
        Proxy {
            port,
            faults,
            stalls,
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

    /// Stalls every connection open now: what its client sends from now on is held back,
    /// not delivered. Connections opened later are not stalled.
    pub fn stall(&self) {
        for s in self.stalls.lock().unwrap().iter() {
            s.on.store(true, Ordering::SeqCst);
        }
    }

    /// Closes the stalled connections on the client's side only: their clients see the
    /// connection end, while the server's side stays open with nothing delivered yet.
    pub fn close_stalled_clients(&self) {
        for s in self.stalls.lock().unwrap().iter() {
            if s.on.load(Ordering::SeqCst) {
                s.closed.send_replace(true);
            }
        }
    }

    /// Delivers what the stalled connections held back to the server, late.
    pub fn deliver_stalled(&self) {
        for s in self.stalls.lock().unwrap().iter() {
            if s.on.load(Ordering::SeqCst) {
                s.deliver.notify_one();
            }
        }
    }
}

/// Which way a pump carries bytes, with its connection's stall.
enum Side {
    ToServer(Arc<Stall>),
    ToClient(Arc<Stall>),
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
    side: Side,
) {
    // Remember the cut generation at the start, so only later cuts close this connection.
    let generation = *cut.borrow_and_update();
    let mut buf = vec![0u8; 16 * 1024];
    let mut closed_rx = match &side {
        Side::ToClient(s) | Side::ToServer(s) => s.closed.subscribe(),
    };
    let closed = async move {
        let _ = closed_rx.wait_for(|c| *c).await;
    };
    tokio::pin!(closed);
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = cut.changed() => break,
            _ = &mut closed => break,
        };
        if let Side::ToServer(s) = &side {
            if s.on.load(Ordering::SeqCst) {
                s.held.lock().unwrap().extend_from_slice(&buf[..n]);
                continue;
            }
        }
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
    if let Side::ToServer(s) = &side {
        if s.on.load(Ordering::SeqCst) {
            // The client is gone; the server's side waits for what was held back.
            s.deliver.notified().await;
            let held = std::mem::take(&mut *s.held.lock().unwrap());
            let _ = to.write_all(&held).await;
            // Time for the server to run it before it sees the end of the connection.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let _ = to.shutdown().await;
}
