//! A redis-server for a benchmark: `REDIS_URL` when set, else one started on a free
//! loopback port (see `tests/common/server_bin.rs` for which binary), killed on drop.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/common/server_bin.rs"]
#[allow(dead_code)]
mod server_bin;

pub struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start_server() -> (String, Option<Server>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (url, None);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bin = server_bin::server_bin();
    let child = Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (url, Some(Server(child)))
}
