//! Deletes request latches once their request is settled, in batches.
//!
//! Partial releases, hand-overs and some acquires write a latch so that a retry can
//! replay their outcome; once the call has its answer the latch is garbage. Deleting each
//! one with its own command would add a command (and a task wake-up) to every such call;
//! instead one task per client gathers keys for [`GATHER`] after the first arrives, then
//! sends one `DEL` for all of them. The gathering window is long on purpose: each wake-up
//! of the task and each `DEL` lands between hand-overs on a contended lock, so fewer of
//! them leave more room for grants (`docs/benchmarks.md`, W3). A latch that is never
//! deleted (client gone, Redis down) expires by its own TTL.

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::background::Background;
use crate::wire::connection::Conn;

/// Keys per `DEL` at most.
const BATCH: usize = 512;

/// How long keys pile up before a `DEL` is sent. Meanwhile the task sleeps, so queueing
/// a key costs no wake-up.
const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

enum Job {
    Delete(String),
    /// Delete what is queued now, without gathering, then say so.
    Flush(oneshot::Sender<()>),
}

pub(crate) struct Janitor {
    queue: mpsc::UnboundedSender<Job>,
}

impl Janitor {
    pub(crate) fn start(conn: Conn, runtime: &Handle, background: &Arc<Background>) -> Janitor {
        let (queue, rx) = mpsc::unbounded_channel();
        background.service(runtime, run(conn, rx));
        Janitor { queue }
    }

    /// Queues `key` for deletion.
    pub(crate) fn discard(&self, key: String) {
        let _ = self.queue.send(Job::Delete(key));
    }

    /// Deletes every latch queued so far. Returns when that was tried (or the janitor is
    /// gone).
    pub(crate) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.queue.send(Job::Flush(done)).is_ok() {
            let _ = flushed.await;
        }
    }
}

async fn run(conn: Conn, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut behind = false;
    while let Some(first) = rx.recv().await {
        let mut keys = Vec::new();
        let mut flushed = Vec::new();
        match first {
            Job::Delete(k) => {
                keys.push(k);
                // After a full batch more are waiting already: no pause then, so
                // deletion keeps up with any rate.
                if !behind {
                    tokio::time::sleep(GATHER).await;
                }
            }
            Job::Flush(done) => flushed.push(done),
        }
        while keys.len() < BATCH {
            match rx.try_recv() {
                Ok(Job::Delete(k)) => keys.push(k),
                Ok(Job::Flush(done)) => flushed.push(done),
                Err(_) => break,
            }
        }
        behind = keys.len() == BATCH;
        // On a cluster one DEL may only name keys of one slot.
        for group in conn.group_by_slot(keys, |k| k.as_bytes()) {
            if let Err(e) = conn.query(redis::cmd("DEL").arg(&group)).await {
                tracing::debug!(keys = group.len(), error = %e, "latch cleanup failed; the latches will expire");
            }
        }
        // The queue is first in, first out: every key queued before a flush that was
        // taken up here is in this batch.
        for done in flushed {
            let _ = done.send(());
        }
    }
}
