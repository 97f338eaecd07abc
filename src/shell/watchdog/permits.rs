//! Expirable permits held in watchdog mode: the watchdog renews each one's lease in
//! `{<name>}:timeout` while its guard lives, and tells the guard when it is lost.
//!
//! A permit is registered synchronously when its acquire reply arrives and deregistered
//! synchronously when its release starts, before the release is sent, as lock holds
//! are. The renew script (`lua/permit_renew.lua`) only moves the score of an id still in
//! the set with a live lease, so a renewal that lands after a release, or after the lease
//! ran out, revives nothing: a Redisson peer sees only live scores move forward.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::background::Signal;
use crate::error::Result;
use crate::wire::connection::Conn;
use crate::wire::sync_raw::{self, Give, PermitKeys};

use super::BATCH;

/// One watched permit: what its guard and the watchdog share.
pub(crate) struct WatchedPermit {
    pub(crate) name: Arc<str>,
    timeout: Arc<str>,
    channel: Arc<str>,
    pub(crate) id: [u8; 16],
    pub(crate) lost: Signal,
    /// Send time of the last acquire or renewal that Redis confirmed, plus the lease,
    /// on the monotonic clock: it errs early.
    valid_until: Mutex<Instant>,
}

impl WatchedPermit {
    fn extend(&self, until: Instant) {
        let mut v = self.valid_until.lock();
        if until > *v {
            *v = until;
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock()
    }

    pub(crate) fn expired(&self) -> bool {
        self.valid_until() <= Instant::now()
    }
}

/// Permits a guard holds, as shutdown must give them back.
pub(crate) enum Held {
    /// Permits of a plain semaphore: `(name, channel, count)`.
    Count(Arc<str>, Arc<str>, u32),
    /// One expirable permit: `(name, lease set, channel, id)`.
    Expirable(Arc<str>, Arc<str>, Arc<str>, [u8; 16]),
}

/// The permits of one client's live guards, and the watched ones among them by id (ids
/// are random 16 bytes).
#[derive(Default)]
pub(crate) struct Registry {
    map: Mutex<HashMap<[u8; 16], Arc<WatchedPermit>>>,
    held: Mutex<HashMap<u64, Held>>,
    next: AtomicU64,
}

impl Registry {
    /// Records the permits of a new guard; the key its guard gives back with.
    pub(crate) fn hold(&self, held: Held) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.held.lock().insert(key, held);
        key
    }

    /// Forgets the guard `key`; whether it was still there, which makes the caller the
    /// one that gives its permits back (false once shutdown took them).
    pub(crate) fn unhold(&self, key: u64) -> bool {
        self.held.lock().remove(&key).is_some()
    }

    /// Takes every guard's permits, and stops every renewal, for shutdown.
    pub(crate) fn drain(&self) -> Vec<Held> {
        self.map.lock().clear();
        self.held.lock().drain().map(|(_, h)| h).collect()
    }

    pub(crate) fn add(
        &self,
        keys: (&Arc<str>, &Arc<str>, &Arc<str>),
        id: [u8; 16],
        valid_until: Instant,
    ) -> Arc<WatchedPermit> {
        let entry = Arc::new(WatchedPermit {
            name: keys.0.clone(),
            timeout: keys.1.clone(),
            channel: keys.2.clone(),
            id,
            lost: Signal::default(),
            valid_until: Mutex::new(valid_until),
        });
        self.map.lock().insert(id, entry.clone());
        entry
    }

    /// Stops renewing `entry`; whether it was still registered.
    pub(crate) fn remove(&self, entry: &Arc<WatchedPermit>) -> bool {
        let mut map = self.map.lock();
        match map.get(&entry.id) {
            Some(e) if Arc::ptr_eq(e, entry) => {
                map.remove(&entry.id);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn all(&self) -> Vec<Arc<WatchedPermit>> {
        self.map.lock().values().cloned().collect()
    }

    /// Marks `entry` lost and stops renewing it. An entry released meanwhile is not
    /// lost, just finished.
    pub(crate) fn mark_lost(&self, entry: &Arc<WatchedPermit>, why: &'static str) {
        if self.remove(entry) {
            tracing::warn!(semaphore = %entry.name, reason = why, "permit lost while held");
            entry.lost.set();
        }
    }

    /// One renewal of every watched permit: one script call per semaphore and
    /// [`BATCH`] ids, all sent at once.
    pub(crate) async fn renew_all(&self, conn: &Conn, lease: Duration) {
        let mut by_name: HashMap<Arc<str>, Vec<Arc<WatchedPermit>>> = HashMap::new();
        for entry in self.all() {
            if entry.expired() {
                // Renewing it now could not help: a peer may have taken it meanwhile.
                self.mark_lost(&entry, super::EXPIRED);
            } else {
                by_name.entry(entry.name.clone()).or_default().push(entry);
            }
        }
        let batches = by_name
            .values()
            .flat_map(|g| g.chunks(BATCH))
            .map(|chunk| self.renew_batch(conn, lease, chunk));
        futures_util::future::join_all(batches).await;
    }

    async fn renew_batch(&self, conn: &Conn, lease: Duration, chunk: &[Arc<WatchedPermit>]) {
        let Some(first) = chunk.first() else {
            return;
        };
        let keys = PermitKeys {
            name: &first.name,
            timeout: &first.timeout,
            channel: &first.channel,
        };
        let ids: Vec<[u8; 16]> = chunk.iter().map(|e| e.id).collect();
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = Instant::now();
            let err = match sync_raw::permit_renew(conn, &keys, &ids, lease).await {
                Ok(held) => {
                    for (entry, held) in chunk.iter().zip(held) {
                        if held {
                            entry.extend(sent + lease);
                        } else {
                            self.mark_lost(entry, "permit gone from the lease set");
                        }
                    }
                    return;
                }
                Err(e) => e,
            };
            let mut live = 0;
            for entry in chunk {
                if entry.expired() {
                    self.mark_lost(entry, super::EXPIRED);
                } else {
                    live += 1;
                }
            }
            // As for locks: sent again within this period on the connection the driver
            // reopens, else tried again next period.
            let pause = Duration::from_millis(20 * attempt);
            if live == 0
                || !err.is_transient()
                || attempt >= super::RENEW_ATTEMPTS
                || started.elapsed() + pause >= lease / 6
            {
                tracing::warn!(semaphore = %first.name, permits = live, attempt, error = %err, "permit renewal failed; retrying next period");
                return;
            }
            tracing::debug!(semaphore = %first.name, permits = live, attempt, error = %err, "permit renewal failed; retrying now");
            tokio::time::sleep(pause).await;
        }
    }
}

/// Gives back what [`Registry::drain`] took; the first error.
pub(crate) async fn give_back(conn: &Conn, held: Vec<Held>) -> Result<()> {
    let sends = held.iter().map(|h| async move {
        match h {
            Held::Count(name, channel, n) => {
                sync_raw::semaphore_release(conn, name, channel, i64::from(*n), Give::Release)
                    .await
                    .map(|_| ())
            }
            Held::Expirable(name, timeout, channel, id) => {
                let keys = PermitKeys {
                    name,
                    timeout,
                    channel,
                };
                sync_raw::permit_release(conn, &keys, &[*id])
                    .await
                    .map(|_| ())
            }
        }
    });
    let mut first = Ok(());
    for (out, h) in futures_util::future::join_all(sends)
        .await
        .into_iter()
        .zip(&held)
    {
        if let Err(e) = out {
            let name = match h {
                Held::Count(name, ..) | Held::Expirable(name, ..) => name,
            };
            tracing::warn!(semaphore = %name, error = %e, "shutdown could not give permits back");
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}
