//! Fixed-lease holds a client has taken in Redis.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::watchdog::SlotKey;

/// Fixed-lease holds this client has taken in Redis, per `(name, holder field)`. With
/// the watchdog's registry it tells whether an acquire is the holder's first, which
/// decides whether the acquire script must latch the request (`lua/acquire.lua`).
#[derive(Default)]
pub(crate) struct FixedHolds {
    counts: Mutex<HashMap<SlotKey, u32>>,
}

impl FixedHolds {
    pub(crate) fn add(&self, name: &Arc<str>, field: &Arc<str>) {
        *self
            .counts
            .lock()
            .entry((name.clone(), field.clone()))
            .or_insert(0) += 1;
    }

    pub(crate) fn remove(&self, name: &Arc<str>, field: &Arc<str>) {
        let mut counts = self.counts.lock();
        let key = (name.clone(), field.clone());
        if let Some(n) = counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&key);
            }
        }
    }

    pub(crate) fn holds(&self, name: &Arc<str>, field: &Arc<str>) -> bool {
        self.counts
            .lock()
            .contains_key(&(name.clone(), field.clone()))
    }

    /// Forgets every hold (the client shuts down); returns their `(name, field)`.
    pub(crate) fn drain(&self) -> Vec<SlotKey> {
        self.counts.lock().drain().map(|(key, _)| key).collect()
    }
}
