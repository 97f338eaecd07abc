//! A small job runner: several worker processes take jobs under per-job locks, run long
//! ones with the watchdog renewing their locks, give a job up the moment its lock is
//! lost, stop gracefully with `shutdown`, and report what their clients did.
//!
//!     cargo run --example job_runner                       # 3 workers, 12 jobs
//!     cargo run --example job_runner -- --workers 4 --jobs 20
//!
//! The first process is the coordinator: it puts the jobs in Redis, starts the workers
//! (copies of itself), waits for them, and checks that every job ran exactly once. Uses
//! `REDIS_URL` when set; otherwise starts a throwaway server (see `examples/demo.rs`).
//! A worker stops on Ctrl-C too, after the job it is running.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis_rlock::{Client, Error};

#[path = "common/throwaway.rs"]
mod throwaway;

/// The jobs to do: a set of ids. A job is done once its id is in the `done` hash.
const JOBS: &str = "jobs:todo";
const DONE: &str = "jobs:done";
/// How many times each job ran (exactly once, or the runner is wrong).
const RUNS: &str = "jobs:runs";
/// The watchdog lease of the workers: short, so that long jobs show renewals.
const LEASE: Duration = Duration::from_secs(2);

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(url) = std::env::var("JOB_RUNNER_WORKER") {
        return worker(&url).await;
    }
    let (url, _server) = throwaway::url_or_start();
    let (workers, jobs) = (arg("--workers", 3), arg("--jobs", 12));
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("DEL")
        .arg(&[JOBS, DONE, RUNS])
        .query_async(&mut conn)
        .await?;
    for id in 0..jobs {
        let _: () = conn.sadd(JOBS, id).await?;
    }
    println!("{jobs} jobs, {workers} worker processes");
    let started = Instant::now();
    let children: Vec<_> = (0..workers)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .env("JOB_RUNNER_WORKER", &url)
                .stdout(Stdio::inherit())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut c in children {
        c.wait()?;
    }
    let runs: std::collections::HashMap<u64, u64> = conn.hgetall(RUNS).await?;
    let once = (0..jobs).filter(|id| runs.get(id) == Some(&1)).count();
    println!(
        "all workers stopped after {:.1} s: {once} of {jobs} jobs ran exactly once",
        started.elapsed().as_secs_f64()
    );
    if once as u64 != jobs {
        return Err(format!("runs per job: {runs:?}").into());
    }
    Ok(())
}

/// One worker process: takes any job whose lock it gets, until every job is done.
async fn worker(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let me = std::process::id();
    // One client per process, shared by everything it runs.
    let client = Client::builder(url).watchdog_timeout(LEASE).build().await?;
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    'work: loop {
        let todo: Vec<u64> = conn.smembers(JOBS).await?;
        let done: Vec<u64> = conn.hkeys(DONE).await?;
        let open: Vec<u64> = todo.into_iter().filter(|j| !done.contains(j)).collect();
        if open.is_empty() {
            break;
        }
        for job in open {
            // A per-job lock: whoever gets it runs the job; the others move on.
            let lock = client.lock(format!("jobs:{job}"));
            let Some(guard) = lock.try_lock().await? else {
                continue;
            };
            // Another worker may have finished it between our look and our lock.
            if conn.hexists(DONE, job).await? {
                guard.unlock().await?;
                continue;
            }
            // Every third job outlives the lease: the watchdog renews its lock.
            let length = if job % 3 == 0 {
                LEASE + Duration::from_secs(1)
            } else {
                Duration::from_millis(300)
            };
            println!("worker {me}: job {job} ({} ms)", length.as_millis());
            tokio::select! {
                _ = tokio::time::sleep(length) => {
                    // Right before the write the lock protects: is it still ours?
                    if guard.is_lost() {
                        println!("worker {me}: lost the lock of job {job}; not marking it done");
                        continue;
                    }
                    let _: () = conn.hset(DONE, job, me).await?;
                    let _: () = conn.hincr(RUNS, job, 1).await?;
                    guard.unlock().await?;
                }
                _ = guard.lost() => {
                    println!("worker {me}: lost the lock of job {job}; abandoned");
                }
                _ = &mut stop => {
                    println!("worker {me}: stopping; job {job} is left for the others");
                    break 'work;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = client.stats();
    // Releases whatever is still held, and stops the client's background tasks.
    match client.shutdown().await {
        Ok(()) | Err(Error::Closed) => {}
        Err(e) => eprintln!("worker {me}: shutdown: {e}"),
    }
    println!(
        "worker {me}: done; {} locks taken, {} busy, {} renewals, {} lost",
        stats.acquisitions, stats.busy, stats.renewals, stats.leases_lost
    );
    Ok(())
}
