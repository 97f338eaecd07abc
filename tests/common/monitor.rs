//! A thread reading `MONITOR` of a test's server: how `tests/names.rs` counts the names a
//! lock touches and `tests/adv_yield.rs` counts turn messages.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::RedisServer;

/// Starts `MONITOR` on `s` (checked answered `+OK` before this returns), then on a thread
/// hands each line to `on_line` with `state`, until `stop` is set, the server closes the
/// connection, or `limit` passes (bounded). The thread's result is `state`.
pub fn monitor<T, F>(
    s: &RedisServer,
    stop: Arc<AtomicBool>,
    limit: Duration,
    state: T,
    mut on_line: F,
) -> std::thread::JoinHandle<T>
where
    T: Send + 'static,
    F: FnMut(&mut T, &str) + Send + 'static,
{
    let mut tcp = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    tcp.write_all(b"MONITOR\r\n").unwrap();
    // Short reads, so that `stop` is seen soon on a quiet server.
    tcp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut lines = BufReader::new(tcp);
    let mut first = String::new();
    lines.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "+OK");
    std::thread::spawn(move || {
        let mut state = state;
        let mut line = String::new();
        let until = Instant::now() + limit;
        while Instant::now() < until {
            line.clear();
            match lines.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) => on_line(&mut state, &line),
                Err(_) if stop.load(Ordering::SeqCst) => break,
                Err(_) => {}
            }
        }
        state
    })
}
