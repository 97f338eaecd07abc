//! The names with an entry in the table, and a few emptied entries kept for the next
//! names: an uncontended lock and unlock empties its name's entry about three times, and
//! making its maps anew each time was 1% of the client's instructions per pair.

use std::collections::HashMap;
use std::sync::Arc;

use super::Entry;
use crate::hash::Seeded;
use crate::state::queue::Queue;

/// Emptied entries kept: memory for a few names, whatever the number of names used.
const SPARE_ENTRIES: usize = 8;

/// The most holder fields an emptied entry's map may have room for and be kept.
const SPARE_CAPACITY: usize = 16;

#[derive(Default)]
pub(super) struct Names {
    pub(super) map: HashMap<Arc<str>, Entry, Seeded>,
    pub(super) spare: Vec<Entry>,
}

impl Names {
    /// Keeps `e`, an entry found empty and removed, as a spare.
    pub(super) fn spare_from(&mut self, e: Entry) {
        // An entry whose map grew large (thousands of readers, say) gives its memory
        // back instead.
        if self.spare.len() < SPARE_ENTRIES && e.holders.capacity() <= SPARE_CAPACITY {
            self.spare.push(e.recycle());
        }
    }
}

impl Entry {
    /// An empty entry made as new, its holders map's memory kept.
    fn recycle(mut self) -> Entry {
        self.holders.clear();
        Entry {
            holders: self.holders,
            queue: Queue::default(),
            in_line: 0,
            placed: false,
        }
    }
}

impl std::ops::Deref for Names {
    type Target = HashMap<Arc<str>, Entry, Seeded>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for Names {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}
