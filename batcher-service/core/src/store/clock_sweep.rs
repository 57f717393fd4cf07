//! CLOCK (second chance) victim choice and key → shard placement, shared by every store
//! that must evict exactly like [`super::CpuStore`] (the GPU store's host mirror decides its
//! device slots with these same functions, so both stores hold the same entries).
//!
//! The slots of one shard are `0..len`, dense; `expired(slot)` says whether the entry is
//! past its TTL and `take_ref(slot)` clears the slot's reference bit and says whether it
//! was set. The hand is the caller's; the caller puts it just past the victim.

use super::index::mix;

/// The slot a full shard reuses, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victim {
    /// An expired entry (counted as an expiration).
    Expired(usize),
    /// A live entry not used since the hand last passed (counted as an eviction).
    Evicted(usize),
}

impl Victim {
    pub fn slot(self) -> usize {
        match self {
            Victim::Expired(s) | Victim::Evicted(s) => s,
        }
    }
}

/// Sweep from `*hand`: an expired entry is taken at once; a referenced one loses its
/// reference and is skipped; the first unreferenced one is evicted. Two sweeps suffice (the
/// first clears every reference bit it passes). `len` must be at least 1.
pub fn clock_victim(
    hand: &mut usize,
    len: usize,
    expired: impl Fn(usize) -> bool,
    mut take_ref: impl FnMut(usize) -> bool,
) -> Victim {
    for _ in 0..=2 * len {
        if *hand >= len {
            *hand = 0;
        }
        let slot = *hand;
        if expired(slot) {
            return Victim::Expired(slot);
        }
        if take_ref(slot) {
            *hand += 1;
            continue;
        }
        return Victim::Evicted(slot);
    }
    Victim::Evicted((*hand).min(len.saturating_sub(1)))
}

/// The shard (of `shards`) that holds `key`.
#[inline]
pub fn shard_of(key: u64, shards: usize) -> usize {
    (mix(key) as u32 as usize) % shards
}

/// Capacity of each of `shards` shards when `capacity` entries are split evenly.
pub fn shard_capacities(capacity: usize, shards: usize) -> Vec<usize> {
    (0..shards)
        .map(|i| capacity / shards + usize::from(i < capacity % shards))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_skips_referenced_then_evicts() {
        let mut refs = [true, false, true];
        let mut hand = 0;
        let v = clock_victim(&mut hand, 3, |_| false, |s| std::mem::take(&mut refs[s]));
        assert_eq!(v, Victim::Evicted(1));
        assert_eq!(refs, [false, false, true]);
        assert_eq!(
            hand, 1,
            "the hand stops on the victim; the caller moves it past"
        );
        hand = 2;
        let v = clock_victim(&mut hand, 3, |s| s == 2, |_| false);
        assert_eq!(v, Victim::Expired(2));
        hand = 3;
        let v = clock_victim(&mut hand, 3, |_| false, |_| false);
        assert_eq!((v, hand), (Victim::Evicted(0), 0), "wraps around");
    }

    #[test]
    fn capacities_sum() {
        let caps = shard_capacities(10, 4);
        assert_eq!(caps, vec![3, 3, 2, 2]);
    }
}
