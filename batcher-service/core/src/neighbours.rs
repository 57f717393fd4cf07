//! Where semantically similar requests went: the recent members of each cohort, so a
//! decision can ask the fingerprint store for a request's nearest past fingerprints, and
//! the replicas that served them, without scanning the whole store.
//!
//! # An inverted file whose lists are the cohorts
//! The fingerprint store holds up to millions of fingerprints (key, sketch, tenant,
//! cohort, replica). An exact nearest-neighbour scan of a million sketches costs about
//! 3.6 ms on one core (docs/GPU-STORE.md), too slow for an Assign. But every stored
//! fingerprint already belongs to a cohort, and a cohort's centroid is what the Assign
//! searches first ([`crate::cohorts`]). So the cohorts are the coarse quantiser of an
//! inverted file (IVF): this module keeps, per cohort, the keys of its most recent
//! members (at most [`Neighbours::per_cohort`], newest first), maintained incrementally on
//! every observation. A query probes the lists of the request's nearest cohorts (the
//! centroid search's candidates, above the threshold or not) and the store re-ranks those
//! keys exactly ([`crate::store::Store::top_k_among`]). The cost is bounded by
//! probes × per_cohort look-ups whatever the store holds.
//!
//! The lists keep only the most recent members on purpose: routing wants to know where
//! similar requests went *lately*, because that is where their prefix may still be cached;
//! a member from an hour ago says little about a replica's cache now.
//!
//! # The vote
//! [`vote`] turns the nearest hits into one replica: the hits at or above the similarity
//! floor (cosine, from the int8 scores and the norms) vote with their score for the
//! replica that served them; the most voted wins, ties to the smaller index. Hits whose
//! replica is unknown (not chosen by this batcher) do not vote.
//!
//! Pure: no I/O, no clock; bounded memory (cohorts × per_cohort keys).

use crate::store::{Hit, SketchBytes};
use std::collections::{HashMap, VecDeque};

/// Default of the number of recent members kept per cohort.
pub const DEFAULT_PER_COHORT: usize = 16;

/// The recent members of each cohort (see the module doc).
#[derive(Debug)]
pub struct Neighbours {
    per_cohort: usize,
    max_cohorts: usize,
    lists: HashMap<u32, VecDeque<u64>>,
}

impl Neighbours {
    /// Lists of at most `per_cohort` keys for at most `max_cohorts` cohorts (beyond, a new
    /// cohort's members are not recorded until [`Neighbours::retain`] frees room).
    pub fn new(per_cohort: usize, max_cohorts: usize) -> Neighbours {
        Neighbours {
            per_cohort,
            max_cohorts,
            lists: HashMap::new(),
        }
    }

    pub fn per_cohort(&self) -> usize {
        self.per_cohort
    }

    /// Number of cohorts with a list.
    pub fn cohorts(&self) -> usize {
        self.lists.len()
    }

    /// Record that `key` (a fingerprint in the store) joined `cohort`: it becomes the
    /// list's newest member (moved to the front when already there), and the oldest
    /// beyond `per_cohort` is dropped.
    pub fn record(&mut self, cohort: u32, key: u64) {
        if self.per_cohort == 0 {
            return;
        }
        let full = self.lists.len() >= self.max_cohorts;
        let list = match self.lists.get_mut(&cohort) {
            Some(list) => list,
            None if full => return,
            None => self.lists.entry(cohort).or_default(),
        };
        if let Some(at) = list.iter().position(|&k| k == key) {
            list.remove(at);
        }
        list.push_front(key);
        list.truncate(self.per_cohort);
    }

    /// The keys of the lists of `cohorts` (newest first within each list), the candidates
    /// a store re-ranks.
    pub fn candidates(&self, cohorts: &[u32]) -> Vec<u64> {
        cohorts
            .iter()
            .filter_map(|c| self.lists.get(c))
            .flatten()
            .copied()
            .collect()
    }

    /// Keep the lists of the cohorts `live` says are still alive (the others expired).
    pub fn retain(&mut self, mut live: impl FnMut(u32) -> bool) {
        self.lists.retain(|&cohort, _| live(cohort));
    }
}

/// Cosine of two int8 vectors from their dot product.
fn cosine(score: i32, a: &SketchBytes, b: &SketchBytes) -> f32 {
    let norm = |v: &SketchBytes| {
        v.iter()
            .map(|&x| f32::from(x) * f32::from(x))
            .sum::<f32>()
            .sqrt()
    };
    let n = norm(a) * norm(b);
    if n > 0.0 {
        score as f32 / n
    } else {
        0.0
    }
}

/// The replica most of the similar past requests went to (see the module doc): the hits
/// (with their sketches, as [`crate::store::Store::top_k_among`] answers) at cosine ≥ `floor` to `query` vote with their
/// score for `hit.meta.replica` when it is below `replicas`. `None` when no hit votes.
pub fn vote(
    query: &SketchBytes,
    hits: &[(Hit, SketchBytes)],
    floor: f32,
    replicas: usize,
) -> Option<usize> {
    let mut votes = vec![0i64; replicas];
    let mut any = false;
    for (hit, sketch) in hits {
        let replica = usize::from(hit.meta.replica);
        if replica < replicas && cosine(hit.score, query, sketch) >= floor {
            votes[replica] += i64::from(hit.score.max(1));
            any = true;
        }
    }
    if !any {
        return None;
    }
    let best = votes.iter().copied().max()?;
    votes.iter().position(|&v| v == best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EntryMeta;

    fn hit(key: u64, score: i32, replica: u16) -> Hit {
        Hit {
            key,
            score,
            meta: EntryMeta {
                tenant: 1,
                cohort: 1,
                replica,
                expires_at_s: 100,
            },
        }
    }

    #[test]
    fn lists_keep_the_newest_members_once_each() {
        let mut n = Neighbours::new(3, 10);
        for key in [1, 2, 3, 2, 4] {
            n.record(7, key);
        }
        assert_eq!(n.candidates(&[7]), vec![4, 2, 3]);
        n.record(8, 9);
        assert_eq!(n.candidates(&[8, 7, 99]), vec![9, 4, 2, 3]);
        n.retain(|c| c == 8);
        assert_eq!(n.candidates(&[7, 8]), vec![9]);
    }

    #[test]
    fn cohorts_beyond_the_bound_are_not_recorded_and_zero_keeps_nothing() {
        let mut n = Neighbours::new(2, 1);
        n.record(1, 10);
        n.record(2, 20);
        n.record(1, 11);
        assert_eq!(n.cohorts(), 1);
        assert_eq!(n.candidates(&[1, 2]), vec![11, 10]);
        let mut off = Neighbours::new(0, 10);
        off.record(1, 10);
        assert!(off.candidates(&[1]).is_empty());
    }

    #[test]
    fn the_most_voted_similar_replica_wins() {
        let q: SketchBytes = [10; 32];
        let same: SketchBytes = [10; 32];
        let opposite: SketchBytes = [-10; 32];
        let s = crate::store::dot(&q, &same);
        // Two similar hits on replica 2 outvote one on replica 0; the dissimilar one and
        // the unknown replica do not vote.
        let hits = [
            (hit(1, s, 0), same),
            (hit(2, s, 2), same),
            (hit(3, s, 2), same),
            (hit(4, -s, 1), opposite),
            (hit(5, s, u16::MAX), same),
        ];
        assert_eq!(vote(&q, &hits, 0.5, 3), Some(2));
        // Nothing above the floor: no vote.
        assert_eq!(vote(&q, &hits[3..4], 0.5, 3), None);
        // Ties go to the smaller replica.
        assert_eq!(vote(&q, &hits[..2], 0.5, 3), Some(0));
        assert_eq!(vote(&q, &[], 0.5, 3), None);
    }
}
