//! A throwaway redis-server for the examples: `REDIS_URL` when set; otherwise a server
//! started on a free loopback port (`REDIS_SERVER`, `redis-server` or `valkey-server` on
//! the PATH, or a Valkey fetched once into `target/valkey/`, see
//! `tests/common/server_bin.rs`) and stopped when the returned guard is dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/common/server_bin.rs"]
#[allow(dead_code)]
mod server_bin;

/// A redis-server started for this demo, killed on drop.
pub struct Throwaway {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_redis() -> Result<(String, Throwaway), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let dir = std::env::temp_dir().join(format!("rlock-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let bin = std::panic::catch_unwind(server_bin::server_bin).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "no server binary".into())
    })?;
    let child = Command::new(&bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}; or set REDIS_URL to a running Redis"))?;
    let server = Throwaway { child, dir };
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!("{bin} did not start within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok((format!("redis://127.0.0.1:{port}"), server))
}

/// The URL to use, and the server started for it (if one was); exits with a message
/// when there is neither.
pub fn url_or_start() -> (String, Option<Throwaway>) {
    match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => match start_redis() {
            Ok((url, s)) => {
                println!("started a throwaway server at {url}");
                (url, Some(s))
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        },
    }
}
