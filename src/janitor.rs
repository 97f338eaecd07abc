//! Deletes request latches once their request is settled, in batches.
//!
//! Partial releases, hand-overs and some acquires write a latch so that a retry can
//! replay their outcome; once the call has its answer the latch is garbage. Deleting each
//! one with its own command would add a command (and a task wake-up) to every such call;
//! instead one task per client gathers keys for [`GATHER`] after the first arrives, then
//! sends one `DEL` for all of them: under heavy load, a few `DEL`s of hundreds of keys
//! every 20 ms (gathering for 2 ms cost a quarter of the contended benchmark's grants per
//! second: the waking task and its `DEL` land between the hand-overs). A latch that is
//! never deleted (client gone, Redis down) expires by its own TTL.

use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::connection::Conn;

/// Keys per `DEL` at most.
const BATCH: usize = 512;

/// How long keys pile up before a `DEL` is sent. Meanwhile the task sleeps, so queueing
/// a key costs no wake-up.
const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

pub(crate) struct Janitor {
    queue: mpsc::UnboundedSender<String>,
}

impl Janitor {
    pub(crate) fn start(conn: Conn, runtime: &Handle) -> Janitor {
        let (queue, rx) = mpsc::unbounded_channel();
        runtime.spawn(run(conn, rx));
        Janitor { queue }
    }

    /// Queues `key` for deletion.
    pub(crate) fn discard(&self, key: String) {
        let _ = self.queue.send(key);
    }
}

async fn run(conn: Conn, mut rx: mpsc::UnboundedReceiver<String>) {
    let mut behind = false;
    while let Some(first) = rx.recv().await {
        // After a full batch more are waiting already: no pause then, so deletion keeps
        // up with any rate.
        if !behind {
            tokio::time::sleep(GATHER).await;
        }
        let mut keys = vec![first];
        while keys.len() < BATCH {
            match rx.try_recv() {
                Ok(k) => keys.push(k),
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
    }
}
