//! Deletes request latches once their request is settled, in batches.
//!
//! Every unlock writes a latch so that a retry of it can replay its outcome; once the
//! call has its answer the latch is garbage. Deleting each one with its own command
//! would add a command (and a task) to every unlock; instead one task per client drains
//! a queue and sends one `DEL` for everything that piled up while the previous `DEL` was
//! in flight. Under light load that is one key per command, under heavy load hundreds.
//! A latch that is never deleted (client gone, Redis down) expires by its own TTL.

use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::connection::Conn;

/// Keys per `DEL` at most.
const BATCH: usize = 256;

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
    while let Some(first) = rx.recv().await {
        let mut keys = vec![first];
        while keys.len() < BATCH {
            match rx.try_recv() {
                Ok(k) => keys.push(k),
                Err(_) => break,
            }
        }
        // On a cluster one DEL may only name keys of one slot.
        for group in conn.group_by_slot(keys, |k| k.as_bytes()) {
            if let Err(e) = conn.query(redis::cmd("DEL").arg(&group)).await {
                tracing::debug!(keys = group.len(), error = %e, "latch cleanup failed; the latches will expire");
            }
        }
    }
}
