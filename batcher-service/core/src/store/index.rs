//! The key → slot index of one store shard: an open-addressing, linear-probing table of
//! `u32` slot numbers (0 = empty, else slot + 1).
//!
//! The keys themselves live only in the shard's slot arrays, so the index costs 4 bytes per
//! bucket; with a load factor kept between 0.53 and 0.8 (growth ×1.5, any table size,
//! Lemire's multiply-shift instead of a power-of-two mask) that is 5–7.5 bytes per entry,
//! against 17+ for a `HashMap<u64, u32>` at the same load. Deletion shifts the following
//! run back (no tombstones), so lookups stay short under churn.

/// Finaliser of splitmix64: a cheap, well-mixed hash of a key (keys may be sequential).
#[inline]
pub(crate) fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Debug, Default)]
pub(crate) struct SlotIndex {
    buckets: Vec<u32>,
}

impl SlotIndex {
    #[inline]
    fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.buckets.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.buckets.len() {
            0
        } else {
            i + 1
        }
    }

    /// Bucket holding `key`, if any.
    fn bucket_of(&self, key: u64, key_of: &impl Fn(u32) -> u64) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mut i = self.home(mix(key));
        loop {
            let b = self.buckets[i];
            if b == 0 {
                return None;
            }
            if key_of(b - 1) == key {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    pub(crate) fn find(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        self.bucket_of(key, &key_of).map(|i| self.buckets[i] - 1)
    }

    /// Make room for `entries` keys (load ≤ 0.8), never sizing past what `max_entries`
    /// needs. Rehashes with `key_of`.
    pub(crate) fn reserve(
        &mut self,
        entries: usize,
        max_entries: usize,
        key_of: impl Fn(u32) -> u64,
    ) {
        let len = self.buckets.len();
        if entries * 5 <= len * 4 && entries < len {
            return;
        }
        let needed = entries + entries / 4 + 1;
        let ceiling = (max_entries + max_entries / 4 + 1).max(needed);
        let grown = (len + len / 2).max(16).max(needed).min(ceiling);
        self.rebuild(grown, key_of);
    }

    /// Give memory back when under a quarter full (to half full), so a store that emptied
    /// does not keep its peak index.
    pub(crate) fn shrink(&mut self, entries: usize, key_of: impl Fn(u32) -> u64) {
        let len = self.buckets.len();
        if len > 64 && entries * 4 < len {
            self.rebuild((entries * 2).max(16), key_of);
        }
    }

    fn rebuild(&mut self, size: usize, key_of: impl Fn(u32) -> u64) {
        let old = std::mem::replace(&mut self.buckets, vec![0; size]);
        for b in old.into_iter().filter(|&b| b != 0) {
            let mut i = self.home(mix(key_of(b - 1)));
            while self.buckets[i] != 0 {
                i = self.next(i);
            }
            self.buckets[i] = b;
        }
    }

    /// Insert a key known to be absent; the caller has reserved room for it.
    pub(crate) fn insert(&mut self, key: u64, slot: u32) {
        if self.buckets.is_empty() || slot == u32::MAX {
            return;
        }
        let mut i = self.home(mix(key));
        while self.buckets[i] != 0 {
            i = self.next(i);
        }
        self.buckets[i] = slot + 1;
    }

    /// Point `key` (present) at a new slot.
    pub(crate) fn repoint(&mut self, key: u64, slot: u32, key_of: impl Fn(u32) -> u64) {
        if let Some(i) = self.bucket_of(key, &key_of) {
            self.buckets[i] = slot + 1;
        }
    }

    /// Remove `key`; returns its slot.
    pub(crate) fn remove(&mut self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        let mut hole = self.bucket_of(key, &key_of)?;
        let slot = self.buckets[hole] - 1;
        let mut j = hole;
        loop {
            j = self.next(j);
            let b = self.buckets[j];
            if b == 0 {
                break;
            }
            let home = self.home(mix(key_of(b - 1)));
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.buckets[hole] = b;
                hole = j;
            }
        }
        self.buckets[hole] = 0;
        Some(slot)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn insert_find_remove_under_churn() {
        // keys[slot] plays the shard's key array; dense, swap-removed like the shard.
        let mut keys: Vec<u64> = Vec::new();
        let mut index = SlotIndex::default();
        let mut model: HashMap<u64, ()> = HashMap::new();
        let mut x = 1u64;
        for step in 0..20_000u32 {
            x = mix(x);
            let key = x % 3000;
            if step % 3 == 2 {
                if let Some(slot) = index.remove(key, |s| keys[s as usize]) {
                    let last = keys.len() - 1;
                    let moved = keys[last];
                    keys.swap_remove(slot as usize);
                    if slot as usize != last {
                        index.repoint(moved, slot, |s| {
                            if s as usize == last {
                                moved
                            } else {
                                keys[s as usize]
                            }
                        });
                    }
                    assert!(model.remove(&key).is_some());
                } else {
                    assert!(!model.contains_key(&key));
                }
            } else if index.find(key, |s| keys[s as usize]).is_none() {
                index.reserve(keys.len() + 1, 4000, |s| keys[s as usize]);
                keys.push(key);
                index.insert(key, (keys.len() - 1) as u32);
                model.insert(key, ());
            }
        }
        for (slot, &key) in keys.iter().enumerate() {
            assert_eq!(index.find(key, |s| keys[s as usize]), Some(slot as u32));
        }
        assert_eq!(keys.len(), model.len());
        assert!(index.bytes() <= (4000 + 4000 / 4 + 1) * 4);
    }
}
