//! Running the `rlock` binary from the CLI tests.
#![allow(dead_code)]

use std::process::{Command, Output};

/// `rlock --url URL ARGS...`, run to its end.
pub fn rlock(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlock"))
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("the rlock binary runs")
}

/// The same, off the runtime's threads.
pub async fn rlock_async(url: String, args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        rlock(&url, &args)
    })
    .await
    .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
