//! The hash of the client's maps (the table's, the waiter queues' and the pub/sub hub's).
//! Their keys are lock names, holder fields and channels, hashed several times per lock
//! call: with the standard SipHash that was about 5% of a client's instructions per lock
//! and unlock. This one folds each 8 bytes into the state with one 128-bit multiply, from
//! a seed drawn per process (so that names chosen to collide cannot be found ahead of
//! time, as with the standard hasher's random keys).

use std::hash::{BuildHasher, Hasher};

/// Multiplier of the fold: the 64-bit golden ratio, odd, with well-spread bits.
const K: u64 = 0x9e37_79b9_7f4a_7c15;

fn fold(x: u64) -> u64 {
    let m = u128::from(x) * u128::from(K);
    (m as u64) ^ ((m >> 64) as u64)
}

/// The last 0 to 7 bytes of a key as a little-endian word, zero-padded, read in at
/// most two loads: copied into a buffer, each key's tail was a call to `memcpy`.
fn tail(rest: &[u8]) -> u64 {
    let n = rest.len();
    let le = |b: &[u8]| u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes")));
    match n {
        0 => 0,
        // Three bytes, the middle one counted twice where n is 1 or 2, each at its place.
        1..=3 => {
            u64::from(rest[0])
                | u64::from(rest[n / 2]) << (8 * (n / 2))
                | u64::from(rest[n - 1]) << (8 * (n - 1))
        }
        // Two overlapping words; the bytes both hold land at the same place.
        _ => le(&rest[..4]) | le(&rest[n - 4..]) << (8 * (n - 4)),
    }
}

/// Builds [`Folding`] hashers from one random seed.
#[derive(Clone)]
pub(crate) struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Seeded {
        static SEED: once_cell::sync::Lazy<u64> = once_cell::sync::Lazy::new(|| {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
        Seeded(*SEED)
    }
}

impl BuildHasher for Seeded {
    type Hasher = Folding;

    fn build_hasher(&self) -> Folding {
        Folding(self.0)
    }
}

/// A hasher that folds its input 8 bytes at a time.
pub(crate) struct Folding(u64);

impl Hasher for Folding {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            h = fold(h ^ u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        // The length tells "ab" from "ab\0"; the fold spreads it over the word.
        h = fold(h ^ tail(words.remainder()) ^ ((bytes.len() as u64) << 56));
        self.0 = h;
    }

    // What `write(&[i])` gives, without the slice: each `str` key ends with one byte,
    // which through `write` cost about as much as the key.
    fn write_u8(&mut self, i: u8) {
        self.0 = fold(self.0 ^ u64::from(i) ^ (1 << 56));
    }

    fn finish(&self) -> u64 {
        fold(self.0 ^ K)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(s: &str) -> u64 {
        Seeded::default().hash_one(s)
    }

    #[test]
    fn equal_keys_hash_alike_and_near_keys_apart() {
        assert_eq!(hash("orders:42"), hash("orders:42"));
        let near = [
            "orders:42",
            "orders:43",
            "orders:4",
            "orders:42\0",
            "",
            "\0",
            "a",
            "b",
        ];
        let mut seen = std::collections::HashSet::new();
        for k in near {
            assert!(seen.insert(hash(k)), "{k:?} collided");
        }
    }

    #[test]
    fn a_tail_reads_as_its_bytes_zero_padded() {
        let bytes = [0x11u8, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77];
        for n in 0..8 {
            let mut padded = [0u8; 8];
            padded[..n].copy_from_slice(&bytes[..n]);
            assert_eq!(tail(&bytes[..n]), u64::from_le_bytes(padded), "{n} bytes");
        }
    }

    #[test]
    fn a_map_with_this_hash_finds_what_it_holds() {
        let mut m: std::collections::HashMap<String, usize, Seeded> = Default::default();
        for i in 0..10_000 {
            m.insert(format!("f-{i}:task-{}", i * 7), i);
        }
        for i in 0..10_000 {
            assert_eq!(m[&format!("f-{i}:task-{}", i * 7)], i);
        }
    }
}
